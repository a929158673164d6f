"""Monthly releases: a closed month's split, event database snapshot, manifest and dataset card,
published once and never changed, to S3 (any S3-compatible store) or a local directory.

One publish algorithm runs against both stores: plan (hashing only files without a recorded
sha256), refuse if anything already at a release key differs (releases are immutable), upload what
is missing with a checksum the store verifies, write the manifest last, then index.json and
latest.json. Every step is a no-op when already done, so a crashed run is completed by the next
one, and a reader only ever reaches releases whose manifest (hence every file) is in place. Layout
and each step in detail: docs/releases.md.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import stat as stat_mode
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from urllib.parse import quote, urlparse

from pipeline.config import Settings
from pipeline.release.layout import (
    CARD_NAME,
    INDEX_KEY,
    LATEST_KEY,
    LEADERBOARD_KEYS,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    RELEASE_FORMAT,
    RELEASES_DIR,
    ReleaseError,
    UnsafeRelease,
    check_manifest,
    check_name,
    check_store_key,
    is_month,
    load_json,
    path_inside,
    release_key,
)
from pipeline.storage import DataLayout, FileDigest, atomic_write_bytes, recorded_digest, temp_path_for, write_all

INDEX_FORMAT = "mirai-release-index-v1"
CONTENT_TYPES = {
    ".parquet": "application/vnd.apache.parquet",
    ".json": "application/json",
    ".jsonl": "application/jsonl",  # live rounds' questions and answers (docs/live.md)
    ".md": "text/markdown; charset=utf-8",
    ".png": "image/png",
    ".html": "text/html; charset=utf-8",  # the leaderboard page (pipeline/evaluation/board.py)
    # MIRAI's files (mirai/data/, pipeline/splits/mirai_files.py): its ".csv" files are tab-separated.
    ".csv": "text/tab-separated-values; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
# Release objects never change, so caches and CDNs may keep them forever; the two pointers
# (index.json, latest.json) move with every release and must be revalidated.
IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
POINTER_CACHE = "no-cache"
CHUNK = 1 << 20

Progress = Callable[[int], None]
_CHANGED = (
    "changed since it was hashed or its sha256 recorded (damaged or rewritten): rebuild it "
    "(materialise its partition again), then publish again"
)


class ReleaseNotReady(ReleaseError):
    """The month's split or event database is not built (or changed since its manifest)."""


class ReleaseConflict(ReleaseError):
    """The store already holds different bytes at a key of this release: nothing is overwritten."""


class ObjectTooLarge(UnsafeRelease):
    """An object read with a limit (``get_bytes``) holds more bytes than the limit allows."""


