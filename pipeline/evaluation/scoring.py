"""``mirai score``: score a predictions file against a split, from a downloaded release alone.

A predictions file is untrusted (docs/evaluation.md, "Score your own predictions"): it is read
without following links, up to MAX_PREDICTIONS_BYTES and MAX_RECORDS, parsed as JSON (a MIRAI
round file's answer as a Python literal, never executed: pipeline/evaluation/mirai_predictions.py)
and every problem is one line naming its line or record, at most MAX_PROBLEMS_SHOWN of them.

Strict by default: any problem refuses the file (InvalidPredictions). Lenient scoring reads the
answers as MIRAI's agent_evaluation/eval.py does (metrics.clean_prediction: what is invalid
counts as empty) and lists the problems it forgave. A query with no prediction scores as an empty
answer in both modes, and is listed.

The per-query scores are metrics.query_scores, reciprocal_rank and hit (the numbers run.py
stores); each reported metric is their mean over queries with a percentile bootstrap interval
over queries, drawn from numpy's Generator with the given seed, so the same input and seed give
the same scorecard bytes.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.evaluation.metrics import (
    SET_METRICS,
    clean_ranking,
    gold_relations,
    hit,
    query_scores,
    reciprocal_rank,
    to_answer_dict,
)
from pipeline.evaluation.mirai_predictions import (
    MAX_ANSWER_CHARS,
    PredictionFileError,
    count_rounds,
    is_query_id,
    listed_codes,
    mirai_query_ids,
    read_prediction_file,
)
from pipeline.reference.tables import level1_codes, level2_codes
from pipeline.release.layout import MANIFEST_NAME, MAX_JSON_BYTES, SPLIT_FILES, is_month, shown
from pipeline.untrusted_parquet import UntrustedParquetError, check_footer, read_untrusted_parquet, text_bytes

SCORECARD_FORMAT = "mirai-scorecard-v1"
MAX_PREDICTIONS_BYTES = 64 * 2**20  # a month has ~2,000 queries; a full answer is < 3 KB as JSON
MAX_RECORDS = 200_000
# A month's queries.parquet is a few MB (~2,000 queries); a handed-over one is read up to these.
MAX_SPLIT_BYTES = 256 * 2**20
MAX_SPLIT_DECODED_BYTES = 256 * 2**20
MAX_LINE_CHARS = 4 * MAX_ANSWER_CHARS  # one JSONL line or CSV field: an answer plus a ranked list
# A query's id and its actors' codes: at most 100 characters (is_query_id) and ISO 3166 alpha-3.
MAX_KEY_CHARS = 100
MAX_RANKED = 1000  # as mirai_predictions: there are ~240 second-level codes
MAX_PROBLEMS_SHOWN = 50
DEFAULT_RESAMPLES = 1000
MAX_RESAMPLES = 100_000
BOOTSTRAP_CHUNK = 500  # resamples drawn at once: 500 × 2,000 queries of counts is 8 MB
HIT_K = 10  # as run.py (MIRAI Appendix D.8)
RANKED_METRICS = ("mrr", f"hit_at_{HIT_K}")
METRICS = (*SET_METRICS, *RANKED_METRICS)
# Shown in the Markdown table (the JSON scorecard has every metric).
TABLE_METRICS = (
    "level1_precision",
    "level1_recall",
    "level1_f1",
    "level2_precision",
    "level2_recall",
    "level2_f1",
    "binary_kl",
    "quad_kl",
    "mrr",
    f"hit_at_{HIT_K}",
)
_CODE = {1: re.compile(r"[0-9]{2}"), 2: re.compile(r"[0-9]{3}")}  # fullmatch: "$" also matches before a final newline
PARQUET_COLUMNS = ("query_id", "answer", "ranked", "p_event")


class ScoringError(ValueError):
    """The split or the predictions cannot be read as asked; the message is one line."""


class InvalidPredictions(ScoringError):
    """Strict scoring refused the predictions: ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s); nothing was scored (--lenient scores as eval.py)")


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
    if not path.is_file():
        raise ScoringError(f"{directory} holds no {name} (a release month's directory or splits/YYYY-MM)")
    if path.stat().st_size > MAX_SPLIT_BYTES:
        raise ScoringError(f"{path}: refused: larger than {MAX_SPLIT_BYTES} bytes")
    data = path.read_bytes()
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
    gold: dict[str, dict[str, list[str]]] = {}
    for query_id, answer in table.iter_rows():
        try:
            gold[query_id] = json.loads(answer)
            gold_relations(gold[query_id])
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
    if not manifest.is_file() or manifest.stat().st_size > MAX_JSON_BYTES:
        return None
    try:
        entry = json.loads(manifest.read_bytes())["files"][name]["sha256"]
    except (ValueError, RecursionError, KeyError, TypeError):
        return None
    return entry if isinstance(entry, str) else None


