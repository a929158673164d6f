"""Pick up new uploads in the release store's submissions/ and score each once.

Each tick looks at up to MAX_LISTED_KEYS keys (the cursor pages through more on later ticks,
then starts over), and for every complete upload with no record and no rejection.json yet adds
a partition of the `submission` asset and requests one run. Uploads in progress and months whose
split is not built yet wait for a later tick (pipeline/evaluation/submissions.py, ``triage``), as do
live rounds' uploads for a round not published yet (pipeline/live/submissions.py, whose ``triage`` this calls).
The run key ``submission:<name>:<content key>`` (a hash of the listed objects and the metadata's
bytes) makes a re-tick a no-op: Dagster never launches a run key twice. When submissions were
materialised since the last leaderboard and none is queued or running, it requests the
`leaderboard_refresh` job, as the evaluation sensor does.
"""

from __future__ import annotations

import json

import dagster as dg

from assets.owners import BENCHMARK_OWNERS
from assets.resources import Dataset, Network, ReleaseBucket, compose
from assets.submissions import submission, submission_partitions
from pipeline.evaluation.scoring import bounded
from pipeline.live.submissions import triage
from pipeline.release.store_uri import open_store
from sensors.evaluations import leaderboard_job, leaderboard_request

submission_job = dg.define_asset_job(
    "submission_scoring",
    owners=BENCHMARK_OWNERS,
    selection=[submission],
    executor_def=dg.in_process_executor,
    description="Checks and scores (monthly) or accepts (live) one uploaded submission, or refuses it with "
    "rejection.json (the submission_accepted check then warns); submission_sensor launches it.",
)


@dg.sensor(
    jobs=[submission_job, leaderboard_job],
    minimum_interval_seconds=60,
    description="Every minute lists new uploads under submissions/ in the release store and launches one "
    "submission_scoring run per complete upload (and a leaderboard_refresh after scoring). Stopped by default, like "
    "every sensor that launches runs here: an operator turns it on once the release store is configured and open "
    "for submissions.",
)
def submission_sensor(
    context: dg.SensorEvaluationContext, dataset: Dataset, network: Network, release_store: ReleaseBucket
) -> dg.SensorResult:
    """A store that cannot be listed fails the tick; a bad upload never does (its run refuses it)."""
    state = json.loads(context.cursor) if context.cursor else {"after": "", "board": 0}
    settings = compose(dataset, network, release_store)
    found = triage(
        open_store(settings.dataset, settings.network, settings.release),
        settings.dataset.data_dir,
        start_after=state["after"],
    )
    for line in bounded(found.stray + found.waiting):  # at most 50 lines a tick
        context.log.info(line)
    known = set(context.instance.get_dynamic_partitions(submission_partitions.name))
    new = [name for name in found.ready if name not in known]
    requests = [
        dg.RunRequest(
            run_key=f"submission:{name}:{content}",
            job_name=submission_job.name,
            partition_key=name,
            tags={"mirai/submission": name},
        )
        for name, content in found.ready.items()
    ]
    board = state["board"]
    if not requests:
        refresh, board = leaderboard_request(context.instance, submission, submission_job.name, board)
        requests += [refresh] if refresh else []
    # The first waiting upload names what it waits for (test_split, live_round); the rest are in the log.
    skip = (
        f"nothing new ({len(found.waiting)} waiting, {len(found.stray)} key(s) under no valid name)"
        + (f"; first waiting: {found.waiting[0]}" if found.waiting else "")
        if not requests
        else None
    )
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=skip,
        cursor=json.dumps({"after": found.next_after, "board": board}),
        dynamic_partitions_requests=[submission_partitions.build_add_request(new)] if new else [],
    )
