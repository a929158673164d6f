"""Predictions in MIRAI's layout: ``<dir>/round<N>/<QueryId>.json``, written from a stored
evaluation run and read back for scoring.

MIRAI's agents (``agents/react_agents.py`` in github.com/yecchen/MIRAI) write one file per round
and query: a JSON list holding one object with ``query_id``, ``n_steps``, ``end_state``,
``answer`` (the answer dict as a JSON string, "" when none was extracted), ``gt_answer`` and the
episode's log; its ``agent_evaluation/eval.py`` reads ``answer``, ``end_state`` and ``n_steps``
of the list's last object. ``export_predictions`` writes those files from what
pipeline/evaluation/run.py stores (``results.parquet``, one row per round and query, and
``trajectories.jsonl`` for the episode log), plus ``ranked`` (the run's ranked codes, for MRR and
Hit@10; eval.py ignores it).

``read_predictions`` is for files anyone may hand us (MIRAI's own outputs, a leaderboard
submission): it never executes them (eval.py ``eval``s ``answer``; here it is parsed as a Python
literal), refuses symbolic links, files over MAX_FILE_BYTES, answers over MAX_ANSWER_CHARS and
anything not of MIRAI's shape, each with one line naming the file (PredictionFileError).
``score_round`` scores one round with pipeline.evaluation.metrics, as run.py scores its own.
"""

from __future__ import annotations

import ast
import csv
import errno
import io
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.evaluation.metrics import clean_prediction, hit_at_k, mrr, score
from pipeline.storage import atomic_write_bytes, staged_directory

# MIRAI's files hold the whole episode log; its examples/outputs_raw files are ~20-60 KB.
MAX_FILE_BYTES = 4 * 2**20
# An answer is a dict of at most 20 first-level keys and ~240 second-level codes (< 3 KB as JSON).
MAX_ANSWER_CHARS = 64 * 1024
MAX_RANKED = 1000  # entries of an optional ranked list (there are ~240 second-level codes)
HIT_K = 10  # as run.py (MIRAI Appendix D.8)
_ROUND_DIR = re.compile(r"^round([1-9][0-9]{0,5})$")
_QUERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def is_query_id(text: object) -> bool:
    """Whether ``text`` can name a round file (<query_id>.json): 1-100 letters, digits and "._-",
    starting with a letter or digit, and nothing else (no "/", no newline: fullmatch, not match
    with "$", which also matches before a final newline)."""
    return isinstance(text, str) and _QUERY_ID.fullmatch(text) is not None


# Our end states (docs/evaluation.md) under the names MIRAI's agents write; others are kept as is.
MIRAI_END_STATES = {
    "final_answer": "Final Answer",
    "max_steps": "Max Steps Exceeded",
    "invalid_actions": "Invalid Action",
    "repeated_actions": "Repeated Actions",
}
BASELINE_END_STATE = "baseline"  # a model-free baseline has no episode: n_steps 0


class PredictionFileError(ValueError):
    """A prediction file or directory that is not in MIRAI's layout; the message names it."""


@dataclass(frozen=True)
class Prediction:
    """One query's prediction in one round, as read from its file."""

    query_id: str
    answer: object  # the parsed answer (None when eval.py would read nothing: "" or not a literal)
    answer_text: str
    end_state: str
    n_steps: int
    ranked: list[str] | None  # the file's ``ranked`` list, if it has one


# --- writing ------------------------------------------------------------------------------------


def mirai_query_ids(queries: pl.DataFrame, relation_query_csv: Path) -> dict[str, str]:
    """Our query_id → the QueryId of the same query (DateStr, Actor1CountryCode, Actor2CountryCode)
    in a MIRAI relation_query.csv, so file names match that file. Every query must be there once.
    The file may come from anyone (a handed-over release's mirai/data/): a regular file, read up
    to the bound ``mirai import mirai`` puts on the same file, else ValueError in one line."""
    keys: dict[tuple[str, str, str], list[str]] = {}
    for query_id, day, s, o in _relation_query_rows(Path(relation_query_csv)):
        keys.setdefault((day, s, o), []).append(query_id)
    out = {}
    for query_id, day, s, o in queries.select("query_id", "date", "s", "o").iter_rows():
        found = keys.get((day.isoformat(), s, o), [])
        if len(found) != 1:
            raise ValueError(
                f"{relation_query_csv}: query ({day}, {s}, ?, {o}) ({query_id}) appears {len(found)} times, not once"
            )
        out[query_id] = found[0]
    return out


