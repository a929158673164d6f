"""Live rounds' submissions (docs/live.md, "Submitting"): accepted or refused, recorded, and
checked by `mirai submit` against the published round.

An upload in the store's submissions/ whose submission.json has a "round" field is for a live
round. Its listing, its metadata (``parse_live_metadata``) and the rejection.json beside a refused
one are pipeline/evaluation/submissions.py's, as for a monthly submission; here it is ``accepted``
or ``rejected`` (never scored here: its answers do not exist yet, pipeline/live/score.py scores it
at resolution), by the deadline on the store's clock, and recorded under
``<data_dir>/live/<round>/submissions/<name>/`` with a normalised predictions.parquet
(``_process_live``); a round not published yet is waited for until its day ends (``live_wait``).

``process`` and ``triage`` are the pipeline's way in to every submission, monthly or live (the
submission asset and sensor): pipeline/evaluation/submissions.py's, given LIVE_PATH (live/ builds
on evaluation/, never the reverse).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.evaluation import submissions as evaluation_submissions
from pipeline.evaluation.score_inputs import ScoringError, read_submission
from pipeline.evaluation.scoring import bounded, match_queries
from pipeline.evaluation.submission_metadata import MAX_METADATA_BYTES, metadata_object, parse_live_metadata
from pipeline.evaluation.submissions import (
    MAX_LISTED_KEYS,
    MAX_SUBMISSION_BYTES,
    LivePath,
    NotReady,
    Triage,
    Upload,
    live_pointer_path,
    put_rejection,
    read_capped,
)
from pipeline.evaluation.submit import Prepared
from pipeline.live.publication import read_local_manifest, recorded_baselines, store_deadline
from pipeline.live.rounds import resolved_targets, round_dir
from pipeline.live.status import publish_status
from pipeline.release.layout import (
    LIVE_QUESTIONS,
    MANIFEST_NAME,
    SUBMISSIONS_DIR,
    ReleaseError,
    UnsafeRelease,
    is_day,
    live_round_key,
)
from pipeline.release.store import ReleaseStore
from pipeline.storage import atomic_write_bytes, atomic_write_parquet

LIVE_RECORD_FORMAT = "mirai-live-submission-v1"
# <data_dir>/live/<D>/submissions/<name>/predictions.parquet: one row per question of the round
LIVE_PREDICTIONS_SCHEMA = {"query_id": pl.String, "relations": pl.List(pl.String), "p_event": pl.Float64}


def owner_sha256(owner_key: str | None) -> str | None:
    """What a live record keeps of a submission's owner key: its sha256, never the key."""
    return hashlib.sha256(owner_key.encode()).hexdigest() if owner_key is not None else None


def live_record_path(data_dir: Path, day: date, name: str) -> Path:
    return round_dir(data_dir, day) / SUBMISSIONS_DIR / name / "record.json"


def read_live_record(data_dir: Path, name: str) -> dict | None:
    pointer = live_pointer_path(data_dir, name)
    if not pointer.is_file():
        return None
    day = date.fromisoformat(json.loads(pointer.read_bytes())["round"])
    return json.loads(live_record_path(data_dir, day, name).read_bytes())


def _published_by(day: date) -> datetime:
    """When a round of ``day`` that is not published yet stops being awaited: the round is
    published on its day D, so a submission for it waits until D ends, then is refused."""
    return datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)


def live_wait(data_dir: Path, raw: bytes, now: datetime) -> str | None:
    """Why a live submission waits (its round's day has not ended and the round is not published
    yet), or None."""
    value, _ = metadata_object(raw)
    if value is None or not is_day(value.get("round")):
        return None
    day = date.fromisoformat(value["round"])
    if read_local_manifest(data_dir, day) is None and now < _published_by(day):
        return f"round {day} is not published yet: waits for live_round {day} (awaited until {_published_by(day).isoformat()})"
    return None


