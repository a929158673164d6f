"""The Dagster UI, for real: the webserver and the daemon on a persistent instance holding a
materialised month, checked through GraphQL and looked at in headless Chromium (Debian's chromium
and chromium-driver packages) driven by Selenium: pages are waited on until the UI has rendered
what a maintainer would look for, then read from the DOM and photographed."""

from __future__ import annotations

import json
import os
import time
from datetime import date

import dagster as dg
import polars as pl
import pytest
import requests

from assets.articles import articles, fetch_ledger
from assets.database import event_database
from assets.evaluations import agent_partitions, evaluation, leaderboard
from assets.ingest import gdelt_files
from assets.metadata import COLUMN_SCHEMA, column_schema
from assets.resources import resources_for
from assets.splits import test_split as split_asset
from pipeline.evaluation.board import summary
from pipeline.evaluation.board_files import BOARD_FILE
from pipeline.events.normalize import EVENTS_COLUMNS
from pipeline.events.quads import QUADS_SCHEMA
from pipeline.storage import DataLayout, atomic_write_parquet
from quality.split_checks import split_leakage_audit
from testbed.dagster_services import graphql, running_daemon, running_webserver
from testbed.generate import news_sites
from testbed.news import NewsServer
from testbed.serve import MirrorServer

from .chromium import headless_chromium, needs_chromium
from .conftest import MIRROR_DAY
from .month_builder import Quad, write_month
from .settings_builder import make_settings
from .test_column_schemas import SCHEMA_AT_MATERIALISATION, WRITTEN_WITH
from .test_splits import QUADS

# The UI renders after its GraphQL answers arrive; on a loaded 2-core CI machine that takes seconds.
RENDER_TIMEOUT_S = 90
EVERY_ASSET = {
    "gdelt_files",
    "gdelt_events",
    "gdelt_mentions",
    "events",
    "unmapped_codes",
    "daily_quads",
    "articles",
    "fetch_ledger",
    "event_database",
    "test_split",
    "release",
    "evaluation",
    "leaderboard",
}

# The articles day's quad: its URLs on the generated news sites (testbed/news.py site_page decides
# each page by its URL): four whole English articles, a paywall teaser too short to extract, a
# German article the language filter drops, and a page that is gone (404).
ARTICLE_URLS = [
    *(f"http://www.worldwire.example/world/2024/01/01/story-{i}" for i in (0, 1, 2, 3, 5, 42)),
    "http://www.zeitung-heute.example/world/2024/01/01/story-0",
]
# The registry the fixture evaluates and the webserver loads: one baseline (no model needed) at
# distance 1 only, as its history starts with the split's month (February's first query, on the
# 3rd, would need January's events at distance 7, and agents.yaml's 90 days back to November).
AGENTS_YAML = "agents:\n  - {name: recurrency, kind: baseline, baseline: recurrency, distances: [1]}\n"
EVALUATED = dg.MultiPartitionKey({"month": "2024-02-01", "agent": "recurrency"})
# Before the split's (Feb 29, UKR, RUS) query, below test grade (100 mentions) but in the event
# database: recurrency predicts 190, one of that query's two relations, so its run scores above 0
# and is ranked (an all-zero run is listed unranked).
HISTORY = [Quad(date(2024, 2, 20), "UKR", "190", "RUS", 60)]

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def ui(tmp_path_factory, generated_day):
    """A materialised month on a persistent SQLite instance, with the webserver and the daemon;
    a baseline's evaluation of the month's split and the leaderboard built from it (their scores
    and board tables); a day of GDELT files from the generated mirror (its slot ledger's picture);
    and that day's articles fetched from the generated news sites (its OBELICS funnel)."""
    root = tmp_path_factory.mktemp("ui")
    home, data, agents_file = root / "dagster_home", root / "data", root / "agents.yaml"
    home.mkdir()
    agents_file.write_text(AGENTS_YAML)
    # The onboarding dialog would cover the page in the screenshot; telemetry needs the network.
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    write_month(make_settings(data_dir=data), date(2024, 2, 1), [*QUADS, *HISTORY])
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = dg.materialize(
            [event_database, split_asset, split_leakage_audit],
            partition_key="2024-02-01",
            instance=instance,
            resources=resources_for(make_settings(data_dir=str(data))),
        )
        assert result.success
        registered = resources_for(make_settings(data_dir=str(data), agents_file=str(agents_file)))
        instance.add_dynamic_partitions(agent_partitions.name, [EVALUATED.keys_by_dimension["agent"]])
        scored = dg.materialize([evaluation], partition_key=EVALUATED, instance=instance, resources=registered)
        assert scored.success
        assert dg.materialize([leaderboard], instance=instance, resources=registered).success
        with MirrorServer(generated_day) as mirror:
            day = dg.materialize(
                [gdelt_files],
                partition_key=MIRROR_DAY.isoformat(),
                instance=instance,
                resources=resources_for(make_settings(data_dir=str(data), gdelt_base_url=mirror.base_url)),
            )
        assert day.success
        # The day's quads as daily_quads writes them: one quad over the mention threshold.
        quad = {"date": MIRROR_DAY, "s": "USA", "r": "042", "o": "CHN", "r1": "04", "daily_mentions": 80}
        quad |= {"n_events": 1, "urls": ARTICLE_URLS, "n_urls": len(ARTICLE_URLS), "web_mention_urls": 0}
        atomic_write_parquet(pl.DataFrame([quad], schema=QUADS_SCHEMA), DataLayout(data).daily_quads_path(MIRROR_DAY))
        with NewsServer(sites=news_sites()) as news:
            fetched = dg.materialize(
                [articles, fetch_ledger],
                partition_key=MIRROR_DAY.isoformat(),
                instance=instance,
                resources=resources_for(
                    make_settings(
                        data_dir=str(data),
                        fetch_allow_loopback=True,
                        fetch_host_map=f"*.example=127.0.0.1:{news.port}",
                        extract_workers=1,
                    )
                ),
            )
        assert fetched.success
        # Fetched from the news server: the funnel draws four kept of seven selected.
        [day_articles] = [m for m in fetched.asset_materializations_for_node("articles") if m.asset_key == articles.key]
        counts = day_articles.metadata
        assert (counts["selected"].value, counts["stored"].value, counts["kept"].value) == (7, 6, 4)
    env = {**os.environ, "DAGSTER_HOME": str(home), "MIRAI_DATA_DIR": str(data), "MIRAI_AGENTS_FILE": str(agents_file)}
    with running_webserver(env) as url, running_daemon(env) as daemon:
        yield {"url": url, "root": root, "daemon": daemon}


