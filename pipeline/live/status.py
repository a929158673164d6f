"""A live submission's public status (docs/live.md, "A submission's status"): what became of it,
published at live/status/<name>.json, which anyone may read (live/ is public-read), unlike the
rejection.json beside the upload in submissions/ (not public: a submission's metadata holds its
contact). Written when the submission is accepted or refused (``process`` in
pipeline/live/submissions.py) and again when its round's scores change (the live_resolution
asset). It holds the verdict, the reasons and the score, never the contact or the owner key's hash.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from pipeline.live.rounds import round_dir
from pipeline.live.score import OCCURRENCE_METRICS, RANK_METRIC
from pipeline.release.layout import MAX_JSON_BYTES, SUBMISSIONS_DIR, live_status_key
from pipeline.release.publish import POINTER_CACHE
from pipeline.release.store import ReleaseStore

STATUS_FORMAT = "mirai-live-status-v1"
# From the record: what a participant may learn of any submission (the contact and the owner
# key's hash stay private: the board's row ids are keyed for the same reason).
PUBLIC_FIELDS = (
    "submission",
    "round",
    "status",
    "reasons",
    "model",
    "baseline",
    "submitted_at",
    "deadline",
    "processed_at",
    "questions",
    "answered",
)
SHOWN_METRICS = (RANK_METRIC, "level2_f1", *OCCURRENCE_METRICS)


def public_status(record: dict, scores: dict | None) -> dict:
    """The public status of a live record: its public fields, and its score from the round's
    scores.json (``scores``) once a target date is resolved (None before)."""
    status = {"format": STATUS_FORMAT} | {k: record.get(k) for k in PUBLIC_FIELDS}
    entry = (scores or {}).get("submissions", {}).get(record["submission"]) if record["status"] == "accepted" else None
    if entry is None:
        status["score"] = None
    elif not entry.get("scored"):
        status["score"] = {"scored": False, "reason": entry.get("reason")}
    else:
        metrics = entry.get("metrics", {})
        status["score"] = {
            "scored": True,
            "resolved_questions": scores.get("resolved_questions"),
            "questions": scores.get("questions"),
            "metrics": {m: metrics[m] for m in SHOWN_METRICS if m in metrics},
        }
    return status


def _scores(data_dir: Path, day: date) -> dict | None:
    path = round_dir(data_dir, day) / "scores.json"
    return json.loads(path.read_bytes()) if path.is_file() else None


def publish_status(store: ReleaseStore, data_dir: Path, record: dict) -> bool:
    """Write the record's public status to live/status/<name>.json when it changed; whether written."""
    status = public_status(record, _scores(data_dir, date.fromisoformat(record["round"])))
    data = (json.dumps(status, indent=2) + "\n").encode()
    key = live_status_key(record["submission"])
    if store.get_bytes(key, limit=MAX_JSON_BYTES) == data:
        return False
    store.put_bytes(key, data, cache_control=POINTER_CACHE, if_absent=False)
    return True


def publish_round_statuses(store: ReleaseStore, data_dir: Path, day: date) -> int:
    """Every recorded submission of round ``day`` (accepted or refused) with its current score;
    how many statuses changed."""
    base = round_dir(data_dir, day) / SUBMISSIONS_DIR
    records = sorted(base.glob("*/record.json")) if base.is_dir() else []
    return sum(publish_status(store, data_dir, json.loads(path.read_bytes())) for path in records)
