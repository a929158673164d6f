"""Replaying GDELT slots changes nothing; a corrupted parquet file is rebuilt, never silently read.

Two days of a small generated mirror are ingested, parsed and normalised once (the module's clean
store); each test works on a copy of it.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.events.daily import build_daily_quads, build_events
from pipeline.gdelt.ingest import ingest_day, parse_day
from pipeline.gdelt.integrity import read_digests, write_digests
from pipeline.storage import DamagedFile, DataLayout, atomic_write_many
from testbed.generate import MirrorOptions, generate_mirror
from testbed.serve import MirrorServer

from ..settings_builder import make_settings
from .helpers import assert_no_duplicate_rows, file_digests

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)
NOW = datetime(2024, 1, 3, tzinfo=UTC)
DAYS = (D1, D2)


def run_days(settings: Settings, now: datetime = NOW) -> None:
    """What the schedule runs for a day (the gdelt_ingest job's steps), for each day in order."""
    for day in DAYS:
        ingest_day(day, settings.dataset, settings.network, settings.gdelt, now=now)
        for kind in ("export", "mentions"):
            parse_day(day, kind, settings.dataset, settings.gdelt)
    for day in DAYS:
        build_events(day, settings.dataset)
        build_daily_quads(day, settings.dataset)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay")
    manifest = generate_mirror(base / "mirror", D1, D2, seed=5, slots=120, options=MirrorOptions(event_scale=0.1))
    with MirrorServer(base / "mirror") as mirror:
        settings = make_settings(
            data_dir=base / "clean",
            gdelt_base_url=mirror.base_url,
            backoff_base_s=0.01,
            backoff_max_s=0.05,
            read_timeout_s=2.0,
        )
        run_days(settings)
        yield base / "clean", settings, manifest


@pytest.fixture
def copy(store, tmp_path) -> tuple[Path, Settings]:
    clean, settings, _ = store
    data = tmp_path / "data"
    shutil.copytree(clean, data)
    return data, make_settings(settings, data_dir=data)


def test_the_store_holds_exactly_what_the_generator_published(store):
    clean, _, manifest = store
    layout = DataLayout(clean)
    for kind in ("export", "mentions"):
        rows = sum(
            pl.scan_parquet(layout.parsed_dir(kind, d) / "*.parquet").select(pl.len()).collect().item() for d in DAYS
        )
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
    run_days(settings, now=datetime(2024, 1, 5, tzinfo=UTC))
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


def _flip_a_bit_that_still_decodes(path: Path) -> None:
    """Damage a reader cannot see: one flipped bit after which the file still reads without error
    but gives other values (the zstd frames carry no checksum, the pages no CRC). The first such
    bit from the start of the file, so it does not depend on the file's layout."""
    data = path.read_bytes()
    clean = pl.read_parquet(io.BytesIO(data))
    for pos in range(4, len(data) - 8):
        damaged = bytearray(data)
        damaged[pos] ^= 0x01
        try:
            differs = not pl.read_parquet(io.BytesIO(bytes(damaged))).equals(clean)
        except (Exception, pl.exceptions.PanicException):
            continue
        if differs:
            path.write_bytes(bytes(damaged))
            return
    raise AssertionError(f"no single flipped bit of {path.name} still decodes")


def digests_outside_parsed_quarantine(root: Path) -> dict[str, str]:
    """file_digests without quarantine/parsed/: where a run puts the damaged parsed files it finds
    (quarantine/gdeltv2/ of the download stays compared)."""
    return {rel: d for rel, d in file_digests(root).items() if not rel.startswith("quarantine/parsed/")}


def quarantined_pairs(root: Path) -> dict[str, dict]:
    """quarantine/parsed/ as {bad file: its note}; every .bad has its .bad.json and nothing else is there."""
    directory = root / "quarantine" / "parsed"
    files = sorted(p for p in directory.rglob("*") if p.is_file()) if directory.exists() else []
    bad = [p for p in files if p.name.endswith(".bad")]
    assert sorted(files) == sorted([*bad, *(p.with_name(p.name + ".json") for p in bad)]), files
    return {str(p.relative_to(root)): json.loads(p.with_name(p.name + ".json").read_text()) for p in bad}


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit_that_still_decodes], ids=["truncated", "damaged_values"])
@pytest.mark.parametrize("table", ["events", "daily_quads"])
def test_a_damaged_derived_file_is_refused_by_its_reader_and_the_next_run_rebuilds_it(copy, store, table, damage):
    from pipeline.articles.day import select_urls

    data, settings = copy
    layout = DataLayout(data)
    path = layout.events_path(D2) if table == "events" else layout.daily_quads_path(D2)
    damage(path)
    # Not silently read, even when the damage still decodes: the file's sha256 was recorded when
    # it was written, and the next consumer (the quads build, the article selection) checks it.
    with pytest.raises(DamagedFile, match=re.escape(str(path.relative_to(data)))):
        if table == "events":
            build_daily_quads(D2, settings.dataset)
        else:
            select_urls(D2, settings.dataset, settings.articles)
    # The schedule's next run of the day rewrites both files from the parsed slots.
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


