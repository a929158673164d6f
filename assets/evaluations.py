"""Agent evaluations, one partition per (month, agent), and the leaderboard built from them."""

from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl
from pydantic import Field

from assets.metadata import COLUMN_SCHEMA, column_schema, frame_table, png_metadata, table_schema
from assets.owners import BENCHMARK_OWNERS
from assets.partitions import monthly_partitions
from assets.resources import Dataset, LlmRuntime, Network, ReleaseBucket, compose
from assets.splits import test_split
from assets.submissions import submission
from pipeline.agent_api import EventDatabase
from pipeline.config import SandboxSettings
from pipeline.evaluation.agent_config import agent_config_hash, endpoint_limits
from pipeline.evaluation.board import BOARD_COLUMNS, INTERVAL_RULE, summary
from pipeline.evaluation.clients import client_for
from pipeline.evaluation.episodes import episode_concurrency
from pipeline.evaluation.llm import ModelUnavailable
from pipeline.evaluation.refusals import clear_refusal, refusals, write_refusal
from pipeline.evaluation.registry import Agent, RegistryError, eligibility, load_agents
from pipeline.evaluation.run import (
    AGGREGATION_RULE,
    EVALUATION_VERSION,
    RANK_RULE,
    RESULT_DESCRIPTIONS,
    evaluate_agent,
    evaluate_baseline,
)
from pipeline.evaluation.throughput import RateLimiter
from pipeline.release.publish import publish_leaderboard
from pipeline.release.store_uri import open_store
from pipeline.splits.database import MonthNotReady
from pipeline.storage import DataLayout

# Agent names come from agents.yaml; the evaluation sensor adds a partition for every new one.
agent_partitions = dg.DynamicPartitionsDefinition(name="agents")
evaluation_partitions = dg.MultiPartitionsDefinition({"month": monthly_partitions, "agent": agent_partitions})
QUERY_SETS = ("queries_sample", "queries")
# The scores table's metric columns: label → scores.json metric.
SCORE_COLUMNS = {
    "L2 F1": "level2_f1",
    "L1 F1": "level1_f1",
    "L2 precision": "level2_precision",
    "L2 recall": "level2_recall",
    "quad KL": "quad_kl",
    "MRR": "mrr",
}


class EvaluationConfig(dg.Config):
    query_set: str = Field(
        default="queries_sample",
        description="queries_sample (the balanced 100, MIRAI's test subset) or queries (the whole split)",
    )
    force: bool = Field(
        default=False,
        description="run an agent that is not eligible for the month anyway: stored as contaminated, never ranked",
    )


def _agent(agents_file: Path, name: str) -> Agent:
    try:
        agents = {a.name: a for a in load_agents(agents_file)}
    except (RegistryError, OSError) as exc:
        raise dg.Failure(description=f"cannot read the agent registry: {exc}", allow_retries=False) from exc
    if name not in agents:
        raise dg.Failure(
            description=f"agent {name!r} is not in {agents_file} (removed or renamed?)", allow_retries=False
        )
    return agents[name]


def _scores_frame(records: list[dict]) -> pl.DataFrame:
    """One row per distance: the headline metrics of its scores record, and the across-round aggregates."""
    rows = [
        {
            "distance": r["distance"],
            "n": r["n"],
            "rounds": r["rounds"],
            **{label: m[metric] for label, metric in SCORE_COLUMNS.items()},
            "Max@K L2 F1": r["max_at_k"]["level2_f1"],
            "repeated L2 F1": (r["repeated"] or {}).get("level2_f1"),
            "avg steps": r["avg_steps"],
        }
        for r in records
        for m in [r["metrics"]]
    ]
    floats = [*SCORE_COLUMNS, "Max@K L2 F1", "repeated L2 F1", "avg steps"]
    return pl.DataFrame(
        rows, schema={**dict.fromkeys(("distance", "n", "rounds"), pl.Int64), **dict.fromkeys(floats, pl.Float64)}
    )


def _concurrency(agent: Agent, llm: LlmRuntime) -> int:
    """The agent's episodes at once, under the launchpad's cap (episodes.episode_concurrency then caps
    it by the sandboxes' memory)."""
    return min(agent.episode_concurrency, llm.max_concurrency or agent.episode_concurrency)