# --- reading predictions ----------------------------------------------------------------------------


def _read_capped(path: Path) -> bytes:
    """A regular file's bytes, reached without following a link, at most MAX_PREDICTIONS_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise ScoringError(f"{path}: refused: {reason}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ScoringError(f"{path}: refused: not a regular file")
        data = fh.read(MAX_PREDICTIONS_BYTES + 1)
    if len(data) > MAX_PREDICTIONS_BYTES:
        raise ScoringError(f"{path}: refused: larger than {MAX_PREDICTIONS_BYTES} bytes")
    return data


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


def _too_many(path: Path) -> ScoringError:
    return ScoringError(f"{path}: refused: more than {MAX_RECORDS} records")


def read_jsonl(path: Path) -> tuple[list[Submitted], list[str]]:
    """Records of a JSONL file (one object per line; blank lines skipped) and the lines that are
    not records."""
    records, problems = [], []
    for number, line in enumerate(_text(path, _read_capped(path)).splitlines(), 1):
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
        records.append(
            Submitted(where, value.get("query_id"), value.get("answer"), value.get("ranked"), value.get("p_event"))
        )
    return records, problems


def read_csv(path: Path) -> tuple[list[Submitted], list[str]]:
    """Records of a CSV file with a header: ``query_id``, ``answer`` (JSON: an answer dict or a
    list of codes) and optionally ``ranked`` (a JSON list of codes) and ``p_event`` (a number)."""
    reader = csv.reader(io.StringIO(_text(path, _read_capped(path)), newline=""))
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
    data = _read_capped(path)
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
    expected = {"query_id": pl.String, "answer": pl.String, "ranked": pl.List(pl.String), "p_event": pl.Float64}
    wrong = [c for c in table.columns if table.schema[c] != expected[c]]
    if wrong:
        raise ScoringError(f"{path}: refused: column {wrong[0]} is {table.schema[wrong[0]]}, not {expected[wrong[0]]}")
    # Measured on the columns, before a row becomes Python strings: decoded values may share one
    # buffer (a dictionary page), so 600 answers of 1 MiB can sit in a 2 KB file and in little memory.
    oversized = _oversized_cells(table)
    if oversized:
        raise ScoringError(f"{path}: refused: {oversized}")
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
    if path.stat().st_size > MAX_SPLIT_BYTES:
        raise ScoringError(f"{path}: refused: larger than {MAX_SPLIT_BYTES} bytes")
    try:
        table = read_untrusted_parquet(
            path.read_bytes(), MAX_SPLIT_DECODED_BYTES, columns=["query_id", "date", "s", "o"]
        )
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


# --- checking ---------------------------------------------------------------------------------------


def _code_problem(code: object, level: int) -> str | None:
    if not isinstance(code, str):
        return f"code {shown(code)} is {type(code).__name__}, not a string"
    if not _CODE[level].fullmatch(code):
        return f"code {shown(code)} is malformed (a level-{level} code is {level + 1} digits)"
    if code not in (level1_codes() if level == 1 else level2_codes()):
        return f"code {shown(code)} is not a CAMEO level-{level} code"
    return None


def _ranked_problems(ranked: object, field: str) -> list[str]:
    if not isinstance(ranked, list):
        return [f"{field} is {type(ranked).__name__}, not a list of codes"]
    if len(ranked) > MAX_RANKED:
        return [f"{field} holds more than {MAX_RANKED} codes"]
    return [f"{field}: {p}" for p in (_code_problem(c, 2) for c in ranked) if p]


def answer_problems(answer: object, ranked: object) -> list[str]:
    """What strict scoring refuses in one record's answer and ranked list (empty when valid)."""
    problems = []
    if answer is None and ranked is None:
        problems.append("no answer and no ranked list")
    elif isinstance(answer, list):
        problems += _ranked_problems(answer, "answer")
    elif isinstance(answer, dict):
        for key, codes in answer.items():
            problem = _code_problem(key, 1)
            if problem:
                problems.append(f"answer key: {problem}")
                continue
            if not isinstance(codes, list):
                problems.append(f"answer[{key!r}] is {type(codes).__name__}, not a list of codes")
                continue
            for code in codes:
                problem = _code_problem(code, 2)
                if problem:
                    problems.append(f"answer[{key!r}]: {problem}")
                elif code[:2] != key:
                    problems.append(f"answer[{key!r}]: code {code!r} belongs under {code[:2]!r}")
    elif answer is not None:
        problems.append(f"answer is {type(answer).__name__}, not an answer dict or a list of codes")
    if ranked is not None:
        problems += _ranked_problems(ranked, "ranked")
    return problems


