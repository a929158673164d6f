"""Replaying GDELT slots changes nothing; a corrupted parquet file is rebuilt, never silently read.

Two days of a small generated mirror are ingested, parsed and normalised once (the module's clean
store); each test works on a copy of it.
"""

from __future__ import annotations

import json
import shutil
from datetime import date, datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.events import build_daily_quads, build_events
from pipeline.gdelt.ingest import ingest_day, parse_day
from pipeline.mirror.generate import MirrorOptions, generate_mirror
from pipeline.mirror.serve import MirrorServer
from pipeline.storage import DataLayout

from .helpers import assert_no_duplicate_rows, file_digests

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)
NOW = datetime(2024, 1, 3, tzinfo=timezone.utc)
DAYS = (D1, D2)


def run_days(settings: Settings, now: datetime = NOW) -> None:
    """What the schedule runs for a day (the gdelt_ingest job's steps), for each day in order."""
    for day in DAYS:
        ingest_day(day, settings, now=now)
        for kind in ("export", "mentions"):
            parse_day(day, kind, settings)
    for day in DAYS:
        build_events(day, settings)
        build_daily_quads(day, settings)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay")
    manifest = generate_mirror(base / "mirror", D1, D2, seed=5, slots=120, options=MirrorOptions(event_scale=0.1))
    with MirrorServer(base / "mirror") as mirror:
        settings = Settings(data_dir=base / "clean", gdelt_base_url=mirror.base_url, backoff_base_s=0.01,
                            backoff_max_s=0.05, read_timeout_s=2.0)
        run_days(settings)
        yield base / "clean", settings, manifest


@pytest.fixture
def copy(store, tmp_path) -> tuple[Path, Settings]:
    clean, settings, _ = store
    data = tmp_path / "data"
    shutil.copytree(clean, data)
    return data, settings.with_(data_dir=data)


def test_the_store_holds_exactly_what_the_generator_published(store):
    clean, _, manifest = store
    layout = DataLayout(clean)
    for kind in ("export", "mentions"):
        rows = sum(pl.scan_parquet(layout.parsed_dir(kind, d) / "*.parquet").select(pl.len()).collect().item() for d in DAYS)
        assert rows == manifest["totals"][kind]["valid_rows"]
    assert_no_duplicate_rows(clean)


def test_replaying_the_same_slots_twice_changes_no_byte(copy, store):
    data, settings = copy
    run_days(settings)
    # Same `now` as the first run, so even the ledgers' times agree: every file byte for byte.
    assert file_digests(data) == file_digests(store[0])
    assert_no_duplicate_rows(data)


def test_replaying_later_changes_only_unsettled_ledger_rows(copy, store):
    """Days later, a replay may settle what was pending (unlisted slots become missing after the
    grace period), but data files keep their bytes and settled ledger rows keep their values."""
    data, settings = copy
    run_days(settings, now=datetime(2024, 1, 5, tzinfo=timezone.utc))
    clean = store[0]
    before, after = file_digests(clean), file_digests(data)
    assert sorted(before) == sorted(after)
    assert [rel for rel in before if before[rel] != after[rel] and not rel.startswith("ledger/slots/")] == []
    for day in DAYS:
        path = DataLayout(clean).slot_ledger_path(day).relative_to(clean)
        settled = pl.read_parquet(clean / path).filter(pl.col("status").is_in(["landed", "late", "missing"]))
        now = pl.read_parquet(data / path).join(settled.select("slot", "kind"), on=["slot", "kind"], how="semi")
        assert now.drop("updated_at").equals(settled.drop("updated_at"))
    assert_no_duplicate_rows(data)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_bytes(path: Path) -> None:
    """Damage data pages and keep the footer (and so the metadata) intact: bit rot, a bad copy."""
    data = bytearray(path.read_bytes())
    for pos in range(64, min(len(data) - 64, 512), 7):
        data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("table", ["events", "daily_quads"])
def test_a_truncated_derived_file_fails_loudly_and_the_next_run_rebuilds_it(copy, store, table):
    data, settings = copy
    layout = DataLayout(data)
    path = layout.events_path(D2) if table == "events" else layout.daily_quads_path(D2)
    _truncate(path)
    # Not silently read: the next consumer (daily_quads, the GX checks via pl.read_parquet) raises.
    with pytest.raises(Exception, match="(?i)parquet|PAR1|footer"):
        pl.read_parquet(path)
    if table == "events":
        with pytest.raises(Exception, match="(?i)parquet|PAR1|footer"):
            build_daily_quads(D2, settings)
    # The schedule's next run of the day rewrites both files from the parsed slots.
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


@pytest.mark.parametrize("damage", [
    _truncate,
    pytest.param(_flip_bytes, marks=pytest.mark.xfail(strict=True, reason=(
        "KNOWN GAP: a parsed slot with damaged data pages keeps its footer, so parse_day's metadata check "
        "calls it built and build_events fails on it (zstd: data corruption) on every run until the file "
        "is deleted; detecting it would mean decoding every parsed file on every 15-minute run"))),
], ids=["truncated", "damaged_pages"])
def test_a_corrupted_parsed_slot_is_parsed_again(copy, store, damage):
    data, settings = copy
    damage(sorted(DataLayout(data).parsed_dir("export", D2).glob("*.parquet"))[3])
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


def test_a_corrupted_parsed_slot_is_never_silently_read(copy):
    """Whatever parse_day does with it, damaged rows must not reach the events."""
    data, settings = copy
    _flip_bytes(sorted(DataLayout(data).parsed_dir("export", D2).glob("*.parquet"))[3])
    before = DataLayout(data).events_path(D2).read_bytes()
    with pytest.raises(Exception, match="(?i)corrupt|parquet|zstd"):
        build_events(D2, settings)
    assert DataLayout(data).events_path(D2).read_bytes() == before


def test_a_truncated_history_key_file_is_rebuilt(copy, store):
    data, settings = copy
    _truncate(DataLayout(data).event_keys_path(D1))
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


def test_manifest_counts_survive_the_replays(copy, store):
    """The events file's own bookkeeping adds up after a replay: kept + excluded = input rows."""
    data, settings = copy
    run_days(settings)
    from pipeline.storage import read_parquet_metadata

    for day in DAYS:
        meta = read_parquet_metadata(DataLayout(data).events_path(day))
        kept = pl.read_parquet(DataLayout(data).events_path(day)).height
        assert kept + sum(json.loads(meta["exclusions"]).values()) == int(meta["input_rows"])
