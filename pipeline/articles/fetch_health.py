"""Whether a day's article fetches are healthy: a day whose fetches mostly fail looks green
otherwise (the articles run succeeds with 0 rows, and ``articles_valid`` passes on an empty file).

The day's fetches are the fetch ledger's rows for the URLs the day selects (``select_urls``): the
ledger is global (an article is fetched once ever), so its rows for one day's selection are that
day's record, whichever run fetched them. A row counts as attempted once a run tried it, as failed
when its last try did not store the page (a URL waiting for a retry is failed until a retry
fetches it), and its failure reason is the ledger's status (pipeline/articles/outcome.py
``STATUSES``), ``http_error`` split by its HTTP code: "404 everywhere" (pages gone), "403
everywhere" (we are blocked) and "503 everywhere" (sites down) call for different actions.

A day is unhealthy when at least ``MIN_FETCHES`` fetches were attempted and more than
``MAX_FAILURE_RATE`` of them failed; ``FetchHealth.dominant_reason`` names the commonest failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date

import polars as pl

from pipeline.articles.ledger import read_ledger
from pipeline.config import ArticleSettings, DatasetSettings
from pipeline.storage import DataLayout

# Below this many attempted fetches a day's rate says little: with 10 URLs, five dead links of one
# site already make 50 %. At 20, a day whose true failure rate is an ordinary 25 % exceeds 50 % by
# chance with a probability of 0.4 % (binomial), and a well-reported day selects far more URLs
# (the default demo: 8,103 over 34 days, ~240 a day; a full-size day ~3,300; docs/demo.md).
MIN_FETCHES = 20
# Normal failure rates are far below a half. The default demo's sites (modelled on real ones: 404s,
# PDFs, 503s, robots.txt refusals) failed 588 of 8,103 fetches, 7.3 % (docs/demo.md). Real news
# links rot, but slowly: GDELT's own recrawls of 88 M article URLs found 2.7 % erroring or
# redirected within 24 h and 4.1 % within a week (blog.gdeltproject.org, "Looking Back On Four
# Months Of The Global Difference Graph"), and Pew Research found 8 % of 2023's pages gone by
# October 2023, 38 % of 2013's a decade later ("When Online Content Disappears", 2024). With what
# our fetcher refuses on its own (robots.txt, PDFs, sites that block crawlers) a fresh day fails on
# the order of 5-25 % of its fetches, and even a backfill of decade-old days stays below a half.
# More than half failing is our side (DNS, network, an egress block) or a mass block, not link rot.
MAX_FAILURE_RATE = 0.5


def failure_reason(status: str, http_status: int | None) -> str:
    """The ledger status of a failed fetch, ``http_error`` as ``http_<code>`` when the code is known."""
    return f"http_{http_status}" if status == "http_error" and http_status is not None else status


@dataclass(frozen=True)
class FetchHealth:
    selected: int  # URLs the day selects
    attempted: int  # of those, tried by some run
    failed: int  # of those, not stored after their last try
    failures_by_reason: dict[str, int] = field(default_factory=dict)  # commonest first
    min_fetches: int = MIN_FETCHES
    max_failure_rate: float = MAX_FAILURE_RATE

    @property
    def failure_rate(self) -> float:
        return self.failed / self.attempted if self.attempted else 0.0

    @property
    def dominant_reason(self) -> str | None:
        return next(iter(self.failures_by_reason), None)

    @property
    def dominant_count(self) -> int:
        return self.failures_by_reason.get(self.dominant_reason, 0) if self.dominant_reason else 0

    @property
    def healthy(self) -> bool:
        return self.attempted < self.min_fetches or self.failure_rate <= self.max_failure_rate

    def describe(self) -> str:
        said = f"{self.failed} of {self.attempted} attempted fetches failed ({self.failure_rate:.0%})"
        if self.dominant_reason:
            said += f", most with {self.dominant_reason} ({self.dominant_count})"
        if self.attempted < self.min_fetches:
            return f"{said}: fewer than {self.min_fetches} attempted, too few to judge"
        if self.healthy:
            return said
        return f"{said}: more than {self.max_failure_rate:.0%} of the day's article fetches failed"

    def failures_frame(self) -> pl.DataFrame:
        """The failures by reason, commonest first: reason, fetches."""
        return pl.DataFrame(
            {"reason": list(self.failures_by_reason), "fetches": list(self.failures_by_reason.values())},
            schema={"reason": pl.String, "fetches": pl.Int64},
        )


def fetch_health(
    ledger: pl.DataFrame,
    selected_urls: Iterable[str],
    *,
    min_fetches: int = MIN_FETCHES,
    max_failure_rate: float = MAX_FAILURE_RATE,
) -> FetchHealth:
    """The health of the fetches of ``selected_urls`` (normalised, as ``select_urls`` returns them)
    according to the fetch ledger."""
    selected = pl.Series("url", list(dict.fromkeys(selected_urls)), dtype=pl.String)
    tried = ledger.filter(pl.col("url").is_in(selected.implode()), pl.col("status").is_not_null())
    failed = tried.filter(pl.col("status") != "fetched")
    reasons = [failure_reason(status, code) for status, code in failed.select("status", "http_status").iter_rows()]
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    # Commonest first, ties by name: the dominant reason is the same on every evaluation.
    by_reason = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return FetchHealth(selected.len(), tried.height, failed.height, by_reason, min_fetches, max_failure_rate)


def day_fetch_health(day: date, dataset: DatasetSettings, articles: ArticleSettings) -> FetchHealth:
    """The health of ``day``'s fetches: its selection (none when its quads were never built) in
    the fetch ledger."""
    from pipeline.articles.day import select_urls  # the fetcher and extractors come with it

    layout = DataLayout(dataset.data_dir)
    selected = select_urls(day, dataset, articles) if layout.daily_quads_path(day).exists() else []
    return fetch_health(read_ledger(layout), selected)
