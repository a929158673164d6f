"""Evaluation runs: forecast a split's queries, score them, store the record; and the leaderboard.

One run = one agent × one month × one query set (``queries`` or ``queries_sample``) × one distance,
stored as a directory ``evaluations/YYYY-MM/<agent>/<query_set>/distance=<d>/`` holding

- ``results.parquet``: per query its gold and predicted answer dicts, the ranked list and every
  per-query metric;
- ``scores.json``: the metrics (mean and std over rounds), agent, month, distance, the
  contamination flag with its reason, and the code version;
- ``trajectories.jsonl`` (LLM agents): one line per round and query, every step of the episode.

While an LLM run is in progress its finished episodes are checkpointed in
``distance=<d>.episodes.jsonl`` beside that directory, so a killed run resumes (docs/evaluation.md,
"Concurrency, rate limits and resume"); the file goes once the run is stored.

An agent refused on a month (its knowledge cutoff is not before it) leaves ``refusal.json`` in
``evaluations/YYYY-MM/<agent>/<query_set>/`` instead.

The directory is built aside and swapped in whole, so a reader never pairs new results with old
scores. The leaderboard (pipeline/evaluation/board.py) collects every scores.json; contaminated runs
are listed but never ranked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.lookup import map_iso_to_country_name
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB, SPARES
from pipeline.evaluation.agents import (
    AgentSpec,
    Query,
    Trajectory,
    code_libraries,
    react_environment,
    run_react,
    run_single_turn,
)
from pipeline.evaluation.baselines import FORECAST_SCHEMA, default_top_k, forecast
from pipeline.evaluation.clients import client_for
from pipeline.evaluation.llm import ChatClient, ClientSettings, ModelUnavailable
from pipeline.evaluation.metrics import (
    SET_METRICS,
    aggregate_answers,
    aggregate_rounds,
    gold_relations,
    hit,
    hit_at_k,
    mrr,
    query_scores,
    reciprocal_rank,
    score,
)
from pipeline.evaluation.mirai_predictions import is_query_id
from pipeline.evaluation.model_server import runtime as model_server_runtime
from pipeline.evaluation.prompts import PROMPT_VERSION
from pipeline.evaluation.registry import Agent, eligibility
from pipeline.evaluation.score_inputs import MAX_PREDICTIONS_BYTES, MAX_RECORDS
from pipeline.evaluation.throughput import (
    SANDBOX_SHARED_MB,
    SPARE_PRIVATE_MB,
    UNLIMITED,
    EpisodeLog,
    Progress,
    RateLimiter,
    RateLimits,
    SandboxSlots,
    sandbox_cap,
    sandbox_start_mb,
)
from pipeline.reference.tables import iso3_codes
from pipeline.release.layout import DATABASE_TABLES, check_inside, shown
from pipeline.splits.database import MonthNotReady
from pipeline.splits.schema import QUERIES_SCHEMA
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    staged_directory,
)
from pipeline.untrusted_parquet import UntrustedParquetError, check_footer, read_untrusted_parquet, text_bytes
from pipeline.version import code_version

EVALUATION_VERSION = "evaluation-v1"
REFUSAL_FILE = "refusal.json"
RANK_METRIC = "level2_f1"
# Within a tier the rows are listed by second-level F1, then by these (all higher-is-better), then name.
TIEBREAK_METRICS = ("level1_f1", "mrr")
# Said wherever the leaderboard shows (demo summary, Dagster metadata, chart, HTML page,
# docs/evaluation.md); board.rank applies it.
RANK_RULE = (
    "rank: within each month, query set and distance, rows are taken in order of second-level F1; a row whose "
    "95% bootstrap interval (over queries) of second-level F1 overlaps that of its tier's first row shares that row's rank, "
    "otherwise it starts a new tier ranked by its position (1 + the rows above it); within a tier rows are "
    "listed by second-level F1, then first-level F1, MRR and name; runs that scored 0 on all three and "
    "contaminated runs are not ranked and listed last"
)
HIT_K = 10  # Hit@10, as in MIRAI (arXiv:2407.01231) Appendix D.8
_MONTH_FILE = re.compile(r"^month=(\d{4})-(\d{2})\.parquet$")
# A queries file is read only within these bounds, checked on its footer before a row is decoded
# (a month has ~2,000 queries, ~200 KB): no more rows than `mirai score` reads predictions, and no
# more bytes, on disk or decoded, than a predictions file may have.
MAX_QUERIES = MAX_RECORDS
MAX_QUERIES_BYTES = MAX_PREDICTIONS_BYTES
MAX_QUERIES_DECODED_BYTES = 4 * MAX_QUERIES_BYTES
MAX_QUERY_CELL_BYTES = 64 * 2**10  # a gold answer_dict of every CAMEO code is ~3 KB
# The columns an evaluation reads (s_name and o_name too, when present: the prompt's names).
QUERY_COLUMNS = ("query_id", "date", "s", "o", "answer_dict")


class NotEligible(RuntimeError):
    """The agent's knowledge cutoff is not before the month; the message says why."""


