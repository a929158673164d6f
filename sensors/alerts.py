"""Alert sensors: a run that failed, and GDELT data going stale. Both post to
MIRAI_ALERT_WEBHOOK_URL (pipeline/alerts.py); with no URL set the alert is a log line in the
sensor's tick history. docs/operations.md says what each alert means and what to do.
"""

import json
from datetime import UTC, datetime

import dagster as dg

from assets.resources import Alerts, Dataset, Network
from pipeline.alerts import Alert, Freshness, freshness, send_alert
from pipeline.storage import DataLayout

FRESHNESS_INTERVAL_S = 300


class AlertNotDelivered(Exception):
    """The webhook refused or never answered after every attempt: the tick shows the error in the
    UI. The freshness sensor's cursor then stays put, so its next tick retries; a run-status
    sensor's cursor moves on regardless (Dagster's design), so that failure is in the tick only."""


# Running by default, unlike the schedules: it acts only on a failed run, and an alert nobody
# switched on is the one that is missed.
@dg.run_failure_sensor(
    name="alert_on_run_failure",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="When any run fails, posts it (job, partition, run id, error) to MIRAI_ALERT_WEBHOOK_URL (with "
    "no URL, a line in this sensor's tick log); launches no run. Running by default: it acts only on a failed "
    "run, and an alert nobody switched on is the one that is missed.",
)
def alert_on_run_failure(context: dg.RunFailureSensorContext, network: Network, alerts: Alerts) -> None:
    run = context.dagster_run
    partition = run.tags.get("dagster/partition")
    error = _root_causes(context) or context.failure_event.message
    alert = Alert(
        "run_failure",
        f"run of {run.job_name}{f' for {partition}' if partition else ''} failed: {error}",
        {"run_id": run.run_id, "job_name": run.job_name, "partition": partition, "error": error},
    )
    if send_alert(alert, alerts.settings(), network.user_agent, context.log.info) == "failed":
        raise AlertNotDelivered(f"run failure alert for {run.run_id} not delivered")


def _root_causes(context: dg.RunFailureSensorContext) -> str:
    """ "step: the innermost exception" per failed step; the run's own message only says which
    steps failed, the cause says why (an unreachable host, a lock timeout, a failed check)."""
    causes = []
    for event in context.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            causes.append(f"{event.step_key}: {error.message.strip()}")
    return "; ".join(causes)


def _unchanged(state: Freshness) -> str:
    """The skip reason of a tick that posts nothing: the state, and what would change it."""
    if state.newest is None:
        return (
            f"{state.describe()}: no gdelt_files partition has a landed slot "
            "(turn on gdelt_every_15_minutes or backfill the gdelt_ingest job)"
        )
    if state.stale:
        return f"{state.describe()}; breach already announced, waits for gdelt_files to land a newer slot"
    return state.describe()


def _freshness_alert(state: Freshness, recovered: bool) -> Alert:
    fields = {
        "newest_landed_slot": state.newest.isoformat() if state.newest else None,
        "age_hours": None if state.age is None else round(state.age.total_seconds() / 3600, 2),
        "limit_hours": state.limit.total_seconds() / 3600,
    }
    if recovered:
        return Alert("freshness_recovered", f"GDELT data fresh again: {state.describe()}", fields)
    return Alert("freshness_breach", f"GDELT data stale: {state.describe()}", fields)


# Stopped by default like the 15-minute schedule it watches: on demo data (or before ingestion is
# switched on) the newest slot is always old. Turn both on together.
@dg.sensor(
    name="gdelt_freshness",
    minimum_interval_seconds=FRESHNESS_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Every 5 minutes checks the newest landed GDELT slot (gdelt_files) and alerts once when it is "
    "older than MIRAI_FRESHNESS_HOURS, and once when it is fresh again; launches no run. Stopped by default like "
    "gdelt_every_15_minutes, since on demo data the newest slot is always old: turn both on together.",
)
def gdelt_freshness(
    context: dg.SensorEvaluationContext, dataset: Dataset, network: Network, alerts: Alerts
) -> dg.SensorResult:
    """The cursor remembers whether the breach was already announced, so a breach posts once, not
    on every tick. A failed delivery fails the tick, which keeps the cursor: the next tick retries."""
    settings = alerts.settings()
    state = freshness(DataLayout(dataset.settings().data_dir), settings, datetime.now(UTC))
    announced = json.loads(context.cursor)["breach_announced"] if context.cursor else False
    if state.stale == announced:
        return dg.SensorResult(skip_reason=_unchanged(state), cursor=json.dumps({"breach_announced": announced}))
    alert = _freshness_alert(state, recovered=announced)
    if send_alert(alert, settings, network.user_agent, context.log.info) == "failed":
        raise AlertNotDelivered(f"{alert.kind} alert not delivered; the next tick tries again")
    return dg.SensorResult(skip_reason=alert.title, cursor=json.dumps({"breach_announced": state.stale}))
