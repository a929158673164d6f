"""Resolution of a live round (docs/live.md, "Resolution"): once a target date t has closed, every
question (t, s, o) of the round gets its answer, every level-2 relation s took toward o on t by the
event database's rule (pipeline/splits/database.py day_events: daily mentions ≥ article_min_mentions and
at least one kept article that day), possibly none.

A date closes like a month does for its split (pipeline/splits/split.py month_closure), per day: every
slot of t's ledger landed or confirmed missing (CLOSED_STATUSES), t's daily quads and articles
stored, and now ≥ t + 1 day + live_resolution_grace_hours. The round must be published (its local
manifest.json) and its submission deadline passed; the deadline is 00:00 of the earliest target
date, so a closed date is always past it, and the check is kept as a guard against a bad manifest.

Answers are written once per date: live/<D>/answers/<t>.parquet locally, then
live/rounds/<D>/answers-<t>.jsonl in the release store (if absent), and live/index.json is rebuilt
(pipeline/live/publication.py write_live_index) so that it lists the date. A resolved date is never
recomputed (a later change of t's files cannot change a published answer), and a store object with
other bytes than ours is refused, never overwritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.columns import Columns
from pipeline.config import DatasetSettings, LiveSettings
from pipeline.gdelt.ledger import read_ledger, summarize
from pipeline.live.publication import store_deadline, write_live_index
from pipeline.live.rounds import answers_file, round_dir
from pipeline.release.layout import is_day, live_answers_name, live_round_key
from pipeline.release.publish import IMMUTABLE_CACHE, ReleaseConflict
from pipeline.release.store import ReleaseStore
from pipeline.splits.database import day_events, day_inputs_missing
from pipeline.splits.split import CLOSED_STATUSES
from pipeline.storage import DataLayout, atomic_write_parquet

ANSWERS_COLUMNS = Columns(
    {
        "query_id": (pl.String, "The question answered (the round's query_id)"),
        "answer_list": (
            pl.List(pl.String),
            "Sorted unique CAMEO level-2 codes s took toward o on the target date (event database rule); may be empty",
        ),
    }
)
ANSWERS_SCHEMA = ANSWERS_COLUMNS.schema
RESOLUTION_VERSION = "live-resolution-v1"
# An answers file is ~100 questions × ~60 bytes; anything far larger in the store is not ours.
MAX_ANSWERS_BYTES = 16 * 2**20


class RoundNotPublished(RuntimeError):
    """The round has no local questions or manifest: nothing to resolve."""


def answers_path(dataset: DatasetSettings, round_day: date, target: date) -> Path:
    return answers_file(dataset.data_dir, round_day, target)


@dataclass(frozen=True)
class DayClosure:
    """Whether target date t may be resolved; ``reasons`` say what it waits for."""

    day: date
    closed: bool
    reasons: tuple[str, ...]
    slots: dict[str, int]


def day_closure(day: date, dataset: DatasetSettings, live: LiveSettings, now: datetime) -> DayClosure:
    """month_closure's rule for one day, with the live grace period (in hours)."""
    layout = DataLayout(dataset.data_dir)
    ledger = read_ledger(layout, day)
    slots = summarize(ledger)
    reasons = []
    due = datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC) + timedelta(
        hours=live.resolution_grace_hours
    )
    if now < due:
        reasons.append(f"grace period runs until {due.isoformat()}")
    if ledger.height == 0:
        reasons.append(f"no slot ledger (gdelt_files {day} not materialised)")
    unsettled = {k: v for k, v in slots.items() if v and k not in CLOSED_STATUSES}
    if unsettled:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(unsettled.items()))
        reasons.append(f"slots not settled: {counts} in gdelt_files {day}")
    missing = day_inputs_missing(day, dataset)
    if missing:
        reasons.append(f"not stored yet: {', '.join(f'{name} {day}' for name in missing)}")
    return DayClosure(day=day, closed=not reasons, reasons=tuple(reasons), slots=slots)


