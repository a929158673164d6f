"""Hostile GDELT export files with correct md5s: what an attacker who controls GDELT's bytes (or
its index) can serve, planted into a generated mirror for the tests and bench/hostile_day.py.

GDELT's index is the only integrity check there is, and it vouches for whatever bytes it lists; so
every file here is relisted with its true size and md5 and passes download verification (or is
refused for its zip alone). Each member is built to inflate to just under ``cap`` (the
``max_uncompressed_mb`` the run uses) from a few KB of zip, in a shape that hurts a different part
of the parser (docs/data-layout.md, "Hostile GDELT files"):

=====================  ===================================================================
``huge_line``          real rows, then one line of TAB-less text filling the rest
``huge_url``           real rows, then one well-formed row whose SOURCEURL fills the rest
``huge_undecodable``   real rows, then one line of invalid UTF-8 filling the rest
``tiny_rows``          the shortest well-formed rows there are, repeated (most rows per byte)
``tiny_bad_rows``      as tiny_rows with a letter in GLOBALEVENTID (most rejects per byte)
``sixty_columns``      real rows with their last field cut off: 60 columns, the wrong format
``newlines``           nothing but newlines (most lines per byte)
``real_rows``          the slot's real rows repeated (a plausible but oversized file)
=====================  ===================================================================
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from datetime import datetime
from pathlib import Path

from pipeline.storage import raw_file_name

SHAPES = (
    "huge_line",
    "huge_url",
    "huge_undecodable",
    "tiny_rows",
    "tiny_bad_rows",
    "sixty_columns",
    "newlines",
    "real_rows",
)

# The shortest well-formed export row: a 1-digit GLOBALEVENTID, 58 empty fields, DATEADDED and an
# empty SOURCEURL.
_TINY_ROW = b"1" + b"\t" * 59 + b"20240101000000\t\n"


def _fill(head: bytes, unit: bytes, size: int) -> bytes:
    """``head`` followed by ``unit`` repeated (and cut) to make exactly ``size`` bytes."""
    rest = max(size - len(head), 0)
    return head + (unit * (rest // len(unit) + 1))[:rest]


def hostile_member(shape: str, real_csv: bytes, size: int) -> bytes:
    """An export CSV of ``size`` bytes in ``shape`` (see the module docstring), built from the
    well-formed lines of ``real_csv`` (a real or generated 15-minute export)."""
    rows = [line + b"\n" for line in real_csv.split(b"\n") if line.count(b"\t") == 60]
    head = b"".join(rows[:200])
    if shape == "huge_line":
        return _fill(head, b"A", size - 1) + b"\n"
    if shape == "huge_url":
        row = rows[0].rstrip(b"\n")
        return _fill(head + row, b"u", size - 1) + b"\n"
    if shape == "huge_undecodable":
        return _fill(head, b"\xff", size - 1) + b"\n"
    if shape == "tiny_rows":
        return _fill(b"", _TINY_ROW, size - len(_TINY_ROW)).rsplit(b"\n", 1)[0] + b"\n"
    if shape == "tiny_bad_rows":
        bad = b"x" + _TINY_ROW[1:]
        return _fill(b"", bad, size - len(bad)).rsplit(b"\n", 1)[0] + b"\n"
    if shape == "sixty_columns":
        cut = b"".join(row.rsplit(b"\t", 1)[0] + b"\n" for row in rows)
        return _fill(b"", cut, size).rsplit(b"\n", 1)[0] + b"\n"
    if shape == "newlines":
        return b"\n" * size
    if shape == "real_rows":
        return _fill(b"", b"".join(rows), size).rsplit(b"\n", 1)[0] + b"\n"
    raise ValueError(f"unknown shape {shape!r}; one of {SHAPES}")


def zip_member(name: str, data: bytes) -> bytes:
    """``data`` as the single member ``name`` of a deflated zip, as GDELT packs its files."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data, compresslevel=9)
    return buf.getvalue()


def relist(mirror_dir: Path, name: str, data: bytes) -> None:
    """Serve ``data`` under ``name`` and make the mirror's index vouch for exactly these bytes, as
    if GDELT itself had published them."""
    feed = mirror_dir / "gdeltv2"
    (feed / name).write_bytes(data)
    index = feed / "masterfilelist.txt"
    lines = [
        f"{len(data)} {hashlib.md5(data).hexdigest()} {line.split(' ', 2)[2]}" if line.endswith("/" + name) else line
        for line in index.read_text().splitlines()
    ]
    index.write_text("\n".join(lines) + "\n")


def plant_hostile_day(mirror_dir: Path, slots: list[datetime], cap: int) -> dict[datetime, str]:
    """Replace the export files of ``slots`` (one per shape of :data:`SHAPES`, in order) with
    hostile ones whose members are 64 bytes under ``cap``, each relisted with its true md5;
    returns slot -> shape."""
    if len(slots) != len(SHAPES):
        raise ValueError(f"one slot per shape: {len(SHAPES)} slots, got {len(slots)}")
    planted = {}
    for slot, shape in zip(slots, SHAPES):
        name = raw_file_name(slot, "export")
        with zipfile.ZipFile(mirror_dir / "gdeltv2" / name) as archive:
            real_csv = archive.read(archive.infolist()[0])
        relist(mirror_dir, name, zip_member(name.removesuffix(".zip"), hostile_member(shape, real_csv, cap - 64)))
        planted[slot] = shape
    return planted
