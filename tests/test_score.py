"""`mirai score` (pipeline/evaluation/scoring.py): every input format, strict refusals naming the
record, lenient scoring as MIRAI's eval.py, missing queries, bootstrap determinism, hostile files,
and a downloaded release scored with no data directory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.cli import main
from pipeline.evaluation import score_inputs, scoring
from pipeline.evaluation.metrics import hit_at_k, mrr, score

GOLD = {
    "2024-01-00001": {"04": ["042"], "19": ["190"]},
    "2024-01-00002": {"01": ["010", "013"]},
    "2024-01-00003": {"17": ["173"]},
    "2024-01-00004": {"04": ["040", "042"]},
}
# A mix of right, half right and wrong answers, all valid.
ANSWERS = {
    "2024-01-00001": {"04": ["042"]},
    "2024-01-00002": {"01": ["010"], "19": ["190"]},
    "2024-01-00003": {"17": ["172"]},
    "2024-01-00004": {"04": ["042", "040"]},
}


def _release(root: Path, month: str = "2024-01") -> Path:
    """A directory shaped as `mirai download` leaves a release month: the split files and the manifest."""
    directory = root / month
    directory.mkdir(parents=True)
    queries = pl.DataFrame(
        {
            "query_id": list(GOLD),
            "date": [date(2024, 1, i + 1) for i in range(len(GOLD))],
            "s": ["USA", "CHN", "RUS", "FRA"],
            "o": ["CHN", "USA", "UKR", "DEU"],
            "answer_dict": [json.dumps(a) for a in GOLD.values()],
        }
    )
    queries.write_parquet(directory / "queries.parquet")
    queries.head(2).write_parquet(directory / "queries_sample.parquet")
    files = {
        name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest()}
        for name in ("queries.parquet", "queries_sample.parquet")
    }
    (directory / "manifest.json").write_text(
        json.dumps({"format": "mirai-release-v1", "release": month, "files": files})
    )
    return directory


@pytest.fixture
def release(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("MIRAI_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./data either
    return _release(tmp_path / "mirai-releases")


def _jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["score", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _card(out_dir: Path) -> dict:
    return json.loads((out_dir / "scorecard.json").read_text())


def _expected(answers: dict, rankings: dict | None = None) -> dict[str, float]:
    """The numbers of pipeline.evaluation.metrics for answers keyed by query (missing: empty)."""
    preds = [answers.get(q, {}) for q in GOLD]
    ranks = [(rankings or {}).get(q) or [c for codes in preds[i].values() for c in codes] for i, q in enumerate(GOLD)]
    golds = list(GOLD.values())
    return score(preds, golds) | {"mrr": mrr(ranks, golds), "hit_at_10": hit_at_k(ranks, golds, 10)}


def _assert_metrics(card: dict, expected: dict[str, float]) -> None:
    for metric in scoring.METRICS:
        assert card["metrics"][metric]["value"] == pytest.approx(expected[metric], abs=1e-4), metric
        low, high = card["metrics"][metric]["ci95"]
        assert low <= card["metrics"][metric]["value"] + 1e-4 and high >= card["metrics"][metric]["value"] - 1e-4


def test_jsonl_on_a_downloaded_release_with_no_data_dir(release, tmp_path, capsys):
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    code, out, err = _run(capsys, predictions, "--split", release, "--distance", 3, "--out", tmp_path / "card")
    assert code == 0, err
    card = _card(tmp_path / "card")
    assert card["distance_days"] == 3 and card["mode"] == "strict" and card["rounds"] == 1
    _assert_metrics(card, _expected(ANSWERS))
    assert card["split"]["month"] == "2024-01" and card["queries"] == 4 and card["missing"]["count"] == 0
    assert card["by_level1"]["04"]["queries"] == 2 and set(card["by_level1"]) == {"01", "04", "17", "19"}
    assert out == (tmp_path / "card" / "scorecard.md").read_text()
    assert "| level2_f1 |" in out and "| 04 | 2 |" in out
    assert not (tmp_path / "data").exists()
    assert card["split"]["manifest_checked"] is True

    # A queries file changed after the download no longer matches the manifest: refused.
    pl.read_parquet(release / "queries.parquet").head(3).write_parquet(release / "queries.parquet")
    code, _, err = _run(capsys, predictions, "--split", release)
    assert code == 1 and "does not match the sha256 its manifest.json lists" in err


def test_month_of_the_data_dir_and_the_sample(tmp_path, monkeypatch, capsys):
    _release(tmp_path / "data" / "splits")
    monkeypatch.setenv("MIRAI_DATA_DIR", str(tmp_path / "data"))
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    code, _, err = _run(capsys, predictions, "--split", "2024-01", "--sample", "--lenient", "--out", tmp_path / "c")
    assert code == 0, err
    card = _card(tmp_path / "c")
    assert card["split"]["query_set"] == "queries_sample" and card["queries"] == 2
    # The two queries outside the sample are unknown there: forgiven in lenient mode.
    assert card["forgiven"]["count"] == 2 and "unknown query_id '2024-01-00003'" in err
    code, _, err = _run(capsys, predictions, "--split", "2023-05")
    assert code == 1 and "no split for 2023-05" in err


def test_each_input_format_scores_the_same(release, tmp_path, capsys):
    rankings = {"2024-01-00001": ["190", "042"], "2024-01-00003": ["172", "173"]}
    records = [
        {"query_id": q, "answer": a} | ({"ranked": rankings[q]} if q in rankings else {}) for q, a in ANSWERS.items()
    ]
    expected = _expected(ANSWERS, rankings)
    jsonl = _jsonl(tmp_path / "p.jsonl", records)
    csv_path = tmp_path / "p.csv"
    pl.DataFrame(
        {
            "query_id": list(ANSWERS),
            "answer": [json.dumps(a) for a in ANSWERS.values()],
            "ranked": [json.dumps(rankings[q]) if q in rankings else "" for q in ANSWERS],
        }
    ).write_csv(csv_path)
    parquet = tmp_path / "p.parquet"
    pl.DataFrame(
        {
            "query_id": list(ANSWERS),
            "answer": [json.dumps(a) for a in ANSWERS.values()],
            "ranked": [rankings.get(q) for q in ANSWERS],
        },
        schema={"query_id": pl.String, "answer": pl.String, "ranked": pl.List(pl.String)},
    ).write_parquet(parquet)
    rounds = tmp_path / "mirai-out"
    for n in (1, 2):  # two identical rounds: the mean over rounds is the one round's score
        (rounds / f"round{n}").mkdir(parents=True)
        for q, a in ANSWERS.items():
            record = {"answer": repr(a), "end_state": "Final Answer", "n_steps": 3} | (
                {"ranked": rankings[q]} if q in rankings else {}
            )
            (rounds / f"round{n}" / f"{q}.json").write_text(json.dumps([record]))
    cards = []
    for path in (jsonl, csv_path, parquet, rounds):
        code, _, err = _run(capsys, path, "--split", release, "--out", tmp_path / f"card-{path.name}")
        assert code == 0, f"{path.name}: {err}"
        cards.append(_card(tmp_path / f"card-{path.name}"))
        _assert_metrics(cards[-1], expected)
    assert [c["metrics"] for c in cards[1:]] == [cards[0]["metrics"]] * 3
    assert cards[3]["rounds"] == 2 and expected["mrr"] != _expected(ANSWERS)["mrr"]


def test_answer_as_ranked_list(release, tmp_path, capsys):
    ranked = {"2024-01-00001": ["190", "042", "010"], "2024-01-00002": ["013"]}
    predictions = _jsonl(
        tmp_path / "p.jsonl",
        [
            {"query_id": "2024-01-00001", "answer": ranked["2024-01-00001"]},
            {"query_id": "2024-01-00002", "ranked": ["013"]},
        ],
    )
    code, _, err = _run(capsys, predictions, "--split", release, "--out", tmp_path / "c")
    assert code == 0, err
    answers = {"2024-01-00001": {"01": ["010"], "04": ["042"], "19": ["190"]}, "2024-01-00002": {"01": ["013"]}}
    _assert_metrics(_card(tmp_path / "c"), _expected(answers, ranked))
    assert "missing (scored as empty): 2024-01-00003" in err


BAD_RECORDS = [
    ({"query_id": "2024-01-00001", "answer": {"04": ["042"]}}, None),
    ({"query_id": "2024-01-00009", "answer": {}}, "line 2: unknown query_id '2024-01-00009'"),
    ({"query_id": "2024-01-00001", "answer": {}}, "line 3: duplicate query_id '2024-01-00001'"),
    ({"query_id": "2024-01-00002", "answer": {"01": ["10"]}}, "line 4: answer['01']: code '10' is malformed"),
    ({"query_id": "2024-01-00003", "answer": {"17": ["179"]}}, "line 5: answer['17']: code '179' is not a CAMEO"),
    ({"query_id": "2024-01-00004", "answer": {"04": "042"}}, "line 6: answer['04'] is str, not a list"),
    ({"query_id": 7, "answer": {}}, "line 7: query_id 7 is not a query id"),
    ({"query_id": "2024-01-00002", "answer": {"01": ["190"]}}, None),  # a duplicate of line 4: asserted below
    ('{"query_id": "2024-01-00003", "answer": ', "line 9: not JSON"),
    ("[1, 2]", "line 10: not a JSON object but list"),
    ({"query_id": "2024-01-00004", "answer": {"4": []}}, "line 11: answer key: code '4' is malformed"),
    ({"query_id": "2024-01-00003", "answer": "{'17': ['173']}"}, "line 12: answer is str"),
    ({"query_id": "2024-01-00004", "ranked": [42]}, "line 13: ranked: code 42 is int, not a string"),
]


def test_strict_names_every_problem_and_lenient_scores_as_eval(release, tmp_path, capsys):
    records = [r for r, _ in BAD_RECORDS]
    predictions = _jsonl(tmp_path / "bad.jsonl", records)
    code, out, err = _run(capsys, predictions, "--split", release, "--out", tmp_path / "strict")
    assert code == 1 and out == "" and not (tmp_path / "strict").exists()
    positions = [err.index(message) for _, message in BAD_RECORDS if message]
    assert positions == sorted(positions)  # in file order, whichever step found them
    assert "line 8: duplicate query_id '2024-01-00002'" in err  # line 4 came first
    assert err.strip().splitlines()[-1].startswith("mirai score: error: ") and "nothing was scored" in err

    # A level-2 code under the wrong key, alone: strict refuses, lenient drops that code only.
    wrong_key = _jsonl(tmp_path / "key.jsonl", [{"query_id": "2024-01-00002", "answer": {"01": ["010", "190"]}}])
    code, _, err = _run(capsys, wrong_key, "--split", release)
    assert code == 1 and "line 1: answer['01']: code '190' belongs under '19'" in err

    code, _, err = _run(capsys, predictions, "--split", release, "--lenient", "--out", tmp_path / "lenient")
    assert code == 0, err
    card = _card(tmp_path / "lenient")
    # eval.py's reading of the first record for each query: invalid parts dropped or the whole answer empty.
    eval_answers = {
        "2024-01-00001": {"04": ["042"]},
        "2024-01-00002": {"01": []},  # "10" dropped
        "2024-01-00003": {"17": []},  # "179" is no CAMEO code
        "2024-01-00004": {"04": []},  # {"04": "042"}: the key counts, the characters of "042" are no codes
    }
    rankings = {"2024-01-00004": []}
    _assert_metrics(card, _expected(eval_answers, rankings))
    assert card["mode"] == "lenient" and card["forgiven"]["count"] >= 12 and card["missing"]["count"] == 0
    assert "forgiven: line 2: unknown query_id" in err


def test_a_misspelt_key_is_refused_by_strict_scoring_and_forgiven_by_lenient(release, tmp_path, capsys):
    """Issue 33: {"answers": …, "ranked": …} was scored as its ranked list, 0 problems forgiven."""
    records = [
        {"query_id": "2024-01-00001", "answers": {"04": ["042"]}, "ranked": ["042"]},
        {"query_id": "2024-01-00002", "answer": {"01": ["010"]}, "p_events": 0.5, "Ranked": [], "x" * 200: 1, "y": 2},
    ]
    predictions = _jsonl(tmp_path / "misspelt.jsonl", records)
    code, out, err = _run(capsys, predictions, "--split", release)
    assert code == 1 and out == "", err
    assert "line 1: unknown key(s) 'answers'; a record holds query_id, answer, ranked, p_event" in err
    assert "line 2: unknown key(s) 'Ranked', 'p_events', 'xxxxxxx" in err and "… (200 characters) and 1 more" in err
    code, _, err = _run(capsys, predictions, "--split", release, "--lenient", "--out", tmp_path / "lenient")
    assert code == 0 and _card(tmp_path / "lenient")["forgiven"]["count"] == 2, err


def test_a_trailing_newline_makes_neither_a_query_id_nor_a_code(release, tmp_path, capsys):
    """Ids and codes are matched whole: a regex's "$" also matches before a final newline."""
    records = [
        {"query_id": "2024-01-00001\n", "answer": {}},
        {"query_id": "2024-01-00002", "answer": {"01": ["010\n"]}},
    ]
    code, _, err = _run(capsys, _jsonl(tmp_path / "newline.jsonl", records), "--split", release)
    assert code == 1
    assert "line 1: query_id '2024-01-00001\\n' is not a query id" in err, err
    assert "line 2: answer['01']: code '010\\n' is malformed" in err, err