def _repositories(url: str) -> list[dict]:
    query = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
        schedules { name cronSchedule } sensors { name }
        assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name } } } } } } } }"""
    try:
        return graphql(url, query)["repositoriesOrError"]["nodes"]
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
    assert {
        "events_valid",
        "daily_quads_valid",
        "articles_valid",
        "split_leakage_audit",
        "gdelt_files_all_green",
    } <= checks


def test_a_materialisation_shows_its_metadata(ui):
    query = """{ assetOrError(assetKey: {path: ["test_split"]}) { ... on Asset {
        assetMaterializations(limit: 1) { partition metadataEntries { label
          ... on IntMetadataEntry { intValue } ... on MarkdownMetadataEntry { mdStr } } } } } }"""
    [materialisation] = graphql(ui["url"], query)["assetOrError"]["assetMaterializations"]
    assert materialisation["partition"] == "2024-02-01"
    entries = {e["label"]: e for e in materialisation["metadataEntries"]}
    assert entries["dagster/row_count"]["intValue"] == 2
    assert entries["relation_distribution.png"]["mdStr"].startswith("![relation_distribution](data:image/png;base64,")


def test_the_daemon_is_healthy(ui):
    query = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"
    deadline = time.monotonic() + 120
    while True:
        statuses = graphql(ui["url"], query)["instance"]["daemonHealth"]["allDaemonStatuses"]
        required = {s["daemonType"]: s["healthy"] for s in statuses if s["required"]}
        if required and all(required.values()):
            break
        assert ui["daemon"].poll() is None, ui["daemon"].stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"daemons not healthy: {required}"
        time.sleep(2)
    assert {"SCHEDULER", "SENSOR"} <= set(required)


@pytest.fixture(scope="module")
def browser(ui):
    """One headless Chromium for the module."""
    with headless_chromium(ui["root"]) as driver:
        driver.set_window_size(1600, 1000)
        yield driver


def _open_and_wait_for(driver, url: str, texts: list[str]) -> str:
    """Load a page and wait until every text is shown; returns the page's visible text."""
    driver.get(url)
    return _wait_for(driver, texts)


