"""Where everything lives under MIRAI_DATA_DIR, and how it is written.

One class owns every path so the layout in docs/architecture.md has a single source of truth.
Every write goes to a uniquely named temp file in the destination directory, is fsynced, then
renamed over the target: a reader (or a crash) never sees half a file, and two writers of the same
file race only on an atomic rename.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import BinaryIO

import polars as pl

KINDS = ("export", "mentions")


def slot_ts(slot: datetime) -> str:
    """GDELT's 14-digit UTC timestamp for a 15-minute slot."""
    return slot.strftime("%Y%m%d%H%M%S")


def raw_file_name(slot: datetime, kind: str) -> str:
    return f"{slot_ts(slot)}.{kind}.CSV.zip"


class DataLayout:
    def __init__(self, root: Path | str):
        self.root = Path(root)

    def _day_dir(self, base: str, day: date) -> Path:
        return self.root / base / f"{day:%Y}" / f"{day:%m}" / f"{day:%d}"

    # raw/gdeltv2/YYYY/MM/DD/<ts>.<kind>.CSV.zip: verified bytes, never rewritten
    def raw_path(self, slot: datetime, kind: str) -> Path:
        return self._day_dir("raw/gdeltv2", slot.date()) / raw_file_name(slot, kind)

    def quarantine_dir(self, day: date) -> Path:
        return self._day_dir("quarantine/gdeltv2", day)

    def slot_ledger_path(self, day: date) -> Path:
        return self.root / "ledger" / "slots" / f"date={day.isoformat()}.parquet"

    def parsed_path(self, kind: str, slot: datetime) -> Path:
        return self.root / "parsed" / kind / f"date={slot.date().isoformat()}" / f"{slot_ts(slot)}.parquet"

    def parsed_dir(self, kind: str, day: date) -> Path:
        return self.root / "parsed" / kind / f"date={day.isoformat()}"

    # Beside the slot directory, not in it: every reader globs that directory's *.parquet.
    def parsed_digests_path(self, kind: str, day: date) -> Path:
        return self.root / "parsed" / "digests" / kind / f"date={day.isoformat()}.parquet"

    def parsed_quarantine_dir(self, kind: str, day: date) -> Path:
        return self.root / "quarantine" / "parsed" / kind / f"date={day.isoformat()}"

    def rejects_path(self, kind: str, slot: datetime) -> Path:
        return self.root / "parsed" / "rejects" / f"date={slot.date().isoformat()}" / f"{slot_ts(slot)}.{kind}.parquet"

    def event_keys_path(self, day: date) -> Path:
        return self.root / "keys" / "events" / f"date={day.isoformat()}.parquet"

    def event_keys_dir(self) -> Path:
        return self.root / "keys" / "events"

    # keys/history/{ids,urls}/<n>d/from=YYYY-MM-DD.parquet: the key files of n aligned days, merged
    def event_history_path(self, kind: str, first: date, days: int) -> Path:
        return self.root / "keys" / "history" / kind / f"{days}d" / f"from={first.isoformat()}.parquet"

    def events_path(self, day: date) -> Path:
        return self.root / "events" / f"date={day.isoformat()}.parquet"

    def daily_quads_path(self, day: date) -> Path:
        return self.root / "daily_quads" / f"date={day.isoformat()}.parquet"

    def articles_path(self, day: date) -> Path:
        return self.root / "articles" / f"date={day.isoformat()}.parquet"

    def unmapped_codes_path(self, day: date) -> Path:
        return self.root / "reports" / "unmapped_codes" / f"date={day.isoformat()}.parquet"

    def index_dir(self) -> Path:
        return self.root / "index" / "gdeltv2"

    # digests/<path of a sealed file>.sha256: "<sha256> <bytes>" of the file as it was written
    def digest_path(self, path: Path) -> Path:
        return self.root / "digests" / f"{path.relative_to(self.root)}.sha256"

    def lock_path(self, name: str) -> Path:
        return self.root / "locks" / f"{name}.lock"

    # raw_html/<md5[:2]>/<md5>.html.gz: the decoded body of a fetched article, gzip-compressed
    def raw_html_path(self, url_md5: str) -> Path:
        return self.root / "raw_html" / url_md5[:2] / f"{url_md5}.html.gz"

    # One global fetch ledger: fetch-once-ever dedup across days needs a global view of every URL.
    def fetch_ledger_path(self) -> Path:
        return self.root / "ledger" / "articles" / "fetch_ledger.parquet"

    # database/{events,news}/month=YYYY-MM.parquet: what agents query. One file per month, so a
    # new month adds files and never rewrites history.
    def database_dir(self) -> Path:
        return self.root / "database"

    def database_path(self, table: str, month: date) -> Path:
        return self.database_dir() / table / f"month={month:%Y-%m}.parquet"

    # evaluations/YYYY-MM/<agent>/<query set>/distance=<d>/: results.parquet, scores.json
    def evaluation_dir(self, month: date, agent: str, query_set: str, distance: int) -> Path:
        return self.root / "evaluations" / f"{month:%Y-%m}" / agent / query_set / f"distance={distance}"

    # splits/YYYY-MM/: queries.parquet, queries_sample.parquet, figures, manifest.json, README.md
    def split_dir(self, month: date) -> Path:
        return self.root / "splits" / f"{month:%Y-%m}"

    def split_months(self, before: date) -> list[date]:
        """The months before ``before`` with a split (splits/YYYY-MM/queries.parquet), oldest
        first. Never ``before`` or later: what a split is built from must not include later data.
        A staging directory (hidden, not named YYYY-MM) is not a split."""
        months = (
            date.fromisoformat(f"{path.parent.name}-01")
            for path in (self.root / "splits").glob("*/queries.parquet")
            if re.fullmatch(r"[0-9]{4}-(0[1-9]|1[0-2])", path.parent.name)
        )
        return sorted(m for m in months if m < before.replace(day=1))


