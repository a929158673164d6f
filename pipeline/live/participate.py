"""A participant's side of the live rounds (docs/live.md, "Finding a round"): `mirai live list`,
`mirai live questions D` and `mirai download --live` (the history, "The history a participant may
use"). The store is read as untrusted input, as `mirai download` reads a
release: live/index.json is checked entry by entry, a round's manifest against the sha256 the
index publishes for it, and its questions.jsonl is fetched by the release download's own
verified-file code (pipeline/release/download.py ``download_file``) against the manifest's
sha256. Whether a round is still open is judged as acceptance judges it, on the store's clock
(pipeline/live/publication.py ``store_deadline``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pipeline.evaluation.submission_status import has_status_shape
from pipeline.evaluation.submissions import MAX_SUBMISSION_BYTES
from pipeline.live.history import HISTORY_INDEX_FORMAT, check_history_manifest
from pipeline.live.publication import INDEX_FORMAT, ROUND_FORMAT, store_deadline
from pipeline.live.status import STATUS_FORMAT
from pipeline.release.download import ChecksumMismatch, download_file, refuse_links
from pipeline.release.layout import (
    LIVE_HISTORY_FILES,
    LIVE_HISTORY_INDEX_KEY,
    LIVE_INDEX_KEY,
    LIVE_QUESTIONS,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    ReleaseError,
    UnsafeRelease,
    is_day,
    is_submission_name,
    live_history_key,
    live_round_key,
    live_status_key,
    load_json,
    shown,
    submission_status_key,
)
from pipeline.release.publish import sha256_hex
from pipeline.release.store import ReleaseStore
from pipeline.storage import DataLayout, atomic_write_bytes

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ListedRound:
    """One round of live/index.json, checked: days are real days, the deadline an aware ISO time."""

    day: str
    deadline: datetime  # as published (the round's own time; acceptance moves it onto the store's clock)
    target_dates: tuple[str, ...]
    resolved_dates: tuple[str, ...]
    manifest_sha256: str


def _moment(value: object) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo is not None else None


def _days(value: object) -> tuple[str, ...] | None:
    return tuple(value) if isinstance(value, list) and all(is_day(t) for t in value) else None


def _entry(entry: object, where: str) -> ListedRound:
    if not isinstance(entry, dict) or not is_day(entry.get("round")):
        raise UnsafeRelease(f"{where} has an entry that is not a round YYYY-MM-DD: {shown(entry)}; refused")
    day = entry["round"]
    digest, deadline = entry.get("manifest_sha256"), _moment(entry.get("deadline"))
    targets, resolved = _days(entry.get("target_dates")), _days(entry.get("resolved_dates", []))
    if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        raise UnsafeRelease(f"{where}: round {day} has the manifest sha256 {shown(digest)}; refused")
    if deadline is None:
        raise UnsafeRelease(f"{where}: round {day} has the deadline {shown(entry.get('deadline'))}; refused")
    if not targets or resolved is None or not set(resolved) <= set(targets):
        raise UnsafeRelease(f"{where}: round {day} has target or resolved dates that are not days; refused")
    return ListedRound(day, deadline, targets, resolved, digest)


def _index_list(store: ReleaseStore, key: str, format_name: str, field: str, absent: str) -> tuple[list, str]:
    """The ``field`` list of the ``format_name`` index at ``key`` (bounded read), and where it was
    read for messages; an index of another shape is refused in one line."""
    raw = store.get_bytes(key, limit=MAX_JSON_BYTES)
    if raw is None:
        raise ReleaseError(f"{absent} is published at {store.description} (no {key})")
    where = f"{key} at {store.description}"
    index = load_json(raw, where)
    entries = index.get(field) if isinstance(index, dict) and index.get("format") == format_name else None
    if not isinstance(entries, list):
        raise UnsafeRelease(f"{where} is not a {format_name} index with a '{field}' list; refused")
    return entries, where


def read_index(store: ReleaseStore) -> list[ListedRound]:
    """The published rounds, newest first, from live/index.json (its keys are not trusted: a
    round's files are read at the layout's keys for its day)."""
    rounds, where = _index_list(store, LIVE_INDEX_KEY, INDEX_FORMAT, "rounds", "no live round")
    listed = [_entry(entry, where) for entry in rounds]
    if len({r.day for r in listed}) != len(listed):
        raise UnsafeRelease(f"{where} lists a round twice; refused")
    return sorted(listed, key=lambda r: r.day, reverse=True)


def find_round(store: ReleaseStore, day: date) -> ListedRound:
    listed = read_index(store)
    for entry in listed:
        if entry.day == day.isoformat():
            return entry
    newest = ", ".join(r.day for r in listed[:5]) or "none"
    raise ReleaseError(f"round {day} is not published at {store.description} (newest published: {newest})")


def verified_manifest(store: ReleaseStore, entry: ListedRound) -> dict:
    """The round's manifest.json, checked against the sha256 the index publishes and against the
    fields a participant uses (its round, deadline, publication time, questions' sha256 and size)."""
    key = live_round_key(entry.day, MANIFEST_NAME)
    raw = store.get_bytes(key, limit=MAX_JSON_BYTES)
    if raw is None:
        raise ReleaseError(f"round {entry.day} is listed but {key} is not at {store.description}")
    if sha256_hex(raw) != entry.manifest_sha256:
        raise ChecksumMismatch(
            f"{key} has sha256 {sha256_hex(raw)} but {LIVE_INDEX_KEY} publishes {entry.manifest_sha256}"
        )
    where = f"{key} at {store.description}"
    manifest = load_json(raw, where)
    if not isinstance(manifest, dict) or manifest.get("format") != ROUND_FORMAT or manifest.get("round") != entry.day:
        raise UnsafeRelease(f"{where} is not the {ROUND_FORMAT} manifest of round {entry.day}; refused")
    questions = (manifest.get("files") or {}).get(LIVE_QUESTIONS) if isinstance(manifest.get("files"), dict) else None
    size = questions.get("bytes") if isinstance(questions, dict) else None
    digest = questions.get("sha256") if isinstance(questions, dict) else None
    if not (isinstance(digest, str) and _SHA256.fullmatch(digest)) or not (
        type(size) is int and 0 < size <= MAX_SUBMISSION_BYTES
    ):
        raise UnsafeRelease(f"{where}: files.{LIVE_QUESTIONS} has no valid sha256 and size; refused")
    if _moment(manifest.get("deadline")) is None or _moment(manifest.get("published_at")) is None:
        raise UnsafeRelease(f"{where}: its deadline or published_at is not an ISO time with a zone; refused")
    if not is_day(manifest.get("history_cutoff")):
        raise UnsafeRelease(f"{where}: history_cutoff {shown(manifest.get('history_cutoff'))} is not a day; refused")
    return manifest


def status(store: ReleaseStore, entry: ListedRound, now: datetime) -> tuple[bool, str]:
    """(open, what to say): a round with resolved dates is closed without a request; any other is
    open while ``now`` is before its deadline on the store's clock (its manifest read and verified)."""
    if entry.resolved_dates:
        return False, f"closed (resolved: {', '.join(entry.resolved_dates)})"
    due, _ = store_deadline(store, verified_manifest(store, entry))
    due = due.astimezone(UTC)
    if now > due:
        return False, f"closed at {due.isoformat()} (store time)"
    left = timedelta(seconds=round((due - now).total_seconds()))
    return True, f"open until {due.isoformat()} (store time; {left} left)"


def download_questions(store: ReleaseStore, day: date, target: Path, *, bar: bool | None = None) -> dict:
    """The round's questions.jsonl into ``target``, verified against its manifest's sha256 (the
    manifest against the index's); returns the manifest. ChecksumMismatch keeps nothing."""
    manifest = verified_manifest(store, find_round(store, day))
    download_file(
        store, live_round_key(day.isoformat(), LIVE_QUESTIONS), target, manifest["files"][LIVE_QUESTIONS], bar=bar
    )
    return manifest


def read_status(store: ReleaseStore, name: str) -> dict:
    """Submission ``name``'s public status (live/status/<name>.json), its shape checked: the store
    may be hostile, and every text in it reaches a terminal (shown with visible_text by the CLI)."""
    if not is_submission_name(name):
        raise ReleaseError(f"{shown(name)} is not a submission name (letters, digits and '._-', at most 64)")
    key = live_status_key(name)
    raw = store.get_bytes(key, limit=MAX_JSON_BYTES)
    if raw is None:
        raise ReleaseError(
            f"no status for {name!r} at {store.description} (neither {submission_status_key(name)} nor {key}): "
            "not processed yet (the pipeline looks at new submissions every few minutes), or no submission has "
            "that name: check its spelling"
        )
    where = f"{key} at {store.description}"
    status = load_json(raw, where)
    if not (has_status_shape(status, name, STATUS_FORMAT, ("accepted", "rejected")) and is_day(status.get("round"))):
        raise UnsafeRelease(f"{where} is not the {STATUS_FORMAT} status of {name!r}; refused")
    return status


# --- the live history (docs/live.md, "The history a participant may use") -------------------


@dataclass
class HistorySync:
    directory: Path
    downloaded: list[str] = field(default_factory=list)  # days fetched now
    present: list[str] = field(default_factory=list)  # days already there
    bytes_downloaded: int = 0


def read_history_index(store: ReleaseStore) -> dict[str, str]:
    """{day: manifest sha256} of live/history/index.json, every entry checked (its keys are not
    trusted: a day's files are read at the layout's keys for its day)."""
    days, where = _index_list(store, LIVE_HISTORY_INDEX_KEY, HISTORY_INDEX_FORMAT, "days", "no live history")
    published: dict[str, str] = {}
    for entry in days:
        day = entry.get("day") if isinstance(entry, dict) else None
        digest = entry.get("manifest_sha256") if isinstance(entry, dict) else None
        if not is_day(day):
            raise UnsafeRelease(f"{where} has an entry that is not a day YYYY-MM-DD: {shown(entry)}; refused")
        if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise UnsafeRelease(f"{where}: day {day} has the manifest sha256 {shown(digest)}; refused")
        if day in published:
            raise UnsafeRelease(f"{where} lists day {day} twice; refused")
        published[day] = digest
    return published


def history_paths(out: Path, day: str) -> dict[str, Path]:
    """Where a synced day goes: its tables as EventDatabase reads them, and its manifest (written
    last: its presence means the day was verified)."""
    database = DataLayout(out).database_dir()
    return {
        **{name: database / name.removesuffix(".parquet") / f"day={day}.parquet" for name in LIVE_HISTORY_FILES},
        MANIFEST_NAME: database / "manifests" / f"day={day}.json",
    }


def _present(paths: dict[str, Path], digest: str) -> bool:
    """The day's manifest is the published one and its files have the manifest's sizes (a synced
    day is not hashed again on every sync: its files were verified when they were written)."""
    try:
        raw = paths[MANIFEST_NAME].read_bytes()
        files = json.loads(raw)["files"]
        return sha256_hex(raw) == digest and all(
            paths[n].stat().st_size == files[n]["bytes"] for n in LIVE_HISTORY_FILES
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def sync_history(
    store: ReleaseStore, out: Path, through: date | None = None, *, bar: bool | None = None
) -> HistorySync:
    """Download every published history day ≤ ``through`` (all when None) not yet in ``out``.
    Every manifest to fetch is checked against the index's sha256 and the layout before any file
    is written; each day's files are fetched by the release download's verified-file code into
    database/.staging/ and renamed into place only once both match their manifest, its manifest
    written last. A refusal (UnsafeRelease, ChecksumMismatch) leaves no unverified file in place."""
    published = read_history_index(store)
    wanted = sorted(d for d in published if through is None or d <= through.isoformat())
    result = HistorySync(directory=out)
    todo: dict[str, tuple[bytes, dict]] = {}
    for day in wanted:
        if _present(history_paths(out, day), published[day]):
            result.present.append(day)
            continue
        key = live_history_key(day, MANIFEST_NAME)
        raw = store.get_bytes(key, limit=MAX_JSON_BYTES)
        if raw is None:
            raise ReleaseError(f"history day {day} is listed but {key} is not at {store.description}")
        if sha256_hex(raw) != published[day]:
            raise ChecksumMismatch(
                f"{key} has sha256 {sha256_hex(raw)} but {LIVE_HISTORY_INDEX_KEY} publishes {published[day]}; "
                "nothing was written"
            )
        todo[day] = (raw, check_history_manifest(raw, day, f"{key} at {store.description}"))
    staging = DataLayout(out).database_dir() / ".staging"
    targets = [p for day in todo for p in (*history_paths(out, day).values(), *_staged(staging, day).values())]
    refuse_links(Path(out), targets)
    try:
        for day, (raw, manifest) in todo.items():
            staged, paths = _staged(staging, day), history_paths(out, day)
            for name in LIVE_HISTORY_FILES:
                meta = manifest["files"][name]
                result.bytes_downloaded += download_file(
                    store, live_history_key(day, name), staged[name], meta, bar=bar
                )
            for name in LIVE_HISTORY_FILES:
                paths[name].parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged[name], paths[name])
            atomic_write_bytes(paths[MANIFEST_NAME], raw)
            result.downloaded.append(day)
    finally:
        for directory in [*sorted((p for p in staging.glob("*") if p.is_dir()), reverse=True), staging]:
            with contextlib.suppress(OSError):  # not empty: a .part an interrupted download resumes
                directory.rmdir()
    return result


def _staged(staging: Path, day: str) -> dict[str, Path]:
    return {name: staging / f"day={day}" / name for name in LIVE_HISTORY_FILES}
