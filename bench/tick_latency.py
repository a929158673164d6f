"""Live tick latency: the real 15-minute schedule under the real daemon, against a mirror that
publishes on the wall clock.

    .venv/bin/python bench/tick_latency.py [--ticks N] [--out DIR]

What it measures, per tick of ``gdelt_every_15_minutes`` (:05, :20, :35, :50 UTC): the newest
slot the tick's run can land (``newest_slot`` of the tick, or the newest listed slot before it
when that one is a feed gap) and when the mirror published it; when the run was created (queued),
started and ended; when its ``events`` were materialised (events available). From those: slot
published -> run started, slot published -> events available, launch latency (created ->
started) and the per-run Dagster overhead, (run end - run created) - the sum of its step
durations. After each tick it checks, from the day's slot ledger and events file, that the run
landed the newest published slot, and times the same work without Dagster in this process (the
``mirai ingest`` / ``mirai events`` calls: ``ingest_day``, ``parse_day`` twice, ``build_events``,
``build_daily_quads``) on a second data directory kept in step with the pipeline's, for the ratio
Dagster run / plain. The goal on 2 cores is p95 slot published -> events available <= 5 min.

How: a fresh DAGSTER_HOME with deploy/dagster-local.yaml as its dagster.yaml (the storage created
here before the daemon starts: testbed/dagster_services.py), the schedule turned on with ``dagster schedule
start`` and ``dagster-daemon run -w workspace.yaml`` in its own session, with MIRAI_DATA_DIR,
GDELT_BASE_URL and MIRAI_START_DATE (yesterday) set. The mirror: ``generate_mirror`` (seed 0,
event scale 1.0, i.e. GDELT's volume: a whole day lands and builds in a few seconds on 2 cores
without Dagster, so nothing is scaled down) for yesterday through the last day the run reaches,
written to a hidden staging directory; a publisher thread copies each slot's zips into the served directory
at slot time + PUBLISH_LAG and rewrites masterfilelist.txt and lastupdate.txt to list only the
published slots, recording each slot's publish time (slots due before the bench started are
published at once). Yesterday and today's slots published so far are built before the daemon
starts (plain code path, into both data directories), as in a running deployment: every tick, the
first too, lands the slots published since the one before.

It runs in real time: one tick every 15 minutes, so the default (8 ticks) takes about 2 h. Each tick's line is printed when its runs end, and the JSON (per-tick numbers, summary)
is rewritten to --out after each tick, so an interrupted run keeps what it measured.

Excluded: runs of other jobs (e.g. events_follow_history) are not measured. The ratio's plain side does not run the
asset checks, which are steps of the Dagster run (their durations are printed per step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl

from common import machine as machine_summary
from pipeline.config import DatasetSettings, Settings
from pipeline.events.daily import build_daily_quads, build_events
from pipeline.gdelt.ingest import ingest_day, parse_day
from pipeline.gdelt.ledger import GREEN, read_ledger
from pipeline.storage import KINDS, DataLayout, atomic_write_bytes
from sensors.schedules import newest_slot
from testbed.dagster_services import BIN, ROOT, running_daemon
from testbed.generate import MirrorOptions, generate_mirror
from testbed.serve import MirrorServer

SCHEDULE = "gdelt_every_15_minutes"
TICK_MINUTES = (5, 20, 35, 50)  # the schedule's cron, 5,20,35,50 * * * * UTC
SEED = 0
EVENT_SCALE = 1.0
# GDELT lists a slot a few minutes after its timestamp; 2 minutes keeps each tick's newest slot
# (tick - 5 min, sensors/schedules.py) published before the tick, as on the real feed.
PUBLISH_LAG = timedelta(minutes=2)
PUBLISH_POLL_S = 2.0
# A tick's runs that have not ended by then are reported unfinished: the next tick is due.
TICK_DEADLINE = timedelta(minutes=14)
POLL_S = 2.0
GOAL_P95_S = 300.0


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def hms(ts: float | None) -> str:
    return "-" if ts is None else f"{utc(ts):%H:%M:%S}"


def clock(iso: str | None) -> str:
    return "-" if iso is None else iso[11:16]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


class Publisher(threading.Thread):
    """Publishes the staged mirror slot by slot at slot time + PUBLISH_LAG: zips first, then the
    index files listing only published slots (the master list only grows, as the downloader's
    Range refresh requires)."""

    def __init__(self, staging: Path, served: Path):
        super().__init__(name="publisher", daemon=True)
        self.staging, self.served = staging / "gdeltv2", served / "gdeltv2"
        self.served.mkdir(parents=True, exist_ok=True)
        # The staged index, per slot in time order: the lines of its listed files.
        self.lines: dict[datetime, list[str]] = {}
        for line in (self.staging / "masterfilelist.txt").read_text().splitlines():
            name = line.rsplit("/", 1)[1]
            self.lines.setdefault(datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC), []).append(line)
        self.published: dict[datetime, float] = {}  # slot -> when its index lines were served
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.publish_due()  # everything already due is served before anyone asks

    def publish_due(self) -> None:
        now = datetime.now(UTC)
        due = [slot for slot in self.lines if slot not in self.published and slot + PUBLISH_LAG <= now]
        if not due:
            return
        for slot in due:
            for line in self.lines[slot]:
                name = line.rsplit("/", 1)[1]
                atomic_write_bytes(self.served / name, (self.staging / name).read_bytes())
        listed = [slot for slot in self.lines if slot in self.published or slot in due]
        atomic_write_bytes(
            self.served / "masterfilelist.txt", "".join(f"{line}\n" for s in listed for line in self.lines[s]).encode()
        )
        atomic_write_bytes(
            self.served / "lastupdate.txt", "".join(f"{line}\n" for line in self.lines[listed[-1]]).encode()
        )
        at = time.time()
        with self.lock:
            self.published.update(dict.fromkeys(due, at))

    def run(self) -> None:
        while not self.stopping.wait(PUBLISH_POLL_S):
            self.publish_due()

    def published_at(self, slot: datetime) -> float | None:
        with self.lock:
            return self.published.get(slot)

    def newest_listed(self, at_or_before: datetime) -> datetime | None:
        """The newest slot the staged index lists at or before a time (a feed gap has no files)."""
        return max((slot for slot in self.lines if slot <= at_or_before), default=None)


def plain_day(day: date, settings: Settings) -> dict[str, float]:
    """The day's work without Dagster, as ``mirai ingest`` and ``mirai events`` do it; seconds per call."""
    took: dict[str, float] = {}
    start = time.perf_counter()
    ingest_day(day, settings.dataset, settings.network, settings.gdelt)
    took["ingest_day"] = time.perf_counter() - start
    for kind in KINDS:
        start = time.perf_counter()
        parse_day(day, kind, settings.dataset, settings.gdelt)
        took[f"parse_day {kind}"] = time.perf_counter() - start
    start = time.perf_counter()
    build_events(day, settings.dataset)
    took["build_events"] = time.perf_counter() - start
    start = time.perf_counter()
    build_daily_quads(day, settings.dataset)
    took["build_daily_quads"] = time.perf_counter() - start
    return took


