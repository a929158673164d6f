"""A day of articles: select the URLs of well-reported quads, fetch what the ledger says is due,
extract and filter every stored page of the day's selection, and write ``articles/date=…``.

Extraction and filtering always run from the stored HTML, so a new profile or extractor version
re-runs without fetching anything again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime
from urllib.parse import urlsplit

import polars as pl

from pipeline.articles.extract import ExtractionPool
from pipeline.articles.fetch import FetchRun, fetch_articles, read_html
from pipeline.articles.ledger import read_ledger
from pipeline.articles.obelics import PROFILES, DomainParagraphDedup, filter_document
from pipeline.articles.urls import normalize_url
from pipeline.columns import Columns
from pipeline.config import ArticleSettings, DatasetSettings, NetworkSettings
from pipeline.events.daily import scan_parsed
from pipeline.http import utc_now
from pipeline.storage import DataLayout, verified, write_sealed_parquet

ARTICLES_VERSION = "articles-v1"
ABSTRACT_MIN_CHARS = 50  # MIRAI's data_news.csv: add paragraphs while the abstract is ≤ 50 chars

ARTICLES_COLUMNS = Columns(
    {
        "url": (pl.String, "Normalised article URL (a quad's SOURCEURL, pipeline.articles.urls.normalize_url)"),
        "url_md5": (pl.String, "md5 of url: the news table's article_id"),
        "day": (pl.Date, "Day of the events whose quads selected the URL"),
        "fetched_at": (pl.Datetime("us", "UTC"), "When the page was fetched (fetch ledger)"),
        "http_status": (pl.Int16, "HTTP status of the fetch (fetch ledger)"),
        "final_url": (pl.String, "URL after redirects (fetch ledger)"),
        "title": (pl.String, "Title extracted by trafilatura"),
        "text": (pl.String, 'Paragraphs that survive the filters, "\\n"-separated; empty when not kept'),
        "abstract": (pl.String, "Title, then leading paragraphs until over 50 characters (MIRAI's abstract)"),
        "date_published": (pl.String, "The page's own publication date (YYYY-MM-DD), if it declares one"),
        "lang": (pl.String, "fastText lid.176 top-1 language of the text"),
        "lang_score": (pl.Float64, "fastText lid.176 score of lang"),
        "n_words": (pl.Int64, "Words of the extracted text (OBELICS words)"),
        "extraction_error": (pl.String, "Why extraction gave no usable text; null when it did"),
        "kept": (pl.Boolean, "Whether the article passed every filter of the profile"),
        "failing_filter": (
            pl.String,
            "First failing document filter (or domain_dedup, or extraction:ERROR); null when kept",
        ),
        "failing_value": (pl.Float64, "The failing filter's measured value"),
        "paragraphs_in": (pl.Int32, "Paragraphs of the extracted text"),
        "paragraphs_kept": (pl.Int32, "Paragraphs that survived the paragraph filters"),
        "paragraph_drops": (pl.String, "JSON {paragraph filter: paragraphs it removed}"),
        "profile": (pl.String, "Filter profile applied (MIRAI_ARTICLE_PROFILE)"),
    }
)
ARTICLES_SCHEMA = ARTICLES_COLUMNS.schema


def _same_line(a: str, b: str) -> bool:
    """Equal up to case, spacing and edge punctuation: a headline repeated as the text's first line."""

    def norm(s: str) -> str:
        return " ".join(s.split()).casefold().strip(" .:;,|-\u2013\u2014")

    return bool(norm(a)) and norm(a) == norm(b)


def abstract(title: str | None, text: str) -> str:
    """Title, then the first paragraph, then more paragraphs while it is still short (MIRAI).

    Extracted text often starts with the page's headline (trafilatura keeps an article's <h1>), so
    leading paragraphs that repeat the title are skipped: "Title\nTitle\n..." says nothing twice."""
    parts = [title or ""]
    paragraphs = text.split("\n")
    while paragraphs and title and _same_line(paragraphs[0], title):
        paragraphs.pop(0)
    for paragraph in paragraphs:
        parts.append(paragraph)
        if len("\n".join(parts)) > ABSTRACT_MIN_CHARS:
            break
    return "\n".join(parts).strip()


def select_urls(day: date, dataset: DatasetSettings, articles: ArticleSettings) -> list[str]:
    """Normalised article URLs of the day's quads with daily_mentions ≥ the threshold (plus,
    optionally, the first-day WEB mention URLs of their events), sorted and unique."""
    layout = DataLayout(dataset.data_dir)
    quads = pl.scan_parquet(verified(layout, layout.daily_quads_path(day))).filter(
        pl.col("daily_mentions") >= dataset.article_min_mentions
    )
    urls = quads.select(pl.col("urls").explode().alias("url"))
    mentions = scan_parsed(layout, "mentions", day) if articles.article_include_mention_urls else None
    if mentions is not None:
        events = pl.scan_parquet(verified(layout, layout.events_path(day))).join(
            quads.select("date", "s", "r", "o"), on=["date", "s", "r", "o"], how="semi"
        )
        web = (
            mentions.filter(pl.col("MentionType") == 1, pl.col("MentionTimeDate").dt.date() == day)
            .join(events.select(pl.col("event_id").alias("GLOBALEVENTID")), on="GLOBALEVENTID", how="semi")
            .select(pl.col("MentionIdentifier").alias("url"))
        )
        urls = pl.concat([urls, web])
    raw = urls.drop_nulls().unique().collect()["url"].to_list()
    return sorted({normalize_url(u) for u in raw})


