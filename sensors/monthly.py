"""The monthly release: a daily cron that builds, audits and publishes each month once it has closed.

Not eager automation: a month closes only when every slot of every day is landed or confirmed
missing and the grace period has passed, and one slot GDELT never settles would make an eager
condition wait forever without saying why. A daily tick instead records what keeps the months
open: summed up by cause in its skip reason, each month's reasons in its log; an operator can
force a month with a recorded override (SplitConfig on test_split).
"""

from datetime import date

import dagster as dg

from assets.database import event_database
from assets.owners import DATA_OWNERS
from assets.partitions import monthly_partitions
from assets.release import release
from assets.resources import Dataset, Network, ReleaseBucket, compose
from assets.splits import test_split
from pipeline.release.layout import MANIFEST_NAME, release_key
from pipeline.release.store_uri import open_store
from pipeline.splits.split import CLOSED_STATUSES, Closure, month_closure
from sensors.run_health import max_runtime_tag

monthly_release_job = dg.define_asset_job(
    "monthly_release",
    owners=DATA_OWNERS,
    # One run per month: the release step runs only if test_split's blocking checks (the leakage
    # audit) passed in the same run.
    selection=[event_database, test_split, release],
    description="Builds one closed month's event database and test split, audits the split for leakage and "
    "publishes the release (skipped if the audit fails); the monthly_release_daily schedule launches it.",
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("monthly_release"),
)


# A skip reason is read in the tick list of the UI: one screen, not one line per open month (the
# tick's log has every month's full reasons).
SUMMARY_MAX_CHARS = 500
MONTH_RANGES_SHOWN = 3


def month_ranges(months: list[date]) -> str:
    """Months as runs of consecutive months, "2022-01..2025-08, 2025-10", at most
    MONTH_RANGES_SHOWN runs and then how many more."""
    runs: list[list[date]] = []
    for month in sorted(months):
        if runs and (runs[-1][-1].year * 12 + runs[-1][-1].month) + 1 == month.year * 12 + month.month:
            runs[-1].append(month)
        else:
            runs.append([month])
    shown = [f"{r[0]:%Y-%m}" + (f"..{r[-1]:%Y-%m}" if len(r) > 1 else "") for r in runs[:MONTH_RANGES_SHOWN]]
    more = sum(len(r) for r in runs[MONTH_RANGES_SHOWN:])
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _months_wait(months: list[date]) -> str:
    if len(months) == 1:
        return f"{months[0]:%Y-%m} waits"
    return f"{len(months)} months ({month_ranges(months)}) wait"


def _days(days: list[date]) -> str:
    return f"{len(days)} day{'s' if len(days) > 1 else ''}"


def open_months_summary(closures: list[Closure]) -> str:
    """Why the open months wait, by cause: how many months and which (as ranges), and for each
    cause the first thing to act on (the first day to materialise, the end of the grace period).
    At most SUMMARY_MAX_CHARS."""
    causes = []
    no_ledger = [c for c in closures if c.days_without_ledger]
    if no_ledger:
        days = [d for c in no_ledger for d in c.days_without_ledger]
        causes.append(
            f"{_months_wait([c.month for c in no_ledger])} for gdelt_files on {_days(days)} "
            f"(no slot ledger; first {min(days)}, last {max(days)})"
        )
    unsettled = [c for c in closures if c.days_unsettled]
    if unsettled:
        counts: dict[str, int] = {}
        for c in unsettled:
            for status, n in c.slots.items():
                if n and status not in CLOSED_STATUSES:
                    counts[status] = counts.get(status, 0) + n
        days = [d for c in unsettled for d in c.days_unsettled]
        causes.append(
            f"{_months_wait([c.month for c in unsettled])} for gdelt_files slots to settle "
            f"({', '.join(f'{n} {status}' for status, n in sorted(counts.items()))} on {_days(days)}; "
            f"first {min(days)})"
        )
    in_grace = [c for c in closures if c.grace_until is not None]
    if in_grace:
        causes.append(
            f"{_months_wait([c.month for c in in_grace])} for the grace period "
            f"(until {min(c.grace_until for c in in_grace).isoformat()})"
        )
    text = f"{len(closures)} month{'s' if len(closures) > 1 else ''} open: " + "; ".join(causes)
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 1] + "…"


@dg.schedule(
    cron_schedule="0 6 * * *",
    job=monthly_release_job,
    execution_timezone="UTC",
    description="Daily at 06:00 UTC launches one monthly_release run (event database, test split, leakage "
    "audit, release) for every ended month that has closed (slots settled, MIRAI_SPLIT_GRACE_DAYS over) and is "
    "not published; otherwise its skip reason sums up what keeps the months open. Stopped by default like every "
    "schedule: turn it on once ingestion runs and the release store is configured.",
)
def monthly_release_daily(
    context: dg.ScheduleEvaluationContext, dataset: Dataset, network: Network, release_store: ReleaseBucket
):
    """Request every ended month that is not released yet and has closed; skip with the reasons
    otherwise (visible on the schedule's tick history in the UI). A month whose run failed is
    requested again on the next day (the run key carries the day); re-running is idempotent."""
    now = context.scheduled_execution_time
    keys = monthly_partitions.get_partition_keys(current_time=now)
    if not keys:
        # Nothing to check: no store (no S3 client) is opened.
        return dg.SkipReason("no month has ended since MIRAI_START_DATE")
    settings = compose(dataset, network, release_store)
    store = open_store(settings.dataset, settings.network, settings.release, signed=True)
    started = set(store.release_months())
    requests: list[dg.RunRequest] = []
    waiting: list[Closure] = []
    for key in keys:
        month = f"{date.fromisoformat(key):%Y-%m}"
        # Published = its manifest is there (written last); a directory alone is an interrupted run.
        if month in started and store.stat(release_key(month, MANIFEST_NAME)) is not None:
            continue
        closure = month_closure(date.fromisoformat(key), settings.dataset, now)
        if closure.closed:
            requests.append(dg.RunRequest(run_key=f"release-{key}@{now:%Y-%m-%d}", partition_key=key))
        else:
            waiting.append(closure)
    # Every open month's full reasons, in the tick's log (the skip reason only sums them up).
    for closure in waiting:
        context.log.info(closure.describe())
    if requests:
        return requests
    return dg.SkipReason(open_months_summary(waiting) if waiting else "every ended month is released")