@dataclass
class RunTimes:
    run_id: str
    partition: str
    status: str
    created: float
    started: float | None
    events_at: float | None
    ended: float | None
    steps: dict[str, float]  # step key -> seconds

    @property
    def launch_s(self) -> float | None:
        return None if self.started is None else self.started - self.created

    @property
    def overhead_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.created - sum(self.steps.values())


def run_times(instance: dg.DagsterInstance, record: dg.RunRecord) -> RunTimes:
    run_id = record.dagster_run.run_id
    started = ended = events_at = None
    step_start: dict[str, float] = {}
    steps: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        kind = event.event_type
        if kind == dg.DagsterEventType.RUN_START:
            started = entry.timestamp
        elif kind in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE):
            ended = entry.timestamp
        elif kind == dg.DagsterEventType.STEP_START:
            step_start[entry.step_key] = entry.timestamp
        elif kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            steps[entry.step_key] = entry.timestamp - step_start[entry.step_key]
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION and event.asset_key == dg.AssetKey("events"):
            events_at = entry.timestamp
    return RunTimes(
        run_id,
        record.dagster_run.tags.get("dagster/partition", ""),
        record.dagster_run.status.value,
        record.create_timestamp.timestamp(),
        started,
        events_at,
        ended,
        steps,
    )


