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
"Concurrency, rate limits and resume"); the file goes once the run is stored. An episode that
failed on transport is never taken as done from it (trajectory.FAILURES): a resumed run, or one
asked to reuse the stored run (``reuse_stored``, `mirai evaluate`), runs it again.

An agent refused on a month (its knowledge cutoff is not before it) leaves ``refusal.json`` in
``evaluations/YYYY-MM/<agent>/<query_set>/`` instead (pipeline/evaluation/refusals.py). What a run
reads is checked in queries.py, an LLM run's episodes run in episodes.py, and what it records of
its agent comes from agent_config.py.

The directory is built aside and swapped in whole, so a reader never pairs new results with old
scores. The leaderboard (pipeline/evaluation/board.py) collects every scores.json; contaminated runs
are listed but never ranked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.lookup import map_iso_to_country_name
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.evaluation.agent_config import (
    agent_config_hash,
    agent_mode,
    agent_tools,
    cost_usd,
    endpoint_limits,
    model_description,
)
from pipeline.evaluation.baselines import FORECAST_SCHEMA, default_top_k, forecast
from pipeline.evaluation.clients import client_for
from pipeline.evaluation.episodes import episode_concurrency, gated_tables_mb, run_episodes, sandbox_slots
from pipeline.evaluation.llm import ChatClient, ClientSettings
from pipeline.evaluation.metrics import (
    SET_METRIC_MEANINGS,
    SET_METRICS,
    aggregate_answers,
    aggregate_rounds,
    hit,
    hit_at_k,
    mrr,
    query_scores,
    reciprocal_rank,
    score,
)
from pipeline.evaluation.prompts import PROMPT_VERSION
from pipeline.evaluation.queries import load_history, load_queries, split_month
from pipeline.evaluation.registry import Agent, eligibility
from pipeline.evaluation.subsets import limit_queries, subset_record
from pipeline.evaluation.throughput import (
    UNLIMITED,
    EpisodeBar,
    EpisodeLog,
    Progress,
    RateLimiter,
    RateLimits,
    SandboxSlots,
)
from pipeline.evaluation.trajectory import FAILURES, AgentSpec, Query, run_again
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet, staged_directory
from pipeline.version import code_version

EVALUATION_VERSION = "evaluation-v1"
RANK_METRIC = "level2_f1"
# Rows equal on second-level F1 are ranked by these (all higher-is-better), then listed by name.
TIEBREAK_METRICS = ("level1_f1", "mrr")
# Said wherever the leaderboard shows (demo summary, Dagster metadata, chart, HTML page,
# docs/evaluation.md); board.rank applies it.
RANK_RULE = (
    "rank: within each month, query set and distance, rows are ranked by their mean second-level F1 over queries, "
    "ties by first-level F1, then MRR (rows equal on all three to 4 decimals share a rank: 1, 1, 3), and listed "
    "by rank, then name; runs that scored 0 on all three and contaminated runs are not ranked and listed last. "
    "≈ leader: a ranked row whose 95% bootstrap interval (over queries) of second-level F1 overlaps the leader's "
    "(the first row) is not separable from it at this number of queries; disjoint intervals mean a difference "
    "significant well beyond the 5% level, while intervals that overlap a little may still hide one (the mark "
    "errs on the side of 'not separable')"
)
HIT_K = 10  # Hit@10, as in MIRAI (arXiv:2407.01231) Appendix D.8


class NotEligible(RuntimeError):
    """The agent's knowledge cutoff is not before the month; the message says why."""


def admit(agent: Agent, month: date, force: bool) -> tuple[bool, str]:
    """(contaminated, reason): an ineligible agent runs only when forced, and is then flagged."""
    eligible, reason = eligibility(agent, month)
    if not eligible and not force:
        raise NotEligible(f"{agent.name} on {month:%Y-%m}: {reason} (force the run to store it as contaminated)")
    return not eligible, reason


