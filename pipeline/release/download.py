"""``mirai download``: fetch a published release, verify every file, resume what was interrupted.

A file is streamed into a hidden ``.<name>.part`` next to its destination and renamed into place
only once its size and sha256 match the manifest, so the destination never holds a file that
failed verification. An interrupted run leaves the .part behind and the next run asks only for
the missing bytes (an HTTP Range request on S3); every run re-hashes the files already in place
and fetches again any that no longer match. The manifest itself is checked against latest.json
or index.json and written last: a destination with manifest.json had every selected file
verified.

Durability is opt-in (``durable=True``, ``mirai download --fsync``): every file and directory is
then fsynced before the manifest is written, so manifest.json also means "on disk" across a power
cut. It is off by default, as in ``aws s3 cp`` and other downloaders: re-running the command
already repairs anything a crash damaged, and on a disk busy with other writes the fsyncs made
the download 0.2-0.3 s slower per 500 MB (docs/benchmarks.md).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pipeline.release.layout import (
    INDEX_KEY,
    LATEST_KEY,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    MIRAI_BUNDLE_DIR,
    ReleaseError,
    UnsafeRelease,
    check_index,
    check_manifest,
    check_pointer,
    load_json,
    parse_month,
    path_inside,
    release_key,
    shown,
)
from pipeline.release.publish import sha256_hex
from pipeline.release.store import CHUNK, ReleaseStore
from pipeline.storage import atomic_write_bytes, write_all

ONLY_CHOICES = ("split", "database", "mirai")
# A body that breaks off mid-stream (reset, timeout) is re-requested from where it stopped this
# many times per file before the run gives up (and leaves the .part for the next run).
STREAM_ATTEMPTS = 3
# A durable download asks the kernel to start writing each WRITEBACK bytes as they arrive, so the
# disk works while the network does and the final fsyncs find little left to wait for. A plain
# download does not: starting writeback blocks while the disk is busy with other writes.
WRITEBACK = 8 * 2**20


class ChecksumMismatch(ReleaseError):
    """A downloaded file (or the manifest) does not match its published sha256; nothing was kept."""


@dataclass
class DownloadResult:
    release: str
    directory: Path
    downloaded: list[str] = field(default_factory=list)
    already_verified: list[str] = field(default_factory=list)
    bytes_downloaded: int = 0


class ProgressBar:
    """tqdm's byte bar on stderr (bytes, percent, rate, current file); silent when stderr is not a
    terminal. Callable with a byte count, as boto3's transfer callbacks are, from several threads
    (tqdm does not document update() as thread-safe: the lock keeps the count exact)."""

    def __init__(self, total: int, enabled: bool | None = None):
        self.bar = tqdm(
            total=max(total, 1),
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            mininterval=0.1,
            dynamic_ncols=True,
            file=sys.stderr,
            disable=None if enabled is None else not enabled,
        )
        self.enabled = not self.bar.disable
        self._lock = threading.Lock()

    def file(self, label: str) -> None:
        if self.enabled:
            self.bar.set_postfix_str(label[-40:])

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self.bar.update(nbytes)

    def close(self) -> None:
        self.bar.close()


def resolve_release(store: ReleaseStore, which: str) -> tuple[str, bytes, dict]:
    """(month, manifest bytes, manifest) for "latest" or "YYYY-MM", the manifest checked against
    the sha256 that latest.json or index.json publishes for it, and every pointer and manifest
    entry against the release layout (pipeline/release/layout.py): the store may be hostile."""
    if which == "latest":
        raw = store.get_bytes(LATEST_KEY, limit=MAX_JSON_BYTES)
        if raw is None:
            raise ReleaseError(f"no release is published at {store.description} (no {LATEST_KEY})")
        where = f"{LATEST_KEY} at {store.description}"
        month, expected = check_pointer(load_json(raw, where), where)
    else:
        month = parse_month(which)
        index = store.get_bytes(INDEX_KEY, limit=MAX_JSON_BYTES)
        where = f"{INDEX_KEY} at {store.description}"
        entries = check_index(load_json(index, where), where) if index is not None else {}
        if index is not None and month not in entries:
            published = ", ".join(entries) or "none"
            raise ReleaseError(f"release {month} is not published at {store.description} (published: {published})")
        expected = entries.get(month)
    raw = store.get_bytes(release_key(month, MANIFEST_NAME), limit=MAX_JSON_BYTES)
    if raw is None:
        raise ReleaseError(f"release {month} is not published at {store.description}")
    if expected is not None and sha256_hex(raw) != expected:
        raise ChecksumMismatch(
            f"{release_key(month, MANIFEST_NAME)} has sha256 {sha256_hex(raw)} but the index publishes {expected}"
        )
    where = f"{release_key(month, MANIFEST_NAME)} at {store.description}"
    manifest = load_json(raw, where)
    check_manifest(month, manifest, where)
    return month, raw, manifest


def select_files(manifest: dict, only: str | None) -> dict[str, dict]:
    files = manifest["files"]
    if only is None:
        return dict(files)
    if only not in ONLY_CHOICES:
        raise ReleaseError(f"--only must be one of {', '.join(ONLY_CHOICES)}, got {only!r}")
    return {name: meta for name, meta in files.items() if _part_of(name) == only}


def _part_of(name: str) -> str:
    """Which --only part a release file belongs to: the database, MIRAI's layout, or the split."""
    if name.startswith("database/"):
        return "database"
    if name.startswith(f"{MIRAI_BUNDLE_DIR}/"):
        return "mirai"
    return "split"


