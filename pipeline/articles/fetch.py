"""Fetch the news article behind each well-reported event: bounded, polite and safe.

``fetch_article`` gets one URL; ``fetch_many`` a batch with bounded global and per-host
concurrency; ``fetch_articles`` is a whole run: it asks the fetch ledger which candidate URLs are
due (never tried, or failed and due for a retry), fetches them, stores the HTML and records every
outcome in the ledger. The GET beneath them (redirects checked hop by hop, the per-URL deadline,
the capped body read) is ``checked_get``'s; this module decides what a response means for an article.

Every URL is bounded in time and size, whatever the server does:

- connect/read timeouts per request and a wall-clock deadline per URL over all attempts, redirect
  hops and backoff waits (``MIRAI_FETCH_DEADLINE_S``), checked after every socket read, so a
  slow-drip body ends at the deadline;
- redirects followed by hand (at most ``MIRAI_FETCH_MAX_REDIRECTS``), each hop re-checked by
  ``safety.check_url`` and robots.txt, a hop back to a URL already visited is a ``redirect_loop``;
  and every connection goes through ``safety.SafeHTTPAdapter``, which resolves, checks every address
  and connects to the checked address (no DNS rebinding);
- the body is read with ``read1`` (returns as soon as any bytes arrive) and decoded by urllib3
  (≥ 2.6 bounds each decompression step to the bytes asked for), and the *decoded* byte count is
  capped (``MIRAI_FETCH_MAX_BYTES``): a 50 MB page or a gzip bomb stops at the cap, holding at
  most one chunk beyond it in memory; a Content-Length over the cap is refused before reading;
- only text/html and application/xhtml+xml are read; with no Content-Type the first bytes are
  sniffed (WHATWG-style HTML signatures);
- timeouts, resets, 429 and 5xx are retried through ``pipeline.http.with_retries`` (tenacity; Retry-After
  honoured up to ``MIRAI_FETCH_BACKOFF_MAX_S``; a longer one ends the URL for this run and sets its
  earliest retry in the ledger).

Statuses (``FetchOutcome.status``), which of them later runs retry, and what each means:
``pipeline.articles.outcome`` (shared with the ledger).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import requests
import urllib3.exceptions as u3

from pipeline.articles.checked_get import (
    REDIRECT_CODES,
    SNIFF_BYTES,
    BodyTooLarge,
    DeadlineExceeded,
    FetchFailure,
    Hop,
    fetch_robots_txt,
    get_following_redirects,
    read_capped,
)
from pipeline.articles.ledger import plan_fetch, read_ledger, record_outcomes, write_ledger
from pipeline.articles.outcome import STATUSES, FetchOutcome
from pipeline.articles.robots import RobotsCache
from pipeline.articles.safety import UnsafeURL, check_url, make_safe_session
from pipeline.articles.urls import host_key, normalize_url, url_md5
from pipeline.config import ArticleSettings, DatasetSettings, NetworkSettings
from pipeline.http import (
    RETRYABLE_STATUS,
    RetryLog,
    TransientHTTPError,
    describe,
    parse_retry_after,
    utc_now,
    with_retries,
)
from pipeline.storage import DataLayout, atomic_write_bytes, file_lock

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# What we ask for (Accept-Encoding) and urllib3 decodes; anything else would be stored undecoded.
DECODABLE_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})
# WHATWG MIME sniffing, "text/html" patterns: a tag name followed by a space or '>'.
_HTML_SIGNATURES = tuple(
    f"<{tag}".encode()
    for tag in (
        "!doctype html",
        "html",
        "head",
        "script",
        "iframe",
        "h1",
        "div",
        "font",
        "table",
        "a",
        "style",
        "title",
        "b",
        "body",
        "br",
        "p",
        "meta",
        "link",
        "article",
        "section",
        "header",
        "nav",
    )
)


def looks_like_html(head: bytes) -> bool:
    data = head.lstrip(b"\xef\xbb\xbf").lstrip(b" \t\r\n\x0c").lower()
    if b"\x00" in head[:SNIFF_BYTES]:
        return False
    if data.startswith(b"<!--"):
        return True
    return any(data.startswith(sig) and data[len(sig) : len(sig) + 1] in (b" ", b">") for sig in _HTML_SIGNATURES)


def fetch_article(
    session: requests.Session, url: str, articles: ArticleSettings, robots: RobotsCache | None = None
) -> tuple[FetchOutcome, bytes | None]:
    """Fetch one article URL: (outcome, decoded HTML bytes or None). Never raises for anything a
    server or a URL can do; ``robots=None`` skips robots.txt."""
    started = time.monotonic()
    deadline = started + articles.fetch_deadline_s
    url = normalize_url(url)
    outcome = FetchOutcome(url=url, url_md5=url_md5(url), status="error")
    log = RetryLog()
    hop = Hop(url)
    body: bytes | None = None
    try:
        check_url(url, articles.fetch_allow_loopback, resolve=False)  # refused before any attempt
        response, body, content_type = with_retries(
            lambda: _attempt(session, url, articles, deadline, hop, robots, log),
            attempts=max(1, articles.fetch_attempts),
            backoff_base_s=articles.fetch_backoff_base_s,
            backoff_max_s=articles.fetch_backoff_max_s,
            log=log,
            within_s=deadline - time.monotonic(),  # out of time for another attempt: report this one
        )
        outcome.status, outcome.http_status = "fetched", response.status_code
        outcome.content_type, outcome.bytes = content_type, len(body)
        outcome.fetched_at = datetime.now(UTC)
    except Exception as exc:  # whatever it is, it is recorded: _record_failure says as what
        _record_failure(outcome, exc, url, hop, articles)
    if outcome.status != "fetched" and outcome.http_status is None:
        outcome.http_status = hop.http_status if hop.http_status not in REDIRECT_CODES else None
    outcome.final_url = hop.url
    outcome.attempts = log.attempts
    outcome.elapsed_s = round(time.monotonic() - started, 3)
    return outcome, body


def _attempt(
    session: requests.Session,
    url: str,
    articles: ArticleSettings,
    deadline: float,
    hop: Hop,
    robots: RobotsCache | None,
    log: RetryLog,
) -> tuple[requests.Response, bytes, str | None]:
    """One try at an article: the response, its decoded body and its Content-Type. A verdict for
    this run raises FetchFailure; a retryable status raises TransientHTTPError."""
    response = get_following_redirects(session, url, articles, deadline, hop, robots)
    with response:
        code = response.status_code
        log.last_status = code
        if code in RETRYABLE_STATUS:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            # By hand, not a tenacity wait: a longer wait ends the URL's run and defers it in the ledger.
            if retry_after is not None and retry_after > articles.fetch_backoff_max_s:
                raise FetchFailure(
                    "http_error",
                    f"HTTP {code}, Retry-After {retry_after:.0f}s",
                    http_status=code,
                    retryable=True,
                    retry_after_s=retry_after,
                )
            raise TransientHTTPError(code, hop.url, retry_after)
        if code != 200:
            raise FetchFailure("http_error", f"HTTP {code}", http_status=code, retryable=code >= 500)
        content_type = response.headers.get("Content-Type", "").strip() or None
        media = content_type.split(";", 1)[0].strip().lower() if content_type else None
        if media is not None and media not in HTML_TYPES:
            raise FetchFailure("not_html", f"content type {content_type!r}", http_status=code)
        encodings = {e.strip().lower() for e in response.headers.get("Content-Encoding", "").split(",")}
        if not encodings <= DECODABLE_ENCODINGS:
            encoding = response.headers["Content-Encoding"]
            raise FetchFailure(
                "decode_error",
                f"unsupported Content-Encoding {encoding!r}",
                http_status=code,
                error_class="UnsupportedContentEncoding",
            )
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > articles.fetch_max_bytes:
            raise FetchFailure("too_large", f"Content-Length {length} > {articles.fetch_max_bytes}", http_status=code)

        def sniff(head: bytes) -> None:
            if media is None and not looks_like_html(head):
                raise FetchFailure(
                    "not_html", "no content type, and the body does not look like HTML", http_status=code
                )

        try:
            body = read_capped(response, articles.fetch_max_bytes, deadline, on_head=sniff)
        except BodyTooLarge as exc:
            raise FetchFailure("too_large", str(exc), http_status=code) from exc
        if not body:
            raise FetchFailure("empty", "empty body", http_status=code)
        return response, body, content_type


def _record_failure(outcome: FetchOutcome, exc: Exception, url: str, hop: Hop, articles: ArticleSettings) -> None:
    """Record why ``fetch_article`` failed. The kinds are tried in this order, as except clauses
    would be: the first that matches decides the status."""
    if isinstance(exc, UnsafeURL):
        reason = exc.reason if hop.url == url else f"redirect to {hop.url} refused: {exc.reason}"
        _fail(outcome, "blocked_unsafe", exc, reason)
    elif isinstance(exc, FetchFailure):
        _fail(outcome, exc.status, exc, str(exc), retryable=exc.retryable, error_class=exc.error_class)
        outcome.http_status = exc.http_status
        outcome.retry_after_s = exc.retry_after_s
    elif isinstance(exc, DeadlineExceeded):
        _fail(outcome, "timeout", exc, f"deadline of {articles.fetch_deadline_s:g}s exceeded", retryable=True)
    elif isinstance(exc, TransientHTTPError):
        _fail(outcome, "http_error", exc, str(exc), retryable=True)
        outcome.http_status = exc.status
    elif isinstance(exc, requests.Timeout):
        _fail(outcome, "timeout", exc, describe(exc), retryable=True)
    elif isinstance(exc, requests.exceptions.ContentDecodingError):
        _fail(outcome, "decode_error", exc, describe(exc))
    elif isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        _fail(outcome, "connection_error", exc, describe(exc), retryable=True)
    elif isinstance(
        exc,
        (
            requests.exceptions.InvalidURL,
            requests.exceptions.InvalidSchema,
            requests.exceptions.MissingSchema,
            u3.LocationParseError,
        ),
    ):
        _fail(outcome, "invalid_url", exc, describe(exc))
    else:  # a bug or something unforeseen: recorded, and the batch goes on
        _fail(outcome, "error", exc, describe(exc))


def _fail(
    outcome: FetchOutcome,
    status: str,
    exc: BaseException,
    message: str,
    *,
    retryable: bool = False,
    error_class: str | None = None,
) -> None:
    outcome.status = status
    outcome.error_class = error_class or type(exc).__name__
    outcome.error = message[:500]
    outcome.retryable = retryable


def store_html(layout: DataLayout, md5: str, body: bytes) -> str:
    """gzip the decoded body to raw_html/<md5[:2]>/<md5>.html.gz (atomic); the relative path.

    Level 1: it runs in the fetch threads, and at level 6 compression was the fetcher's main CPU
    cost (bench/articles.py: 2.4 s of CPU for 189 MiB of pages, enough to miss the throughput
    goal on 2 cores); level 1 keeps most of the saving on HTML at a fraction of the CPU."""
    path = layout.raw_html_path(md5)
    atomic_write_bytes(path, gzip.compress(body, compresslevel=1, mtime=0))
    return str(path.relative_to(layout.root))


def read_html(layout: DataLayout, md5: str) -> bytes:
    return gzip.decompress(layout.raw_html_path(md5).read_bytes())


@dataclass
class FetchBatch:
    outcomes: list[FetchOutcome]
    started_at: datetime
    elapsed_s: float
    robots_requests: int = 0

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for outcome in self.outcomes:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return counts

    def by_url(self) -> dict[str, FetchOutcome]:
        return {o.url: o for o in self.outcomes}


class _HostSchedule:
    """Which URL goes next: round-robin over hosts, skipping a host with ``per_host`` URLs in
    flight, so no worker ever blocks on a busy host while another host waits."""

    def __init__(self, urls: Iterable[str], per_host: int):
        self.queues: dict[str, deque[str]] = {}
        for url in dict.fromkeys(normalize_url(u) for u in urls):
            self.queues.setdefault(host_key(url), deque()).append(url)
        self.ready: deque[str] = deque(self.queues)
        self.active: dict[str, int] = dict.fromkeys(self.queues, 0)
        self.per_host = per_host

    def fill(self, running: dict[Future, str], concurrency: int, submit: Callable[[str], Future]) -> None:
        """Submit URLs until ``concurrency`` are running or every host with URLs left is busy."""
        ready, active, queues = self.ready, self.active, self.queues
        while len(running) < concurrency and ready:
            progressed = False
            for _ in range(len(ready)):
                if len(running) >= concurrency:
                    break
                host = ready.popleft()
                if active[host] < self.per_host:
                    active[host] += 1
                    running[submit(queues[host].popleft())] = host
                    progressed = True
                if queues[host]:
                    ready.append(host)
            if not progressed:
                return

    def done(self, host: str) -> None:
        self.active[host] -= 1


class _ThreadSessions:
    """One pooled session per worker thread (no shared pool, no lock on the request path), all
    closed together at the end of the batch."""

    def __init__(self, network: NetworkSettings, articles: ArticleSettings):
        self.network, self.articles = network, articles
        self.local = threading.local()
        self.sessions: list[requests.Session] = []
        self.lock = threading.Lock()

    def get(self) -> requests.Session:
        s = getattr(self.local, "session", None)
        if s is None:
            s = self.local.session = make_safe_session(self.network, self.articles, pool_maxsize=1)
            with self.lock:
                self.sessions.append(s)
        return s

    def close(self) -> None:
        for s in self.sessions:
            s.close()


def fetch_many(
    urls: Iterable[str],
    dataset: DatasetSettings,
    network: NetworkSettings,
    articles: ArticleSettings,
    *,
    now: datetime | None = None,
    on_outcome: Callable[[FetchOutcome], None] | None = None,
) -> FetchBatch:
    """Fetch URLs (normalised and deduplicated here) with at most ``fetch_concurrency`` requests in
    flight and at most ``fetch_per_host`` to any one host, storing fetched HTML under raw_html/.

    A scheduler in the calling thread hands a URL to the pool only when its host has a free slot,
    round-robin over hosts, so no worker ever blocks on a busy host while another host waits. Each
    worker thread has its own pooled session (no shared pool, no lock on the request path).
    ``on_outcome`` is called in the calling thread as each URL finishes (ledger checkpoints)."""
    started_at = now or utc_now()
    clock = time.monotonic()
    layout = DataLayout(dataset.data_dir)
    robots = RobotsCache(network, articles, fetcher=fetch_robots_txt) if articles.fetch_respect_robots else None
    concurrency = max(1, articles.fetch_concurrency)
    schedule = _HostSchedule(urls, max(1, articles.fetch_per_host))
    sessions = _ThreadSessions(network, articles)

    def work(url: str) -> FetchOutcome:
        try:
            outcome, body = fetch_article(sessions.get(), url, articles, robots)
            if body is not None:
                outcome.html_path = store_html(layout, outcome.url_md5, body)
            return outcome
        except Exception as exc:  # storage errors etc.: recorded, the batch goes on
            outcome = FetchOutcome(url=url, url_md5=url_md5(url), status="error")
            _fail(outcome, "error", exc, describe(exc))
            return outcome

    outcomes: list[FetchOutcome] = []
    running: dict[Future, str] = {}
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fetch")
    try:

        def submit(url: str) -> Future:
            return pool.submit(work, url)

        schedule.fill(running, concurrency, submit)
        while running:
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                schedule.done(running.pop(future))
                outcome = future.result()
                outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
            schedule.fill(running, concurrency, submit)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        sessions.close()
    return FetchBatch(outcomes, started_at, round(time.monotonic() - clock, 3), robots.requests if robots else 0)


@dataclass
class FetchRun:
    candidates: int  # distinct normalised candidate URLs
    due: int  # fetched (or tried) in this run
    already_fetched: int  # fetched by an earlier run: never fetched again
    waiting: int  # failed earlier, next retry not due yet
    given_up: int  # failed on every step of the schedule (or permanently)
    batch: FetchBatch
    ledger_path: Path = field(default=Path())


def fetch_articles(
    candidate_urls: Iterable[str],
    dataset: DatasetSettings,
    network: NetworkSettings,
    articles: ArticleSettings,
    *,
    now: datetime | None = None,
    checkpoint_s: float = 30.0,
) -> FetchRun:
    """One fetch run: the due URLs among the candidates are fetched and every outcome is merged
    into the global fetch ledger (under its file lock, re-read before each write so concurrent
    runs for other days lose nothing). The ledger is also written every ``checkpoint_s`` during a
    long run, so a crash loses at most that much bookkeeping (the HTML files are already stored)."""
    now = now or utc_now()
    schedule = articles.fetch_retry_schedule  # fail early on a bad MIRAI_FETCH_RETRY_SCHEDULE_H
    layout = DataLayout(dataset.data_dir)
    lock = layout.lock_path("fetch_ledger")
    with file_lock(lock, dataset.day_lock_timeout_s):
        ledger = read_ledger(layout)
        if not layout.fetch_ledger_path().exists():
            write_ledger(layout, ledger)  # the asset exists (empty) from the first run on
        plan = plan_fetch(ledger, candidate_urls, now)

    pending: list[FetchOutcome] = []
    last_flush = [time.monotonic()]

    def flush() -> None:
        if not pending:
            return
        with file_lock(lock, dataset.day_lock_timeout_s):
            write_ledger(layout, record_outcomes(read_ledger(layout), pending, now, schedule))
        pending.clear()
        last_flush[0] = time.monotonic()

    def on_outcome(outcome: FetchOutcome) -> None:
        pending.append(outcome)
        if time.monotonic() - last_flush[0] >= checkpoint_s:
            flush()

    batch = fetch_many(plan.due, dataset, network, articles, now=now, on_outcome=on_outcome)
    flush()
    return FetchRun(
        plan.candidates,
        len(plan.due),
        plan.already_fetched,
        plan.waiting,
        plan.given_up,
        batch,
        layout.fetch_ledger_path(),
    )
