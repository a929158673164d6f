"""The live history (pipeline/live/history.py, docs/live.md, "The history a participant may use"):
each closed day's event database published once to the release store, `mirai download --live`
syncing it (verified against the day manifests, themselves against the index; a hostile store
refused in one line with nothing written), EventDatabase answering date-gated queries over what
it downloaded, and the `live_history` asset, its job and its schedule through Dagster."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from assets.live_history import live_history
from assets.resources import resources_for
from pipeline.agent_api.event_database import DatabaseFileError, EventDatabase
from pipeline.agent_api.types import DateGateError
from pipeline.cli import main
from pipeline.live.history import HistoryRefused, publish_history_day
from pipeline.release.layout import UnsafeRelease
from pipeline.release.publish import ReleaseConflict
from pipeline.release.store import LocalStore
from pipeline.splits.database import build_database_month, month_days
from sensors.live import live_history_daily, live_history_job

from .month_builder import Quad, write_days
from .test_live_rounds import DAY, WINDOW, later_quads, live_settings, window_quads

FIRST, SECOND = WINDOW[-2], WINDOW[-1]  # 2024-03-08, 2024-03-09
MARCH = date(2024, 3, 1)
CLOCK = datetime(2024, 3, 10, 2, 30, tzinfo=UTC)


@pytest.fixture
def settings(tmp_path):
    settings = live_settings(tmp_path / "data")
    write_days(settings, month_days(MARCH), window_quads() + later_quads())
    return settings


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "bucket")


def publish(settings, store, day, now=CLOCK):
    return publish_history_day(day, settings.dataset, settings.articles, settings.gdelt, store, now=now)


def store_files(store: LocalStore) -> dict[str, bytes]:
    return {str(p.relative_to(store.root)): p.read_bytes() for p in sorted(store.root.rglob("*")) if p.is_file()}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(tmp_path, capsys, *extra: str, source=None) -> tuple[int, str, str]:
    code = main(["download", "--live", "--from", str(source or tmp_path / "bucket"), *extra])
    out, err = capsys.readouterr()
    return code, out, err


# --- publishing -------------------------------------------------------------------------------


def test_two_days_give_their_parts_manifests_and_index(settings, store):
    for day in (FIRST, SECOND):
        result = publish(settings, store, day)
        assert result.published_now and result.index_written
    month = build_database_month(MARCH, settings.dataset)
    history = store.root / "live" / "history"
    index = json.loads((history / "index.json").read_bytes())
    assert index["format"] == "mirai-live-history-index-v1" and index["through"] == SECOND.isoformat()
    assert [e["day"] for e in index["days"]] == [FIRST.isoformat(), SECOND.isoformat()]
    for entry, day in zip(index["days"], (FIRST, SECOND), strict=True):
        raw = (history / day.isoformat() / "manifest.json").read_bytes()
        assert entry["manifest_sha256"] == sha(raw) and entry["manifest"] == f"live/history/{day}/manifest.json"
        manifest = json.loads(raw)
        assert manifest["format"] == "mirai-live-history-v1" and manifest["day"] == day.isoformat()
        for table, frame in (("events", month.events), ("news", month.news)):
            data = (history / day.isoformat() / f"{table}.parquet").read_bytes()
            meta = manifest["files"][f"{table}.parquet"]
            assert (meta["sha256"], meta["bytes"]) == (sha(data), len(data))
            part = pl.read_parquet(data)
            # The monthly database's table, restricted to the day: same columns, types and rows.
            expected = frame.filter(pl.col("date") == day)
            assert part.schema == frame.schema and part.equals(expected) and meta["rows"] == expected.height > 0


def test_a_re_run_changes_nothing_and_a_changed_day_is_refused(settings, store):
    publish(settings, store, SECOND)
    before = store_files(store)
    again = publish(settings, store, SECOND, now=CLOCK + timedelta(days=3))
    assert not again.published_now and not again.index_written and store_files(store) == before
    # D − 1's files change after publication (a late quad): the published day stays as it was.
    write_days(
        settings, [SECOND], [*(q for q in window_quads() if q.day == SECOND), Quad(SECOND, "USA", "042", "MEX", 80)]
    )
    with pytest.raises(ReleaseConflict, match="holds other tables"):
        publish(settings, store, SECOND)
    assert store_files(store) == before


def test_a_day_is_published_only_once_over_with_its_files(settings, store, tmp_path):
    with pytest.raises(HistoryRefused, match="not over until 2024-03-10T00:00:00"):
        publish(settings, store, SECOND, now=datetime(2024, 3, 9, 23, 59, tzinfo=UTC))
    (tmp_path / "data" / "articles" / f"date={SECOND}.parquet").unlink()
    with pytest.raises(HistoryRefused, match=f"waits for articles {SECOND}"):
        publish(settings, store, SECOND)
    assert store_files(store) == {}


def test_the_store_refuses_other_keys_under_live_history(store):
    for key in ("live/history/2024-03-09/queries.parquet", "live/history/../index.json", "live/history/2024-02-30/x"):
        with pytest.raises(UnsafeRelease, match="refused"):
            store.put_bytes(key, b"x", cache_control="no-cache", if_absent=True)


# --- mirai download --live --------------------------------------------------------------------


def test_download_live_syncs_once_then_one_new_day(settings, store, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for day in (FIRST, SECOND):
        publish(settings, store, day)
    code, out, _ = download(tmp_path, capsys, "--through", FIRST.isoformat())
    assert code == 0 and "1 days downloaded" in out and "published yet" not in out
    code, out, _ = download(tmp_path, capsys)  # default --out mirai-live
    assert code == 0 and "1 days downloaded" in out and "1 already there" in out
    database = tmp_path / "mirai-live" / "database"
    synced = sorted(str(p.relative_to(database)) for p in database.rglob("*") if p.is_file())
    assert synced == [
        f"{table}/day={day}.{ext}"
        for table, ext in (("events", "parquet"), ("manifests", "json"), ("news", "parquet"))
        for day in (FIRST, SECOND)
    ]
    for day in (FIRST, SECOND):
        for table in ("events", "news"):
            assert (database / table / f"day={day}.parquet").read_bytes() == (
                store.root / "live" / "history" / day.isoformat() / f"{table}.parquet"
            ).read_bytes()
    code, out, _ = download(tmp_path, capsys)
    assert code == 0 and "0 days downloaded (0 bytes, each file sha256-verified), 2 already there" in out
    # A --through past the newest published day says so, instead of seeming to hold it.
    later = (SECOND + timedelta(days=5)).isoformat()
    code, out, _ = download(tmp_path, capsys, "--through", later)
    assert code == 0 and f"no day after {SECOND} is published yet: --through {later} asked for more" in out
    publish(settings, store, DAY, now=CLOCK + timedelta(days=1))
    assert main(["download", "2024-03", "--live"]) == 1  # a release and the history are two downloads
    assert "--live downloads the live history" in capsys.readouterr().err
    code, out, _ = download(tmp_path, capsys)
    assert code == 0 and f"live history {FIRST}..{DAY}" in out and "1 days downloaded" in out
    assert (database / "events" / f"day={DAY}.parquet").is_file()


def _tampered(tmp_path, store, change) -> LocalStore:
    """A copy of the store with ``change(root)`` applied: what a hostile store serves."""
    copy = tmp_path / "hostile"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store.root, copy)
    change(copy)
    return LocalStore(copy)


def _reindex(root, day: date, manifest: dict) -> None:
    """Rewrite day's manifest and give the index its new sha256 (a store lying consistently)."""
    raw = json.dumps(manifest).encode()
    (root / "live" / "history" / day.isoformat() / "manifest.json").write_bytes(raw)
    index_path = root / "live" / "history" / "index.json"
    index = json.loads(index_path.read_bytes())
    for entry in index["days"]:
        if entry["day"] == day.isoformat():
            entry["manifest_sha256"] = sha(raw)
    index_path.write_bytes(json.dumps(index).encode())