def p_event_problem(value: object) -> str | None:
    """Why a record's p_event is not absent or a probability (a finite number from 0 to 1)."""
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 1:
        return f"p_event {shown(value)} is not a probability from 0 to 1"
    return None


def _as_scored(record: Submitted) -> tuple[object, list]:
    """(answer, ranking) as scored: a list answer is its codes grouped by level-1 code and also the
    ranking; a record with only ``ranked`` answers its codes; else the ranking is ``ranked`` or the
    answer's codes in the order written (as run.py and mirai_predictions.score_round)."""
    answer, ranked = record.answer, record.ranked
    if isinstance(answer, list) or (answer is None and isinstance(ranked, list)):
        codes = answer if isinstance(answer, list) else ranked
        answer = to_answer_dict(clean_ranking(codes[:MAX_RANKED]))
        ranked = ranked if isinstance(ranked, list) else codes
    if not isinstance(ranked, list):
        ranked = listed_codes(answer)
    return answer, ranked[:MAX_RANKED]


def match_queries(
    rounds: Sequence[Sequence[Submitted]], gold: Mapping[str, object]
) -> tuple[list[dict[str, tuple[object, list]]], list[str], list[str]]:
    """Per round, query_id → (answer, ranking) as scored; the problems, each naming its record
    (malformed, unknown or duplicate query ids; invalid answers, a duplicate's too); and the
    queries with no prediction in some round. Of duplicates the first record is scored."""
    matched, problems, missing = [], [], set()
    for records in rounds:
        found: dict[str, tuple[object, list]] = {}
        for record in records:
            query_id = record.query_id
            if not is_query_id(query_id):
                problems.append(f"{record.where}: query_id {shown(query_id)} is not a query id")
                continue
            if query_id not in gold:
                problems.append(f"{record.where}: unknown query_id {query_id!r} (not in the split)")
                continue
            problems += [f"{record.where}: {p}" for p in answer_problems(record.answer, record.ranked)]
            problem = p_event_problem(record.p_event)
            if problem:
                problems.append(f"{record.where}: {problem}")
            if query_id in found:
                problems.append(f"{record.where}: duplicate query_id {query_id!r} (the first is scored)")
                continue
            found[query_id] = _as_scored(record)
        missing |= set(gold) - set(found)
        matched.append(found)
    return matched, problems, [q for q in gold if q in missing]


# --- scoring ------------------------------------------------------------------------------------------


