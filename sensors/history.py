"""Later days follow an earlier day that changed.

A day's events read every earlier day's key files (rules 1 and 6), and record which history they
were built against (`history_fingerprint`). When an earlier day is added or rebuilt after later
days were built (history extended backwards, the live schedule switched on before a backfill, a
repaired day), those later days hold events that belong to the earlier one. This sensor finds
them (pipeline.events.outdated_days) and rebuilds the oldest one's events and quads; only one
rebuild runs at a time, so the next day is judged against the rebuilt one: oldest first, down to
the newest, with no one involved (docs/operations.md, "Backfills").

Why not Dagster's own automation: `events` would have to depend on its previous partition, and an
automation condition on that self-dependent multi-asset (events, unmapped_codes) is turned into an
asset backfill that Dagster 1.13 fails at once ("At least one run should be requested on first
backfill iteration"); the fingerprint also names exactly the days whose history changed.
"""

import dagster as dg

from assets.events import daily_quads, events
from assets.resources import Dataset
from pipeline.events import history_fingerprint, outdated_days
from pipeline.storage import DataLayout
from sensors.run_health import max_runtime_tag

FOLLOW_INTERVAL_S = 30

events_follow_job = dg.define_asset_job(
    "events_follow_history",
    selection=[events, daily_quads],
    executor_def=dg.in_process_executor,
    tags=max_runtime_tag("gdelt_ingest"),
)


@dg.sensor(
    name="events_follow_history",
    job=events_follow_job,
    minimum_interval_seconds=FOLLOW_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Rebuilds, one day at a time and oldest first, the events and daily quads of every day "
    "built before an earlier day was added or rebuilt. Running by default: a day built against an "
    "outdated history is wrong data that nothing else would fix.",
)
def events_follow_history(context: dg.SensorEvaluationContext, dataset: Dataset):
    active = context.instance.get_runs(
        filters=dg.RunsFilter(
            job_name=events_follow_job.name,
            statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED],
        ),
        limit=1,
    )
    if active:
        return dg.SkipReason(f"waits for the rebuild of {active[0].tags.get('dagster/partition')} to end")
    layout = DataLayout(dataset.data_dir)
    outdated = outdated_days(layout)
    if not outdated:
        return dg.SkipReason("every built day's events are current with the days before it")
    day = outdated[0]
    context.log.info(f"{len(outdated)} day(s) outdated: {', '.join(d.isoformat() for d in outdated[:20])}")
    return dg.RunRequest(
        # Once per day and history: a rebuild that failed (alerted as a run failure) is not
        # retried on every tick; a change to an earlier day makes a new key.
        run_key=f"{day}@{history_fingerprint(layout, day)}",
        partition_key=day.isoformat(),
        tags={"mirai/outdated_days": str(len(outdated))},
    )
