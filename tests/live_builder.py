"""Live-round test data in the formats of docs/live.md (the contract between publication and
resolution): a realistic world of daily quads (pairs that act most days with habitual relations,
pairs that rarely act), a published round's private questions.parquet and manifest.json, and
accepted submissions (record.json + normalised predictions.parquet) as acceptance writes them.
The daily files are written by tests/month_builder.py, so resolution reads them through the real
event-database code."""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import polars as pl

from pipeline.config import Settings, data_source
from pipeline.evaluation import baselines
from pipeline.live.rounds import round_dir
from pipeline.live.submissions import owner_sha256
from pipeline.reference import region_table
from pipeline.release.layout import live_round_key
from pipeline.release.store import LocalStore
from pipeline.splits.database import day_events
from pipeline.storage import atomic_write_bytes, atomic_write_parquet

from .month_builder import Quad, write_days

COUNTRIES = ("USA", "CHN", "RUS", "FRA", "DEU", "GBR", "JPN", "IND", "BRA", "ZAF", "EGY", "TUR")
COMMON = ("010", "020", "036", "040", "042", "043", "046", "051", "057", "061", "112", "120", "173", "190")


def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, UTC)


@dataclass(frozen=True)
class Pair:
    s: str
    o: str
    habits: tuple[tuple[str, float], ...]  # (relation, chance per day)
    stratum: str  # "active" | "quiet"


def pairs(seed: int, active: int = 24, quiet: int = 8) -> list[Pair]:
    rng = random.Random(seed)
    ordered = [(s, o) for s in COUNTRIES for o in COUNTRIES if s != o]
    chosen = rng.sample(ordered, active + quiet)
    out = []
    for i, (s, o) in enumerate(chosen):
        if i < active:
            relations = rng.sample(COMMON, 3)
            out.append(Pair(s, o, tuple(zip(relations, (0.6, 0.4, 0.25))), "active"))
        else:
            out.append(Pair(s, o, ((rng.choice(COMMON), 0.1),), "quiet"))
    return out


def world(seed: int, world_pairs: list[Pair], days: list[date]) -> list[Quad]:
    """Each pair's quads per day: each habitual relation with its chance, and now and then (5%) a
    relation it rarely takes. An active pair's quads are test-grade (≥ 100 mentions, 5 kept
    articles), a quiet pair's only over the database's threshold (one kept article)."""
    rng = random.Random(seed)
    quads = []
    for day in days:
        for pair in world_pairs:
            taken = {r for r, chance in pair.habits if rng.random() < chance}
            if pair.stratum == "active" and rng.random() < 0.05:
                taken.add(rng.choice(COMMON))
            grade = {"mentions": 100, "kept": 5} if pair.stratum == "active" else {"mentions": 60, "kept": 1}
            quads += [
                Quad(day, pair.s, r, pair.o, mentions=grade["mentions"] + rng.randrange(100), kept=grade["kept"])
                for r in sorted(taken)
            ]
    return quads


def write_world(settings: Settings, seed: int, world_pairs: list[Pair], days: list[date], **kwargs) -> None:
    write_days(settings, days, world(seed, world_pairs, days), **kwargs)