@dataclass(frozen=True)
class DateResolution:
    target: date
    resolved: bool
    reasons: tuple[str, ...]  # why it waits (empty once resolved)
    questions: int
    empty: int  # questions whose answer is empty
    newly: bool  # resolved by this call (False: read back, or waiting)
    store_key: str | None = None


@dataclass(frozen=True)
class RoundResolution:
    round_day: date
    dates: list[DateResolution] = field(default_factory=list)

    @property
    def resolved(self) -> list[date]:
        return [d.target for d in self.dates if d.resolved]

    @property
    def waiting(self) -> dict[str, list[str]]:
        return {d.target.isoformat(): list(d.reasons) for d in self.dates if not d.resolved}


def read_round(dataset: DatasetSettings, round_day: date) -> tuple[pl.DataFrame, dict]:
    """The round's private questions and its published manifest, as stored at publication."""
    directory = round_dir(dataset.data_dir, round_day)
    questions, manifest = directory / "questions.parquet", directory / "manifest.json"
    if not questions.exists() or not manifest.exists():
        raise RoundNotPublished(f"round {round_day}: no published round under {directory}")
    return pl.read_parquet(questions), json.loads(manifest.read_text())


def compute_answers(questions: pl.DataFrame, target: date, dataset: DatasetSettings) -> pl.DataFrame:
    """ANSWERS_SCHEMA rows, one per question on ``target``, in query_id order: the sorted distinct
    level-2 relations of (t, s, o) in the day's event-database rows, empty when there are none."""
    asked = questions.filter(pl.col("date") == target).select("query_id", "s", "o")
    relations = day_events(target, dataset).group_by("s", "o").agg(pl.col("r").unique().sort().alias("answer_list"))
    return (
        asked.join(relations, on=["s", "o"], how="left")
        .with_columns(pl.col("answer_list").fill_null(pl.lit([], dtype=pl.List(pl.String))))
        .sort("query_id")
        .select(ANSWERS_SCHEMA.names())
        .match_to_schema(ANSWERS_SCHEMA)
    )


def answers_jsonl(questions: pl.DataFrame, answers: pl.DataFrame) -> bytes:
    """The published answers-<t>.jsonl: query_id, date, s, o, answer_list per line, in query_id order."""
    keyed = answers.join(questions.select("query_id", "date", "s", "o"), on="query_id", how="left").sort("query_id")
    lines = [
        json.dumps(
            {"query_id": q, "date": t.isoformat(), "s": s, "o": o, "answer_list": list(a)},
            ensure_ascii=True,
            separators=(",", ":"),
        )
        for q, a, t, s, o in keyed.select("query_id", "answer_list", "date", "s", "o").iter_rows()
    ]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def publish_answers(store: ReleaseStore, round_day: date, target: date, data: bytes) -> str:
    """Put the answers once; an object already there must hold the same bytes (ReleaseConflict)."""
    key = live_round_key(round_day.isoformat(), live_answers_name(target.isoformat()))
    if not store.put_bytes(key, data, cache_control=IMMUTABLE_CACHE, if_absent=True):
        stored = store.get_bytes(key, limit=MAX_ANSWERS_BYTES)
        if stored != data:
            raise ReleaseConflict(
                f"{key} at {store.description} holds other bytes than the answers resolved here; a resolved "
                "date is immutable, so nothing was overwritten (find out who wrote it before removing it)"
            )
    return key


def closing_time(manifest: dict, store: ReleaseStore | None) -> datetime:
    """When the round stops taking submissions, as acceptance judges it: the deadline on the
    store's clock (publication.store_deadline: live, the published deadline plus the manifest's
    upload latency; for a replayed round, its timeline placed in store time), never before the
    published deadline; without a store, the published deadline. Resolving earlier would publish
    answers while a submission could still be accepted (docs/live.md, "Timeline")."""
    published = datetime.fromisoformat(manifest["deadline"])
    return published if store is None else max(published, store_deadline(store, manifest)[0])