def download_release(
    store: ReleaseStore,
    which: str,
    dest: Path,
    *,
    only: str | None = None,
    workers: int = 8,
    durable: bool = False,
    bar: bool | None = None,
    log=lambda message: None,
) -> DownloadResult:
    """Download release ``which`` ("latest" or "YYYY-MM") into dest/YYYY-MM/, ``workers`` files
    at a time (each one stream: on a local S3 server one stream per file beat ranged parts);
    ``durable`` fsyncs every file and directory before the manifest is written."""
    month, raw_manifest, manifest = resolve_release(store, which)
    files = select_files(manifest, only)
    directory = path_inside(Path(dest), month)
    refuse_links(directory, [path_inside(directory, name) for name in files])
    result = DownloadResult(release=month, directory=directory)
    todo = {}
    for name, meta in sorted(files.items()):
        if _verified(directory / name, meta):
            result.already_verified.append(name)
        else:
            todo[name] = meta
    progress = ProgressBar(sum(meta["bytes"] for meta in todo.values()), enabled=bar)

    def fetch(name: str) -> int:
        progress.file(name)
        transferred = _fetch(store, release_key(month, name), directory / name, todo[name], progress, durable)
        log(f"verified {name} ({todo[name]['bytes']:,} bytes)")
        return transferred

    errors = []
    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        try:
            futures = {name: pool.submit(fetch, name) for name in todo}
            for name, future in futures.items():
                try:
                    result.bytes_downloaded += future.result()
                    result.downloaded.append(name)
                except Exception as exc:  # the other files still finish (and stay verified)
                    errors.append(exc)
        finally:
            progress.close()
        if errors:
            # A checksum mismatch is the error the user must see, whatever else went wrong.
            raise next((e for e in errors if isinstance(e, ChecksumMismatch)), errors[0])
        if durable:  # on disk before the manifest says so; the waits overlap on the pool's threads
            paths = [directory / name for name in files]
            folders = {folder for p in paths for folder in p.parents if folder.is_relative_to(directory)}
            list(pool.map(_fsync, paths + sorted(folders | {directory.parent})))
    atomic_write_bytes(directory / MANIFEST_NAME, raw_manifest)
    return result


def download_file(store: ReleaseStore, key: str, target: Path, meta: dict, *, bar: bool | None = None) -> int:
    """One file ``key`` into ``target``, as download_release fetches each of a release's: no link
    followed, streamed into a .part (resumed), renamed into place only once its size and sha256
    match ``meta`` (``{"sha256": hex, "bytes": n}``), else ChecksumMismatch and nothing kept.
    Returns the bytes transferred (0 when ``target`` was already verified)."""
    for path in (target, _part_path(target)):  # the directory is the user's choice (and may be a link)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or (path != target and st.st_nlink > 1):
            raise UnsafeRelease(f"{str(path)!r} is not a plain file: never written through; remove it and run again")
    if _verified(target, meta):
        return 0
    progress = ProgressBar(meta["bytes"], enabled=bar)
    try:
        progress.file(target.name)
        return _fetch(store, key, target, meta, progress, durable=False)
    finally:
        progress.close()


def _part_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.part")