def _live_record(
    name: str, day: date, status: str, reasons: list[str], fields: dict, extra: dict, now: datetime
) -> dict:
    return {
        "format": LIVE_RECORD_FORMAT,
        "submission": name,
        "round": day.isoformat(),
        "status": status,
        "reasons": reasons,
        **{k: fields.get(k) for k in ("model", "knowledge_cutoff", "contact")},
        "owner_sha256": owner_sha256(fields.get("owner_key")),
        "baseline": False,
        "predictions_sha256": None,
        "submitted_at": None,
        "deadline": None,
        "accepted_at": now.isoformat() if status == "accepted" else None,
        "processed_at": now.isoformat(),
    } | extra


def _write_live_record(data_dir: Path, day: date, record: dict, predictions=None) -> dict:
    """The record (and the normalised predictions) under live/D/submissions/<name>/, then the
    pointer that marks the submission processed."""
    name = record["submission"]
    directory = live_record_path(data_dir, day, name).parent
    if predictions is not None:
        atomic_write_parquet(predictions, directory / "predictions.parquet")
    atomic_write_bytes(directory / "record.json", (json.dumps(record, indent=2) + "\n").encode())
    atomic_write_bytes(live_pointer_path(data_dir, name), json.dumps({"round": day.isoformat()}).encode())
    return record


def _earlier_live_duplicate(data_dir: Path, day: date, name: str, sha256: str) -> str | None:
    base = round_dir(data_dir, day) / SUBMISSIONS_DIR
    for path in sorted(base.glob("*/record.json")) if base.is_dir() else []:
        record = json.loads(path.read_bytes())
        if record["submission"] != name and record["status"] == "accepted" and record["predictions_sha256"] == sha256:
            return record["submission"]
    return None


def normalised_predictions(query_ids: list[str], found: dict[str, tuple[object, list]], p_event: dict) -> pl.DataFrame:
    """One row per question: its level-2 codes as scored (sorted, unique; [] when none or no
    prediction) and p_event (null when not given)."""
    relations = [
        sorted({code for codes in found[q][0].values() for code in codes}) if q in found else [] for q in query_ids
    ]
    return pl.DataFrame(
        {"query_id": query_ids, "relations": relations, "p_event": [p_event.get(q) for q in query_ids]},
        schema=LIVE_PREDICTIONS_SCHEMA,
    )


def _too_late(
    data_dir: Path, day: date, manifest: dict, extra: dict, late: bool, how: str, upload: Upload
) -> list[str]:
    """A live submission's timing problems: past the deadline, uploaded in parts, or its round
    already resolved (out of _process_live to keep it under ~80 lines)."""
    problems = []
    # A store may date an object uploaded in parts by when its upload began (S3 keeps an upload
    # open for as long as the client likes): one begun before the deadline could carry bytes
    # written once the target dates were known. `mirai submit` sends each file in one PUT.
    problems += [
        f"{item.key.rsplit('/', 1)[1]} was uploaded in parts (multipart): the store's time for it may be when "
        "its upload began, not when it was written, so a live round takes only files sent in one PUT, "
        "as `mirai submit --live` sends them"
        for item in upload.files.values()
        if item.multipart
    ]
    if late:
        problems.append(
            f"late: the submission's last object reached the store at {extra['submitted_at']}, after the round's "
            f"deadline {extra['deadline']} ({how})"
        )
    # Answers published, no forecast is taken, whatever the store says of its objects' times: a
    # store that dates a multipart upload by its start would let one begun before the deadline
    # and completed after the answers came out pass the check above.
    answered = resolved_targets(data_dir, day, [date.fromisoformat(t) for t in manifest["target_dates"]])
    if answered:
        problems.append(
            f"round {day} is already resolved (answers for {', '.join(map(str, answered))} are out): a submission "
            "processed after that is refused, whatever its objects' timestamps"
        )
    return problems