def tick_runs(instance: dg.DagsterInstance, tick: datetime) -> list[dg.RunRecord]:
    """The schedule's runs for one tick: their run keys end in ``@<tick>`` (sensors/schedules.py)."""
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/schedule_name": SCHEDULE}), limit=20)
    return [r for r in records if r.dagster_run.tags.get("dagster/run_key", "").endswith(f"@{tick:%Y%m%dT%H%M}")]


def landed_state(layout: DataLayout, day: date) -> dict:
    """What the day's files hold: slots with both files landed, the newest of them, and the newest
    DATEADDED among the day's kept events."""
    ledger = read_ledger(layout, day)
    landed = (
        ledger.filter(pl.col("status").is_in(GREEN)).group_by("slot").len().filter(pl.col("len") == len(KINDS))["slot"]
    )
    events_path = layout.events_path(day)
    newest_event = None
    if events_path.exists():
        newest_event = pl.scan_parquet(events_path).select(pl.col("date_added").max()).collect().item()
    return {
        "landed_slots": landed.len(),
        "newest_landed": landed.max(),
        "newest_event_added": newest_event,
    }


def next_tick(after: datetime) -> datetime:
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while t.minute not in TICK_MINUTES:
        t += timedelta(minutes=1)
    return t


def percentile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure_tick(
    tick: datetime, instance: dg.DagsterInstance, publisher: Publisher, layout: DataLayout, plain: Settings
) -> dict:
    """Wait for the tick's runs to end, then read their timeline and check the day's files."""
    expected = 2 if tick.minute == 5 and tick.hour < 6 else 1  # the early :05 ticks re-run yesterday
    deadline = tick + TICK_DEADLINE
    while True:
        records = tick_runs(instance, tick)
        if len(records) >= expected and all(r.dagster_run.is_finished for r in records):
            break
        if datetime.now(UTC) > deadline:
            break
        time.sleep(POLL_S)
    slot = newest_slot(tick)
    day = slot.date()
    landable = publisher.newest_listed(slot)
    published = publisher.published_at(landable) if landable else None
    runs = [run_times(instance, r) for r in records]
    main = next((r for r in runs if r.partition == day.isoformat()), None)
    result: dict = {
        "tick": tick.isoformat(),
        "newest_slot": slot.isoformat(),
        "landable_slot": landable.isoformat() if landable else None,
        "slot_published": published,
        "runs": [vars(r) | {"launch_s": r.launch_s, "overhead_s": r.overhead_s} for r in runs],
    }
    if main is None:
        return result
    state = landed_state(layout, day)
    plain_s = {}
    for partition in sorted(r.partition for r in runs if r.ended is not None):
        plain_s[partition] = plain_day(date.fromisoformat(partition), plain)
    steps_s = sum(main.steps.values())
    result.update(
        run_id=main.run_id,
        status=main.status,
        created=main.created,
        started=main.started,
        events_at=main.events_at,
        ended=main.ended,
        published_to_started_s=None if published is None or main.started is None else main.started - published,
        published_to_events_s=None if published is None or main.events_at is None else main.events_at - published,
        launch_s=main.launch_s,
        overhead_s=main.overhead_s,
        run_s=None if main.ended is None else main.ended - main.created,
        steps_s=steps_s,
        steps=main.steps,
        plain_s=sum(plain_s.get(day.isoformat(), {}).values()) or None,
        plain_calls=plain_s,
        landed_slots=state["landed_slots"],
        newest_landed=state["newest_landed"].isoformat() if state["newest_landed"] else None,
        newest_event_added=state["newest_event_added"].isoformat() if state["newest_event_added"] else None,
        # Slots of the day the run could see: published before it started.
        published_slots=sum(
            1
            for s in publisher.lines
            if s.date() == day and (p := publisher.published_at(s)) is not None and p <= (main.started or main.created)
        ),
        has_newest=landable is not None and state["newest_landed"] is not None and state["newest_landed"] >= landable,
    )
    return result


HEADER = (
    f"{'tick':>5} {'slot':>5} {'published':>9} {'created':>8} {'started':>8} {'events':>8} {'ended':>8} "
    f"{'pub>start':>9} {'pub>events':>10} {'launch':>6} {'overhead':>8} {'steps':>6} {'plain':>6} {'x plain':>7}  "
    "day's files"
)


