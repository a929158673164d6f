"""Monthly releases: a closed month's split, event database snapshot, manifest and dataset card,
published once and never changed, to S3 (any S3-compatible store) or a local directory (the
stores: pipeline.release.store, pipeline.release.s3_store).

One publish algorithm runs against both stores: plan (hashing only files without a recorded
sha256), refuse if anything already at a release key differs (releases are immutable), upload what
is missing with a checksum the store verifies, write the manifest last, then index.json and
latest.json. Every step is a no-op when already done, so a crashed run is completed by the next
one, and a reader only ever reaches releases whose manifest (hence every file) is in place. Layout
and each step in detail: docs/releases.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date
from pathlib import Path

from pipeline.config import DatasetSettings, ReleaseSettings
from pipeline.release.croissant import croissant_bytes
from pipeline.release.layout import (
    CARD_NAME,
    CROISSANT_NAME,
    INDEX_KEY,
    LATEST_KEY,
    LEADERBOARD_KEYS,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    RELEASE_FORMAT,
    RELEASES_DIR,
    ReleaseError,
    check_manifest,
    check_name,
    is_month,
    load_json,
    release_key,
)
from pipeline.release.store import (
    CHUNK,
    ObjectInfo,
    ObjectTooLarge,
    PlannedObject,
    Progress,
    ReleaseNotReady,
    ReleaseStore,
)
from pipeline.storage import DataLayout, FileDigest, recorded_digest

INDEX_FORMAT = "mirai-release-index-v1"
# Release objects never change, so caches and CDNs may keep them forever; the two pointers
# (index.json, latest.json) move with every release and must be revalidated.
IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
POINTER_CACHE = "no-cache"


class ReleaseConflict(ReleaseError):
    """The store already holds different bytes at a key of this release: nothing is overwritten."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- planning -----------------------------------------------------------------------------------


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


def _part_size(release: ReleaseSettings, size: int) -> int | None:
    """The part size of a file's multipart upload (whole MiB, at least 5 MiB, at most 10,000
    parts), or None below the threshold: one PUT."""
    if size < release.multipart_threshold_mb * 2**20:
        return None
    wanted = max(release.multipart_chunk_mb * 2**20, MIN_PART, -(-size // MAX_PARTS))
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


def _planned(source: SourceFile, release: ReleaseSettings) -> PlannedObject:
    """The file's upload plan. A file of one PUT with a recorded sha256 is not read: the PUT
    carries that sha256, so the store itself refuses bytes that changed since (S3 answers
    BadDigest, the local store compares while copying), and a publish does not re-read a
    snapshot of several GB that was hashed as it was written. Any other file is hashed (a
    multipart upload needs each part's SHA-256) and checked against its recorded digest."""
    name, path, recorded = source.name, source.path, source.recorded
    size = path.stat().st_size
    if recorded is not None and recorded.bytes != size:
        raise source.not_as_recorded(f"{size} bytes", f"{recorded.bytes}")
    part_size = _part_size(release, size)
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


def release_sources(month: date, dataset: DatasetSettings) -> ReleaseSources:
    layout = DataLayout(dataset.data_dir)
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
    return ReleaseSources(
        month=label,
        split_manifest=split_manifest,
        database_months=months,
        files=files,
    )


def plan_files(sources: ReleaseSources, release: ReleaseSettings) -> Iterator[PlannedObject]:
    """Each file planned (see _planned), in the sources' order, as soon as it is (so uploads can
    start while later files are still read), then croissant.json, which lists them all with their
    sha256 (pipeline/release/croissant.py); raises when a file no longer matches its recorded
    sha256 or size."""
    planned = []
    # Hashing is most of a publish's own CPU time; hashlib and file reads release the GIL.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for obj in pool.map(lambda source: _planned(source, release), sources.files):
            planned.append(obj)
            yield obj
    yield _croissant(sources, planned)


def _croissant(sources: ReleaseSources, planned: list[PlannedObject]) -> PlannedObject:
    """croissant.json of the release, a pure function of the planned files (so an unchanged month
    gives the same bytes), planned like any other file but held in memory."""
    data = croissant_bytes(sources.month, sources.split_manifest.get("source"), {o.name: o.entry() for o in planned})
    return PlannedObject(
        name=CROISSANT_NAME,
        path=None,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        part_size=None,
        part_sha256=(),
        content=data,
    )


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


def plan_release(month: date, dataset: DatasetSettings, release: ReleaseSettings) -> ReleasePlan:
    """Plan every file of the month's release (see _planned) and build its manifest."""
    sources = release_sources(month, dataset)
    return build_plan(sources, list(plan_files(sources, release)))


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
    dataset: DatasetSettings,
    release: ReleaseSettings,
    store: ReleaseStore,
    *,
    plan: ReleasePlan | None = None,
    log: Callable[[str], None] = lambda message: None,
    progress: Progress | None = None,
) -> PublishResult:
    """Publish the month's release to ``store`` (``store_uri.open_store``), or verify an existing
    one and change nothing.

    ``plan`` is plan_release's result when the caller already made it (planning may read the
    files); without one, a month the store holds nothing of is uploaded while it is planned.
    Raises ReleaseConflict, before writing anything, when the store already holds a different
    release for the month (or different bytes at any of its keys).
    """
    if plan:  # a plan made by the caller: the same layout check as plan_release's, before any write
        where = f"the plan of release {plan.month}"
        check_manifest(plan.month, plan.manifest, where)
        for obj in plan.objects:
            check_name(plan.month, obj.name, where)
    sources = None if plan else release_sources(month, dataset)
    label = plan.month if plan else sources.month
    manifest_key = release_key(label, MANIFEST_NAME)
    published = store.get_bytes(manifest_key, limit=MAX_JSON_BYTES)
    if sources and published is None and not _any_stored(store, label, sources.files):
        # A month new to the store (every first publish) has nothing to compare against, so each
        # file goes up as soon as it is planned instead of after a hashing pass over the release.
        plan = _upload_while_planning(store, sources, release, log, progress)
        uploaded, verified = plan.objects, []
    else:
        plan = plan or build_plan(sources, list(plan_files(sources, release)))
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
    store: ReleaseStore, sources: ReleaseSources, release: ReleaseSettings, log, progress
) -> ReleasePlan:
    """Upload every file of a release the store holds nothing of, each as soon as it is planned;
    the plan (hence the manifest) is complete only once every upload is verified."""
    total = sum(f.path.stat().st_size for f in sources.files)
    log(
        f"uploading {len(sources.files)} files ({total:,} bytes) and their {CROISSANT_NAME} to {store.description}: "
        + ", ".join(f.name for f in sources.files)
    )
    objects: list[PlannedObject] = []

    def planned() -> Iterator[tuple[str, PlannedObject]]:
        for obj in plan_files(sources, release):
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
