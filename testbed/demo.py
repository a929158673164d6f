"""``mirai demo``: the whole chain on generated data, through Dagster, on one machine.

A generated GDELT mirror (one closed month plus a few days) is served on 127.0.0.1 with the news
sites its article URLs point at (NewsServer(sites=...), reached through MIRAI_FETCH_HOST_MAP) and
a local S3 server for the release (SeaweedFS). The production jobs then run, as the schedules
would run them, on the persistent SQLite instance in ``<data>/dagster_home`` (so ``dagster dev``
shows every run): ``gdelt_ingest`` and ``articles_daily`` for each day in order (a day's events
depend on the days before it), ``monthly_release`` for the month, then the baseline evaluations
and the leaderboard. Partitions already materialised in the instance are skipped, so a second
run only verifies the release and prints the summary.

Why the Python API and not ``dagster job execute``: the CLI runs one partition per process, and
its ``--partition-range`` needs single-run backfill policies these daily assets do not have (each
day is its own run in production). One process running the same jobs on the same instance saves
~5 s of start-up for each of the ~70 runs, over half the 10-minute budget. See docs/demo.md.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.config import DatasetSettings, NetworkSettings, ReleaseSettings, Settings
from pipeline.splits.database import month_days
from pipeline.storage import DataLayout, LockTimeout, file_lock
from testbed.generate import MirrorOptions, generate_mirror, news_sites
from testbed.news import SITE_SUFFIX, NewsServer
from testbed.s3 import SERVE_PORT, LocalS3
from testbed.serve import MirrorServer

ROOT = Path(__file__).resolve().parents[1]  # the project: definitions.py, workspace.yaml, agents.yaml
BUCKET = "mirai-releases"
RELEASE_PREFIX = "mirai"
# What anonymous clients may read in the demo's store, as docs/releases.md's policy grants it:
# releases and live rounds; never submissions/ (a submission's metadata holds a contact address).
PUBLIC_PREFIXES = (f"{RELEASE_PREFIX}/releases", f"{RELEASE_PREFIX}/live")
EVALUATION_JOB, LEADERBOARD_JOB, SUBMISSION_JOB = "agent_evaluation", "leaderboard_refresh", "submission_scoring"
# The baseline whose forecasts the demo scores and submits as a newcomer would (docs/evaluate-your-agent.md).
SUBMITTED_BASELINE, SUBMITTED_DISTANCE = "recurrency", 1
DEMO_TAGS = {"mirai/source": "demo"}  # every run the demo starts carries it
# The live round's replay clock runs this long before its deadline: the baselines, uploaded at
# publication, land well before it; the demo's late submission waits for it (docs/live.md, "Demo").
LIVE_LEAD = timedelta(seconds=15)
# The round the demo leaves open: its deadline falls this long after its manifest reaches the store,
# time for a newcomer to sync its history, forecast and submit on time (docs/live.md, "Demo").
OPEN_ROUND_LEAD = timedelta(hours=1)


@dataclass(frozen=True)
class DemoPlan:
    month: date  # the closed month that is split and released
    extra_days: int  # days of the next month: the open month the schedules would be working on
    options: MirrorOptions
    seed: int = 0

    @property
    def days(self) -> list[date]:
        month = month_days(self.month)
        return month + [month[-1] + timedelta(days=i + 1) for i in range(self.extra_days)]


def _say(message: str) -> None:
    print(message, flush=True)


class Stage:
    """``with Stage(3, 6, "ingest"):`` prints the stage's header and, at the end, its time."""

    def __init__(self, number: int, total: int, title: str):
        self.label = f"[{number}/{total}] {title}"

    def __enter__(self) -> Stage:
        self.started = time.perf_counter()
        _say(self.label)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            _say(f"      done in {time.perf_counter() - self.started:.1f}s")


def ensure_mirror(plan: DemoPlan, mirror_dir: Path) -> bool:
    """Generate the mirror unless the one on disk was made with the same arguments; True if made."""
    manifest = mirror_dir / "manifest.json"
    wanted = {
        "seed": plan.seed,
        "start": plan.days[0].isoformat(),
        "end": plan.days[-1].isoformat(),
        "options": {
            "event_scale": plan.options.event_scale,
            "stories_per_day": plan.options.stories_per_day,
            "url_scheme": plan.options.url_scheme,
        },
    }
    if manifest.exists():
        have = json.loads(manifest.read_text())
        if {k: have.get(k) for k in wanted} == wanted:
            return False
    generate_mirror(mirror_dir, plan.days[0], plan.days[-1], seed=plan.seed, options=plan.options)
    return True


def generated_source(plan: DemoPlan) -> str:
    return f"generated mirror, seed {plan.seed} (testbed/generate.py)"


def demo_agents(plan: DemoPlan, path: Path) -> Path:
    """agents.yaml's baselines, at the distances one month of history can serve. A baseline at
    distance d reads the event database up to the month's last day minus d, and the demo has no
    month before its own, so d = 90 has nothing to read; LLM agents need a model or an API key."""
    import yaml

    from pipeline.evaluation.registry import DEFAULT_DISTANCES

    reachable = len(month_days(plan.month)) - 1
    agents = []
    for entry in yaml.safe_load((ROOT / "agents.yaml").read_text())["agents"]:
        distances = [d for d in entry.get("distances", DEFAULT_DISTANCES) if d <= reachable]
        if entry.get("kind") == "baseline" and distances:
            agents.append({**entry, "distances": distances})
    path.write_text(
        "# Written by `mirai demo` from agents.yaml (testbed/demo.py: demo_agents).\n"
        + yaml.safe_dump({"agents": agents}, sort_keys=False)
    )
    return path