def test_missing_queries_are_empty_answers(release, tmp_path, capsys):
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": "2024-01-00001", "answer": GOLD["2024-01-00001"]}])
    code, _, err = _run(capsys, predictions, "--split", release, "--out", tmp_path / "c")
    assert code == 0, err
    card = _card(tmp_path / "c")
    _assert_metrics(card, _expected({"2024-01-00001": GOLD["2024-01-00001"]}))
    assert card["metrics"]["level2_f1"]["value"] == 25.0
    assert card["missing"] == {"count": 3, "shown": ["2024-01-00002", "2024-01-00003", "2024-01-00004"]}
    assert err.count("missing (scored as empty)") == 3


def test_bootstrap_is_seeded_and_byte_stable(release, tmp_path, capsys):
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    outputs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        assert _run(capsys, predictions, "--split", release, "--seed", seed, "--out", tmp_path / name)[0] == 0
        outputs.append(
            ((tmp_path / name / "scorecard.json").read_bytes(), (tmp_path / name / "scorecard.md").read_bytes())
        )
    assert outputs[0] == outputs[1]
    first, other = json.loads(outputs[0][0]), json.loads(outputs[2][0])
    assert first["bootstrap"]["seed"] == 7 and other["bootstrap"]["seed"] == 8
    assert first["metrics"]["level2_f1"]["value"] == other["metrics"]["level2_f1"]["value"]
    assert any(first["metrics"][m]["ci95"] != other["metrics"][m]["ci95"] for m in scoring.METRICS)


