"""Model-free baselines on hand-built histories, the date gate, and stored evaluation runs
(pipeline/evaluation/baselines.py, pipeline/evaluation/run.py)."""

from __future__ import annotations

import json
from datetime import date, timedelta

import polars as pl
import pytest

from pipeline.evaluation.baselines import (
    FORECAST_SCHEMA,
    default_top_k,
    empty,
    forecast,
    frequency,
    recurrency,
    visible_history,
)
from pipeline.evaluation.board import leaderboard
from pipeline.evaluation.metrics import SET_METRICS
from pipeline.evaluation.queries import load_history
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.run import AGGREGATE_COLUMNS, RESULT_DESCRIPTIONS, NotEligible, evaluate_baseline
from pipeline.storage import DataLayout, atomic_write_parquet

T = date(2024, 2, 10)


def d(day: str) -> date:
    return date.fromisoformat(day)


def history(*rows: tuple[str, str, str, str]) -> pl.DataFrame:
    """Events (date, s, r, o)."""
    return pl.DataFrame(
        [(d(day), s, r, o) for day, s, r, o in rows],
        schema={"date": pl.Date, "s": pl.String, "r": pl.String, "o": pl.String},
        orient="row",
    )


def queries(*rows: tuple[str, str, str, str], answers: list[dict] | None = None) -> pl.DataFrame:
    """Queries (query_id, date, s, o) with answer dicts (default {"04": ["042"]})."""
    answers = answers or [{"04": ["042"]}] * len(rows)
    return pl.DataFrame(
        [(qid, d(day), s, o, json.dumps(a)) for (qid, day, s, o), a in zip(rows, answers)],
        schema={"query_id": pl.String, "date": pl.Date, "s": pl.String, "o": pl.String, "answer_dict": pl.String},
        orient="row",
    )


# USA→CHN before the query on 2024-02-10 (distance 1: visible up to 02-09 inclusive).
PAIR_HISTORY = history(
    ("2024-01-05", "USA", "042", "CHN"),
    ("2024-01-20", "USA", "042", "CHN"),
    ("2024-02-03", "USA", "042", "CHN"),  # 042: 3 days, last 02-03
    ("2024-01-01", "USA", "043", "CHN"),
    ("2024-02-07", "USA", "043", "CHN"),  # 043: 2 days, last 02-07
    ("2024-02-07", "USA", "190", "CHN"),  # 190: 1 day, last 02-07 (ties 043 on the date)
    ("2024-02-08", "USA", "057", "CHN"),  # 057: 1 day, last 02-08
    ("2024-02-09", "USA", "036", "CHN"),  # 036: on t − 1, the last visible day
    ("2024-02-10", "USA", "010", "CHN"),  # on t itself: never visible
    ("2024-02-08", "CHN", "173", "USA"),  # the reverse direction is another pair
    ("2024-02-08", "USA", "112", "RUS"),  # another pair
)
PAIR_QUERY = queries(("q1", "2024-02-10", "USA", "CHN"))


def ranked(frame: pl.DataFrame) -> dict[str, list[str]]:
    return dict(zip(frame.get_column("query_id"), frame.get_column("ranked").to_list()))


def test_recurrency_ranks_by_last_occurrence():
    out = recurrency(PAIR_QUERY, PAIR_HISTORY)
    assert out.schema == FORECAST_SCHEMA
    # 036 (02-09) > 057 (02-08) > 043 and 190 (02-07; 043 has more days) > 042 (02-03).
    assert ranked(out) == {"q1": ["036", "057", "043", "190", "042"]}
    # The set prediction is every relation seen, grouped by first-level code.
    assert json.loads(out.item(0, "answer_dict")) == {"03": ["036"], "04": ["042", "043"], "05": ["057"], "19": ["190"]}


def test_frequency_top_k():
    # Days: 042 → 3, 043 → 2, then one day each, latest first: 036, 057, 190.
    assert ranked(frequency(PAIR_QUERY, PAIR_HISTORY, k=2)) == {"q1": ["042", "043"]}
    assert ranked(frequency(PAIR_QUERY, PAIR_HISTORY, k=3)) == {"q1": ["042", "043", "036"]}
    assert ranked(frequency(PAIR_QUERY, PAIR_HISTORY, k=10)) == {"q1": ["042", "043", "036", "057", "190"]}
    with pytest.raises(ValueError):
        frequency(PAIR_QUERY, PAIR_HISTORY, k=0)