class InvalidQueries(ValueError):
    """A queries file is not a split's; the message is one line naming the file and the problem."""


def load_queries(source: pl.DataFrame | Path | str, query_set: str | None = None) -> tuple[pl.DataFrame, str]:
    """The queries and the name of their set: a split directory means its queries.parquet, a
    parquet file is named by its stem (queries_sample), a frame by ``query_set`` (default
    "queries"). A file is checked as read_queries does."""
    if isinstance(source, pl.DataFrame):
        return source, query_set or "queries"
    path = Path(source)
    if path.is_dir():
        path = path / "queries.parquet"
    return read_queries(path), query_set or path.stem


def read_queries(path: Path) -> pl.DataFrame:
    """A split's queries file, checked before anything uses it, since it may come from a release
    directory anyone handed over (docs/evaluate-your-agent.md, "3. Run an agent"): its size and
    row count from the footer, before a row is decoded; the columns an evaluation reads, with
    QUERIES_SCHEMA's types and no nulls; unique query ids that are file names (they name MIRAI's
    round<N>/<query_id>.json files); country codes the reference tables know; gold answers as
    `mirai score` takes them (CAMEO codes); one month. Raises InvalidQueries."""

    def refused(problem: str) -> InvalidQueries:
        return InvalidQueries(f"{path}: {problem}; refused")

    try:
        if not os.path.isfile(path):
            raise refused("not a regular file")
        size = os.path.getsize(path)
        if size > MAX_QUERIES_BYTES:
            raise refused(f"{size:,} bytes, more than the {MAX_QUERIES_BYTES:,} a split may take")
        check_footer(path)
        footer = pq.read_metadata(path)
    except UntrustedParquetError as exc:
        raise refused(str(exc)) from None
    except (OSError, pa.ArrowException) as exc:
        raise refused(f"not a parquet file ({type(exc).__name__})") from None
    decoded = sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    if footer.num_rows > MAX_QUERIES:
        raise refused(f"{footer.num_rows:,} rows, more than the {MAX_QUERIES:,} a split may hold")
    if max(size, decoded) > MAX_QUERIES_BYTES:
        raise refused(f"{max(size, decoded):,} bytes, more than the {MAX_QUERIES_BYTES:,} a split may take")
    try:  # the footer is the file's word: decoded where a lie costs a child process
        frame = read_untrusted_parquet(Path(path).read_bytes(), MAX_QUERIES_DECODED_BYTES)
    except OSError as exc:
        raise refused(f"not a parquet file ({type(exc).__name__})") from None
    except UntrustedParquetError as exc:
        raise refused(str(exc)) from None
    longest, total = text_bytes(frame)
    if longest > MAX_QUERY_CELL_BYTES:
        raise refused(f"a text cell longer than {MAX_QUERY_CELL_BYTES:,} bytes")
    if total > MAX_QUERIES_BYTES:
        raise refused(f"more than {MAX_QUERIES_BYTES:,} bytes of text")
    present = [c for c in ("s_name", "o_name") if c in frame.columns]
    for column in (*QUERY_COLUMNS, *present):
        if column not in frame.columns:
            raise refused(f"no {column!r} column (a split's queries file has {', '.join(QUERIES_SCHEMA)})")
        if frame.schema[column] != QUERIES_SCHEMA[column]:
            raise refused(f"column {column!r} is {frame.schema[column]}, not {QUERIES_SCHEMA[column]}")
        if frame.get_column(column).null_count():
            raise refused(f"column {column!r} holds {frame.get_column(column).null_count()} null(s)")
    if frame.is_empty():
        raise refused("no queries")
    ids = frame.get_column("query_id")
    bad = next((q for q in ids if not is_query_id(q)), None)
    if bad is not None:
        raise refused(f"query_id {shown(bad)} is not 1-100 letters, digits and '._-' starting alphanumeric")
    if ids.is_duplicated().any():
        raise refused(f"query_id {shown(ids.filter(ids.is_duplicated())[0])} appears twice")
    countries = iso3_codes()
    for column in ("s", "o"):
        unknown = frame.get_column(column).filter(~frame.get_column(column).is_in(list(countries)))
        if unknown.len():
            raise refused(f"{column} {shown(unknown[0])} is not a country code the reference tables know")
    for query_id, answer in frame.select("query_id", "answer_dict").iter_rows():
        try:
            gold_relations(json.loads(answer))
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise refused(f"query {query_id}: answer_dict is not a gold answer ({shown(str(exc))})") from None
    months = frame.get_column("date").dt.truncate("1mo").unique().sort()
    if months.len() != 1:
        raise refused(
            f"its queries fall in {months.len()} months ({months[0].isoformat()[:7]} to {months[-1].isoformat()[:7]}), not one"
        )
    return frame


