"""Releases that data tools open natively: every config of a release's card, and of the dataset
repository `mirai export hf` writes, opens with `datasets.load_dataset`, offline, with the parquet
files' row counts; each release's croissant.json passes the Croissant reference validator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipeline.cli import main
from pipeline.config import ReleaseSettings
from pipeline.release.publish import publish_release
from pipeline.release.store import LocalStore
from pipeline.release.tables import EVENT_DB_SCHEMA, NEWS_DB_SCHEMA, QUERIES_SCHEMA
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


def assert_every_config_opens(directory: Path, cache: Path) -> dict[str, dict[str, int]]:
    """Open every config of ``directory``'s card with load_dataset, offline: each split has as many
    rows as the parquet files its data_files name, and every one has rows (0 would prove nothing).
    Returns {config: {split: rows}}."""
    configs = card_configs(directory / "README.md")
    loaded = load_every_config(directory, [c["config_name"] for c in configs], cache)
    assert loaded == {
        c["config_name"]: {f["split"]: parquet_rows(directory, f["path"]) for f in c["data_files"]} for c in configs
    }
    assert all(rows > 0 for splits in loaded.values() for rows in splits.values()), loaded
    return loaded


def assert_croissant_validates(release_dir: Path) -> None:
    """croissant.json passes mlcroissant's validator, lists every other file of the manifest with
    its sha256 and size and every table's columns, and its records are the files' rows."""
    import mlcroissant

    manifest = json.loads((release_dir / "manifest.json").read_text())
    assert "croissant.json" in manifest["files"]
    # The validator of the Croissant reference library raises on any error. Its one warning asks
    # for a datePublished, which the file cannot hold: like the manifest it has no timestamp, so
    # that re-planning an unchanged month gives the same bytes (index.json has published_at).
    dataset = mlcroissant.Dataset(jsonld=release_dir / "croissant.json")
    assert [w for w in dataset.metadata.ctx.issues.warnings if "datePublished" not in w] == []
    listed = {f.id: f for f in dataset.metadata.distribution if isinstance(f, mlcroissant.FileObject)}
    others = {name: meta for name, meta in manifest["files"].items() if name != "croissant.json"}
    assert {name: (f.sha256, f.content_size) for name, f in listed.items()} == {
        name: (meta["sha256"], f"{meta['bytes']} B") for name, meta in others.items()
    }
    fields = {rs.id: [f.name for f in rs.fields] for rs in dataset.metadata.record_sets}
    assert fields == {
        "queries": QUERIES_SCHEMA.names(),
        "queries_sample": QUERIES_SCHEMA.names(),
        "events": EVENT_DB_SCHEMA.names(),
        "news": NEWS_DB_SCHEMA.names(),
    }
    assert sum(1 for _ in dataset.records("queries")) == parquet_rows(release_dir, "queries.parquet")
    assert sum(1 for _ in dataset.records("events")) == parquet_rows(release_dir, "database/events/*.parquet")


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
    configs = card_configs(release_dir / "README.md")
    assert [c["config_name"] for c in configs] == ["queries", "queries_sample", "events", "news"]
    assert [c["config_name"] for c in configs if c.get("default")] == ["queries"]
    loaded = assert_every_config_opens(release_dir, tmp_path)
    assert {name: list(splits) for name, splits in loaded.items()} == {
        "queries": ["test"],
        "queries_sample": ["test"],
        "events": ["database"],
        "news": ["database"],
    }
    # Both database months are read.
    assert sorted(p.name for p in (release_dir / "database" / "events").iterdir()) == [
        "month=2024-01.parquet",
        "month=2024-02.parquet",
    ]
    assert loaded["events"]["database"] > parquet_rows(release_dir, "database/events/month=2024-02.parquet")


def test_the_croissant_file_validates_and_lists_every_file_and_field(release_dir):
    assert_croissant_validates(release_dir)


# --- mirai export hf --------------------------------------------------------------------------


def test_export_hf_writes_one_repository_whose_every_config_opens_offline(release_dir, tmp_path, capsys):
    out = tmp_path / "repo"
    assert main(["export", "hf", str(out), "--from", str(release_dir.parent)]) == 0
    assert "releases 2024-01, 2024-02" in capsys.readouterr().out
    configs = {c["config_name"]: c for c in card_configs(out / "README.md")}
    tables = ("queries", "queries_sample", "events", "news")
    per_month = [f"{t}-{m}" for m in ("2024-01", "2024-02") for t in tables]
    assert sorted(configs) == sorted([*tables, *per_month])
    record = json.loads((out / "export.json").read_text())
    assert record["configs"] == list(configs) and record["database_months"] == ["2024-01", "2024-02"]
    # Each database month is stored once, though release 2024-02 carries January's again.
    assert sorted(str(p.relative_to(out)) for p in (out / "database").rglob("*.parquet")) == [
        f"database/{t}/month={m}.parquet" for t in ("events", "news") for m in ("2024-01", "2024-02")
    ]
    loaded = assert_every_config_opens(out, tmp_path / "cache")
    assert loaded["events"]["database"] == loaded["events-2024-01"]["database"] + loaded["events-2024-02"]["database"]
    assert loaded["queries"]["test"] == loaded["queries-2024-01"]["test"] + loaded["queries-2024-02"]["test"]
    # Each file is the release's own, byte for byte.
    assert (out / "splits" / "2024-02" / "queries.parquet").read_bytes() == (
        release_dir / "queries.parquet"
    ).read_bytes()
    assert (out / "splits" / "2024-02" / "manifest.json").read_bytes() == (release_dir / "manifest.json").read_bytes()

    # Idempotent: the same releases again change nothing; the repository is replaced only whole.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(["export", "hf", str(out), "--from", str(release_dir.parent / "2024-01"), str(release_dir)]) == 0
    assert "(unchanged)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # Only January: fewer configs, and February's files are gone.
    assert main(["export", "hf", str(out), "--from", str(release_dir.parent / "2024-01")]) == 0
    assert not (out / "splits" / "2024-02").exists()
    assert "queries-2024-02" not in json.loads((out / "export.json").read_text())["configs"]


def test_export_hf_refuses_a_file_that_is_not_its_releases_and_a_directory_of_the_users(release_dir, tmp_path, capsys):
    copy = tmp_path / "releases"
    shutil.copytree(release_dir.parent, copy)
    path = copy / "2024-02" / "database" / "news" / "month=2024-02.parquet"
    path.write_bytes(path.read_bytes()[:-1] + b"x")
    out = tmp_path / "repo"
    assert main(["export", "hf", str(out), "--from", str(copy)]) != 0
    assert "does not match its release's manifest" in capsys.readouterr().err and not out.exists()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["export", "hf", str(mine), "--from", str(release_dir)]) != 0
    assert "is not an earlier export" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep"


def test_export_hf_writes_a_hostile_manifest_s_counts_as_inert_text(release_dir, tmp_path, capsys):
    """A release comes from a store that may be hostile (docs/releases.md, "Threat model"), and its
    manifest's split counts are not among the fields check_manifest holds to a shape: numbers that
    are Markdown (an image that fetches from the reader's browser, a link, raw HTML, a new table
    row) reached the repository's README.md, the Hub's dataset page. The card writes a count only
    when it is a whole number, else a dash."""
    from tests.test_markdown import _COMMONMARK

    copy = tmp_path / "releases"
    shutil.copytree(release_dir.parent, copy)
    hostile = "![p](http://evil.invalid/p.png) <img src=http://evil.invalid/i> [x](http://evil.invalid/)\n| 9 | 9 |"
    manifest_path = copy / "2024-02" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["split"]["counts"] = {"queries": hostile, "sample": {"nested": hostile}}
    manifest_path.write_text(json.dumps(manifest))
    january = copy / "2024-01" / "manifest.json"
    manifest = json.loads(january.read_text())
    manifest["split"]["counts"] = hostile
    january.write_text(json.dumps(manifest))
    out = tmp_path / "repo"
    assert main(["export", "hf", str(out), "--from", str(copy)]) == 0, capsys.readouterr().err
    card = (out / "README.md").read_text()
    assert "evil.invalid" not in card
    addresses = [
        str(t.attrGet("src") or t.attrGet("href") or t.content)
        for token in _COMMONMARK.parse(card)
        for t in [token, *(token.children or [])]
        if t.type in ("image", "link_open", "html_inline", "html_block")
    ]
    assert all("evil" not in a for a in addresses), addresses
    assert "| 2024-02 | – | – |" in card and "| 2024-01 | – | – |" in card