def outside_or_not_regular(directory: Path, path: Path) -> str | None:
    """Why ``path`` is not a regular file inside ``directory`` once every link is followed (it
    leads outside, is missing, or is a directory, device or pipe), or None when it is. For files in
    a directory someone handed over: a link leading out of it would hand a file from elsewhere on
    the machine to whoever reads it."""
    base, target = Path(os.path.realpath(directory)), Path(os.path.realpath(path))
    if not target.is_relative_to(base):
        return f"{str(path)!r} leads outside {str(directory)!r} (to {str(target)!r})"
    try:
        mode = os.stat(target).st_mode
    except OSError as exc:
        return f"{str(path)!r}: {exc.strerror}"
    if not stat.S_ISREG(mode):
        return f"{str(path)!r} is not a regular file"
    return None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path_for(target: Path, sweep: bool = True) -> Path:
    # Hidden, unique per writer, same directory (rename must not cross filesystems). The writer's
    # pid is in the name so that the next writer of the same target can tell a crashed writer's
    # leftover (pid gone) from a concurrent writer's temp file (pid alive) and remove only the former.
    # ``sweep=False``: the caller swept the directory already (remove_orphan_temps), see there.
    if sweep:
        remove_orphans(target.parent, f".{target.name}.")
    return target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")


_TEMP_NAME = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.part$")  # temp_path_for's names


