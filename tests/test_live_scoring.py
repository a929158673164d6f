"""Scoring of live submissions (pipeline/live/score.py): the empty-answer rule on hand-made cases,
MIRAI's numbers over the answered questions, and on a realistic resolved round that no degenerate
strategy (always empty, always everything, p_event fixed at 0, 1 or the base rate) scores above the
recurrency and frequency baselines, while a calibrated p_event on top of a baseline is rewarded."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from pipeline.config import Settings
from pipeline.evaluation.metrics import score as mirai_score
from pipeline.evaluation.metrics import to_answer_dict
from pipeline.live.resolve import resolve_round, resolved_answers
from pipeline.live.score import LiveScoringError, check_predictions, question_scores, score_round, summarize
from pipeline.reference.tables import level2_codes

from .live_builder import baseline_predictions, history, midnight, pairs, write_accepted, write_round, write_world
from .settings_builder import make_settings

ROUND = date(2024, 3, 10)
WINDOW = [ROUND - timedelta(days=i) for i in range(21, 0, -1)]
TARGETS = [ROUND + timedelta(days=1), ROUND + timedelta(days=7)]


def frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"query_id": pl.String, "relations": pl.List(pl.String), "p_event": pl.Float64}, orient="row"
    )


def answers_of(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"query_id": pl.String, "answer_list": pl.List(pl.String)}, orient="row")


def test_an_empty_answer_counts_only_in_the_event_forecast_and_the_numbers_are_mirais():
    answers = answers_of([("q1", ["042"]), ("q2", []), ("q3", []), ("q4", []), ("q5", ["010", "190"])])
    predictions = frame(
        [
            ("q1", ["042"], None),  # hard forecast "event", right relation
            ("q2", [], None),  # hard forecast "nothing": right, Brier 0
            ("q3", ["042"], None),  # hard forecast "event" on a quiet day: Brier 1
            ("q4", ["042"], 0.2),  # the same relations, but p_event 0.2: Brier 0.04
            ("q5", [], 0.9),  # no relation but p_event 0.9: F1 0, Brier 0.01
        ]
    )
    scores = question_scores(check_predictions(predictions, "test"), answers)
    assert scores.get_column("brier").to_list() == pytest.approx([0.0, 0.0, 1.0, 0.04, 0.01])
    assert scores.get_column("correct").to_list() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert scores.get_column("level2_f1").to_list() == [100.0, None, None, None, 0.0]
    card = summarize(scores)
    assert (card["questions"], card["answered"], card["empty"], card["occurrence_forecast"]) == (5, 2, 3, "mixed")
    assert card["metrics"]["brier"]["value"] == pytest.approx(0.21)
    assert card["metrics"]["live_score"]["value"] == pytest.approx(50.0 * (1 - 0.21))
    # The relation metrics over the answered questions are MIRAI's, as the monthly scorecard's.
    mirai = mirai_score(
        [to_answer_dict(["042"]), to_answer_dict([])], [to_answer_dict(["042"]), to_answer_dict(["010", "190"])]
    )
    for metric in ("level2_f1", "level1_f1", "level2_precision", "quad_kl", "binary_kl"):
        assert card["metrics"][metric]["value"] == pytest.approx(mirai[metric], abs=1e-4)
    low, high = card["metrics"]["live_score"]["ci95"]
    assert low <= card["metrics"]["live_score"]["value"] <= high


def test_bad_probabilities_and_repeated_questions_are_refused():
    with pytest.raises(LiveScoringError, match="p_event outside"):
        check_predictions(frame([("q1", [], 1.5)]), "s")
    with pytest.raises(LiveScoringError, match="p_event outside"):
        check_predictions(frame([("q1", [], float("nan"))]), "s")
    with pytest.raises(LiveScoringError, match="query_id repeated: q1"):
        check_predictions(frame([("q1", [], 0.5), ("q1", ["042"], 0.5)]), "s")
    with pytest.raises(LiveScoringError, match="columns missing: p_event"):
        check_predictions(frame([("q1", [], 0.5)]).drop("p_event"), "s")


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> tuple[Settings, pl.DataFrame, pl.DataFrame]:
    """A resolved round over a realistic world: 30 pairs that act most days with habitual
    relations, 10 that rarely act; questions on both target dates."""
    settings = make_settings(data_dir=tmp_path_factory.mktemp("live") / "data")
    world_pairs = pairs(seed=11, active=30, quiet=10)
    write_world(settings, 12, world_pairs, WINDOW + TARGETS)
    questions = write_round(settings, ROUND, world_pairs)
    result = resolve_round(ROUND, settings.dataset, settings.live, now=midnight(TARGETS[-1]) + timedelta(days=2))
    assert result.resolved == TARGETS
    return settings, questions, history(settings, WINDOW)


def degenerate(questions: pl.DataFrame, base_rate: float) -> dict[str, pl.DataFrame]:
    ids = questions.get_column("query_id").to_list()
    everything = sorted(level2_codes())

    def fill(relations: list[str], p: float | None) -> pl.DataFrame:
        return frame([(q, relations, p) for q in ids])

    return {
        "always-empty": fill([], None),
        "always-empty-p0": fill([], 0.0),
        "always-empty-p1": fill([], 1.0),
        "always-empty-base-rate": fill([], base_rate),
        "always-everything": fill(everything, None),
        "always-everything-p1": fill(everything, 1.0),
        "always-everything-base-rate": fill(everything, base_rate),
    }


def test_no_degenerate_strategy_tops_the_baselines_on_a_realistic_round(resolved):
    settings, questions, past = resolved
    answers = resolved_answers(settings.dataset, ROUND)
    base_rate = answers.select((pl.col("answer_list").list.len() > 0).mean()).item()
    assert 0.4 < base_rate < 0.9  # quiet questions are a real share, and so are active ones
    rec = baseline_predictions(questions, past, "recurrency")
    freq = baseline_predictions(questions, past, "frequency")
    write_accepted(settings, ROUND, f"live-{ROUND}-recurrency", rec, baseline=True, model="recurrency")
    write_accepted(settings, ROUND, f"live-{ROUND}-frequency", freq, baseline=True, model="frequency")
    for name, predictions in degenerate(questions, base_rate).items():
        write_accepted(settings, ROUND, name, predictions, model=name)
    # A forecaster with the frequency baseline's relations and, as p_event, the share of window
    # days the pair acted (a calibrated-ish probability, learnt from history ≤ D − 1 only).
    active_days = past.group_by("s", "o").agg((pl.col("date").n_unique() / len(WINDOW)).alias("p_event"))
    skilled = (
        freq.join(questions.select("query_id", "s", "o"), on="query_id")
        .join(active_days, on=["s", "o"], how="left")
        .with_columns(pl.col("p_event").fill_null(0.0))
    )
    write_accepted(settings, ROUND, "frequency-with-p-event", skilled, model="skilled")

    card = score_round(settings.dataset, ROUND)
    assert json.loads((settings.dataset.data_dir / "live" / str(ROUND) / "scores.json").read_text()) == card
    live = {name: entry["metrics"]["live_score"]["value"] for name, entry in card["submissions"].items()}
    floor = min(live[f"live-{ROUND}-recurrency"], live[f"live-{ROUND}-frequency"])
    print("live scores:", json.dumps(live, indent=1), "base rate", base_rate)
    for name in degenerate(questions, base_rate):
        assert live[name] < floor, (name, live)
    assert live["frequency-with-p-event"] > live[f"live-{ROUND}-frequency"]
    # The baselines' forecasts are hard: their Brier score is 1 − accuracy.
    rec_card = card["submissions"][f"live-{ROUND}-recurrency"]
    assert rec_card["occurrence_forecast"] == "hard"
    assert rec_card["metrics"]["brier"]["value"] == pytest.approx(
        1 - rec_card["metrics"]["occurrence_accuracy"]["value"]
    )
    # "always empty" is perfect on the quiet questions and still scores 0: it has no relation skill.
    assert live["always-empty-base-rate"] == 0.0
    assert card["submissions"]["always-empty"]["metrics"]["occurrence_accuracy"]["value"] == pytest.approx(
        1 - base_rate, abs=1e-4
    )


def test_unscorable_submissions_are_listed_and_the_others_scored(resolved):
    settings, questions, _ = resolved
    ids = questions.get_column("query_id").to_list()
    write_accepted(settings, ROUND, "bad-p", frame([(q, [], 2.0) for q in ids]))
    write_accepted(settings, ROUND, "refused", frame([(q, ["042"], None) for q in ids]), status="rejected")
    hostile = settings.dataset.data_dir / "live" / str(ROUND) / "submissions" / "hostile"
    hostile.mkdir(parents=True)
    (hostile / "record.json").write_bytes(b"\xff not json")
    card = score_round(settings.dataset, ROUND)
    assert card["submissions"]["bad-p"]["scored"] is False
    assert "p_event outside [0, 1]" in card["submissions"]["bad-p"]["reason"]
    assert "refused" not in card["submissions"]
    assert card["problems"] == ["hostile: record.json unreadable (UnicodeDecodeError)"]


def upload(store, name: str, predictions: pl.DataFrame) -> None:
    """A submitter's upload (predictions.jsonl, then submission.json naming the round) written
    straight into the local store, as anyone with write access to submissions/ could."""
    directory = store.root / "submissions" / name
    directory.mkdir(parents=True)
    lines = [
        json.dumps({"query_id": q, "answer": to_answer_dict(r)} | ({} if p is None else {"p_event": p})) + "\n"
        for q, r, p in predictions.iter_rows()
    ]
    (directory / "predictions.jsonl").write_text("".join(lines))
    meta = {"model": name, "knowledge_cutoff": "2024-03-01", "contact": "me@example.org", "round": str(ROUND)}
    (directory / "submission.json").write_text(json.dumps(meta))


def test_a_published_round_with_accepted_submissions_ranks_its_baselines_above_every_degenerate_one(tmp_path):
    """End to end with the round publisher and the submission acceptance of pipeline/live/rounds.py
    and pipeline/live/submissions.py: a round published from a realistic world (active pairs
    test-grade), its own baselines (with p_event) and the degenerate strategies uploaded and
    accepted before the deadline, then resolved, scored and boarded here."""
    from pipeline.live import submissions
    from pipeline.live.board import build_leaderboard
    from pipeline.live.publication import publish_round
    from pipeline.release.store import LocalStore

    settings = make_settings(data_dir=tmp_path / "data", live_window_days=21, live_round_size=80)
    write_world(settings, 42, pairs(seed=41, active=36, quiet=14), WINDOW + TARGETS)
    store = LocalStore(tmp_path / "bucket")
    publication = publish_round(
        ROUND, settings.dataset, settings.gdelt, settings.live, store, now=midnight(ROUND) + timedelta(hours=1)
    )
    assert publication.drawn == {"active": 30, "quiet": 10}
    questions = pl.read_parquet(settings.dataset.data_dir / "live" / str(ROUND) / "questions.parquet")
    # The base rate of the answers to come: a forecaster's best constant p_event (it cannot know it).
    base_rate = 0.6
    for name, predictions in degenerate(questions, base_rate).items():
        upload(store, name, predictions)
    processing = midnight(ROUND) + timedelta(hours=6)
    found = submissions.triage(store, settings.dataset.data_dir, now=processing)
    assert len(found.ready) == 2 + len(degenerate(questions, base_rate))
    for name in found.ready:
        assert submissions.process(store, name, settings.dataset.data_dir, now=processing)["status"] == "accepted", name
    # Its manifest landed in the store now, so on the store's clock (acceptance's and resolution's)
    # the round closes 23 h from now.
    resolved_at = datetime.now(UTC) + timedelta(days=2)
    assert resolve_round(ROUND, settings.dataset, settings.live, now=resolved_at, store=store).resolved == TARGETS
    answers = resolved_answers(settings.dataset, ROUND)
    assert answers.select((pl.col("answer_list").list.len() > 0).mean()).item() == pytest.approx(base_rate)
    card = score_round(settings.dataset, ROUND)
    live = {name: entry["metrics"]["live_score"]["value"] for name, entry in card["submissions"].items()}
    print("published round, live scores:", json.dumps(live, indent=1))
    assert card["submissions"][f"live-{ROUND}-frequency"]["occurrence_forecast"] == "probability"
    floor = min(live[f"live-{ROUND}-recurrency"], live[f"live-{ROUND}-frequency"])
    assert all(live[name] < floor for name in degenerate(questions, base_rate)), live
    ranks = {row["name"]: row["rank"] for row in build_leaderboard(settings.dataset)["rounds"][0]["rows"]}
    worst_baseline = max(ranks["recurrency baseline"], ranks["frequency baseline"])
    assert all(ranks[name] > worst_baseline for name in degenerate(questions, base_rate)), ranks