def _process_live(
    store: ReleaseStore, upload: Upload, data_dir: Path, now: datetime, raw: bytes, problems: list[str], rejected
) -> dict:
    """Accept or refuse a live round's submission (docs/live.md, "Submitting"): metadata field by
    field, the deadline on the store's clock against the latest of the submission's objects, the
    predictions read as `mirai score` reads them and matched strictly to the round's question ids."""
    name = upload.name
    meta, fields, found = parse_live_metadata(raw)
    problems = problems + found
    predictions = upload.predictions
    problems += [
        f"{p.key.rsplit('/', 1)[1]} is {p.size:,} bytes, over the {MAX_SUBMISSION_BYTES:,} cap; not read"
        for p in predictions
        if p.size > MAX_SUBMISSION_BYTES
    ]
    day = date.fromisoformat(fields["round"]) if "round" in fields else None
    manifest = read_local_manifest(data_dir, day) if day else None
    if day is not None and manifest is None:
        if now < _published_by(day):
            raise NotReady(f"{name}: round {day} is not published yet: try again later")
        problems.append(f"round {day} was never published (the published rounds are in live/index.json)")
    if manifest is None:  # no round to file it under: a rejected record in the submissions area
        return rejected(problems, fields)
    submitted = max(item.modified for item in upload.files.values())
    due, how = store_deadline(store, manifest)
    extra = {
        "submitted_at": submitted.astimezone(UTC).isoformat(),
        "deadline": due.astimezone(UTC).isoformat(),
        "deadline_published": manifest["deadline"],
    }

    def refuse(reasons: list[str], sha256: str | None = None) -> dict:
        record = _live_record(name, day, "rejected", bounded(reasons), fields, extra, now)
        record["predictions_sha256"] = sha256
        record["reasons"] = put_rejection(store, name, record["reasons"], now.isoformat())
        return _write_live_record(data_dir, day, record)

    problems += _too_late(data_dir, day, manifest, extra, submitted > due, how, upload)
    if problems or meta is None:
        return refuse(problems)
    item = predictions[0]
    filename = item.key.rsplit("/", 1)[1]
    data, problem = read_capped(store, item.key, MAX_SUBMISSION_BYTES)
    if problem or data is None:
        return refuse([f"{filename} could not be read: {problem or 'it disappeared while being processed'}"])
    sha256 = hashlib.sha256(data).hexdigest()
    earlier = _earlier_live_duplicate(data_dir, day, name, sha256)
    if earlier is not None:
        return refuse(
            [f"duplicate: the same predictions (sha256 {sha256}) were already accepted for round {day} as {earlier!r}"],
            sha256,
        )
    query_ids = pl.read_parquet(round_dir(data_dir, day) / "questions.parquet", columns=["query_id"])
    query_ids = query_ids.get_column("query_id").to_list()
    with tempfile.TemporaryDirectory(prefix="mirai-submission-") as private:  # mode 0700
        path = Path(private) / filename
        path.write_bytes(data)
        try:
            rounds, read_problems = read_submission(path, query_ids)
        except ScoringError as exc:
            return refuse([str(exc).replace(str(path), filename)], sha256)
    matched, match_problems, _ = match_queries(rounds, dict.fromkeys(query_ids), known_as=round_questions(day))
    if read_problems or match_problems:
        return refuse([f"{filename}: {line}" for line in read_problems + match_problems], sha256)
    p_event = {}
    for record in rounds[0]:
        p_event.setdefault(record.query_id, record.p_event)
    extra |= {
        "predictions_sha256": sha256,
        "baseline": recorded_baselines(data_dir, day).get(name) == sha256,
        "questions": len(query_ids),
        "answered": len(matched[0]),
    }
    record = _live_record(name, day, "accepted", [], fields, extra, now)
    return _write_live_record(data_dir, day, record, normalised_predictions(query_ids, matched[0], p_event))


# --- mirai submit -------------------------------------------------------------------------------