def remove_orphan_temps(directory: Path) -> list[Path]:
    """Remove every temp file of a dead writer in ``directory`` in one listing. A writer of
    thousands of files into one directory calls it once and writes with ``sweep=False``: sweeping
    per file lists the directory per file (the generated GDELT mirror's 5,000-zip feed spent most
    of its time listing itself)."""
    removed = []
    for entry in os.scandir(directory) if directory.is_dir() else ():
        match = _TEMP_NAME.match(entry.name)
        if match and entry.is_file(follow_symlinks=False) and not _pid_alive(int(match.group(1))):
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_orphans(directory: Path, prefix: str) -> list[Path]:
    """Remove ``<prefix><pid>.<...>`` entries (temp files, staging directories) whose writer
    process no longer exists: what a crash between writing and renaming leaves behind."""
    removed = []
    if not directory.is_dir():
        return removed
    for path in directory.glob(f"{glob.escape(prefix)}*"):
        pid = path.name[len(prefix) :].split(".", 1)[0]
        if not pid.isdigit() or _pid_alive(int(pid)):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def commit_temp(temp: Path, target: Path) -> None:
    """fsync a finished temp file and rename it over the target."""
    with open(temp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(temp, target)
    _fsync_dir(target.parent)


# Big buffers go to the page cache in writes of at most this size. Measured on this project's
# machines (Linux 6.18, ext4, 2 cores): while earlier dirty data is being written back, the same
# 500 MB cost 0.15-0.2 s of kernel time in 256-512 KiB writes, 0.4-1.8 s in 1 MiB writes and
# 2-3 s in 15 MiB writes (almost all of it copying into the page cache); with no writeback
# running every size costs ~0.15 s. Downloads and files written after a big upload hit this.
WRITE_PIECE = 256 * 1024


def write_all(fh: BinaryIO, data: bytes | memoryview) -> None:
    """fh.write(data), in WRITE_PIECE writes."""
    view = memoryview(data)
    for start in range(0, len(view), WRITE_PIECE):
        fh.write(view[start : start + WRITE_PIECE])


def atomic_write_bytes(target: Path, data: bytes, sweep: bool = True) -> None:
    """Write ``data`` to ``target`` atomically and durably (``sweep``: see ``temp_path_for``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(target, sweep)
    try:
        with open(temp, "wb") as fh:
            write_all(fh, data)
        commit_temp(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        write_all(fh, data)
        os.fsync(fh.fileno())


# Temp files written and fsynced at once by atomic_write_many: fsync waits on the disk with the GIL released,
# and concurrent fsyncs share the filesystem journal's commits.
SYNC_THREADS = 8


def atomic_write_many(files: list[tuple[Path, bytes]]) -> None:
    """``atomic_write_bytes`` for many files of one stage, in order: every file still goes to a
    temp file that is fsynced before it is renamed over its target, but each directory is swept and
    fsynced once, and the temp files are fsynced together before the first rename. A crash leaves
    each target old or new, never half written. Within one call, which renames survive a power loss
    is not ordered: files that must persist before others (e.g. a file marking work done) go in a
    later call, which starts only once this one's directories are fsynced."""
    if not files:
        return
    directories = list(dict.fromkeys(target.parent for target, _ in files))
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        remove_orphan_temps(directory)
    temps = [temp_path_for(target, sweep=False) for target, _ in files]
    try:
        with ThreadPoolExecutor(max_workers=min(SYNC_THREADS, len(temps))) as pool:
            list(pool.map(_write_synced, temps, [data for _, data in files]))
        for temp, (target, _) in zip(temps, files):
            os.replace(temp, target)
        for directory in directories:
            _fsync_dir(directory)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)


def parquet_bytes(df: pl.DataFrame, metadata: dict[str, str] | None = None) -> bytes:
    """Parquet with key-value metadata (rule/parser versions). Statistics are off and the
    compression fixed so the same frame gives byte-identical files."""
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd", statistics=False, metadata=metadata or {})
    return buf.getvalue()


def atomic_write_parquet(df: pl.DataFrame, target: Path, metadata: dict[str, str] | None = None) -> None:
    atomic_write_bytes(target, parquet_bytes(df, metadata))


@dataclass(frozen=True)
class FileDigest:
    """The sha256 and size of a file's bytes, as recorded when it was written."""

    sha256: str
    bytes: int

    @classmethod
    def of_bytes(cls, data: bytes) -> FileDigest:
        return cls(hashlib.sha256(data).hexdigest(), len(data))

    @classmethod
    def of_file(cls, path: Path) -> FileDigest:
        with open(path, "rb") as fh:
            return cls(hashlib.file_digest(fh, "sha256").hexdigest(), os.fstat(fh.fileno()).st_size)

    def describe(self) -> str:
        return f"sha256 {self.sha256}, {self.bytes} bytes"


class DamagedFile(RuntimeError):
    """A sealed file's bytes are not those recorded when it was written (bit rot, a bad copy or
    restore, or a run killed between the digest and the file): the step that writes it must run
    again before anything reads it."""


def write_sealed_parquet(
    layout: DataLayout, df: pl.DataFrame, target: Path, metadata: dict[str, str] | None = None
) -> None:
    """Write a derived parquet file and, first, its sha256 and size under digests/: a sealed file
    is never on disk without its digest, and a reader or check that finds other bytes knows the
    file changed after it was written (its footer may well still open, and damaged pages can
    decode to other values). Hashing costs ~1 ms per MB."""
    write_sealed_bytes(layout, parquet_bytes(df, metadata), target)


