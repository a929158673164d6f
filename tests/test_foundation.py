"""Settings, atomic storage, locks and the retry loop."""

from __future__ import annotations

import io
import os
import re
import threading
import time
from datetime import date
from pathlib import Path

import polars as pl
import pytest
import requests

from pipeline.cli import main
from pipeline.config import Settings, env_names, settings_table
from pipeline.http import RETRY_AFTER_MAX_S, RetryLog, TransientHTTPError, parse_retry_after, with_retries
from pipeline.storage import (
    WRITE_PIECE,
    LockTimeout,
    atomic_write_bytes,
    atomic_write_many,
    atomic_write_parquet,
    built_parquet_metadata,
    file_lock,
    read_parquet_metadata,
    remove_orphan_temps,
    write_all,
)

ROOT = Path(__file__).resolve().parents[1]


def test_settings_from_env_and_clear_errors():
    s = Settings.from_env(
        {"MIRAI_DATA_DIR": "/tmp/x", "MIRAI_START_DATE": "2024-02-01", "MIRAI_DOWNLOAD_ATTEMPTS": "7"}
    )
    assert (s.dataset.data_dir, s.calendar.start_date, s.gdelt.download_attempts) == (
        Path("/tmp/x"),
        date(2024, 2, 1),
        7,
    )
    assert Settings.from_env({}).gdelt.base_url == "https://data.gdeltproject.org/gdeltv2"  # HTTPS by default
    with pytest.raises(ValueError, match="MIRAI_START_DATE"):
        Settings.from_env({"MIRAI_START_DATE": "01/02/2024"})


def test_the_readme_s_settings_table_is_the_one_the_declarations_make(capsys):
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- settings-table: [^>]*-->\n\n(.*?)<!-- /settings-table -->", readme, re.DOTALL)
    assert found, "README.md lost its settings table"
    assert found.group(1) == settings_table(), "regenerate it: mirai settings"
    assert main(["settings"]) == 0 and capsys.readouterr().out == settings_table()
    assert len(found.group(1).splitlines()) == 2 + len(env_names())  # one row per setting


def test_atomic_parquet_write_keeps_metadata_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a" / "b.parquet"
    df = pl.DataFrame({"x": [1, 2, 3]})
    atomic_write_parquet(df, target, metadata={"format_version": "9"})
    atomic_write_parquet(df, target, metadata={"format_version": "9"})
    assert pl.read_parquet(target).equals(df)
    assert read_parquet_metadata(target) == {"format_version": "9"}
    assert [p.name for p in target.parent.iterdir()] == ["b.parquet"]


def test_big_buffers_are_written_whole_in_pieces(tmp_path):
    class Recorder(io.BytesIO):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def write(self, data):
            self.sizes.append(len(data))
            return super().write(data)

    data = os.urandom(3 * WRITE_PIECE + 123)
    out = Recorder()
    write_all(out, data)
    assert out.getvalue() == data and out.sizes == [WRITE_PIECE] * 3 + [123]
    atomic_write_bytes(tmp_path / "f", data)
    assert (tmp_path / "f").read_bytes() == data


def test_a_crashed_writers_temp_file_is_removed_by_the_next_write_and_a_live_ones_is_kept(tmp_path):
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that existed and is gone
    target = tmp_path / "x.parquet"
    crashed = tmp_path / f".x.parquet.{dead.pid}.deadbeef.part"
    concurrent = tmp_path / f".x.parquet.{os.getpid()}.cafecafe.part"
    crashed.write_bytes(b"half")
    concurrent.write_bytes(b"in progress")
    atomic_write_bytes(target, b"done")
    assert target.read_bytes() == b"done"
    assert not crashed.exists() and concurrent.exists()


def test_one_sweep_removes_every_crashed_writers_temp_file_of_a_directory_and_nothing_else(tmp_path):
    """What a writer of many files calls once before writing them with sweep=False (the generated
    mirror's feed)."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    crashed = [tmp_path / f".{name}.{dead.pid}.deadbeef.part" for name in ("a.zip", "b.zip")]
    kept = [
        tmp_path / f".c.zip.{os.getpid()}.cafecafe.part",  # a live writer's
        tmp_path / "a.zip",
        tmp_path / f".a.zip.{dead.pid}.part",
    ]  # data, and not a temp name
    for path in crashed + kept:
        path.write_bytes(b"x")
    assert sorted(remove_orphan_temps(tmp_path)) == sorted(crashed)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
    atomic_write_bytes(tmp_path / "d.zip", b"done", sweep=False)
    assert (tmp_path / "d.zip").read_bytes() == b"done" and sorted(tmp_path.iterdir()) == sorted(
        [*kept, tmp_path / "d.zip"]
    )
    assert remove_orphan_temps(tmp_path / "absent") == []


def test_a_batch_of_atomic_writes_lands_every_file_whole_and_a_failed_one_changes_nothing(tmp_path):
    """atomic_write_many (a stage's many files, e.g. a day's parsed slots): every target gets its
    bytes, no temp file is left, a crashed writer's temp files are swept; a batch that fails before
    its renames leaves every target as it was."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    crashed = tmp_path / "a" / f".x.parquet.{dead.pid}.deadbeef.part"
    crashed.parent.mkdir()
    crashed.write_bytes(b"half")
    files = [(tmp_path / "a" / "x.parquet", b"x" * (WRITE_PIECE + 1)), (tmp_path / "b" / "c" / "y.parquet", b"y")]
    atomic_write_many(files)
    assert [target.read_bytes() for target, _ in files] == [data for _, data in files]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["x.parquet", "y.parquet"]
    with pytest.raises(TypeError):
        atomic_write_many([(tmp_path / "a" / "x.parquet", b"new"), (tmp_path / "b" / "c" / "y.parquet", None)])
    assert [target.read_bytes() for target, _ in files] == [data for _, data in files]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["x.parquet", "y.parquet"]
    atomic_write_many([])