def test_default_top_k_is_relations_per_active_pair_day():
    hist = history(
        ("2024-01-01", "USA", "042", "CHN"),
        ("2024-01-01", "USA", "043", "CHN"),
        ("2024-01-01", "USA", "190", "CHN"),  # (01-01, USA, CHN): 3 relations
        ("2024-01-02", "USA", "042", "CHN"),
        ("2024-01-02", "USA", "190", "CHN"),  # (01-02, USA, CHN): 2
        ("2024-01-02", "FRA", "042", "DEU"),
        ("2024-01-02", "FRA", "043", "DEU"),  # (01-02, FRA, DEU): 2 → mean 7/3 → 2
        ("2024-01-09", "FRA", "010", "DEU"),
        ("2024-01-09", "FRA", "011", "DEU"),
        ("2024-01-09", "FRA", "012", "DEU"),
        ("2024-01-09", "FRA", "013", "DEU"),  # after the earliest query's cutoff: ignored
    )
    qs = queries(("a", "2024-01-04", "USA", "CHN"), ("b", "2024-01-20", "FRA", "DEU"))
    assert default_top_k(qs, hist, distance_days=1) == 2
    assert len(frequency(qs, hist).get_column("ranked")[0]) == 2


@pytest.mark.parametrize("method", ["recurrency", "frequency"])
def test_date_gate_never_shows_day_t_or_after_t_minus_distance(method):
    # One relation per day: 010 on t, 020 on t − 1, 030 on t − 6, 040 on t − 7.
    hist = history(
        ("2024-02-10", "USA", "010", "CHN"),
        ("2024-02-09", "USA", "020", "CHN"),
        ("2024-02-04", "USA", "030", "CHN"),
        ("2024-02-03", "USA", "040", "CHN"),
    )
    # distance 1: everything up to t − 1; the event on t (= t − distance + 1) is hidden.
    assert sorted(ranked(forecast(method, PAIR_QUERY, hist, distance_days=1, top_k=10))["q1"]) == ["020", "030", "040"]
    # distance 7: only t − 7; t − 6 (= t − distance + 1), t − 1 and t are hidden.
    assert ranked(forecast(method, PAIR_QUERY, hist, distance_days=7, top_k=10))["q1"] == ["040"]
    # distance 8: nothing is visible.
    assert ranked(forecast(method, PAIR_QUERY, hist, distance_days=8, top_k=10))["q1"] == []


def test_each_query_has_its_own_gate():
    # Same pair, two days: the earlier query must not see what happened between them.
    qs = queries(("early", "2024-02-05", "USA", "CHN"), ("late", "2024-02-10", "USA", "CHN"))
    out = ranked(recurrency(qs, PAIR_HISTORY))
    # Up to 02-04: 042 (last 02-03) and 043 (last 01-01); nothing from 02-07 on.
    assert out["early"] == ["042", "043"]
    assert out["late"] == ["036", "057", "043", "190", "042"]
    gated = visible_history(qs, PAIR_HISTORY, 1).collect()
    cutoffs = {"early": d("2024-02-04"), "late": d("2024-02-09")}
    assert all(row["date"] <= cutoffs[row["query_id"]] for row in gated.iter_rows(named=True))


def test_distance_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        recurrency(PAIR_QUERY, PAIR_HISTORY, distance_days=0)


def test_queries_without_history_and_the_empty_baseline():
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), ("q2", "2024-02-10", "NOR", "ISL"))
    out = recurrency(qs, PAIR_HISTORY)
    assert out.get_column("query_id").to_list() == ["q1", "q2"]  # query order kept
    assert ranked(out)["q2"] == [] and out.item(1, "answer_dict") == "{}"
    floor = empty(qs)
    assert floor.schema == FORECAST_SCHEMA
    assert floor.get_column("answer_dict").to_list() == ["{}", "{}"]
    with pytest.raises(ValueError, match="unknown baseline"):
        forecast("oracle", qs, PAIR_HISTORY, distance_days=1)


# --- stored runs and the leaderboard ------------------------------------------------------------