def release_queries(release: Path, query_set: str) -> pl.DataFrame:
    """The queries of a release directory for `mirai evaluate`, once what the run reads is safe to
    read: the directory may be any the user was handed, not one `mirai download` verified
    (docs/evaluate-your-agent.md, "3. Run an agent"). The queries file and every database month
    must be regular files inside the directory (check_inside: no link out of it); the queries pass
    read_queries and fall in the release's month, the newest of its database. Raises
    UnsafeRelease or InvalidQueries; the database files' contents are EventDatabase's to check."""
    queries_file = check_inside(release, release / f"{query_set}.parquet")
    months = set()
    for table in DATABASE_TABLES:
        for path in sorted((release / "database" / table).glob("month=*.parquet")):
            check_inside(release, path)
            if m := _MONTH_FILE.match(path.name):
                months.add(f"{m[1]}-{m[2]}")
    frame = read_queries(queries_file)
    month = frame.get_column("date")[0].isoformat()[:7]
    if month != max(months, default=None):
        raise InvalidQueries(
            f"{queries_file}: its queries are dated {month}, but the release's database ends in "
            f"{max(months, default='no month')} (a release of month M holds the database up to M); refused"
        )
    return frame


def split_month(queries: pl.DataFrame) -> date:
    """The one month every query falls in."""
    months = queries.select(pl.col("date").dt.truncate("1mo").unique()).to_series().to_list()
    if len(months) != 1:
        raise ValueError(f"queries must come from one month, found {sorted(months) or 'none'}")
    return months[0]


def load_history(data_dir: Path | str, until: date) -> pl.LazyFrame:
    """(date, s, r, o) of every event in the event database dated on or before ``until``; only
    the monthly files that can hold such events are read."""
    directory = DataLayout(data_dir).database_dir() / "events"
    paths = sorted(
        path
        for path in directory.glob("month=*.parquet")
        if (m := _MONTH_FILE.match(path.name)) and date(int(m[1]), int(m[2]), 1) <= until
    )
    if not paths:
        raise MonthNotReady(
            f"no event database month up to {until} under {directory}; materialise event_database first"
        )
    return pl.scan_parquet(paths).select("date", "s", "r", "o").filter(pl.col("date") <= until)


def admit(agent: Agent, month: date, force: bool) -> tuple[bool, str]:
    """(contaminated, reason): an ineligible agent runs only when forced, and is then flagged."""
    eligible, reason = eligibility(agent, month)
    if not eligible and not force:
        raise NotEligible(f"{agent.name} on {month:%Y-%m}: {reason} (force the run to store it as contaminated)")
    return not eligible, reason


def score_forecasts(queries: pl.DataFrame, forecasts: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, float]]:
    """Per-query results (query, gold, prediction, ranked list, every per-query metric) and the
    averaged metrics: MIRAI's set metrics plus MRR and Hit@10 of the ranked lists."""
    frame = queries.select("query_id", "date", "s", "o", pl.col("answer_dict").alias("gold")).join(
        forecasts.select("query_id", pl.col("answer_dict").alias("prediction"), "ranked"),
        on="query_id",
        how="left",
        maintain_order="left",
    )
    if frame.get_column("prediction").null_count():
        raise ValueError("some queries have no forecast")
    answers = [json.loads(a) for a in frame.get_column("gold")]
    predictions = [json.loads(p) for p in frame.get_column("prediction")]
    rankings = frame.get_column("ranked").to_list()
    per_query = pl.DataFrame(
        [
            query_scores(p, a) | {"reciprocal_rank": reciprocal_rank(r, a), f"hit_at_{HIT_K}": hit(r, a, HIT_K)}
            for p, a, r in zip(predictions, answers, rankings)
        ],
        schema=dict.fromkeys([*SET_METRICS, "reciprocal_rank", f"hit_at_{HIT_K}"], pl.Float64),
    )
    metrics = score(predictions, answers) | {
        "mrr": mrr(rankings, answers),
        f"hit_at_{HIT_K}": hit_at_k(rankings, answers, HIT_K),
    }
    return pl.concat([frame, per_query], how="horizontal"), metrics


def round_aggregates(queries: pl.DataFrame, results: pl.DataFrame, *, steps: bool) -> dict:
    """scores.json's across-round aggregates besides the mean (docs/evaluation.md, "Rounds and
    their aggregates"): ``max_at_k`` and ``repeated`` (``metrics.aggregate_answers``) from the
    predictions of every round in ``results`` (a results table without a ``round`` column is one
    round), and ``avg_steps``, the mean ``n_actions`` over every (round, query) episode when
    ``steps`` (ReAct agents; MIRAI's ``n_steps_avg``), else None."""
    gold = {query_id: json.loads(answer) for query_id, answer in queries.select("query_id", "answer_dict").iter_rows()}
    if "round" not in results.columns:
        results = results.with_columns(pl.lit(0, pl.Int64).alias("round"))
    rounds = [
        {query_id: json.loads(prediction) for query_id, prediction in part.select("query_id", "prediction").iter_rows()}
        for part in results.sort("round", maintain_order=True).partition_by("round", maintain_order=True)
    ]
    aggregates = aggregate_answers(rounds, gold)
    return {
        "max_at_k": aggregates["max_at_k"],
        "repeated": aggregates["repeated"],
        "avg_steps": float(results.get_column("n_actions").mean()) if steps else None,
    }