def test_a_truncated_derived_parquet_reads_as_not_built(tmp_path):
    path = tmp_path / "keys.parquet"
    atomic_write_parquet(pl.DataFrame({"a": [1]}), path, metadata={"v": "1"})
    assert built_parquet_metadata(path) == {"v": "1"}
    path.write_bytes(path.read_bytes()[:20])
    assert built_parquet_metadata(path) is None
    assert built_parquet_metadata(tmp_path / "missing.parquet") is None


def test_file_lock_serialises_and_times_out(tmp_path):
    lock = tmp_path / "day.lock"
    order = []

    def holder():
        with file_lock(lock, timeout_s=5):
            order.append("first-in")
            time.sleep(0.5)
            order.append("first-out")

    t = threading.Thread(target=holder)
    t.start()
    time.sleep(0.1)
    with pytest.raises(LockTimeout):
        with file_lock(lock, timeout_s=0.2):
            pass
    with file_lock(lock, timeout_s=5):
        order.append("second-in")
    t.join()
    assert order == ["first-in", "first-out", "second-in"]


def test_retry_after_forms():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Thu, 01 Jan 2099 00:00:10 GMT", now=4070908800.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after(" 2.5 ") == 2.5  # a fraction, as some LLM endpoints send
    assert parse_retry_after("Thu, 01 Jan 2099 00:00:10 GMT", now=4070908900.0) == 0.0  # passed: now
    # Hostile values: unreadable ones are no delay, long ones are capped (the ledger adds them to a datetime).
    assert [parse_retry_after(v) for v in ("-5", "nan", "-inf", "0x10", "")] == [None] * 5
    assert parse_retry_after("9" * 5000) == parse_retry_after("inf") == RETRY_AFTER_MAX_S
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == RETRY_AFTER_MAX_S
    assert parse_retry_after("Fri, 31 Dec 99999 23:59:59 GMT") is None


def test_retry_loop_backs_off_honours_retry_after_and_gives_up():
    sleeps: list[float] = []
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 1:
            raise TransientHTTPError(429, "u", retry_after_s=3.0)
        if calls["n"] == 2:
            raise requests.ConnectionError("reset")
        return "ok"

    assert with_retries(flaky, attempts=3, backoff_base_s=1, backoff_max_s=10, sleep=sleeps.append) == "ok"
    assert sleeps[0] == 3.0 and 1.0 <= sleeps[1] <= 2.0  # Retry-After, then jittered 2^1 backoff

    def always():
        raise TransientHTTPError(503, "u", retry_after_s=999)

    sleeps.clear()
    with pytest.raises(TransientHTTPError):
        with_retries(always, attempts=3, backoff_base_s=1, backoff_max_s=10, sleep=sleeps.append)
    assert sleeps == [10, 10]  # capped at our own maximum

    def bug():
        raise KeyError("not transient")

    with pytest.raises(KeyError):
        with_retries(bug, attempts=3, backoff_base_s=1, backoff_max_s=10, sleep=sleeps.append)


def test_retries_record_every_attempt_and_stop_before_a_wait_past_the_deadline():
    """The ledger's attempt count and errors; a wait that would end past ``within_s`` is not
    taken: the last failure is raised at once (the article fetcher's per-URL deadline)."""
    sleeps: list[float] = []

    def down():
        raise TransientHTTPError(503, "u", retry_after_s=5.0)

    log = RetryLog()
    with pytest.raises(TransientHTTPError):
        with_retries(down, attempts=4, backoff_base_s=1, backoff_max_s=10, log=log, within_s=60, sleep=sleeps.append)
    assert sleeps == [5.0, 5.0, 5.0] and log.attempts == 4 and log.last_status == 503
    assert log.errors == ["HTTP 503 for u"] * 4
    sleeps.clear()
    log = RetryLog()
    with pytest.raises(TransientHTTPError):
        with_retries(down, attempts=4, backoff_base_s=1, backoff_max_s=10, log=log, within_s=4, sleep=sleeps.append)
    assert sleeps == [] and log.attempts == 1 and log.errors == ["HTTP 503 for u"]