def _wait_for(driver, texts: list[str]) -> str:
    """Wait until the current page shows every text; returns the page's visible text."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, RENDER_TIMEOUT_S, poll_frequency=0.5).until(
            lambda d: all(t in _visible_text(d) for t in texts)
        )
    except TimeoutException:
        shown = _visible_text(driver)
        pytest.fail(
            f"{driver.current_url} never showed {[t for t in texts if t not in shown]}; it shows: {shown[:1500]!r}"
        )
    return _visible_text(driver)


def _visible_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _wait_until_still(driver) -> None:
    """Wait for the page's animations (a dialog fading in, a group opening) to finish, so a
    screenshot shows what the user ends up seeing."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, RENDER_TIMEOUT_S).until(
        lambda d: d.execute_script("return document.getAnimations().length") == 0
    )


def test_asset_graph_renders_every_group_and_a_group_opens_on_click(ui, browser):
    from matplotlib import image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    groups = ["ingestion", "events", "articles", "splits", "releases", "evaluation"]
    _open_and_wait_for(browser, f"{ui['url']}/asset-groups", groups)
    # The graph opens with its groups collapsed; a click on the splits group's node (the last of
    # the elements named so: the sidebar lists the groups first) shows its assets in the graph.
    browser.find_elements(By.XPATH, "//*[normalize-space(text())='splits']")[-1].click()
    WebDriverWait(browser, RENDER_TIMEOUT_S).until(
        lambda d: all(name in _visible_text(d).split("\n") for name in ("event_database", "test_split"))
    )
    _wait_until_still(browser)
    shot = ui["root"] / "asset_graph.png"  # kept with the test run: open it to see what the UI showed
    assert browser.save_screenshot(str(shot))
    pixels = image.imread(shot)
    width, height = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    assert pixels.shape[:2] == (height, width) and width >= 1500 and height >= 800
    # A blank or error page is (nearly) one colour; the graph page has text, boxes and edges.
    assert pixels[..., :3].std() > 0.05
    # The catalog renders only the rows in view: a window tall enough to hold every asset's row.
    size = browser.get_window_size()
    browser.set_window_size(size["width"], 4000)
    try:
        catalog = _open_and_wait_for(
            browser, f"{ui['url']}/assets", ["gdelt_files", "daily_quads", "test_split", "leaderboard"]
        )
    finally:
        browser.set_window_size(size["width"], size["height"])
    assert [name for name in sorted(EVERY_ASSET) if name not in catalog] == []


