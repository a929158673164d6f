"""Predictions in MIRAI's layout (pipeline/evaluation/mirai_predictions.py): a stored run written as
round<N>/<QueryId>.json and read back scores as run.py scored it; hostile files are refused with one
line naming the file; nothing in a file is executed."""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.evaluation.metrics import aggregate_rounds
from pipeline.evaluation.mirai_predictions import (
    MAX_ANSWER_CHARS,
    MAX_FILE_BYTES,
    PredictionFileError,
    export_predictions,
    mirai_query_ids,
    read_predictions,
    score_round,
)
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.run import evaluate_agent, evaluate_baseline
from pipeline.storage import DataLayout
from testbed.database import generate_event_database
from tests.test_agents import ScriptedClient

MONTH = date(2024, 2, 1)
QUERIES = pl.DataFrame(
    {
        "query_id": ["2024-02-00001", "2024-02-00002", "2024-02-00003"],
        "date": [date(2024, 2, 10), date(2024, 2, 11), date(2024, 2, 11)],
        "s": ["USA", "RUS", "AUS"],
        "o": ["CHN", "UKR", "CHN"],
        "answer_dict": [
            json.dumps(a) for a in ({"04": ["042"]}, {"19": ["190", "193"]}, {"03": ["036"], "04": ["042"]})
        ],
    }
)
DIST = 'get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])'
# Two rounds of three episodes, with the answers eval.py and a careless reader disagree on: a code
# under the wrong key, a string for a list, JSON's null (an unknown name to eval.py's `eval`), none.
# In the order the episodes run: by cutoff, a query's rounds together (episodes._pending).
REPLIES = [
    # 2024-02-10: query 1, rounds 1 and 2
    f"Action: {DIST}",
    'Final Answer: {"04": ["042", "190"], "19": ["190"]}',
    'Final Answer: {"04": ["042"], "note": null}',
    # 2024-02-11, round 1: queries 2 and 3
    'Final Answer: {"19": "190", "1": ["193"]}',
    "x",
    "y",
    "z",
    "I cannot tell.",
    # 2024-02-11, round 2: queries 2 and 3
    'Final Answer: {"03": ["036"], "04": ["042", "043"]}',
    'Final Answer: {"19": ["190", "193"]}',
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mirai-predictions")
    generate_event_database(root, date(2024, 1, 1), 2, seed=5, quads_per_day=40)
    return root


@pytest.fixture(scope="module")
def llm_run(data_dir):
    agent = Agent(
        name="scripted",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=2,
        gguf=data_dir / "none.gguf",
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=3,
    )
    results, record = evaluate_agent(QUERIES, data_dir, agent, 1, client=ScriptedClient(REPLIES), query_set="t")
    return DataLayout(data_dir).evaluation_dir(MONTH, "scripted", "t", 1), results, record


def _scores(directory: Path, query_ids: list[str]) -> tuple[list[dict], list]:
    rounds = read_predictions(directory, query_ids)
    answers = [json.loads(a) for a in QUERIES.get_column("answer_dict")]
    return [score_round(r, answers) for r in rounds], rounds


def test_an_llm_run_round_trips_with_run_py_scores(llm_run, tmp_path):
    run_dir, results, record = llm_run
    written = export_predictions(run_dir, tmp_path)
    assert sorted(written) == [1, 2] and all(len(paths) == 3 for paths in written.values())
    per_round, rounds = _scores(tmp_path, QUERIES.get_column("query_id").to_list())
    stored = aggregate_rounds(per_round)
    assert stored["mean"] == pytest.approx(record["metrics"], rel=1e-12, abs=1e-12)
    assert stored["std"] == pytest.approx(record["metrics_std"], rel=1e-12, abs=1e-12)
    # Per round too, against the per-query rows run.py stored.
    for n, metrics in enumerate(per_round):
        rows = results.filter(pl.col("round") == n)
        assert metrics["level2_f1"] == pytest.approx(rows.get_column("level2_f1").mean())
    # MIRAI's shape: a one-element list with MIRAI's keys; end states under MIRAI's names.
    content = json.loads((tmp_path / "round1" / "2024-02-00003.json").read_text())
    assert isinstance(content, list) and len(content) == 1
    record1 = content[0]
    assert record1["query_id"] == "2024-02-00003" and record1["gt_answer"] == "{'03': ['036'], '04': ['042']}"
    assert record1["end_state"] == "Invalid Action" and record1["n_steps"] == 3 and len(record1["json_log"]) == 3
    assert record1["ext_request"] == "I cannot tell." and record1["answer"] == "{}"
    assert [p.end_state for p in rounds[0]] == ["Final Answer", "Final Answer", "Invalid Action"]
    # JSON's null voids an answer under eval.py's eval, not under run.py's scoring: the file then
    # carries the scored content, and the stored text beside it.
    nulled = json.loads((tmp_path / "round2" / "2024-02-00001.json").read_text())[0]
    assert json.loads(nulled["answer"]) == {"04": ["042"]} and "null" in nulled["answer_as_stored"]


def test_a_baseline_round_trips_with_its_ranked_metrics(data_dir, tmp_path):
    agent = Agent(name="freq", kind="baseline", knowledge_cutoff=None, distances=(1,), rounds=1, baseline="frequency")
    _, record = evaluate_baseline(QUERIES, data_dir, agent, 1, query_set="t")
    run_dir = DataLayout(data_dir).evaluation_dir(MONTH, "freq", "t", 1)
    export_predictions(run_dir, tmp_path / "out")
    per_round, rounds = _scores(tmp_path / "out", QUERIES.get_column("query_id").to_list())
    assert len(per_round) == 1 and per_round[0]["mrr"] == pytest.approx(record["metrics"]["mrr"])
    assert aggregate_rounds(per_round)["mean"] == pytest.approx(record["metrics"], rel=1e-12, abs=1e-12)
    assert {(p.end_state, p.n_steps) for p in rounds[0]} == {("baseline", 0)}


def test_files_are_named_by_a_relation_query_csv_and_rewritten_whole(llm_run, tmp_path):
    run_dir, _, _ = llm_run
    csv = tmp_path / "relation_query.csv"
    csv.write_text(
        "QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\tAnswerDict\n"
        "1\t2024-02-10\tUSA\tCHN\t{'04': ['042']}\n"
        "2\t2024-02-11\tAUS\tCHN\t{'03': ['036'], '04': ['042']}\n"
        "3\t2024-02-11\tRUS\tUKR\t{'19': ['190', '193']}\n"
    )
    ids = mirai_query_ids(QUERIES, csv)
    assert ids == {"2024-02-00001": "1", "2024-02-00002": "3", "2024-02-00003": "2"}
    out = tmp_path / "out"
    (out / "round1").mkdir(parents=True)
    (out / "round1" / "stale.json").write_text("[]")
    export_predictions(run_dir, out, ids)
    assert sorted(p.name for p in (out / "round1").iterdir()) == ["1.json", "2.json", "3.json"]
    assert [n for n in os.listdir(out) if n.startswith(".")] == []
    first = read_predictions(out, ["1", "2", "3"])[0]
    assert first[1].query_id == "2" and first[1].end_state == "Invalid Action"
    csv.write_text("QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\n1\t2024-02-10\tUSA\tCHN\n")
    with pytest.raises(ValueError, match=r"\(2024-02-11, RUS, \?, UKR\) \(2024-02-00002\) appears 0 times"):
        mirai_query_ids(QUERIES, csv)


def test_the_cli_exports_a_stored_run(llm_run, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIRAI_DATA_DIR", str(data_dir))
    args = ["export", "predictions", "--month", "2024-02", "--agent", "scripted", "--query-set", "t"]
    assert main([*args, "--out", str(tmp_path / "p")]) == 0
    assert "6 prediction files in 2 round(s)" in capsys.readouterr().out
    assert len(read_predictions(tmp_path / "p", QUERIES.get_column("query_id").to_list())) == 2
    assert main(["export", "predictions", "--month", "2024-03", "--agent", "scripted", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mirai export predictions: error: no stored run at") and err.count("\n") == 1


# --- hostile files ---------------------------------------------------------------------------------

GOOD = {"query_id": "q1", "n_steps": 2, "end_state": "Final Answer", "answer": '{"04": ["042"]}'}


def _write(directory: Path, content: bytes | str | object, name: str = "q1.json") -> Path:
    (directory / "round1").mkdir(parents=True, exist_ok=True)
    path = directory / "round1" / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


ATTACKS = {
    "not JSON": (b"{'answer': ", "not JSON"),
    "not UTF-8": (b'[{"answer": "\xff"}]', "not UTF-8"),
    "nested too deeply": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "an object, not a list": (GOOD, "a JSON list holding one object"),
    "two objects": ([GOOD, GOOD], "a JSON list holding one object"),
    "answer not a string": ([GOOD | {"answer": {"04": ["042"]}}], "'answer' must be a string"),
    "answer too long": ([GOOD | {"answer": "{" + " " * MAX_ANSWER_CHARS + "}"}], "'answer' longer than"),
    "n_steps a bool": ([GOOD | {"n_steps": True}], "'n_steps' must be a whole number"),
    "n_steps negative": ([GOOD | {"n_steps": -1}], "'n_steps' must be a whole number"),
    "n_steps with 5000 digits": (b'[{"n_steps": ' + b"9" * 5000 + b"}]", "not JSON"),
    "end_state missing": ([{k: v for k, v in GOOD.items() if k != "end_state"}], "'end_state' must be a string"),
    "another query's id": ([GOOD | {"query_id": "q2"}], "'query_id' 'q2' is not the file's query 'q1'"),
    "ranked not strings": ([GOOD | {"ranked": [1, 2]}], "'ranked' must be a list"),
    "too big": (b"[" + b" " * MAX_FILE_BYTES + b"]", f"larger than {MAX_FILE_BYTES} bytes"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_file_is_refused_in_one_line_naming_it(tmp_path, attack):
    content, reason = ATTACKS[attack]
    path = _write(tmp_path, content)
    with pytest.raises(PredictionFileError) as caught:
        read_predictions(tmp_path, ["q1"])
    message = str(caught.value)
    assert message.startswith(f"{path}: refused: ") and reason in message and "\n" not in message


def test_links_fifos_gaps_and_missing_files_are_refused(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps([GOOD]))
    _write(tmp_path / "a", [GOOD])
    (tmp_path / "a" / "round1" / "q2.json").symlink_to(secret)
    with pytest.raises(PredictionFileError, match=r"q2\.json: refused: a symbolic link$"):
        read_predictions(tmp_path / "a", ["q1", "q2"])
    os.mkfifo(tmp_path / "a" / "round1" / "q3.json")  # would block a plain open()
    with pytest.raises(PredictionFileError, match=r"q3\.json: refused: not a regular file$"):
        read_predictions(tmp_path / "a", ["q3"])
    with pytest.raises(PredictionFileError, match=r"q4\.json: refused: missing"):
        read_predictions(tmp_path / "a", ["q4"])
    (tmp_path / "a" / "round3").mkdir()
    with pytest.raises(PredictionFileError, match=r"expected round1 … roundN directories"):
        read_predictions(tmp_path / "a", ["q1"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "round1").symlink_to(tmp_path / "a" / "round1")
    with pytest.raises(PredictionFileError, match=r"round1: refused: not a directory"):
        read_predictions(tmp_path / "b", ["q1"])
    with pytest.raises(ValueError, match="cannot be a file name"):
        read_predictions(tmp_path / "a", ["../secret"])


def test_an_answer_is_parsed_as_a_literal_never_run(tmp_path):
    planted = tmp_path / "planted"
    code = f"__import__('pathlib').Path({str(planted)!r}).touch() or {{'04': ['042']}}"
    _write(tmp_path, [GOOD | {"answer": code}])
    _write(tmp_path, [GOOD | {"query_id": "q2", "answer": ""}], "q2.json")
    _write(tmp_path, [GOOD | {"query_id": "q3", "answer": "{'04': ('042',), '19': ['190']}"}], "q3.json")
    (first,) = read_predictions(tmp_path, ["q1", "q2", "q3"])
    assert not planted.exists()
    assert [p.answer for p in first] == [None, None, {"04": ("042",), "19": ["190"]}]
    scores = score_round(first, [{"04": ["042"]}] * 3)
    assert scores["level2_recall"] == pytest.approx(100 / 3)