def _run(
    agent: Agent,
    split_file: Path,
    data_dir: Path,
    config: EvaluationConfig,
    llm: LlmRuntime,
    context: dg.AssetExecutionContext,
    sandbox: SandboxSettings,
) -> list[dict]:
    """Evaluate the agent at each of its distances; the scores records."""
    records = []
    if agent.kind == "baseline":
        for distance in agent.distances:
            records.append(evaluate_baseline(split_file, data_dir, agent, distance, force=config.force)[1])
        return records
    settings = llm.client_settings()
    # One limiter for every distance: the endpoint's limits hold across the whole asset run.
    limiter = RateLimiter(endpoint_limits(agent, llm.rate_limits()))
    client = client_for(agent, settings, limiter)
    concurrency = _concurrency(agent, llm)
    # Loaded once for every distance.
    database = (
        EventDatabase(
            data_dir,
            allow_unconfined_sandbox=sandbox.allow_unconfined,
            sandbox_handover_grid_s=sandbox.handover_grid_s,
        )
        if agent.strategy == "react"
        else None
    )
    try:
        for distance in agent.distances:
            _, record = evaluate_agent(
                split_file,
                data_dir,
                agent,
                distance,
                force=config.force,
                client=client,
                client_settings=settings,
                database=database,
                concurrency=concurrency,
                sandbox_memory_mb=llm.sandbox_memory_mb,
                # At most one line a minute: a month's sample is hundreds of episodes.
                progress=lambda line, d=distance: context.log.info(f"{agent.name} at distance {d}: {line}"),
                progress_interval_s=60.0,
            )
            context.log.info(
                f"{agent.name} at distance {distance}: end states {record['end_states']}; rate-limit waits "
                f"{limiter.waited_s:.1f} s, {limiter.throttles} 429 response(s)"
            )
            records.append(record)
    finally:
        client.close()  # a GGUF agent's model server ends with the asset run
    return records