@dataclass
class DayArticles:
    day: date
    selected: int
    fetch: FetchRun
    articles: pl.DataFrame
    counts: dict[str, int]


def build_articles(
    day: date,
    dataset: DatasetSettings,
    network: NetworkSettings,
    articles: ArticleSettings,
    *,
    now: datetime | None = None,
) -> DayArticles:
    if articles.article_profile not in PROFILES:
        raise ValueError(f"MIRAI_ARTICLE_PROFILE={articles.article_profile!r}: expected one of {', '.join(PROFILES)}")
    if articles.article_domain_dedup and not PROFILES[articles.article_profile].allows_domain_dedup:
        raise ValueError(f"MIRAI_ARTICLE_DOMAIN_DEDUP needs the obelics profile, not {articles.article_profile!r}")
    layout = DataLayout(dataset.data_dir)
    selected = select_urls(day, dataset, articles)
    run = fetch_articles(selected, dataset, network, articles, now=now or utc_now())
    ledger = read_ledger(layout).filter(pl.col("url").is_in(pl.Series(selected, dtype=pl.String).implode()))
    stored = ledger.filter(pl.col("html_path").is_not_null()).sort("url")
    docs = ((read_html(layout, r["url_md5"]), r["final_url"] or r["url"]) for r in stored.iter_rows(named=True))
    with ExtractionPool(articles.extract_workers, timeout_s=articles.extract_timeout_s) as pool:
        judged = [
            (
                r,
                extracted,
                filter_document(extracted.text, articles.article_profile) if extracted.error is None else None,
            )
            for r, extracted in zip(stored.iter_rows(named=True), pool.map(docs))
        ]
    if articles.article_domain_dedup:
        # OBELICS step 09 over the day's batch: paragraphs repeated within a domain are boilerplate.
        dedup = DomainParagraphDedup()
        domain = lambda r: urlsplit(r["final_url"] or r["url"]).netloc  # noqa: E731
        for r, _, decision in judged:
            if decision is not None:
                dedup.add(domain(r), decision)
        judged = [(r, e, dedup.apply(domain(r), d) if d is not None else None) for r, e, d in judged]
    rows = []
    for r, extracted, decision in judged:
        text = decision.text if decision else ""
        rows.append(
            {
                "url": r["url"],
                "url_md5": r["url_md5"],
                "day": day,
                "fetched_at": r["fetched_at"],
                "http_status": r["http_status"],
                "final_url": r["final_url"],
                "title": extracted.title,
                "text": text,
                "abstract": abstract(extracted.title, text) if decision and decision.kept else None,
                "date_published": extracted.date,
                "lang": decision.lang if decision and decision.lang else extracted.lang,
                "lang_score": decision.lang_score
                if decision and decision.lang_score is not None
                else extracted.lang_score,
                "n_words": extracted.n_words,
                "extraction_error": extracted.error,
                "kept": bool(decision and decision.kept),
                "failing_filter": (decision.failing_filter if decision else f"extraction:{extracted.error}"),
                "failing_value": decision.value if decision else None,
                "paragraphs_in": decision.paragraphs_in if decision else 0,
                "paragraphs_kept": decision.paragraphs_kept if decision else 0,
                "paragraph_drops": json.dumps(decision.paragraph_drops, sort_keys=True) if decision else None,
                "profile": articles.article_profile,
            }
        )
    table = pl.DataFrame(rows, schema=ARTICLES_SCHEMA)
    write_sealed_parquet(
        layout,
        table,
        layout.articles_path(day),
        metadata={"articles_version": ARTICLES_VERSION, "profile": articles.article_profile},
    )
    not_stored = ledger.filter(pl.col("html_path").is_null())
    counts = {
        "selected": len(selected),
        "fetched_this_run": run.due,
        "already_fetched": run.already_fetched,
        "stored": stored.height,
        "failed": not_stored.height,
        "extracted": table.filter(pl.col("extraction_error").is_null()).height,
        "kept": table.filter("kept").height,
    }
    counts.update({f"failed_{k}": v for k, v in not_stored.group_by("status").len().iter_rows()})
    counts.update(
        {f"dropped_{k}": v for k, v in table.filter(~pl.col("kept")).group_by("failing_filter").len().iter_rows()}
    )
    return DayArticles(day, len(selected), run, table, counts)