def tick_line(r: dict) -> str:
    tick = datetime.fromisoformat(r["tick"])
    slot = datetime.fromisoformat(r["landable_slot"]) if r["landable_slot"] else None
    if "run_id" not in r:
        slot_text = "-" if slot is None else f"{slot:%H:%M}"
        return f"{tick:%H:%M} {slot_text:>5} no run of this tick's day ended by {tick + TICK_DEADLINE:%H:%M}"
    ratio = f"{r['run_s'] / r['plain_s']:.2f}" if r["run_s"] and r["plain_s"] else "-"
    files = (
        f"{r['landed_slots']}/{r['published_slots']} slots landed, newest {clock(r['newest_landed'])}, "
        f"newest event added {clock(r['newest_event_added'])}: "
        + ("has the newest published slot" if r["has_newest"] else "MISSES the newest published slot")
    )
    extra = [run for run in r["runs"] if run["run_id"] != r["run_id"]]
    also = "".join(
        f"; also {run['partition']} ({run['status']}, {seconds(run['ended'] and run['ended'] - run['created'])} s)"
        for run in extra
    )
    status = "" if r["status"] == "SUCCESS" else f" [{r['status']}]"
    return (
        f"{tick:%H:%M} {slot:%H:%M} {hms(r['slot_published']):>9} {hms(r['created']):>8} {hms(r['started']):>8} "
        f"{hms(r['events_at']):>8} {hms(r['ended']):>8} {seconds(r['published_to_started_s']):>9} "
        f"{seconds(r['published_to_events_s']):>10} {seconds(r['launch_s']):>6} {seconds(r['overhead_s']):>8} "
        f"{seconds(r['steps_s']):>6} {seconds(r['plain_s']):>6} {ratio:>7}  {files}{also}{status}"
    )


def summary(ticks: list[dict]) -> dict:
    measured = [t for t in ticks if t.get("status") == "SUCCESS"]
    out: dict = {"ticks": len(ticks), "successful": len(measured)}
    for key in (
        "published_to_started_s",
        "published_to_events_s",
        "launch_s",
        "overhead_s",
        "run_s",
        "steps_s",
        "plain_s",
    ):
        values = [t[key] for t in measured if t.get(key) is not None]
        if values:
            out[key] = {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values)}
    ratios = [t["run_s"] / t["plain_s"] for t in measured if t.get("run_s") and t.get("plain_s")]
    if ratios:
        out["run_over_plain"] = {"p50": percentile(ratios, 50), "p95": percentile(ratios, 95)}
    step_names = sorted({name for t in measured for name in t["steps"]})
    out["step_p50_s"] = {
        name: statistics.median(t["steps"][name] for t in measured if name in t["steps"]) for name in step_names
    }
    return out


def print_summary(s: dict) -> None:
    print(f"over {s['successful']} successful of {s['ticks']} measured ticks:")
    labels = {
        "published_to_started_s": "slot published -> run started",
        "published_to_events_s": "slot published -> events available",
        "launch_s": "launch (run created -> started)",
        "overhead_s": "Dagster overhead ((end - created) - steps)",
        "run_s": "Dagster run (created -> end)",
        "steps_s": "sum of step durations",
        "plain_s": "plain (same work, no Dagster)",
    }
    for key, label in labels.items():
        if key in s:
            v = s[key]
            print(f"  {label:44s} p50 {v['p50']:7.1f} s   p95 {v['p95']:7.1f} s   max {v['max']:7.1f} s")
    if "run_over_plain" in s:
        print(
            f"  {'Dagster run / plain':44s} p50 {s['run_over_plain']['p50']:7.2f} x   "
            f"p95 {s['run_over_plain']['p95']:7.2f} x"
        )
    print("  step durations, p50: " + ", ".join(f"{name} {v:.2f} s" for name, v in s["step_p50_s"].items()))
    if "published_to_events_s" in s:
        p95 = s["published_to_events_s"]["p95"]
        print(
            f"  goal p95 slot published -> events available <= {GOAL_P95_S:.0f} s: "
            f"{'met' if p95 <= GOAL_P95_S else 'NOT met'} ({p95:.1f} s)"
        )