def write_round(
    settings: Settings,
    round_day: date,
    world_pairs: list[Pair],
    *,
    horizons: tuple[int, ...] = (1, 7),
    published_at: datetime | None = None,
    store: LocalStore | None = None,
) -> pl.DataFrame:
    """questions.parquet (every pair on every target date) and manifest.json as publication
    writes them (with a store, the manifest in it too); returns the questions."""
    regions = dict(region_table().select("iso3", "region").iter_rows())
    rows = sorted((round_day + timedelta(days=h), p.s, p.o, p.stratum) for h in horizons for p in world_pairs)
    questions = pl.DataFrame(
        [
            {
                "query_id": f"{round_day}-{n:04d}",
                "round": round_day.isoformat(),
                "horizon": (t - round_day).days,
                "date": t,
                "s": s,
                "o": o,
                "s_name": s,
                "o_name": o,
                "s_region": regions[s],
                "o_region": regions[o],
                "query_code": f"({t}, {s}, ?, {o})",
                "stratum": stratum,
            }
            for n, (t, s, o, stratum) in enumerate(rows, 1)
        ]
    )
    directory = round_dir(settings.dataset.data_dir, round_day)
    atomic_write_parquet(questions, directory / "questions.parquet")
    targets = [round_day + timedelta(days=h) for h in horizons]
    manifest = {
        "format": "mirai-live-round-v1",
        "round": round_day.isoformat(),
        "history_cutoff": (round_day - timedelta(days=1)).isoformat(),
        "horizons": list(horizons),
        "target_dates": [t.isoformat() for t in targets],
        "deadline": midnight(min(targets)).isoformat(),
        "published_at": (published_at or midnight(round_day) + timedelta(hours=1)).isoformat(),
        "sampler": {"version": "test", "seed": 0, "window_days": 28, "round_size": questions.height},
        "files": {},
        "source": data_source(settings.dataset, settings.gdelt),
        "code_version": "test",
    }
    data = json.dumps(manifest, indent=2).encode()
    atomic_write_bytes(directory / "manifest.json", data)
    if store is not None:
        key = live_round_key(str(round_day), "manifest.json")
        store.put_bytes(key, data, cache_control="no-cache", if_absent=True)
        # A live round's manifest lands when it is published: the store's clock agrees with the
        # round's timeline (acceptance and resolution place the deadline by it).
        moment = datetime.fromisoformat(manifest["published_at"]).timestamp()
        os.utime(store.root / key, (moment, moment))
    return questions


def write_accepted(
    settings: Settings,
    round_day: date,
    name: str,
    predictions: pl.DataFrame,
    *,
    model: str = "test-model",
    contact: str = "someone@example.org",
    baseline: bool = False,
    status: str = "accepted",
    owner_key: str | None = None,
) -> None:
    """An accepted (or rejected) submission as acceptance records it: predictions.parquet in the
    normalised columns (query_id, relations, p_event) and record.json."""
    directory = round_dir(settings.dataset.data_dir, round_day) / "submissions" / name
    frame = predictions.select(
        "query_id",
        pl.col("relations").cast(pl.List(pl.String)),
        pl.col("p_event").cast(pl.Float64)
        if "p_event" in predictions.columns
        else pl.lit(None, pl.Float64).alias("p_event"),
    )
    atomic_write_parquet(frame, directory / "predictions.parquet")
    deadline = midnight(round_day + timedelta(days=1))
    record = {
        "format": "mirai-live-submission-v1",
        "submission": name,
        "round": round_day.isoformat(),
        "status": status,
        "reasons": [],
        "model": model,
        "knowledge_cutoff": "2024-01-01",
        "contact": contact,
        "owner_sha256": owner_sha256(owner_key),
        "baseline": baseline,
        "predictions_sha256": hashlib.sha256((directory / "predictions.parquet").read_bytes()).hexdigest(),
        "submitted_at": (deadline - timedelta(hours=3)).isoformat(),
        "deadline": deadline.isoformat(),
        "accepted_at": (deadline - timedelta(hours=2)).isoformat(),
    }
    atomic_write_bytes(directory / "record.json", json.dumps(record, indent=2).encode())


def history(settings: Settings, days: list[date]) -> pl.DataFrame:
    return pl.concat([day_events(d, settings.dataset) for d in days]).select("date", "s", "r", "o")


def baseline_predictions(questions: pl.DataFrame, past: pl.DataFrame, method: str) -> pl.DataFrame:
    """pipeline/evaluation/baselines.py's forecast from history ≤ D − 1 only (the history given
    ends there, so a distance of one day shows all of it), as normalised predictions."""
    queries = questions.select("query_id", "date", "s", "o")
    cutoff = past.get_column("date").max()
    gated = queries.with_columns(pl.lit(cutoff + timedelta(days=1)).alias("date"))
    forecast = baselines.forecast(method, gated, past, distance_days=1)
    return forecast.select(
        "query_id",
        pl.col("answer_dict")
        .map_elements(
            lambda d: sorted(c for codes in json.loads(d).values() for c in codes), return_dtype=pl.List(pl.String)
        )
        .alias("relations"),
    )
