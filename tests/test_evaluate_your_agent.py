"""docs/evaluate-your-agent.md, done as a newcomer does it: the doc's commands and both of its
agents, as written, on a release published by the real code and fetched with `mirai download`,
then `mirai score` on what they wrote. No data directory, no Dagster: the doc cannot rot."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.release.publish import publish_release
from pipeline.release.store_uri import open_store
from pipeline.splits.split import Override, build_split
from testbed.database import generate_event_database

from .settings_builder import make_settings

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "evaluate-your-agent.md"
MONTH = date(2024, 2, 1)  # the month the doc's commands name
NOW = datetime(2024, 4, 1, tzinfo=UTC)


def _block(marker: str) -> str:
    found = re.search(rf"<!-- {marker}: [^>]*-->\n```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/evaluate-your-agent.md lost its {marker} block"
    return found.group(1)


def _command(prefix: str) -> list[str]:
    """The doc's one command line that starts with ``prefix``, split as a shell would (comments
    dropped), outside the demo's block (tests/test_demo.py runs that one)."""
    text = re.sub(r"<!-- demo-path: [^>]*-->\n```bash\n.*?```", "", DOC.read_text(), flags=re.DOTALL)
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"docs/evaluate-your-agent.md should show one `{prefix} …` command, found {lines}"
    return shlex.split(lines[0], comments=True)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory) -> Path:
    """A release store holding 2024-02: two generated database months, February's split (forced:
    no slot ledgers here) and its release, published by pipeline.release.publish into a local bucket. A
    later database month stays in the data directory, so a release that reached past its month
    would show."""
    root = tmp_path_factory.mktemp("newcomer")
    data_dir = root / "data"
    generate_event_database(data_dir, date(2024, 1, 1), 3, seed=11, quads_per_day=12)
    settings = make_settings(data_dir=data_dir, release_uri=str(root / "bucket"), split_sample_size=20)
    build_split(
        MONTH, settings.dataset, settings.gdelt, now=NOW, override=Override("test", "no ledgers in this test", NOW)
    )
    publish_release(
        MONTH, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    return root / "bucket"


def _expected_ranking(events: pl.DataFrame, query: dict, last_day: date) -> list[str]:
    """The agent's ranking computed from the published database files directly: relations of
    (s, o) up to last_day, most frequent first, ties by code."""
    counts = (
        events.filter((pl.col("s") == query["s"]) & (pl.col("o") == query["o"]) & (pl.col("date") <= last_day))
        .group_by("r")
        .len()
        .sort(["len", "r"], descending=[True, False])
    )
    return counts["r"].to_list()


def test_the_doc_s_path_from_download_to_scorecard(bucket, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MIRAI_DATA_DIR", raising=False)
    monkeypatch.delenv("MIRAI_RELEASE_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # a fresh directory: no ./data

    # 2. Download, as the doc says, from our bucket instead of the placeholder.
    download = _command("mirai download 2024-02 ")
    download[download.index("--from") + 1] = str(bucket)
    assert main(download[1:]) == 0, capsys.readouterr().err
    release = tmp_path / "mirai-releases" / "2024-02"
    assert (release / "manifest.json").is_file() and (release / "database" / "events").is_dir()
    assert not (release / "database" / "events" / "month=2024-03.parquet").exists()

    # 3. Both agents, as written, with the doc's command line.
    (tmp_path / "forecast.py").write_text(_block("newcomer-agent"))
    (tmp_path / "forecast_mirai.py").write_text(_block("newcomer-agent-mirai"))
    run = _command("python forecast.py ")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    for script, out in (("forecast.py", "predictions.jsonl"), ("forecast_mirai.py", "predictions_mirai.jsonl")):
        argv = [sys.executable, script, *run[2:]]
        argv[argv.index("predictions.jsonl")] = out
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    written = (tmp_path / "predictions.jsonl").read_text()
    assert (tmp_path / "predictions_mirai.jsonl").read_text() == written

    # The rankings are the pair's relations before each query's day, read from the files
    # themselves; counting the query's own day as well would change some of them.
    events = pl.read_parquet(release / "database" / "events" / "*.parquet").with_columns(
        pl.col("s", "r", "o").cast(pl.String)
    )
    sample = pl.read_parquet(release / "queries_sample.parquet").sort("query_id")
    records = [json.loads(line) for line in written.splitlines()]
    assert [r["query_id"] for r in records] == sample["query_id"].to_list()
    leaky = 0
    for record, query in zip(records, sample.iter_rows(named=True)):
        expected = _expected_ranking(events, query, query["date"] - timedelta(days=1))
        assert record["ranked"] == expected, record["query_id"]
        top = {}
        for code in expected[:3]:
            top.setdefault(code[:2], []).append(code)
        assert record["answer"] == top
        leaky += _expected_ranking(events, query, query["date"]) != expected
    assert leaky > 0, "no query's ranking depends on its own day: the gate would go untested"

    # 4. Score, with the doc's command: every sampled query answered, nothing forgiven.
    capsys.readouterr()
    assert main(_command("mirai score ")[1:]) == 0, capsys.readouterr().err
    card = json.loads((tmp_path / "scorecard" / "scorecard.json").read_text())
    assert card["queries"] == sample.height and card["missing"]["count"] == 0 and card["forgiven"]["count"] == 0
    assert card["split"] == card["split"] | {
        "month": "2024-02",
        "query_set": "queries_sample",
        "manifest_checked": True,
    }
    assert card["distance_days"] == 1
    assert 0 < card["metrics"]["level1_f1"]["value"] <= 100  # percent, as MIRAI reports them
    assert not (tmp_path / "data").exists()


def _mirai_doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "mirai.md").read_text()
    found = re.search(r"<!-- scripted-agent-commands: [^>]*-->\n```\n(.*?)```", text, re.DOTALL)
    assert found, "docs/mirai.md lost the commands that run and score its scripted agent"
    return [shlex.split(line) for line in found.group(1).splitlines()]


def _mirai_scripted_agent() -> str:
    text = (ROOT / "docs" / "mirai.md").read_text()
    found = re.search(r"<!-- scripted-agent: [^>]*-->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/mirai.md lost its scripted agent"
    return found.group(1)


def test_a_mirai_agent_s_round_files_on_the_release_s_own_bundle_are_scored(bucket, tmp_path, monkeypatch, capsys):
    """docs/mirai.md's scripted agent reads the release's MIRAI relation_query.csv and names its
    files by that file's QueryIds (1, 2, ...): `mirai score --relation-query` maps them to the
    split's queries, with the scores of the same answers written under our ids."""
    monkeypatch.delenv("MIRAI_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["download", "2024-02", "--from", str(bucket), "--dest", "mirai-releases"]) == 0
    (tmp_path / "scripted_agent.py").write_text(_mirai_scripted_agent())
    run, score = _mirai_doc_commands()
    assignment, python, *args = run
    name, value = assignment.split("=", 1)
    assert (name, python) == ("MIRAI_DATA_DIR", "python")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), name: value}
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    relation_query = args[1]
    sample = pl.read_parquet(Path(value) / "queries_sample.parquet")
    assert sorted(p.name for p in (tmp_path / "out" / "round1").iterdir()) == sorted(
        f"{n}.json" for n in range(1, sample.height + 1)
    )

    # Without the mapping, no file is a query of the split: refused, one line per file.
    capsys.readouterr()
    plain = [a for a in score if a != "--relation-query" and not a.endswith("relation_query.csv")]
    assert main(plain[1:]) == 1
    assert capsys.readouterr().err.count(": not a query of the split") == sample.height

    assert main([*score[1:], "--out", "mapped"]) == 0, capsys.readouterr().err
    mapped = json.loads((tmp_path / "mapped" / "scorecard.json").read_text())
    assert mapped["queries"] == sample.height and mapped["missing"]["count"] == 0

    # The same answers under our query ids, matched on (date, s, o) by hand.
    csv_rows = pl.read_csv(relation_query, separator="\t", infer_schema=False)
    ours = {(d.isoformat(), s, o): q for q, d, s, o in sample.select("query_id", "date", "s", "o").iter_rows()}
    lines = []
    for mirai_id, day, s, o in csv_rows.select(
        "QueryId", "DateStr", "Actor1CountryCode", "Actor2CountryCode"
    ).iter_rows():
        (record,) = json.loads((tmp_path / "out" / "round1" / f"{mirai_id}.json").read_text())
        lines.append(json.dumps({"query_id": ours[(day, s, o)], "answer": json.loads(record["answer"])}) + "\n")
    (tmp_path / "ours.jsonl").write_text("".join(lines))
    assert main(["score", "ours.jsonl", "--split", value, "--sample", "--out", "ours"]) == 0
    by_ours = json.loads((tmp_path / "ours" / "scorecard.json").read_text())
    assert mapped["metrics"] == by_ours["metrics"] and mapped["by_level1"] == by_ours["by_level1"]

    # The mapping is for round directories, and the CSV must name every query of the split.
    assert main(["score", "ours.jsonl", "--split", value, "--sample", "--relation-query", relation_query]) == 1
    assert "names the files of a MIRAI round directory" in capsys.readouterr().err
    (tmp_path / "short.csv").write_text("\n".join(Path(relation_query).read_text().splitlines()[:-1]) + "\n")
    assert main(["score", "out", "--split", value, "--sample", "--relation-query", "short.csv"]) == 1
    assert "appears 0 times, not once" in capsys.readouterr().err


def test_both_agents_run_on_a_release_whose_first_queries_have_no_history(tmp_path, monkeypatch, capsys):
    """Issue 33, point 4: on a release of the database's first month (the demo's January), a query
    on its first day sees no day at all; the MIRAI drop-in agent failed there ("Date must be on or
    before the current date 2023-12-31, but received: 2024-01-01")."""
    january = date(2024, 1, 1)
    data_dir = tmp_path / "data"
    generate_event_database(data_dir, january, 2, seed=11, quads_per_day=12)
    settings = make_settings(data_dir=data_dir, release_uri=str(tmp_path / "bucket"), split_sample_size=10_000)
    build_split(
        january, settings.dataset, settings.gdelt, now=NOW, override=Override("test", "no ledgers in this test", NOW)
    )
    publish_release(
        january, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["download", "2024-01", "--from", str(tmp_path / "bucket"), "--dest", "mirai-releases"]) == 0
    release = tmp_path / "mirai-releases" / "2024-01"
    sample = pl.read_parquet(release / "queries_sample.parquet").sort("query_id")
    assert sample["date"].min() == january  # the first queries' history is empty
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    written = {}
    for marker in ("newcomer-agent", "newcomer-agent-mirai"):
        (tmp_path / "agent.py").write_text(_block(marker))
        argv = [sys.executable, "agent.py", str(release), "out.jsonl", "1"]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        written[marker] = (tmp_path / "out.jsonl").read_text()
    assert written["newcomer-agent"] == written["newcomer-agent-mirai"]
    records = {r["query_id"]: r for r in map(json.loads, written["newcomer-agent"].splitlines())}
    first = sample.filter(pl.col("date") == january)["query_id"].to_list()
    assert first and all(records[q]["ranked"] == [] and records[q]["answer"] == {} for q in first)
