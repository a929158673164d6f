"""Later days follow an earlier day that changed.

A day's events read every earlier day's key files (rules 1 and 6), and record which history they
were built against (`history_fingerprint`). When an earlier day is added or rebuilt after later
days were built (history extended backwards, the live schedule switched on before a backfill, a
repaired day), those later days hold events that belong to the earlier one. This sensor finds
them (pipeline.events.daily.outdated_days) and rebuilds the oldest one's events and quads; only one
rebuild runs at a time, so the next day is judged against the rebuilt one: oldest first, down to
the newest, with no one involved (docs/operations.md, "Backfills").

When days become outdated the sensor alerts once (`events_outdated`) and records each such day's
`events_history_current` check as failed, so the UI shows which days wait; each rebuild runs the
check again and passes it.

Why not Dagster's own machinery, now that `events` declares its dependency on the previous day
(assets/events.py): an automation condition on that self-dependent multi-asset (events,
unmapped_codes) is turned into an asset backfill that Dagster 1.13 fails at once ("At least one run
should be requested on first backfill iteration"), and Dagster does not follow a self-dependency
for staleness past 100 partitions (`SKIP_PARTITION_DATA_VERSION_SELF_DEPENDENCY_THRESHOLD` in
dagster/_core/definitions/data_version.py), so later days would not show as stale. The fingerprint
also names exactly the days whose history changed.
"""

import json

import dagster as dg

from assets.events import daily_quads, events
from assets.owners import DATA_OWNERS
from assets.resources import Alerts, Dataset, Network
from pipeline.alerts import Alert, send_alert
from pipeline.config import AlertSettings
from pipeline.events.daily import OutdatedDay, outdated_days
from pipeline.storage import DataLayout
from quality.event_checks import events_history_current
from sensors.run_health import max_runtime_tag

FOLLOW_INTERVAL_S = 30
MAX_DAYS_LISTED = 100  # in the alert's payload; the count says how many in all

events_follow_job = dg.define_asset_job(
    "events_follow_history",
    owners=DATA_OWNERS,
    selection=[events, daily_quads],
    description="Rebuilds one day's events and daily quads whose history changed after they were built; "
    "the events_follow_history sensor launches it, oldest day first.",
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("gdelt_ingest"),
)


@dg.sensor(
    name="events_follow_history",
    job=events_follow_job,
    minimum_interval_seconds=FOLLOW_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Rebuilds, one day at a time and oldest first, the events and daily quads of every day "
    "built before an earlier day was added or rebuilt; marks each such day's events_history_current check "
    "failed and alerts (events_outdated) when days become outdated. Running by default: a day built against "
    "an outdated history is wrong data that nothing else would fix.",
)
def events_follow_history(context: dg.SensorEvaluationContext, dataset: Dataset, network: Network, alerts: Alerts):
    active = context.instance.get_runs(
        filters=dg.RunsFilter(
            job_name=events_follow_job.name,
            statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED],
        ),
        limit=1,
    )
    if active:
        return dg.SkipReason(f"waits for the rebuild of {active[0].tags.get('dagster/partition')} to end")
    outdated = outdated_days(DataLayout(dataset.data_dir))
    if not outdated:
        return dg.SensorResult(
            skip_reason="every built day's events are current with the days before it", cursor=json.dumps([])
        )
    context.log.info(f"{len(outdated)} day(s) outdated: {', '.join(o.day.isoformat() for o in outdated[:20])}")
    # Announced once per day and history; the cursor keeps only the days still outdated.
    announced = set(json.loads(context.cursor)) if context.cursor else set()
    new = [o for o in outdated if _key(o) not in announced]
    if new and _announce(new, outdated, alerts.settings(), network.user_agent, context.log):
        announced |= {_key(o) for o in new}
    oldest = outdated[0]
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                # Once per day and history: a rebuild that failed (alerted as a run failure) is not
                # retried on every tick; a change to an earlier day makes a new key.
                run_key=_key(oldest),
                partition_key=oldest.day.isoformat(),
                tags={"mirai/outdated_days": str(len(outdated))},
            )
        ],
        # The UI shows each outdated day's events with a failed check until its rebuild passes it.
        asset_events=[_failed_history_check(o) for o in new],
        cursor=json.dumps(sorted(announced & {_key(o) for o in outdated})),
    )


def _key(outdated: OutdatedDay) -> str:
    return f"{outdated.day}@{outdated.history_now}"


def _failed_history_check(outdated: OutdatedDay) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=events_history_current.check_key.asset_key,
        check_name=events_history_current.check_key.name,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        partition=outdated.day.isoformat(),
        metadata={"built_against": outdated.built_against, "history_now": outdated.history_now},
        description="earlier days changed since this day was normalised: events_follow_history rebuilds it",
    )


def _announce(new: list[OutdatedDay], outdated: list[OutdatedDay], alerts: AlertSettings, user_agent: str, log) -> bool:
    """Alert that days became outdated (a backfill or a day added out of order). A webhook that
    fails is retried on the next tick, and never holds back the rebuild."""
    days = [o.day.isoformat() for o in new]
    span = days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"
    alert = Alert(
        "events_outdated",
        f"{len(new)} day(s) built before an earlier day changed ({span}); events_follow_history rebuilds "
        f"them oldest first ({len(outdated)} outdated in all)",
        {"days": days[:MAX_DAYS_LISTED], "count": len(new), "outdated_in_all": len(outdated)},
    )
    if send_alert(alert, alerts, user_agent, log.info) == "failed":
        log.warning("events_outdated alert not delivered; the next tick tries again")
        return False
    return True