def content_type(name: str) -> str:
    return CONTENT_TYPES.get(Path(name).suffix, "application/octet-stream")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- stores -------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Listing:
    keys: list[ListedKey]  # in key order (S3's: by the key's UTF-8 bytes)
    truncated: bool  # more keys follow: list again with start_after=keys[-1].key


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
            self._put_file(key, obj.path, obj.sha256, progress)

    def _put_file(self, key: str, path: Path, sha256: str, progress: Progress | None) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path_for(target)
        try:
            digest = hashlib.sha256()
            with open(path, "rb") as src, open(temp, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    write_all(dst, chunk)
                    if progress:
                        progress(len(chunk))
            if digest.hexdigest() != sha256:
                raise ReleaseNotReady(f"{path}: {_CHANGED} (its bytes' sha256 {digest.hexdigest()}, expected {sha256})")
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
            return _read_bounded(fh, key, limit, self.description)

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


class S3Store(ReleaseStore):
    """s3://bucket/prefix through boto3. Credentials come from the standard AWS chain (environment,
    profile, instance role); ``signed=False`` reads a public bucket anonymously."""

    def __init__(self, bucket: str, prefix: str, settings: Settings, *, signed: bool = True):
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = settings.s3_endpoint_url.rstrip("/")
        session = boto3.session.Session(region_name=settings.s3_region or None)
        self.region = session.region_name or "us-east-1"
        # S3-compatible stores (SeaweedFS, MinIO, Ceph) rarely have per-bucket DNS names.
        s3 = {"addressing_style": "path"} if self.endpoint else {}
        config = Config(
            signature_version=UNSIGNED if not signed else None,
            retries={"max_attempts": settings.s3_max_attempts, "mode": "standard"},
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            max_pool_connections=settings.release_concurrency + 2,
            s3=s3,
            # botocore would SHA-256 every downloaded file a second time (a single-PUT object has a
            # full-object checksum); read_from's bytes are checked against the manifest instead,
            # and get_bytes asks for botocore's check itself (ChecksumMode).
            response_checksum_validation="when_required",
        )
        self.client = session.client("s3", region_name=self.region, endpoint_url=self.endpoint or None, config=config)
        # For the PUTs whose body carries its x-amz-checksum-sha256 (a signed header the server
        # verifies), SigV4 need not hash the payload as well: botocore already sends
        # UNSIGNED-PAYLOAD for them over HTTPS, but over plain HTTP (a local endpoint) it would
        # SHA-256 every byte once more, and the server too.
        self._checksummed = session.client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint or None,
            config=config.merge(Config(s3={**s3, "payload_signing_enabled": False})),
        )
        self.concurrency = settings.release_concurrency
        self._public = settings.release_public_url.rstrip("/")
        where = f"endpoint {self.endpoint}" if self.endpoint else f"AWS {self.region}"
        self.description = f"s3://{self.bucket}/{self.prefix} ({where}{'' if signed else ', anonymous'})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def stat(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _explain(exc, self.description) from exc
        checksum = head.get("ChecksumSHA256") or ""
        composite = checksum if "-" in checksum else None
        # A single PUT carries the server-verified SHA-256 of the whole object; a multipart upload
        # only a checksum of its parts' checksums, so it also carries our sha256 as metadata.
        digest = (
            base64.b64decode(checksum).hex() if checksum and not composite else head.get("Metadata", {}).get("sha256")
        )
        return ObjectInfo(size=head["ContentLength"], sha256=digest, modified=head["LastModified"], composite=composite)

    def put_files(
        self, files: Iterable[tuple[str, PlannedObject]], *, cache_control: str, progress: Progress | None
    ) -> None:
        """Every PUT and part of every file shares one pool of MIRAI_RELEASE_CONCURRENCY requests,
        and a file's requests start as soon as ``files`` yields it (while later files are still
        being hashed). Each request carries the plan's SHA-256 (of the object, recorded or computed,
        or of the part), so the server verifies the bytes against the manifest itself and the
        client hashes nothing twice (boto3's transfer manager would hash every byte again)."""
        uploads: dict[str, str] = {}  # key -> multipart UploadId
        pending: dict[str, list] = {}  # key -> the futures of its parts
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                try:
                    for key, obj in files:
                        pending[key] = [
                            pool.submit(*task, progress) for task in self._tasks(key, obj, cache_control, uploads)
                        ]
                    for key, futures in pending.items():
                        parts = [future.result() for future in futures]
                        if key in uploads:
                            self._call(
                                "complete_multipart_upload",
                                Bucket=self.bucket,
                                Key=self._key(key),
                                UploadId=uploads.pop(key),
                                MultipartUpload={"Parts": parts},
                            )
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # a failed run sends nothing more
                    raise
        finally:
            for key, upload_id in uploads.items():  # a failed run: free the parts already stored
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
                except Exception:
                    pass

    def _tasks(self, key: str, obj: PlannedObject, cache_control: str, uploads: dict[str, str]) -> list[tuple]:
        """The requests that store one file: one PUT, or (after creating its multipart upload,
        recorded in ``uploads``) one per part, in part order."""
        head = {"ContentType": content_type(key), "CacheControl": cache_control, "Metadata": {"sha256": obj.sha256}}
        if obj.part_size is None:
            return [(self._put_whole, key, obj, head)]
        created = self._call(
            "create_multipart_upload", Bucket=self.bucket, Key=self._key(key), ChecksumAlgorithm="SHA256", **head
        )
        uploads[key] = created["UploadId"]
        return [(self._put_part, key, obj, (uploads[key], n)) for n in range(len(obj.part_sha256))]

    def _put_whole(self, key: str, obj: PlannedObject, head: dict, progress: Progress | None) -> None:
        # Streamed from the file (up to the multipart threshold, times the concurrency, would
        # otherwise sit in memory); botocore rewinds it for a retry.
        with open(obj.path, "rb") as body:
            self._call(
                "put_object",
                self._checksummed,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=body,
                ChecksumSHA256=base64.b64encode(bytes.fromhex(obj.sha256)).decode(),
                **head,
            )
        if progress:
            progress(obj.size)

    def _put_part(self, key: str, obj: PlannedObject, upload: tuple[str, int], progress: Progress | None) -> dict:
        upload_id, n = upload
        with open(obj.path, "rb") as fh:
            body = os.pread(fh.fileno(), obj.part_size, n * obj.part_size)
        checksum = base64.b64encode(obj.part_sha256[n]).decode()
        response = self._call(
            "upload_part",
            self._checksummed,
            Bucket=self.bucket,
            Key=self._key(key),
            UploadId=upload_id,
            PartNumber=n + 1,
            Body=body,
            ChecksumSHA256=checksum,
        )
        if progress:
            progress(len(body))
        return {"PartNumber": n + 1, "ETag": response["ETag"], "ChecksumSHA256": checksum}

    def _call(self, operation: str, client=None, **kwargs) -> dict:
        from botocore.exceptions import ClientError

        try:
            return getattr(client or self.client, operation)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"):
                raise ReleaseNotReady(
                    f"{kwargs['Key']}: the store rejected the bytes sent as not matching their "
                    f"sha256: the local file {_CHANGED}"
                ) from exc
            raise _explain(exc, self.description) from exc

    def put_bytes(self, key: str, data: bytes, *, cache_control: str, if_absent: bool) -> bool:
        from botocore.exceptions import ClientError

        digest = hashlib.sha256(data)
        args = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "Body": data,
            "ChecksumSHA256": base64.b64encode(digest.digest()).decode(),
            "ContentType": content_type(key),
            "CacheControl": cache_control,
            "Metadata": {"sha256": digest.hexdigest()},
        }
        if if_absent:
            args["IfNoneMatch"] = "*"  # conditional write: two publishers cannot both commit a month
        try:
            self._checksummed.put_object(**args)
        except ClientError as exc:
            if _status(exc) in (409, 412):
                return False
            raise _explain(exc, self.description) from exc
        return True

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")["Body"]
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _explain(exc, self.description) from exc
        with body:
            return _read_bounded(body, key, limit, self.description)

    def read_from(self, key: str, offset: int) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        args = {"Bucket": self.bucket, "Key": self._key(key)}
        if offset:
            args["Range"] = f"bytes={offset}-"
        try:
            body = self.client.get_object(**args)["Body"]
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def release_months(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(RELEASES_DIR) + "/", Delimiter="/"
        )
        names = (p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for page in pages for p in page.get("CommonPrefixes", []))
        return sorted(n for n in names if is_month(n))

    def list_keys(self, prefix: str, *, max_keys: int, start_after: str = "") -> Listing:
        from botocore.exceptions import ClientError

        args = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after:
            args["StartAfter"] = self._key(start_after)
        pages = self.client.get_paginator("list_objects_v2").paginate(
            **args, PaginationConfig={"MaxItems": max_keys + 1, "PageSize": min(1000, max_keys + 1)}
        )
        strip = len(self._key(""))
        try:
            found = [
                ListedKey(item["Key"][strip:], item["Size"], item["LastModified"])
                for page in pages
                for item in page.get("Contents", [])
            ]
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        return Listing(found[:max_keys], len(found) > max_keys)

    def abort_unfinished_uploads(self, prefix: str) -> list[str]:
        from botocore.exceptions import ClientError

        aborted = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix)
            )
            for upload in (u for page in pages for u in page.get("Uploads", [])):
                try:
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                except ClientError as exc:
                    if _status(exc) != 404:  # NoSuchUpload: completed or aborted by another run meanwhile
                        raise
                aborted.append(upload["Key"].removeprefix(self._key("")))
        except ClientError as exc:
            raise _explain(exc, self.description) from exc
        return aborted

    def public_url(self, key: str) -> str:
        if self._public:
            base = self._public
        elif self.endpoint:
            base = f"{self.endpoint}/{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        else:
            base = f"https://{self.bucket}.s3.{self.region}.amazonaws.com" + (f"/{self.prefix}" if self.prefix else "")
        return f"{base}/{quote(key, safe='/=')}"