def test_asset_page_shows_the_latest_materialisation_its_figure_and_its_check(ui, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = _open_and_wait_for(
        browser,
        f"{ui['url']}/assets/test_split",
        ["Latest materialization", "2024-02-01", "Row count", "relation_distribution.png"],
    )
    assert "Row count\n2\n" in page  # the split's two queries
    # The card's figure is Markdown metadata: the maintainer opens it and the UI renders the PNG.
    row = browser.find_element(By.XPATH, "//tr[.//*[normalize-space(text())='relation_distribution.png']]")
    row.find_element(By.XPATH, ".//*[contains(text(), 'Show Markdown')]").click()
    figure = WebDriverWait(browser, RENDER_TIMEOUT_S).until(
        lambda d: next(
            (
                img
                for img in d.find_elements(By.TAG_NAME, "img")
                if (img.get_attribute("src") or "").startswith("data:image/png;base64,")
                and img.get_property("naturalWidth")
            ),
            None,
        )
    )
    assert figure.get_property("naturalWidth") > 300 and figure.is_displayed()
    _wait_until_still(browser)  # the dialog fades in
    browser.save_screenshot(str(ui["root"] / "relation_distribution_in_ui.png"))

    # The blocking leakage audit, as the maintainer finds it under the asset's Checks tab: the tab
    # opens on the first check by name (column_schema_change), so the maintainer picks the audit.
    _open_and_wait_for(browser, f"{ui['url']}/assets/test_split?view=checks", ["split_leakage_audit"])
    browser.find_element(By.XPATH, "//*[normalize-space(text())='split_leakage_audit']").click()
    checks = _wait_for(browser, ["This is a blocking asset check.", "Evaluation result\nPassed"])
    assert "Evaluation result\nPassed" in checks and "violations 0" in checks and "query dates audited 2" in checks


def _shown_png(browser, label: str):
    """Open the Markdown metadata row ``label`` of the asset page and wait for its inline PNG."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    row = browser.find_element(By.XPATH, f"//tr[.//*[normalize-space(text())='{label}']]")
    row.find_element(By.XPATH, ".//*[contains(text(), 'Show Markdown')]").click()
    return WebDriverWait(browser, RENDER_TIMEOUT_S).until(
        lambda d: next(
            (
                img
                for img in d.find_elements(By.TAG_NAME, "img")
                if (img.get_attribute("src") or "").startswith("data:image/png;base64,")
                and img.get_property("naturalWidth")
                and img.is_displayed()
            ),
            None,
        )
    )


@pytest.mark.parametrize(
    ("asset", "partition", "label", "width"),
    [
        ("gdelt_files", MIRROR_DAY.isoformat(), "ledger_month", 1200),
        ("test_split", "2024-02-01", "queries_by_month.png", 1200),
        ("articles", MIRROR_DAY.isoformat(), "obelics_funnel", 1000),
    ],
)
def test_the_pictures_open_from_the_asset_page(ui, browser, asset, partition, label, width):
    """The operator's pictures (the month's slot ledger, the split's months, the day's OBELICS
    funnel) render in the UI from the materialisation's metadata, at their drawn size;
    photographed for a look."""
    _open_and_wait_for(browser, f"{ui['url']}/assets/{asset}", ["Latest materialization", partition, label])
    picture = _shown_png(browser, label)
    assert picture.get_property("naturalWidth") == width
    _wait_until_still(browser)
    browser.save_screenshot(str(ui["root"] / f"{label.removesuffix('.png')}_in_ui.png"))


def test_every_parquet_asset_is_served_with_its_columns(ui):
    """The webserver serves each parquet asset's ``dagster/column_schema`` (the asset page's
    Columns), column by column as the asset's code writes and describes it."""
    query = """{ assetNodes { assetKey { path } kinds metadataEntries { label
        ... on TableSchemaMetadataEntry { schema { columns { name type description } } } } } }"""
    nodes = graphql(ui["url"], query)["assetNodes"]
    parquet = {"/".join(n["assetKey"]["path"]) for n in nodes if "parquet" in n["kinds"]}
    served = {
        "/".join(n["assetKey"]["path"]): [(c["name"], c["type"], c["description"]) for c in e["schema"]["columns"]]
        for n in nodes
        for e in n["metadataEntries"]
        if e["label"] == COLUMN_SCHEMA
    }
    assert {"events", "daily_quads", "articles", "fetch_ledger", "test_split", "leaderboard"} <= parquet
    assert sorted(parquet - SCHEMA_AT_MATERIALISATION - set(served)) == []
    written = {
        key: [(c.name, c.type, c.description) for c in column_schema(WRITTEN_WITH[key])[COLUMN_SCHEMA].columns]
        for key in served
    }
    assert served == written


def _table_rows(driver, xpath: str) -> list[list[str]]:
    """The visible text of each cell of the first table at ``xpath``, row by row (the header
    first); none while it is not there. Found and read in one script: React may replace it."""
    return driver.execute_script(
        """const table = document.evaluate(arguments[0], document, null,
            XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
        return table ? [...table.rows].map(r => [...r.cells].map(c => c.innerText.trim())) : [];""",
        xpath,
    )


def _scroll_to(driver, xpath: str, block: str) -> str:
    """Scroll the first element at ``xpath`` into view (``block``: start, center) and return its
    visible text; found and used in one script, like _table_rows."""
    return driver.execute_script(
        """const element = document.evaluate(arguments[0], document, null,
            XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
        element.scrollIntoView({block: arguments[1]});
        return element.innerText;""",
        xpath,
        block,
    )


def test_the_columns_of_a_parquet_asset_show_on_its_page(ui, browser):
    """The events asset's page lists its columns with their types and descriptions (from its
    definition: the fixture never materialises events), as a table; photographed for a look."""
    from selenium.webdriver.support.ui import WebDriverWait

    columns = [(c.name, c.type, c.description) for c in column_schema(EVENTS_COLUMNS)[COLUMN_SCHEMA].columns]
    _open_and_wait_for(browser, f"{ui['url']}/assets/events", ["Columns", "Column name", columns[-1][0]])
    table = "//table[.//td[normalize-space(text())='Column name']]"
    # The rows render after the header: wait until every column has its row.
    WebDriverWait(browser, RENDER_TIMEOUT_S).until(lambda d: len(_table_rows(d, table)) == 1 + len(columns))
    header, *rows = _table_rows(browser, table)
    assert header == ["Column name", "Type", "Description"]
    assert [tuple(row) for row in rows] == columns
    _scroll_to(browser, "//span[normalize-space(text())='Columns']", "start")
    _wait_until_still(browser)
    browser.save_screenshot(str(ui["root"] / "events_columns_in_ui.png"))


