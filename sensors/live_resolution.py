"""Resolve live rounds as their target dates close, then refresh the live leaderboard.

Each tick asks every published round (a local live/<D>/manifest.json) which of its target dates
are unresolved and would resolve now (pipeline/live/resolve.py resolvable_dates: deadline passed,
ledger settled, files stored, grace over) and requests one `live_round_resolution` run (the `live_resolution` asset) for each round
with such dates. The run key ``live_resolution:<D>:<dates>`` makes a re-tick a no-op (Dagster
never launches a run key twice); once the run has resolved them, the dates are no longer asked
for. When live_resolution was materialised since the last refresh and none is in flight, it
requests one `live_leaderboard` run, keyed by that materialisation.
"""

import json
from datetime import UTC, datetime

import dagster as dg

from assets.live_resolution import live_leaderboard, live_resolution
from assets.resources import Dataset, LiveRounds, pipeline_settings
from pipeline.live.resolve import published_round_days, resolvable_dates
from sensors.evaluations import IN_FLIGHT

live_resolution_job = dg.define_asset_job(
    "live_round_resolution", selection=[live_resolution], executor_def=dg.in_process_executor
)
live_leaderboard_job = dg.define_asset_job(
    "live_leaderboard_refresh", selection=[live_leaderboard], executor_def=dg.in_process_executor
)


@dg.sensor(jobs=[live_resolution_job, live_leaderboard_job], minimum_interval_seconds=300)
def live_resolution_sensor(context: dg.SensorEvaluationContext, dataset: Dataset, live: LiveRounds) -> dg.SensorResult:
    state = json.loads(context.cursor) if context.cursor else {"board": 0}
    settings = pipeline_settings(dataset, live)
    now = datetime.now(UTC)
    requests = []
    for round_day in published_round_days(settings):
        dates = resolvable_dates(settings, round_day, now)
        if dates:
            key = round_day.isoformat()
            requests.append(
                dg.RunRequest(
                    run_key=f"live_resolution:{key}:{','.join(d.isoformat() for d in dates)}",
                    job_name=live_resolution_job.name,
                    partition_key=key,
                    tags={"mirai/live_round": key},
                )
            )
    board = state["board"]
    if not requests:
        records = context.instance.fetch_materializations(live_resolution.key, limit=1).records
        latest = records[0].storage_id if records else 0
        busy = context.instance.get_runs_count(dg.RunsFilter(job_name=live_resolution_job.name, statuses=IN_FLIGHT))
        if latest > board and not busy:
            requests.append(dg.RunRequest(run_key=f"live_leaderboard:{latest}", job_name=live_leaderboard_job.name))
            board = latest
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=None if requests else "no target date of a published round has newly closed",
        cursor=json.dumps({"board": board}),
    )