def demo_env(
    plan: DemoPlan, data_dir: Path, mirror: MirrorServer, news: NewsServer, s3: LocalS3, agents: Path
) -> dict[str, str]:
    """The settings the demo's runs read (pipeline.config names; the README's table)."""
    return {
        "MIRAI_DATA_DIR": str(data_dir),
        "DAGSTER_HOME": str(data_dir / "dagster_home"),
        "GDELT_BASE_URL": mirror.base_url,
        # Recorded in the split and release manifests and cards: a demo release must say it is not GDELT.
        "MIRAI_GENERATED_SOURCE": generated_source(plan),
        # The daily partitions are the demo's days (the UI then shows them, not every day since 2023).
        "MIRAI_START_DATE": plan.days[0].isoformat(),
        "MIRAI_END_DATE": plan.days[-1].isoformat(),
        # Short retry waits: every request is local, and one 503 page must not hold up a day's run.
        "MIRAI_BACKOFF_BASE_S": "0.2",
        "MIRAI_FETCH_BACKOFF_BASE_S": "0.2",
        # The news sites are www.<site>.example (never real hosts), all played by the local server.
        "MIRAI_FETCH_ALLOW_LOOPBACK": "1",
        "MIRAI_FETCH_HOST_MAP": f"*{SITE_SUFFIX}=127.0.0.1:{news.port}",
        "MIRAI_RELEASE_URI": f"s3://{BUCKET}/{RELEASE_PREFIX}",
        "MIRAI_AGENTS_FILE": str(agents),
        **s3.env(),
    }


def _metadata(result, asset: str) -> dict:
    """The metadata values of ``asset``'s materialisation in an execute_in_process result."""
    for event in result.get_asset_materialization_events():
        if event.asset_key.to_user_string() == asset:
            return {k: v.value for k, v in event.materialization.metadata.items()}
    return {}


@contextmanager
def demo_lock(data_dir: Path) -> Iterator[None]:
    """Held for the whole demo and by ``serve-release`` (flock on ``<data>/locks/demo.lock``): a
    second one on the same data (a second SeaweedFS on ``data/s3``, a second runner on the instance)
    is refused, and the holder knows no other demo process is alive, whatever the first one's fate:
    the kernel drops the lock when its holder dies, even by SIGKILL."""
    path = DataLayout(data_dir).lock_path("demo")
    with ExitStack() as held:
        try:
            held.enter_context(file_lock(path, timeout_s=0))
        except LockTimeout as exc:
            raise RuntimeError(
                f"another `mirai demo` or `mirai serve-release` is using {data_dir} (it holds "
                f"{path}): wait for it to end, or stop it"
            ) from exc
        yield


class Runner:
    """Runs the code location's jobs (or ``defs``'s) in this process on the persistent instance."""

    def __init__(self, defs=None):
        import dagster as dg

        self.dg = dg
        if defs is None:
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            with warnings.catch_warnings():  # the project opts into preview features knowingly
                warnings.simplefilter("ignore", dg.PreviewWarning)
                defs = importlib.import_module("definitions").defs
        self.defs = defs
        self.instance = dg.DagsterInstance.get()  # DAGSTER_HOME: the SQLite instance `dagster dev` opens

    def release_interrupted_runs(self) -> list:
        """Mark failed the demo's runs a killed demo left unfinished, and free the pool slots they hold.

        A step of the gdelt_http or article_fetch pool holds its slot (deploy/dagster-local.yaml: one
        each) until the step ends. Dagster frees the slots of a run whose process died only through
        run monitoring (the daemon's ``free_slots_after_run_end_seconds``, once the run is marked
        finished), and the demo runs without a daemon: after a SIGKILL mid-step, the next demo's step
        would wait for the slot forever (docs/demo.md). Call only under ``demo_lock``: then no demo
        run is alive; runs the UI or the daemon launched are never touched."""
        dg, storage = self.dg, self.instance.event_log_storage
        unfinished = [
            dg.DagsterRunStatus.NOT_STARTED,
            dg.DagsterRunStatus.STARTING,
            dg.DagsterRunStatus.STARTED,
            dg.DagsterRunStatus.CANCELING,
        ]
        stale = [
            r.dagster_run
            for r in self.instance.get_run_records(filters=dg.RunsFilter(tags=DEMO_TAGS, statuses=unfinished))
            if self._in_process(r.dagster_run)
        ]
        holding: set[str] = set()
        if storage.supports_global_concurrency_limits:
            holders = storage.get_concurrency_run_ids()  # runs with steps waiting for a slot
            for key in storage.get_concurrency_keys():
                holders |= storage.get_concurrency_info(key).active_run_ids
            # A demo run marked finished from the UI may still hold its slots too.
            holding = (
                {
                    r.dagster_run.run_id
                    for r in self.instance.get_run_records(
                        filters=dg.RunsFilter(tags=DEMO_TAGS, run_ids=sorted(holders))
                    )
                    if self._in_process(r.dagster_run)
                }
                if holders
                else set()
            )
        for run_id in holding:  # first the slots: a crash here leaves the run to the next demo
            storage.free_concurrency_slots_for_run(run_id)
        for run in stale:
            self.instance.report_run_failed(
                run,
                message="The `mirai demo` running this run was killed; "
                "the next demo marked it failed and freed its pool slots.",
            )
        return stale

    @staticmethod
    def _in_process(run) -> bool:
        """Made by execute_in_process (a demo), not launched by `dagster dev` (a UI re-execution of a
        demo run keeps its tags, but a launched run records the code location it came from)."""
        return run.remote_job_origin is None

    def done(self, asset: str) -> set[str]:
        return set(self.instance.get_materialized_partitions(self.dg.AssetKey(asset)))

    def run(
        self, job: str, partition_key=None, ops: dict | None = None, partition_range: tuple[str, str] | None = None
    ):
        """One run of ``job``; ``ops``: the run config's "ops" part (e.g. live_round's replay clock);
        ``partition_range``: (first, last) partition keys, one run over all of them (as a backfill
        of an asset with a single-run backfill policy)."""
        tags = dict(DEMO_TAGS)
        if partition_range:
            tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"] = partition_range
        result = self.defs.resolve_job_def(job).execute_in_process(
            instance=self.instance,
            partition_key=partition_key,
            raise_on_error=False,
            tags=tags,
            # The full event log is in the instance (the UI shows it); the terminal gets problems only.
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}} | ({"ops": ops} if ops else {}),
        )
        if not result.success:
            keys = partition_key or (partition_range and " .. ".join(partition_range))
            raise RuntimeError(f"Dagster run {result.run_id} of {job} ({keys}) failed: see it in the UI")
        return result