def test_bootstrap_interval_is_the_percentile_interval_of_resampled_means():
    scores = np.array([[0.0], [100.0], [50.0], [25.0], [75.0]])
    low, high = scoring.bootstrap_intervals(scores, seed=3, resamples=200)
    draws = np.random.default_rng(3).integers(0, 5, size=(200, 5))
    means = scores[draws, 0].mean(axis=1)  # the plain (looped) definition
    assert low[0] == pytest.approx(np.percentile(means, 2.5)) and high[0] == pytest.approx(np.percentile(means, 97.5))


def test_hostile_files_are_refused(release, tmp_path, capsys, monkeypatch):
    good = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    link = tmp_path / "link.jsonl"
    link.symlink_to(good)
    code, _, err = _run(capsys, link, "--split", release)
    assert code == 1 and "refused: a symbolic link" in err
    monkeypatch.setattr(score_inputs, "MAX_PREDICTIONS_BYTES", 100)
    code, _, err = _run(capsys, good, "--split", release)
    assert code == 1 and "larger than 100 bytes" in err
    monkeypatch.undo()
    deep = _jsonl(tmp_path / "deep.jsonl", ["[" * 200_000 + "]" * 200_000])
    code, _, err = _run(capsys, deep, "--split", release)
    assert code == 1 and "line 1: longer than" in err
    nested = _jsonl(
        tmp_path / "nested.jsonl", ['{"query_id": "2024-01-00001", "answer": ' + "[" * 5000 + "]" * 5000 + "}"]
    )
    code, _, err = _run(capsys, nested, "--split", release)
    assert code == 1 and "line 1: JSON nested too deeply" in err
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe")
    code, _, err = _run(capsys, tmp_path / "bin.jsonl", "--split", release)
    assert code == 1 and "not UTF-8" in err
    (tmp_path / "p.txt").write_text("x")
    code, _, err = _run(capsys, tmp_path / "p.txt", "--split", release)
    assert code == 1 and "expected a .jsonl, .csv or .parquet" in err