# What each column of results.parquet holds (the Dagster UI's Columns tab of `evaluation`): the
# per-query scores, then, for an LLM run, the round and its episode's columns (_episode_columns).
RESULT_DESCRIPTIONS = {
    "query_id": "The query scored (the split's query_id)",
    "date": "Day t the query asks about",
    "s": "Subject country, ISO 3166-1 alpha-3",
    "o": "Object country, ISO 3166-1 alpha-3",
    "gold": "The query's answer_dict (JSON)",
    "prediction": "The agent's answer as an answer_dict (JSON)",
    "ranked": "The agent's second-level codes, best first (MRR and Hit@10 read them)",
    **{
        m: f"{meaning} for this query{'' if m.endswith('_kl') else ', in percent'}"
        for m, meaning in SET_METRIC_MEANINGS.items()
    },
    "reciprocal_rank": "1 / rank of the first correct second-level code in ranked, 0 if none",
    f"hit_at_{HIT_K}": f"1 if a correct second-level code is among the first {HIT_K} of ranked, else 0",
    "round": "The round (0 … K − 1) of an LLM run",
    "end_state": "How the episode ended (final_answer, invalid_actions, error, …)",
    "answer_source": "Where the answer came from: final_answer, final_request, extraction or none",
    "n_actions": "ReAct actions the episode took",
    "tokens_in": "Prompt tokens of the episode",
    "tokens_out": "Completion tokens of the episode",
    "model_s": "Seconds spent in model calls",
    "env_s": "Seconds spent in environment (sandbox) calls",
    "wall_s": "Wall-clock seconds of the episode",
}


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
    limit: int | None = None,
    reuse_stored: bool = False,
    retry_failed: bool = False,
    bar: EpisodeBar | None = None,
) -> tuple[pl.DataFrame, dict]:
    """Run an LLM agent on every query, ``agent.rounds`` times, score each round and store the
    run with its trajectories (see the module doc). ``client`` defaults to the one the registry
    entry describes, its requests bounded by the endpoint's limits (the entry's, else ``limits``);
    ``database`` (for ReAct) to the data dir's event database, loaded once for all queries.
    Episodes run ``episode_concurrency`` at once, their live sandboxes bounded by ``sandboxes``
    (default ``sandbox_slots``), each allowed the agent's ``sandbox_memory_mb``, else
    ``sandbox_memory_mb``, and as many warm spares kept ready; each finished one is checkpointed beside the
    run's directory, so a killed run resumes where it stopped. ``progress`` gets a line (episodes
    done, tokens) at most every ``progress_interval_s``; ``bar`` (a terminal's progress bar) is
    told of every episode. ``limit``: only the queries subsets.SUBSET_RULE picks, recorded as the
    run's ``subset``. An episode that failed on transport (trajectory.FAILURES) is never reused from
    the checkpoint, nor with ``reuse_stored`` from the run stored in the directory, so it is run
    again; ``retry_failed`` runs every failed one again. Returns the per-query results of every
    round and the scores record."""
    if agent.kind != "llm":
        raise ValueError(f"{agent.name} is a {agent.kind} agent, not an llm agent")
    frame, query_set = load_queries(queries, query_set)
    subset = subset_record(limit, frame.height)
    frame = limit_queries(frame, limit)
    month = split_month(frame)
    contaminated, reason = admit(agent, month, force)
    client_settings = client_settings or ClientSettings()
    spec = _agent_spec(agent, client_settings, sandbox_memory_mb)
    owned_client = client is None
    client = client or client_for(agent, client_settings, RateLimiter(endpoint_limits(agent, limits)))
    if spec.strategy == "react" and database is None:
        database = EventDatabase(data_dir)
    items = _queries(frame)
    harness = _harness(client_settings, spec)
    concurrency = episode_concurrency(agent, concurrency)
    if sandboxes is None and spec.strategy == "react" and concurrency > 1:
        sandboxes = sandbox_slots(concurrency, gated_tables_mb(database, frame, distance), spec.memory_mb)
    directory = DataLayout(data_dir).evaluation_dir(month, agent.name, query_set, distance)
    key = _checkpoint_key(agent, harness, frame, distance)
    log = EpisodeLog(checkpoint_path(directory), key, lambda trajectory: run_again(trajectory, retry_failed))
    if reuse_stored:
        log.adopt(_stored_episodes(directory, key))
    progress_state = Progress(
        agent.rounds * len(items), progress, progress_interval_s, watch=bar.update if bar else None
    )
    if bar is not None:
        bar.start(len(log.done), progress_state.total)
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
            progress=progress_state,
            sandboxes=sandboxes,
        )
    finally:
        if bar is not None:
            bar.close()
        if owned_client:  # a client handed in is its caller's to close (it may serve every distance)
            client.close()
    results, per_round, trajectories_jsonl, layers = _scored_rounds(frame, episodes)
    record = _record(agent, month, query_set, distance, aggregate_rounds(per_round), contaminated, reason)
    record |= _llm_fields(agent, harness, results, trajectories_jsonl, layers)
    record |= round_aggregates(frame, results, steps=agent.strategy == "react")
    record |= {"failures": _failures(episodes), "episodes_key": key, "subset": subset}
    stored = write_evaluation(directory, results, record, {"trajectories.jsonl": trajectories_jsonl})
    log.remove()
    return results, stored


