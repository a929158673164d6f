"""Release stores: where releases are published and read, behind one interface (``ReleaseStore``,
with the objects it hands over) that pipeline.release.publish, pipeline.release.download, live
rounds and submissions use, and the local directory store (``LocalStore``, the embedded default).
S3 and any S3-compatible store: pipeline.release.s3_store; the one MIRAI_RELEASE_URI names:
pipeline.release.store_uri.

Nothing a store writes is unverified: a file goes up with the sha256 its plan holds (per part for
a multipart upload), which S3 checks on receipt and the local store while copying, and a local
object is hard-linked into place, so nothing is overwritten. Every read may meet a hostile store:
a local key is checked against the layout and no link is followed, and a bounded read stops past
its limit. Layout, checksums and threat model: docs/releases.md.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import os
import stat as stat_mode
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from pipeline.release.layout import (
    RELEASES_DIR,
    ReleaseError,
    UnsafeRelease,
    check_store_key,
    is_month,
    path_inside,
)
from pipeline.storage import atomic_write_bytes, temp_path_for, write_all

CONTENT_TYPES = {
    ".parquet": "application/vnd.apache.parquet",
    ".json": "application/json",
    ".jsonl": "application/jsonl",  # live rounds' questions and answers (docs/live.md)
    ".md": "text/markdown; charset=utf-8",
    ".png": "image/png",
    ".html": "text/html; charset=utf-8",  # the leaderboard page (pipeline/evaluation/board_files.py)
    # MIRAI's files (mirai/data/, pipeline/splits/mirai_files.py): its ".csv" files are tab-separated.
    ".csv": "text/tab-separated-values; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
CHUNK = 1 << 20

Progress = Callable[[int], None]
# Both stores' advice when a file's bytes no longer match the sha256 its plan holds.
CHANGED_SINCE_HASHED = (
    "changed since it was hashed or its sha256 recorded (damaged or rewritten): rebuild it "
    "(materialise its partition again), then publish again"
)


class ReleaseNotReady(ReleaseError):
    """The month's split or event database is not built (or changed since its manifest)."""


class ObjectTooLarge(UnsafeRelease):
    """An object read with a limit (``get_bytes``) holds more bytes than the limit allows."""


def content_type(name: str) -> str:
    return CONTENT_TYPES.get(Path(name).suffix, "application/octet-stream")


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    sha256: str | None  # hex; None when the store cannot vouch for the content
    modified: datetime
    composite: str | None = None  # S3's "<base64>-<parts>" checksum of a multipart upload


@dataclass(frozen=True)
class ListedKey:
    key: str  # relative to the store's root
    size: int
    modified: datetime
    problem: str | None = None  # why it is not a plain object (a link, a directory, a special file)
    # Uploaded in parts (S3: an ETag "<md5>-<parts>"). A store may date such an object by when its
    # upload began, not when its last byte came (pipeline/live/submissions.py).
    multipart: bool = False


@dataclass(frozen=True)
class Listing:
    keys: list[ListedKey]  # in key order (S3's: by the key's UTF-8 bytes)
    truncated: bool  # more keys follow: list again with start_after=keys[-1].key


# One file of a release as planned (pipeline.release.publish): what ``put_files`` stores, checked
# against its sha256 (and each part's) on the way in.
@dataclass(frozen=True)
class PlannedObject:
    name: str  # key relative to releases/YYYY-MM/
    path: Path | None  # None: ``content`` holds the bytes
    sha256: str
    size: int
    part_size: int | None  # None: one PUT
    part_sha256: tuple[bytes, ...]  # SHA-256 of each part, sent with it and checked by S3
    rows: int | None = None
    # A small file made while publishing (croissant.json), held in memory: publishing writes
    # nothing into the data directory.
    content: bytes | None = None

    def open(self) -> BinaryIO:
        return io.BytesIO(self.content) if self.content is not None else open(self.path, "rb")

    @property
    def composite(self) -> str | None:
        """The checksum S3 reports for this file's multipart upload: base64(sha256(part digests))-N."""
        if self.part_size is None:
            return None
        return (
            f"{base64.b64encode(hashlib.sha256(b''.join(self.part_sha256)).digest()).decode()}-{len(self.part_sha256)}"
        )

    def entry(self) -> dict:
        entry = {"sha256": self.sha256, "bytes": self.size, "content_type": content_type(self.name)}
        if self.rows is not None:
            entry["rows"] = self.rows
        return entry


