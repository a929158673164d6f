"""Soak: 200 consecutive 15-minute ticks through the real schedule, with faults on 5% of requests.

For each tick the real ``gdelt_every_15_minutes`` schedule is evaluated at that time, the mirror's
index lists only the slots GDELT would have published by then (helpers.Publisher: MirrorServer has
no clock of its own), the pipeline's clock is frozen at the tick, and the runs the schedule asks
for are executed on a Dagster instance. Before each tick, every request the tick's runs may make
(the two index files and the zips of every published slot) gets a seeded 5% chance of one injected
fault. At the end every slot is landed or recorded missing, and the rows equal the generator's.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import polars as pl

from pipeline.gdelt.ledger import read_ledger
from pipeline.storage import DataLayout
from testbed.generate import MirrorOptions, generate_mirror
from testbed.serve import MirrorServer

from ..settings_builder import make_settings
from .helpers import Publisher, assert_no_duplicate_rows

START = date(2024, 1, 1)
FIRST_TICK = datetime(2024, 1, 1, 0, 5, tzinfo=UTC)
TICKS = 200
SLOTS = TICKS  # the tick at hh:mm+5 sees the slot at hh:mm: one new slot per tick
END = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=15 * SLOTS)  # the first slot not generated
FAULT_RATE = 0.05
# Every kind the mirror injects, with parameters that keep a tick short: a stall beyond the read
# timeout, a short Retry-After. Each rule hits one request, so the retry loop gets a clean one.
FAULTS = [
    ("404", {}),
    ("500", {}),
    ("503", {"retry_after": 0}),
    ("429", {"retry_after": 0}),
    ("reset", {}),
    ("reset_mid_body", {}),
    ("slow", {"delay_s": 0.01}),
    ("stall", {"delay_s": 1.5}),
    ("wrong_bytes", {}),
    ("truncate", {}),
    ("empty", {}),
]
# The console logger at DEBUG costs a third of a small run; failures are asserted, not read in logs.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
SETTLED = ("landed", "late", "missing")
DRAIN_TICKS = 8  # fault-free ticks after the soak, for what the last faulty ticks left pending


def ticks(first: datetime, n: int) -> list[datetime]:
    return [first + timedelta(minutes=15 * i) for i in range(n)]


def inject(mirror: MirrorServer, publisher: Publisher, tick: datetime, rng: random.Random) -> int:
    """Arm one-shot faults on ~5% of the requests the tick's runs may make."""
    from sensors.schedules import newest_slot

    # What a tick's run asks for: the index (its tail) and the newest slot's two zips.
    newest = [line.rsplit("/", 1)[1] for line in publisher.lines if publisher._slot(line) == newest_slot(tick)]
    targets = ["/masterfilelist.txt", "/lastupdate.txt"] + [f"/{name}" for name in newest]
    armed = 0
    for target in targets:
        if rng.random() < FAULT_RATE:
            kind, params = rng.choice(FAULTS)
            mirror.faults.add(target, kind, times=1, **params)
            armed += 1
    return armed


def test_200_ticks_of_the_schedule_with_faults_land_every_slot(tmp_path, monkeypatch):
    from assets.resources import resources_for
    from definitions import defs
    from sensors.schedules import gdelt_every_15_minutes, newest_slot

    manifest = generate_mirror(
        tmp_path / "mirror",
        START,
        START + timedelta(days=2),
        seed=3,
        slots=SLOTS,
        options=MirrorOptions(event_scale=0.05),
    )
    publisher = Publisher(tmp_path / "mirror")
    data = tmp_path / "data"
    rng = random.Random(2024)
    # An in-memory instance: SQLite event-log writes were a third of each small run's time.
    with MirrorServer(tmp_path / "mirror") as mirror, dg.DagsterInstance.ephemeral() as instance:
        # The deployment's definitions with the soak's resources: fast backoff, a 1 s read timeout,
        # and unlisted slots confirmed missing an hour after their time, so the feed outages of the
        # soak's two days settle inside it (production waits 24 h).
        resources = resources_for(
            make_settings(
                data_dir=str(data),
                gdelt_base_url=mirror.base_url,
                backoff_base_s=0.01,
                backoff_max_s=0.05,
                read_timeout_s=1.0,
                missing_grace_hours=1.0,
            )
        )
        soak_defs = dg.Definitions(
            assets=list(defs.assets),
            asset_checks=list(defs.asset_checks),
            jobs=list(defs.jobs),
            schedules=list(defs.schedules),
            resources=resources,
        )
        job = soak_defs.resolve_job_def("gdelt_ingest")
        runs, faults = 0, 0
        for n, tick in enumerate(ticks(FIRST_TICK, TICKS + DRAIN_TICKS)):
            publisher.publish_until(newest_slot(tick))
            mirror.faults.clear()
            if n < TICKS:
                faults += inject(mirror, publisher, tick, rng)
            monkeypatch.setattr("pipeline.gdelt.ingest.utc_now", lambda tick=tick: tick)
            with dg.build_schedule_context(
                instance=instance, scheduled_execution_time=tick, repository_def=soak_defs.get_repository_def()
            ) as context:
                requests = gdelt_every_15_minutes.evaluate_tick(context).run_requests
            for request in requests:
                result = job.execute_in_process(
                    instance=instance,
                    partition_key=request.partition_key,
                    tags=request.tags,
                    raise_on_error=False,
                    run_config=QUIET,
                )
                runs += 1
                assert result.success, f"tick {tick:%Y-%m-%d %H:%M} run of {request.partition_key} failed"
            if n >= TICKS and _all_settled(data):
                break
        assert faults >= 0.02 * TICKS, "too few faults were injected for a soak"
        # Faults really reached the client: the request log, not the rules we armed, says so.
        faulted = sum(1 for r in mirror.requests if r["fault"])
        assert faulted >= 0.02 * len(mirror.requests), (faulted, len(mirror.requests))

    layout = DataLayout(data)
    days = sorted({date.fromisoformat(d) for d in manifest["days"]})
    ledger = pl.concat([read_ledger(layout, d) for d in days])
    due = ledger.filter(pl.col("slot") < END)
    assert due.height == SLOTS * 2
    assert set(due["status"].unique()) <= set(SETTLED), due.group_by("status").len()
    # Landed exactly what the generator listed, missing exactly its gaps.
    listed = {(s["ts"], kind) for s in manifest["slots"] for kind in ("export", "mentions") if s[kind]["listed"]}
    landed = {
        (r["slot"].strftime("%Y%m%d%H%M%S"), r["kind"])
        for r in due.filter(pl.col("status") != "missing").iter_rows(named=True)
    }
    assert landed == listed
    for kind in ("export", "mentions"):
        rows = sum(
            pl.scan_parquet(layout.parsed_dir(kind, d) / "*.parquet").select(pl.len()).collect().item()
            for d in days
            if layout.parsed_dir(kind, d).exists()
        )
        assert rows == manifest["totals"][kind]["valid_rows"], kind
    # The events of each day were rebuilt from all of its slots: input rows = the day's export rows.
    from pipeline.storage import read_parquet_metadata

    for d in days:
        meta = read_parquet_metadata(layout.events_path(d))
        assert int(meta["input_rows"]) == manifest["days"][d.isoformat()]["export"]["valid_rows"]
    assert_no_duplicate_rows(data)


def _all_settled(data) -> bool:
    layout = DataLayout(data)
    ledger = pl.concat([read_ledger(layout, START + timedelta(days=i)) for i in range(3)])
    due = ledger.filter(pl.col("slot") < END)
    return due.height == SLOTS * 2 and set(due["status"].unique()) <= set(SETTLED)