def run_days(runner: Runner, plan: DemoPlan) -> None:
    """``gdelt_ingest`` then ``articles_daily`` for each day, in order, as the schedules run them."""
    ingested, fetched = runner.done("daily_quads"), runner.done("articles")
    skipped = [d for d in plan.days if d.isoformat() in ingested and d.isoformat() in fetched]
    if skipped:
        _say(f"      {len(skipped)} days already materialised: skipped")
    for day in plan.days:
        key = day.isoformat()
        if day in skipped:
            continue
        started = time.perf_counter()
        quads = _metadata(runner.run("gdelt_ingest", key), "daily_quads") if key not in ingested else {}
        ingest_s = time.perf_counter() - started
        articles = _metadata(runner.run("articles_daily", key), "articles")
        _say(
            f"      {key}  ingest {ingest_s:4.1f}s quads {quads.get('dagster/row_count', '-'):>5}  "
            f"articles {time.perf_counter() - started - ingest_s:4.1f}s selected {articles.get('selected', 0):>4} "
            f"kept {articles.get('kept', 0):>4}"
        )


def run_evaluations(runner: Runner, plan: DemoPlan) -> None:
    """Each baseline of the demo's registry on the month's sample, then the leaderboard (what the
    evaluation sensor requests)."""
    from pipeline.evaluation.registry import load_agents

    agents = load_agents(Settings.from_env().dataset.agents_file)
    baselines = [a.name for a in agents]
    _say(
        "      "
        + "; ".join(f"{a.name} at d = {', '.join(map(str, a.distances))}" for a in agents)
        + " (one month of history: no longer distances)"
    )
    runner.instance.add_dynamic_partitions("agents", baselines)
    month_key = plan.month.isoformat()
    done = runner.done("evaluation")
    new = 0
    for name in baselines:
        key = runner.dg.MultiPartitionKey({"month": month_key, "agent": name})
        if str(key) in done:
            continue
        started = time.perf_counter()
        runner.run(EVALUATION_JOB, key)
        new += 1
        _say(f"      {name}: evaluated in {time.perf_counter() - started:.1f}s")
    if new or not runner.instance.fetch_materializations(runner.dg.AssetKey("leaderboard"), limit=1).records:
        runner.run(LEADERBOARD_JOB)


def submission_name(plan: DemoPlan) -> str:
    return f"demo-{SUBMITTED_BASELINE}-{plan.month:%Y-%m}"


def newcomer_files(plan: DemoPlan, settings: Settings, directory: Path) -> tuple[Path, Path]:
    """A baseline's stored forecasts of the month's sample as a newcomer's predictions.jsonl, and
    its submission.json (knowledge cutoff: the day before the month, so it is ranked)."""
    run = DataLayout(settings.dataset.data_dir).evaluation_dir(
        plan.month, SUBMITTED_BASELINE, "queries_sample", SUBMITTED_DISTANCE
    )
    results = pl.read_parquet(run / "results.parquet", columns=["query_id", "prediction", "ranked"])
    directory.mkdir(parents=True, exist_ok=True)
    predictions = directory / "predictions.jsonl"
    predictions.write_text(
        "".join(
            json.dumps({"query_id": q, "answer": json.loads(p), "ranked": r}) + "\n" for q, p, r in results.iter_rows()
        )
    )
    metadata = directory / "submission.json"
    metadata.write_text(
        json.dumps(
            {
                "model": f"{SUBMITTED_BASELINE} baseline (submitted by mirai demo)",
                "knowledge_cutoff": (plan.month - timedelta(days=1)).isoformat(),
                "contact": "demo@localhost",
                "month": f"{plan.month:%Y-%m}",
                "query_set": "queries_sample",
                "distance": SUBMITTED_DISTANCE,
                "rounds": 1,
                "api_mode": "native",
                "action_type": "none",
            },
            indent=2,
        )
        + "\n"
    )
    return predictions, metadata