class ReleaseStore(ABC):
    """Keys are relative to the store's root ("releases/2024-02/queries.parquet")."""

    description: str  # where, for logs and metadata: never credentials

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None: ...

    @abstractmethod
    def put_files(
        self, files: Iterable[tuple[str, PlannedObject]], *, cache_control: str, progress: Progress | None
    ) -> None:
        """Store each (key, planned file), starting on each as soon as ``files`` yields it; the
        store checks the bytes against the plan's sha256 (per part for a multipart upload) and
        rejects a mismatch, so nothing unverified lands."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, cache_control: str, if_absent: bool) -> bool:
        """Write a small object; with if_absent, only if nothing is there (False if something was)."""

    @abstractmethod
    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes | None:
        """The object's bytes, None when there is none; with ``limit``, UnsafeRelease as soon as
        more than ``limit`` bytes arrive (a hostile store may serve a pointer of any size)."""

    @abstractmethod
    def read_from(self, key: str, offset: int) -> Iterator[bytes]:
        """The object's bytes from offset to the end (an HTTP Range request on S3)."""

    @abstractmethod
    def release_months(self) -> list[str]:
        """Months with a directory under releases/ (published or not), sorted."""

    @abstractmethod
    def list_keys(self, prefix: str, *, max_keys: int, start_after: str = "") -> Listing:
        """At most ``max_keys`` keys under ``prefix`` (ending in "/"), after ``start_after``, each
        with its size; nothing is followed or read (a link in a local store is listed, with its
        problem, never entered)."""

    @abstractmethod
    def public_url(self, key: str) -> str:
        """An address of the key for logs and metadata (it may name a local endpoint or directory)."""

    _public = ""  # MIRAI_RELEASE_PUBLIC_URL without its trailing slash; "" when not configured

    def configured_url(self, key: str) -> str | None:
        """The key's URL under MIRAI_RELEASE_PUBLIC_URL, or None when none is configured: index files
        carry only addresses that stay valid, never an endpoint's that may be gone tomorrow (the
        demo's S3 server listens on a new port each run)."""
        return f"{self._public}/{quote(key, safe='/=')}" if self._public else None

    def abort_unfinished_uploads(self, prefix: str) -> list[str]:
        """Abort every upload still open under ``prefix``: what a killed run leaves behind (S3
        keeps, and bills, the parts of a multipart upload until it is completed or aborted).
        Returns their keys; a store without such uploads has none."""
        return []