def refuse_links(directory: Path, targets: list[Path]) -> None:
    """Refuse, before anything is written, a symbolic link (or anything but a directory or a
    regular file) wherever the download would write: dest/YYYY-MM, a directory under it, a
    file, its .part or manifest.json. The kernel follows a link anywhere in a path, so one there
    would send the files elsewhere; dest itself is the user's choice and may be a link. (Files
    are also opened with O_NOFOLLOW, and a .part with other hard links would write into them.)"""
    directories = {directory} | {p for t in targets for p in t.parents if p.is_relative_to(directory)}
    files = {directory / MANIFEST_NAME, *targets}
    parts = {_part_path(t) for t in targets}
    for path in sorted(directories | files | parts):
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: refused at its parent
            continue
        if stat.S_ISLNK(st.st_mode):
            found = f"a symbolic link to {shown(os.readlink(path))}"
        elif path in directories:
            found = None if stat.S_ISDIR(st.st_mode) else "not a directory"
        elif not stat.S_ISREG(st.st_mode):
            found = "not a regular file"
        else:
            found = f"a file with {st.st_nlink} hard links" if path in parts and st.st_nlink > 1 else None
        if found:
            raise UnsafeRelease(
                f"{str(path)!r} is {found}: mirai download never writes through one; "
                "remove it and run again (nothing was written)"
            )


def _open_file(path: Path, flags: int, mode: str):
    """open() that never follows a symbolic link at the last component (O_NOFOLLOW)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)  # as open(): the umask applies
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRelease(f"{str(path)!r} became a symbolic link during the download; refused") from exc
        raise
    return os.fdopen(fd, mode)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verified(path: Path, meta: dict) -> bool:
    try:
        if os.lstat(path).st_size != meta["bytes"]:
            return False
    except FileNotFoundError:
        return False
    with _open_file(path, os.O_RDONLY, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest() == meta["sha256"]


def _fetch(store: ReleaseStore, key: str, target: Path, meta: dict, progress: ProgressBar, durable: bool) -> int:
    """Stream key into target's .part (resuming it), verify, rename. Returns bytes transferred."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = _part_path(target)
    transferred = 0
    while True:
        digest, offset = _resume(part, meta["bytes"])
        resumed = offset > 0
        progress(offset)
        writeback = WRITEBACK if durable else None
        transferred += _stream(store, key, part, offset, meta["bytes"], digest, progress, writeback)
        size = part.stat().st_size
        if size == meta["bytes"] and digest.hexdigest() == meta["sha256"]:
            os.replace(part, target)
            return transferred
        part.unlink()
        if not resumed:
            raise ChecksumMismatch(
                f"{key}: got {size:,} bytes with sha256 {digest.hexdigest()}, the manifest says {meta['bytes']:,} bytes "
                f"with sha256 {meta['sha256']}; the published copy is corrupt or was replaced (nothing was kept)"
            )
        # The bad bytes may be the earlier run's: start this file over once before failing.
        progress(-size)


def _resume(part: Path, expected: int) -> tuple[hashlib._Hash, int]:
    """The sha256 state and length of an earlier run's partial file (discarded if too long)."""
    digest = hashlib.sha256()
    try:
        size = os.lstat(part).st_size
    except FileNotFoundError:
        return digest, 0
    if size > expected:
        part.unlink()
        return digest, 0
    with _open_file(part, os.O_RDONLY, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
        return digest, fh.tell()


def _stream(
    store: ReleaseStore, key: str, part: Path, offset: int, expected: int, digest, progress, writeback: int | None
) -> int:
    """Append key's bytes from ``offset`` to part, hashing them; with ``writeback``, start writing
    every that many bytes to disk as they arrive (for a durable download's final fsync)."""
    from botocore.exceptions import BotoCoreError

    written = 0
    with _open_file(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "ab") as fh:
        flushing = offset  # bytes before this are already on their way to the disk
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            try:
                for chunk in store.read_from(key, offset + written):
                    # More bytes than the manifest says: stop; the size check rejects the file.
                    chunk = chunk[: expected + 1 - offset - written]
                    write_all(fh, chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    progress(len(chunk))
                    if writeback and offset + written - flushing >= writeback:
                        fh.flush()
                        flushing = _start_writeback(fh.fileno(), flushing, offset + written)
                    if offset + written > expected:
                        break
                return written
            except (BotoCoreError, OSError) as exc:
                fh.flush()
                if attempt == STREAM_ATTEMPTS:
                    raise ReleaseError(f"{key}: transfer kept failing ({exc}); run again to resume") from exc
    return written


def _start_writeback(fd: int, start: int, end: int) -> int:
    """Start (not wait for) writing bytes start..end of fd to disk; returns end. On Linux,
    POSIX_FADV_DONTNEED starts writeback of dirty pages and evicts only pages already clean, so
    the file stays cached; elsewhere it is a no-op and fsync does all the work."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
    return end
