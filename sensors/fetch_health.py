"""The alert for a day whose article fetches mostly fail: ``articles_fetch_failing``.

``articles_fetch_health`` (quality/event_checks.py) fails with WARN when most of a day's fetches
failed; a WARN shows in the UI and nowhere else, and the run stays green. This sensor posts it to
MIRAI_ALERT_WEBHOOK_URL (pipeline/alerts.py): once when a day's check starts failing, again only
after the day has passed the check in between (the hourly articles runs of a day whose fetches
keep failing re-evaluate it every hour; one alert says it).

Why a sensor over the check's execution history:
- the check cannot alert itself: it must stay a pure function of the stored data (the UI and
  tests re-run it; an evaluation must not post anything);
- a run-status sensor sees each run once, but only runs ending with one status (the check's
  verdict is in successful and failed runs alike), its cursor moves on even when the webhook is
  down (the alert is lost), and it keeps no state across runs, so every hourly run of a failing
  day would alert;
- Dagster's own alerting on check failures is a Dagster+ feature; OSS has none;
- the event log's check-evaluation events cannot be read across runs by a storage-id cursor on
  the default SQLite storage (its event log is sharded per run); the check's execution history
  (an index table, the one the UI's check history reads) can, on SQLite and PostgreSQL alike.

Each tick reads the newest ``HISTORY_WINDOW`` executions of the check. Their ids are those of the
planned executions, so a run planned earlier can finish later: the cursor keeps the ids of the
finished evaluations already handled, not a high-water mark, plus the days announced as failing.
A first tick only notes what is there: failures from before the sensor ran are not news (a day
that is still failing is announced at its next evaluation). A failed delivery fails the tick and
keeps the cursor, so the next tick posts it again (with any alert that tick had already posted).
"""

from __future__ import annotations

import json

import dagster as dg

from assets.resources import Alerts, Network
from pipeline.alerts import Alert, send_alert
from sensors.alerts import AlertNotDelivered

FETCH_HEALTH_CHECK = dg.AssetCheckKey(dg.AssetKey("articles"), "articles_fetch_health")
FETCH_HEALTH_INTERVAL_S = 60
# Executions of the check read per tick: the hourly articles runs, or a backfill's, finish far
# fewer than this between two ticks a minute apart.
HISTORY_WINDOW = 200
# Days remembered as announced: a day that never passes again (its URLs given up) is dropped from
# the cursor after this many newer failing days.
MAX_FAILING_DAYS = 400


def _evaluations(instance: dg.DagsterInstance) -> list[tuple[int, str | None, str, dg.AssetCheckEvaluation]]:
    """(execution id, partition, run id, evaluation) of the newest finished executions, oldest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(FETCH_HEALTH_CHECK, limit=HISTORY_WINDOW)
    finished = [
        (r.id, r.partition, r.run_id, r.event.dagster_event.event_specific_data)
        for r in records
        if r.event is not None and r.event.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    return sorted(finished, key=lambda item: item[0])


def fetch_failing_alert(partition: str | None, run_id: str, evaluation: dg.AssetCheckEvaluation) -> Alert:
    metadata = {key: value.value for key, value in evaluation.metadata.items()}
    fields = {k: metadata.get(k) for k in ("attempted", "failed", "failure_rate", "dominant_reason", "dominant_count")}
    return Alert(
        "articles_fetch_failing",
        f"articles of {partition}: {evaluation.description}",
        {"partition": partition, **fields, "run_id": run_id},
    )


@dg.sensor(
    name="alert_on_articles_fetch_failing",
    minimum_interval_seconds=FETCH_HEALTH_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute reads the new evaluations of articles_fetch_health and posts an "
    "articles_fetch_failing alert (day, attempted, failed, failure rate, dominant failure) to "
    "MIRAI_ALERT_WEBHOOK_URL once when a day starts failing it: most of its article fetches failed; launches "
    "no run. Running by default: it acts only on a failing check, and an alert nobody switched on is the one "
    "that is missed.",
)
def alert_on_articles_fetch_failing(
    context: dg.SensorEvaluationContext, network: Network, alerts: Alerts
) -> dg.SensorResult:
    evaluations = _evaluations(context.instance)
    window = [execution_id for execution_id, *_ in evaluations]
    if context.cursor is None:
        return dg.SensorResult(
            skip_reason=f"watching articles_fetch_health from now on ({len(window)} earlier evaluation(s) noted)",
            cursor=json.dumps({"seen": window, "failing": []}),
        )
    state = json.loads(context.cursor)
    seen, failing = set(state["seen"]), list(state["failing"])
    settings = alerts.settings()
    said = []
    for execution_id, partition, run_id, evaluation in evaluations:
        if execution_id in seen:
            continue
        if evaluation.passed:
            failing = [day for day in failing if day != partition]  # re-armed: its next failure is news
        elif partition not in failing:
            alert = fetch_failing_alert(partition, run_id, evaluation)
            if send_alert(alert, settings, network.user_agent, context.log.info) == "failed":
                raise AlertNotDelivered(f"{alert.kind} alert for {partition} not delivered; the next tick tries again")
            failing.append(partition)
            said.append(alert.title)
    return dg.SensorResult(
        skip_reason="; ".join(said) or f"no new failing day among {len(window)} evaluation(s)",
        cursor=json.dumps({"seen": window, "failing": failing[-MAX_FAILING_DAYS:]}),
    )
