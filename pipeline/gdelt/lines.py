"""The lines of a GDELT file, found on its bytes: which go to the CSV reader, which are rejected
and why.

A chunk of whole lines becomes a :class:`ReadPlan`: all of it for the reader when its TAB total
proves it clean (:func:`plan_read`), else only its well-formed lines, the others listed as
``invalid_utf8``, ``empty_line`` or ``field_count:N`` with their line numbers. The byte scans
(TABs, line ends, UTF-8) run in polars and pyarrow on zero-copy views, and a member is cut into
chunks of whole lines here (:func:`line_chunks`). The names stay private: pipeline/gdelt/parse.py
and pipeline/gdelt/convert.py are their only users (docs/data-layout.md, "Parsing GDELT files").
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from pipeline.gdelt.schema import SCHEMAS

_BOM = b"\xef\xbb\xbf"


@dataclass
class ReadPlan:
    """One file, ready to be read: what goes to the CSV reader, and how its rows map to lines."""

    source: str
    data: bytes  # the CSV, unzipped
    total_lines: int
    csv: bytes  # what the reader gets: ``data``, or only its well-formed lines
    n_rows: int  # lines in ``csv``
    found: list[tuple[int, str]]  # (line_number, reason) of the lines left out of ``csv``
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # (start, end) of some lines, by number
    # Where each line of ``data`` ends (see :func:`_line_ends`), once a line had to be looked at.
    ends: list[int] | None = None
    by_line: bool = False  # whether ``csv`` holds the lines found well-formed one by one
    first_line: int = 0  # lines of the file before ``data`` (``data`` is one of its chunks)
    # Whether a byte order mark starting ``csv`` is data: lines of the file before it went to the
    # reader (see :func:`joined_csv`).
    bom_is_data: bool = False

    def raw_line(self, number: int) -> memoryview:
        """The bytes of line ``number``, as a view into ``data`` (no copy)."""
        if number in self.spans:
            start, end = self.spans[number]
        else:
            if self.ends is None:
                self.ends = _line_ends(_byte_view(self.data), self.data)
            start, end = _line_start(self.ends, number - 1), self.ends[number - 1]
        return memoryview(self.data)[start:end]


def plan_read(data: bytes, source: str, kind: str, first_line: int) -> ReadPlan:
    """What of a chunk of whole lines of a file (the lines after its first ``first_line``) goes to
    the reader: all of it if it passes the clean-file proof so far, else only its well-formed lines.

    The proof: a clean file holds ``fields - 1`` TABs per line, so its TAB total gives its line
    count. The reader (:func:`read_csv_lines`) raises on any line with more fields than the schema, so once
    it succeeds no line has more than ``fields - 1`` TABs, and the file has at least as many lines
    as its TABs make. The reader gives one row per line (a blank line too), so when its row count
    is the one the TABs make, there are exactly that many lines, none of them short. Undecodable
    bytes would make the reader raise too; they are looked for first, so that one such line does
    not fail the read of a whole batch of files.
    """
    # A real 15-minute file can be near-empty (GDELT's index lists a 401-byte export in February 2015,
    # during an outage); an empty one makes no line and goes to the reader as nothing.
    tabs = _count_byte(data, b"\t")
    n_lines, odd = divmod(tabs, len(SCHEMAS[kind]) - 1)
    plan = ReadPlan(source, data, n_lines, data, n_lines, [], first_line=first_line)
    # Bytes that make no whole line cannot be a clean file. And the reader lets one line through
    # with a field too many: the last one, when no \n ends it and the extra field is empty.
    unended = data.rfind(b"\n") + 1 if not data.endswith(b"\n") else len(data)
    if odd or (data and not n_lines) or data.count(b"\t", unended) >= len(SCHEMAS[kind]):
        return line_by_line(plan, kind)
    if not is_utf8(data):
        return _without_undecodable(plan, kind, tabs)
    return plan


def count_lines(data: bytes) -> int:
    return _count_byte(data, b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _count_byte(data: bytes | memoryview, byte: bytes) -> int:
    """How many times ``byte`` occurs in ``data``.

    polars compares a byte array with SIMD and counts the bit mask: about ten times less CPU than
    ``bytes.count`` (which holds the GIL for the whole scan). The array is a zero-copy view of
    ``data`` through pyarrow.
    """
    return _byte_view(data).eq(ord(byte)).sum()


def _byte_view(data: bytes | memoryview) -> pl.Series:
    """``data`` as a UInt8 series, without a copy (through pyarrow)."""
    return pl.from_arrow(pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)]))


def _line_ends(view: pl.Series, data: bytes) -> list[int]:
    """Where each line of ``data`` (``view``: :func:`_byte_view`) ends: the offset of its ``\\n``,
    or ``len(data)`` for a last line without one."""
    ends = view.eq(ord("\n")).arg_true().to_list()
    if data and not data.endswith(b"\n"):
        ends.append(len(data))
    return ends


def _line_start(ends: list[int], index: int) -> int:
    """Offset of the first byte of the line at ``index`` (0-based)."""
    return ends[index - 1] + 1 if index else 0


def _line_tabs(view: pl.Series, data: bytes) -> pl.Series:
    """TABs per line of ``data`` (``view``: :func:`_byte_view`), as Int64.

    Only the TABs and ``\\n`` are kept, in order (polars filters a byte mask far faster than it
    lists positions); a line's TABs are then the distance between its ``\\n`` and the previous
    one among them, less one.
    """
    marks = view.filter(view.eq(ord("\t")) | view.eq(ord("\n")))
    newlines = marks.eq(ord("\n")).arg_true().cast(pl.Int64)
    if data and not data.endswith(b"\n"):  # the last line ends where the marks do
        newlines = pl.concat([newlines, pl.Series([marks.len()], dtype=pl.Int64)])
    return newlines - newlines.shift(1, fill_value=-1) - 1


def _without_undecodable(plan: ReadPlan, kind: str, tabs: int) -> ReadPlan:
    """``plan`` (a whole file, ``tabs`` TABs) without its undecodable lines.

    When the TABs of the other lines still make whole lines, the same proof holds for them, and
    the file need not be split into lines: the usual damage in transit is a few flipped bytes.
    """
    data = plan.data
    undecodable = _undecodable_lines(data)
    tabs -= sum(data.count(b"\t", start, end) for _, start, end in undecodable)
    rest, odd = divmod(tabs, len(SCHEMAS[kind]) - 1)
    if odd:
        return line_by_line(plan, kind, undecodable)
    return dataclasses.replace(
        plan,
        total_lines=rest + len(undecodable),
        csv=_cut_out(data, [(start, end) for _, start, end in undecodable]),
        n_rows=rest,
        found=[(number, "invalid_utf8") for number, _, _ in undecodable],
        spans={number: (start, end) for number, start, end in undecodable},
    )


def line_by_line(plan: ReadPlan, kind: str, undecodable: list[tuple[int, int, int]] | None = None) -> ReadPlan:
    """``plan`` with its malformed lines found and left out of what the reader gets."""
    data = plan.data
    view = _byte_view(data)
    ends = _line_ends(view, data)
    if undecodable is None:
        undecodable = [] if is_utf8(data) else _undecodable_lines(data)
    found = _line_rejects(data, ends, _line_tabs(view, data), kind, [number for number, _, _ in undecodable])
    spans = [(_line_start(ends, number - 1), ends[number - 1]) for number, _ in found]
    return dataclasses.replace(
        plan,
        total_lines=len(ends),
        csv=_cut_out(data, spans),
        n_rows=len(ends) - len(found),
        found=found,
        spans={},
        ends=ends,
        by_line=True,
    )


def _cut_out(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    """``data`` without the lines at ``spans`` (``(start, end)``, sorted, ``end`` at the line's
    ``\\n`` or at the end of ``data``), each with its ``\\n``."""
    view = memoryview(data)
    kept, pos = [], 0
    for start, end in spans:
        kept.append(view[pos:start])
        pos = end + 1
    kept.append(view[pos:])
    return b"".join(kept)


def _line_rejects(
    data: bytes, ends: list[int], tabs: pl.Series, kind: str, undecodable: list[int]
) -> list[tuple[int, str]]:
    """``(line_number, reason)`` of every line that is not well-formed, in line order: an
    undecodable line is ``invalid_utf8``, a blank one ``empty_line``, another with the wrong
    number of TABs ``field_count:N`` (what :func:`_votes` counts)."""
    expected = len(SCHEMAS[kind])
    wrong = (tabs != expected - 1).arg_true()
    wrong_tabs = dict(zip(wrong.to_list(), tabs.gather(wrong).to_list()))
    undecodable_at = {number - 1 for number in undecodable}
    found = []
    for at in sorted(undecodable_at.union(wrong_tabs)):
        if at in undecodable_at:
            reason = "invalid_utf8"
        elif data[_line_start(ends, at) : ends[at]] in (b"", b"\r"):
            reason = "empty_line"
        else:
            reason = f"field_count:{wrong_tabs[at] + 1}"
        found.append((at + 1, reason))
    return found


def _undecodable_lines(data: bytes) -> list[tuple[int, int, int]]:
    """``(line_number, start, end)`` of each line that is not valid UTF-8 (``end`` excludes the
    ``\\n``).

    The loop runs once per undecodable line, not per line: each pass decodes up to the next
    error, so the buffer is decoded about once. ``\\n`` never occurs inside a multi-byte UTF-8
    sequence, so cutting at it is always safe.
    """
    view = memoryview(data)
    found: list[tuple[int, int, int]] = []
    pos = 0
    newlines_before = 0  # newlines in data[:counted]
    counted = 0
    while True:
        try:
            str(view[pos:], "utf-8")
            return found
        except UnicodeDecodeError as exc:
            at = pos + exc.start
            start = max(data.rfind(b"\n", pos, at) + 1, pos)
            end = data.find(b"\n", at)
            end = len(data) if end == -1 else end
            newlines_before += _count_byte(view[counted:start], b"\n")
            counted = start
            found.append((newlines_before + 1, start, end))
            pos = end


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8.

    pyarrow validates a zero-copy view of it as one string: faster than polars, which must copy
    it into a Series first, and three times faster than Python's decode. All three agree on what
    UTF-8 is (no surrogates, no overlong forms; checked on 400,000 byte strings).
    """
    # The offsets are packed by hand: pa.array() on a Python list would import pandas (48 MiB).
    offsets = pa.py_buffer(struct.pack("<2q", 0, len(data)))
    try:
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def line_chunks(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The bytes of ``pieces`` one after the other, cut into chunks of whole lines: each but the
    last ends with a ``\\n`` and holds at least ``size`` bytes (more when a line runs past that
    point, up to the last line end of the piece that got there); the last holds the rest. At
    least one chunk, ``b""`` for no bytes."""
    out, cut_any = io.BytesIO(), False
    for piece in pieces:
        cut = piece.rfind(b"\n") + 1
        if not cut or out.tell() + cut < size:
            out.write(piece)
            continue
        out.write(memoryview(piece)[:cut])
        yield out.getvalue()  # BytesIO hands its buffer over without a copy
        cut_any = True
        out = io.BytesIO()
        out.write(memoryview(piece)[cut:])
    if out.tell() or not cut_any:
        yield out.getvalue()


def byte_chunks(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in chunks as :func:`line_chunks` cuts them (``data`` itself when it is one)."""
    start = 0
    while len(data) - start > size and (cut := data.find(b"\n", start + size - 1) + 1):
        yield data[start:cut]
        start = cut
    if start < len(data) or not start:
        yield data[start:] if start else data


def joined_csv(plans: list[ReadPlan]) -> bytes:
    """What the reader gets for ``plans``: their CSVs one after the other.

    Each is read as polars would read its whole file: it ends with a ``\\n`` (so no line runs
    into the next file's), and a UTF-8 byte order mark starting it is dropped (polars drops one
    by itself, only at the start of what it reads) unless lines of its file before it went to the
    reader (the mark is then inside what polars reads of the file, and kept as data: an extra mark
    goes before it when it starts what the reader gets).
    """
    plans = [plan for plan in plans if plan.csv]
    if len(plans) == 1 and not (plans[0].bom_is_data and plans[0].csv.startswith(_BOM)):
        return plans[0].csv
    pieces: list[bytes] = []
    for plan in plans:
        csv = plan.csv
        if pieces and not pieces[-1].endswith(b"\n"):
            pieces.append(b"\n")
        if csv.startswith(_BOM) and not pieces and plan.bom_is_data:
            pieces.append(_BOM)
        elif csv.startswith(_BOM) and pieces and not plan.bom_is_data:
            csv = csv[len(_BOM) :]
        pieces.append(csv)
    return b"".join(pieces)


def line_numbers(positions: list[int], skipped: list[int]) -> list[int]:
    """1-based line numbers of the rows at ``positions`` (sorted) among the lines that were left
    after leaving out the (sorted) line numbers ``skipped``."""
    numbers, gone = [], 0
    for position in positions:
        number = position + 1 + gone
        while gone < len(skipped) and skipped[gone] <= number:
            gone += 1
            number += 1
        numbers.append(number)
    return numbers