def test_problem_output_is_bounded(release, tmp_path, capsys):
    predictions = _jsonl(tmp_path / "many.jsonl", [{"query_id": f"2024-02-{i:05d}", "answer": {}} for i in range(500)])
    code, _, err = _run(capsys, predictions, "--split", release)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == scoring.MAX_PROBLEMS_SHOWN + 2
    assert lines[-2] == f"… and {500 - scoring.MAX_PROBLEMS_SHOWN} more" and "500 problem(s)" in lines[-1]


def test_bad_parquet_csv_and_round_dir(release, tmp_path, capsys):
    wrong_type = tmp_path / "t.parquet"
    pl.DataFrame({"query_id": ["2024-01-00001"], "answer": [4]}).write_parquet(wrong_type)
    code, _, err = _run(capsys, wrong_type, "--split", release)
    assert code == 1 and "column answer is Int64, not String" in err
    extra = tmp_path / "x.parquet"
    pl.DataFrame({"query_id": ["2024-01-00001"], "answer": ["{}"], "code": ["import os"]}).write_parquet(extra)
    code, _, err = _run(capsys, extra, "--split", release)
    assert code == 1 and "no others" in err
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not parquet PAR1")
    code, _, err = _run(capsys, tmp_path / "junk.parquet", "--split", release)
    assert code == 1 and "not a readable parquet file" in err
    (tmp_path / "p.csv").write_text('query_id,answer\n2024-01-00001,"{""04"": [""042""]}"\n2024-01-00002\n')
    code, _, err = _run(capsys, tmp_path / "p.csv", "--split", release)
    assert code == 1 and "row 3: 1 fields, the header has 2" in err

    rounds = tmp_path / "out"
    (rounds / "round1").mkdir(parents=True)
    record = {"answer": "__import__('os').system('touch pwned')", "end_state": "Final Answer", "n_steps": 1}
    (rounds / "round1" / "2024-01-00001.json").write_text(json.dumps([record]))
    (rounds / "round1" / "2024-01-00002.json").write_text("{}")
    listed = {"answer": "['042']", "end_state": "Final Answer", "n_steps": 1}  # eval.py: not a dict, so empty
    (rounds / "round1" / "2024-01-00004.json").write_text(json.dumps([listed]))
    (rounds / "round1" / "other.json").write_text("[]")
    os.symlink(rounds / "round1" / "2024-01-00001.json", rounds / "round1" / "2024-01-00003.json")
    code, _, err = _run(capsys, rounds, "--split", release)
    assert code == 1 and not Path("pwned").exists()
    assert "round1/2024-01-00001.json: answer is not a Python literal" in err
    assert "round1/2024-01-00002.json: not MIRAI's shape" in err
    assert "round1/other.json: not a query of the split" in err
    assert "round1/2024-01-00003.json: a symbolic link" in err
    assert "round1/2024-01-00004.json: answer is list, not an answer dict" in err
    code, _, err = _run(capsys, rounds, "--split", release, "--lenient", "--out", tmp_path / "lenient")
    assert code == 0 and not Path("pwned").exists() and err.count("forgiven: ") == 5
    card = _card(tmp_path / "lenient")
    assert card["missing"]["count"] == 2 and card["metrics"]["level1_recall"]["value"] == 0.0  # 00001, 00004: empty
    code, _, err = _run(capsys, tmp_path / "empty-dir-missing", "--split", release)
    assert code == 1 and "expected a .jsonl" in err
    (tmp_path / "noround").mkdir()
    code, _, err = _run(capsys, tmp_path / "noround", "--split", release)
    assert code == 1 and "expected round1 … roundN directories" in err