def write_database(data_dir, events: pl.DataFrame) -> None:
    """One events file per month, with only the columns the baselines read."""
    layout = DataLayout(data_dir)
    for (month,), frame in events.group_by(pl.col("date").dt.truncate("1mo")):
        atomic_write_parquet(frame, layout.database_path("events", month))


def baseline(name: str, method: str, **fields) -> Agent:
    return Agent(name=name, kind="baseline", knowledge_cutoff=None, distances=(1,), rounds=1, baseline=method, **fields)


def test_load_history_reads_only_months_up_to_the_gate(tmp_path):
    write_database(tmp_path, PAIR_HISTORY.vstack(history(("2024-03-02", "USA", "042", "CHN"))))
    got = load_history(tmp_path, d("2024-02-08")).collect()
    assert got.get_column("date").max() == d("2024-02-08")
    assert set(got.columns) == {"date", "s", "r", "o"}


def test_evaluate_baseline_writes_results_and_scores(tmp_path):
    write_database(tmp_path, PAIR_HISTORY)
    # Gold for q1: 036 and 190. Recurrency ranks 036 first and predicts all five relations.
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), answers=[{"03": ["036"], "19": ["190"]}])
    results, record = evaluate_baseline(qs, tmp_path, baseline("recurrency", "recurrency"), 1)
    directory = DataLayout(tmp_path).evaluation_dir(d("2024-02-01"), "recurrency", "queries", 1)
    assert directory == tmp_path / "evaluations" / "2024-02" / "recurrency" / "queries" / "distance=1"
    stored = json.loads((directory / "scores.json").read_text())
    assert stored == record
    assert pl.read_parquet(directory / "results.parquet").equals(results)
    # Each column is described for the evaluation asset's Columns tab.
    assert set(results.columns) <= set(RESULT_DESCRIPTIONS)
    # level 2: pred {036, 042, 043, 057, 190}, gold {036, 190}: P = 2/5 = 40, R = 100.
    assert record["metrics"]["level2_precision"] == pytest.approx(40.0)
    assert record["metrics"]["level2_recall"] == 100.0
    assert record["metrics"]["mrr"] == 100.0 and record["metrics"]["hit_at_10"] == 100.0
    assert (record["month"], record["distance"], record["n"], record["contaminated"]) == ("2024-02", 1, 1, False)
    assert record["code_version"] and record["metrics_std"]["level2_f1"] == 0.0
    assert results.columns[:6] == ["query_id", "date", "s", "o", "gold", "prediction"]


def test_frequency_run_records_the_k_it_used(tmp_path):
    write_database(tmp_path, PAIR_HISTORY)
    _, record = evaluate_baseline(PAIR_QUERY, tmp_path, baseline("frequency", "frequency"), 1)
    assert record["top_k"] == 1  # every visible pair-day has one relation


def test_contaminated_runs_need_force_and_are_never_ranked(tmp_path):
    write_database(tmp_path, PAIR_HISTORY)
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), answers=[{"03": ["036"]}])
    # A "baseline" trained through February 2024 may have seen the month it is tested on.
    trained = Agent(
        name="trained",
        kind="baseline",
        knowledge_cutoff=d("2024-02-29"),
        distances=(1,),
        rounds=1,
        baseline="recurrency",
    )
    with pytest.raises(NotEligible, match="not before 2024-02-01"):
        evaluate_baseline(qs, tmp_path, trained, 1)
    _, record = evaluate_baseline(qs, tmp_path, trained, 1, force=True)
    assert record["contaminated"] is True
    evaluate_baseline(qs, tmp_path, baseline("empty", "empty"), 1)
    evaluate_baseline(qs, tmp_path, baseline("frequency", "frequency", top_k=1), 1)
    board = leaderboard(tmp_path)
    rows = {row["agent"]: row for row in board.iter_rows(named=True)}
    # trained would win on F1 (036 is its top relation), but it is contaminated: no rank.
    assert rows["trained"]["contaminated"] and rows["trained"]["rank"] is None
    assert rows["trained"]["level2_f1"] > rows["frequency"]["level2_f1"]
    # frequency's one pick is 042 (3 days): 0 on every ranking metric, like empty: neither is
    # ranked (a run that got nothing right must not share first place), both listed before trained.
    assert (rows["frequency"]["rank"], rows["empty"]["rank"]) == (None, None)
    assert board.get_column("agent").to_list() == ["empty", "frequency", "trained"]


