"""Resolve live rounds as their target dates close, then refresh the live leaderboard.

Each tick asks every published round (a local live/<D>/manifest.json) which of its target dates
are unresolved and would resolve now (pipeline/live/resolve.py unresolved_dates: deadline passed on
the store's clock, ledger settled, files stored, grace over) and requests one `live_round_resolution` run (the `live_resolution` asset) for each round
with such dates. The run key ``live_resolution:<D>:<dates>`` makes a re-tick a no-op (Dagster
never launches a run key twice); once the run has resolved them, the dates are no longer asked
for. When live_resolution was materialised since the last refresh and none is in flight, it
requests one `live_leaderboard` run, keyed by that materialisation.
"""

import json
from datetime import UTC, date, datetime

import dagster as dg

from assets.live_resolution import live_leaderboard, live_resolution
from assets.owners import BENCHMARK_OWNERS
from assets.resources import Dataset, LiveRounds, Network, ReleaseBucket, compose
from pipeline.live.resolve import published_round_days, unresolved_dates
from pipeline.release.store_uri import open_store
from sensors.evaluations import IN_FLIGHT

live_resolution_job = dg.define_asset_job(
    "live_round_resolution",
    owners=BENCHMARK_OWNERS,
    selection=[live_resolution],
    executor_def=dg.in_process_executor,
    description="Resolves the closed target dates of one live round and scores its accepted submissions; "
    "live_resolution_sensor launches it.",
)
live_leaderboard_job = dg.define_asset_job(
    "live_leaderboard_refresh",
    owners=BENCHMARK_OWNERS,
    selection=[live_leaderboard],
    executor_def=dg.in_process_executor,
    description="Rebuilds the live leaderboard (per round and cumulative) and publishes it to live/; "
    "live_resolution_sensor launches it after a resolution.",
)


@dg.sensor(
    jobs=[live_resolution_job, live_leaderboard_job],
    minimum_interval_seconds=300,
    description="Every 5 minutes launches one live_round_resolution run per published live round with target "
    "dates that have closed (deadline passed on the store's clock, slots settled, daily_quads and articles in, grace over), then one "
    "live_leaderboard_refresh. Stopped by default like live_round_daily, whose rounds it resolves: turn both on "
    "together.",
)
def live_resolution_sensor(
    context: dg.SensorEvaluationContext,
    dataset: Dataset,
    network: Network,
    live: LiveRounds,
    release_store: ReleaseBucket,
) -> dg.SensorResult:
    state = json.loads(context.cursor) if context.cursor else {"board": 0}
    settings = compose(dataset, network, live, release_store)
    store = open_store(settings.dataset, settings.network, settings.release)
    now = datetime.now(UTC)
    requests = []
    rounds = published_round_days(settings.dataset)
    waits: dict[tuple[date, date], tuple[str, ...]] = {}  # (target date, round) -> what it waits for
    for round_day in rounds:
        unresolved = unresolved_dates(settings.dataset, settings.live, round_day, now, store)
        waits.update({(target, round_day): reasons for target, reasons in unresolved.items() if reasons})
        dates = [target for target, reasons in unresolved.items() if not reasons]
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
        skip_reason=None if requests else _nothing_closed(len(rounds), waits),
        cursor=json.dumps({"board": board}),
    )


def _nothing_closed(rounds: int, waits: dict[tuple[date, date], tuple[str, ...]]) -> str:
    """Why a tick requests nothing: the earliest target date that waits and what for (the asset
    and partition), since it is the next to close."""
    if not rounds:
        return "no published round (no live_round partition materialised yet)"
    said = f"no target date of the {rounds} published round(s) has newly closed"
    if not waits:
        return said + "; every target date is resolved and the live leaderboard is current or being refreshed"
    (target, round_day), reasons = min(waits.items())
    return said + f"; next to close: {target} of round {round_day} ({'; '.join(reasons)}); {len(waits)} date(s) wait"