def _manifest(root, day: date) -> dict:
    return json.loads((root / "live" / "history" / day.isoformat() / "manifest.json").read_bytes())


def _edit_manifest(edit):
    def change(root):
        manifest = _manifest(root, SECOND)
        edit(manifest)
        _reindex(root, SECOND, manifest)

    return change


def _grow_events(manifest):
    manifest["files"]["events.parquet"]["bytes"] += 1


def _traversal(manifest):
    manifest["files"]["../../escaped.parquet"] = manifest["files"].pop("news.parquet")


def _huge(manifest):
    manifest["files"]["news.parquet"]["bytes"] = 2**50


def _wrong_sha(manifest):
    manifest["files"]["news.parquet"]["sha256"] = "0" * 64


def _index_traversal(root):
    path = root / "live" / "history" / "index.json"
    index = json.loads(path.read_bytes())
    index["days"][0]["day"] = "../../../etc"
    path.write_bytes(json.dumps(index).encode())


def _manifest_not_indexed(root):
    path = root / "live" / "history" / SECOND.isoformat() / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"day"', b'"day" ', 1))


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        (_manifest_not_indexed, 3, "but live/history/index.json publishes"),
        (_index_traversal, 1, "is not a day YYYY-MM-DD"),
        (_edit_manifest(_traversal), 1, "are not events.parquet, news.parquet"),
        (_edit_manifest(_huge), 1, "not an integer from 0 to"),
        (_edit_manifest(_grow_events), 3, "the manifest says"),
        (_edit_manifest(_wrong_sha), 3, "the manifest says"),
    ],
)
def test_a_hostile_history_is_refused_in_one_line_with_nothing_written(
    settings, store, tmp_path, capsys, change, status, says
):
    for day in (FIRST, SECOND):
        publish(settings, store, day)
    hostile = _tampered(tmp_path, store, change)
    out = tmp_path / "participant"
    code, printed, err = download(tmp_path, capsys, "--out", str(out), source=hostile.root)
    assert code == status and says in err and len(err.strip().splitlines()) == 1 and printed == ""
    # Nothing of SECOND in place (a file verified before the refusal waits in database/.staging/ for
    # the next sync), nothing outside the output directory.
    assert not (tmp_path / "escaped.parquet").exists()
    placed = [p for p in out.rglob("*") if p.is_file() and ".staging" not in p.parts]
    assert not [p for p in placed if SECOND.isoformat() in p.name]
    # The sync stops before writing a day's file that does not verify; a day refused before any
    # download (its manifest or the index) leaves nothing at all.
    if status == 1 or "index.json" in says:
        assert not [p for p in out.rglob("*") if p.is_file()]


