"""The 15-minute GDELT schedule.

GDELT publishes a slot's files at its timestamp; ticks at :05/:20/:35/:50 give it five minutes.
Each tick materialises the UTC day of the newest published slot, so the 00:05 tick already works
on the new day. The :05 ticks of the first hours of a day also re-run the previous day, where
late slots (GDELT catching up) are picked up and pending ones become missing after the grace
period.
"""

from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.articles import articles, fetch_ledger
from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.owners import DATA_OWNERS
from sensors.run_health import max_runtime_tag

PUBLISH_DELAY = timedelta(minutes=5)
# The live ticks' runs go first: the queue launches higher-priority runs first and a pool hands its
# next free slot to the highest-priority waiting step, so a backfill delays a live run by at most the
# one backfill step holding the slot (docs/operations.md, "Backfills"). Set on the schedules' run
# requests, not on the jobs: a backfill of the job would inherit a job tag.
LIVE_RUN_TAGS = {"dagster/priority": "10"}
RECONCILE_PREVIOUS_DAY_HOURS = 6

gdelt_ingest_job = dg.define_asset_job(
    "gdelt_ingest",
    owners=DATA_OWNERS,
    # The day's whole chain, so events and quads follow every new slot; partitions are inferred.
    selection=[gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads],
    description="Lands one UTC day's GDELT files and builds its parsed rows, events and daily quads; "
    "the gdelt_every_15_minutes schedule launches it.",
    # Small, frequent runs: one process, no per-step subprocess start-up (https://docs.dagster.io/guides/operate/run-executors).
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("gdelt_ingest"),
)


def newest_slot(at: datetime) -> datetime:
    t = at.astimezone(UTC) - PUBLISH_DELAY
    return t.replace(minute=t.minute - t.minute % 15, second=0, microsecond=0)


@dg.schedule(
    cron_schedule="5,20,35,50 * * * *",
    job=gdelt_ingest_job,
    execution_timezone="UTC",
    description="Every 15 minutes (:05, :20, :35, :50 UTC) launches a gdelt_ingest run (files, parsed rows, "
    "events, daily quads) for the UTC day of the newest published GDELT slot; the :05 ticks before 06:00 "
    "also re-run the previous day for late slots. Stopped by default, so a UI opened on demo data never "
    "starts downloading: turn it on (with gdelt_freshness) to ingest live.",
)
def gdelt_every_15_minutes(context: dg.ScheduleEvaluationContext):
    tick = context.scheduled_execution_time.astimezone(UTC)
    day = newest_slot(tick).date()
    requests = [dg.RunRequest(run_key=f"{day}@{tick:%Y%m%dT%H%M}", partition_key=day.isoformat(), tags=LIVE_RUN_TAGS)]
    if tick.minute == 5 and tick.hour < RECONCILE_PREVIOUS_DAY_HOURS:
        previous = day - timedelta(days=1)
        requests.append(
            dg.RunRequest(
                run_key=f"{previous}@{tick:%Y%m%dT%H%M}", partition_key=previous.isoformat(), tags=LIVE_RUN_TAGS
            )
        )
    return requests


articles_job = dg.define_asset_job(
    "articles_daily",
    owners=DATA_OWNERS,
    # fetch_ledger has no step of its own (articles records it), so its checks are selected by name.
    selection=dg.AssetSelection.assets(articles) | dg.AssetSelection.checks_for_assets(fetch_ledger.key),
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("articles_daily"),
    description="Fetches and extracts the articles of one day's well-reported quads; the articles_hourly schedule "
    "launches it.",
)


@dg.schedule(
    cron_schedule="40 * * * *",
    job=articles_job,
    execution_timezone="UTC",
    description="Hourly at :40 UTC launches an articles_daily run that fetches the articles of the current "
    "day's well-reported quads (only new URLs and due retries); the 00:40 tick also finishes the previous "
    "day. Stopped by default like gdelt_every_15_minutes, whose daily quads it reads: turn both on together.",
)
def articles_hourly(context: dg.ScheduleEvaluationContext):
    """Hourly, the articles of the current day's well-reported quads: soon after publication,
    before links rot. Only new URLs (and failed ones whose retry is due) are fetched, so an hourly
    run costs little; the 00:40 tick also finishes the previous day."""
    tick = context.scheduled_execution_time.astimezone(UTC)
    day = newest_slot(tick).date()
    requests = [
        dg.RunRequest(run_key=f"articles-{day}@{tick:%Y%m%dT%H%M}", partition_key=day.isoformat(), tags=LIVE_RUN_TAGS)
    ]
    if tick.hour == 0:
        previous = day - timedelta(days=1)
        requests.append(
            dg.RunRequest(
                run_key=f"articles-{previous}@{tick:%Y%m%dT%H%M}",
                partition_key=previous.isoformat(),
                tags=LIVE_RUN_TAGS,
            )
        )
    return requests