def write_evaluation(
    directory: Path, results: pl.DataFrame, record: dict, extra_files: Mapping[str, bytes] | None = None
) -> dict:
    """Write results.parquet, scores.json and any ``extra_files`` (name → bytes) into a staging
    directory and swap it into place; return the record as stored (with the sha256 of
    results.parquet)."""
    with staged_directory(directory) as staging:
        for name, data in (extra_files or {}).items():
            atomic_write_bytes(staging / name, data)
        atomic_write_parquet(results, staging / "results.parquet", metadata={"evaluation_version": EVALUATION_VERSION})
        record = record | {"results_sha256": hashlib.sha256((staging / "results.parquet").read_bytes()).hexdigest()}
        atomic_write_bytes(staging / "scores.json", (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return record


def evaluate_baseline(
    queries: pl.DataFrame | Path | str,
    data_dir: Path | str,
    agent: Agent,
    distance: int,
    *,
    query_set: str | None = None,
    force: bool = False,
) -> tuple[pl.DataFrame, dict]:
    """Forecast every query with a model-free baseline from the history visible at distance
    ``distance`` days, score it, and store the run (see the module doc). Returns the per-query
    results and the scores record."""
    if agent.kind != "baseline":
        raise ValueError(f"{agent.name} is a {agent.kind} agent, not a baseline")
    frame, query_set = load_queries(queries, query_set)
    month = split_month(frame)
    contaminated, reason = admit(agent, month, force)
    history = load_history(data_dir, frame.get_column("date").max() - timedelta(days=distance))
    top_k = agent.top_k
    if agent.baseline == "frequency" and top_k is None:
        top_k = default_top_k(frame, history, distance)
    forecasts = forecast(agent.baseline, frame, history, distance_days=distance, top_k=top_k)
    results, metrics = score_forecasts(frame, forecasts)
    record = _record(agent, month, query_set, distance, aggregate_rounds([metrics]), contaminated, reason)
    record = {"agent": agent.name, "kind": agent.kind, "baseline": agent.baseline, "top_k": top_k} | record
    record |= round_aggregates(frame, results, steps=False)
    return results, write_evaluation(
        DataLayout(data_dir).evaluation_dir(month, agent.name, query_set, distance), results, record
    )


def _record(
    agent: Agent, month: date, query_set: str, distance: int, rounds: dict, contaminated: bool, reason: str
) -> dict:
    """The scores.json fields every run has, baseline or LLM."""
    return {
        "agent": agent.name,
        "kind": agent.kind,
        "month": f"{month:%Y-%m}",
        "query_set": query_set,
        "distance": distance,
        "n": rounds["n"],
        "rounds": rounds["rounds"],
        "metrics": rounds["mean"],
        "metrics_std": rounds["std"],
        "knowledge_cutoff": agent.knowledge_cutoff.isoformat() if agent.knowledge_cutoff else None,
        "mode": agent_mode(agent),
        "tools": agent_tools(agent),
        "contaminated": contaminated,
        "eligibility": reason,
        "code_version": code_version(),
        "evaluation_version": EVALUATION_VERSION,
        "evaluated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def agent_mode(agent: Agent) -> str | None:
    """The harness mode of an LLM agent (native unless the registry says mirai); None for a
    baseline, which has no prompts or loop."""
    return None if agent.kind != "llm" else agent.mode or "native"


def agent_tools(agent: Agent) -> str | None:
    """The API subset a ReAct agent gets (full unless the registry says kg or news); None for an
    agent that calls no tools."""
    return None if agent.kind != "llm" or agent.strategy != "react" else agent.tools or "full"


# Fields added after the first evaluations: left out of the hash at these values, so the entries
# evaluated before they existed keep their hashes (and are not evaluated again).
_HASH_DEFAULTS = {"mode": (None, "native"), "tools": (None, "full")}
# How fast and at what price an agent runs, not what it answers: changing them neither re-runs the
# agent nor invalidates a half-finished run's checkpoint (docs/evaluation.md, "Concurrency").
# The sandbox's memory budget is a run-time budget like max_tokens: recorded with the harness (and
# so in the checkpoint's key), not a new agent.
_NOT_HASHED = {"concurrency", "price_per_million_input_tokens", "price_per_million_output_tokens", "sandbox_memory_mb"}
_ENDPOINT_NOT_HASHED = {"requests_per_minute", "tokens_per_minute"}


def agent_config_hash(agent: Agent) -> str:
    """A short hash of the agent's registry entry, without the _NOT_HASHED throughput and price
    settings: a changed entry is a new agent to evaluate (the sensor's run keys carry it)."""
    fields = {
        k: v
        for k, v in dataclasses.asdict(agent).items()
        if k not in _NOT_HASHED and v not in _HASH_DEFAULTS.get(k, ())
    }
    if fields.get("endpoint"):
        fields["endpoint"] = {k: v for k, v in fields["endpoint"].items() if k not in _ENDPOINT_NOT_HASHED}
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# --- LLM agents -----------------------------------------------------------------------------------


def _queries(frame: pl.DataFrame) -> list[Query]:
    """The split's queries with country names (looked up for a frame without the split's name
    columns)."""
    if "s_name" not in frame.columns:
        frame = frame.with_columns(
            pl.col("s").map_elements(map_iso_to_country_name, return_dtype=pl.String).alias("s_name"),
            pl.col("o").map_elements(map_iso_to_country_name, return_dtype=pl.String).alias("o_name"),
        )
    return [Query(*row) for row in frame.select("query_id", "date", "s", "o", "s_name", "o_name").iter_rows()]


def _listed_codes(answer: object) -> list[str]:
    """An LLM answer has no ranking; its second-level codes in the order the model listed them
    stand in for one, so MRR and Hit@10 read "how early the model named a correct code"."""
    if not isinstance(answer, dict):
        return []
    return [code for codes in answer.values() if isinstance(codes, list) for code in codes if isinstance(code, str)]


def _episode_columns(records: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "end_state": [r["end_state"] for r in records],
            "answer_source": [r["answer_source"] for r in records],
            "n_actions": [r["n_actions"] for r in records],
            "tokens_in": [r["tokens_in"] for r in records],
            "tokens_out": [r["tokens_out"] for r in records],
            "model_s": [r["model_s"] for r in records],
            "env_s": [r["env_s"] for r in records],
            "wall_s": [r["wall_s"] for r in records],
        },
        schema={
            "end_state": pl.String,
            "answer_source": pl.String,
            "n_actions": pl.Int64,
            "tokens_in": pl.Int64,
            "tokens_out": pl.Int64,
            "model_s": pl.Float64,
            "env_s": pl.Float64,
            "wall_s": pl.Float64,
        },
    )


class _SpareDemand:
    """The warm spares a concurrent ReAct run keeps (sandbox.SparePool): one per live sandbox
    slot, started ahead while the first replies are awaited, and never more than the episodes
    that have yet to start a sandbox, so that no spare is started only to be stopped unused."""

    def __init__(self, libraries: tuple[str, ...], slots: int, episodes: int):
        self._libraries, self._slots, self._left = libraries, slots, episodes
        self._lock = threading.Lock()
        self._n = min(slots, episodes)
        SPARES.reserve(libraries, self._n)

    def started(self) -> None:
        """One episode has taken its sandbox, or ended without one."""
        with self._lock:
            self._left -= 1
            old, self._n = self._n, min(self._slots, self._left)
            if old != self._n:
                SPARES.resize(self._libraries, old, self._n)

    def release(self) -> None:
        with self._lock:
            SPARES.release(self._libraries, self._n)


class _SlottedEnvironment:
    """An episode's Environment whose sandbox counts against the run's SandboxSlots: the first
    code run (which starts the sandbox) waits for a slot, closing (which stops it) frees it.
    ``started`` is called once the slot is taken (the run's _SpareDemand)."""

    def __init__(self, env, slots: SandboxSlots, started: Callable[[], None]):
        self._env, self._slots, self._held, self._started = env, slots, False, started

    def run_code(self, code: str, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        if not self._held:
            self._slots.acquire()
            self._held = True
            self._started()
        return self._env.run_code(code, timeout_s=timeout_s, memory_mb=memory_mb)

    @property
    def sandbox_report(self) -> dict | None:
        return self._env.sandbox_report

    def __enter__(self) -> _SlottedEnvironment:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._env.close()
        finally:
            if self._held:
                self._held = False
                self._slots.release()


def _episode(
    client: ChatClient,
    spec: AgentSpec,
    query: Query,
    distance: int,
    database: EventDatabase | None,
    database_lock: threading.Lock,
    sandboxes: SandboxSlots,
    started: Callable[[], None],
) -> Trajectory:
    cutoff = query.date - timedelta(days=distance)
    if spec.strategy != "react":
        return run_single_turn(client, spec, query, cutoff)

    def environment():
        # EventDatabase loads its months on first use with no lock of its own; opening an
        # environment is a concat and a slice, and its sandbox starts later, in this episode's thread.
        with database_lock:
            env = react_environment(database, spec, query.date, distance)
        return _SlottedEnvironment(env, sandboxes, started)

    return run_react(client, spec, query, cutoff, environment, first_day=database.start)


def _failed_episode(spec: AgentSpec, query: Query, exc: Exception) -> Trajectory:
    """An episode the harness itself could not finish: stored in end state "error" like a model
    failure, so that the other episodes' results are kept."""
    trajectory = Trajectory(query.query_id, spec.strategy, spec.action_type if spec.strategy == "react" else None)
    trajectory.end_state, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
    return trajectory


def episode_concurrency(agent: Agent, requested: int | None = None) -> int:
    """Episodes at once: ``requested`` or the agent's own (registry.Agent.episode_concurrency),
    never more than 1 for a GGUF model (its server answers one request at a time). (Their sandboxes are bounded apart, by
    ``sandbox_slots``: an episode waiting on the model holds no sandbox until its first code.)"""
    if agent.endpoint is None:
        return 1
    return max(1, requested or agent.episode_concurrency)


def sandbox_slots(concurrency: int, tables_mb: float, memory_mb: int = DEFAULT_MEMORY_MB) -> SandboxSlots:
    """Live sandboxes at most: as many as the episodes, and no more than fit in the machine's
    available memory (throughput.sandbox_cap), each with a warm spare beside it (the run reserves
    one spare per slot: sandbox.SparePool), all mapping ``tables_mb`` of gated tables and the
    libraries' code (shared, once), and each sandbox allowed ``memory_mb`` on top of its start."""
    per_pair_mb = sandbox_start_mb(tables_mb) + SPARE_PRIVATE_MB
    shared_mb = tables_mb + SANDBOX_SHARED_MB
    return SandboxSlots(min(concurrency, sandbox_cap(memory_mb, per_pair_mb, shared_mb=shared_mb)))


def gated_tables_mb(database: EventDatabase, frame: pl.DataFrame, distance: int) -> float:
    """The largest gated tables an episode's sandbox gets: those of the latest query's cutoff."""
    events, news = database.gated_tables(frame.get_column("date").max() - timedelta(days=distance))
    return (events.estimated_size() + news.estimated_size()) / 2**20


def run_episodes(
    client: ChatClient,
    spec: AgentSpec,
    queries: list[Query],
    rounds: int,
    distance: int,
    database: EventDatabase | None,
    *,
    concurrency: int,
    log: EpisodeLog,
    progress: Progress,
    sandboxes: SandboxSlots | None = None,
) -> list[list[dict]]:
    """Every (round, query) episode's trajectory record, in round then query order whatever the
    order they finished in; episodes in ``log`` are not run again, and each one run is appended to
    it as it finishes. ModelUnavailable stops the run (after the episodes in flight finish).
    ``sandboxes`` bounds the live sandboxes (default: one per episode in flight)."""
    lock = threading.Lock()
    sandboxes = sandboxes or SandboxSlots(concurrency)
    records: dict[tuple[int, str], dict] = dict(log.done)
    for record in records.values():
        progress.done += 1
        progress.tokens_in += record["tokens_in"]
        progress.tokens_out += record["tokens_out"]
    pending = [(r, q) for r in range(rounds) for q in queries if (r, q.query_id) not in records]
    spares = (
        _SpareDemand(code_libraries(spec), sandboxes.n, len(pending))
        if spec.strategy == "react" and concurrency > 1 and pending
        else None
    )

    def work(round_no: int, query: Query) -> None:
        once = threading.Lock()  # the episode counts once in the spare demand: at its sandbox or its end

        def started() -> None:
            if spares is not None and once.acquire(blocking=False):
                spares.started()

        try:
            trajectory = _episode(client, spec, query, distance, database, lock, sandboxes, started)
        except ModelUnavailable:
            raise
        except Exception as exc:
            trajectory = _failed_episode(spec, query, exc)
        finally:
            started()
        # Through JSON once, so that a fresh episode's record and a resumed one's are the same.
        record = json.loads(json.dumps(trajectory.record(), default=str))
        log.append(round_no, query.query_id, record)
        records[(round_no, query.query_id)] = record
        progress.add(record["tokens_in"], record["tokens_out"])

    if concurrency <= 1:
        for round_no, query in pending:
            work(round_no, query)
    else:
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="episode")
        try:
            for future in as_completed([pool.submit(work, r, q) for r, q in pending]):
                future.result()  # the first failure (ModelUnavailable) stops the run
        finally:
            # On a failure or an interruption (a terminated Dagster run) no new episode starts;
            # those in flight finish and are checkpointed, so the next run need not redo them.
            pool.shutdown(wait=True, cancel_futures=True)
            if spares is not None:
                spares.release()
    return [[records[(r, q.query_id)] for q in queries] for r in range(rounds)]


def _model_description(agent: Agent) -> dict:
    if agent.endpoint is not None:
        return {"base_url": agent.endpoint.base_url, "model": agent.endpoint.model}
    size = agent.gguf.stat().st_size if agent.gguf.exists() else None
    return {"gguf": agent.gguf.name, "gguf_bytes": size, "runtime": model_server_runtime()}


def cost_usd(agent: Agent, tokens_in: int, tokens_out: int) -> float | None:
    """The run's estimated cost from the registry's prices per million tokens; None without them."""
    if agent.price_per_million_input_tokens is None or agent.price_per_million_output_tokens is None:
        return None
    return (tokens_in * agent.price_per_million_input_tokens + tokens_out * agent.price_per_million_output_tokens) / 1e6


def endpoint_limits(agent: Agent, defaults: RateLimits = UNLIMITED) -> RateLimits:
    """The endpoint's requests and tokens per minute from its registry entry, else ``defaults``
    (LlmRuntime's)."""
    e = agent.endpoint
    return RateLimits(
        (e and e.requests_per_minute) or defaults.requests_per_minute,
        (e and e.tokens_per_minute) or defaults.tokens_per_minute,
    )


def checkpoint_path(directory: Path) -> Path:
    """A run's episode checkpoint: beside its directory (which is swapped in whole at the end)."""
    return directory.with_name(f"{directory.name}.episodes.jsonl")


def _checkpoint_key(agent: Agent, harness: dict, frame: pl.DataFrame, distance: int) -> str:
    """What an episode's result depends on: the agent, the harness and the queries."""
    queries = frame.select("query_id", "date", "s", "o").rows()
    canonical = json.dumps([agent_config_hash(agent), harness, distance, queries], sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def evaluate_agent(
    queries: pl.DataFrame | Path | str,
    data_dir: Path | str,
    agent: Agent,
    distance: int,
    *,
    query_set: str | None = None,
    force: bool = False,
    client: ChatClient | None = None,
    client_settings: ClientSettings | None = None,
    database: EventDatabase | None = None,
    concurrency: int | None = None,
    limits: RateLimits = UNLIMITED,
    progress: Callable[[str], None] | None = None,
    progress_interval_s: float = 30.0,
    sandboxes: SandboxSlots | None = None,
    sandbox_memory_mb: int = DEFAULT_MEMORY_MB,
) -> tuple[pl.DataFrame, dict]:
    """Run an LLM agent on every query, ``agent.rounds`` times, score each round and store the
    run with its trajectories (see the module doc). ``client`` defaults to the one the registry
    entry describes, its requests bounded by the endpoint's limits (the entry's, else ``limits``);
    ``database`` (for ReAct) to the data dir's event database, loaded once for all queries.
    Episodes run ``episode_concurrency`` at once, their live sandboxes bounded by ``sandboxes``
    (default ``sandbox_slots``), each allowed the agent's ``sandbox_memory_mb``, else
    ``sandbox_memory_mb``, and as many warm spares kept ready; each finished one is checkpointed beside the
    run's directory, so a killed run resumes where it stopped. ``progress`` gets a line (episodes
    done, tokens) at most every ``progress_interval_s``. Returns the per-query results of every
    round and the scores record."""
    if agent.kind != "llm":
        raise ValueError(f"{agent.name} is a {agent.kind} agent, not an llm agent")
    frame, query_set = load_queries(queries, query_set)
    month = split_month(frame)
    contaminated, reason = admit(agent, month, force)
    client_settings = client_settings or ClientSettings()
    spec = AgentSpec(
        agent.strategy,
        agent.action_type,
        agent.temperature,
        agent.max_steps,
        client_settings.max_tokens,
        mode=agent_mode(agent),
        tools=agent_tools(agent) or "full",
        memory_mb=agent.sandbox_memory_mb or sandbox_memory_mb,
    )
    owned_client = client is None
    client = client or client_for(agent, client_settings, RateLimiter(endpoint_limits(agent, limits)))
    if spec.strategy == "react" and database is None:
        database = EventDatabase(data_dir)
    items = _queries(frame)
    harness = {
        "prompt_version": PROMPT_VERSION,
        "max_tokens": client_settings.max_tokens,
        "n_ctx": client_settings.n_ctx,
        "seed": client_settings.seed,
        # A code block's memory budget: beyond it a block's observation is a MemoryError.
        **({"sandbox_memory_mb": spec.memory_mb} if spec.strategy == "react" else {}),
    }
    concurrency = episode_concurrency(agent, concurrency)
    if sandboxes is None and spec.strategy == "react" and concurrency > 1:
        sandboxes = sandbox_slots(concurrency, gated_tables_mb(database, frame, distance), spec.memory_mb)
    directory = DataLayout(data_dir).evaluation_dir(month, agent.name, query_set, distance)
    log = EpisodeLog(checkpoint_path(directory), _checkpoint_key(agent, harness, frame, distance))
    try:
        episodes = run_episodes(
            client,
            spec,
            items,
            agent.rounds,
            distance,
            database,
            concurrency=concurrency,
            log=log,
            progress=Progress(agent.rounds * len(items), progress, progress_interval_s),
            sandboxes=sandboxes,
        )
    finally:
        if owned_client:  # a client handed in is its caller's to close (it may serve every distance)
            client.close()
    per_round, results, lines, sandboxes = [], [], [], set()
    for round_no, records in enumerate(episodes):
        forecasts = pl.DataFrame(
            {
                "query_id": [r["query_id"] for r in records],
                "ranked": [_listed_codes(r["answer"]) for r in records],
                "answer_dict": [json.dumps(r["answer"], sort_keys=True) for r in records],
            },
            schema=FORECAST_SCHEMA,
        )
        scored, metrics = score_forecasts(frame, forecasts)
        per_round.append(metrics)
        results.append(
            pl.concat(
                [scored.with_columns(pl.lit(round_no, pl.Int64).alias("round")), _episode_columns(records)],
                how="horizontal",
            )
        )
        lines.extend(json.dumps({"round": round_no} | r, default=str) for r in records)
        sandboxes.update(json.dumps(r["sandbox"], sort_keys=True) for r in records if r["sandbox"] is not None)
    results = pl.concat(results)
    trajectories_jsonl = ("\n".join(lines) + "\n").encode()
    tokens_in, tokens_out = int(results.get_column("tokens_in").sum()), int(results.get_column("tokens_out").sum())
    record = _record(agent, month, query_set, distance, aggregate_rounds(per_round), contaminated, reason) | {
        "strategy": agent.strategy,
        "action_type": agent.action_type,
        "temperature": agent.temperature,
        "max_steps": agent.max_steps,
        "model": _model_description(agent),
        "harness": harness,
        "agent_config_hash": agent_config_hash(agent),
        "end_states": dict(sorted(results.get_column("end_state").value_counts().iter_rows())),
        "answer_sources": dict(sorted(results.get_column("answer_source").value_counts().iter_rows())),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost_usd": cost_usd(agent, tokens_in, tokens_out),
        "model_s": float(results.get_column("model_s").sum()),
        "trajectories_sha256": hashlib.sha256(trajectories_jsonl).hexdigest(),
        # The confinement layers the code-running sandboxes had (docs/agent_api.md, "Threat
        # model"): one entry unless they differed between episodes; empty if no code ran.
        "sandbox": [json.loads(layers) for layers in sorted(sandboxes)],
    }
    record |= round_aggregates(frame, results, steps=agent.strategy == "react")
    stored = write_evaluation(directory, results, record, {"trajectories.jsonl": trajectories_jsonl})
    log.remove()
    return results, stored


# --- refusals -------------------------------------------------------------------------------------


def refusal_path(data_dir: Path | str, month: date, agent_name: str, query_set: str) -> Path:
    """evaluations/YYYY-MM/<agent>/<query_set>/refusal.json: next to the per-distance runs,
    since eligibility does not depend on the distance."""
    return DataLayout(data_dir).evaluation_dir(month, agent_name, query_set, 1).parent / REFUSAL_FILE


def write_refusal(data_dir: Path | str, agent: Agent, month: date, query_set: str, reason: str) -> dict:
    """Store why the agent is not evaluated on the month; return the record."""
    record = {
        "agent": agent.name,
        "month": f"{month:%Y-%m}",
        "query_set": query_set,
        "status": "refused",
        "reason": reason,
        "knowledge_cutoff": agent.knowledge_cutoff.isoformat() if agent.knowledge_cutoff else None,
        "agent_config_hash": agent_config_hash(agent),
        "code_version": code_version(),
        "refused_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write_bytes(
        refusal_path(data_dir, month, agent.name, query_set),
        (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(),
    )
    return record


def clear_refusal(data_dir: Path | str, month: date, agent_name: str, query_set: str) -> None:
    """Remove a refusal that no longer holds (the agent was evaluated after all)."""
    refusal_path(data_dir, month, agent_name, query_set).unlink(missing_ok=True)


def refusals(data_dir: Path | str) -> pl.DataFrame:
    """(month, query_set, agent, reason) of every stored refusal, newest month first."""
    paths = sorted((DataLayout(data_dir).root / "evaluations").glob(f"*/*/*/{REFUSAL_FILE}"))
    records = [json.loads(path.read_text()) for path in paths]
    return pl.DataFrame(
        [{k: r[k] for k in ("month", "query_set", "agent", "reason")} for r in records],
        schema={"month": pl.String, "query_set": pl.String, "agent": pl.String, "reason": pl.String},
    ).sort(["month", "query_set", "agent"], descending=[True, False, False])


# The across-round aggregates' columns (docs/evaluation.md, "Rounds and their aggregates") of the
# leaderboard (board.leaderboard); null where a run did not store the aggregate.
AGGREGATE_COLUMNS = (
    *(f"max_at_k_{m}" for m in SET_METRICS),
    *(f"repeated_{m}" for m in SET_METRICS),
    "avg_steps",
)
# Said under the leaderboard wherever RANK_RULE is (Dagster metadata, docs/evaluation.md).
AGGREGATION_RULE = (
    "metrics are means over a run's K rounds (std: sample std); max_at_k_*: per query the round with the best "
    "second-level F1 (latest on ties), averaged over queries; repeated_*: per query the codes predicted in at "
    "least 2 of the K rounds, scored as one answer (K >= 2 only); avg_steps: mean ReAct steps per episode"
)


def aggregation(record: Mapping) -> str:
    """What a run's metric columns are, for its leaderboard row: K, and which of Max@K, repeated
    and average steps it stored (a run evaluated before they existed has none of them)."""
    k = record["rounds"]
    parts = [f"mean ± std of {k} rounds" if k > 1 else "1 round"]
    if "max_at_k" not in record:
        return "; ".join([*parts, "Max@K, repeated and steps not stored"])
    parts.append(f"Max@{k}")
    if record["repeated"] is not None:
        parts.append(f"repeated (≥ 2 of {k})")
    if record["avg_steps"] is not None:
        parts.append("avg steps")
    return "; ".join(parts)