@pytest.mark.parametrize(
    "damage",
    [_truncate, _flip_bytes, _flip_a_bit_that_still_decodes],
    ids=["truncated", "damaged_pages", "damaged_values"],
)
def test_a_corrupted_parsed_slot_is_parsed_again(copy, store, damage):
    data, settings = copy
    path = sorted(DataLayout(data).parsed_dir("export", D2).glob("*.parquet"))[3]
    clean_sha = file_digests(store[0])[str(path.relative_to(data))]
    damage(path)
    run_days(settings)
    # Byte for byte the clean run, the damaged bytes aside in quarantine with a note saying why.
    assert digests_outside_parsed_quarantine(data) == file_digests(store[0])
    [(bad, note)] = quarantined_pairs(data).items()
    assert bad.startswith(f"quarantine/parsed/export/date={D2}/{path.name}.") and bad.endswith(".bad")
    assert note["path"] == str(path.relative_to(data)) and note["expected_sha256"] == clean_sha
    assert note["found_sha256"] != clean_sha
    # Idempotent: a second run finds nothing more to quarantine and changes no byte.
    run_days(settings)
    assert digests_outside_parsed_quarantine(data) == file_digests(store[0])
    assert list(quarantined_pairs(data)) == [bad]


@pytest.mark.parametrize("damage", [_flip_bytes, _flip_a_bit_that_still_decodes], ids=["undecodable", "still_decodes"])
def test_a_corrupted_parsed_slot_is_never_silently_read(copy, store, damage):
    """Damaged rows must not reach the events. build_events itself trusts the parsed files; what
    protects it is that the day's parse step (which runs before it in every run) checks each file
    against its recorded digest and replaces a damaged one."""
    data, settings = copy
    layout = DataLayout(data)
    path = sorted(layout.parsed_dir("export", D2).glob("*.parquet"))[3]
    clean_rows = pl.read_parquet(path)
    damage(path)
    before = layout.events_path(D2).read_bytes()
    if damage is _flip_bytes:
        # Without the parse step the damage is at least loud: decoding fails, the events stay as they were.
        with pytest.raises(Exception, match=r"(?i)corrupt|parquet|zstd"):
            build_events(D2, settings.dataset)
        assert layout.events_path(D2).read_bytes() == before
    else:
        # This damage is silent to a reader: without the parse step it would reach the events.
        assert not pl.read_parquet(path).equals(clean_rows)
    parse_day(D2, "export", settings.dataset, settings.gdelt)
    assert pl.read_parquet(path).equals(clean_rows)
    build_events(D2, settings.dataset)
    assert layout.events_path(D2).read_bytes() == (store[0] / layout.events_path(D2).relative_to(data)).read_bytes()