def test_leaderboard_ranks_within_month_and_distance(tmp_path):
    write_database(tmp_path, PAIR_HISTORY)
    # Recurrency predicts 042 at both distances (at 7 it sees only 042 and 043): it beats empty.
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), answers=[{"03": ["036"], "04": ["042"]}])
    for distance in (1, 7):
        evaluate_baseline(qs, tmp_path, baseline("recurrency", "recurrency"), distance)
        evaluate_baseline(qs, tmp_path, baseline("empty", "empty"), distance)
    board = leaderboard(tmp_path)
    assert board.height == 4
    assert board.filter(pl.col("agent") == "recurrency").get_column("rank").to_list() == [1, 1]
    assert board.filter(pl.col("agent") == "empty").get_column("rank").to_list() == [None, None]
    assert board.select("distance", "agent").rows() == [
        (1, "recurrency"),
        (1, "empty"),
        (7, "recurrency"),
        (7, "empty"),
    ]
    assert leaderboard(tmp_path / "nothing").height == 0


def test_all_zero_runs_are_ranked_last_and_ties_fall_to_level1_f1_then_mrr(tmp_path):
    """A leaderboard led by runs that forecast nothing (issue 20): every run that scored 0 on
    all ranking metrics comes after every run that scored anything, and has no rank."""
    from pipeline.evaluation.board import markdown_table, summary
    from pipeline.evaluation.board_files import chart
    from pipeline.evaluation.run import RANK_RULE

    write_database(tmp_path, PAIR_HISTORY)
    # Gold 043. recurrency lists every relation (043 among them); frequency's one pick, 042, is
    # wrong at level 2 but right at level 1 (04); empty predicts nothing.
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), answers=[{"04": ["043"]}])
    for agent in (
        baseline("aaa-empty", "empty"),
        baseline("frequency", "frequency", top_k=1),
        baseline("recurrency", "recurrency"),
    ):
        evaluate_baseline(qs, tmp_path, agent, 1)
    board = leaderboard(tmp_path)
    rows = {row["agent"]: row for row in board.iter_rows(named=True)}
    assert rows["frequency"]["level2_f1"] == rows["aaa-empty"]["level2_f1"] == 0
    assert rows["frequency"]["level1_f1"] > 0  # not all zero: ranked, below recurrency
    assert board.select("rank", "agent").rows() == [(1, "recurrency"), (2, "frequency"), (None, "aaa-empty")]
    assert "ties by first-level F1, then MRR" in RANK_RULE and "not ranked and listed last" in RANK_RULE
    assert markdown_table(summary(board)).splitlines()[-1].startswith("|  | 2024-02 |")  # unranked, last
    assert chart(board)[:8] == b"\x89PNG\r\n\x1a\n"


