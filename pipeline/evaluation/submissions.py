"""Submitted predictions: read from the release store's submissions/ area, checked, scored and
recorded (docs/evaluation.md, "Submissions").

A submission is ``submissions/<name>/`` holding one predictions file (``predictions.jsonl``,
``.csv`` or ``.parquet``, the formats ``mirai score`` reads) and ``submission.json`` (uploaded
last, so its presence means the upload is complete). Everything in it was written by a stranger:
the listing follows nothing, a size is known before a byte is read and every read is capped,
the metadata is checked field by field, the predictions are scored in strict mode
(pipeline/evaluation/scoring.py) from a private temporary copy, and each problem is one line of
the submission's rejection. One refused submission never stops another from being processed.

Outcomes, each written to ``<data_dir>/submissions/<name>/record.json`` (format RECORD_FORMAT):
``scored``; ``contaminated`` (scored, never ranked: the knowledge cutoff is not before the month,
registry.eligibility's rule); ``rejected`` (and ``rejection.json`` beside the upload in the store).
Two states are not outcomes: an upload still in progress, and a month whose split this pipeline
has not built yet: both are retried at a later look (``triage``).

submission.json's fields are checked by pipeline/evaluation/submission_metadata.py. One with a
"round" field is for a live round (docs/live.md, "Submitting"): its metadata is checked there
(``parse_live_metadata``, which `mirai submit` applies too), and it is
accepted or rejected by live/submissions.py, which owns live submissions and is the pipeline's
way in to all of them: its ``process`` and ``triage`` are these, given its LIVE_PATH
(``LivePath``; live/ builds on evaluation/, never the reverse).

`mirai submit` (``prepare``, ``score_locally``, ``check_name_free``, ``upload``: the checks above
on local files, then the upload) is pipeline/evaluation/submit.py; a live submission's predictions
are checked against its round by live/submissions.py's ``check_live_locally``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pipeline.evaluation.score_inputs import MAX_PREDICTIONS_BYTES, ScoringError
from pipeline.evaluation.scoring import InvalidPredictions, bounded, score_predictions
from pipeline.evaluation.submission_metadata import (
    MAX_METADATA_BYTES,
    OPTIONAL_FIELDS,
    QUERY_SETS,
    REQUIRED_FIELDS,
    Metadata,
    cutoff_rule,
    is_live_metadata,
    parse_metadata,
)
from pipeline.evaluation.submission_status import publish_status
from pipeline.release.layout import (
    PREDICTION_NAMES,
    SPLIT_FILES,
    SUBMISSION_FILES,
    SUBMISSION_META,
    SUBMISSION_REJECTION,
    SUBMISSIONS_DIR,
    ReleaseError,
    UnsafeRelease,
    is_submission_name,
    shown,
    submission_key,
)
from pipeline.release.publish import POINTER_CACHE
from pipeline.release.store import ListedKey, ReleaseStore
from pipeline.storage import DataLayout, atomic_write_bytes, file_lock

RECORD_FORMAT = "mirai-submission-record-v1"
REJECTION_FORMAT = "mirai-submission-rejection-v1"
# The predictions file: the cap `mirai score` applies to a local file (a month's ~2,000 queries
# with full answers are under 10 MB as JSONL), checked on the listed size before any byte is read.
MAX_SUBMISSION_BYTES = MAX_PREDICTIONS_BYTES
# Keys listed per look at the store (the sensor pages through the rest on later ticks), and per
# submission (it holds at most len(SUBMISSION_FILES) objects; more is an attack or a mistake).
MAX_LISTED_KEYS = 5000
MAX_KEYS_PER_SUBMISSION = 16
# Predictions with no submission.json after this long are an abandoned half-upload: refused.
ABANDONED_AFTER = timedelta(hours=1)
# Processing one submission takes well under a second for a month's ~2,000 queries; a run that
# waits this long behind others fails and can be materialised again.
LOCK_TIMEOUT_S = 600


class SubmissionError(ReleaseError):
    """A submission cannot be processed as asked (not one to refuse: e.g. an invalid name, which
    has nowhere to hold a rejection); the message is one line."""


class NotReady(SubmissionError):
    """Not yet processable (an upload in progress, a month without a split): try again later."""


def split_queries(data_dir: Path, month: str, query_set: str) -> Path:
    """The split file a submission is scored against (it may not exist yet)."""
    name = SPLIT_FILES[QUERY_SETS.index(query_set)]
    return DataLayout(data_dir).split_dir(date.fromisoformat(f"{month}-01")) / name


# --- the store's listing ----------------------------------------------------------------------------


@dataclass
class Upload:
    """What the store holds under submissions/<name>/: the expected files, by name, and one line
    for every object that does not belong there."""

    name: str
    files: dict[str, ListedKey] = field(default_factory=dict)
    odd: list[str] = field(default_factory=list)

    @property
    def predictions(self) -> list[ListedKey]:
        return [self.files[n] for n in PREDICTION_NAMES if n in self.files]


def group_uploads(keys: list[ListedKey]) -> tuple[dict[str, Upload], list[str]]:
    """The listing's keys by submission, and one line per key no submission can hold (a bad
    name: it has nowhere to put a rejection, so it is only reported)."""
    uploads: dict[str, Upload] = {}
    stray: list[str] = []
    for item in keys:
        if not item.key.startswith(f"{SUBMISSIONS_DIR}/"):  # the area itself is a link or a file
            stray.append(f"{shown(item.key)} is {item.problem or 'not a directory'}: nothing under it is read")
            continue
        name, _, file = item.key.removeprefix(f"{SUBMISSIONS_DIR}/").partition("/")
        if not is_submission_name(name):
            stray.append(f"{shown(item.key)}: not under a valid submission name (letters, digits, '._-', at most 64)")
            continue
        upload = uploads.setdefault(name, Upload(name))
        if item.problem:
            upload.odd.append(f"{shown(file)} is {item.problem}")
        elif file not in SUBMISSION_FILES:
            upload.odd.append(
                f"unexpected object {shown(file)} (a submission holds {SUBMISSION_META} and one of "
                f"{', '.join(PREDICTION_NAMES)})"
            )
        else:
            upload.files[file] = item
    return uploads, stray


def list_upload(store: ReleaseStore, name: str) -> Upload:
    if not is_submission_name(name):
        raise SubmissionError(f"{shown(name)} is not a submission name (letters, digits, '._-', at most 64)")
    listing = store.list_keys(f"{SUBMISSIONS_DIR}/{name}/", max_keys=MAX_KEYS_PER_SUBMISSION)
    uploads, _ = group_uploads(listing.keys)
    upload = uploads.get(name, Upload(name))
    if listing.truncated:
        upload.odd.append(f"more than {MAX_KEYS_PER_SUBMISSION} objects")
    return upload


# --- records ------------------------------------------------------------------------------------


def record_path(data_dir: Path, name: str) -> Path:
    return DataLayout(data_dir).root / SUBMISSIONS_DIR / name / "record.json"


def read_record(data_dir: Path, name: str) -> dict | None:
    path = record_path(data_dir, name)
    return json.loads(path.read_bytes()) if path.is_file() else None


def _records(data_dir: Path) -> Iterator[dict]:
    base = DataLayout(data_dir).root / SUBMISSIONS_DIR
    for path in sorted(base.glob("*/record.json")) if base.is_dir() else []:
        yield json.loads(path.read_bytes())


def earlier_duplicate(data_dir: Path, name: str, sha256: str, meta: Metadata) -> str | None:
    """The name of a scored (or contaminated) submission of the same file for the same month,
    query set and distance, if there is one."""
    for record in _records(data_dir):
        if (
            record["submission"] != name
            and record["status"] != "rejected"
            and (record["predictions_sha256"], record["month"], record["query_set"], record["distance"])
            == (sha256, meta.month, meta.query_set, meta.distance)
        ):
            return record["submission"]
    return None


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _record(
    name: str, status: str, reasons: list[str], fields: dict, sha256: str | None, submitted: datetime | None, card
) -> dict:
    return {
        "format": RECORD_FORMAT,
        "submission": name,
        "status": status,
        "reasons": reasons,
        **{k: fields.get(k) for k in REQUIRED_FIELDS + OPTIONAL_FIELDS},
        "predictions_sha256": sha256,
        "submitted_at": submitted.astimezone(UTC).isoformat() if submitted else None,
        "scored_at": _now().isoformat(),
        "scorecard": card,
    }


def _write_record(data_dir: Path, record: dict) -> None:
    atomic_write_bytes(record_path(data_dir, record["submission"]), (json.dumps(record, indent=2) + "\n").encode())


def _reject(store: ReleaseStore, record: dict) -> dict:
    """Put rejection.json beside the upload (never over one), then return the record to write."""
    record["reasons"] = put_rejection(store, record["submission"], record["reasons"], record["scored_at"])
    return record


def put_rejection(store: ReleaseStore, name: str, reasons: list[str], at: str) -> list[str]:
    """Write rejection.json; the reasons, with one more when it could not be written."""
    rejection = {"format": REJECTION_FORMAT, "submission": name, "reasons": reasons, "rejected_at": at}
    try:
        store.put_bytes(
            submission_key(name, SUBMISSION_REJECTION),
            (json.dumps(rejection, indent=2) + "\n").encode(),
            cache_control=POINTER_CACHE,
            if_absent=True,
        )
    except ReleaseError as exc:  # e.g. the submission's directory is a link out of a local store
        return [*reasons, f"{SUBMISSION_REJECTION} could not be written: {exc}"]
    return reasons


# --- processing ---------------------------------------------------------------------------------


def read_capped(store: ReleaseStore, key: str, limit: int) -> tuple[bytes | None, str | None]:
    """(the object's bytes, None), or (None, why it is refused) when the upload itself is at fault:
    a link or special file, more than ``limit`` bytes, bytes that fail the checksum the store
    recorded. A store that cannot be reached or refuses access raises (ReleaseError): not the
    submitter's fault, so the run fails and nothing is recorded."""
    from botocore.exceptions import FlexibleChecksumError

    try:
        return store.get_bytes(key, limit=limit), None
    except UnsafeRelease as exc:
        return None, str(exc)
    except FlexibleChecksumError:
        return None, f"{key}: its bytes do not match the checksum the store recorded"


def process(
    store: ReleaseStore, name: str, data_dir: Path, *, now: datetime | None = None, live: LivePath | None = None
) -> dict:
    """Check, score and record submission ``name``; return its record. A submission with a record
    is not processed again (the stored record is returned). NotReady: try again later, nothing
    was written. One submission at a time per data directory (a flock): the duplicate check, the
    scoring and the record are one step, so two identical files cannot both be scored. A live
    round's submission is processed by ``live`` (live/submissions.py's ``process`` passes its
    LIVE_PATH); without it, one is a SubmissionError. A monthly record's public status is
    (re)published (releases/status/<name>.json, submission_status.py), also for a record made
    earlier: a run that stopped between the two writes is completed by the next."""
    with file_lock(DataLayout(data_dir).lock_path("submissions"), LOCK_TIMEOUT_S):
        record = read_record(data_dir, name) or (live.read_record(data_dir, name) if live else None)
        if record is None:
            record = _process(store, list_upload(store, name), data_dir, now or _now(), live)
        if record["format"] == RECORD_FORMAT:
            publish_status(store, record)
        return record


# _process's checks of what was listed, before any byte is read (out of it to keep it ~80 lines).
def _shape_problems(upload: Upload) -> list[str]:
    """The upload's odd keys, a half-upload and more than one predictions file, one line each."""
    meta_item, predictions = upload.files.get(SUBMISSION_META), upload.predictions
    problems = list(upload.odd)
    if meta_item is None:
        problems.append(
            f"half-uploaded: no {SUBMISSION_META} beside the predictions after {ABANDONED_AFTER} "
            f"(upload the predictions first, {SUBMISSION_META} last)"
        )
    if not predictions:
        problems.append(f"half-uploaded: no predictions file (expected one of {', '.join(PREDICTION_NAMES)})")
    elif len(predictions) > 1:
        problems.append(f"more than one predictions file: {', '.join(p.key.rsplit('/', 1)[1] for p in predictions)}")
    return problems


def _oversized(predictions: list[ListedKey]) -> list[str]:
    """A line per predictions file whose listed size is over the cap (never read)."""
    oversized = [p for p in predictions if p.size > MAX_SUBMISSION_BYTES]
    return [
        f"{p.key.rsplit('/', 1)[1]} is {p.size:,} bytes, over the {MAX_SUBMISSION_BYTES:,} cap; not read"
        for p in oversized
    ]


def _process(store: ReleaseStore, upload: Upload, data_dir: Path, now: datetime, live: LivePath | None) -> dict:
    name, files = upload.name, upload.files
    meta_item, predictions = files.get(SUBMISSION_META), upload.predictions
    first = meta_item or (predictions[0] if predictions else None)
    submitted = first.modified if first else None

    def rejected(reasons: list[str], fields: dict | None = None, sha256: str | None = None) -> dict:
        record = _reject(store, _record(name, "rejected", bounded(reasons), fields or {}, sha256, submitted, None))
        _write_record(data_dir, record)
        return record

    if SUBMISSION_REJECTION in files:
        return rejected([f"already refused ({SUBMISSION_REJECTION} is in the store)"])
    if meta_item is None:
        if not predictions and not upload.odd:
            raise SubmissionError(f"no submission {name!r} in {store.description}")
        if predictions and now - predictions[0].modified < ABANDONED_AFTER:
            raise NotReady(f"{name}: upload in progress ({SUBMISSION_META}, uploaded last, is not there yet)")
    problems = _shape_problems(upload)
    meta, fields = None, {}
    if meta_item is not None:
        if meta_item.size > MAX_METADATA_BYTES:
            problems.append(f"{SUBMISSION_META} is {meta_item.size:,} bytes, over the {MAX_METADATA_BYTES:,} cap")
        else:
            raw, problem = read_capped(store, meta_item.key, MAX_METADATA_BYTES)
            if problem:
                problems.append(f"{SUBMISSION_META} could not be read: {problem}")
            elif is_live_metadata(raw or b""):
                if live is None:
                    raise SubmissionError(f"{name} is a live round's submission: live/submissions.py processes it")
                return live.process(store, upload, data_dir, now, raw or b"", problems, rejected)
            else:
                meta, fields, found = parse_metadata(raw or b"")
                problems += found
    problems += _oversized(predictions)
    if problems or meta is None:
        return rejected(problems, fields)
    return _score_upload(store, upload, data_dir, meta, fields, submitted, rejected)


def _score_upload(
    store: ReleaseStore,
    upload: Upload,
    data_dir: Path,
    meta: Metadata,
    fields: dict,
    submitted: datetime | None,
    rejected: Callable[..., dict],
) -> dict:
    """_process's last step, once the listing and submission.json passed: the predictions read,
    refused as a duplicate or scored against the split from a private copy, and recorded."""
    name = upload.name
    item = upload.predictions[0]
    filename = item.key.rsplit("/", 1)[1]
    with tempfile.TemporaryDirectory(prefix="mirai-submission-") as private:  # mode 0700
        data, problem = read_capped(store, item.key, MAX_SUBMISSION_BYTES)
        if problem:
            return rejected([f"{filename} could not be read: {problem}"], fields)
        if data is None:
            return rejected([f"{filename} disappeared while the submission was processed"], fields)
        sha256 = hashlib.sha256(data).hexdigest()
        earlier = earlier_duplicate(data_dir, name, sha256, meta)
        if earlier is not None:
            return rejected(
                [
                    f"duplicate: the same predictions (sha256 {sha256}) for {meta.month} {meta.query_set}, "
                    f"distance {meta.distance} were already scored as submission {earlier!r}"
                ],
                fields,
                sha256,
            )
        queries = split_queries(data_dir, meta.month, meta.query_set)
        if not queries.is_file():
            raise NotReady(f"{name}: no split for {meta.month} yet ({queries} is not built): try again later")
        path = Path(private) / filename
        path.write_bytes(data)
        try:
            result = score_predictions(
                path, queries.parent, sample=meta.query_set == "queries_sample", distance=meta.distance
            )
        except InvalidPredictions as exc:
            return rejected([f"{filename}: {line}" for line in exc.problems], fields, sha256)
        except ScoringError as exc:
            return rejected([str(exc).replace(str(path), filename)], fields, sha256)
    eligible, why = cutoff_rule(meta)
    record = _record(
        name,
        "scored" if eligible else "contaminated",
        [] if eligible else [why],
        fields,
        sha256,
        submitted,
        result.card,
    )
    _write_record(data_dir, record)
    return record


# --- live rounds: LivePath (docs/live.md, "Submitting"; the rest: live/submissions.py) ----------------

# data_dir/submissions/<name>/live.json: {"round": D}, where a processed live submission's record
# is (live/D/submissions/<name>/record.json); a record.json there would be a monthly one.
LIVE_POINTER = "live.json"


def live_pointer_path(data_dir: Path, name: str) -> Path:
    return DataLayout(data_dir).root / SUBMISSIONS_DIR / name / LIVE_POINTER


@dataclass(frozen=True)
class LivePath:
    """How ``process`` and ``triage`` reach live rounds' submissions, which live/submissions.py owns
    and provides as its LIVE_PATH (live/ builds on evaluation/, never the reverse)."""

    read_record: Callable[[Path, str], dict | None]  # (data_dir, name): a processed one's record, or None
    wait: Callable[[Path, bytes, datetime], str | None]  # (data_dir, submission.json, now): why it waits, or None
    # (store, upload, data_dir, now, submission.json, the problems found so far, ``rejected``): its record
    process: Callable[[ReleaseStore, Upload, Path, datetime, bytes, list[str], Callable[..., dict]], dict]


# --- what the sensor asks for ---------------------------------------------------------------------


def _landed(upload: Upload) -> datetime:
    return max((item.modified for item in upload.files.values()), default=datetime.min.replace(tzinfo=UTC))


@dataclass
class Triage:
    ready: dict[str, str] = field(default_factory=dict)  # name -> content key for the run key
    waiting: list[str] = field(default_factory=list)  # one line each: why not yet
    stray: list[str] = field(default_factory=list)  # keys under no valid name: reported only
    next_after: str = ""  # where the next look starts ("" = from the top)


def triage(
    store: ReleaseStore,
    data_dir: Path,
    *,
    start_after: str = "",
    now: datetime | None = None,
    max_keys: int = MAX_LISTED_KEYS,
    live: LivePath | None = None,
) -> Triage:
    """One bounded look at submissions/: which uploads to process now (complete, or abandoned
    half-uploads), which to look at again later, and which keys are under no valid name. Reads
    only each new submission.json (capped); a problem reading one is left to ``process`` to
    refuse. Whether a live round's submission waits is ``live``'s to say (live/submissions.py's
    ``triage`` passes its LIVE_PATH; without it, none does)."""
    now = now or _now()
    listing = store.list_keys(f"{SUBMISSIONS_DIR}/", max_keys=max_keys, start_after=start_after)
    uploads, stray = group_uploads(listing.keys)
    result = Triage(stray=stray)
    if listing.truncated:
        # The last name's keys may continue on the next page: unless it fills the page alone, it
        # is looked at whole on the next look, which starts just before it.
        keys = [k.key for k in listing.keys]
        last = keys[-1].split("/")[1]
        first = next(i for i, key in enumerate(keys) if key.split("/")[1] == last)
        if first > 0:
            uploads.pop(last, None)
        result.next_after = keys[first - 1] if first > 0 else keys[-1]
    # Oldest first (by the time its last file landed), so that of two identical files the one
    # submitted first is scored and the other refused as its duplicate.
    for name, upload in sorted(uploads.items(), key=lambda u: (_landed(u[1]), u[0])):
        if (
            SUBMISSION_REJECTION in upload.files
            or record_path(data_dir, name).is_file()
            or live_pointer_path(data_dir, name).is_file()
        ):
            continue
        meta_item = upload.files.get(SUBMISSION_META)
        if meta_item is None:
            predictions = upload.predictions
            if predictions and now - predictions[0].modified < ABANDONED_AFTER:
                result.waiting.append(f"{name}: upload in progress (no {SUBMISSION_META} yet)")
                continue
            if not predictions and not upload.odd:
                continue
        content = hashlib.sha256()
        for item in sorted(upload.files.values(), key=lambda k: k.key):
            content.update(f"{item.key}\0{item.size}\0{item.modified.isoformat()}\0".encode())
        if meta_item is not None and meta_item.size <= MAX_METADATA_BYTES and not upload.odd:
            try:
                raw = store.get_bytes(meta_item.key, limit=MAX_METADATA_BYTES) or b""
            except Exception:  # whatever the upload does to a read, its run refuses it, not this look
                raw = b""
            content.update(raw)
            waiting = live.wait(data_dir, raw, now) if live else None
            if waiting:
                result.waiting.append(f"{name}: {waiting}")
                continue
            meta, _, _ = parse_metadata(raw)
            if meta is not None and not split_queries(data_dir, meta.month, meta.query_set).is_file():
                # test_split's partition key is the month's first day (assets/partitions.py).
                result.waiting.append(
                    f"{name}: no split for {meta.month} yet: waits for test_split {meta.month}-01 (scored once it is built)"
                )
                continue
        result.ready[name] = content.hexdigest()[:16]
    return result
