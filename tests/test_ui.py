"""The Dagster UI, for real: the webserver and the daemon on a persistent instance holding a
materialised month, checked through GraphQL and looked at in headless Chromium (Debian's package,
driven through its own --screenshot / --dump-dom switches: no driver needed)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import dagster as dg
import pytest
import requests

from assets.database import event_database
from assets.resources import MiraiSettings
from assets.splits import test_split as split_asset
from pipeline.config import Settings
from quality.split_checks import split_leakage_audit

from .conftest import ROOT
from .month_builder import write_month
from .test_splits import QUADS

BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a sandboxed root CI needs; background networking off because the machine's closed
# network refuses Chromium's own update and metrics connections.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1600,1000", "--virtual-time-budget=20000",
]
EVERY_ASSET = {
    "gdelt_files", "gdelt_events", "gdelt_mentions", "events", "unmapped_codes", "daily_quads", "articles",
    "fetch_ledger", "event_database", "test_split", "release", "evaluation", "leaderboard",
}

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (make setup installs it when run as root with apt-get)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A materialised month on a persistent SQLite instance, with the webserver and the daemon."""
    root = tmp_path_factory.mktemp("ui")
    home, data = root / "dagster_home", root / "data"
    home.mkdir()
    # The onboarding dialog would cover the page in the screenshot; telemetry needs the network.
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    write_month(Settings(data_dir=data), date(2024, 2, 1), QUADS)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = dg.materialize(
            [event_database, split_asset, split_leakage_audit], partition_key="2024-02-01", instance=instance,
            resources={"mirai": MiraiSettings(data_dir=str(data))},
        )
        assert result.success
    env = {**os.environ, "DAGSTER_HOME": str(home), "MIRAI_DATA_DIR": str(data)}
    port = _free_port()
    webserver = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _repositories(url):
            assert webserver.poll() is None, webserver.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the webserver did not come up"
            time.sleep(1)
        yield {"url": url, "root": root, "daemon": daemon}
    finally:
        for process in (webserver, daemon):
            process.terminate()
        for process in (webserver, daemon):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _graphql(url: str, query: str) -> dict:
    response = requests.post(f"{url}/graphql", json={"query": query}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def _repositories(url: str) -> list[dict]:
    query = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
        schedules { name cronSchedule } sensors { name }
        assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name } } } } } } } }"""
    try:
        return _graphql(url, query)["repositoriesOrError"]["nodes"]
    except (requests.RequestException, KeyError, TypeError):
        return []


def test_graphql_lists_the_graph_schedules_sensors_and_checks(ui):
    [repo] = _repositories(ui["url"])
    assets = {"/".join(node["assetKey"]["path"]) for node in repo["assetNodes"]}
    assert EVERY_ASSET <= assets
    schedules = {s["name"]: s["cronSchedule"] for s in repo["schedules"]}
    assert schedules["gdelt_every_15_minutes"] == "5,20,35,50 * * * *"
    assert {"articles_hourly", "monthly_release_daily"} <= set(schedules)
    assert {"evaluation_sensor", "alert_on_run_failure", "gdelt_freshness"} <= {s["name"] for s in repo["sensors"]}
    checks = {c["name"] for node in repo["assetNodes"] for c in (node["assetChecksOrError"].get("checks") or [])}
    assert {"events_valid", "daily_quads_valid", "articles_valid", "split_leakage_audit", "gdelt_files_all_green"} <= checks


def test_a_materialisation_shows_its_metadata(ui):
    query = """{ assetOrError(assetKey: {path: ["test_split"]}) { ... on Asset {
        assetMaterializations(limit: 1) { partition metadataEntries { label
          ... on IntMetadataEntry { intValue } ... on MarkdownMetadataEntry { mdStr } } } } } }"""
    [materialisation] = _graphql(ui["url"], query)["assetOrError"]["assetMaterializations"]
    assert materialisation["partition"] == "2024-02-01"
    entries = {e["label"]: e for e in materialisation["metadataEntries"]}
    assert entries["dagster/row_count"]["intValue"] == 2
    assert entries["relation_distribution.png"]["mdStr"].startswith("![relation_distribution](data:image/png;base64,")


def test_the_daemon_is_healthy(ui):
    query = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"
    deadline = time.monotonic() + 120
    while True:
        statuses = _graphql(ui["url"], query)["instance"]["daemonHealth"]["allDaemonStatuses"]
        required = {s["daemonType"]: s["healthy"] for s in statuses if s["required"]}
        if required and all(required.values()):
            break
        assert ui["daemon"].poll() is None, ui["daemon"].stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"daemons not healthy: {required}"
        time.sleep(2)
    assert {"SCHEDULER", "SENSOR"} <= set(required)


def _chromium(ui, *args: str) -> subprocess.CompletedProcess:
    profile = ui["root"] / f"chromium-{time.monotonic_ns()}"
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180)


def test_asset_graph_screenshot_and_catalog_dom(ui):
    from matplotlib import image

    shot = ui["root"] / "asset_graph.png"
    done = _chromium(ui, f"--screenshot={shot}", f"{ui['url']}/asset-groups")
    assert shot.exists(), done.stderr[-2000:]
    pixels = image.imread(shot)
    assert pixels.shape[:2] == (1000, 1600)
    # A blank or error page is (nearly) one colour; the graph page has text, boxes and edges.
    assert pixels[..., :3].std() > 0.05
    dom = _chromium(ui, "--dump-dom", f"{ui['url']}/asset-groups").stdout
    assert all(group in dom for group in ("ingestion", "events", "articles", "splits", "releases", "evaluation"))
    catalog = _chromium(ui, "--dump-dom", f"{ui['url']}/assets").stdout
    assert all(name in catalog for name in ("gdelt_files", "daily_quads", "test_split", "leaderboard"))
