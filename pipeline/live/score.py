"""Scoring of live-round submissions (docs/live.md, "Scoring").

Two parts, per resolved question (t, s, o) with answer A (a set of level-2 codes, maybe empty):

- relations: MIRAI's set metrics (pipeline/evaluation/metrics.py query_scores, the monthly
  scorecard's numbers) over the questions with a non-empty A only, as in a monthly split, where
  every query has an answer (MIRAI arXiv:2407.01231 §2.4: precision/recall/F1 and KL are defined
  against a non-empty gold set). An empty A contributes nothing here.
- occurrence: did s act toward o at all on t? y = (A non-empty), over every resolved question. The
  forecast is p = p_event when the submission gives it for the question, else the hard forecast
  implied by its relations (1 when it predicts any, 0 when none), so a submission that mixes them
  is scored question by question and every submission gets a Brier score (p − y)². For a hard
  forecast the Brier score is 1 − accuracy, so "accuracy when no probability is given" is the same
  number; accuracy (p ≥ 0.5 is "event") is reported beside it.

The board ranks by the live score = level-2 F1 (%, non-empty answers) × (1 − Brier) (all
questions): a forecaster with no relation skill scores ≈ 0 whatever its p_event, and one that
never says when nothing will happen pays for every quiet question (docs/live.md says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.config import DatasetSettings
from pipeline.evaluation.metrics import SET_METRICS, query_scores, to_answer_dict
from pipeline.evaluation.scoring import DEFAULT_RESAMPLES, bootstrap_intervals, bootstrap_means
from pipeline.live.resolve import read_round, resolved_answers, round_dir
from pipeline.reference.tables import level2_codes
from pipeline.storage import atomic_write_bytes

PREDICTIONS_SCHEMA = pl.Schema([("query_id", pl.String), ("relations", pl.List(pl.String)), ("p_event", pl.Float64)])
SCORES_FORMAT = "mirai-live-scores-v1"
RECORD_FORMAT = "mirai-live-submission-v1"
BOOTSTRAP_SEED = 0
RANK_METRIC = "live_score"
OCCURRENCE_METRICS = ("brier", "occurrence_accuracy")
SUMMARY_METRICS = (
    RANK_METRIC,
    "level2_f1",
    "level1_f1",
    "level2_precision",
    "level2_recall",
    "quad_kl",
    *OCCURRENCE_METRICS,
)
LIVE_SCORE_RULE = (
    "live score = level-2 F1 (%, MIRAI's metric over the questions with a non-empty answer) × (1 − Brier score "
    "of the event forecast over all resolved questions); the event forecast is p_event, or 1 when relations are "
    "predicted and 0 when none are, where no p_event is given"
)


class LiveScoringError(ValueError):
    """A submission's normalised predictions cannot be scored; the message says why."""


def check_predictions(predictions: pl.DataFrame, where: str) -> pl.DataFrame:
    """The predictions as PREDICTIONS_SCHEMA, once every p_event is null or in [0, 1] and no
    question appears twice. Codes outside CAMEO are left for query_scores to drop, as the monthly
    scoring does."""
    missing = [c for c in PREDICTIONS_SCHEMA if c not in predictions.columns]
    if missing:
        raise LiveScoringError(f"{where}: columns missing: {', '.join(missing)}")
    try:
        frame = predictions.select(PREDICTIONS_SCHEMA.names()).cast(dict(PREDICTIONS_SCHEMA))
    except pl.exceptions.PolarsError as exc:
        raise LiveScoringError(f"{where}: columns of the wrong type ({type(exc).__name__})") from None
    duplicated = frame.filter(pl.col("query_id").is_duplicated()).get_column("query_id").unique().sort()
    if duplicated.len():
        raise LiveScoringError(f"{where}: query_id repeated: {', '.join(duplicated.head(5).to_list())}")
    bad = frame.filter(pl.col("p_event").is_not_null() & ~pl.col("p_event").is_between(0.0, 1.0))
    if bad.height:
        raise LiveScoringError(f"{where}: p_event outside [0, 1] (or NaN) for {bad.height} question(s)")
    return frame