def test_split_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MIRAI_DATA_DIR", raising=False)
    predictions = _jsonl(tmp_path / "p.jsonl", [])
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, predictions, "--split", tmp_path / "empty")
    assert code == 1 and "holds no queries.parquet" in err
    code, _, err = _run(capsys, predictions, "--split", "nowhere")
    assert code == 1 and "neither a directory nor a month" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["score", str(predictions)])
    assert exit_info.value.code == 2 and "--split" in capsys.readouterr().err


def test_the_installed_command_exit_codes(release, tmp_path):
    """`mirai score` as a user runs it (a subprocess): 0 scored, 1 refused, 2 a bad argument."""
    mirai = str(Path(sys.executable).with_name("mirai"))
    env = {k: v for k, v in os.environ.items() if k != "MIRAI_DATA_DIR"}
    good = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    bad = _jsonl(tmp_path / "bad.jsonl", [{"query_id": "2024-01-00001", "answer": {"04": ["999"]}}])
    runs = {
        name: subprocess.run(
            [mirai, "score", *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
        )
        for name, args in {
            "good": [str(good), "--split", str(release)],
            "bad": [str(bad), "--split", str(release)],
            "no split": [str(good), "--split", "2024-01"],
            "bad argument": [str(good), "--split", str(release), "--resamples", "0"],
        }.items()
    }
    assert runs["good"].returncode == 0 and runs["good"].stdout.startswith("# Scorecard: 2024-01 queries")
    assert runs["bad"].returncode == 1 and runs["bad"].stdout == ""
    assert runs["bad"].stderr.splitlines()[0] == "line 1: answer['04']: code '999' is not a CAMEO level-2 code"
    assert runs["no split"].returncode == 1 and len(runs["no split"].stderr.splitlines()) == 1
    assert "no split for 2024-01 at data/splits/2024-01" in runs["no split"].stderr
    assert (
        runs["bad argument"].returncode == 2 and "--resamples: expected from 1 to 100000" in runs["bad argument"].stderr
    )
    assert all("Traceback" not in r.stderr for r in runs.values())


# --- parquet whose stated sizes lie (issue 30) ------------------------------------------------------

BIG_ANSWER = '{"04": ["' + "0" * 2**20 + '"]}'  # 1 MiB of one character: it compresses to almost nothing


def _varint(value: int, length: int = 0) -> bytes:
    """``value`` as a thrift varint, in ``length`` bytes at least (an overlong varint, continuation
    bits on zero groups, decodes to the same number)."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        more = value or len(out) + 1 < length
        out.append(byte | 0x80 if more else byte)
        if not more:
            return bytes(out)


def zstd_bomb(rows: int, column: str = "answer", understate: bool = True) -> bytes:
    """``rows`` answers of 1 MiB each, zstd-compressed into ~60 bytes apiece, plain-encoded (every
    byte is decoded for real). With ``understate`` the footer's row-group size (thrift compact:
    a zigzag varint) is edited, at the same length, to 128 MiB: the file then passes a check that
    believes its footer."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [f"2024-01-{i:05d}" for i in range(rows)]
    table = pa.table({"query_id": ids, column: pa.array([BIG_ANSWER] * rows)})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, store_schema=False, compression="zstd", use_dictionary=False)
    data = buffer.getvalue()
    if understate:
        stated = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).total_byte_size
        true, lie = _varint(stated << 1), _varint(2**27 << 1)  # zigzag of a positive n is 2n
        assert len(true) == len(lie) == 5 and data.count(true) >= 1
        data = data.replace(true, lie)
        assert pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).total_byte_size == 2**27
    return data