def _latest_table(url: str, asset: str, label: str) -> tuple[list[str], list[dict]]:
    """The table metadata ``label`` of the asset's latest materialisation as GraphQL serves it to
    the UI: its column names and its records, decoded."""
    query = """query ($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
        assetMaterializations(limit: 1) { metadataEntries { label
          ... on TableMetadataEntry { table { records schema { columns { name } } } } } } } } }"""
    [materialisation] = graphql(url, query, {"path": [asset]})["assetOrError"]["assetMaterializations"]
    [table] = [e["table"] for e in materialisation["metadataEntries"] if e["label"] == label]
    return [c["name"] for c in table["schema"]["columns"]], [json.loads(r) for r in table["records"]]


def _cell_text(value: object) -> str:
    """A record's value as the UI's table cell shows it, JavaScript's ``value?.toString()``
    (TableMetadataEntryComponent in Dagster's ui-core MetadataEntry.tsx): null is empty, true is
    "true" and 1.0 is "1"."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _shown_table(ui, browser, asset: str, label: str, texts: list[str], shot: str) -> list[list[str]]:
    """The metadata entry ``label`` on the asset's page, once it shows ``texts``: an HTML table in
    the metadata, not Markdown behind a button. Its cells' text, row by row (the header first);
    the entry scrolled into view and photographed as ``shot`` under the fixture's root."""
    _open_and_wait_for(browser, f"{ui['url']}/assets/{asset}", ["Latest materialization", label, *texts])
    entry = f"//tr[.//*[normalize-space(text())='{label}']]"
    assert "Show Markdown" not in _scroll_to(browser, entry, "center")
    rows = _table_rows(browser, f"{entry}//table")
    _wait_until_still(browser)
    browser.save_screenshot(str(ui["root"] / shot))
    return rows


def test_the_ledger_problems_show_as_a_table_on_the_asset_page(ui, browser):
    """gdelt_files' ``problems`` (a table metadata value: the day's slots that are not green) is
    rendered as an HTML table, header and rows as recorded; photographed."""
    columns, records = _latest_table(ui["url"], "gdelt_files", "problems")
    # The generated day's feed outage: one slot missing from GDELT's index, both of its files.
    assert [(r["kind"], r["status"]) for r in records] == [("export", "missing"), ("mentions", "missing")]
    assert columns == ["slot", "kind", "status", "attempts", "http_status", "last_error"]

    shown = _shown_table(
        ui, browser, "gdelt_files", "problems", ["not listed in the GDELT index"], "ledger_problems_in_ui.png"
    )
    assert shown == [columns, *([_cell_text(r[name]) for name in columns] for r in records)]


def test_an_evaluation_shows_its_scores_as_a_table(ui, browser):
    """The baseline's evaluation ``scores`` (one row per distance: its headline metrics) is
    rendered as an HTML table on the evaluation page, header and rows as recorded; photographed."""
    columns, records = _latest_table(ui["url"], "evaluation", "scores")
    assert columns == [
        *("distance", "n", "rounds", "L2 F1", "L1 F1", "L2 precision", "L2 recall", "quad KL", "MRR"),
        *("Max@K L2 F1", "repeated L2 F1", "avg steps"),
    ]
    # The split's two queries, once each (a baseline is deterministic), at the registry's distance.
    assert [(r["distance"], r["n"], r["rounds"]) for r in records] == [(1, 2, 1)]

    shown = _shown_table(ui, browser, "evaluation", "scores", ["quad KL", "avg steps"], "evaluation_scores_in_ui.png")
    assert shown == [columns, *([_cell_text(r[name]) for name in columns] for r in records)]


def test_the_leaderboard_shows_as_a_table(ui, browser):
    """The ``leaderboard`` (the board's headline columns, one row per ranked run) is rendered as
    an HTML table on the leaderboard page, header and rows as its parquet file holds them;
    photographed."""
    columns, records = _latest_table(ui["url"], "leaderboard", "leaderboard")
    board = summary(pl.read_parquet(DataLayout(ui["root"] / "data").root / "evaluations" / BOARD_FILE))
    assert columns == board.columns
    assert [(r["rank"], r["agent"], r["distance"]) for r in records] == [(1, "recurrency", 1)]
    assert [[_cell_text(r[name]) for name in columns] for r in records] == [
        [_cell_text(value) for value in row] for row in board.rows()
    ]

    shown = _shown_table(
        ui, browser, "leaderboard", "leaderboard", ["refusals", "level2_f1_ci95_low"], "leaderboard_in_ui.png"
    )
    assert shown == [columns, *([_cell_text(r[name]) for name in columns] for r in records)]