def _read_bounded(fh, key: str, limit: int | None, where: str) -> bytes:
    """fh's bytes up to the end, refused past ``limit``. Read to the empty read at the end, where
    botocore checks the object's checksum (ChecksumMode)."""
    chunks, size = [], 0
    while chunk := fh.read(CHUNK):
        size += len(chunk)
        if limit is not None and size > limit:
            raise ObjectTooLarge(f"{key} at {where} is over {limit:,} bytes; refused, nothing was written")
        chunks.append(chunk)
    return b"".join(chunks)


def _status(exc) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _explain(exc, where: str) -> ReleaseError:
    code = exc.response.get("Error", {}).get("Code", "")
    if _status(exc) == 403:
        return ReleaseError(
            f"access denied by {where} ({code}): a private bucket needs credentials from the AWS chain "
            "(and MIRAI_RELEASE_SIGNED_DOWNLOAD=1 or --signed for `mirai download`)"
        )
    return ReleaseError(f"{where}: {code or _status(exc)}: {exc}")


def open_store(settings: Settings, *, uri: str | None = None, signed: bool = True) -> ReleaseStore:
    """The store MIRAI_RELEASE_URI names: s3://bucket/prefix, file:///path or a path; empty means
    <data_dir>/releases-bucket."""
    uri = uri if uri is not None else settings.release_uri
    if not uri:
        return LocalStore(settings.data_dir / "releases-bucket", settings.release_public_url)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: expected s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path, settings, signed=signed)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path), settings.release_public_url)
    if parsed.scheme:
        raise ReleaseError(f"MIRAI_RELEASE_URI={uri!r}: only s3://, file:// and plain paths are supported")
    return LocalStore(Path(uri), settings.release_public_url)


