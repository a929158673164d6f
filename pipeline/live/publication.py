"""A live round published (docs/live.md, "Timeline" and "Formats"): its questions.jsonl and
manifest.json written once to the release store within the round's timeline, its model-free
baselines submitted through the same acceptance path as anyone's, and live/index.json, the list
of published rounds rebuilt from one bounded listing. The round itself is built by
pipeline/live/rounds.py; publishing only writes what it built, never a second version of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import polars as pl

from pipeline.config import DatasetSettings, GdeltSettings, LiveSettings, data_source
from pipeline.evaluation.baselines import forecast
from pipeline.live.rounds import (
    LIVE_SAMPLER_VERSION,
    Round,
    build_round,
    deadline,
    round_dir,
    target_dates,
    window_days,
)
from pipeline.release.layout import (
    LIVE_ANSWERS,
    LIVE_INDEX_KEY,
    LIVE_QUESTIONS,
    LIVE_ROUNDS_DIR,
    MANIFEST_NAME,
    MAX_JSON_BYTES,
    SUBMISSION_META,
    ReleaseError,
    UnsafeRelease,
    is_day,
    live_round_key,
    load_json,
    shown,
    submission_key,
)
from pipeline.release.publish import IMMUTABLE_CACHE, POINTER_CACHE, ReleaseConflict, sha256_hex
from pipeline.release.store import ReleaseStore
from pipeline.splits.split import SAMPLER_CANDIDATES, SAMPLER_WEIGHTS
from pipeline.storage import atomic_write_bytes, atomic_write_parquet
from pipeline.version import code_version

ROUND_FORMAT = "mirai-live-round-v1"
INDEX_FORMAT = "mirai-live-index-v1"
BASELINES = ("recurrency", "frequency")
# live/rounds/ holds 2 + len(horizons) keys a round: 20,000 is over a decade of daily rounds.
MAX_LIVE_KEYS = 20_000


class RoundRefused(ReleaseError):
    """Publishing the round now would break its timeline (docs/live.md, "Timeline")."""


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


# --- the manifest -----------------------------------------------------------------------------


def round_manifest(
    rnd: Round, dataset: DatasetSettings, gdelt: GdeltSettings, live: LiveSettings, published_at: datetime
) -> dict:
    questions = rnd.jsonl()
    return {
        "format": ROUND_FORMAT,
        "round": rnd.day.isoformat(),
        "history_cutoff": (rnd.day - timedelta(days=1)).isoformat(),
        "horizons": list(live.horizon_days),
        "target_dates": [t.isoformat() for t in target_dates(rnd.day, live)],
        "deadline": _iso(deadline(rnd.day, live)),
        "published_at": _iso(published_at),
        "sampler": {
            "version": LIVE_SAMPLER_VERSION,
            "seed": rnd.seed,
            "live_seed": live.seed,
            "window_days": live.window_days,
            "round_size": live.round_size,
            "quiet_share": live.quiet_share,
            "candidates_per_step": SAMPLER_CANDIDATES,
            "weights": SAMPLER_WEIGHTS,
            "pools": rnd.pools,
            "pairs": sum(rnd.drawn.values()),
        },
        "window": {
            "first": window_days(rnd.day, live)[0].isoformat(),
            "last": window_days(rnd.day, live)[-1].isoformat(),
            "days_read": len(rnd.days_read),
            "days_missing": [d.isoformat() for d in rnd.days_missing],
        },
        "thresholds": {
            "database_min_mentions": dataset.article_min_mentions,
            "test_min_mentions": dataset.test_min_mentions,
            "test_min_articles": dataset.test_min_articles,
        },
        "files": {
            LIVE_QUESTIONS: {"sha256": sha256_hex(questions), "bytes": len(questions), "rows": rnd.questions.height}
        },
        "source": data_source(dataset, gdelt),
        "code_version": code_version(),
    }


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2) + "\n").encode()


def _identity(manifest: dict) -> dict:
    """What makes two manifests the same round: everything but when and by which code it was published."""
    return {k: v for k, v in manifest.items() if k not in ("published_at", "code_version")}


# --- baselines --------------------------------------------------------------------------------


def baseline_name(day: date, method: str) -> str:
    return f"live-{day.isoformat()}-{method}"


def baseline_predictions(rnd: Round) -> dict[str, bytes]:
    """{method: predictions.jsonl} for BASELINES, from the window's events only: a question of
    horizon h sees events up to t − (h + 1) = D − 1 (baselines.visible_history). p_event, the
    probability that s acts toward o on t at all: for frequency, the share of the window's days
    read on which the pair had an event-database row; for recurrency, 1 when it had one on the
    last day read (what happened most recently happens again), else 0."""
    history = rnd.events.select("date", "s", "r", "o")
    days = (
        rnd.events.group_by("s", "o")
        .agg(
            pl.col("date").n_unique().alias("days"),
            (pl.col("date") == max(rnd.days_read)).any().alias("last_day"),
        )
        .with_columns(
            (pl.col("days") / len(rnd.days_read)).alias("frequency"),
            pl.col("last_day").cast(pl.Float64).alias("recurrency"),
        )
    )
    queries = rnd.questions.select("query_id", "date", "s", "o", "horizon")
    out = {}
    for method in BASELINES:
        forecasts = pl.concat(
            [
                forecast(method, part.drop("horizon"), history, distance_days=int(horizon) + 1)
                for (horizon,), part in queries.partition_by("horizon", as_dict=True, maintain_order=True).items()
            ]
        )
        rows = (
            queries.join(forecasts, on="query_id", how="left")
            .join(days.select("s", "o", pl.col(method).alias("p_event")), on=["s", "o"], how="left")
            .with_columns(pl.col("p_event").fill_null(0.0))
            .sort("query_id")
        )
        out[method] = "".join(
            json.dumps({"query_id": q, "answer": json.loads(a), "ranked": r, "p_event": p}) + "\n"
            for q, a, r, p in rows.select("query_id", "answer_dict", "ranked", "p_event").iter_rows()
        ).encode()
    return out


def baseline_metadata(day: date, method: str) -> bytes:
    return (
        json.dumps(
            {
                "model": f"{method} baseline",
                "knowledge_cutoff": (day - timedelta(days=1)).isoformat(),
                "contact": "mirai-pipeline (model-free baseline, submitted at publication)",
                "round": day.isoformat(),
            },
            indent=2,
        )
        + "\n"
    ).encode()


def put_once(store: ReleaseStore, key: str, data: bytes, cache_control: str) -> str | None:
    """Write ``data`` at ``key`` unless there; None when the key holds ``data`` now, else why not."""
    if store.put_bytes(key, data, cache_control=cache_control, if_absent=True):
        return None
    try:
        found = store.get_bytes(key, limit=max(len(data), MAX_JSON_BYTES))
    except UnsafeRelease as exc:
        return str(exc)
    return None if found == data else f"{key} in {store.description} holds other bytes ({len(found or b'')} bytes)"


def submit_baselines(rnd: Round, dataset: DatasetSettings, store: ReleaseStore) -> dict[str, str]:
    """Upload each baseline as a submission (predictions first, submission.json last), through the
    same acceptance path as anyone's. Their names and predictions' sha256 go to the round's private
    baselines.json first, which is how acceptance knows a baseline from a stranger's upload under
    the same name. Returns {submission name: "submitted" or why not}."""
    predictions = baseline_predictions(rnd)
    recorded = {baseline_name(rnd.day, m): hashlib.sha256(data).hexdigest() for m, data in predictions.items()}
    atomic_write_bytes(
        round_dir(dataset.data_dir, rnd.day) / "baselines.json",
        (json.dumps(recorded, indent=2) + "\n").encode(),
    )
    outcome = {}
    for method, data in predictions.items():
        name = baseline_name(rnd.day, method)
        problem = put_once(store, submission_key(name, "predictions.jsonl"), data, POINTER_CACHE) or put_once(
            store, submission_key(name, SUBMISSION_META), baseline_metadata(rnd.day, method), POINTER_CACHE
        )
        outcome[name] = problem or "submitted"
    return outcome


def recorded_baselines(data_dir: Path | str, day: date) -> dict[str, str]:
    """{baseline submission name: its predictions' sha256}, as the round's publication recorded."""
    path = round_dir(data_dir, day) / "baselines.json"
    return json.loads(path.read_bytes()) if path.is_file() else {}


# --- publication ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publication:
    day: date
    manifest: dict
    manifest_key: str
    published_now: bool  # False: the identical round was already in the store
    questions: int
    pools: dict[str, int]
    drawn: dict[str, int]
    baselines: dict[str, str]
    index_written: bool


def read_local_manifest(data_dir: Path | str, day: date) -> dict | None:
    """The manifest this pipeline published for ``day`` (trusted: our own data directory)."""
    path = round_dir(data_dir, day) / MANIFEST_NAME
    return json.loads(path.read_bytes()) if path.is_file() else None


def publish_round(
    day: date, dataset: DatasetSettings, gdelt: GdeltSettings, live: LiveSettings, store: ReleaseStore, *, now: datetime
) -> Publication:
    """Build the round of ``day`` and publish it: questions.jsonl, then manifest.json (its presence
    means the round is published), each written once; then the baselines' submissions and
    live/index.json. A re-run that builds the same round is a no-op; one that builds a different
    round refuses (ReleaseConflict): a round is immutable. A new round is refused (RoundRefused)
    before the day D starts (the window's last day is not over) and from its deadline on."""
    rnd = build_round(day, dataset, live)
    manifest_key = live_round_key(day.isoformat(), MANIFEST_NAME)
    questions = rnd.jsonl()
    ours = round_manifest(rnd, dataset, gdelt, live, now)
    published = store.get_bytes(manifest_key, limit=MAX_JSON_BYTES)
    if published is None:
        start, due = datetime.combine(day, time.min, UTC), deadline(day, live)
        if now < start:
            raise RoundRefused(f"round {day}: not before {_iso(start)} (its history runs through {day - timedelta(1)})")
        if now >= due:
            raise RoundRefused(
                f"round {day}: publication at {_iso(now)} is not before its deadline {_iso(due)}; a round is "
                "published before any of its answers can happen, never after"
            )
        problem = put_once(store, live_round_key(day.isoformat(), LIVE_QUESTIONS), questions, IMMUTABLE_CACHE)
        if problem:
            raise ReleaseConflict(f"round {day}: {problem}; a published round is never rewritten")
        written = store.put_bytes(manifest_key, manifest_bytes(ours), cache_control=IMMUTABLE_CACHE, if_absent=True)
        published = manifest_bytes(ours) if written else store.get_bytes(manifest_key, limit=MAX_JSON_BYTES)
    else:
        written = False
    theirs = load_json(published or b"", f"{manifest_key} in {store.description}")
    if not isinstance(theirs, dict) or _identity(theirs) != _identity(ours):
        raise ReleaseConflict(
            f"round {day}: {manifest_key} in {store.description} is not the round built now (its questions or "
            "sampler differ); a published round is never rewritten: look at what changed in the window's files"
        )
    directory = round_dir(dataset.data_dir, day)
    atomic_write_parquet(rnd.questions, directory / "questions.parquet")
    atomic_write_bytes(directory / MANIFEST_NAME, published)
    baselines = submit_baselines(rnd, dataset, store)
    return Publication(
        day=day,
        manifest=theirs,
        manifest_key=manifest_key,
        published_now=written,
        questions=rnd.questions.height,
        pools=rnd.pools,
        drawn=rnd.drawn,
        baselines=baselines,
        index_written=write_live_index(store),
    )


# --- the index --------------------------------------------------------------------------------


def _checked_manifest(store: ReleaseStore, day: str, key: str) -> tuple[dict, bytes]:
    where = f"{key} in {store.description}"
    raw = store.get_bytes(key, limit=MAX_JSON_BYTES) or b""
    manifest = load_json(raw, where)
    if not isinstance(manifest, dict) or manifest.get("format") != ROUND_FORMAT or manifest.get("round") != day:
        raise UnsafeRelease(f"{where} is not the {ROUND_FORMAT} manifest of round {day}; refused, nothing was written")
    dates = manifest.get("target_dates")
    if not (isinstance(dates, list) and dates and all(is_day(t) for t in dates)):
        raise UnsafeRelease(f"{where}: target_dates {shown(dates)} are not days YYYY-MM-DD; refused")
    moment = manifest.get("deadline")
    try:
        datetime.fromisoformat(moment)
    except (TypeError, ValueError):
        raise UnsafeRelease(f"{where}: deadline {shown(moment)} is not an ISO time; refused") from None
    return manifest, raw


def live_index(store: ReleaseStore) -> dict:
    """Every published round (its manifest is there), newest first, from one bounded listing of
    live/rounds/: its manifest's key and sha256, deadline and target dates, and the target dates
    whose answers are published."""
    listing = store.list_keys(f"{LIVE_ROUNDS_DIR}/", max_keys=MAX_LIVE_KEYS)
    if listing.truncated:
        raise ReleaseError(f"{store.description}: more than {MAX_LIVE_KEYS} keys under {LIVE_ROUNDS_DIR}/; refused")
    files: dict[str, set[str]] = {}
    for item in listing.keys:
        day, _, name = item.key.removeprefix(f"{LIVE_ROUNDS_DIR}/").partition("/")
        if is_day(day) and item.problem is None:
            files.setdefault(day, set()).add(name)
    rounds = []
    for day in sorted((d for d, names in files.items() if MANIFEST_NAME in names), reverse=True):
        key = live_round_key(day, MANIFEST_NAME)
        manifest, raw = _checked_manifest(store, day, key)
        answered = {m[1] for m in map(LIVE_ANSWERS.fullmatch, files[day]) if m}
        entry = {
            "round": day,
            "manifest": key,
            "manifest_sha256": sha256_hex(raw),
            "questions": live_round_key(day, LIVE_QUESTIONS),
            "deadline": manifest["deadline"],
            "target_dates": manifest["target_dates"],
            "resolved_dates": sorted(answered & set(manifest["target_dates"])),
        }
        if store.configured_url(key) is not None:
            entry["manifest_url"] = store.configured_url(key)
        rounds.append(entry)
    return {"format": INDEX_FORMAT, "rounds": rounds}


def write_live_index(store: ReleaseStore) -> bool:
    """Rewrite live/index.json from the store's listing when it changed; whether it was written."""
    data = (json.dumps(live_index(store), indent=2) + "\n").encode()
    if store.get_bytes(LIVE_INDEX_KEY, limit=MAX_JSON_BYTES) == data:
        return False
    store.put_bytes(LIVE_INDEX_KEY, data, cache_control=POINTER_CACHE, if_absent=False)
    return True


def store_deadline(store: ReleaseStore, manifest: dict) -> tuple[datetime, str]:
    """The round's deadline on the store's clock, and how it was found. The published deadline is
    anchored to the store's own timestamp of the round's manifest: manifest.modified + (deadline −
    published_at). Live, that is the deadline up to the upload's latency, with no skew between our
    clock and the store's; for a replayed past round (the demo), it keeps the round's timeline in
    store time (docs/live.md, "Timeline")."""
    published_deadline = datetime.fromisoformat(manifest["deadline"])
    info = store.stat(live_round_key(manifest["round"], MANIFEST_NAME))
    if info is None:
        return published_deadline, f"the published deadline (no {MANIFEST_NAME} of the round in the store to anchor it)"
    lead = published_deadline - datetime.fromisoformat(manifest["published_at"])
    return info.modified + lead, f"{lead} after the round's {MANIFEST_NAME} reached the store"