def check_live_locally(prepared: Prepared, store: ReleaseStore) -> tuple[dict, list[str]]:
    """(the round's published manifest, one line per problem): the checks acceptance applies to a
    live submission's predictions, against the round's questions.jsonl as the store publishes it."""
    day = prepared.meta.round.isoformat()
    where = f"{live_round_key(day, MANIFEST_NAME)} in {store.description}"
    try:
        manifest = json.loads(store.get_bytes(live_round_key(day, MANIFEST_NAME), limit=MAX_METADATA_BYTES) or b"null")
        questions = store.get_bytes(live_round_key(day, LIVE_QUESTIONS), limit=MAX_SUBMISSION_BYTES)
        query_ids = [json.loads(line)["query_id"] for line in (questions or b"").splitlines()]
    except (ValueError, RecursionError, TypeError, KeyError, UnsafeRelease) as exc:
        return {}, [f"round {day}: its published files cannot be read ({type(exc).__name__})"]
    if not isinstance(manifest, dict) or not query_ids:
        return {}, [f"round {day} is not published in {store.description} (no {where})"]
    if manifest.get("round") != day:
        return {}, [f"{where} is not the manifest of round {day}; nothing was uploaded"]
    with tempfile.TemporaryDirectory(prefix="mirai-submit-") as private:
        path = Path(private) / prepared.filename
        path.write_bytes(prepared.predictions)
        try:
            rounds, problems = read_submission(path, query_ids)
        except ScoringError as exc:
            return manifest, [str(exc).replace(str(path), prepared.filename)]
    _, found, _ = match_queries(rounds, dict.fromkeys(query_ids), known_as=round_questions(day))
    return manifest, [f"{prepared.filename}: {line}" for line in problems + found]


def round_questions(day: object) -> str:
    """What a live record's query id must be in, as a refusal says it."""
    return f"round {day}'s questions, whose ids are {day}-NNNN"


def deadline_courtesy(
    store: ReleaseStore, manifest: dict, now: datetime, warn_before: timedelta
) -> tuple[str | None, str | None]:
    """(why `mirai submit` refuses to upload now, a warning): the round's deadline as acceptance
    places it on the store's clock (``store_deadline``), against ``now`` on the submitter's clock.
    A courtesy that saves a doomed upload: the store's timestamps decide acceptance, so a clock
    that runs early or late can only make this check wrong, never the verdict."""
    day = manifest.get("round")
    try:
        due, how = store_deadline(store, manifest)
    except (KeyError, TypeError, ValueError, OverflowError, ReleaseError):
        due = None
    if due is None or due.tzinfo is None:  # a time without a zone cannot be placed on any clock
        return f"round {day}: its manifest's deadline cannot be read; nothing was uploaded", None
    left = timedelta(seconds=round((due - now).total_seconds()))  # whole seconds, as store times are
    if now > due:
        return (
            f"round {day}: its deadline {due.astimezone(UTC).isoformat()} (store time: {how}) passed "
            f"{-left} ago by this machine's clock; the pipeline would refuse the submission as late, so nothing "
            "was uploaded (the store's clock decides acceptance; this refusal is only a courtesy)"
        ), None
    if left < warn_before:
        return None, (
            f"round {day}: only {left} left before its deadline {due.astimezone(UTC).isoformat()} (store time, "
            "by this machine's clock): an upload that reaches the store later is refused as late"
        )
    return None, None


# --- every submission, monthly or live -------------------------------------------------------------

LIVE_PATH = LivePath(read_record=read_live_record, wait=live_wait, process=_process_live)


def process(store: ReleaseStore, name: str, data_dir: Path, *, now: datetime | None = None) -> dict:
    """Check and record submission ``name``, monthly (scored) or live (accepted or refused); return
    its record: pipeline/evaluation/submissions.py's ``process`` with LIVE_PATH. A live record's
    public status is (re)published (live/status/<name>.json, pipeline/live/status.py), also for a
    record made earlier: a run that stopped between the two writes is completed by the next."""
    record = evaluation_submissions.process(store, name, data_dir, now=now, live=LIVE_PATH)
    if record.get("format") == LIVE_RECORD_FORMAT:
        publish_status(store, data_dir, record)
    return record


def triage(
    store: ReleaseStore,
    data_dir: Path,
    *,
    start_after: str = "",
    now: datetime | None = None,
    max_keys: int = MAX_LISTED_KEYS,
) -> Triage:
    """One bounded look at submissions/, monthly and live: pipeline/evaluation/submissions.py's
    ``triage`` with LIVE_PATH (a live submission waits for its round's publication)."""
    return evaluation_submissions.triage(
        store, data_dir, start_after=start_after, now=now, max_keys=max_keys, live=LIVE_PATH
    )