def machine() -> str:
    load = os.getloadavg()
    return machine_summary({"dagster": dg.__version__, "polars": pl.__version__}) + (
        f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=8, help="ticks measured (default 8)")
    parser.add_argument("--out", type=Path, help="work directory and results (default: a new temp dir)")
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="bench-tick-latency-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so the daemon's session is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"machine: {machine()}", flush=True)

    begin = datetime.now(UTC)
    yesterday = begin.date() - timedelta(days=1)
    last_day = (begin + (args.ticks + 2) * timedelta(minutes=15)).date()
    staging, served = out / ".staging", out / "served"
    for stale in (staging, served, out / "dagster_home", out / "data", out / "plain"):
        shutil.rmtree(stale, ignore_errors=True)
    start = time.perf_counter()
    manifest = generate_mirror(staging, yesterday, last_day, seed=SEED, options=MirrorOptions(event_scale=EVENT_SCALE))
    print(
        f"mirror: {yesterday}..{last_day}, seed {SEED}, event scale {EVENT_SCALE} (GDELT's volume), "
        f"{manifest['totals']['listed_slots']} listed slots, generated in {time.perf_counter() - start:.1f} s; "
        f"a slot is published {PUBLISH_LAG.total_seconds() / 60:.0f} min after its timestamp",
        flush=True,
    )
    publisher = Publisher(staging, served)
    publisher.start()
    home, data, plain_data = out / "dagster_home", out / "data", out / "plain"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-local.yaml", home / "dagster.yaml")
    with MirrorServer(served) as server:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "MIRAI_DATA_DIR": str(data),
            "GDELT_BASE_URL": server.base_url,
            "MIRAI_START_DATE": yesterday.isoformat(),
        }
        env.pop("MIRAI_END_DATE", None)
        settings = Settings.from_env(env)
        # Yesterday and today's slots published so far are in before the schedule starts, as in a
        # running deployment: every tick, the first too, lands what was published since the last.
        for day, what in ((yesterday, "every slot published"), (begin.date(), "the slots published so far")):
            start = time.perf_counter()
            took = plain_day(day, settings)
            print(
                f"{day} ({what}) built without Dagster in {time.perf_counter() - start:.1f} s "
                f"({', '.join(f'{k} {v:.1f} s' for k, v in took.items())})",
                flush=True,
            )
        print("then copied for the plain side", flush=True)
        shutil.copytree(data, plain_data)
        plain = dataclasses.replace(settings, dataset=DatasetSettings(data_dir=plain_data))
        layout = DataLayout(data)

        with dg.DagsterInstance.from_config(str(home)) as instance:
            schedule_on = datetime.now(UTC)
            subprocess.run(
                [str(BIN / "dagster"), "schedule", "start", SCHEDULE, "-w", "workspace.yaml"],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                timeout=300,
            )
            with running_daemon(env, out / "daemon.log") as daemon:
                tick = next_tick(schedule_on)
                print(
                    f"schedule {SCHEDULE} on at {schedule_on:%H:%M:%S}, daemon pid {daemon.pid}; "
                    f"{args.ticks} measured ticks from {tick:%H:%M} UTC "
                    f"(until ~{tick + (args.ticks - 1) * timedelta(minutes=15):%H:%M}); "
                    f"work dir {out}",
                    flush=True,
                )
                results: dict = {
                    "machine": machine(),
                    "event_scale": EVENT_SCALE,
                    "publish_lag_s": PUBLISH_LAG.total_seconds(),
                    "ticks": [],
                }
                print("ticks (times UTC, durations in seconds; plain: the same work without Dagster):")
                print(HEADER, flush=True)
                for _ in range(args.ticks):
                    while datetime.now(UTC) < tick:
                        if daemon.poll() is not None:
                            raise SystemExit(f"the daemon exited ({daemon.returncode}); see {out / 'daemon.log'}")
                        time.sleep(POLL_S)
                    measured = measure_tick(tick, instance, publisher, layout, plain)
                    results["ticks"].append(measured)
                    results["summary"] = summary(results["ticks"])
                    print(tick_line(measured), flush=True)
                    (out / "tick_latency.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
                    tick += timedelta(minutes=15)
        publisher.stopping.set()
    if results["ticks"]:
        print_summary(results["summary"])
    print(f"per-tick numbers: {out / 'tick_latency.json'}", flush=True)


if __name__ == "__main__":
    main()
