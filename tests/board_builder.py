"""A monthly leaderboard from realistic data through the real code: three months of tests/live_builder.py's
world (pairs that act most days with habitual relations) written as daily files, each month's event
database and test split built by pipeline/splits, the baselines evaluated on each month's sample at
distances 1 and 7 (pipeline/evaluation/run.py), and submissions scored by `mirai score`'s code
(scoring.score_predictions) as the submission sensor records them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from pipeline.evaluation.board import RECORD_FORMAT
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.run import evaluate_baseline
from pipeline.evaluation.scoring import score_predictions
from pipeline.splits.database import build_event_database
from pipeline.splits.split import build_split
from pipeline.storage import DataLayout

from .live_builder import pairs, write_world
from .settings_builder import make_settings

MONTHS = (date(2024, 1, 1), date(2024, 2, 1), date(2024, 3, 1))
DISTANCES = (1, 7)
# (agent name, method, top_k): the three baselines, and frequency cut to its top relation.
BASELINES = (("recurrency", "recurrency", None), ("frequency", "frequency", None), ("frequency-top1", "frequency", 1))
BASELINES += (("empty", "empty", None),)
HOSTILE_MODEL = '<script>alert("x")</script>'


def baseline_agent(name: str, method: str, top_k: int | None) -> Agent:
    return Agent(
        name=name,
        kind="baseline",
        knowledge_cutoff=None,
        distances=DISTANCES,
        rounds=1,
        baseline=method,
        top_k=top_k,
    )


def _predictions(results: pl.DataFrame, path: Path, drop_every: int = 0) -> Path:
    """A run's forecasts as a `mirai score` JSONL file; with ``drop_every`` k, every k-th query
    answers nothing: a weaker forecaster of the same kind."""
    lines = []
    for i, (query_id, prediction, ranked) in enumerate(results.select("query_id", "prediction", "ranked").iter_rows()):
        kept = not drop_every or i % drop_every != 0
        lines.append(
            json.dumps(
                {
                    "query_id": query_id,
                    "answer": json.loads(prediction) if kept else {},
                    "ranked": ranked if kept else [],
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def record_submission(data_dir: Path, name: str, month: date, distance: int, card: dict, **fields) -> None:
    """record.json in the shared format, as the submission sensor writes it for a scored upload."""
    record = {
        "format": RECORD_FORMAT,
        "submission": name,
        "status": "scored",
        "reasons": [],
        "model": "acme-7b",
        "knowledge_cutoff": "2023-06-30",
        "contact": "team@example.org",
        "month": f"{month:%Y-%m}",
        "query_set": "queries_sample",
        "distance": distance,
        "rounds": 1,
        "api_mode": "native",
        "action_type": None,
        "tokens_in": None,
        "tokens_out": None,
        "cost_usd": None,
        "predictions_sha256": "0" * 64,
        "submitted_at": f"{month + timedelta(days=40):%Y-%m-%d}T10:00:00+00:00",
        "scored_at": f"{month + timedelta(days=40):%Y-%m-%d}T10:01:00+00:00",
        "scorecard": card,
    } | fields
    path = DataLayout(data_dir).root / "submissions" / name / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def build_monthly_board(data_dir: Path, scratch: Path) -> Path:
    """Three months of runs and submissions under ``data_dir`` (see the module doc)."""
    settings = make_settings(data_dir=data_dir)
    world_pairs = pairs(seed=33, active=24, quiet=8)
    first = date(2023, 12, 1)  # a month of history before the first month, for the baselines
    days = [first + timedelta(days=i) for i in range((date(2024, 4, 1) - first).days)]
    write_world(settings, 33, world_pairs, days)
    for month in (first.replace(day=1), *MONTHS):
        build_event_database(month, settings.dataset, settings.articles)
    scratch.mkdir(parents=True, exist_ok=True)
    for month in MONTHS:
        after = (month + timedelta(days=32)).replace(day=1) + timedelta(days=5)
        split = build_split(
            month, settings.dataset, settings.gdelt, now=datetime.combine(after, datetime.min.time(), UTC)
        )
        sample = split.directory / "queries_sample.parquet"
        for distance in DISTANCES:
            runs = {
                name: evaluate_baseline(sample, data_dir, baseline_agent(name, method, top_k), distance)[0]
                for name, method, top_k in BASELINES
            }
            stem = f"{month:%Y-%m}-d{distance}"
            # Teams that forecast as recurrency but answer nothing on every 10th query (close
            # behind the leader) or every 3rd (well behind).
            for team, drop_every in (("acme", 10), ("bolt", 3)):
                weaker = _predictions(runs["recurrency"], scratch / f"{stem}-{team}.jsonl", drop_every=drop_every)
                card = score_predictions(weaker, split.directory, sample=True, distance=distance).card
                record_submission(data_dir, f"{team}-{stem}", month, distance, card, model=HOSTILE_MODEL)
            if month == MONTHS[-1]:
                # A model whose cutoff is inside the month: shown, never ranked.
                same = _predictions(runs["frequency"], scratch / f"{stem}-leaky.jsonl")
                card = score_predictions(same, split.directory, sample=True, distance=distance).card
                record_submission(
                    data_dir,
                    f"leaky-{stem}",
                    month,
                    distance,
                    card,
                    knowledge_cutoff="2024-03-15",
                    status="contaminated",
                )
    return data_dir
