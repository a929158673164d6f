"""The daily live round (docs/live.md, "Timeline") and the live history's day (docs/live.md, "The
history a participant may use"): schedules, stopped until an operator starts them.

Day D's round reads the daily files through D − 1, whose last 15-minute slot GDELT publishes
around 00:15 UTC on D and whose articles the hourly fetch (at :40) takes in by ~01:00. So the
first tick is at 02:00 UTC; each hourly tick until LAST_HOUR asks again while D − 1's daily quads
or articles are missing, and the last one asks regardless (the manifest lists any day missing),
still 12 hours before the round's deadline (00:00 UTC of D + 1 with the default horizons). The
run key "live-<D>" makes every later tick of the day a no-op once one is requested.
"""

from datetime import UTC, timedelta

import dagster as dg

from assets.live import live_round
from assets.live_history import live_history
from assets.owners import BENCHMARK_OWNERS
from assets.resources import Dataset
from pipeline.splits.database import day_inputs_missing

FIRST_HOUR, LAST_HOUR = 2, 12

live_round_job = dg.define_asset_job(
    "live_round_publication",
    owners=BENCHMARK_OWNERS,
    selection=[live_round],
    executor_def=dg.in_process_executor,
    description="Publishes day D's live round (questions, manifest, baselines' submissions) to the release store, "
    "once; the live_round_daily schedule launches it.",
)


@dg.schedule(
    cron_schedule=f"0 {FIRST_HOUR}-{LAST_HOUR} * * *",
    job=live_round_job,
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"Hourly {FIRST_HOUR}:00–{LAST_HOUR}:00 UTC launches one live_round_publication run that publishes "
    f"day D's live round once D − 1's daily_quads and articles are in (at {LAST_HOUR}:00 regardless; the manifest "
    "lists a missing day); later ticks of the day are no-ops. Stopped by default: a round is public and immutable, "
    "so an operator starts it once ingestion and the release store are live (docs/live.md).",
)
def live_round_daily(context: dg.ScheduleEvaluationContext, dataset: Dataset):
    tick = context.scheduled_execution_time.astimezone(UTC)
    day = tick.date()
    last = day - timedelta(days=1)
    # Asset names, not file names: both assets store D − 1 as date=<D − 1>.parquet.
    missing = day_inputs_missing(last, dataset.settings())
    if missing and tick.hour < LAST_HOUR:
        waits = " and ".join(f"{name} {last}" for name in missing)
        stored = "".join(f" ({name} {last} is in)" for name in ("daily_quads", "articles") if name not in missing)
        return dg.SkipReason(
            f"round {day} waits for {waits}{stored}; asked again hourly, requested regardless at {LAST_HOUR}:00 UTC"
        )
    return dg.RunRequest(run_key=f"live-{day}", partition_key=day.isoformat())


live_history_job = dg.define_asset_job(
    "live_history_publication",
    owners=BENCHMARK_OWNERS,
    selection=[live_history],
    executor_def=dg.in_process_executor,
    description="Publishes day d's part of the live history (its event database tables and manifest) to the release "
    "store, once; the live_history_daily schedule launches it for the day before.",
)


@dg.schedule(
    cron_schedule=f"30 {FIRST_HOUR}-{LAST_HOUR} * * *",
    job=live_history_job,
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"Hourly at :30, {FIRST_HOUR}:30–{LAST_HOUR}:30 UTC, launches one live_history_publication run "
    "that publishes day D − 1's event database to live/history/ once its daily_quads and articles are in (the "
    "files D's round is drawn from); later ticks of the day are no-ops. Stopped by default, like live_round_daily: "
    "a history day is public and immutable (docs/live.md).",
)
def live_history_daily(context: dg.ScheduleEvaluationContext, dataset: Dataset):
    last = context.scheduled_execution_time.astimezone(UTC).date() - timedelta(days=1)
    missing = day_inputs_missing(last, dataset.settings())
    if missing:
        waits = " and ".join(f"{name} {last}" for name in missing)
        return dg.SkipReason(f"history day {last} waits for {waits}; asked again hourly until {LAST_HOUR}:30 UTC")
    return dg.RunRequest(run_key=f"live-history-{last}", partition_key=last.isoformat())