def test_a_predictions_file_that_understates_its_size_is_refused_and_the_process_lives(tmp_path):
    """A 40 KB file holding 600 MiB of answers behind a footer that says 128 MiB: the decode runs
    in a child process with a memory bound, which it exceeds; the caller gets one line."""
    path = tmp_path / "predictions.parquet"
    path.write_bytes(zstd_bomb(600))
    assert path.stat().st_size < 64 * 2**10
    with pytest.raises(score_inputs.ScoringError) as refused:
        score_inputs.read_parquet(path)
    assert "refused: decoding it needs more than 256 MiB of memory" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_answers_that_share_one_dictionary_value_are_measured_before_they_become_strings(tmp_path):
    """Dictionary-encoded, 600 answers of 1 MiB fit in 2 KB of file and in little memory once
    decoded (they share one buffer); read row by row they would be 600 MiB of Python strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 600
    answers = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([BIG_ANSWER]))
    path = tmp_path / "predictions.parquet"
    table = pa.table({"query_id": [f"q{i}" for i in range(rows)], "answer": answers})
    pq.write_table(table, path, store_schema=False, compression="zstd")
    assert path.stat().st_size < 4 * 2**10
    with pytest.raises(score_inputs.ScoringError, match=r"refused: answer values longer than \d+ bytes"):
        score_inputs.read_parquet(path)


def test_a_handed_over_split_whose_queries_file_is_a_bomb_is_refused(tmp_path):
    """`mirai score --split DIR` with a queries.parquet of 40 KB that decodes to 600 MiB."""
    split = tmp_path / "split"
    split.mkdir()
    (split / "queries.parquet").write_bytes(zstd_bomb(600, column="answer_dict", understate=False))
    with pytest.raises(
        score_inputs.ScoringError, match=r"not a split's queries file \(decoding it needs more than 256 MiB"
    ):
        score_inputs.load_split(split)


def test_a_thousand_shared_codes_per_ranked_list_are_refused_by_their_sum(tmp_path):
    """Found by a re-attack: 1,000 ranked codes of 256 KiB each, one shared dictionary value, in a
    1 KB file. Each code is under the per-cell cap; read row by row they were 256 MiB of Python
    strings per row. Their sum is measured on the column first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, code = 4, "0" * 2**18
    ranked = pa.array([[code] * 1000] * rows, pa.list_(pa.string()))
    path = tmp_path / "predictions.parquet"
    table = pa.table({"query_id": [f"q{i}" for i in range(rows)], "answer": ["{}"] * rows, "ranked": ranked})
    pq.write_table(table, path, compression="zstd", dictionary_pagesize_limit=4 << 20)
    assert path.stat().st_size < 4 * 2**10
    with pytest.raises(score_inputs.ScoringError, match=r"refused: more than \d+ bytes of ranked codes"):
        score_inputs.read_parquet(path)


