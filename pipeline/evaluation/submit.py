"""`mirai submit`, the submitter's side (docs/evaluation.md, "Submissions"): ``prepare`` applies the
pipeline's checks to local files, ``score_locally`` scores them strictly as the pipeline will,
``check_name_free`` and ``upload`` put them in the release store's submissions/ (predictions first,
submission.json last). A live submission's predictions are checked against its round by
live/submissions.py's ``check_live_locally``. Out of submissions.py, which processes what lands.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.evaluation.scoring import score_predictions
from pipeline.evaluation.submission_metadata import (
    MAX_METADATA_BYTES,
    LiveMetadata,
    Metadata,
    is_live_metadata,
    parse_live_metadata,
    parse_metadata,
)
from pipeline.evaluation.submissions import MAX_SUBMISSION_BYTES, SubmissionError
from pipeline.evaluation.subsets import is_subset
from pipeline.release.layout import (
    PREDICTION_NAMES,
    SUBMISSION_META,
    SUBMISSIONS_DIR,
    is_submission_name,
    shown,
    submission_key,
)
from pipeline.release.publish import POINTER_CACHE
from pipeline.release.store import ReleaseStore


@dataclass(frozen=True)
class Prepared:
    """A submission checked on the submitter's machine, ready to upload."""

    name: str
    meta: Metadata | LiveMetadata
    metadata: bytes  # submission.json as read
    filename: str  # predictions.<ext>
    predictions: bytes


def _read_local(path: Path, cap: int, what: str) -> bytes:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SubmissionError(f"{path}: {exc.strerror}") from None
    if not path.is_file():
        raise SubmissionError(f"{path}: not a file")
    if size > cap:
        raise SubmissionError(f"{path}: {what} is {size:,} bytes, over the {cap:,} cap")
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise SubmissionError(f"{path}: {what} is over the {cap:,} cap")
    return data


def prepare(name: str, predictions: Path, metadata: Path) -> tuple[Prepared | None, list[str]]:
    """The checks the pipeline applies before scoring, on local files: (the submission, []) or
    (None, one line per problem)."""
    problems = []
    if not is_submission_name(name):
        problems.append(f"the name {shown(name)} is not letters, digits and '._-' (at most 64, starting alphanumeric)")
    suffix = predictions.suffix.lower()
    filename = f"predictions{suffix}"
    if filename not in PREDICTION_NAMES:
        problems.append(
            f"{predictions}: expected a .jsonl, .csv or .parquet file (MIRAI round directories: `mirai score`)"
        )
    meta, raw, data = None, b"", b""
    try:
        raw = _read_local(metadata, MAX_METADATA_BYTES, SUBMISSION_META)
        meta, _, found = (parse_live_metadata if is_live_metadata(raw) else parse_metadata)(raw)
        problems += [line.replace(SUBMISSION_META, str(metadata), 1) for line in found]
    except SubmissionError as exc:
        problems.append(str(exc))
    try:
        data = _read_local(predictions, MAX_SUBMISSION_BYTES, "the predictions file")
    except SubmissionError as exc:
        problems.append(str(exc))
    if problems or meta is None:
        return None, problems
    return Prepared(name, meta, raw, filename, data), []


def score_locally(prepared: Prepared, split_dir: Path):
    """Strict scoring as the pipeline's (InvalidPredictions / ScoringError when it would refuse).
    Predictions that answer exactly a `mirai evaluate --limit` subset are scored over that subset,
    which their card's ``subset`` says (and `mirai submit` then refuses to upload)."""
    with tempfile.TemporaryDirectory(prefix="mirai-submit-") as private:
        path = Path(private) / prepared.filename
        path.write_bytes(prepared.predictions)
        sample, distance = prepared.meta.query_set == "queries_sample", prepared.meta.distance
        result = score_predictions(path, split_dir, sample=sample, distance=distance)
        answered = set(result.queries) - set(result.missing)
        if is_subset(answered, result.queries):
            result = score_predictions(path, split_dir, sample=sample, distance=distance, limit=len(answered))
        return result


def check_name_free(store: ReleaseStore, name: str) -> None:
    if store.list_keys(f"{SUBMISSIONS_DIR}/{name}/", max_keys=1).keys:
        raise SubmissionError(f"the submission name {name!r} is taken in {store.description}: choose another")


def upload(store: ReleaseStore, prepared: Prepared) -> None:
    """Predictions first, submission.json last (its presence means the upload is complete); an
    existing name is never overwritten (SubmissionError)."""
    name = prepared.name
    check_name_free(store, name)
    for file, data in ((prepared.filename, prepared.predictions), (SUBMISSION_META, prepared.metadata)):
        if not store.put_bytes(submission_key(name, file), data, cache_control=POINTER_CACHE, if_absent=True):
            raise SubmissionError(
                f"{submission_key(name, file)} appeared in {store.description} meanwhile: the name {name!r} is "
                "taken; choose another"
            )
