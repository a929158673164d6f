"""The articles suite (quality/suites.py ``validate_articles``) and its asset check
(quality/event_checks.py ``articles_valid``).

The suite passes on a hand-built day of articles and on the pipeline's own output (real news pages
through the local news server), and fails on each kind of bad row with the failing expectation and
its column named. The Dagster tests run the articles asset with its check and show the check's
counts, and that a failed check is an ERROR that blocks nothing.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime

import dagster as dg
import polars as pl
import pytest

from assets.resources import resources_for
from pipeline.articles.day import ARTICLES_SCHEMA
from pipeline.storage import DataLayout, atomic_write_parquet, write_sealed_parquet
from quality.suites import SCHEMA_CHECK, article_counts, filter_label, validate_articles

from .conftest import FIXTURES
from .gx_helpers import assert_fails_only, failure, set_row
from .settings_builder import make_settings
from .table_metadata import table_text

DAY = date(2024, 1, 1)
FETCHED_AT = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)

UNIQUE = "expect_column_values_to_be_unique"
NOT_NULL = "expect_column_values_to_not_be_null"
IS_NULL = "expect_column_values_to_be_null"
IN_SET = "expect_column_values_to_be_in_set"
REGEX = "expect_column_values_to_match_regex"
BETWEEN = "expect_column_values_to_be_between"
COLUMN_LIST = "expect_table_columns_to_match_ordered_list"


# --- builders -------------------------------------------------------------------------------


def _row(n: int, *, kept: bool, failing_filter: str | None = None, lang: str = "en", profile: str = "mirai") -> dict:
    url = f"https://news.example/2024/01/01/story-{n}"
    title = f"Story {n}: ministers meet over the border dispute"
    text = (
        (
            f"Ministers from both countries met on Monday to discuss story {n}.\n"
            "Officials said the talks would continue next week in the capital."
        )
        if kept
        else ""
    )
    return {
        "url": url,
        "url_md5": hashlib.md5(url.encode()).hexdigest(),
        "day": DAY,
        "fetched_at": FETCHED_AT,
        "http_status": 200,
        "final_url": url,
        "title": title,
        "text": text,
        "abstract": f"{title}\n{text.split(chr(10))[0]}" if kept else None,
        "date_published": "2024-01-01",
        "lang": lang,
        "lang_score": 0.97,
        "n_words": 22 if kept else 180,
        "extraction_error": failing_filter.split(":", 1)[1]
        if failing_filter and failing_filter.startswith("extraction:")
        else None,
        "kept": kept,
        "failing_filter": failing_filter,
        "failing_value": None if kept or (failing_filter or "").startswith("extraction:") else 0.41,
        "paragraphs_in": 2 if kept else 9,
        "paragraphs_kept": 2 if kept else 3,
        "profile": profile,
    }


def good_articles() -> pl.DataFrame:
    """Four kept articles and three dropped ones (German, a failed extraction, too few words)."""
    rows = [_row(n, kept=True) for n in range(4)]
    rows += [
        _row(4, kept=False, failing_filter="language_id", lang="de"),
        _row(5, kept=False, failing_filter="extraction:failed: ValueError: bad page"),
        _row(6, kept=False, failing_filter="words"),
    ]
    return pl.DataFrame(rows, schema=ARTICLES_SCHEMA)


# --- the suite ------------------------------------------------------------------------------


def test_articles_pass_on_a_hand_built_day():
    res = validate_articles(good_articles())
    assert res.passed, res.failures
    assert res.statistics["unsuccessful_expectations"] == 0 and res.statistics["schema_problems"] == 0
    assert {k: res.statistics[k] for k in ("rows", "kept", "dropped")} == {"rows": 7, "kept": 4, "dropped": 3}
    assert res.statistics["dropped_language_id"] == 1 and res.statistics["dropped_words"] == 1
    # An extraction failure counts under its kind, without the per-page exception text.
    assert res.statistics["dropped_extraction:failed"] == 1


def test_articles_pass_with_the_obelics_profile_and_an_all_dropped_day():
    day = good_articles().with_columns(profile=pl.lit("obelics"))
    assert validate_articles(day).passed
    dropped = good_articles().filter(~pl.col("kept"))
    res = validate_articles(dropped)
    assert res.passed, res.failures
    assert res.statistics["kept"] == 0 and res.statistics["dropped"] == 3


def test_duplicate_url_fails():
    bad = set_row(good_articles(), 1, url=good_articles()["url"][0])  # same url, its own md5
    f = assert_fails_only(validate_articles(bad), UNIQUE, "url")
    assert f["unexpected_count"] == 2 and f["unexpected_values"] == [good_articles()["url"][0]] * 2


def test_duplicate_row_fails_on_url_and_url_md5():
    articles = good_articles()
    res = validate_articles(pl.concat([articles, articles.slice(2, 1)]))
    assert not res.passed
    assert {(f["expectation"], f["column"]) for f in res.failures} == {(UNIQUE, "url"), (UNIQUE, "url_md5")}


def test_null_url_fails():
    f = assert_fails_only(validate_articles(set_row(good_articles(), 3, url=None)), NOT_NULL, "url")
    assert f["rule"] == "articles: url present"


@pytest.mark.parametrize("md5", ["0" * 31, "0" * 33, "A" * 32, "g" * 32])
def test_url_md5_not_32_lowercase_hex_fails(md5):
    f = assert_fails_only(validate_articles(set_row(good_articles(), 0, url_md5=md5)), REGEX, "url_md5")
    assert f["unexpected_values"] == [md5]


def test_kept_row_with_empty_text_fails():
    f = assert_fails_only(validate_articles(set_row(good_articles(), 2, text="")), REGEX, "text")
    assert f["rule"] == "kept: text non-empty" and f["unexpected_count"] == 1


def test_kept_row_with_blank_or_missing_text_or_abstract_fails():
    assert_fails_only(validate_articles(set_row(good_articles(), 0, text=" \n ")), REGEX, "text")
    assert_fails_only(validate_articles(set_row(good_articles(), 0, text=None)), NOT_NULL, "text")
    assert_fails_only(validate_articles(set_row(good_articles(), 0, abstract=None)), NOT_NULL, "abstract")
    assert_fails_only(validate_articles(set_row(good_articles(), 0, abstract="")), REGEX, "abstract")


def test_dropped_rows_may_have_empty_text_and_no_abstract():
    articles = good_articles()
    dropped = articles.filter(~pl.col("kept"))
    assert (dropped["text"] == "").all() and dropped["abstract"].is_null().all()
    assert validate_articles(articles).passed


def test_kept_row_with_lang_de_fails():
    f = assert_fails_only(validate_articles(set_row(good_articles(), 1, lang="de")), IN_SET, "lang")
    assert f["unexpected_values"] == ["de"] and f["rule"] == "kept: lang is 'en'"


def test_kept_row_without_lang_fails():
    assert_fails_only(validate_articles(set_row(good_articles(), 1, lang=None)), NOT_NULL, "lang")


def test_kept_row_with_a_failing_filter_fails():
    f = assert_fails_only(
        validate_articles(set_row(good_articles(), 0, failing_filter="words")), IS_NULL, "failing_filter"
    )
    assert f["rule"] == "kept: no failing_filter"


def test_dropped_row_without_failing_filter_fails():
    f = assert_fails_only(
        validate_articles(set_row(good_articles(), 4, failing_filter=None)), NOT_NULL, "failing_filter"
    )
    assert f["rule"] == "dropped: failing_filter named" and f["unexpected_count"] == 1


def test_unknown_profile_fails():
    f = assert_fails_only(validate_articles(set_row(good_articles(), 5, profile="c4")), IN_SET, "profile")
    assert f["unexpected_values"] == ["c4"]


def test_negative_n_words_fails():
    f = assert_fails_only(validate_articles(set_row(good_articles(), 6, n_words=-1)), BETWEEN, "n_words")
    assert f["unexpected_values"] == [-1]


def test_null_kept_fails():
    assert_fails_only(validate_articles(set_row(good_articles(), 6, kept=None)), NOT_NULL, "kept")


def test_wrong_dtype_fails_on_the_polars_side():
    f = assert_fails_only(
        validate_articles(good_articles().with_columns(pl.col("http_status").cast(pl.Int64))), SCHEMA_CHECK
    )
    assert f["unexpected_values"] == ["http_status: Int64 != Int16"]


def test_missing_column_fails_in_polars_and_in_gx():
    res = validate_articles(good_articles().drop("abstract"))
    assert not res.passed
    assert "missing=['abstract']" in failure(res, SCHEMA_CHECK)["unexpected_values"][0]
    failure(res, COLUMN_LIST)


def test_empty_day_passes_with_a_note():
    res = validate_articles(ARTICLES_SCHEMA.to_frame())
    assert res.passed and res.note == "no articles on this day"
    assert res.statistics == {"rows": 0, "kept": 0, "dropped": 0}


def test_counts_and_filter_labels():
    assert filter_label("extraction:crashed: exit code -9") == "extraction:crashed"
    assert filter_label("extraction:timeout") == "extraction:timeout"
    assert filter_label("language_id") == "language_id"
    counts = article_counts(set_row(good_articles(), 4, failing_filter=None))
    assert counts["dropped"] == 3 and counts["dropped_(none)"] == 1


def test_failures_make_the_check_s_table():
    rows = validate_articles(set_row(good_articles(), 1, lang="de")).failures_frame().rows(named=True)
    assert any("kept: lang is 'en'" in r["rule"] and '["de"]' in r["examples"] for r in rows)


# --- the pipeline's own output ----------------------------------------------------------------


@pytest.fixture
def news():
    from testbed.news import NewsServer

    html = FIXTURES / "html"
    if not html.exists():
        pytest.skip("../shared/fixtures/html is absent (real news pages are served from there)")
    names = (
        "reuters.com.parasite.html",
        "zeit.de.zugverkehr.html",
        "scmp.com.playbook.html",
        "theverge.com.ios13.html",
    )
    with NewsServer({f"/{n}": (html / n).read_bytes() for n in names}) as server:
        yield server, names


def _write_quads(data_dir, urls: list[str]) -> None:
    from pipeline.events.quads import QUADS_SCHEMA

    quads = pl.DataFrame(
        [
            {
                "date": DAY,
                "s": "USA",
                "r": "042",
                "o": "CHN",
                "r1": "04",
                "daily_mentions": 80,
                "n_events": 1,
                "urls": urls,
                "n_urls": len(urls),
                "web_mention_urls": 0,
            }
        ],
        schema=QUADS_SCHEMA,
    )
    atomic_write_parquet(quads, DataLayout(data_dir).daily_quads_path(DAY))


def test_articles_pass_on_the_pipeline_output(tmp_path, news):
    """Real pages: one kept (Reuters, The Verge), one dropped by language (Zeit), one failed
    extraction (SCMP's 24-word caption), one not stored (404): the file meets every expectation."""
    from pipeline.articles.day import build_articles

    server, names = news
    _write_quads(tmp_path, [server.url_for(f"/{n}") for n in names] + [server.url_for("/hostile/404")])
    settings = make_settings(data_dir=tmp_path, fetch_allow_loopback=True, fetch_backoff_base_s=0.01, extract_workers=1)
    built = build_articles(DAY, settings.dataset, settings.network, settings.articles)
    res = validate_articles(pl.read_parquet(DataLayout(tmp_path).articles_path(DAY)))
    assert res.passed, res.failures
    assert res.statistics["rows"] == built.counts["stored"] == 4
    assert res.statistics["kept"] == built.counts["kept"] == 2
    assert res.statistics["dropped_language_id"] == 1 and res.statistics["dropped_extraction:too_short"] == 1


# --- Dagster: the check on the articles asset -------------------------------------------------


def _materialize(tmp_path, monkeypatch, frame: pl.DataFrame | None):
    """The articles asset with its check; ``build_articles`` replaced by one writing ``frame``."""
    import assets.articles as article_assets
    from quality.event_checks import articles_valid

    def fake_build_articles(day, dataset, network, articles, now=None):
        from pipeline.articles.day import DayArticles

        if frame is not None:
            layout = DataLayout(dataset.data_dir)
            write_sealed_parquet(layout, frame, layout.articles_path(day))  # as build_articles writes
        return DayArticles(day, 0, None, frame if frame is not None else ARTICLES_SCHEMA.to_frame(), {"selected": 0})

    monkeypatch.setattr(article_assets, "build_articles", fake_build_articles)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [article_assets.articles, articles_valid],
            partition_key=DAY.isoformat(),
            resources=resources_for(make_settings(data_dir=str(tmp_path))),
            instance=instance,
            raise_on_error=False,
        )
    [evaluation] = result.get_asset_check_evaluations()
    return result, evaluation


