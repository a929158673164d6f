"""Evaluate every registered agent on every new split, and rebuild the leaderboard after.

Each tick:

1. reads agents.yaml (MIRAI_AGENTS_FILE) and adds a partition of the "agents" dimension for every
   new agent name (removed agents keep theirs, so their stored runs stay visible);
2. requests one `agent_evaluation` run per (month with a test_split, agent) pair it has not
   requested yet: a month it has not seen, or an agent whose registry entry is new or changed
   (then every month: the back-evaluation). An ineligible pair gets a run too, which stores the
   refusal and shows it on the partition, so every (month, agent) cell says what happened to it;
3. when evaluations were materialised since the last leaderboard and none is queued or running,
   requests one `leaderboard` run.

The cursor holds the months seen and each agent's config hash; the run keys
``evaluation:<month>:<agent>:<config hash>`` make a request that slips past the cursor (a reset
cursor, an agent removed and added back) a no-op, since Dagster never launches a run key twice.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import dagster as dg

from assets.evaluations import agent_partitions, evaluation, leaderboard
from assets.owners import BENCHMARK_OWNERS
from assets.resources import Dataset
from pipeline.evaluation.agent_config import agent_config_hash
from pipeline.evaluation.registry import Agent, eligibility, load_agents

TEST_SPLIT = dg.AssetKey("test_split")
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]

evaluation_job = dg.define_asset_job(
    "agent_evaluation",
    owners=BENCHMARK_OWNERS,
    selection=[evaluation],
    description="Evaluates one agent of agents.yaml on one month's test split (a (month, agent) partition of "
    "evaluation) at each of its distances, or records why it is refused; evaluation_sensor launches it.",
    # One run evaluates one (month, agent): a single step, so no per-step subprocess.
    executor_def=dg.in_process_executor,
)
leaderboard_job = dg.define_asset_job(
    "leaderboard_refresh",
    owners=BENCHMARK_OWNERS,
    selection=[leaderboard],
    executor_def=dg.in_process_executor,
    description="Rebuilds the leaderboard from every stored run and scored submission and publishes it beside the "
    "releases; evaluation_sensor and submission_sensor launch it after new results.",
)


def _request(month_key: str, agent: Agent, config_hash: str) -> dg.RunRequest:
    eligible, _ = eligibility(agent, date.fromisoformat(month_key))
    return dg.RunRequest(
        run_key=f"evaluation:{month_key}:{agent.name}:{config_hash}",
        job_name=evaluation_job.name,
        partition_key=dg.MultiPartitionKey({"month": month_key, "agent": agent.name}),
        tags={
            "mirai/agent": agent.name,
            "mirai/month": month_key[:7],
            "mirai/agent_config": config_hash,
            "mirai/eligible": str(eligible).lower(),
        },
    )


def _nothing_new(months: int, agents: int, agents_file: str) -> str:
    """Why a tick requests nothing, and what would change that."""
    said = f"{months} split month(s) × {agents} agent(s): "
    if not months:
        return said + "nothing to evaluate until a test_split month is materialised (the monthly_release job)"
    if not agents:
        return said + f"no agent registered in {agents_file}"
    return said + "nothing new: every pair was requested; the leaderboard is current or waits for runs in flight"


def leaderboard_request(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition, job_name: str, board: int
) -> tuple[dg.RunRequest | None, int]:
    """A ``leaderboard_refresh`` request when ``asset`` was materialised since ``board`` (the
    storage id the last request saw) and no run of the job ``job_name`` is queued or running; with the new
    storage id to keep in the cursor. The run key names the materialisation, so two sensors (or a
    reset cursor) never request the same refresh twice."""
    records = instance.fetch_materializations(asset.key, limit=1).records
    latest = records[0].storage_id if records else 0
    if latest <= board or instance.get_runs_count(dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT)):
        return None, board
    return dg.RunRequest(
        run_key=f"leaderboard:{asset.key.to_user_string()}:{latest}", job_name=leaderboard_job.name
    ), latest


@dg.sensor(
    jobs=[evaluation_job, leaderboard_job],
    minimum_interval_seconds=120,
    description="Every 2 minutes launches one agent_evaluation run per (test_split month, agent in agents.yaml) "
    "pair not evaluated yet (new months, new or changed agents), then one leaderboard_refresh. Stopped by "
    "default: evaluations call the agents' model endpoints, so an operator turns it on once per deployment.",
)
def evaluation_sensor(context: dg.SensorEvaluationContext, dataset: Dataset) -> dg.SensorResult:
    """A broken agents.yaml fails the tick with every problem listed (RegistryError)."""
    state = json.loads(context.cursor) if context.cursor else {"months": [], "agents": {}, "board": 0}
    agents = load_agents(Path(dataset.agents_file))
    months = sorted(context.instance.get_materialized_partitions(TEST_SPLIT))
    known = set(context.instance.get_dynamic_partitions(agent_partitions.name))
    new_names = [a.name for a in agents if a.name not in known]
    hashes = {a.name: agent_config_hash(a) for a in agents}
    seen = set(state["months"])
    requests = [
        _request(month, agent, hashes[agent.name])
        for agent in agents
        for month in months
        if month not in seen or state["agents"].get(agent.name) != hashes[agent.name]
    ]
    board = state["board"]
    if not requests:
        refresh, board = leaderboard_request(context.instance, evaluation, evaluation_job.name, board)
        requests += [refresh] if refresh else []
    cursor = json.dumps({"months": months, "agents": hashes, "board": board}, sort_keys=True)
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=None if requests else _nothing_new(len(months), len(agents), dataset.agents_file),
        cursor=cursor,
        dynamic_partitions_requests=[agent_partitions.build_add_request(new_names)] if new_names else [],
    )