def run_submission(runner: Runner, plan: DemoPlan, settings: Settings, data_dir: Path) -> None:
    """The newcomer's path (docs/evaluate-your-agent.md) with one baseline's forecasts: ``mirai
    score`` against the month's split, ``mirai submit`` to the S3 store; then what the operator's
    daemon does: a tick of the submission sensor, the submission run it requests and the
    leaderboard refresh after it."""
    from contextlib import redirect_stdout

    from pipeline.cli import main as mirai
    from pipeline.evaluation.submissions import SubmissionError
    from pipeline.evaluation.submit import check_name_free
    from pipeline.release.store_uri import open_store

    name = submission_name(plan)
    if name in runner.done("submission"):
        _say(f"      {name} already submitted and scored: skipped")
        return
    directory = data_dir / "newcomer"
    predictions, metadata = newcomer_files(plan, settings, directory)
    split = str(DataLayout(settings.dataset.data_dir).split_dir(plan.month))
    score = ["score", str(predictions), "--split", split, "--sample", "--out", str(directory / "scorecard")]
    submit = ["submit", str(predictions), "--meta", str(metadata), "--name", name, "--split", split]
    steps = [(score, "score.log"), (submit, "submit.log")]
    try:
        check_name_free(open_store(settings.dataset, settings.network, settings.release), name)
    except SubmissionError:  # uploaded by a demo killed before its sensor tick: the tick still scores it
        steps.pop()
        _say(f"      {name} was uploaded by an earlier, interrupted demo")
    for argv, log in steps:
        with open(directory / log, "w") as out, redirect_stdout(out):
            if mirai(argv) != 0:
                raise RuntimeError(f"mirai {argv[0]} failed: see {directory / log}")
        _say(f"      mirai {' '.join(argv[:2])} ...: ok ({directory / log})")
    tick = sensor_tick(runner, "submission_sensor")
    for request in tick.run_requests:
        runner.run(request.job_name, request.partition_key)
    record = json.loads((settings.dataset.data_dir / "submissions" / name / "record.json").read_text())
    _say(f"      submission_sensor tick: {len(tick.run_requests)} run(s); {name} {record['status']}")
    runner.run(LEADERBOARD_JOB)


def sensor_tick(runner: Runner, sensor: str, cursor: str | None = None):
    """One tick of ``sensor``, as the daemon evaluates it (the dynamic partitions it adds are added)."""
    with runner.dg.build_sensor_context(
        instance=runner.instance,
        instance_ref=runner.instance.get_ref(),  # the tick checks the dynamic partition keys it requests
        definitions=runner.defs,
        resources=runner.defs.resources,
        cursor=cursor,
    ) as context:
        tick = runner.defs.resolve_sensor_def(sensor).evaluate_tick(context)
    for request in tick.dynamic_partitions_requests or []:
        runner.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return tick


def live_round_day(plan: DemoPlan, settings: Settings) -> date:
    """The round whose farthest target date is the last generated day: every target date is a
    generated day, and the round's history (D − 1 and before) is too."""
    return plan.days[-1] - timedelta(days=max(settings.live.horizon_days))


def open_round_day(plan: DemoPlan, settings: Settings) -> date:
    """The round the demo leaves open: the one before live_round_day, so its target dates are
    generated days too and the UI's daemon can resolve and score it once its deadline has passed."""
    return live_round_day(plan, settings) - timedelta(days=1)


def late_name(day: date) -> str:
    return f"demo-late-{day.isoformat()}"