# --- EventDatabase over the downloaded history ------------------------------------------------


def test_event_database_answers_date_gated_queries_on_the_downloaded_days(settings, store, tmp_path, capsys):
    for day in (FIRST, SECOND, DAY):
        publish(settings, store, day, now=CLOCK + timedelta(days=1))
    out = tmp_path / "participant"
    assert download(tmp_path, capsys, "--out", str(out))[0] == 0
    db = EventDatabase(out)
    assert db.months == [MARCH] and db.start == MARCH and db.last_day == DAY
    month = build_database_month(MARCH, settings.dataset)
    events, news = db.gated_tables(SECOND)
    assert events.get_column("date").max() == SECOND and news.get_column("date").max() == SECOND
    expected = month.events.filter(pl.col("date").is_between(FIRST, SECOND))
    assert events.height == expected.height
    # A query on DAY sees the history through D − 1, never D itself.
    env = db.environment(DAY, 1)
    assert env.count_events() == expected.height
    with pytest.raises(DateGateError, match="after the environment's cutoff 2024-03-09"):
        env.count_events(date_range=(DAY, DAY))
    assert EventDatabase(out).environment(DAY + timedelta(days=1), 1).count_events(date_range=(DAY, DAY)) > 0


def test_a_day_file_with_another_days_rows_is_refused(settings, store, tmp_path, capsys):
    publish(settings, store, SECOND)
    out = tmp_path / "participant"
    assert download(tmp_path, capsys, "--out", str(out))[0] == 0
    path = out / "database" / "events" / f"day={SECOND}.parquet"
    pl.read_parquet(path).with_columns(pl.lit(DAY).alias("date")).write_parquet(path)
    with pytest.raises(DatabaseFileError, match=f"dated outside {SECOND}"):
        EventDatabase(out).gated_tables(SECOND)


# --- Dagster ------------------------------------------------------------------------------------


def test_the_job_publishes_a_partition_and_the_schedule_asks_for_the_day_before(settings, tmp_path):
    resources = resources_for(live_settings(tmp_path / "data", release_uri=str(tmp_path / "bucket")))
    defs = dg.Definitions(assets=[live_history], jobs=[live_history_job], resources=resources)
    replay = {"ops": {"live_history": {"config": {"replay_at": CLOCK.isoformat()}}}}
    with dg.instance_for_test() as instance:
        # Resolved inside the block: resolving reads the current instance's definitions state.
        job = defs.resolve_job_def("live_history_publication")
        result = job.execute_in_process(partition_key=SECOND.isoformat(), instance=instance, run_config=replay)
        assert result.success
        meta = result.asset_materializations_for_node("live_history")[0].metadata
        assert meta["published_now"].value == 1 and meta["index_updated"].value is True
        assert meta["dagster/row_count"].value > 0 and meta["news"].value > 0
        assert meta["manifest_key"].value == f"live/history/{SECOND}/manifest.json"
        # A backfill is one run over its days (single-run policy): the new day is published, the
        # published one verified, and each day is a materialised partition.
        ranged = job.execute_in_process(
            instance=instance,
            run_config=replay,
            tags={
                "dagster/asset_partition_range_start": FIRST.isoformat(),
                "dagster/asset_partition_range_end": SECOND.isoformat(),
            },
        )
        assert ranged.success
        meta = ranged.asset_materializations_for_node("live_history")[0].metadata
        assert meta["days"].value == 2 and meta["published_now"].value == 1
        assert instance.get_materialized_partitions(dg.AssetKey("live_history")) == {
            FIRST.isoformat(),
            SECOND.isoformat(),
        }
        # The day is not over on the run's clock: refused, not retried.
        early = {"ops": {"live_history": {"config": {"replay_at": f"{DAY}T00:00:00+00:00"}}}}
        failed = job.execute_in_process(
            partition_key=DAY.isoformat(), instance=instance, run_config=early, raise_on_error=False
        )
        assert not failed.success
    assert (tmp_path / "bucket" / "live" / "history" / "index.json").is_file()

    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance, scheduled_execution_time=CLOCK, resources={"dataset": resources["dataset"]}
        )
        request = live_history_daily(context)
        assert isinstance(request, dg.RunRequest)
        assert request.partition_key == SECOND.isoformat() and request.run_key == f"live-history-{SECOND}"
        (tmp_path / "data" / "articles" / f"date={SECOND}.parquet").unlink()
        skipped = live_history_daily(context)
        assert isinstance(skipped, dg.SkipReason) and f"waits for articles {SECOND}" in skipped.skip_message