def test_a_day_parsed_before_digests_were_recorded_gets_its_table_without_being_parsed_again(copy, store):
    data, settings = copy
    shutil.rmtree(data / "parsed" / "digests")
    slot_files = {
        p: p.stat().st_mtime_ns
        for kind in ("export", "mentions")
        for d in DAYS
        for p in DataLayout(data).parsed_dir(kind, d).glob("*.parquet")
    }
    for day in DAYS:
        for kind in ("export", "mentions"):
            assert parse_day(day, kind, settings.dataset, settings.gdelt).parsed == 0
    assert {p: p.stat().st_mtime_ns for p in slot_files} == slot_files
    assert file_digests(data) == file_digests(store[0])


def test_a_slot_whose_file_is_missing_after_its_digest_was_recorded_is_parsed_again(copy, store):
    """What a crash between the digest table and a slot file leaves (the table is written first):
    the slot is simply parsed again, nothing is quarantined."""
    data, settings = copy
    sorted(DataLayout(data).parsed_dir("mentions", D1).glob("*.parquet"))[5].unlink()
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


def test_a_run_that_dies_between_the_digest_table_and_its_slot_files_leaves_nothing_to_quarantine(
    copy, store, monkeypatch
):
    """The table is written before the slot files, so a run that dies part way leaves slots that
    are missing (parsed again by the next run), never a built file the table does not list."""
    from pipeline.gdelt import ingest

    class Died(BaseException):
        pass

    data, settings = copy
    layout = DataLayout(data)
    recorded = read_digests(layout, "export", D2)
    added = sorted(recorded)[-3:]  # slots a later run of the day adds to an existing table
    write_digests(layout, "export", D2, {slot: d for slot, d in recorded.items() if slot not in added})
    for slot in added:
        layout.parsed_path("export", slot).unlink()
    written = []

    def dies_at_the_second_slot_file(files: list[tuple[Path, bytes]]) -> None:
        """The batch of slot files lands its first file whole, then the run dies."""
        if not any(target.parent == layout.parsed_dir("export", D2) for target, _ in files):
            return atomic_write_many(files)
        written.append(files[0][0])
        atomic_write_many(files[:1])
        raise Died

    monkeypatch.setattr(ingest, "atomic_write_many", dies_at_the_second_slot_file)
    with pytest.raises(Died):
        parse_day(D2, "export", settings.dataset, settings.gdelt)
    monkeypatch.undo()
    assert written == [layout.parsed_path("export", added[0])]
    run_days(settings)
    assert file_digests(data) == file_digests(store[0])


def test_a_built_slot_the_digest_table_does_not_list_is_quarantined_and_parsed_again(copy, store):
    """The table is written before its files, so a built file it does not list did not come from
    parse_day (a restore, a copy): not trusted."""
    data, settings = copy
    layout = DataLayout(data)
    recorded = read_digests(layout, "export", D1)
    unlisted = sorted(recorded)[7]
    write_digests(layout, "export", D1, {slot: d for slot, d in recorded.items() if slot != unlisted})
    run_days(settings)
    assert digests_outside_parsed_quarantine(data) == file_digests(store[0])
    [note] = quarantined_pairs(data).values()
    assert note["reason"] == "not in the digest table"
    assert note["path"] == str(layout.parsed_path("export", unlisted).relative_to(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit_that_still_decodes], ids=["truncated", "damaged_values"])
def test_a_damaged_digest_table_is_quarantined_and_its_day_parsed_again(copy, store, damage):
    data, settings = copy
    damage(DataLayout(data).parsed_digests_path("export", D2))
    run_days(settings)
    assert digests_outside_parsed_quarantine(data) == file_digests(store[0])
    # Only the table is quarantined: its slot files were replaced, not accused.
    [bad] = quarantined_pairs(data)
    assert bad.startswith(f"quarantine/parsed/export/date={D2}/digests.parquet.")


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