def test_a_split_whose_shared_answers_would_parse_to_gigabytes_is_refused(tmp_path):
    """Found by a re-attack: one 900 KB answer_dict shared by every row of a 1 KB queries.parquet;
    each row's json.loads kept ~11 MB. The column's lengths are measured before any row is parsed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, answer = 100, json.dumps({"01": ["010"] * 128_000})
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([answer]))
    split = tmp_path / "split"
    split.mkdir()
    table = pa.table({"query_id": [f"2024-01-{i:05d}" for i in range(rows)], "answer_dict": column})
    pq.write_table(table, split / "queries.parquet", store_schema=False, compression="zstd")
    with pytest.raises(score_inputs.ScoringError, match=r"answer_dict values too long to be gold answers"):
        score_inputs.load_split(split)


@pytest.mark.parametrize("name", ["queries.parquet", "manifest.json"])
def test_a_handed_over_split_linking_out_of_its_directory_is_refused(release, tmp_path, capsys, name):
    """`mirai score --split DIR` on a directory anyone handed over: a file that leads out of it (here
    the genuine release's own, elsewhere on the machine) was read and scored against, where `mirai
    evaluate` refuses the same link (test_evaluate_hostile.py)."""
    handed = tmp_path / "handed" / "2024-01"
    handed.mkdir(parents=True)
    for file in ("queries.parquet", "queries_sample.parquet", "manifest.json"):
        (handed / file).write_bytes((release / file).read_bytes())
    (handed / name).unlink()
    (handed / name).symlink_to(release / name)
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    code, out, err = _run(capsys, predictions, "--split", handed)
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert f"{name}' leads outside" in err and "refused" in err, err


def test_a_handed_over_split_file_that_is_a_fifo_is_refused_not_waited_on(release, tmp_path, capsys):
    handed = tmp_path / "handed" / "2024-01"
    handed.mkdir(parents=True)
    (handed / "queries.parquet").write_bytes((release / "queries.parquet").read_bytes())
    os.mkfifo(handed / "manifest.json")  # nothing would ever end its read
    predictions = _jsonl(tmp_path / "p.jsonl", [{"query_id": q, "answer": a} for q, a in ANSWERS.items()])
    code, _, err = _run(capsys, predictions, "--split", handed)
    assert code == 1 and "manifest.json' is not a regular file; refused" in err, err


def test_a_round_file_whose_name_is_not_utf8_is_forgiven_by_lenient_scoring(release, tmp_path, capsys):
    """A handed-over MIRAI round directory may hold any file name the filesystem allows; one that is
    not UTF-8 (os.scandir gives it with surrogate escapes) made the scorecard's digest of the
    directory raise UnicodeEncodeError once --lenient had forgiven it."""
    rounds = tmp_path / "rounds"
    (rounds / "round1").mkdir(parents=True)
    record = {"answer": json.dumps(ANSWERS["2024-01-00001"]), "end_state": "Final Answer", "n_steps": 1}
    (rounds / "round1" / "2024-01-00001.json").write_text(json.dumps([record]))
    with open(os.fsencode(rounds / "round1") + b"/\xff\xfe.json", "wb") as fh:
        fh.write(b"[]")
    code, out, err = _run(capsys, rounds, "--split", release, "--lenient")
    assert code == 0, err
    assert "forgiven: round1/'\\udcff\\udcfe.json': not a query of the split" in err, err
    assert "# Scorecard" in out
    code, _, err = _run(capsys, rounds, "--split", release)
    assert code == 1 and "round1/'\\udcff\\udcfe.json': not a query of the split" in err, err