def _hms(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%H:%M:%S")


def _run_submissions(runner: Runner, names: list[str]) -> None:
    """A tick of submission_sensor, and the runs it requests for ``names`` (the monthly leaderboard
    refresh it may also ask for is stage 6's business)."""
    tick = sensor_tick(runner, "submission_sensor")
    for request in tick.run_requests:
        if request.partition_key in names:
            runner.run(request.job_name, request.partition_key)


def _live_status(settings: Settings, day: date, name: str) -> str:
    from pipeline.live.submissions import live_record_path

    path = live_record_path(settings.dataset.data_dir, day, name)
    if not path.is_file():
        return f"{name}: no record"
    record = json.loads(path.read_text())
    when = f"uploaded {_hms(datetime.fromisoformat(record['submitted_at']))} (store time)"
    if record["status"] == "accepted":
        kind = "baseline" if record["baseline"] else "submission"
        return f"{name}: accepted ({kind}, {record['answered']}/{record['questions']} questions), {when}"
    return f"{name}: {record['status']}, {when}: " + "; ".join(record["reasons"])


def run_live_round(runner: Runner, plan: DemoPlan, settings: Settings, data_dir: Path) -> None:
    """A live round replayed on the generated days (docs/live.md, "Demo"): the `live_round` asset
    publishes round D with a replay clock LIVE_LEAD before its deadline, so the deadline falls
    LIVE_LEAD after the manifest reaches the store (acceptance anchors it there); its baselines,
    uploaded at publication, are accepted; a newcomer's submission after that moment is refused
    by `mirai submit --live D` locally, then, uploaded anyway, by the pipeline as late. Then what the daemon does: `live_resolution_sensor` resolves the target dates (already
    ingested: D + 1 .. the last generated day), scores the accepted submissions, and refreshes the
    live leaderboard."""
    from contextlib import redirect_stderr, redirect_stdout

    from pipeline.cli import main as mirai
    from pipeline.evaluation.submissions import SubmissionError
    from pipeline.evaluation.submit import check_name_free, prepare, upload
    from pipeline.live.publication import baseline_name, read_local_manifest, store_deadline
    from pipeline.live.rounds import deadline
    from pipeline.release.layout import SUBMISSION_META, submission_key
    from pipeline.release.store_uri import open_store

    day = live_round_day(plan, settings)
    key, store = day.isoformat(), open_store(settings.dataset, settings.network, settings.release)
    baselines = [baseline_name(day, method) for method in ("recurrency", "frequency")]
    late = late_name(day)
    if key in runner.done("live_round"):
        _say(f"      round {key} already published: skipped (a round is immutable)")
    else:
        replay_at = deadline(day, settings.live) - LIVE_LEAD
        meta = _metadata(
            runner.run("live_round_publication", key, {"live_round": {"config": {"replay_at": replay_at.isoformat()}}}),
            "live_round",
        )
        _say(
            f"      live_round {key} (replay clock {replay_at.isoformat()}): {meta['questions']} questions "
            f"({meta['pairs_active']} active and {meta['pairs_quiet']} quiet pairs) for {meta['target_dates']}, "
            f"history through {day - timedelta(days=1)}"
        )
    manifest = read_local_manifest(settings.dataset.data_dir, day)
    due, how = store_deadline(store, manifest)
    _say(f"      deadline {manifest['deadline']} in the round's time = {_hms(due)} store time ({how})")
    if not all(name in runner.done("submission") for name in baselines):
        _run_submissions(runner, baselines)
    for name in baselines:
        _say("      " + _live_status(settings, day, name))
    if late not in runner.done("submission"):
        try:
            check_name_free(store, late)
        except SubmissionError:  # uploaded by a demo killed before its sensor tick
            _say(f"      {late} was uploaded by an earlier, interrupted demo")
        else:
            directory = data_dir / "newcomer" / "live"
            directory.mkdir(parents=True, exist_ok=True)
            # A newcomer sends the recurrency baseline's published forecasts, after the deadline.
            predictions = directory / "predictions.jsonl"
            predictions.write_bytes(store.get_bytes(submission_key(baselines[0], "predictions.jsonl")))
            metadata = directory / SUBMISSION_META
            metadata.write_text(
                json.dumps(
                    {
                        "model": "a late newcomer (mirai demo)",
                        "knowledge_cutoff": (day - timedelta(days=1)).isoformat(),
                        "contact": "demo@localhost",
                        "round": key,
                    },
                    indent=2,
                )
                + "\n"
            )
            wait = (due - datetime.now(UTC)).total_seconds() + 1.1  # the store's times are whole seconds
            if wait > 0:
                time.sleep(wait)
            # `mirai submit` refuses it locally (a courtesy); the newcomer then uploads it as any S3
            # client can, and the pipeline refuses it on the store's clock.
            argv = ["submit", str(predictions), "--meta", str(metadata), "--name", late, "--live", key]
            with open(directory / "submit.log", "w") as out, redirect_stdout(out), redirect_stderr(out):
                if mirai(argv) != 1:
                    raise RuntimeError(f"mirai submit did not refuse a late submission: see {directory / 'submit.log'}")
            _say(f"      mirai submit ... --name {late} --live {key}: refused locally ({directory / 'submit.log'})")
            prepared, problems = prepare(late, predictions, metadata)
            if prepared is None:
                raise RuntimeError("; ".join(problems))
            upload(store, prepared)
            _say(f"      uploaded anyway (as any S3 client can) at {_hms(datetime.now(UTC))}")
        _run_submissions(runner, [late])
    _say("      " + _live_status(settings, day, late))
    run_open_round(runner, plan, settings, store)
    _refresh_after_live_submissions(runner)
    resolved = _resolve_live(runner)
    card = json.loads((settings.dataset.data_dir / "live" / key / "scores.json").read_text())
    _say(
        f"      live_resolution {key}: {', '.join(resolved) or 'already resolved'}; "
        f"{card['resolved_questions']}/{card['questions']} questions resolved"
    )
    for name, entry in sorted(card["submissions"].items()):
        if entry.get("scored"):
            m = entry["metrics"]
            _say(
                f"      {name}: live score {m['live_score']['value']:.2f}, level-2 F1 "
                f"{m['level2_f1']['value'] if m['level2_f1']['value'] is not None else '-'}, "
                f"Brier {m['brier']['value']:.4f}"
            )
        else:
            _say(f"      {name}: not scored: {entry['reason']}")


def run_open_round(runner: Runner, plan: DemoPlan, settings: Settings, store) -> None:
    """The round left open for a newcomer (docs/live.md, "Demo"): `live_round` publishes round D
    with a replay clock OPEN_ROUND_LEAD before its deadline, so submissions close OPEN_ROUND_LEAD
    after its manifest reaches the store; `live_history` publishes the history it is forecast from
    (every generated day through D − 1, one run); a `submission_sensor` tick accepts its baselines."""
    from pipeline.live.publication import baseline_name, read_local_manifest, store_deadline
    from pipeline.live.rounds import deadline

    day = open_round_day(plan, settings)
    key, cutoff = day.isoformat(), day - timedelta(days=1)
    replay_at = deadline(day, settings.live) - OPEN_ROUND_LEAD
    if key in runner.done("live_round"):
        _say(f"      open round {key} already published: skipped")
    else:
        runner.run("live_round_publication", key, {"live_round": {"config": {"replay_at": replay_at.isoformat()}}})
    history = [d.isoformat() for d in plan.days if d <= cutoff]
    if set(history) <= runner.done("live_history"):
        _say(f"      live history through {cutoff} already published: skipped")
    else:
        clock = {"live_history": {"config": {"replay_at": replay_at.isoformat()}}}
        runner.run("live_history_publication", ops=clock, partition_range=(history[0], history[-1]))
        _say(f"      live_history {history[0]} .. {history[-1]}: {len(history)} days published (one run)")
    baselines = [baseline_name(day, method) for method in ("recurrency", "frequency")]
    if not all(name in runner.done("submission") for name in baselines):
        _run_submissions(runner, baselines)
    manifest = read_local_manifest(settings.dataset.data_dir, day)
    due, _ = store_deadline(store, manifest)
    _say(
        f"      open round {key}: questions for {', '.join(manifest['target_dates'])}, history through {cutoff}; "
        f"open until {_hms(due)} store time (in {max(0, round((due - datetime.now(UTC)).total_seconds() / 60))} min; "
        "the UI's daemon scores it after)"
    )


def _latest(runner: Runner, asset: str) -> int:
    """The storage id of ``asset``'s latest materialisation (0: none)."""
    records = runner.instance.fetch_materializations(runner.dg.AssetKey(asset), limit=1).records
    return records[0].storage_id if records else 0


def _refresh_after_live_submissions(runner: Runner) -> None:
    """The leaderboard_refresh that submission_sensor's next tick requests once the live round's
    submissions are in: they are partitions of `submission` too, so without it the UI would show
    the leaderboard Unsynced by them (it does not read them: its rows do not change)."""
    if _latest(runner, "submission") > _latest(runner, "leaderboard"):
        runner.run(LEADERBOARD_JOB)
        _say("      leaderboard_refresh after the live submissions (the monthly board is unchanged)")


def _resolve_live(runner: Runner) -> list[str]:
    """Ticks of live_resolution_sensor and the runs they request: the resolution runs, then the live
    leaderboard refresh. The cursor is the one the daemon would hold (the resolution the last
    refresh followed), so a second demo refreshes nothing."""
    dg, instance = runner.dg, runner.instance

    def latest(asset: str) -> int:
        records = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records
        return records[0].storage_id if records else 0

    board = latest("live_resolution") if latest("live_leaderboard") > latest("live_resolution") else 0
    cursor, resolved = json.dumps({"board": board}), []
    for _ in range(2):
        tick = sensor_tick(runner, "live_resolution_sensor", cursor)
        for request in tick.run_requests:
            runner.run(request.job_name, request.partition_key)
            if request.job_name == "live_round_resolution":
                resolved.append(request.run_key.rsplit(":", 1)[1])
        cursor = tick.cursor
    return resolved


def _count(paths: list[Path]) -> int:
    existing = [p for p in paths if p.exists()]
    return pl.scan_parquet(existing).select(pl.len()).collect().item() if existing else 0


def summary(plan: DemoPlan, settings: Settings, release_where: str, say: Callable[[str], None]) -> None:
    from pipeline.articles.ledger import read_ledger as read_fetch_ledger
    from pipeline.gdelt.ledger import read_ledger

    layout = DataLayout(settings.dataset.data_dir)
    slots = pl.concat([read_ledger(layout, d) for d in plan.days]).filter(pl.col("kind") == "export")
    by_status = dict(slots.group_by("status").len().iter_rows())
    quads = (
        pl.scan_parquet([layout.daily_quads_path(d) for d in plan.days])
        .select(
            pl.len().alias("quads"),
            (pl.col("daily_mentions") >= settings.dataset.article_min_mentions).sum().alias("well"),
        )
        .collect()
        .row(0, named=True)
    )
    fetch = read_fetch_ledger(layout)
    fetch_status = dict(fetch.group_by("status").len().sort("len", descending=True).iter_rows())
    judged = pl.read_parquet([layout.articles_path(d) for d in plan.days], columns=["kept", "failing_filter"])
    dropped = judged.filter(~pl.col("kept")).group_by("failing_filter").len().sort("len", descending=True)
    split = layout.split_dir(plan.month)
    queries = pl.read_parquet(split / "queries.parquet")
    sample = pl.read_parquet(split / "queries_sample.parquet")
    say(f"  days        {plan.days[0]} .. {plan.days[-1]} (month {plan.month:%Y-%m} closed and released)")
    say(f"  slots       {slots.height:,}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(by_status.items())))
    say(
        f"  events      {_count([layout.events_path(d) for d in plan.days]):,} kept international events, "
        f"{quads['quads']:,} daily quads ({quads['well']:,} with >= {settings.dataset.article_min_mentions} mentions)"
    )
    say(
        f"  articles    {fetch.height:,} URLs in the fetch ledger: "
        + ", ".join(f"{k} {v:,}" for k, v in fetch_status.items())
    )
    say(
        f"              {judged.height:,} stored pages extracted and filtered: {judged['kept'].sum():,} kept, dropped by "
        + ", ".join(f"{k} {v:,}" for k, v in dropped.iter_rows())
    )
    say(f"  split       {queries.height:,} queries, sample {sample.height:,} ({split})")
    for row in sample.head(3).select("query_code", "s_name", "o_name", "answer_list").iter_rows(named=True):
        say(f"              {row['query_code']}  {row['s_name']} -> {row['o_name']}: {', '.join(row['answer_list'])}")
    say(f"  release     {release_where}")
    from pipeline.evaluation.board import GROUP, markdown_table, newest_sections
    from pipeline.evaluation.board_files import BOARD_FILE
    from pipeline.evaluation.run import RANK_RULE

    board = pl.read_parquet(settings.dataset.data_dir / "evaluations" / BOARD_FILE)
    shown = board.select("rank", "overlaps_leader", "agent", "source", "level2_f1", "level1_f1", "mrr", *GROUP)
    say(f"  leaderboard {board.height} rows; the newest month's top 5 of each distance (F1 and MRR in %):")
    for title, rows in newest_sections(shown, top=5):
        say(f"              {title}")
        for line in markdown_table(rows.drop(GROUP)).splitlines():
            say("              " + line)
    say(f"              {RANK_RULE}")
    record = json.loads((settings.dataset.data_dir / "submissions" / submission_name(plan) / "record.json").read_text())
    say(
        f"  submission  {record['submission']}: {record['status']}, level-2 F1 "
        f"{record['scorecard']['metrics']['level2_f1']['value']:.2f} (as the run it came from); "
        f"page {settings.dataset.data_dir / 'evaluations' / 'leaderboard.html'}, published as releases/leaderboard.html"
    )
    live_summary(plan, settings, say)


def live_summary(plan: DemoPlan, settings: Settings, say: Callable[[str], None]) -> None:
    from pipeline.live.submissions import live_record_path

    day = live_round_day(plan, settings)
    directory = settings.dataset.data_dir / "live" / day.isoformat()
    manifest = json.loads((directory / "manifest.json").read_text())
    card = json.loads((directory / "scores.json").read_text())
    records = [json.loads(p.read_text()) for p in sorted((directory / "submissions").glob("*/record.json"))]
    accepted = sum(r["status"] == "accepted" for r in records)
    late = json.loads(live_record_path(settings.dataset.data_dir, day, late_name(day)).read_text())
    say(
        f"  live round  {day}: {card['questions']} questions for {', '.join(manifest['target_dates'])}; "
        f"{accepted} submissions accepted, {late['submission']} {late['status']} (late); "
        f"{card['resolved_questions']} questions resolved"
    )
    opened = open_round_day(plan, settings)
    manifest = json.loads((settings.dataset.data_dir / "live" / opened.isoformat() / "manifest.json").read_text())
    say(
        f"  open round  {opened}: {manifest['files']['questions.jsonl']['rows']} questions for "
        f"{', '.join(manifest['target_dates'])}, history through {manifest['history_cutoff']} in live/history/; "
        '`mirai live list` says until when it is open (docs/live.md, "Demo")'
    )
    board = json.loads((settings.dataset.data_dir / "live" / "leaderboard.json").read_text())
    say(
        "              live leaderboard: "
        + "; ".join(f"{r['rank']}. {r['name']} {r['live_score']:.2f}" for r in board["cumulative"][:3])
        + f" (page {settings.dataset.data_dir / 'live' / 'leaderboard.html'}, published as live/leaderboard.html)"
    )


def run_demo(plan: DemoPlan, data_dir: Path) -> int:
    with demo_lock(data_dir.resolve()):
        return _run_demo(plan, data_dir.resolve())


def _run_demo(plan: DemoPlan, data_dir: Path) -> int:
    total, started = 8, time.perf_counter()
    with Stage(1, total, f"GDELT mirror {plan.days[0]} .. {plan.days[-1]} in {data_dir / 'mirror'}"):
        made = ensure_mirror(plan, data_dir / "mirror")
        _say("      generated" if made else "      reusing the mirror generated earlier (same arguments)")
    dagster_home = data_dir / "dagster_home"
    dagster_home.mkdir(parents=True, exist_ok=True)
    instance_yaml = dagster_home / "dagster.yaml"
    # The local instance's settings (pools, telemetry off); an earlier demo's one-line file is replaced.
    if not instance_yaml.exists() or instance_yaml.read_text() == "telemetry:\n  enabled: false\n":
        instance_yaml.write_text((ROOT / "deploy" / "dagster-local.yaml").read_text())
    with ExitStack() as servers:
        with Stage(2, total, "servers on 127.0.0.1: GDELT mirror, news sites, S3 (SeaweedFS)"):
            mirror = servers.enter_context(MirrorServer(data_dir / "mirror"))
            news = servers.enter_context(NewsServer(sites=news_sites()))
            s3 = servers.enter_context(LocalS3(data_dir / "s3", BUCKET, public_prefixes=PUBLIC_PREFIXES))
            agents = demo_agents(plan, data_dir / "demo_agents.yaml")
            os.environ.update(demo_env(plan, data_dir, mirror, news, s3, agents))
            store_env = served_store_env(s3, f"http://127.0.0.1:{SERVE_PORT}")
            _say(f"      mirror {mirror.base_url}, news sites {news.url} (*{SITE_SUFFIX}), S3 {s3.endpoint}")
            runner, settings = Runner(), Settings.from_env()
            for run in runner.release_interrupted_runs():
                _say(
                    f"      run {run.run_id} of {run.job_name} {run.tags.get('dagster/partition', '')} was left "
                    "unfinished by a killed demo: marked failed, its pool slots freed"
                )
        with Stage(3, total, f"Dagster: gdelt_ingest + articles_daily for {len(plan.days)} days"):
            run_days(runner, plan)
        with Stage(4, total, f"Dagster: monthly_release {plan.month:%Y-%m} (event_database, test_split, release)"):
            if plan.month.isoformat() in runner.done("release"):
                _say("      already materialised: skipped (the release is immutable)")
            else:
                runner.run("monthly_release", plan.month.isoformat())
            release_where = _release_location(settings, plan.month)
        with Stage(5, total, "Dagster: baseline evaluations and the leaderboard"):
            run_evaluations(runner, plan)
        with Stage(6, total, f"a newcomer's path: score and submit {SUBMITTED_BASELINE}'s forecasts, then the sensor"):
            run_submission(runner, plan, settings, data_dir)
        with Stage(7, total, "live rounds: one replayed (a late submission refused, resolved, scored), one left open"):
            run_live_round(runner, plan, settings, data_dir)
    _say(f"[{total}/{total}] summary (servers stopped; {time.perf_counter() - started:.0f}s in all)")
    summary(plan, settings, release_where, _say)
    _say(
        f"\nThe local S3 server is stopped; its data stays in {data_dir / 's3'}. To download the release or "
        f"submit to it, serve it on http://127.0.0.1:{SERVE_PORT} (the command prints the commands for both):"
    )
    _say(f"  cd {ROOT} && MIRAI_DATA_DIR={data_dir} {_mirai()} serve-release")
    _say(
        "Open the same instance and data in the Dagster UI (http://127.0.0.1:3000); its sensors read that "
        "store, so keep serve-release running:"
    )
    _say(
        f"  cd {ROOT} && DAGSTER_HOME={dagster_home} MIRAI_DATA_DIR={data_dir} MIRAI_AGENTS_FILE={agents} "
        f"MIRAI_START_DATE={plan.days[0]} MIRAI_END_DATE={plan.days[-1]} {shell_assignments(store_env)} "
        ".venv/bin/dagster dev -w workspace.yaml"
    )
    return 0


def served_store_env(s3: LocalS3, endpoint: str) -> dict[str, str]:
    """The settings with which ``mirai submit`` and the Dagster UI's sensors reach the demo's store
    served at ``endpoint`` (``serve-release``) as the demo's identity (a named profile: no key in
    a command line)."""
    return {"MIRAI_RELEASE_URI": f"s3://{BUCKET}/{RELEASE_PREFIX}", **s3.profile_env(endpoint)}


def shell_assignments(env: dict[str, str]) -> str:
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())


def _mirai() -> str:
    """The `mirai` this process runs from (the venv's), else plain `mirai` from PATH."""
    local = Path(sys.executable).with_name("mirai")
    return shlex.quote(str(local)) if local.exists() else "mirai"


def serve_release(data_dir: Path, port: int, say: Callable[[str], None] = _say) -> None:
    """Serve the demo's release store (``data_dir/s3``) on 127.0.0.1:``port`` until interrupted,
    as the public bucket of docs/releases.md would be: anonymous reads, no anonymous listing.
    Prints the exact commands that download the newest release from it. The caller holds
    ``demo_lock(data_dir)``."""
    import signal

    from pipeline.release.layout import INDEX_KEY, LATEST_KEY
    from pipeline.release.store_uri import open_store

    endpoint = f"http://127.0.0.1:{port}"
    uri = f"s3://{BUCKET}/{RELEASE_PREFIX}"
    # SIGTERM (not only Ctrl-C) must stop weed too: it runs in its own session.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with LocalS3(data_dir / "s3", BUCKET, s3_port=port, public_prefixes=PUBLIC_PREFIXES) as s3:
        reader = open_store(
            DatasetSettings(),
            NetworkSettings(),
            ReleaseSettings(s3_endpoint_url=endpoint, s3_region="us-east-1", s3_max_attempts=1),
            uri=uri,
            signed=False,
        )
        latest = reader.get_bytes(LATEST_KEY)
        base = f"{endpoint}/{BUCKET}/{RELEASE_PREFIX}"
        say(
            f"serving the demo's release store {data_dir / 's3'} at {endpoint} ({uri}; anonymous read-only, "
            "no listing); Ctrl-C stops it"
        )
        if latest is None:
            say("no release is published there yet: `mirai demo` publishes one")
        else:
            month = json.loads(latest)["release"]
            say(f"newest release: {month}. Download and verify it (from another terminal):")
            say(f"  MIRAI_S3_ENDPOINT_URL={endpoint} {_mirai()} download latest --from {uri} --dest mirai-releases")
            say("or fetch single files with curl (keys in index.json are relative to the store's root):")
            say(f"  curl -s {base}/{INDEX_KEY}")
            say(f"  curl -O {base}/releases/{month}/queries.parquet")
            say(
                "Submit to it as the demo's own identity (the named profile of a credentials file: no key "
                'printed; docs/evaluate-your-agent.md, "6. The whole path on the demo"):'
            )
            say(f"  export {shell_assignments(served_store_env(s3, endpoint))}")
            say(
                f"  {_mirai()} submit predictions.jsonl --meta submission.json --name NAME "
                f"--split mirai-releases/{month}"
            )
            say(
                "The Dagster UI (the command `mirai demo` printed last, with its MIRAI_S3_ENDPOINT_URL set to "
                f"{endpoint}) picks submissions up from here while this runs."
            )
            say("Live rounds (docs/live.md): which are open, a round's questions, a live submission's status:")
            say(f"  MIRAI_S3_ENDPOINT_URL={endpoint} {_mirai()} live list --from {uri}")
            say(f"  MIRAI_S3_ENDPOINT_URL={endpoint} {_mirai()} status NAME --from {uri}")
        sys.stdout.flush()
        # Waited for in steps: Ctrl-C's SIGINT may be delivered to any thread (polars' and
        # jemalloc's included), and Python raises KeyboardInterrupt only once the main thread runs
        # bytecode again, never inside one long waitpid.
        try:
            while s3.process.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            # Read-only serving has nothing to drain (weed takes over 5 s to stop gracefully):
            # stopped within 5 s of Ctrl-C, as its first line promises.
            s3.stop(drain_s=1.0)
            return
        raise RuntimeError(f"weed exited with {s3.process.returncode}; see {data_dir / 's3' / 'weed.log'}")


def _release_location(settings: Settings, month: date) -> str:
    from pipeline.release.layout import MANIFEST_NAME, release_key
    from pipeline.release.store_uri import open_store

    store = open_store(settings.dataset, settings.network, settings.release)
    key = release_key(f"{month:%Y-%m}", MANIFEST_NAME)
    info = store.stat(key)
    state = f"manifest {info.size:,} bytes" if info else "NO MANIFEST"
    return f"{store.description}, {key} ({state})"
