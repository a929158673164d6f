"""A monthly submission's public status (docs/evaluation.md, "A submission's status"): what became
of it, published at releases/status/<name>.json, which anyone may read (releases/ is public-read),
unlike the record and the rejection.json beside the upload in submissions/ (not public: a
submission's metadata holds its contact). Written when the submission is processed (``process`` in
pipeline/evaluation/submissions.py), and again by a later look if a run stopped between the record
and the status. It holds the verdict, the reasons and the scorecard's headline, never the contact.
A live round's submission has its own (pipeline/live/status.py); `mirai status NAME` reads either.
"""

from __future__ import annotations

import json

from pipeline.release.layout import MAX_JSON_BYTES, UnsafeRelease, is_month, load_json, submission_status_key
from pipeline.release.publish import POINTER_CACHE
from pipeline.release.store import ReleaseStore

STATUS_FORMAT = "mirai-submission-status-v1"
OUTCOMES = ("scored", "contaminated", "rejected")
# From the record: what anyone may learn of a submission (the contact stays private).
PUBLIC_FIELDS = (
    "submission",
    "status",
    "reasons",
    "model",
    "knowledge_cutoff",
    "month",
    "query_set",
    "distance",
    "submitted_at",
    "scored_at",
)
SHOWN_METRICS = ("level2_f1", "level1_f1", "mrr")


def public_status(record: dict) -> dict:
    """The public status of a monthly record: its public fields and, once scored, the scorecard's
    headline metrics with their intervals and the queries it answered."""
    status = {"format": STATUS_FORMAT} | {k: record.get(k) for k in PUBLIC_FIELDS}
    card = record.get("scorecard")
    status["score"] = (
        None
        if card is None
        else {
            "queries": card["queries"],
            "missing": card["missing"]["count"],
            "metrics": {m: card["metrics"][m] for m in SHOWN_METRICS if m in card["metrics"]},
        }
    )
    return status


def publish_status(store: ReleaseStore, record: dict) -> bool:
    """Write the record's public status to releases/status/<name>.json when it changed; whether written."""
    data = (json.dumps(public_status(record), indent=2) + "\n").encode()
    key = submission_status_key(record["submission"])
    if store.get_bytes(key, limit=MAX_JSON_BYTES) == data:
        return False
    store.put_bytes(key, data, cache_control=POINTER_CACHE, if_absent=False)
    return True


def read_status(store: ReleaseStore, name: str) -> dict | None:
    """Monthly submission ``name``'s public status, its shape checked (the store may be hostile, and
    every text in it reaches a terminal); None when there is none."""
    key = submission_status_key(name)
    raw = store.get_bytes(key, limit=MAX_JSON_BYTES)
    if raw is None:
        return None
    where = f"{key} at {store.description}"
    status = load_json(raw, where)
    if not (
        has_status_shape(status, name, STATUS_FORMAT, OUTCOMES)
        and (status.get("month") is None or is_month(status.get("month")))
    ):
        raise UnsafeRelease(f"{where} is not the {STATUS_FORMAT} status of {name!r}; refused")
    return status


def has_status_shape(status: object, name: str, format_name: str, outcomes: tuple[str, ...]) -> bool:
    """Whether a status read from the store has the fields every status (monthly or live) shows
    with the types the CLI expects: a hostile store's file of another shape is refused."""
    return (
        isinstance(status, dict)
        and status.get("format") == format_name
        and status.get("submission") == name
        and status.get("status") in outcomes
        and isinstance(status.get("reasons"), list)
        and all(isinstance(r, str) for r in status["reasons"])
        and (status.get("score") is None or isinstance(status.get("score"), dict))
    )
