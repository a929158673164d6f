"""The fetch ledger: one row per normalised article URL, saying what fetching it gave.

An article is fetched once ever, so the ledger is global, not per day: ``ledger/articles/
fetch_ledger.parquet`` (``DataLayout.fetch_ledger_path``). Every run decides what to fetch from it
(``due_urls``/``plan_fetch``) and merges its outcomes back (``record_outcomes``) under the file lock
``locks/fetch_ledger.lock``, re-reading the file before each write, so runs for different days
can overlap without losing rows. Per-day files would need a scan of every day to answer "was this
URL ever fetched?", and a retry of a URL first seen on day D would have to rewrite day D's file
from a run for another day; one file keeps both simple. Size: a row is ~100 bytes before zstd, so
a year of MIRAI (a few hundred thousand URLs) is tens of MB, read and rewritten in well under a
second; if it ever outgrows that, shard by ``url_md5`` prefix with the same functions.

A URL is due when it was never tried, or its last run failed with a retryable status, it is not
given up and ``next_retry_at`` ≤ now. After the k-th failed run the next retry is at
now + schedule[k-1] (``MIRAI_FETCH_RETRY_SCHEDULE_H``, default 1 h, 6 h, 24 h), pushed later by
a server's Retry-After; a failure after the last step, or a final status (not_html, too_large,
blocked_unsafe, 404, …), gives up. A fetched URL is never due again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from pipeline.articles.outcome import STATUSES, FetchOutcome
from pipeline.articles.urls import normalize_url, url_md5
from pipeline.columns import Columns
from pipeline.storage import DataLayout, atomic_write_parquet

LEDGER_VERSION = "1"
TS = pl.Datetime("us", "UTC")

FETCH_LEDGER_COLUMNS = Columns(
    {
        "url": (pl.String, "Normalised article URL (pipeline.articles.urls.normalize_url): the key"),
        "url_md5": (pl.String, "md5 of url, naming the stored HTML"),
        "status": (pl.String, "Outcome of the last run that tried it (pipeline.articles.outcome.STATUSES)"),
        "http_status": (pl.Int16, "HTTP status of the last attempt"),
        "final_url": (pl.String, "URL after redirects (or the refused redirect target)"),
        "error_class": (pl.String, "Class of the last error"),
        "last_error": (pl.String, "Message of the last error"),
        "content_type": (pl.String, "Content-Type of the response"),
        "bytes": (pl.Int64, "Decoded HTML size"),
        "attempts": (pl.Int32, "HTTP attempts over all runs"),
        "tries": (pl.Int32, "Runs that tried it"),
        "first_tried_at": (TS, "When a run first tried it"),
        "last_tried_at": (TS, "When a run last tried it"),
        "fetched_at": (TS, "When it was fetched; null until then"),
        "next_retry_at": (TS, "When it is next due; null when fetched or given up"),
        "gave_up": (pl.Boolean, "Whether it will not be tried again (final status or retries exhausted)"),
        "html_path": (pl.String, "The stored page, raw_html/{md5[:2]}/{md5}.html.gz relative to MIRAI_DATA_DIR"),
    }
)
FETCH_LEDGER_SCHEMA = FETCH_LEDGER_COLUMNS.schema


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def empty_ledger() -> pl.DataFrame:
    return FETCH_LEDGER_SCHEMA.to_frame()


def read_ledger(layout: DataLayout) -> pl.DataFrame:
    path = layout.fetch_ledger_path()
    if not path.exists():
        return empty_ledger()
    return pl.read_parquet(path).match_to_schema(FETCH_LEDGER_SCHEMA)


def write_ledger(layout: DataLayout, ledger: pl.DataFrame) -> None:
    atomic_write_parquet(
        ledger.match_to_schema(FETCH_LEDGER_SCHEMA).sort("url"),
        layout.fetch_ledger_path(),
        metadata={"ledger_version": LEDGER_VERSION},
    )


@dataclass
class FetchPlan:
    due: list[str]  # normalised URLs to fetch now, in candidate order
    candidates: int  # distinct normalised candidates
    already_fetched: int
    waiting: int  # failed, retry not due yet
    given_up: int


def plan_fetch(ledger: pl.DataFrame, candidate_urls: Iterable[str], now: datetime) -> FetchPlan:
    now = _utc(now)
    urls = list(dict.fromkeys(normalize_url(u) for u in candidate_urls if u and u.strip()))
    cands = pl.DataFrame({"url": urls, "order": range(len(urls))}, schema={"url": pl.String, "order": pl.Int64})
    joined = cands.join(ledger.select("url", "status", "gave_up", "next_retry_at"), on="url", how="left").sort("order")
    never = pl.col("status").is_null()
    fetched = pl.col("status") == "fetched"
    gave_up = ~never & ~fetched & pl.col("gave_up").fill_null(False)
    retry_due = ~never & ~fetched & ~gave_up & (pl.col("next_retry_at").is_null() | (pl.col("next_retry_at") <= now))
    flags = joined.select(
        "url",
        due=never | retry_due,
        fetched=fetched.fill_null(False),
        gave_up=gave_up.fill_null(False),
    )
    due = flags.filter("due")["url"].to_list()
    n_fetched = int(flags["fetched"].sum())
    n_gave_up = int(flags["gave_up"].sum())
    return FetchPlan(due, len(urls), n_fetched, len(urls) - len(due) - n_fetched - n_gave_up, n_gave_up)


def due_urls(ledger: pl.DataFrame, candidate_urls: Iterable[str], now: datetime) -> list[str]:
    """Normalised candidate URLs to fetch in this run: never tried, or failed and due for a retry."""
    return plan_fetch(ledger, candidate_urls, now).due


def _next_retry(
    failed_runs: int, now: datetime, schedule: Sequence[timedelta], retry_after_s: float | None
) -> datetime | None:
    if failed_runs > len(schedule):
        return None
    when = now + schedule[failed_runs - 1]
    if retry_after_s:
        when = max(when, now + timedelta(seconds=retry_after_s))
    return when


def record_outcomes(
    ledger: pl.DataFrame, outcomes: Sequence[FetchOutcome], now: datetime, schedule: Sequence[timedelta]
) -> pl.DataFrame:
    """The ledger with these outcomes merged in (one row per URL; attempts and tries add up)."""
    if not outcomes:
        return ledger
    now = _utc(now)
    latest = {o.url: o for o in outcomes}
    previous = {row["url"]: row for row in ledger.filter(pl.col("url").is_in(list(latest))).iter_rows(named=True)}
    rows = []
    for url, o in latest.items():
        prev = previous.get(url)
        if prev is not None and prev["status"] == "fetched" and o.status != "fetched":
            rows.append(prev)  # another run fetched it meanwhile: fetched stays fetched
            continue
        tries = (prev["tries"] if prev else 0) + 1
        row = {
            "url": url,
            "url_md5": o.url_md5 or url_md5(url),
            "status": o.status,
            "http_status": o.http_status,
            "final_url": o.final_url,
            "error_class": o.error_class,
            "last_error": o.error,
            "content_type": o.content_type,
            "bytes": o.bytes if o.status == "fetched" else None,
            "attempts": ((prev["attempts"] or 0) if prev else 0) + o.attempts,
            "tries": tries,
            "first_tried_at": prev["first_tried_at"] if prev and prev["first_tried_at"] else now,
            "last_tried_at": now,
            "fetched_at": None,
            "next_retry_at": None,
            "gave_up": False,
            "html_path": None,
        }
        if o.status == "fetched":
            row["fetched_at"] = _utc(o.fetched_at) if o.fetched_at else now
            row["html_path"] = o.html_path
        elif not o.retryable:
            row["gave_up"] = True
        else:
            # tries counts failed runs here: a fetched URL is never tried again
            row["next_retry_at"] = _next_retry(tries, now, schedule, o.retry_after_s)
            row["gave_up"] = row["next_retry_at"] is None
        rows.append(row)
    updates = pl.DataFrame(rows, schema=FETCH_LEDGER_SCHEMA)
    return pl.concat([ledger.filter(~pl.col("url").is_in(list(latest))), updates], how="vertical")


def summarize(ledger: pl.DataFrame) -> dict[str, int]:
    """Counts for the UI: rows, per status of the last try, given up, and waiting for a retry."""
    counts = dict(ledger.group_by("status").len().iter_rows())
    out = {"urls": ledger.height}
    out.update({status: int(counts.get(status, 0)) for status in STATUSES})
    out["gave_up"] = int(ledger["gave_up"].sum() or 0)
    out["retry_pending"] = int(ledger.filter(pl.col("next_retry_at").is_not_null()).height)
    return out
