"""The monthly split: a daily cron that builds each month once it has closed.

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
from assets.resources import MiraiSettings
from assets.splits import test_split
from pipeline.splits import month_closure, read_manifest

monthly_split_job = dg.define_asset_job(
    "monthly_split",
    selection=[event_database, test_split],
    executor_def=dg.in_process_executor,
)


@dg.schedule(cron_schedule="0 6 * * *", job=monthly_split_job, execution_timezone="UTC")
def monthly_split_daily(context: dg.ScheduleEvaluationContext, mirai: MiraiSettings):
    """Request every ended month that has no split yet and has closed; skip with the reasons
    otherwise (visible on the schedule's tick history in the UI)."""
    settings = mirai.settings()
    now = context.scheduled_execution_time
    requests, waiting = [], []
    for key in monthly_partitions.get_partition_keys(current_time=now):
        month = date.fromisoformat(key)
        if read_manifest(settings, month) is not None:
            continue
        closure = month_closure(month, settings, now)
        if closure.closed:
            requests.append(dg.RunRequest(run_key=f"split-{key}", partition_key=key))
        else:
            waiting.append(closure.describe())
    if requests:
        return requests
    return dg.SkipReason("; ".join(waiting) if waiting else "every ended month has its split")
