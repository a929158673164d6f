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
from pipeline.config import Settings
from pipeline.release import open_store, publish_release
from pipeline.splits import Override, build_split
from testbed.database import generate_event_database

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "evaluate-your-agent.md"
MONTH = date(2024, 2, 1)  # the month the doc's commands name
NOW = datetime(2024, 4, 1, tzinfo=UTC)


def _block(marker: str) -> str:
    found = re.search(rf"<!-- {marker}: [^>]*-->\n```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/evaluate-your-agent.md lost its {marker} block"
    return found.group(1)


def _command(prefix: str) -> list[str]:
    """The doc's one command line that starts with ``prefix``, split as a shell would (comments dropped)."""
    lines = [line for line in DOC.read_text().splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"docs/evaluate-your-agent.md should show one `{prefix} …` command, found {lines}"
    return shlex.split(lines[0], comments=True)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory) -> Path:
    """A release store holding 2024-02: two generated database months, February's split (forced:
    no slot ledgers here) and its release, published by pipeline.release into a local bucket. A
    later database month stays in the data directory, so a release that reached past its month
    would show."""
    root = tmp_path_factory.mktemp("newcomer")
    data_dir = root / "data"
    generate_event_database(data_dir, date(2024, 1, 1), 3, seed=11, quads_per_day=12)
    settings = Settings(data_dir=data_dir, release_uri=str(root / "bucket"), split_sample_size=20)
    build_split(MONTH, settings, now=NOW, override=Override("test", "no ledgers in this test", NOW))
    publish_release(MONTH, settings, open_store(settings))
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