def question_scores(predictions: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    """One row per resolved question (answers' query_id order): y (answer non-empty), p (the event
    forecast), hard (no p_event given), brier, correct, and each of SET_METRICS (null when the
    answer is empty). A question the predictions lack is an empty prediction with no p_event."""
    joined = answers.join(predictions, on="query_id", how="left")
    rows = []
    for query_id, answer, relations, p_event in joined.select(
        "query_id", "answer_list", "relations", "p_event"
    ).iter_rows():
        relations = relations or []
        y = 1.0 if answer else 0.0
        hard = p_event is None
        p = (1.0 if any(r in level2_codes() for r in relations) else 0.0) if hard else float(p_event)
        row = {
            "query_id": query_id,
            "y": y,
            "p": p,
            "hard": hard,
            "brier": (p - y) ** 2,
            "correct": float((p >= 0.5) == (y == 1.0)),
        }
        metrics = query_scores(to_answer_dict(relations), to_answer_dict(answer)) if answer else {}
        row |= {m: metrics.get(m) for m in SET_METRICS}
        rows.append(row)
    schema = {
        "query_id": pl.String,
        "y": pl.Float64,
        "p": pl.Float64,
        "hard": pl.Boolean,
        "brier": pl.Float64,
        "correct": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema | dict.fromkeys(SET_METRICS, pl.Float64), orient="row")


def _round4(value: float) -> float:
    return round(float(value), 4)


def live_scores(means: np.ndarray) -> np.ndarray:
    """The live score of each row of means over (f1 × answered, answered, brier): the F1 mean over
    answered questions (0 when a resample drew none) times 1 − Brier."""
    answered = means[:, 1]
    f1 = np.divide(means[:, 0], answered, out=np.zeros_like(answered), where=answered > 0)
    return f1 * (1.0 - means[:, 2])


def summarize(scores: pl.DataFrame, *, seed: int = BOOTSTRAP_SEED, resamples: int = DEFAULT_RESAMPLES) -> dict:
    """Each metric's value and 95% percentile-bootstrap interval over questions: SET_METRICS over
    the answered questions, the occurrence metrics over all, and the live score from the same
    resamples of all questions (so its interval accounts for both parts at once)."""
    if scores.is_empty():
        raise LiveScoringError("no resolved questions to score")
    answered = scores.filter(pl.col("y") == 1.0)
    metrics: dict[str, dict] = {}
    if answered.height:
        values = answered.select(SET_METRICS).to_numpy()
        low, high = bootstrap_intervals(values, seed, resamples)
        for i, m in enumerate(SET_METRICS):
            metrics[m] = {"value": _round4(values[:, i].mean()), "ci95": [_round4(low[i]), _round4(high[i])]}
    else:
        metrics |= {m: {"value": None, "ci95": [None, None]} for m in SET_METRICS}
    occurrence = scores.select(OCCURRENCE_METRICS[0], "correct").to_numpy()
    low, high = bootstrap_intervals(occurrence, seed, resamples)
    for i, m in enumerate(OCCURRENCE_METRICS):
        metrics[m] = {"value": _round4(occurrence[:, i].mean()), "ci95": [_round4(low[i]), _round4(high[i])]}
    joint = scores.select(
        (pl.col("level2_f1").fill_null(0.0) * pl.col("y")).alias("f1_answered"), "y", "brier"
    ).to_numpy()
    point = live_scores(joint.mean(axis=0, keepdims=True))[0]
    low, high = np.percentile(live_scores(bootstrap_means(joint, seed, resamples)), [2.5, 97.5])
    metrics[RANK_METRIC] = {"value": _round4(point), "ci95": [_round4(low), _round4(high)]}
    hard = int(scores.get_column("hard").sum())
    mode = "probability" if hard == 0 else "hard" if hard == scores.height else "mixed"
    return {
        "questions": scores.height,
        "answered": answered.height,
        "empty": scores.height - answered.height,
        "occurrence_forecast": mode,
        "hard_forecasts": hard,
        "bootstrap": {"seed": seed, "resamples": resamples, "interval": "percentile, 95%", "unit": "question"},
        "metrics": metrics,
    }


@dataclass(frozen=True)
class Accepted:
    """An accepted submission of a round, as wt-live-pub's acceptance recorded it."""

    name: str
    record: dict
    predictions: Path


def accepted_submissions(dataset: DatasetSettings, round_day: date) -> tuple[list[Accepted], list[str]]:
    """The round's accepted submissions in name order, and one line per record that could not be
    read (a record is ours, but its text fields come from submitters)."""
    directory = round_dir(dataset.data_dir, round_day) / "submissions"
    found, problems = [], []
    for sub in sorted(directory.iterdir()) if directory.is_dir() else []:
        record_path, predictions = sub / "record.json", sub / "predictions.parquet"
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{sub.name}: record.json unreadable ({type(exc).__name__})")
            continue
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            problems.append(f"{sub.name}: record.json is not a {RECORD_FORMAT} record")
            continue
        if record.get("status") != "accepted":
            continue
        if record.get("round") != round_day.isoformat() or record.get("submission") != sub.name:
            problems.append(f"{sub.name}: record.json names another round or submission")
            continue
        if not predictions.exists():
            problems.append(f"{sub.name}: accepted but predictions.parquet is missing")
            continue
        found.append(Accepted(sub.name, record, predictions))
    return found, problems


def score_accepted(accepted: Accepted, answers: pl.DataFrame) -> pl.DataFrame:
    predictions = check_predictions(pl.read_parquet(accepted.predictions), f"submission {accepted.name}")
    return question_scores(predictions, answers)


def score_round(dataset: DatasetSettings, round_day: date) -> dict:
    """Score every accepted submission of the round against the answers resolved so far, and write
    live/<D>/scores.json (rewritten as more dates resolve). A submission whose predictions cannot
    be scored is listed with its reason; the others are scored."""
    questions, _ = read_round(dataset, round_day)
    answers = resolved_answers(dataset, round_day)
    accepted, problems = accepted_submissions(dataset, round_day)
    results: dict[str, dict] = {}
    for sub in accepted:
        entry = {
            "baseline": bool(sub.record.get("baseline")),
            "model": sub.record.get("model"),
            "predictions_sha256": sub.record.get("predictions_sha256"),
        }
        if answers.is_empty():
            results[sub.name] = entry | {"scored": False, "reason": "no target date resolved yet"}
            continue
        try:
            entry |= {"scored": True} | summarize(score_accepted(sub, answers))
        except (LiveScoringError, OSError, pl.exceptions.PolarsError) as exc:
            entry |= {"scored": False, "reason": str(exc)[:500]}
        results[sub.name] = entry
    card = {
        "format": SCORES_FORMAT,
        "round": round_day.isoformat(),
        "questions": questions.height,
        "resolved_questions": answers.height,
        "rule": LIVE_SCORE_RULE,
        "submissions": results,
        "problems": problems,
    }
    atomic_write_bytes(
        round_dir(dataset.data_dir, round_day) / "scores.json",
        (json.dumps(card, indent=2, sort_keys=True) + "\n").encode(),
    )
    return card