def per_query_scores(matched: Sequence[Mapping[str, tuple[object, list]]], gold: Mapping[str, dict]) -> np.ndarray:
    """queries × METRICS: each query's scores (metrics.query_scores, reciprocal_rank, hit at
    HIT_K, in percent as metrics.mrr and hit_at_k), averaged over rounds; a missing query is an
    empty answer."""
    out = np.zeros((len(gold), len(METRICS)))
    for found in matched:
        for i, (query_id, answer) in enumerate(gold.items()):
            prediction, ranking = found.get(query_id, ({}, []))
            row = query_scores(prediction, answer)
            row["mrr"] = 100 * reciprocal_rank(ranking, answer)
            row[f"hit_at_{HIT_K}"] = 100 * hit(ranking, answer, HIT_K)
            out[i] += [row[m] for m in METRICS]
    return out / len(matched)


def bootstrap_means(scores: np.ndarray, seed: int, resamples: int = DEFAULT_RESAMPLES) -> np.ndarray:
    """resamples × metrics: the metric means of each of ``resamples`` resamples of the queries with
    replacement, drawn by numpy's Generator from ``seed``. A resample is a row of counts (how often
    each query is drawn), so all the means are one matrix product per BOOTSTRAP_CHUNK resamples
    (which bounds the memory), not a loop per resample."""
    n = scores.shape[0]
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        size = min(BOOTSTRAP_CHUNK, resamples - start)
        draws = rng.integers(0, n, size=(size, n))
        counts = np.bincount((draws + n * np.arange(size)[:, None]).ravel(), minlength=size * n)
        means.append(counts.reshape(size, n).astype(float) @ scores / n)
    return np.concatenate(means)


def bootstrap_intervals(scores: np.ndarray, seed: int, resamples: int = DEFAULT_RESAMPLES) -> np.ndarray:
    """The 2.5th and 97.5th percentiles (2 × metrics) of the metric means over the resamples of
    ``bootstrap_means``."""
    return np.percentile(bootstrap_means(scores, seed, resamples), [2.5, 97.5], axis=0)


def _round(value: float) -> float:
    return round(float(value), 4)


def scorecard(
    split: Split,
    predictions_sha256: str,
    rounds: int,
    scores: np.ndarray,
    *,
    seed: int,
    resamples: int,
    distance: int,
    lenient: bool,
    missing: Sequence[str],
    forgiven: Sequence[str],
) -> dict:
    """The JSON scorecard: every metric's mean and 95% interval, the per-level-1 breakdown (the
    queries whose gold answer holds that level-1 code: means, no intervals) and what was missing
    or forgiven (at most MAX_PROBLEMS_SHOWN lines of each)."""
    low, high = bootstrap_intervals(scores, seed, resamples)
    means = scores.mean(axis=0)
    metrics = {m: {"value": _round(means[i]), "ci95": [_round(low[i]), _round(high[i])]} for i, m in enumerate(METRICS)}
    by_level1 = {}
    for code in sorted(level1_codes()):
        rows = [i for i, answer in enumerate(split.gold.values()) if code in answer]
        if rows:
            group = scores[rows].mean(axis=0)
            by_level1[code] = {"queries": len(rows)} | {m: _round(group[i]) for i, m in enumerate(METRICS)}
    return {
        "format": SCORECARD_FORMAT,
        "split": {
            "month": split.month,
            "query_set": split.query_set,
            "queries_sha256": split.queries_sha256,
            "manifest_checked": split.manifest_checked,
        },
        "predictions_sha256": predictions_sha256,
        "distance_days": distance,
        "rounds": rounds,
        "queries": len(split.gold),
        "mode": "lenient" if lenient else "strict",
        "bootstrap": {"seed": seed, "resamples": resamples, "interval": "percentile, 95%", "unit": "query"},
        "metrics": metrics,
        "by_level1": by_level1,
        "missing": {"count": len(missing), "shown": list(missing[:MAX_PROBLEMS_SHOWN])},
        "forgiven": {"count": len(forgiven), "shown": list(forgiven[:MAX_PROBLEMS_SHOWN])},
    }