# --- planning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedObject:
    name: str  # key relative to releases/YYYY-MM/
    path: Path
    sha256: str
    size: int
    part_size: int | None  # None: one PUT
    part_sha256: tuple[bytes, ...]  # SHA-256 of each part, sent with it and checked by S3
    rows: int | None = None

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


@dataclass(frozen=True)
class ReleasePlan:
    month: str
    objects: list[PlannedObject]
    manifest: dict
    manifest_bytes: bytes

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)


MAX_PARTS = 10_000  # S3's limit per multipart upload
MIN_PART = 5 * 2**20  # S3's smallest part (but the last)


def _part_size(settings: Settings, size: int) -> int | None:
    """The part size of a file's multipart upload (whole MiB, at least 5 MiB, at most 10,000
    parts), or None below the threshold: one PUT."""
    if size < settings.release_multipart_threshold_mb * 2**20:
        return None
    wanted = max(settings.release_multipart_chunk_mb * 2**20, MIN_PART, -(-size // MAX_PARTS))
    return -(-wanted // CHUNK) * CHUNK


def _digest(path: Path, part_size: int | None) -> tuple[str, int, tuple[bytes, ...]]:
    """sha256, size and the SHA-256 of each part of a multipart upload, in one read of the file."""
    whole = hashlib.sha256()
    parts: list[bytes] = []
    size = 0
    step = min(CHUNK, part_size) if part_size else CHUNK
    part = hashlib.sha256()
    in_part = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(step):
            whole.update(chunk)
            size += len(chunk)
            if part_size:
                part.update(chunk)
                in_part += len(chunk)
                if in_part == part_size:
                    parts.append(part.digest())
                    part, in_part = hashlib.sha256(), 0
    if part_size and in_part:
        parts.append(part.digest())
    return whole.hexdigest(), size, tuple(parts)


@dataclass(frozen=True)
class SourceFile:
    """A local file of a release, with the sha256 and size recorded when it was written (the
    split's manifest, or a sealed file's digest) when there is one."""

    name: str  # key relative to releases/YYYY-MM/
    path: Path
    rows: int | None = None
    recorded: FileDigest | None = None
    recorded_in: str = ""  # where ``recorded`` comes from, for messages

    def not_as_recorded(self, found: str, recorded: str) -> ReleaseNotReady:
        return ReleaseNotReady(
            f"{self.path} no longer matches {self.recorded_in} ({found}, recorded {recorded}): "
            "rebuild it (materialise its partition again)"
        )


def _planned(source: SourceFile, settings: Settings) -> PlannedObject:
    """The file's upload plan. A file of one PUT with a recorded sha256 is not read: the PUT
    carries that sha256, so the store itself refuses bytes that changed since (S3 answers
    BadDigest, the local store compares while copying), and a publish does not re-read a
    snapshot of several GB that was hashed as it was written. Any other file is hashed (a
    multipart upload needs each part's SHA-256) and checked against its recorded digest."""
    name, path, recorded = source.name, source.path, source.recorded
    size = path.stat().st_size
    if recorded is not None and recorded.bytes != size:
        raise source.not_as_recorded(f"{size} bytes", f"{recorded.bytes}")
    part_size = _part_size(settings, size)
    if recorded is not None and part_size is None:
        return PlannedObject(
            name=name, path=path, sha256=recorded.sha256, size=size, part_size=None, part_sha256=(), rows=source.rows
        )
    digest, size, parts = _digest(path, part_size)
    if recorded is not None and digest != recorded.sha256:
        raise source.not_as_recorded(f"sha256 {digest}", recorded.sha256)
    return PlannedObject(
        name=name, path=path, sha256=digest, size=size, part_size=part_size, part_sha256=parts, rows=source.rows
    )


@dataclass(frozen=True)
class ReleaseSources:
    """What a month's release is made of, before any file is read."""

    month: str
    split_manifest: dict
    database_months: list[str]
    files: list[SourceFile]  # the split's files first


def release_sources(month: date, settings: Settings) -> ReleaseSources:
    layout = DataLayout(settings.data_dir)
    month = month.replace(day=1)
    label = f"{month:%Y-%m}"
    split_dir = layout.split_dir(month)
    manifest_path = split_dir / MANIFEST_NAME
    if not manifest_path.exists():
        raise ReleaseNotReady(f"{label}: no test split at {split_dir}; materialise test_split first")
    split_manifest = json.loads(manifest_path.read_text())
    months = _database_months(layout, month)
    files = [
        SourceFile(
            name, split_dir / name, meta.get("rows"), FileDigest(meta["sha256"], meta["bytes"]), "its split manifest"
        )
        for name, meta in sorted(split_manifest["files"].items())
    ]
    files.append(SourceFile(CARD_NAME, split_dir / CARD_NAME))
    for m in months:
        for table in ("events", "news"):
            path = layout.database_path(table, date.fromisoformat(f"{m}-01"))
            digest = recorded_digest(layout, path)
            files.append(
                SourceFile(
                    f"database/{table}/{path.name}",
                    path,
                    recorded=digest,
                    recorded_in=f"its digest {layout.digest_path(path)}" if digest else "",
                )
            )
    for source in files:  # the names mirai download accepts, checked before any file is read
        check_name(label, source.name, f"release {label} as planned from {split_dir}")
    missing = [str(f.path) for f in files if not f.path.exists()]
    if missing:
        raise ReleaseNotReady(f"{label}: {len(missing)} file(s) of the release are missing: {', '.join(missing[:5])}")
    return ReleaseSources(month=label, split_manifest=split_manifest, database_months=months, files=files)


def plan_files(sources: ReleaseSources, settings: Settings) -> Iterator[PlannedObject]:
    """Each file planned (see _planned), in the sources' order, as soon as it is (so uploads can
    start while later files are still read); raises when a file no longer matches its recorded
    sha256 or size."""
    # Hashing is most of a publish's own CPU time; hashlib and file reads release the GIL.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        yield from pool.map(lambda source: _planned(source, settings), sources.files)


def build_plan(sources: ReleaseSources, objects: list[PlannedObject]) -> ReleasePlan:
    """The release's manifest: a pure function of its files, so re-planning an unchanged month
    gives the same bytes."""
    manifest = {
        "format": RELEASE_FORMAT,
        "release": sources.month,
        # Where the data come from (GDELT's feed, or generated data): the split's own record.
        "source": sources.split_manifest.get("source", "not recorded (split built before sources were recorded)"),
        "database_months": sources.database_months,
        "split": sources.split_manifest,
        "files": {o.name: o.entry() for o in objects},
    }
    check_manifest(sources.month, manifest, f"the manifest planned for release {sources.month}")
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    return ReleasePlan(month=sources.month, objects=objects, manifest=manifest, manifest_bytes=data)


def plan_release(month: date, settings: Settings) -> ReleasePlan:
    """Plan every file of the month's release (see _planned) and build its manifest."""
    sources = release_sources(month, settings)
    return build_plan(sources, list(plan_files(sources, settings)))


def _database_months(layout: DataLayout, month: date) -> list[str]:
    """Every month up to and including the release month with an event database: the snapshot an
    agent answering this month's queries may search."""
    events_dir = layout.database_dir() / "events"
    found = (
        sorted(p.stem.removeprefix("month=") for p in events_dir.glob("month=*.parquet")) if events_dir.is_dir() else []
    )
    months = [m for m in found if is_month(m) and m <= f"{month:%Y-%m}"]
    if f"{month:%Y-%m}" not in months:
        raise ReleaseNotReady(f"{month:%Y-%m}: no event database at {layout.database_path('events', month)}")
    missing = [m for m in months if not layout.database_path("news", date.fromisoformat(f"{m}-01")).exists()]
    if missing:
        raise ReleaseNotReady(f"event database months {', '.join(missing)} have no news table; rebuild them")
    return months


# --- publishing ---------------------------------------------------------------------------------


@dataclass
class PublishResult:
    month: str
    store: str
    manifest_sha256: str
    manifest_url: str
    uploaded: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    manifest_written: bool = False
    index_written: bool = False
    latest_written: bool = False
    aborted_uploads: list[str] = field(default_factory=list)  # keys of uploads killed runs left open

    @property
    def changed(self) -> bool:
        return bool(self.uploaded or self.manifest_written or self.index_written or self.latest_written)


def _matches(info: ObjectInfo, obj: PlannedObject) -> bool:
    if info.size != obj.size or info.sha256 != obj.sha256:
        return False
    # The composite checksum is the server's, from the parts it verified; compare it when the part
    # counts agree (a different MIRAI_RELEASE_MULTIPART_CHUNK_MB since the upload changes them).
    if info.composite and obj.composite and info.composite.rsplit("-", 1)[1] == obj.composite.rsplit("-", 1)[1]:
        return info.composite == obj.composite
    return True


def publish_release(
    month: date,
    settings: Settings,
    store: ReleaseStore | None = None,
    *,
    plan: ReleasePlan | None = None,
    log: Callable[[str], None] = lambda message: None,
    progress: Progress | None = None,
) -> PublishResult:
    """Publish the month's release, or verify an existing one and change nothing.

    ``plan`` is plan_release's result when the caller already made it (planning may read the
    files); without one, a month the store holds nothing of is uploaded while it is planned.
    Raises ReleaseConflict, before writing anything, when the store already holds a different
    release for the month (or different bytes at any of its keys).
    """
    store = store or open_store(settings)
    if plan:  # a plan made by the caller: the same layout check as plan_release's, before any write
        where = f"the plan of release {plan.month}"
        check_manifest(plan.month, plan.manifest, where)
        for obj in plan.objects:
            check_name(plan.month, obj.name, where)
    sources = None if plan else release_sources(month, settings)
    label = plan.month if plan else sources.month
    manifest_key = release_key(label, MANIFEST_NAME)
    published = store.get_bytes(manifest_key, limit=MAX_JSON_BYTES)
    if sources and published is None and not _any_stored(store, label, sources.files):
        # A month new to the store (every first publish) has nothing to compare against, so each
        # file goes up as soon as it is planned instead of after a hashing pass over the release.
        plan = _upload_while_planning(store, sources, settings, log, progress)
        uploaded, verified = plan.objects, []
    else:
        plan = plan or build_plan(sources, list(plan_files(sources, settings)))
        uploaded, verified = _check_then_upload(store, plan, published, log, progress)
    result = PublishResult(
        month=plan.month,
        store=store.description,
        manifest_sha256=sha256_hex(plan.manifest_bytes),
        manifest_url=store.public_url(manifest_key),
        uploaded=[o.name for o in uploaded],
        verified=verified,
        bytes_uploaded=sum(o.size for o in uploaded),
    )

    if published is None:
        if not store.put_bytes(manifest_key, plan.manifest_bytes, cache_control=IMMUTABLE_CACHE, if_absent=True):
            if not _holds(store, manifest_key, plan.manifest_bytes):
                raise ReleaseConflict(f"another publisher committed a different release {plan.month} meanwhile")
        else:
            result.manifest_written = True
            log(f"published {manifest_key}")

    result.index_written, result.latest_written = update_pointers(store)
    # The release is complete and immutable: nothing may be written under its prefix any more, so
    # an upload still open there is a killed run's (a run that fails aborts its own). Housekeeping
    # only: the release is already public, so a refusal (e.g. a policy without
    # s3:ListBucketMultipartUploads) is logged, not raised; the next publish tries again.
    try:
        result.aborted_uploads = store.abort_unfinished_uploads(release_key(plan.month, ""))
    except ReleaseError as exc:
        log(f"could not abort the unfinished uploads under {release_key(plan.month, '')}: {exc}")
    if result.aborted_uploads:
        log(f"aborted unfinished uploads left by an interrupted run: {', '.join(result.aborted_uploads)}")
    return result


def _any_stored(store: ReleaseStore, month: str, files: list[SourceFile]) -> bool:
    keys = [release_key(month, f.name) for f in files]
    with ThreadPoolExecutor(max_workers=8) as pool:  # HEAD requests are latency, not bandwidth
        return any(info is not None for info in pool.map(store.stat, keys))


def _upload_while_planning(
    store: ReleaseStore, sources: ReleaseSources, settings: Settings, log, progress
) -> ReleasePlan:
    """Upload every file of a release the store holds nothing of, each as soon as it is planned;
    the plan (hence the manifest) is complete only once every upload is verified."""
    total = sum(f.path.stat().st_size for f in sources.files)
    log(
        f"uploading {len(sources.files)} files ({total:,} bytes) to {store.description}: "
        + ", ".join(f.name for f in sources.files)
    )
    objects: list[PlannedObject] = []

    def planned() -> Iterator[tuple[str, PlannedObject]]:
        for obj in plan_files(sources, settings):
            objects.append(obj)
            yield release_key(sources.month, obj.name), obj

    store.put_files(planned(), cache_control=IMMUTABLE_CACHE, progress=progress)
    return build_plan(sources, objects)


def _check_then_upload(store: ReleaseStore, plan: ReleasePlan, published: bytes | None, log, progress):
    """Refuse (before writing anything) a store holding a different manifest or different bytes
    at any key of the release, then upload what is missing. Returns (uploaded, verified names)."""
    if published is not None and published != plan.manifest_bytes:
        raise ReleaseConflict(
            f"{store.description} already holds a different release {plan.month} (manifest sha256 "
            f"{sha256_hex(published)}, ours {sha256_hex(plan.manifest_bytes)}); releases are immutable, "
            "nothing was written"
        )
    missing, verified, conflicts = [], [], []
    for obj in plan.objects:
        info = store.stat(release_key(plan.month, obj.name))
        if info is None:
            missing.append(obj)
        elif _matches(info, obj):
            verified.append(obj.name)
        else:
            conflicts.append(
                f"{obj.name} (store: {info.size} bytes, sha256 {info.sha256}; ours: {obj.size}, {obj.sha256})"
            )
    if conflicts:
        raise ReleaseConflict(
            f"{store.description} holds different objects under {RELEASES_DIR}/{plan.month}/: "
            + "; ".join(conflicts[:5])
            + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
            + ". Releases are immutable: nothing was written."
        )
    if published is not None and missing:
        # The manifest's bytes equal ours, so restoring the identical files overwrites nothing.
        log(f"release {plan.month} is published but {len(missing)} objects are missing; restoring them")
    if missing:
        log(
            f"uploading {len(missing)} files ({sum(o.size for o in missing):,} bytes) to {store.description}: "
            + ", ".join(o.name for o in missing)
        )
        store.put_files(
            [(release_key(plan.month, o.name), o) for o in missing], cache_control=IMMUTABLE_CACHE, progress=progress
        )
    return missing, verified


def _holds(store: ReleaseStore, key: str, data: bytes) -> bool:
    """Whether ``key`` holds exactly ``data``, found out reading no more than one chunk past
    ``len(data)``: the store may hold anything there, of any size."""
    try:
        return store.get_bytes(key, limit=len(data)) == data
    except ObjectTooLarge:  # longer than ``data``, so not ``data`` (a link is still refused)
        return False


def update_pointers(store: ReleaseStore) -> tuple[bool, bool]:
    """Rewrite index.json, then latest.json, from the manifests actually published (so a crash
    between steps, or two publishers, is repaired by the next run); each is written only if its
    content changed. Returns whether each was written."""
    index = build_index(store)
    index_bytes = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    index_written = not _holds(store, INDEX_KEY, index_bytes)
    if index_written:
        store.put_bytes(INDEX_KEY, index_bytes, cache_control=POINTER_CACHE, if_absent=False)
    if not index["releases"]:
        return index_written, False
    newest = index["releases"][-1]
    latest = {"format": INDEX_FORMAT, **{k: v for k, v in newest.items() if k not in ("files", "urls")}}
    latest_bytes = (json.dumps(latest, indent=2, sort_keys=True) + "\n").encode()
    latest_written = not _holds(store, LATEST_KEY, latest_bytes)
    if latest_written:
        store.put_bytes(LATEST_KEY, latest_bytes, cache_control=POINTER_CACHE, if_absent=False)
    return index_written, latest_written


def build_index(store: ReleaseStore) -> dict:
    """Every month whose manifest is published, oldest first. Files are keys relative to the store's
    root (the directory holding releases/), so the index stays true wherever the store is served
    from; with MIRAI_RELEASE_PUBLIC_URL, plain HTTPS URLs too, for curl and
    ``datasets.load_dataset("parquet", data_files=...)``."""
    releases = []
    for month in store.release_months():
        key = release_key(month, MANIFEST_NAME)
        raw = store.get_bytes(key, limit=MAX_JSON_BYTES)  # the store's word: never read past the bound
        if raw is None:  # an unfinished publish: not a release yet
            continue
        # Checked as mirai download checks it: the index never points at a release it would refuse.
        manifest = load_json(raw, f"{key} in {store.description}")
        check_manifest(month, manifest, f"{key} in {store.description}")
        info = store.stat(key)
        entry = {
            "release": month,
            "manifest": key,
            "manifest_sha256": sha256_hex(raw),
            # The manifest is written once, so its modification time is stable across runs.
            "published_at": info.modified.astimezone(UTC).isoformat(timespec="seconds"),
            "files": {name: release_key(month, name) for name in sorted(manifest["files"])},
        }
        if store.configured_url(key) is not None:
            entry["manifest_url"] = store.configured_url(key)
            entry["urls"] = {name: store.configured_url(path) for name, path in entry["files"].items()}
        releases.append(entry)
    return {"format": INDEX_FORMAT, "releases": releases}


def publish_leaderboard(store: ReleaseStore, board: Path, chart: Path, page: Path) -> list[str]:
    """Put the current leaderboard (table, chart and HTML page) next to the releases' index.
    Unlike a release it changes with every evaluation, so like index.json it is a revalidated
    pointer, not an immutable object; only what changed is written. Returns the keys written."""
    written = []
    for key, path in zip(LEADERBOARD_KEYS.values(), (board, chart, page), strict=True):
        data = path.read_bytes()
        if not _holds(store, key, data):
            store.put_bytes(key, data, cache_control=POINTER_CACHE, if_absent=False)
            written.append(key)
    return written