# MIRAI's relation_query.csv has 20 columns (pipeline/splits/mirai_files.py QUERY_COLUMNS) and a
# row per query (705 in MIRAI's test month, ~2,000 in one of ours). A header of millions of names
# made polars' reader take 74 times the file's size (1.25 GB for a 17 MB header) and abort the
# process once memory ran out; rows are read by the csv module, the four columns kept.
MAX_RELATION_QUERY_COLUMNS = 256
MAX_RELATION_QUERY_ROWS = 200_000
_RELATION_QUERY_KEYS = ("QueryId", "DateStr", "Actor1CountryCode", "Actor2CountryCode")


def _relation_query_rows(path: Path) -> Iterator[tuple[str, str, str, str]]:
    """(QueryId, DateStr, Actor1CountryCode, Actor2CountryCode) of each row of a MIRAI
    relation_query.csv (tab-separated as pandas writes it), read under the import's byte bound,
    at most MAX_RELATION_QUERY_COLUMNS columns and MAX_RELATION_QUERY_ROWS rows; else ValueError
    in one line naming the file. The columns are counted on the text (its TABs) before the csv
    module makes a row of them, so no row is ever held with more."""
    try:
        text = _read_relation_query(path).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (not a MIRAI relation_query.csv)") from None
    tabs = 0  # TABs of the lines of the row being read (a quoted field may span lines)

    def lines() -> Iterator[str]:
        nonlocal tabs
        for number, line in enumerate(io.StringIO(text, newline=""), 1):
            tabs += line.count("\t")
            if tabs >= MAX_RELATION_QUERY_COLUMNS:
                raise ValueError(
                    f"{path} line {number}: more than the {MAX_RELATION_QUERY_COLUMNS} columns a MIRAI "
                    "relation_query.csv may have; refused"
                )
            yield line

    reader = csv.reader(lines(), delimiter="\t", quotechar='"')
    try:
        header = next(reader, [])
        tabs = 0
        missing = [c for c in _RELATION_QUERY_KEYS if c not in header]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)} (not a MIRAI relation_query.csv)")
        where = [header.index(c) for c in _RELATION_QUERY_KEYS]
        for rows, row in enumerate(reader, 1):
            tabs = 0
            if rows > MAX_RELATION_QUERY_ROWS:
                raise ValueError(f"{path}: more than {MAX_RELATION_QUERY_ROWS:,} queries; refused")
            if len(row) != len(header):
                raise ValueError(f"{path} line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
            query_id, day, s, o = (row[i] for i in where)
            yield query_id, day, s, o
    except csv.Error as exc:
        raise ValueError(f"{path} line {reader.line_num}: not a tab-separated file ({exc})") from None


def _read_relation_query(path: Path) -> bytes:
    from pipeline.splits.mirai_files import MAX_FILE_BYTES, TEST_FILE  # the import's bound on this file

    cap = MAX_FILE_BYTES[TEST_FILE]
    try:  # O_NONBLOCK: a FIFO is opened without waiting for a writer, then refused
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{path}: not a regular file; refused")
            data = b"" if info.st_size > cap else fh.read(cap + 1)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    size = max(info.st_size, len(data))
    if size > cap:
        raise ValueError(f"{path}: {size:,} bytes, more than the {cap:,} allowed for a relation_query.csv; refused")
    return data


def _python_repr(answer_json: str) -> str:
    """A gold answer as MIRAI's relation_query.csv writes AnswerDict: the dict's Python repr."""
    return repr(json.loads(answer_json))


def _answer_fields(prediction: str) -> dict[str, str]:
    """The ``answer`` field for a stored prediction (JSON text). eval.py ``eval``s it, where JSON's
    true/false/null are unknown names and void the whole answer, while run.py scored the JSON; when
    the two readings differ, ``answer`` is the scored content (the valid first-level codes with
    their valid second-level codes) and ``answer_as_stored`` keeps the stored text."""
    as_json = clean_prediction(json.loads(prediction))
    if clean_prediction(parse_answer_text(prediction)) == as_json:
        return {"answer": prediction}
    scored = {key: [code for code in as_json.level2 if code[:2] == key] for key in as_json.level1}
    return {"answer": json.dumps(scored), "answer_as_stored": prediction}


def _episode_logs(trajectories: Path) -> dict[tuple[int, str], dict]:
    """(round, query_id) → the json_log MIRAI writes and the extraction's reply, from trajectories.jsonl."""
    logs = {}
    if not trajectories.is_file():
        return logs
    with trajectories.open() as fh:
        for line in fh:
            record = json.loads(line)
            steps = [s for s in record["steps"] if s["kind"] == "react"]
            # MIRAI's ext_request is its extractor's reply (agents/react_agents.py, extract_answer):
            # mode mirai's extraction step, or native mode's final-answer request.
            final = [s["reply"] for s in record["steps"] if s["kind"] in ("extraction", "final_request")]
            logs[(record["round"], record["query_id"])] = {
                "json_log": [
                    {
                        "step": n,
                        "thought": s["thought"],
                        "action": s["action"],
                        "observation": s["observation"] or "",
                        "state": s["action_kind"] if not s["error"] else f"{s['action_kind']}: {s['error']}",
                    }
                    for n, s in enumerate(steps, 1)
                ],
                "ext_request": final[-1] if final else "",
            }
    return logs


def prediction_records(evaluation_dir: Path, query_ids: Mapping[str, str] | None = None) -> dict[int, dict[str, list]]:
    """round (1-based) → {file name stem: the file's content}, from a stored run's directory
    (evaluations/YYYY-MM/<agent>/<query set>/distance=<d>/)."""
    results = pl.read_parquet(evaluation_dir / "results.parquet")
    if "round" not in results.columns:  # a baseline: one round, no episodes
        results = results.with_columns(
            pl.lit(0, pl.Int64).alias("round"),
            pl.lit(BASELINE_END_STATE).alias("end_state"),
            pl.lit(0, pl.Int64).alias("n_actions"),
        )
    logs = _episode_logs(evaluation_dir / "trajectories.jsonl")
    rounds: dict[int, dict[str, list]] = {}
    columns = ("round", "query_id", "gold", "prediction", "ranked", "end_state", "n_actions")
    for round_no, query_id, gold, prediction, ranked, end_state, n_actions in results.select(columns).iter_rows():
        name = query_ids[query_id] if query_ids is not None else query_id
        if not is_query_id(name):
            raise ValueError(f"query id {name!r} cannot be a file name")
        record = {
            "query_id": name,
            "n_steps": n_actions,
            "end_state": MIRAI_END_STATES.get(end_state, end_state),
            **_answer_fields(prediction),
            "gt_answer": _python_repr(gold),
            "ranked": list(ranked),
        } | logs.get((round_no, query_id), {})
        rounds.setdefault(round_no + 1, {})[name] = [record]
    return rounds


def export_predictions(
    evaluation_dir: Path, out: Path, query_ids: Mapping[str, str] | None = None
) -> dict[int, list[Path]]:
    """Write a stored run's predictions as ``out/round<N>/<QueryId>.json`` (QueryId: our query id,
    or ``query_ids[query_id]``). Each round directory is built aside and swapped in whole, so a
    re-run replaces it and a reader never sees half a round. Returns the files per round."""
    rounds = prediction_records(evaluation_dir, query_ids)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for round_no, records in sorted(rounds.items()):
        final = out / f"round{round_no}"
        with staged_directory(final) as staging:
            for name, record in records.items():
                atomic_write_bytes(staging / f"{name}.json", json.dumps(record, indent=4).encode(), sweep=False)
        written[round_no] = sorted(final / f"{name}.json" for name in records)
    return written


# --- reading --------------------------------------------------------------------------------------


def _refuse(path: Path, reason: str) -> PredictionFileError:
    return PredictionFileError(f"{path}: refused: {reason}")


def read_capped_file(path: Path, limit: int, error: type[ValueError], *, missing: str | None = None) -> bytes:
    """A submitted file's bytes: a regular file reached without following a link, at most
    ``limit`` bytes; otherwise ``error("<path>: refused: <reason>")``, ``missing`` being the reason
    for a file that is not there (default: the system's words). score_inputs reads predictions
    files with it too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if missing is not None and exc.errno == errno.ENOENT:
            reason = missing
        else:
            reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise error(f"{path}: refused: {reason}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise error(f"{path}: refused: not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: refused: larger than {limit} bytes")
    return data


def parse_answer_text(text: str) -> object:
    """The answer as eval.py's ``eval(answer)`` reads it, for literals only (never executed): a
    dict, list, string, number... or None when it is not a Python literal ("" included), which
    scores as an empty prediction, as eval.py's ``except`` does."""
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def read_prediction_file(path: Path, query_id: str) -> Prediction:
    """One file of MIRAI's shape, or PredictionFileError naming it."""
    data = read_capped_file(
        path,
        MAX_FILE_BYTES,
        PredictionFileError,
        missing="missing (every query needs a prediction file in every round)",
    )
    try:
        content = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _refuse(path, "not UTF-8 text") from None
    except RecursionError:
        raise _refuse(path, "JSON nested too deeply") from None
    except ValueError as exc:
        raise _refuse(path, f"not JSON ({str(exc).splitlines()[0][:120]})") from None
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        raise _refuse(path, "not MIRAI's shape: a JSON list holding one object")
    record = content[0]
    answer, end_state, n_steps = record.get("answer"), record.get("end_state"), record.get("n_steps")
    if not isinstance(answer, str):
        raise _refuse(path, "'answer' must be a string (the answer dict as JSON, or '')")
    if len(answer) > MAX_ANSWER_CHARS:
        raise _refuse(path, f"'answer' longer than {MAX_ANSWER_CHARS} characters")
    if not isinstance(end_state, str) or len(end_state) > 1000:
        raise _refuse(path, "'end_state' must be a string (of at most 1000 characters)")
    if not isinstance(n_steps, int) or isinstance(n_steps, bool) or not 0 <= n_steps <= 10**6:
        raise _refuse(path, "'n_steps' must be a whole number from 0 to 1000000")
    if "query_id" in record and str(record["query_id"]) != query_id:
        raise _refuse(path, f"'query_id' {str(record['query_id'])[:40]!r} is not the file's query {query_id!r}")
    ranked = record.get("ranked")
    if ranked is not None and not (
        isinstance(ranked, list) and len(ranked) <= MAX_RANKED and all(isinstance(c, str) for c in ranked)
    ):
        raise _refuse(path, f"'ranked' must be a list of at most {MAX_RANKED} strings")
    return Prediction(query_id, parse_answer_text(answer), answer, end_state, n_steps, ranked)


def count_rounds(directory: Path) -> int:
    """How many round directories (round1 … roundN, no gaps) ``directory`` holds."""
    try:
        names = [entry.name for entry in os.scandir(directory) if _ROUND_DIR.match(entry.name)]
    except OSError as exc:
        raise _refuse(directory, exc.strerror or str(exc)) from None
    numbers = sorted(int(_ROUND_DIR.match(name)[1]) for name in names)
    if not numbers or numbers != list(range(1, len(numbers) + 1)):
        raise _refuse(directory, f"expected round1 … roundN directories, found {names[:10] or 'none'}")
    return len(numbers)


def read_predictions(directory: Path, query_ids: Sequence[str], rounds: int | None = None) -> list[list[Prediction]]:
    """Every round's predictions for ``query_ids`` (in that order): ``directory/round<N>/<id>.json``
    for N = 1 … ``rounds`` (default: every round directory there). Files for other queries are
    ignored; a missing or malformed file raises PredictionFileError naming it."""
    directory = Path(directory)
    for query_id in query_ids:
        if not is_query_id(query_id):
            raise ValueError(f"query id {query_id!r} cannot be a file name")
    rounds = count_rounds(directory) if rounds is None else rounds
    out = []
    for n in range(1, rounds + 1):
        round_dir = directory / f"round{n}"
        try:
            mode = os.lstat(round_dir).st_mode
        except FileNotFoundError:
            raise _refuse(round_dir, "missing") from None
        if not stat.S_ISDIR(mode):
            raise _refuse(round_dir, "not a directory (a symbolic link or a file)")
        out.append([read_prediction_file(round_dir / f"{q}.json", q) for q in query_ids])
    return out


# --- scoring --------------------------------------------------------------------------------------


def listed_codes(answer: object) -> list[str]:
    """An answer's second-level codes in the order written: the ranking run.py gives an LLM answer."""
    if not isinstance(answer, dict):
        return []
    return [code for codes in answer.values() if isinstance(codes, list) for code in codes if isinstance(code, str)]


def score_round(predictions: Sequence[Prediction], answers: Sequence[Mapping[str, Sequence[str]]]) -> dict[str, float]:
    """One round's metrics, as run.py's score_forecasts computes them: MIRAI's set metrics, MRR
    and Hit@10 of the file's ``ranked`` list (else the answer's codes in the order written)."""
    rankings = [p.ranked if p.ranked is not None else listed_codes(p.answer) for p in predictions]
    return score([p.answer for p in predictions], answers) | {
        "mrr": mrr(rankings, answers),
        f"hit_at_{HIT_K}": hit_at_k(rankings, answers, HIT_K),
    }