def markdown(card: Mapping) -> str:
    """The scorecard as Markdown: a metric table with intervals, then the per-level-1 table."""
    split = card["split"]
    lines = [
        f"# Scorecard: {split['month']} {split['query_set']}, distance {card['distance_days']}",
        "",
        f"{card['queries']} queries, {card['rounds']} round(s), {card['mode']} mode; "
        f"{card['missing']['count']} missing (scored as empty), {card['forgiven']['count']} problems forgiven. "
        f"95% percentile bootstrap over queries, {card['bootstrap']['resamples']} resamples, seed {card['bootstrap']['seed']}.",
        "",
        "| metric | value | 95% interval |",
        "|---|---:|---|",
    ]
    for m in TABLE_METRICS:
        entry = card["metrics"][m]
        lines.append(f"| {m} | {entry['value']:.2f} | {entry['ci95'][0]:.2f} – {entry['ci95'][1]:.2f} |")
    lines += ["", "| level-1 code | queries | level1_f1 | level2_f1 | mrr |", "|---|---:|---:|---:|---:|"]
    for code, row in card["by_level1"].items():
        lines.append(
            f"| {code} | {row['queries']} | {row['level1_f1']:.2f} | {row['level2_f1']:.2f} | {row['mrr']:.2f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ScoreResult:
    card: dict
    missing: list[str]
    forgiven: list[str]

    def json_bytes(self) -> bytes:
        return (json.dumps(self.card, indent=2, sort_keys=False) + "\n").encode()

    def markdown(self) -> str:
        return markdown(self.card)


def score_predictions(
    predictions: Path,
    split_dir: Path,
    *,
    sample: bool = False,
    distance: int = 1,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    lenient: bool = False,
    relation_query: Path | None = None,
) -> ScoreResult:
    """Score ``predictions`` against the split in ``split_dir``; InvalidPredictions (strict) or
    ScoringError when they cannot be scored. ``relation_query``: a round directory's files are
    named by that MIRAI relation_query.csv's QueryIds (relation_query_file_ids)."""
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ScoringError(f"resamples must be from 1 to {MAX_RESAMPLES}, got {resamples}")
    split = load_split(split_dir, sample)
    file_ids = None if relation_query is None else relation_query_file_ids(split_dir, sample, relation_query)
    rounds, problems = read_submission(predictions, list(split.gold), file_ids)
    matched, found_problems, missing = match_queries(rounds, split.gold)
    problems = sorted(problems + found_problems, key=_position)
    if problems and not lenient:
        raise InvalidPredictions(str(predictions), problems)
    scores = per_query_scores(matched, split.gold)
    card = scorecard(
        split,
        _digest(Path(predictions)),
        len(rounds),
        scores,
        seed=seed,
        resamples=resamples,
        distance=distance,
        lenient=lenient,
        missing=missing,
        forgiven=problems,
    )
    return ScoreResult(card, missing, problems)


_RECORD_PREFIX = re.compile(r"^(?:line|row|record) ([0-9]+):")
_FILE_PREFIX = re.compile(r"^round([0-9]+)/")


def _position(problem: str) -> tuple[int, int, str]:
    """Sort key putting problems in file order: by line/row/record number, or by round and name."""
    record = _RECORD_PREFIX.match(problem)
    if record:
        return 0, int(record[1]), ""
    file = _FILE_PREFIX.match(problem)
    return (int(file[1]), 0, problem) if file else (0, 0, problem)


def _digest(path: Path) -> str:
    """sha256 of a predictions file, or of a round directory's files (names and contents, sorted)."""
    digest = hashlib.sha256()
    if path.is_dir():
        for n in range(1, count_rounds(path) + 1):
            with os.scandir(path / f"round{n}") as entries:
                files = sorted(e.name for e in entries if e.name.endswith(".json") and e.is_file(follow_symlinks=False))
            for name in files:
                digest.update(f"round{n}/{name}".encode() + b"\0" + _read_capped(path / f"round{n}" / name))
    else:
        digest.update(_read_capped(path))
    return digest.hexdigest()


def bounded(problems: Sequence[str], limit: int = MAX_PROBLEMS_SHOWN) -> list[str]:
    """At most ``limit`` problem lines (each cut to 300 characters), then how many were left out."""
    shown_lines = [p if len(p) <= 300 else p[:300] + "…" for p in problems[:limit]]
    if len(problems) > limit:
        shown_lines.append(f"… and {len(problems) - limit} more")
    return shown_lines