def resolve_round(
    round_day: date, dataset: DatasetSettings, live: LiveSettings, *, now: datetime, store: ReleaseStore | None = None
) -> RoundResolution:
    """Resolve every target date of the round that has closed (DayClosure) and is not resolved yet;
    read back the ones already resolved. With a store, publish each resolved date's answers there
    (again when a previous run stopped between the local write and the upload), then rebuild
    live/index.json, whose resolved_dates come from the answers in the store."""
    questions, manifest = read_round(dataset, round_day)
    deadline = closing_time(manifest, store)
    targets = sorted({date.fromisoformat(t) for t in manifest["target_dates"]})
    out = []
    for target in targets:
        path = answers_path(dataset, round_day, target)
        newly = False
        if path.exists():
            answers = pl.read_parquet(path)
        else:
            closure = day_closure(target, dataset, live, now)
            reasons = list(closure.reasons)
            if now < deadline:
                reasons.insert(0, f"submissions are open until {deadline.isoformat()}")
            if reasons:
                n = questions.filter(pl.col("date") == target).height
                out.append(DateResolution(target, False, tuple(reasons), n, 0, False))
                continue
            answers = compute_answers(questions, target, dataset)
            atomic_write_parquet(
                answers,
                path,
                metadata={
                    "resolution_version": RESOLUTION_VERSION,
                    "round": round_day.isoformat(),
                    "date": target.isoformat(),
                    "min_mentions": str(dataset.article_min_mentions),
                    "slots": json.dumps(closure.slots, sort_keys=True),
                },
            )
            newly = True
        key = None
        if store is not None:
            key = publish_answers(store, round_day, target, answers_jsonl(questions, answers))
        empty = answers.filter(pl.col("answer_list").list.len() == 0).height
        out.append(DateResolution(target, True, (), answers.height, empty, newly, key))
    if store is not None:
        write_live_index(store)
    return RoundResolution(round_day, out)


def resolved_answers(dataset: DatasetSettings, round_day: date) -> pl.DataFrame:
    """Every resolved answer of the round so far (ANSWERS_SCHEMA), in query_id order."""
    directory = round_dir(dataset.data_dir, round_day) / "answers"
    paths = sorted(p for p in directory.glob("*.parquet") if is_day(p.stem)) if directory.is_dir() else []
    if not paths:
        return ANSWERS_SCHEMA.to_frame()
    return pl.concat([pl.read_parquet(p).match_to_schema(ANSWERS_SCHEMA) for p in paths]).sort("query_id")


def published_round_days(dataset: DatasetSettings) -> list[date]:
    """Rounds with a local manifest (published), newest first."""
    base = DataLayout(dataset.data_dir).root / "live"
    names = [p.name for p in base.iterdir() if is_day(p.name)] if base.is_dir() else []
    return sorted((date.fromisoformat(n) for n in names if (base / n / "manifest.json").exists()), reverse=True)


def unresolved_dates(
    dataset: DatasetSettings, live: LiveSettings, round_day: date, now: datetime, store: ReleaseStore | None = None
) -> dict[date, tuple[str, ...]]:
    """The round's target dates that are not resolved yet, each with what it waits for (nothing:
    it would resolve now); reads the manifest and each such date's ledger only (a sensor asks this
    of every round on every tick), before the deadline not even those, and asks the store for the
    manifest's timestamp (closing_time) only while some date is unresolved."""
    manifest = json.loads((round_dir(dataset.data_dir, round_day) / "manifest.json").read_text())
    targets = sorted({date.fromisoformat(t) for t in manifest["target_dates"]})
    unresolved = [t for t in targets if not answers_path(dataset, round_day, t).exists()]
    if not unresolved:
        return {}
    deadline = closing_time(manifest, store)
    if now < deadline:
        return dict.fromkeys(unresolved, (f"submissions are open until {deadline.isoformat()}",))
    return {t: day_closure(t, dataset, live, now).reasons for t in unresolved}