@dg.asset(
    partitions_def=evaluation_partitions,
    deps=[test_split],
    group_name="evaluation",
    # One evaluation at a time: two at once hand the machine's cutoff gate back and forth between
    # their cutoffs, each handover from a later one to an earlier one a moment a later agent chose
    # (docs/agent_api.md, "The handover between cutoffs").
    pool="agent_evaluation",
    owners=BENCHMARK_OWNERS,
    kinds={"python", "parquet"},
    code_version=EVALUATION_VERSION,
    description="`evaluations/YYYY-MM/<agent>/<query_set>/distance=<d>/`: results.parquet, scores.json and, for "
    "LLM agents, trajectories.jsonl, for each of the agent's distances; or refusal.json when the agent's "
    "knowledge cutoff is not before the month (docs/evaluation.md).",
)
def evaluation(
    context: dg.AssetExecutionContext, config: EvaluationConfig, dataset: Dataset, network: Network, llm: LlmRuntime
) -> dg.MaterializeResult:
    if config.query_set not in QUERY_SETS:
        raise dg.Failure(description=f"query_set must be one of {QUERY_SETS}, got {config.query_set!r}")
    keys = context.partition_key.keys_by_dimension
    month, settings = date.fromisoformat(keys["month"]), compose(dataset, network, llm)
    agent = _agent(settings.dataset.agents_file, keys["agent"])
    eligible, reason = eligibility(agent, month)
    if not eligible and not config.force:
        record = write_refusal(settings.dataset.data_dir, agent, month, config.query_set, reason)
        context.log.warning(f"{agent.name} is not evaluated on {month:%Y-%m}: {reason}")
        return dg.MaterializeResult(
            metadata={
                "status": "refused",
                "reason": reason,
                "agent config": record["agent_config_hash"],
                "query_set": config.query_set,
            }
        )
    layout = DataLayout(settings.dataset.data_dir)
    split_file = layout.split_dir(month) / f"{config.query_set}.parquet"
    if not split_file.exists():
        raise dg.Failure(
            description=f"no split at {split_file}; materialise test_split for {month:%Y-%m} first", allow_retries=False
        )
    clear_refusal(settings.dataset.data_dir, month, agent.name, config.query_set)
    try:
        records = _run(agent, split_file, settings.dataset.data_dir, config, llm, context, settings.sandbox)
    except (MonthNotReady, ModelUnavailable) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    first = layout.evaluation_dir(month, agent.name, config.query_set, agent.distances[0])
    metadata = {
        # Read back from the file: its columns depend on the agent's kind (ReAct runs add episode columns).
        COLUMN_SCHEMA: table_schema(pl.read_parquet_schema(first / "results.parquet"), RESULT_DESCRIPTIONS),
        "status": "contaminated" if records[0]["contaminated"] else "evaluated",
        "eligibility": reason,
        "agent config": agent_config_hash(agent),
        "query_set": config.query_set,
        "dagster/row_count": sum(r["n"] * r["rounds"] for r in records),
        "scores": frame_table(_scores_frame(records)),
        "path": dg.MetadataValue.path(str(first.parent)),
    }
    if agent.kind == "llm":
        # Which harness and API subset produced the scores (docs/mirai.md, "The `mirai` mode").
        metadata["mode"] = records[0]["mode"]
        if records[0]["tools"] is not None:
            metadata["tools"] = records[0]["tools"]
        metadata["end states"] = dg.MetadataValue.json({f"distance={r['distance']}": r["end_states"] for r in records})
        metadata["tokens in/out"] = f"{sum(r['tokens_in'] for r in records)}/{sum(r['tokens_out'] for r in records)}"
        metadata["tokens_in"] = sum(r["tokens_in"] for r in records)
        metadata["tokens_out"] = sum(r["tokens_out"] for r in records)
        costs = [r["cost_usd"] for r in records]
        # Null unless agents.yaml prices the model (docs/evaluation.md, "Tokens and cost").
        metadata["cost_usd"] = dg.MetadataValue.float(sum(costs)) if None not in costs else dg.MetadataValue.null()
        metadata["episodes"] = sum(r["n"] * r["rounds"] for r in records)
        metadata["episode concurrency"] = episode_concurrency(agent, _concurrency(agent, llm))
        metadata["sandbox layers"] = dg.MetadataValue.json({f"distance={r['distance']}": r["sandbox"] for r in records})
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(
    deps=[evaluation, submission],
    group_name="evaluation",
    owners=BENCHMARK_OWNERS,
    kinds={"polars", "parquet"},
    code_version=EVALUATION_VERSION,
    metadata=column_schema(BOARD_COLUMNS),
    description=(
        f"evaluations/leaderboard.parquet (every stored run and scored submission; {RANK_RULE}), "
        "evaluations/leaderboard.png and the self-contained evaluations/leaderboard.html. Live rounds' "
        "submissions are partitions of `submission` too: the board does not read them, but shows Unsynced after "
        "one until the leaderboard_refresh that submission_sensor requests next (its rows unchanged)."
    ),
)
def leaderboard(dataset: Dataset, network: Network, release_store: ReleaseBucket) -> dg.MaterializeResult:
    from pipeline.evaluation.board_files import write_leaderboard  # with matplotlib: see assets/ingest.py

    settings = compose(dataset, network, release_store)
    data_dir = settings.dataset.data_dir
    written = write_leaderboard(data_dir)
    board = written.board
    refused = refusals(data_dir)
    # Published beside the releases (issue 7: the leaderboard goes out with the releases), once
    # there is at least one release to sit beside.
    store = open_store(settings.dataset, settings.network, settings.release)
    published = publish_leaderboard(store, written.table, written.chart, written.page) if store.release_months() else []
    return dg.MaterializeResult(
        metadata={
            **column_schema(BOARD_COLUMNS, board.schema),
            "dagster/row_count": board.height,
            "path": dg.MetadataValue.path(str(written.table)),
            "page": dg.MetadataValue.path(str(written.page)),
            "submissions": int((board.get_column("source") == "submission").sum()),
            "leaderboard": frame_table(summary(board)),
            "rules": f"{RANK_RULE}; {INTERVAL_RULE}; {AGGREGATION_RULE}.",
            "chart": png_metadata(written.chart),
            # A submission record the board could not read (docs/evaluation.md, "The leaderboard").
            "skipped submission records": dg.MetadataValue.json(written.skipped),
            "refusals": frame_table(refused),
            "published": ", ".join(published) or "unchanged or no release yet",
        }
    )
