"""Shared by the reliability tests: run a stage in a process and SIGKILL it, snapshot a data
directory for comparison, find orphaned temp files, and publish a generated mirror slot by slot."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]

# What a crash can leave behind, by the writers' own naming:
# - storage.temp_path_for: ".<name>.<pid>.<8 hex>.part" next to the target (atomic writes, GDELT
#   downloads, LocalStore objects);
# - pipeline/release/download.py (release download): ".<name>.part", resumed on purpose by the next run;
# - splits.build_split: a tempfile.mkdtemp staging dir ".YYYY-MM.<random>" under splits/, and
#   replace_dir's ".YYYY-MM.old" (removed by the next replace_dir).
ORPHAN_FILE = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.part$")
ORPHAN_DIR = re.compile(r"^\.\d{4}-\d{2}\.")


def orphans(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if (path.is_file() and ORPHAN_FILE.match(path.name)) or (path.is_dir() and ORPHAN_DIR.match(path.name)):
            found.append(str(path.relative_to(root)))
    return found


# --- running a stage --------------------------------------------------------------------------


@dataclass
class StageRun:
    returncode: int
    killed: bool  # SIGKILLed while running (by itself or by us), not finished
    output: str


def stage_cmd(stage: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.reliability.driver", stage, *args]


def run_stage(
    env: dict[str, str], stage: str, *args: str, kill_at: int | None = None, kill_when=None, timeout_s: float = 120.0
) -> StageRun:
    """Run a stage to its end, or kill it: ``kill_at`` = the process kills itself before its N-th
    commit (driver.py); ``kill_when(proc)`` = polled every 10 ms, we SIGKILL it once it is true."""
    env = {**env, "RELIABILITY_KILL_AT": str(kill_at) if kill_at else ""}
    proc = subprocess.Popen(
        stage_cmd(stage, *args), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + timeout_s
    killed_by_us = False
    while proc.poll() is None:
        if kill_when is not None and kill_when():
            proc.send_signal(signal.SIGKILL)
            killed_by_us = True
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{stage} {args} did not finish in {timeout_s}s")
        time.sleep(0.01)
    out = proc.communicate()[0]
    return StageRun(proc.returncode, proc.returncode == -signal.SIGKILL and (killed_by_us or bool(kill_at)), out)


def must_finish(env: dict[str, str], stage: str, *args: str) -> int:
    """Run a stage to its end; the number of commits it made (driver.py)."""
    run = run_stage(env, stage, *args)
    last = run.output.rstrip().rsplit("\n", 1)[-1]
    assert run.returncode == 0 and last.startswith("done commits="), run.output[-3000:]
    return int(last.removeprefix("done commits="))


# --- comparing data directories -----------------------------------------------------------------

# Not data: flock files (empty) and the Dagster instance.
SKIPPED_TOP = {"locks", "dagster_home"}


def file_digests(root: Path, skip: set[str] = SKIPPED_TOP) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (
            path.is_file()
            and rel.parts[0] not in skip
            and not ORPHAN_FILE.match(path.name)
            and not any(ORPHAN_DIR.match(p) for p in rel.parts)
        ):
            out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# Files whose bytes legitimately differ between a crashed-and-resumed run and a clean one, and the
# columns that carry the difference; the rest of each file must be equal row for row.
# - slot ledger: `attempts`/`http_status` count this run's HTTP work. A file landed by the killed
#   run (whose ledger write never happened) is re-verified from disk by the re-run: attempts 0,
#   no HTTP status. updated_at etc. are the `now` passed in, identical here, but would differ in
#   production, so they are not part of the promise either.
# - fetch ledger and articles: `fetched_at` is the wall clock at the response (fetch.py), so two
#   runs never agree on it; the ledger's attempt counters may also see a page fetched twice when the
#   kill came before the checkpoint that records it.
VOLATILE = {
    "ledger/slots/": ("attempts", "http_status", "first_checked_at", "landed_at", "updated_at"),
    "ledger/articles/": ("fetched_at", "first_tried_at", "last_tried_at", "attempts", "http_status"),
    "articles/": ("fetched_at",),
}
# A sealed file's digest (digests/<path>.sha256) differs exactly when its file's bytes do: for a
# file in VOLATILE it is checked to seal the resumed run's own bytes instead.


def volatile_columns(rel: str) -> tuple[str, ...] | None:
    for prefix, columns in VOLATILE.items():
        if rel.startswith(prefix):
            return columns
    return None


def stable_frame(path: Path, columns: tuple[str, ...]) -> pl.DataFrame:
    frame = pl.read_parquet(path)
    return frame.drop([c for c in columns if c in frame.columns])


def assert_same_data(clean: Path, resumed: Path) -> None:
    """Every data file of the clean run exists in the resumed one with the same bytes, and no
    other file does; files in VOLATILE are compared as rows without their volatile columns."""
    a, b = file_digests(clean), file_digests(resumed)
    assert sorted(a) == sorted(b), {"only_clean": sorted(set(a) - set(b)), "only_resumed": sorted(set(b) - set(a))}
    differ = [rel for rel in a if a[rel] != b[rel]]
    bytes_differ = []
    for rel in differ:
        sealed = rel.removeprefix("digests/").removesuffix(".sha256")
        if rel.startswith("digests/") and volatile_columns(sealed):
            recorded = (resumed / rel).read_text().split()[0]
            assert recorded == hashlib.sha256((resumed / sealed).read_bytes()).hexdigest(), (
                f"{rel} does not seal {sealed}"
            )
            continue
        columns = volatile_columns(rel)
        if columns is None:
            bytes_differ.append(rel)
            continue
        x, y = stable_frame(clean / rel, columns), stable_frame(resumed / rel, columns)
        assert x.equals(y), f"{rel}: rows differ beyond {columns}"
    assert not bytes_differ, f"files whose bytes differ from the uninterrupted run: {bytes_differ}"


def assert_no_duplicate_rows(root: Path) -> None:
    """The keys the pipeline promises unique, over every file of each table."""
    keys = {
        "events": ["event_id"],
        "daily_quads": ["date", "s", "r", "o"],
        "articles": ["url"],
        "ledger/slots": ["slot", "kind"],
        "ledger/articles": ["url"],
        "database/events": ["date", "s", "r", "o"],
        "database/news": ["article_id"],
    }
    for table, key in keys.items():
        files = sorted(p for p in (root / table).rglob("*.parquet") if not p.name.startswith("."))
        if not files:
            continue
        frame = pl.concat([pl.read_parquet(p, columns=key) for p in files], how="vertical_relaxed")
        assert frame.height == frame.unique().height, f"{table}: duplicate {key}"
    for kind in ("export", "mentions"):
        files = sorted((root / "parsed" / kind).rglob("*.parquet"))
        if files:
            column = "GLOBALEVENTID" if kind == "export" else None
            if column:
                ids = pl.scan_parquet(files).select(column).collect()
                assert ids.height == ids.unique().height, f"parsed {kind}: duplicate {column}"


# --- a generated mirror, published slot by slot ---------------------------------------------------


class Publisher:
    """Plays GDELT publishing a generated mirror: the index lists only slots up to a cutoff.

    MirrorServer serves whatever is on disk (its control API has faults and a request log, no
    clock), so the index files are rewritten per tick. The master list only ever grows by whole
    lines, as GDELT's does, which is what the pipeline's ranged tail refresh relies on."""

    def __init__(self, mirror_dir: Path):
        self.feed = mirror_dir / "gdeltv2"
        self.lines = (self.feed / "masterfilelist.txt").read_text().splitlines()

    @staticmethod
    def _slot(line: str) -> datetime:
        stamp = line.rsplit("/", 1)[1][:14]
        return datetime.strptime(stamp + "+0000", "%Y%m%d%H%M%S%z")

    def publish_until(self, cutoff: datetime) -> int:
        listed = [line for line in self.lines if self._slot(line) <= cutoff]
        self._write("masterfilelist.txt", listed)
        newest = max((self._slot(line) for line in listed), default=None)
        self._write("lastupdate.txt", [line for line in listed if self._slot(line) == newest])
        return len(listed)

    def _write(self, name: str, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode() if lines else b""
        temp = self.feed / f".{name}.tmp"
        temp.write_bytes(data)
        os.replace(temp, self.feed / name)  # the server must never serve half an index


def settings_env(data_dir: Path, base_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIRAI_", "GDELT_"))}
    env.update(
        {
            "MIRAI_DATA_DIR": str(data_dir),
            "GDELT_BASE_URL": base_url,
            "MIRAI_BACKOFF_BASE_S": "0.01",
            "MIRAI_BACKOFF_MAX_S": "0.05",
            "MIRAI_HTTP_READ_TIMEOUT_S": "2",
            "MIRAI_DAY_LOCK_TIMEOUT_S": "60",
            **extra,
        }
    )
    return env