# evaluate_agent's steps, apart so that the run reads as one page (the issue's ~80-line rule).


def _stored_episodes(directory: Path, key: str) -> dict[tuple[int, str], dict]:
    """The episodes of the run stored in ``directory`` when it was run with checkpoint key ``key``
    (its scores.json's ``episodes_key``), by (round, query id); else none."""
    try:
        stored = json.loads((directory / "scores.json").read_text()).get("episodes_key")
        lines = (directory / "trajectories.jsonl").read_text().splitlines() if stored == key else []
        records = [json.loads(line) for line in lines]
        return {(r.pop("round"), r["query_id"]): r for r in records}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def _failures(episodes: list[list[dict]]) -> dict[str, int]:
    """How many episodes (of every round) met each of trajectory.FAILURES, those met only."""
    kinds = [r.get("failure") for records in episodes for r in records]
    return {kind: kinds.count(kind) for kind in FAILURES if kind in kinds}


def _agent_spec(agent: Agent, client_settings: ClientSettings, sandbox_memory_mb: int) -> AgentSpec:
    """What the episodes run: the registry entry's strategy and sampling, the client's token cap,
    and the sandbox's memory budget (the agent's, else ``sandbox_memory_mb``)."""
    return AgentSpec(
        agent.strategy,
        agent.action_type,
        agent.temperature,
        agent.max_steps,
        client_settings.max_tokens,
        mode=agent_mode(agent),
        tools=agent_tools(agent) or "full",
        memory_mb=agent.sandbox_memory_mb or sandbox_memory_mb,
    )


def _harness(client_settings: ClientSettings, spec: AgentSpec) -> dict:
    """The harness settings a run records (and its checkpoint key carries)."""
    return {
        "prompt_version": PROMPT_VERSION,
        "max_tokens": client_settings.max_tokens,
        "n_ctx": client_settings.n_ctx,
        "seed": client_settings.seed,
        # A code block's memory budget: beyond it a block's observation is a MemoryError.
        **({"sandbox_memory_mb": spec.memory_mb} if spec.strategy == "react" else {}),
    }


def _scored_rounds(frame: pl.DataFrame, episodes: list[list[dict]]) -> tuple[pl.DataFrame, list[dict], bytes, set[str]]:
    """Every round's episodes scored: the results of all rounds, each round's metrics, the
    trajectories.jsonl bytes, and the distinct sandbox reports (as sorted JSON)."""
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
    return pl.concat(results), per_round, ("\n".join(lines) + "\n").encode(), sandboxes


def _llm_fields(
    agent: Agent, harness: dict, results: pl.DataFrame, trajectories_jsonl: bytes, sandboxes: set[str]
) -> dict:
    """The scores.json fields of an LLM run besides those every run has (``_record``)."""
    tokens_in, tokens_out = int(results.get_column("tokens_in").sum()), int(results.get_column("tokens_out").sum())
    return {
        "strategy": agent.strategy,
        "action_type": agent.action_type,
        "temperature": agent.temperature,
        "max_steps": agent.max_steps,
        "model": model_description(agent),
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
