"""Runs whose worker is gone, and pool slots held too long.

A run worker killed by SIGKILL or the OOM killer never marks its run ended: the run stays STARTED,
keeps its pool slots, and every later run of that pool queues behind it for good. Dagster's run
monitoring notices a dead worker only through a run launcher that can check a worker's health,
and the DefaultRunLauncher of one host cannot; a `dagster/max_runtime` ends a stuck run only after
its whole budget. So on that launcher this sensor looks at each STARTED run's worker process (its
pid, from the run's own "Started process for run" event) every RUN_HEALTH_INTERVAL_S: a worker that
is gone has its run marked failed (which `alert_on_run_failure` posts) and its pool slots freed at
once, so the next tick's run proceeds. Dagster's code server marks a run failed itself when it sees
its worker die, but it leaves the run's pool slots claimed (freed only after run monitoring's
free_slots_after_run_end_seconds): the queued next run waits for that too, so this sensor frees
them. docs/operations.md, "A run whose worker died".

It also alerts once per run when a run holds a pool slot past its job's budget (RUN_BUDGETS_S),
whatever the launcher: a stuck download holds the whole pool.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import dagster as dg

from assets.resources import Alerts, Network
from pipeline.alerts import Alert, send_alert
from pipeline.processes import still_running
from sensors.alerts import AlertNotDelivered

RUN_HEALTH_INTERVAL_S = 30
# Each job's budget in seconds (its runs' `dagster/max_runtime` tag, which Dagster's run monitoring
# enforces by ending the run): several times the longest run measured for it (docs/operations.md,
# "Run budgets"). Runs of other jobs (asset backfills, the launchpad) get the instance's
# run_monitoring.max_runtime_seconds.
RUN_BUDGETS_S = {
    "gdelt_ingest": 3600,
    "articles_daily": 3 * 3600,
    "monthly_release": 6 * 3600,
}


def max_runtime_tag(job_name: str) -> dict[str, str]:
    return {"dagster/max_runtime": str(RUN_BUDGETS_S[job_name])}


def run_worker_pid(instance: dg.DagsterInstance, run_id: str) -> tuple[int, datetime] | None:
    """(pid, when it was reported) of the run's worker: the run's engine event that carries a pid
    and no step keys (the run worker's own; step processes name their steps). None until reported."""
    found = None
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        metadata = entry.dagster_event.engine_event_data.metadata
        if "pid" in metadata and "step_keys" not in metadata:
            found = int(metadata["pid"].value), datetime.fromtimestamp(entry.timestamp, UTC)
    return found


def recover_lost_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed every STARTED run whose worker process is gone, and free the pool slots of every
    run whose worker is gone, however the run was ended (Dagster's code server marks a run failed
    when it sees its worker killed, but leaves its slots claimed); return one line per action."""
    said = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        worker = run_worker_pid(instance, run.run_id)
        if worker is None or still_running(*worker):
            continue
        # Re-read: the worker may have ended the run itself between the listing and now.
        current = instance.get_run_by_id(run.run_id)
        if current is None or current.status != dg.DagsterRunStatus.STARTED:
            continue
        instance.report_run_failed(
            current,
            f"run worker (pid {worker[0]}) is gone: killed (SIGKILL, out of memory) or crashed without "
            "ending its run; marked failed by run_worker_watch (docs/operations.md)",
        )
        said.append(f"{run.job_name} {run.run_id[:8]}: worker pid {worker[0]} gone, run marked failed")
    holders = {
        slot.run_id
        for pool in instance.event_log_storage.get_concurrency_keys()
        for slot in instance.event_log_storage.get_concurrency_info(pool).claimed_slots
    }
    for run_id in sorted(holders):
        run = instance.get_run_by_id(run_id)
        worker = run_worker_pid(instance, run_id)
        if run is None or not run.is_finished or worker is None or still_running(*worker):
            continue
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)
        said.append(f"{run.job_name} {run_id[:8]}: ended with its worker gone, pool slots freed")
    return said


def overdue_slot_holders(instance: dg.DagsterInstance, now: float) -> list[tuple[str, str, str, float]]:
    """(pool, run id, job, seconds held) for each run holding a pool slot past its budget."""
    default = float(instance.run_monitoring_max_runtime_seconds or 0)
    overdue = []
    for pool in instance.event_log_storage.get_concurrency_keys():
        info = instance.event_log_storage.get_concurrency_info(pool)
        for run_id in {slot.run_id for slot in info.claimed_slots}:
            record = instance.get_run_record_by_id(run_id)
            if record is None:
                continue
            run = record.dagster_run
            budget = float(run.tags.get("dagster/max_runtime") or RUN_BUDGETS_S.get(run.job_name) or default)
            held = now - (record.start_time or record.create_timestamp.timestamp())
            if budget and held > budget:
                overdue.append((pool, run_id, run.job_name, held))
    return overdue


@dg.sensor(
    name="run_worker_watch",
    minimum_interval_seconds=RUN_HEALTH_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks failed (and frees the pool slots of) every started run whose worker process "
    "is gone (SIGKILL, out of memory), and alerts once when a run holds a pool slot past its job's budget. "
    "Running by default: without it, a killed run holds its pool and stalls every later run of it.",
)
def run_worker_watch(context: dg.SensorEvaluationContext, network: Network, alerts: Alerts) -> dg.SensorResult:
    instance = context.instance
    said = []
    if isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        said += recover_lost_runs(instance)
    else:
        said.append(f"workers are checked by {type(instance.run_launcher).__name__} and run monitoring")
    announced = set(json.loads(context.cursor)) if context.cursor else set()
    overdue = overdue_slot_holders(instance, time.time())
    settings = alerts.settings()
    for pool, run_id, job, held in overdue:
        if run_id in announced:
            continue
        alert = Alert(
            "pool_slot_held",
            f"run of {job} has held the {pool} pool for {held / 60:.0f} min, past its budget",
            {"run_id": run_id, "job_name": job, "pool": pool, "held_minutes": round(held / 60, 1)},
        )
        if send_alert(alert, settings, network.user_agent, context.log.info) == "failed":
            raise AlertNotDelivered(f"pool slot alert for {run_id} not delivered; the next tick tries again")
        announced.add(run_id)
        said.append(alert.title)
    still_overdue = sorted(announced & {run_id for _, run_id, _, _ in overdue})
    return dg.SensorResult(
        skip_reason="; ".join(said) or f"every started run's worker is alive ({datetime.now(UTC):%H:%M:%S} UTC)",
        cursor=json.dumps(still_overdue),
    )
