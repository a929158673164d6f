"""The two inputs of ``mirai score``, both read as untrusted: a split's gold answers
(split_directory, load_split) and a predictions file in any of its formats (read_submission:
JSONL, CSV, parquet or a MIRAI round directory).

A predictions file is read without following links, up to MAX_PREDICTIONS_BYTES and MAX_RECORDS,
parsed as JSON (a MIRAI round file's answer as a Python literal, never executed:
pipeline/evaluation/mirai_predictions.py); a problem is one line naming its line or record. Out of
scoring.py, which checks and scores what these return, so that neither passes ~500 lines.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from pipeline.evaluation.metrics import gold_relations
from pipeline.evaluation.mirai_predictions import (
    MAX_ANSWER_CHARS,
    PredictionFileError,
    count_rounds,
    is_query_id,
    mirai_query_ids,
    read_capped_file,
    read_prediction_file,
)
from pipeline.release.layout import MANIFEST_NAME, MAX_JSON_BYTES, SPLIT_FILES, is_month, shown
from pipeline.storage import outside_or_not_regular
from pipeline.untrusted_parquet import UntrustedParquetError, check_footer, read_untrusted_parquet, text_bytes

MAX_PREDICTIONS_BYTES = 64 * 2**20  # a month has ~2,000 queries; a full answer is < 3 KB as JSON
MAX_RECORDS = 200_000
# A month's queries.parquet is a few MB (~2,000 queries); a handed-over one is read up to these.
MAX_SPLIT_BYTES = 256 * 2**20
MAX_SPLIT_DECODED_BYTES = 256 * 2**20
MAX_LINE_CHARS = 4 * MAX_ANSWER_CHARS  # one JSONL line or CSV field: an answer plus a ranked list
# A query's id and its actors' codes: at most 100 characters (is_query_id) and ISO 3166 alpha-3.
MAX_KEY_CHARS = 100
# JSON values (containers and elements, counted as the ',', '[' and '{' that make them: an upper
# bound) one file's answers and ranked lists may hold. Parsed, a value costs 50-100 bytes of Python
# objects, not its 2-6 bytes of text: a re-attack of issue 30 turned a 9 KB parquet file of
# `[{},{},…]` answers into 1.7 GB, and 2 KB of gold answers into 3 GB. A month's ~2,000 queries
# answered with every second-level code (~240) and ranked in full are about 1,000,000.
MAX_JSON_VALUES = 4_000_000
MAX_RANKED = 1000  # as mirai_predictions: there are ~240 second-level codes
PARQUET_COLUMNS = ("query_id", "answer", "ranked", "p_event")


class ScoringError(ValueError):
    """The split or the predictions cannot be read as asked; the message is one line."""


@dataclass(frozen=True)
class Submitted:
    """One record of a predictions file: ``where`` names it in messages (``line 3``, ``row 2``,
    ``round1/Q.json``); ``answer`` is as parsed, ``ranked`` the record's ranked list or None;
    ``p_event`` the optional probability that s acts toward o at all on t (live rounds,
    docs/live.md), None when not given."""

    where: str
    query_id: object
    answer: object
    ranked: object
    p_event: object = None


@dataclass(frozen=True)
class Split:
    month: str
    query_set: str
    queries_sha256: str
    manifest_checked: bool  # the queries file matched the sha256 in the directory's manifest.json
    gold: dict[str, dict[str, list[str]]]  # query_id → answer dict, in the split's order


# --- the split ----------------------------------------------------------------------------------


def split_directory(split: str, data_dir: Path | None) -> Path:
    """A directory holding queries.parquet: ``split`` itself (a downloaded release month, or a
    data dir's splits/YYYY-MM), else, for a month YYYY-MM, ``data_dir``/splits/YYYY-MM."""
    path = Path(split)
    if path.is_dir():
        return path
    if is_month(split):
        if data_dir is None:
            raise ScoringError(f"no directory {split!r} and no data directory to find month {split} in")
        candidate = data_dir / "splits" / split
        if candidate.is_dir():
            return candidate
        raise ScoringError(f"no split for {split} at {candidate} (`mirai download {split}` fetches the release)")
    raise ScoringError(f"--split {shown(split)} is neither a directory nor a month YYYY-MM")


def load_split(directory: Path, sample: bool = False) -> Split:
    """The gold answers of a split directory's queries.parquet (queries_sample.parquet with
    ``sample``), every code checked against the CAMEO tables."""
    name = SPLIT_FILES[1] if sample else SPLIT_FILES[0]
    path = directory / name
    if not os.path.lexists(path):
        raise ScoringError(f"{directory} holds no {name} (a release month's directory or splits/YYYY-MM)")
    data = _split_bytes(directory, path, MAX_SPLIT_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    listed = _manifest_sha256(directory, name)
    if listed is not None and listed != digest:
        raise ScoringError(f"{path} does not match the sha256 its manifest.json lists (changed since it was written?)")
    try:  # a handed-over directory's file: decoded under a bound its footer cannot lie about
        check_footer(data)
        table = read_untrusted_parquet(data, MAX_SPLIT_DECODED_BYTES, columns=["query_id", "answer_dict"])
    except UntrustedParquetError as exc:
        raise ScoringError(f"{path}: not a split's queries file ({exc})") from None
    # Measured on the columns before any answer is parsed: shared values are cheap until then.
    if table.height > MAX_RECORDS:
        raise ScoringError(f"{path}: not a split's queries file (more than {MAX_RECORDS} queries)")
    longest, total = text_bytes(table, ["answer_dict"])
    if longest > MAX_LINE_CHARS or total > MAX_SPLIT_BYTES:
        raise ScoringError(f"{path}: not a split's queries file (answer_dict values too long to be gold answers)")
    if _column_values(table, ("answer_dict",)) > MAX_JSON_VALUES:
        raise ScoringError(f"{path}: not a split's queries file (more JSON values in answer_dict than any month has)")
    gold: dict[str, dict[str, list[str]]] = {}
    for query_id, answer in table.iter_rows():
        try:
            gold[query_id] = json.loads(answer)
            gold_relations(gold[query_id])
        except RecursionError:
            raise ScoringError(
                f"{path}: query {shown(query_id)} has a broken answer_dict (nested too deeply)"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ScoringError(f"{path}: query {shown(query_id)} has a broken answer_dict ({exc})") from None
    if not gold:
        raise ScoringError(f"{path}: no queries")
    month = next(iter(gold))[:7]
    return Split(
        month if is_month(month) else "unknown", name.removesuffix(".parquet"), digest, listed is not None, gold
    )


def _manifest_sha256(directory: Path, name: str) -> str | None:
    """The sha256 the directory's manifest.json (a release's, or a split's) lists for ``name``,
    or None when there is no such manifest entry."""
    manifest = directory / MANIFEST_NAME
    if not os.path.lexists(manifest):
        return None
    try:
        raw = _split_bytes(directory, manifest, MAX_JSON_BYTES)
    except _TooLarge:
        return None
    try:
        entry = json.loads(raw)["files"][name]["sha256"]
    except (ValueError, RecursionError, KeyError, TypeError):
        return None
    return entry if isinstance(entry, str) else None


class _TooLarge(ScoringError):
    pass


def _split_bytes(directory: Path, path: Path, cap: int) -> bytes:
    """A handed-over split directory's file: a regular file inside ``directory`` once links are
    followed (a link out of it would score against, or quote, a file from elsewhere on the
    machine, as `mirai evaluate` refuses it too), read up to ``cap`` bytes whatever its size said
    when it was looked at (it may grow while read). ScoringError otherwise."""
    problem = outside_or_not_regular(directory, path)
    if problem is not None:
        raise ScoringError(f"{problem}; refused")
    try:  # O_NONBLOCK: a file swapped for a FIFO since the check is not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ScoringError(f"{path}: refused: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ScoringError(f"{path}: refused: not a regular file")
        # Its size as a first read (read(n) reserves n bytes), the rest only if it grew meanwhile.
        data = fh.read(min(info.st_size, cap) + 1)
        if info.st_size < len(data) <= cap:
            data += fh.read(cap + 1 - len(data))
    if len(data) > cap:
        raise _TooLarge(f"{path}: refused: larger than {cap} bytes")
    return data


# --- reading predictions ----------------------------------------------------------------------------


def read_capped(path: Path) -> bytes:
    """A predictions file's bytes, at most MAX_PREDICTIONS_BYTES (``read_capped_file``'s checks)."""
    return read_capped_file(path, MAX_PREDICTIONS_BYTES, ScoringError)


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScoringError(f"{path}: refused: not UTF-8 text") from None


def _json(text: str) -> tuple[object, str | None]:
    if len(text) > MAX_LINE_CHARS:
        return None, f"longer than {MAX_LINE_CHARS} characters"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError as exc:
        return None, f"not JSON ({str(exc).splitlines()[0][:80]})"


def _check_values(path: Path, values: int) -> None:
    if values > MAX_JSON_VALUES:
        raise ScoringError(
            f"{path}: refused: about {values:,} JSON values in its answers, more than the {MAX_JSON_VALUES:,} "
            "a month's predictions could need"
        )


def _text_values(text: str) -> int:
    return text.count(",") + text.count("[") + text.count("{")


def _column_values(table: pl.DataFrame, text_columns: tuple[str, ...], list_columns: tuple[str, ...] = ()) -> int:
    """_text_values summed over ``text_columns``' JSON strings, plus the elements of ``list_columns``,
    counted by polars before any row becomes Python objects."""
    counts = [pl.col(c).str.count_matches(r"[,\[{]").sum() for c in text_columns if c in table.columns]
    counts += [pl.col(c).list.len().sum() for c in list_columns if c in table.columns]
    return int(sum(v or 0 for v in table.select(counts).row(0))) if counts and table.height else 0


def _too_many(path: Path) -> ScoringError:
    return ScoringError(f"{path}: refused: more than {MAX_RECORDS} records")


def read_jsonl(path: Path) -> tuple[list[Submitted], list[str]]:
    """Records of a JSONL file (one object per line; blank lines skipped) and the lines that are
    not records."""
    records, problems, text = [], [], _text(path, read_capped(path))
    _check_values(path, _text_values(text))
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(records) >= MAX_RECORDS:
            raise _too_many(path)
        where = f"line {number}"
        value, problem = _json(line)
        if problem is None and not isinstance(value, dict):
            problem = f"not a JSON object but {type(value).__name__}"
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        # A misspelt key ("answers") would otherwise leave its value unread and score the rest.
        unknown = sorted(set(value) - set(PARQUET_COLUMNS))
        if unknown:
            names = ", ".join(shown(key) for key in unknown[:3]) + (
                f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            )
            problems.append(f"{where}: unknown key(s) {names}; a record holds {', '.join(PARQUET_COLUMNS)}")
        records.append(
            Submitted(where, value.get("query_id"), value.get("answer"), value.get("ranked"), value.get("p_event"))
        )
    return records, problems


def read_csv(path: Path) -> tuple[list[Submitted], list[str]]:
    """Records of a CSV file with a header: ``query_id``, ``answer`` (JSON: an answer dict or a
    list of codes) and optionally ``ranked`` (a JSON list of codes) and ``p_event`` (a number)."""
    text = _text(path, read_capped(path))
    _check_values(path, _text_values(text))
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None or "query_id" not in header or not {"answer", "ranked"} & set(header):
            raise ScoringError(f"{path}: refused: the header must name query_id and answer (or ranked)")
        unknown = sorted(set(header) - set(PARQUET_COLUMNS))
        if unknown or len(set(header)) != len(header):
            raise ScoringError(f"{path}: refused: the columns must be query_id, answer, ranked, p_event, each once")
        records, problems = [], []
        for number, row in enumerate(reader, 2):
            if len(records) >= MAX_RECORDS:
                raise _too_many(path)
            where = f"row {number}"
            if len(row) != len(header):
                problems.append(f"{where}: {len(row)} fields, the header has {len(header)}")
                continue
            fields = dict(zip(header, row))
            parsed = {}
            for column in ("answer", "ranked", "p_event"):
                if fields.get(column, "") != "":
                    parsed[column], problem = _json(fields[column])
                    if problem:
                        problems.append(f"{where}: {column} {problem}")
            records.append(
                Submitted(where, fields["query_id"], parsed.get("answer"), parsed.get("ranked"), parsed.get("p_event"))
            )
    except csv.Error as exc:
        raise ScoringError(f"{path}: refused: not CSV ({exc})") from None
    return records, problems


def read_parquet(path: Path) -> tuple[list[Submitted], list[str]]:
    """Records of a parquet file: ``query_id`` (string), ``answer`` (string: JSON, as in CSV) and
    optionally ``ranked`` (list of strings) and ``p_event`` (float). Its footer is checked before any data is read, so a
    file that would decompress past the caps is refused unread."""
    data = read_capped(path)
    try:
        check_footer(data)
        meta = pq.ParquetFile(io.BytesIO(data))
        columns = meta.schema_arrow.names
        if meta.metadata.num_rows > MAX_RECORDS:
            raise _too_many(path)
        unpacked = sum(meta.metadata.row_group(i).total_byte_size for i in range(meta.metadata.num_row_groups))
        if unpacked > 4 * MAX_PREDICTIONS_BYTES:
            raise ScoringError(f"{path}: refused: {unpacked} bytes once decompressed")
        if "query_id" not in columns or not {"answer", "ranked"} & set(columns) or set(columns) - set(PARQUET_COLUMNS):
            raise ScoringError(
                f"{path}: refused: the columns must be query_id and answer and/or ranked (and p_event), no others"
            )
        # The footer's sizes are the file's word: decoded where a lie costs a child process.
        table = read_untrusted_parquet(data, 4 * MAX_PREDICTIONS_BYTES)
    except ScoringError:
        raise
    except UntrustedParquetError as exc:
        raise ScoringError(f"{path}: refused: {exc}") from None
    except Exception as exc:  # pyarrow's errors for a damaged footer
        raise ScoringError(f"{path}: refused: not a readable parquet file ({type(exc).__name__})") from None
    if table.height > MAX_RECORDS:  # the footer's num_rows is the file's word too
        raise _too_many(path)
    expected = {"query_id": pl.String, "answer": pl.String, "ranked": pl.List(pl.String), "p_event": pl.Float64}
    wrong = [c for c in table.columns if table.schema[c] != expected[c]]
    if wrong:
        raise ScoringError(f"{path}: refused: column {wrong[0]} is {table.schema[wrong[0]]}, not {expected[wrong[0]]}")
    # Measured on the columns, before a row becomes Python strings: decoded values may share one
    # buffer (a dictionary page), so 600 answers of 1 MiB can sit in a 2 KB file and in little memory.
    oversized = _oversized_cells(table)
    if oversized:
        raise ScoringError(f"{path}: refused: {oversized}")
    _check_values(path, _column_values(table, ("answer",), ("ranked",)))
    records, problems = [], []
    for number, row in enumerate(table.iter_rows(named=True), 1):
        where = f"record {number}"
        answer = None
        if row.get("answer") is not None:
            answer, problem = _json(row["answer"])
            if problem:
                problems.append(f"{where}: answer {problem}")
        records.append(Submitted(where, row["query_id"], answer, row.get("ranked"), row.get("p_event")))
    return records, problems


def _oversized_cells(table: pl.DataFrame) -> str | None:
    """What in a predictions table is past the caps a text file has (MAX_LINE_CHARS a string,
    MAX_RANKED codes a ranked list, MAX_PREDICTIONS_BYTES of text in all), or None: per cell and
    summed, since shared values cost nothing until each row becomes Python strings."""
    for c in ("query_id", "answer"):
        longest, total = text_bytes(table, [c])
        if longest > MAX_LINE_CHARS:
            return f"{c} values longer than {MAX_LINE_CHARS} bytes"
        if total > MAX_PREDICTIONS_BYTES:
            return f"more than {MAX_PREDICTIONS_BYTES} bytes of {c}"
    if "ranked" not in table.columns or not table.height:
        return None
    code_bytes = pl.col("ranked").list.eval(pl.element().str.len_bytes())
    codes, longest, total = table.select(
        pl.col("ranked").list.len().max().alias("codes"),
        code_bytes.list.max().max().alias("longest"),
        code_bytes.list.sum().sum().alias("total"),
    ).row(0)
    if (codes or 0) > MAX_RANKED:
        return f"a ranked list of more than {MAX_RANKED} codes"
    if (longest or 0) > MAX_LINE_CHARS:
        return f"a ranked code longer than {MAX_LINE_CHARS} bytes"
    if (total or 0) > MAX_PREDICTIONS_BYTES:
        return f"more than {MAX_PREDICTIONS_BYTES} bytes of ranked codes"
    return None


def read_round_dir(
    path: Path, query_ids: Sequence[str], file_ids: Mapping[str, str] | None = None
) -> tuple[list[list[Submitted]], list[str]]:
    """Every round of a MIRAI-layout directory (round<N>/<QueryId>.json, read by
    mirai_predictions.read_prediction_file): a file for a query of ``query_ids`` that is absent
    leaves the query missing; a file for any other query is a problem. ``file_ids`` maps the files'
    QueryIds to ours when they are named by a MIRAI relation_query.csv (relation_query_file_ids)."""
    try:
        rounds = count_rounds(path)
    except PredictionFileError as exc:
        raise ScoringError(str(exc)) from None
    out, problems = [], []
    wanted = set(query_ids) if file_ids is None else set(file_ids)
    for n in range(1, rounds + 1):
        round_dir = path / f"round{n}"
        if not stat.S_ISDIR(os.lstat(round_dir).st_mode):
            raise ScoringError(f"{round_dir}: refused: not a directory (a symbolic link or a file)")
        names = []
        with os.scandir(round_dir) as entries:
            for entry in entries:
                if len(names) >= MAX_RECORDS:
                    raise _too_many(round_dir)
                names.append(entry.name)
        names.sort()
        records = []
        for name in names:
            query_id = name.removesuffix(".json")
            where = f"round{n}/{name if is_query_id(query_id) else shown(name)}"
            if not name.endswith(".json") or query_id not in wanted:
                problems.append(f"{where}: not a query of the split")
                continue
            try:
                record = read_prediction_file(round_dir / name, query_id)
            except PredictionFileError as exc:
                problems.append(f"{where}: {str(exc).rsplit('refused: ', 1)[-1]}")
                continue
            answer = record.answer
            # eval.py reads "" (no answer), a non-literal and anything but a dict as empty.
            if answer is None:
                answer = {}
                if record.answer_text.strip():
                    problems.append(f"{where}: answer is not a Python literal")
            elif not isinstance(answer, dict):
                problems.append(f"{where}: answer is {type(answer).__name__}, not an answer dict (MIRAI's layout)")
                answer = {}
            ours = query_id if file_ids is None else file_ids[query_id]
            records.append(Submitted(where, ours, answer, record.ranked))
        out.append(records)
    return out, problems


def _query_keys(path: Path) -> pl.DataFrame:
    """query_id, date, s and o of a handed-over queries file, decoded as load_split decodes its
    other columns (in the memory-capped child, then measured on the columns): load_split never
    looked at these, and a footer may lie about them as about any."""
    data = _split_bytes(path.parent, path, MAX_SPLIT_BYTES)
    try:
        table = read_untrusted_parquet(data, MAX_SPLIT_DECODED_BYTES, columns=["query_id", "date", "s", "o"])
    except UntrustedParquetError as exc:
        raise ScoringError(f"{path}: not a split's queries file ({exc})") from None
    if table.height > MAX_RECORDS:
        raise ScoringError(f"{path}: not a split's queries file (more than {MAX_RECORDS} queries)")
    if table.schema["date"] != pl.Date:
        raise ScoringError(f"{path}: not a split's queries file (date is {table.schema['date']}, not Date)")
    for column in ("query_id", "s", "o"):
        if table.schema[column] != pl.String or text_bytes(table, [column])[0] > MAX_KEY_CHARS:
            raise ScoringError(
                f"{path}: not a split's queries file ({column} values longer than {MAX_KEY_CHARS} bytes, or not text)"
            )
    return table


def relation_query_file_ids(split_dir: Path, sample: bool, relation_query: Path) -> dict[str, str]:
    """MIRAI QueryId → our query_id for every query of the split (its queries_sample with
    ``sample``), matched on (date, s, o) with a MIRAI relation_query.csv, such as the one in a
    release's mirai/data/ (which numbers the queries 1, 2, ...). MIRAI's agents name their round
    files by those QueryIds; load_split has checked the queries file against the manifest."""
    queries = _query_keys(Path(split_dir) / (SPLIT_FILES[1] if sample else SPLIT_FILES[0]))
    if not Path(relation_query).is_file():
        raise ScoringError(f"--relation-query {relation_query}: no such file")
    try:
        theirs = mirai_query_ids(queries, Path(relation_query))
    except ValueError as exc:  # a wrong file; polars' parse errors are ValueErrors too
        raise ScoringError(str(exc).splitlines()[0]) from None
    return {mirai_id: ours for ours, mirai_id in theirs.items()}


def read_submission(
    path: Path, query_ids: Sequence[str], file_ids: Mapping[str, str] | None = None
) -> tuple[list[list[Submitted]], list[str]]:
    """A predictions file (by suffix: .jsonl/.json, .csv, .parquet) as one round, or a MIRAI round
    directory as its rounds (its files named as ``file_ids`` says, if given); and the problems
    found reading it."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        return read_round_dir(path, query_ids, file_ids)
    if file_ids is not None:
        raise ScoringError(f"{path}: --relation-query names the files of a MIRAI round directory, not a file's ids")
    readers = {".jsonl": read_jsonl, ".json": read_jsonl, ".csv": read_csv, ".parquet": read_parquet}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ScoringError(f"{path}: expected a .jsonl, .csv or .parquet file or a MIRAI round directory")
    records, problems = reader(path)
    return [records], problems
