"""Landing a day from a real HTTP mirror on 127.0.0.1: the happy path, every fault the issue
lists (each recorded in the ledger, none crashing the day), and re-runs landing what cleared."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from pipeline.gdelt.ingest import ingest_day, parse_day
from pipeline.gdelt.ledger import read_ledger
from pipeline.storage import DataLayout

from .conftest import MIRROR_DAY, shared_fixture

SLOT = datetime(2024, 1, 1, 3, 15, tzinfo=UTC)
EXPORT = "20240101031500.export.CSV.zip"
MENTIONS = "20240101031500.mentions.CSV.zip"


def manifest(mirror_dir: Path) -> dict:
    return json.loads((mirror_dir / "manifest.json").read_text())


def index_lines(mirror_dir: Path) -> list[str]:
    return (mirror_dir / "gdeltv2" / "masterfilelist.txt").read_text().splitlines()


def write_index(mirror_dir: Path, lines: list[str]) -> None:
    (mirror_dir / "gdeltv2" / "masterfilelist.txt").write_text("\n".join(lines) + "\n")


def relist_with(mirror_dir: Path, name: str, data: bytes) -> None:
    """Serve ``data`` under ``name`` and make the index vouch for exactly these bytes, as if GDELT
    itself had published them (so only zip verification can catch them)."""
    (mirror_dir / "gdeltv2" / name).write_bytes(data)
    lines = [
        f"{len(data)} {hashlib.md5(data).hexdigest()} http://data.gdeltproject.org/gdeltv2/{name}"
        if line.endswith("/" + name)
        else line
        for line in index_lines(mirror_dir)
    ]
    write_index(mirror_dir, lines)


def row(ledger: pl.DataFrame, slot: datetime, kind: str) -> dict:
    return ledger.filter(pl.col("slot") == slot, pl.col("kind") == kind).row(0, named=True)


def listed_slots(mirror_dir: Path) -> dict[tuple[str, str], dict]:
    """(ts, kind) -> manifest entry, for every file the generator listed in the index."""
    out = {}
    for slot in manifest(mirror_dir)["slots"]:
        for kind in ("export", "mentions"):
            entry = slot[kind]
            if entry["listed"]:
                out[(slot["ts"], kind)] = entry
    return out


def test_happy_path_lands_every_listed_slot(settings, mirror, mirror_dir):
    result = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    listed = listed_slots(mirror_dir)
    ledger = result.ledger
    assert ledger.height == 96 * 2
    landed = ledger.filter(pl.col("status") == "landed")
    assert landed.height == len(listed)
    # Slots the generator left out of the index are GDELT gaps: missing, never an error.
    assert set(ledger["status"].unique()) <= {"landed", "missing"}
    assert ledger.filter(pl.col("status") == "missing").height == 192 - len(listed)
    layout = DataLayout(settings.dataset.data_dir)
    for r in landed.iter_rows(named=True):
        data = (layout.root / r["path"]).read_bytes()
        assert hashlib.md5(data).hexdigest() == r["expected_md5"]
    for kind in ("export", "mentions"):
        parsed = parse_day(MIRROR_DAY, kind, settings.dataset, settings.gdelt)
        expected = sum(e["valid_rows"] for (ts, k), e in listed.items() if k == kind)
        assert parsed.rows == expected
        on_disk = pl.scan_parquet(layout.parsed_dir(kind, MIRROR_DAY) / "*.parquet").select(pl.len()).collect().item()
        assert on_disk == expected
        malformed = sum(e["malformed_rows"] for (ts, k), e in listed.items() if k == kind)
        assert parsed.rejects == malformed
    assert not list(settings.dataset.data_dir.rglob("*.part")), "temp files left behind"


def test_rerun_is_a_noop(settings, mirror):
    ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    first = {k: parse_day(MIRROR_DAY, k, settings.dataset, settings.gdelt) for k in ("export", "mentions")}
    layout = DataLayout(settings.dataset.data_dir)
    before = {p: p.stat().st_mtime_ns for p in (layout.root / "parsed").rglob("*.parquet")}
    again = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    assert again.downloaded == 0
    for kind in ("export", "mentions"):
        second = parse_day(MIRROR_DAY, kind, settings.dataset, settings.gdelt)
        assert second.parsed == 0 and second.rows == first[kind].rows
    assert {p: p.stat().st_mtime_ns for p in (layout.root / "parsed").rglob("*.parquet")} == before


def test_pending_inside_grace_then_missing(settings, mirror_dir, mirror):
    lines = index_lines(mirror_dir)
    write_index(mirror_dir, [line for line in lines if EXPORT not in line])
    early = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt, now=SLOT + timedelta(hours=1))
    assert row(early.ledger, SLOT, "export")["status"] == "pending"
    # Slots after "now" are not due yet, and nothing was fetched for them.
    assert row(early.ledger, SLOT + timedelta(hours=2), "export")["status"] == "not_due"
    later = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt, now=SLOT + timedelta(hours=30))
    assert row(later.ledger, SLOT, "export")["status"] == "missing"


def test_slot_listed_late_lands_as_late(settings, mirror_dir, mirror):
    lines = index_lines(mirror_dir)
    write_index(mirror_dir, [line for line in lines if EXPORT not in line])
    first = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    assert row(first.ledger, SLOT, "export")["status"] == "missing"
    assert row(first.ledger, SLOT, "export")["listed"] is False
    write_index(mirror_dir, lines)  # GDELT catches up
    second = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    r = row(second.ledger, SLOT, "export")
    assert r["status"] == "late" and r["listed"] is True
    assert second.downloaded == 1
    # Slots that landed on the first try stay "landed", not "late".
    assert row(second.ledger, SLOT, "mentions")["status"] == "landed"


@pytest.mark.parametrize(
    ("fault", "params", "status", "error_part"),
    [
        ("404", {}, "missing", "404"),
        ("500", {}, "failed", "500"),
        ("stall", {"delay_s": 3.0}, "failed", "Timeout"),
        ("wrong_bytes", {}, "corrupt", "md5"),
        ("truncate", {}, "corrupt", "size"),
        ("empty", {}, "corrupt", "size"),
        ("reset", {}, "failed", "Connection"),
    ],
)
def test_fault_is_recorded_then_cleared(settings, mirror, fault, params, status, error_part):
    mirror.faults.add(match=EXPORT, fault=fault, **params)
    first = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    r = row(first.ledger, SLOT, "export")
    assert r["status"] == status, r
    assert error_part.lower() in (r["last_error"] or "").lower(), r
    if fault != "404":
        assert r["attempts"] == settings.gdelt.download_attempts  # retried with backoff, then gave up
    # The fault touched one file: the rest of the day landed.
    assert first.counts["landed"] == first.ledger.filter(pl.col("listed")).height - 1
    layout = DataLayout(settings.dataset.data_dir)
    assert not layout.raw_path(SLOT, "export").exists()
    if status == "corrupt":
        assert r["quarantined"] == settings.gdelt.download_attempts
        bad = sorted(layout.quarantine_dir(MIRROR_DAY).glob(f"{EXPORT}.*.bad"))
        assert len(bad) == settings.gdelt.download_attempts
        assert json.loads(Path(f"{bad[0]}.json").read_text())["url"].endswith(EXPORT)
    mirror.faults.clear()
    second = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    r2 = row(second.ledger, SLOT, "export")
    assert r2["status"] == "late", r2  # unavailable earlier, landed long after its slot
    assert r2["attempts"] == r["attempts"] + 1
    assert second.downloaded == 1


def test_transient_500_then_success_lands_in_one_run(settings, mirror):
    mirror.faults.add(match=EXPORT, fault="500", times=1)
    mirror.faults.add(match=MENTIONS, fault="429", times=1, retry_after=0)
    result = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    for kind in ("export", "mentions"):
        r = row(result.ledger, SLOT, kind)
        assert r["status"] == "landed" and r["attempts"] == 2
        assert "landed after" in r["last_error"]


def test_zip_that_gdelt_itself_lists_but_is_corrupt(settings, mirror_dir, mirror):
    good = (mirror_dir / "gdeltv2" / EXPORT).read_bytes()
    relist_with(mirror_dir, EXPORT, good[: len(good) // 2])  # a truncated zip, md5 "matching"
    result = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    r = row(result.ledger, SLOT, "export")
    # GDELT's index vouches for these very bytes: refetching cannot help, in this run or the next.
    assert r["status"] == "quarantined" and r["last_error"].startswith("zip:")
    # Retrying identical bytes in the same run cannot help: one attempt, one quarantined copy.
    assert r["attempts"] == 1 and r["quarantined"] == 1
    parsed = parse_day(MIRROR_DAY, "export", settings.dataset, settings.gdelt)
    landed_exports = result.ledger.filter(pl.col("kind") == "export", pl.col("status") == "landed").height
    assert parsed.files == landed_exports  # the corrupt slot is never parsed
    assert not DataLayout(settings.dataset.data_dir).parsed_path("export", SLOT).exists()


def test_real_not_a_zip_is_quarantined(settings, mirror_dir, mirror):
    fake = shared_fixture("gdelt/epournaras-DIAS-GDELT/b61e972/20180326191500.export.CSV.zip").read_bytes()
    relist_with(mirror_dir, EXPORT, fake)
    result = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    r = row(result.ledger, SLOT, "export")
    assert r["status"] == "quarantined" and "zip" in r["last_error"]
    bad = list(DataLayout(settings.dataset.data_dir).quarantine_dir(MIRROR_DAY).glob(f"{EXPORT}.*.bad"))
    assert [p.read_bytes() for p in bad] == [fake]


def test_two_runs_of_the_same_day_at_once(settings, mirror):
    results, errors = [], []

    def run():
        try:
            results.append(ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # The per-day lock serialised them: the second found everything landed.
    assert sorted(r.downloaded for r in results)[0] == 0
    final = read_ledger(DataLayout(settings.dataset.data_dir), MIRROR_DAY)
    assert final.filter(pl.col("listed")).select(pl.col("status").eq("landed").all()).item()
    assert final.select(pl.struct("slot", "kind").is_unique().all()).item()
    requested = [r for r in mirror.requests if r["path"].endswith(".zip")]
    assert len(requested) == final.filter(pl.col("listed")).height  # each file fetched once


def test_file_on_disk_without_ledger_row_is_not_fetched_again(settings, mirror):
    ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    layout = DataLayout(settings.dataset.data_dir)
    layout.slot_ledger_path(MIRROR_DAY).unlink()  # as if killed between rename and ledger write
    again = ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt)
    assert again.downloaded == 0
    assert again.counts["landed"] == again.ledger.filter(pl.col("listed")).height
