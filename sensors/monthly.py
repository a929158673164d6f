"""The monthly release: a daily cron that builds, audits and publishes each month once it has closed.

Not eager automation: a month closes only when every slot of every day is landed or confirmed
missing and the grace period has passed, and one slot GDELT never settles would make an eager
condition wait forever without saying why. A daily tick instead records, in its skip reason,
exactly what keeps a month open, and an operator can force a month with a recorded override
(SplitConfig on test_split).
"""

from datetime import date

import dagster as dg

from assets.database import event_database
from assets.partitions import monthly_partitions
from assets.release import release
from assets.resources import Dataset, GdeltFeed, ReleaseBucket, pipeline_settings
from assets.splits import test_split
from pipeline.release import MANIFEST_NAME, open_store, release_key
from pipeline.splits import month_closure
from sensors.run_health import max_runtime_tag

monthly_release_job = dg.define_asset_job(
    "monthly_release",
    # One run per month: the release step runs only if test_split's blocking checks (the leakage
    # audit) passed in the same run.
    selection=[event_database, test_split, release],
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("monthly_release"),
)


@dg.schedule(cron_schedule="0 6 * * *", job=monthly_release_job, execution_timezone="UTC")
def monthly_release_daily(
    context: dg.ScheduleEvaluationContext, dataset: Dataset, gdelt: GdeltFeed, release_store: ReleaseBucket
):
    """Request every ended month that is not released yet and has closed; skip with the reasons
    otherwise (visible on the schedule's tick history in the UI). A month whose run failed is
    requested again on the next day (the run key carries the day); re-running is idempotent."""
    now = context.scheduled_execution_time
    keys = monthly_partitions.get_partition_keys(current_time=now)
    if not keys:
        # Nothing to check: no store (no S3 client) is opened.
        return dg.SkipReason("no month has ended since MIRAI_START_DATE")
    settings = pipeline_settings(dataset, gdelt, release_store)
    store = open_store(settings, signed=True)
    started = set(store.release_months())
    requests, waiting = [], []
    for key in keys:
        month = f"{date.fromisoformat(key):%Y-%m}"
        # Published = its manifest is there (written last); a directory alone is an interrupted run.
        if month in started and store.stat(release_key(month, MANIFEST_NAME)) is not None:
            continue
        closure = month_closure(date.fromisoformat(key), settings, now)
        if closure.closed:
            requests.append(dg.RunRequest(run_key=f"release-{key}@{now:%Y-%m-%d}", partition_key=key))
        else:
            waiting.append(closure.describe())
    if requests:
        return requests
    return dg.SkipReason("; ".join(waiting) if waiting else "every ended month is released")