class LocalStore(ReleaseStore):
    """The embedded default: a directory with the bucket's layout. A file is copied to a temp file
    in the target directory while hashed, checked against its expected sha256, fsynced, then
    hard-linked into place: link() fails if the name exists, so nothing is ever overwritten."""

    def __init__(self, root: Path, public_url: str = ""):
        self.root = Path(root).resolve()
        self.description = f"local directory {self.root}"
        self._public = public_url.rstrip("/")

    def _path(self, key: str) -> Path:
        # The same layout check as mirai download's: no key reaches outside releases/YYYY-MM/ (or
        # submissions/<name>/), and no directory on the way is a link leading out of the store
        # (whoever uploads submissions may be able to make one).
        path = path_inside(self.root, check_store_key(key))
        if not Path(os.path.realpath(path.parent)).is_relative_to(self.root):
            raise UnsafeRelease(f"{key} at {self.description}: a directory on its path is a link out of the store")
        return path

    def _open(self, key: str):
        """The key's file opened for reading, None when there is none; a link or anything but a
        regular file is refused (UnsafeRelease), never followed."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeRelease(f"{key} at {self.description} is a symbolic link; refused") from None
            raise
        fh = os.fdopen(fd, "rb")
        if not stat_mode.S_ISREG(os.fstat(fd).st_mode):
            fh.close()
            raise UnsafeRelease(f"{key} at {self.description} is not a regular file; refused")
        return fh

    def stat(self, key: str) -> ObjectInfo | None:
        fh = self._open(key)
        if fh is None:
            return None
        with fh:
            st = os.fstat(fh.fileno())
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        return ObjectInfo(size=st.st_size, sha256=digest, modified=datetime.fromtimestamp(st.st_mtime, UTC))

    def put_files(
        self, files: Iterable[tuple[str, PlannedObject]], *, cache_control: str, progress: Progress | None
    ) -> None:
        for key, obj in files:
            self._put_file(key, obj, progress)

    def _put_file(self, key: str, obj: PlannedObject, progress: Progress | None) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path_for(target)
        try:
            digest = hashlib.sha256()
            with obj.open() as src, open(temp, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    write_all(dst, chunk)
                    if progress:
                        progress(len(chunk))
            if digest.hexdigest() != obj.sha256:
                raise ReleaseNotReady(
                    f"{obj.path}: {CHANGED_SINCE_HASHED} (its bytes' sha256 {digest.hexdigest()}, expected {obj.sha256})"
                )
            self._link(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes, *, cache_control: str, if_absent: bool) -> bool:
        target = self._path(key)
        if not if_absent:
            atomic_write_bytes(target, data)
            return True
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path_for(target)
        try:
            temp.write_bytes(data)
            return self._link(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    @staticmethod
    def _link(temp: Path, target: Path) -> bool:
        with open(temp, "rb") as fh:
            os.fsync(fh.fileno())
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes | None:
        fh = self._open(key)
        if fh is None:
            return None
        with fh:
            return read_bounded(fh, key, limit, self.description)

    def read_from(self, key: str, offset: int) -> Iterator[bytes]:
        fh = self._open(key)
        if fh is None:
            raise ReleaseError(f"{key} is listed in the manifest but missing from {self.description}")
        with fh:
            fh.seek(offset)
            while chunk := fh.read(CHUNK):
                yield chunk

    def release_months(self) -> list[str]:
        base = self.root / RELEASES_DIR
        return sorted(p.name for p in base.iterdir() if p.is_dir() and is_month(p.name)) if base.is_dir() else []

    def list_keys(self, prefix: str, *, max_keys: int, start_after: str = "") -> Listing:
        # Directories are walked in S3's key order (a directory sorts as its name plus "/"), so
        # start_after pages through as on S3; a link is listed with its problem, never entered.
        base = path_inside(self.root, prefix.rstrip("/"))
        if not Path(os.path.realpath(base.parent)).is_relative_to(self.root):
            raise UnsafeRelease(f"{prefix} at {self.description}: a directory on its path is a link out of the store")
        found: list[ListedKey] = []

        def walk(directory: Path, key_prefix: str) -> bool:  # False once max_keys + 1 are found
            try:
                with os.scandir(directory) as entries:
                    ordered = sorted(entries, key=lambda e: e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
            except (FileNotFoundError, NotADirectoryError):
                return True
            for entry in ordered:
                key = key_prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if (key + "/" > start_after or start_after.startswith(key + "/")) and not walk(
                        Path(entry.path), key + "/"
                    ):
                        return False
                    continue
                if key <= start_after:
                    continue
                st = entry.stat(follow_symlinks=False)
                problem = (
                    None
                    if stat_mode.S_ISREG(st.st_mode)
                    else "a symbolic link"
                    if stat_mode.S_ISLNK(st.st_mode)
                    else "not a regular file"
                )
                found.append(ListedKey(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC), problem))
                if len(found) > max_keys:
                    return False
            return True

        if base.is_symlink():
            return Listing([ListedKey(prefix.rstrip("/"), 0, datetime.now(UTC), "a symbolic link")], False)
        walk(base, prefix)
        return Listing(found[:max_keys], len(found) > max_keys)

    def public_url(self, key: str) -> str:
        return f"{self._public}/{quote(key, safe='/=')}" if self._public else self._path(key).as_uri()


def read_bounded(fh, key: str, limit: int | None, where: str) -> bytes:
    """fh's bytes up to the end, refused past ``limit``. Read to the empty read at the end, where
    botocore checks the object's checksum (ChecksumMode)."""
    chunks, size = [], 0
    while chunk := fh.read(CHUNK):
        size += len(chunk)
        if limit is not None and size > limit:
            raise ObjectTooLarge(f"{key} at {where} is over {limit:,} bytes; refused, nothing was written")
        chunks.append(chunk)
    return b"".join(chunks)
