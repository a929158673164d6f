"""Releases that data tools open natively: every config of a release's card opens with
`datasets.load_dataset`, offline, with the parquet files' row counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipeline.config import ReleaseSettings
from pipeline.release.publish import publish_release
from pipeline.release.store import LocalStore
from pipeline.splits.database import build_event_database
from pipeline.splits.split import build_split

from .month_builder import write_month
from .settings_builder import make_settings
from .test_release import AFTER_GRACE, FEB, JAN, JAN_QUADS
from .test_splits import QUADS

# Run in a child process: the datasets library reads these when it is imported, and no test may
# reach the network (the Hub) or share a cache with another run.
LOAD_EVERY_CONFIG = """
import json, sys
import datasets
path, names = sys.argv[1], json.loads(sys.argv[2])
print(json.dumps({name: {split: ds.num_rows for split, ds in datasets.load_dataset(path, name).items()} for name in names}))
"""


def load_every_config(path: Path, names: list[str], cache: Path) -> dict[str, dict[str, int]]:
    """{config: {split: rows}} as `datasets.load_dataset(path, config)` reads them, offline."""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cache),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EVERY_CONFIG, str(path), json.dumps(names)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def card_configs(readme: Path) -> list[dict]:
    _, front, _ = readme.read_text().split("---\n", 2)
    return yaml.safe_load(front)["configs"]


def parquet_rows(directory: Path, pattern: str) -> int:
    return sum(pl.scan_parquet(p).select(pl.len()).collect().item() for p in sorted(directory.glob(pattern)))


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory) -> Path:
    """Release 2024-02 (database months January and February) as the pipeline publishes it, in a
    local-directory store."""
    root = tmp_path_factory.mktemp("hf")
    settings = make_settings(data_dir=root / "data")
    for month, quads in ((JAN, JAN_QUADS), (FEB, QUADS)):
        write_month(settings, month, quads)
        build_event_database(month, settings.dataset, settings.articles)
        build_split(month, settings.dataset, settings.gdelt, now=AFTER_GRACE)
    store = LocalStore(root / "bucket")
    for month in (JAN, FEB):
        publish_release(month, settings.dataset, ReleaseSettings(), store)
    return root / "bucket" / "releases" / "2024-02"


def test_every_config_of_a_release_card_opens_with_load_dataset_offline(release_dir, tmp_path):
    configs = {c["config_name"]: c for c in card_configs(release_dir / "README.md")}
    assert list(configs) == ["queries", "queries_sample", "events", "news"]
    assert [name for name, c in configs.items() if c.get("default")] == ["queries"]
    loaded = load_every_config(release_dir, list(configs), tmp_path)
    assert loaded == {
        "queries": {"test": parquet_rows(release_dir, "queries.parquet")},
        "queries_sample": {"test": parquet_rows(release_dir, "queries_sample.parquet")},
        "events": {"database": parquet_rows(release_dir, "database/events/*.parquet")},
        "news": {"database": parquet_rows(release_dir, "database/news/*.parquet")},
    }
    # Both database months are read, and every table has rows (a count of 0 would prove nothing).
    assert sorted(p.name for p in (release_dir / "database" / "events").iterdir()) == [
        "month=2024-01.parquet",
        "month=2024-02.parquet",
    ]
    assert all(rows > 0 for splits in loaded.values() for rows in splits.values())
    assert loaded["events"]["database"] > parquet_rows(release_dir, "database/events/month=2024-02.parquet")