def write_sealed_bytes(layout: DataLayout, data: bytes, target: Path) -> None:
    """Write ``data`` to ``target`` after its digest (see write_sealed_parquet)."""
    digest = FileDigest.of_bytes(data)
    atomic_write_bytes(layout.digest_path(target), f"{digest.sha256} {digest.bytes}\n".encode())
    atomic_write_bytes(target, data)


def recorded_digest(layout: DataLayout, path: Path) -> FileDigest | None:
    """The sha256 and size a sealed file was written with, or None for a file with no digest."""
    digest_path = layout.digest_path(path)
    if not digest_path.exists():
        return None
    sha256, size = digest_path.read_text().split()
    return FileDigest(sha256, int(size))


def seal_problem(layout: DataLayout, path: Path) -> str | None:
    """What is wrong with a sealed file, or None when its bytes match its digest. A file with no
    digest (written before digests were recorded) is taken as it is; a digest without its file
    is a file lost after it was written."""
    recorded = recorded_digest(layout, path)
    if recorded is None:
        return None
    if not path.exists():
        return f"missing (its digest records {recorded.describe()})"
    found = FileDigest.of_file(path)
    return None if found == recorded else f"{found.describe()}; written as {recorded.describe()}"


def verified(layout: DataLayout, *paths: Path) -> list[Path]:
    """The paths, once each sealed file among them matches its digest; raises DamagedFile naming
    every one that does not, so damage stops a run instead of being read."""
    problems = {p: seal_problem(layout, p) for p in paths}
    damaged = [f"{p.relative_to(layout.root)}: {what}" for p, what in problems.items() if what]
    if damaged:
        raise DamagedFile(
            f"{len(damaged)} stored file(s) changed after they were written; materialise the partition "
            "that writes them again: "
            + "; ".join(damaged[:5])
            + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
        )
    return list(paths)


def quarantine_file(path: Path, directory: Path, name: str, note: dict) -> Path:
    """Move bad bytes out of the store into ``directory/<name>.<utc stamp>.bad``, with a JSON note
    beside it (``.bad.json``) saying why; a new pair per bad copy, never overwritten."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    dest = directory / f"{name}.{stamp}.bad"
    path.replace(dest)
    atomic_write_bytes(directory / f"{dest.name}.json", json.dumps(note, indent=2, sort_keys=True).encode())
    return dest


def read_parquet_metadata(path: Path) -> dict[str, str]:
    # polars decodes only the footer's key-value pairs: pyarrow's read_metadata built the whole
    # footer (every column's schema) in Python objects, 10x slower, and parse_day reads the
    # metadata of every built slot file on each run (5% of a 15-minute run late in the day).
    return {k: v for k, v in pl.read_parquet_metadata(path).items() if not k.startswith("ARROW:")}


def built_parquet_metadata(path: Path) -> dict[str, str] | None:
    """The metadata of one of our own derived files, or None when it is missing or unreadable:
    a file a crash or a bad disk truncated must be rebuilt, not block every later run."""
    if not path.exists():
        return None
    try:
        return read_parquet_metadata(path)
    except (pl.exceptions.PolarsError, OSError):
        return None


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """A fresh directory to build ``final``'s next contents in, swapped into place (replace_dir)
    when the block ends cleanly, removed when it raises; a block that removes it itself (nothing
    to change) leaves ``final`` as it was. Made beside ``final`` (the same file system) with the
    pid in its name, so the next call removes what a killed one left (remove_orphans)."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(parent, f".{final.name}.")
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", dir=parent))
    try:
        yield staging
        if staging.exists():
            replace_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_dir(new: Path, final: Path) -> None:
    """Swap a finished directory into place: readers see the old split or the new, never a mix
    (two renames; between them the month is briefly absent, which readers treat as not built)."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)


class LockTimeout(TimeoutError):
    pass


@contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive advisory lock (flock), so a schedule run and a backfill of the same day
    serialise instead of interleaving; the second one then finds the slots already landed.
    The kernel drops the lock if the holder dies, so a crash never leaves it stuck."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{path} is held by another run for more than {timeout_s:.0f}s") from exc
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