def test_check_passes_with_the_day_counts(tmp_path, monkeypatch):
    result, check = _materialize(tmp_path, monkeypatch, good_articles())
    assert result.success and check.check_name == "articles_valid" and check.passed
    meta = {k: v.value for k, v in check.metadata.items()}
    assert meta["suite"] == "articles" and meta["failed_expectations"] == 0
    assert {
        k: meta[k]
        for k in ("rows", "kept", "dropped", "dropped_language_id", "dropped_words", "dropped_extraction:failed")
    } == {
        "rows": 7,
        "kept": 4,
        "dropped": 3,
        "dropped_language_id": 1,
        "dropped_words": 1,
        "dropped_extraction:failed": 1,
    }
    assert meta["source"] == str(DataLayout(tmp_path).articles_path(DAY))


def test_failed_check_is_an_error_that_blocks_nothing(tmp_path, monkeypatch):
    result, check = _materialize(tmp_path, monkeypatch, set_row(good_articles(), 0, lang="de"))
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert check.metadata["failures_json"].value[0]["expectation"] == IN_SET
    assert "kept: lang is 'en'" in table_text(check.metadata["failures"])
    assert IN_SET in check.description
    # Non-blocking: the run succeeds and the articles are materialised anyway.
    assert result.success
    assert "articles" in {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def test_check_fails_when_the_file_is_missing(tmp_path, monkeypatch):
    result, check = _materialize(tmp_path, monkeypatch, None)
    assert not check.passed and "missing" in check.description
    assert result.success


def test_definitions_register_the_articles_check():
    import definitions

    keys = definitions.defs.resolve_asset_graph().asset_check_keys
    assert dg.AssetCheckKey(dg.AssetKey("articles"), "articles_valid") in keys
    check_def = next(
        c for c in definitions.defs.asset_checks if c.check_specs and next(iter(c.check_specs)).name == "articles_valid"
    )
    assert not next(iter(check_def.check_specs)).blocking