def test_leaderboard_aggregate_columns_for_baselines_and_for_runs_that_predate_them(tmp_path):
    """A baseline is one round: Max@1 is that round, "repeated" needs two rounds, it takes no
    steps. A run stored before the aggregates existed shows them empty, never 0, and keeps its
    rank."""
    from pipeline.evaluation.board import markdown_table, summary

    write_database(tmp_path, PAIR_HISTORY)
    qs = queries(("q1", "2024-02-10", "USA", "CHN"), answers=[{"03": ["036"], "04": ["042"]}])
    _, record = evaluate_baseline(qs, tmp_path, baseline("recurrency", "recurrency"), 1)
    assert record["max_at_k"] == {m: record["metrics"][m] for m in SET_METRICS}
    assert record["repeated"] is None and record["avg_steps"] is None
    evaluate_baseline(qs, tmp_path, baseline("old", "recurrency"), 1)
    old = DataLayout(tmp_path).evaluation_dir(d("2024-02-01"), "old", "queries", 1) / "scores.json"
    stored = json.loads(old.read_text())
    old.write_text(json.dumps({k: v for k, v in stored.items() if k not in ("max_at_k", "repeated", "avg_steps")}))

    board = leaderboard(tmp_path)
    assert set(AGGREGATE_COLUMNS) <= set(board.columns)
    assert all(board.schema[c] == pl.Float64 for c in AGGREGATE_COLUMNS)
    rows = {row["agent"]: row for row in board.iter_rows(named=True)}
    assert rows["recurrency"]["aggregation"] == "1 round; Max@1"
    assert rows["recurrency"]["max_at_k_level2_f1"] == rows["recurrency"]["level2_f1"] > 0
    assert rows["recurrency"]["repeated_level2_f1"] is None and rows["recurrency"]["avg_steps"] is None
    assert rows["old"]["aggregation"] == "1 round; Max@K, repeated and steps not stored"
    assert all(rows["old"][c] is None for c in AGGREGATE_COLUMNS)
    assert rows["old"]["rank"] == rows["recurrency"]["rank"] == 1  # equal metrics share the rank
    # Tied, so by name: old first. The cells after MRR: tokens in/out, cost, mode and action type
    # (none for a baseline), then Max@K L2 F1, repeated L2 F1, avg steps.
    lines = markdown_table(summary(board)).splitlines()
    blank = "|  " * 5
    # "@" escaped, as every cell's (GFM would link a bare address); it renders as "Max@K".
    assert lines[2].endswith(f"| 100.00 {blank}|  |  |  | 1 round; Max\\@K, repeated and steps not stored |")
    assert lines[3].endswith(f"| 100.00 {blank}| {rows['recurrency']['level2_f1']:.2f} |  |  | 1 round; Max\\@1 |")

    # Only old runs: the columns are still there, all null, with their type.
    old_only = tmp_path / "old-only"
    write_database(old_only, PAIR_HISTORY)
    evaluate_baseline(qs, old_only, baseline("old", "recurrency"), 1)
    path = DataLayout(old_only).evaluation_dir(d("2024-02-01"), "old", "queries", 1) / "scores.json"
    path.write_text(
        json.dumps(
            {k: v for k, v in json.loads(path.read_text()).items() if k not in ("max_at_k", "repeated", "avg_steps")}
        )
    )
    board = leaderboard(old_only)
    assert board.select(AGGREGATE_COLUMNS).null_count().row(0) == (1,) * len(AGGREGATE_COLUMNS)
    assert all(board.schema[c] == pl.Float64 for c in AGGREGATE_COLUMNS)


def test_queries_must_come_from_one_month(tmp_path):
    write_database(tmp_path, PAIR_HISTORY)
    qs = queries(("a", "2024-01-31", "USA", "CHN"), ("b", "2024-02-01", "USA", "CHN"))
    with pytest.raises(ValueError, match="one month"):
        evaluate_baseline(qs, tmp_path, baseline("empty", "empty"), 1)


def test_thousand_queries_in_one_pass(tmp_path):
    """Not a benchmark (bench/evaluate.py is): a guard that the forecast stays vectorised."""
    import time

    days = [T - timedelta(days=i) for i in range(1, 400)]
    pairs = [("USA", "CHN"), ("RUS", "UKR"), ("FRA", "DEU"), ("IND", "PAK")]
    codes = ["010", "036", "042", "043", "190"]
    hist = pl.DataFrame(
        [(day, s, r, o) for day in days for s, o in pairs for r in codes],
        schema={"date": pl.Date, "s": pl.String, "r": pl.String, "o": pl.String},
        orient="row",
    )
    qs = queries(*[(f"q{i}", (T + timedelta(days=i % 15)).isoformat(), *pairs[i % 4]) for i in range(1000)])
    started = time.perf_counter()
    out = recurrency(qs, hist.lazy())
    assert time.perf_counter() - started < 5
    assert out.height == 1000 and all(len(r) == 5 for r in out.get_column("ranked").to_list())


def test_a_killed_evaluations_staging_directory_is_removed_by_the_next_run(tmp_path):
    import subprocess

    from pipeline.evaluation.run import write_evaluation

    gone = subprocess.Popen(["true"])
    gone.wait()
    directory = tmp_path / "evaluations" / "2024-02" / "empty" / "queries" / "distance=1"
    directory.parent.mkdir(parents=True)
    left = directory.parent / f".{directory.name}.{gone.pid}.abc123"
    left.mkdir()
    write_evaluation(directory, pl.DataFrame({"query_id": ["q"]}), {"agent": "empty"})
    assert directory.is_dir() and not left.exists()
