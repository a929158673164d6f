"""A day of articles end to end: quads -> selection -> fetch (real local news server) -> stored
HTML -> extraction workers -> OBELICS decision -> articles parquet, and the Dagster asset."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import dagster as dg
import polars as pl
import pytest

from pipeline.articles.day import ARTICLES_SCHEMA, abstract, build_articles, select_urls
from pipeline.articles.funnel import funnel_frame
from pipeline.articles.urls import normalize_url
from pipeline.config import Settings
from pipeline.events.quads import QUADS_SCHEMA
from pipeline.storage import DataLayout, atomic_write_parquet
from testbed.news import NewsServer

from .conftest import FIXTURES
from .settings_builder import make_settings
from .test_pictures_ops import metadata_png

DAY = date(2024, 1, 1)
HTML = FIXTURES / "html"


def _quads(rows: list[tuple[str, int, list[str]]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "date": DAY,
                "s": "USA",
                "r": r,
                "o": "CHN",
                "r1": r[:2],
                "daily_mentions": m,
                "n_events": 1,
                "urls": urls,
                "n_urls": len(urls),
                "web_mention_urls": 0,
            }
            for r, m, urls in rows
        ],
        schema=QUADS_SCHEMA,
    )


@pytest.fixture
def news():
    if not HTML.exists():
        pytest.skip("../shared/fixtures/html is absent (real news pages are served from there)")
    pages = {
        f"/{name}": (HTML / name).read_bytes() for name in ("reuters.com.parasite.html", "zeit.de.zugverkehr.html")
    }
    with NewsServer(pages) as server:
        yield server


def _settings(tmp_path, **overrides) -> Settings:
    return make_settings(
        data_dir=tmp_path, fetch_allow_loopback=True, fetch_backoff_base_s=0.01, extract_workers=1, **overrides
    )


def test_a_day_of_articles(tmp_path, news):
    settings = _settings(tmp_path)
    reuters, zeit, missing = (
        news.url_for(p) for p in ("/reuters.com.parasite.html", "/zeit.de.zugverkehr.html", "/hostile/404")
    )
    quiet = news.url_for("/quiet.html")
    atomic_write_parquet(
        _quads([("042", 80, [reuters, zeit]), ("043", 120, [missing, reuters]), ("010", 49, [quiet])]),
        DataLayout(tmp_path).daily_quads_path(DAY),
    )
    assert select_urls(DAY, settings.dataset, settings.articles) == sorted(
        normalize_url(u) for u in (reuters, zeit, missing)
    )

    first = build_articles(
        DAY, settings.dataset, settings.network, settings.articles, now=datetime(2024, 1, 2, tzinfo=UTC)
    )
    assert first.counts["selected"] == 3 and first.counts["stored"] == 2 and first.counts["failed_http_error"] == 1
    assert news.count("/quiet.html") == 0  # below the mention threshold: never fetched
    arts = first.articles.sort("url")
    assert arts.schema == ARTICLES_SCHEMA
    by_page = {r["url"].rsplit("/", 1)[1]: r for r in arts.iter_rows(named=True)}
    kept = by_page["reuters.com.parasite.html"]
    assert kept["kept"] and "Despite an unknown cast," in kept["text"] and "Factbox: Key winners" not in kept["text"]
    assert kept["abstract"].startswith(kept["title"]) and len(kept["abstract"]) > 50
    # Per-paragraph decisions are kept: each removed paragraph is counted under its filter.
    assert sum(json.loads(kept["paragraph_drops"]).values()) == kept["paragraphs_in"] - kept["paragraphs_kept"]
    german = by_page["zeit.de.zugverkehr.html"]
    assert not german["kept"] and german["failing_filter"] == "language_id" and german["lang"] == "de"
    assert first.counts["kept"] == 1 and first.counts["dropped_language_id"] == 1
    # The funnel picture's numbers are the day's counts, step by step.
    funnel = dict(funnel_frame(first.selected, first.articles, "mirai").select("stage", "documents").iter_rows())
    assert {stage: funnel[stage] for stage in ("selected", "stored", "extracted", "kept")} == {
        stage: first.counts[stage] for stage in ("selected", "stored", "extracted", "kept")
    }
    assert funnel["language_id"] == funnel["kept"] == funnel["extracted"] - 1
    on_disk = pl.read_parquet(DataLayout(tmp_path).articles_path(DAY))
    assert on_disk.equals(first.articles)

    # Fetched once ever: a re-run re-extracts from the stored HTML and fetches nothing.
    requests_before = news.count("/reuters.com.parasite.html")
    again = build_articles(
        DAY, settings.dataset, settings.network, settings.articles, now=datetime(2024, 1, 2, 0, 5, tzinfo=UTC)
    )
    assert again.counts["fetched_this_run"] == 0 and news.count("/reuters.com.parasite.html") == requests_before
    assert again.articles.equals(first.articles)


def test_obelics_profile_is_applied_when_chosen(tmp_path, news):
    settings = _settings(tmp_path, article_profile="obelics")
    atomic_write_parquet(
        _quads([("042", 80, [news.url_for("/zeit.de.zugverkehr.html")])]), DataLayout(tmp_path).daily_quads_path(DAY)
    )
    result = build_articles(DAY, settings.dataset, settings.network, settings.articles)
    assert result.articles["profile"].to_list() == ["obelics"]
    assert result.articles["kept"].to_list() == [False]


def test_domain_dedup_removes_boilerplate_repeated_across_a_sites_pages(tmp_path):
    shared = "Subscribe to our newsletter for the best of world news, delivered every single morning to you."
    stories = [
        [
            "Dock workers walked out at dawn, halting container traffic along the northern quay.",
            "Port officials said ferries would still sail, although freight could wait for days.",
            "Union leaders promised talks with the shipping firms before the weekend ends.",
        ],
        [
            "Wheat shipments rose sharply last month as buyers in Asia returned to the market.",
            "Traders expect prices to ease once the southern harvest reaches the coast in spring.",
            "The agriculture ministry will publish revised export quotas early next quarter.",
        ],
        [
            "Envoys from both capitals met near the frontier to discuss crossing rules for trucks.",
            "A joint statement mentioned patrols, customs software and a hotline for emergencies.",
            "Observers called the meeting cordial but noted that no treaty text was signed yet.",
        ],
    ]
    pages = {
        f"/p{i}.html": (
            f"<html><head><title>Story {i}</title></head><body><article><h1>Story {i}</h1>"
            + "".join(f"<p>{line}</p>" for line in lines)
            + f"<p>{shared}</p></article></body></html>"
        ).encode()
        for i, lines in enumerate(stories)
    }
    with NewsServer(pages) as server:
        urls = [server.url_for(p) for p in pages]
        atomic_write_parquet(_quads([("042", 80, urls)]), DataLayout(tmp_path).daily_quads_path(DAY))
        obelics = _settings(tmp_path, article_profile="obelics")
        plain = build_articles(DAY, obelics.dataset, obelics.network, obelics.articles)
        with_dedup = _settings(tmp_path, article_profile="obelics", article_domain_dedup=True)
        deduped = build_articles(DAY, with_dedup.dataset, with_dedup.network, with_dedup.articles)
    assert plain.articles["kept"].to_list() == [True, True, True]
    assert all(shared in t for t in plain.articles["text"])
    assert not any(shared in t for t in deduped.articles["text"])
    assert deduped.articles["kept"].to_list() == [True, True, True]
    assert [json.loads(d)["domain_dedup"] for d in deduped.articles["paragraph_drops"]] == [1, 1, 1]
    with pytest.raises(ValueError, match="obelics profile"):
        no_obelics = _settings(tmp_path, article_domain_dedup=True)
        build_articles(DAY, no_obelics.dataset, no_obelics.network, no_obelics.articles)


def test_abstract_follows_mirai():
    assert abstract("Title", "Short.\nSecond paragraph is here and quite long indeed.\nThird.") == (
        "Title\nShort.\nSecond paragraph is here and quite long indeed."
    )
    assert abstract(None, "") == ""


def test_abstract_does_not_repeat_a_title_the_text_starts_with():
    body = "Officials met on Monday to discuss the border.\nTalks continue."
    assert abstract("Border talks resume", "Border talks resume\n" + body) == (
        "Border talks resume\nOfficials met on Monday to discuss the border."
    )
    # Up to case, spacing and edge punctuation; a different first line is kept.
    assert abstract("Border talks resume", "  border talks  RESUME.\n" + body).count("order talks") == 1
    assert abstract("Border talks", "Border talks resume today\n" + body).startswith(
        "Border talks\nBorder talks resume"
    )


def test_abstracts_of_the_demo_sites_and_real_pages_say_the_title_once():
    """The demo's news pages put the headline in the article (trafilatura keeps it as the text's
    first line: 5,131 of 6,382 demo abstracts were "Title\nTitle..."); real pages (the fixtures)
    must come out the same whether or not their text repeats the headline."""
    from pipeline.articles.extract import extract
    from testbed.generate import news_sites
    from testbed.news import site_page

    pages = [site_page("www.dailyherald.example", f"/world/2024/01/0{i}/story-{i}", news_sites()) for i in range(1, 8)]
    demo = [extract(p.body, "http://www.dailyherald.example/") for p in pages if p.status == 200]
    demo = [e for e in demo if e.error is None]
    assert len(demo) >= 3
    assert all(e.text.split("\n")[0] == e.title for e in demo)  # the case this guards against
    for e in demo:
        lines = abstract(e.title, e.text).split("\n")
        assert lines[0] == e.title and e.title not in lines[1:]

    html = FIXTURES / "html"
    if not html.is_dir():
        pytest.skip("../shared/fixtures/html is absent (the real news pages live next to the project)")
    real = [(f.name, extract(f.read_bytes(), f"https://{f.stem}/")) for f in sorted(html.glob("*.html"))]
    real = [(name, e) for name, e in real if e.title and e.text]
    assert len(real) >= 10
    for name, e in real:
        once = abstract(e.title, e.text)
        assert once.split("\n")[0] == e.title and e.title not in once.split("\n")[1:], name
        assert abstract(e.title, f"{e.title}\n{e.text}") == once, name


def test_articles_asset_records_the_fetch_ledger(tmp_path, news):
    from assets.articles import articles
    from assets.resources import resources_for

    atomic_write_parquet(
        _quads([("042", 80, [news.url_for("/reuters.com.parasite.html")])]), DataLayout(tmp_path).daily_quads_path(DAY)
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [articles],
            partition_key=DAY.isoformat(),
            instance=instance,
            resources=resources_for(
                make_settings(data_dir=str(tmp_path), fetch_allow_loopback=True, extract_workers=1)
            ),
        )
        assert result.success
        events = {m.asset_key.to_user_string(): m.metadata for m in result.asset_materializations_for_node("articles")}
        assert events["articles"]["kept"].value == 1 and events["articles"]["selected"].value == 1
        # Ten stages of the mirai profile's funnel, 0.4 inch each (tests/test_pictures_ops.py).
        assert metadata_png(events["articles"]["obelics_funnel"].value).shape == (540, 1000, 4)
        # The ledger is its own asset: every articles run records it, with its counts.
        ledger_event = instance.get_latest_materialization_event(dg.AssetKey("fetch_ledger"))
        assert ledger_event.asset_materialization.metadata["urls_fetched"].value == 1
