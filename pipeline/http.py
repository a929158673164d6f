"""HTTP plumbing shared by every downloader: one pooled session, and retries (tenacity) that know
which failures are worth retrying (timeouts, resets, 429, 5xx) and honour Retry-After."""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import requests
from requests.adapters import HTTPAdapter
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
    wait_random_exponential,
)

from pipeline.config import NetworkSettings

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# Network failures that a later attempt can fix; anything else (bad URL, TLS config) is a bug.
RETRYABLE_EXCEPTIONS = (
    requests.Timeout,
    requests.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)


class TransientHTTPError(Exception):
    def __init__(self, status: int, url: str, retry_after_s: float | None = None):
        super().__init__(f"HTTP {status} for {url}")
        self.status = status
        self.retry_after_s = retry_after_s


def make_session(network: NetworkSettings, concurrency: int = 4) -> requests.Session:
    """A session with our User-Agent whose pool holds ``concurrency`` connections (at least 4)."""
    session = requests.Session()
    session.headers["User-Agent"] = network.user_agent
    # Pool as wide as the caller's download pool so threads never wait on a connection slot.
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=max(concurrency, 4), max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


# The longest Retry-After taken as said, whatever a server sends: a day, where the article ledger's
# default retry schedule ends. In-run waits are shorter still (backoff_wait's max_s, the LLM rate
# limiter's minute); a longer one defers an article URL in the ledger, which adds it to a datetime:
# a huge number overflowed it, a date in year 9999 deferred the URL for ever.
RETRY_AFTER_MAX_S = 86_400.0


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's delay in seconds (RFC 9110 §10.2.3), at most RETRY_AFTER_MAX_S:
    delay-seconds (a fraction too, as some servers send), or an HTTP-date (0 once it has passed;
    ``now``: the epoch seconds to count from). None when absent or unreadable, a negative or NaN
    delay included: the caller then backs off on its own."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_MAX_S)


def raise_for_transient(response: requests.Response) -> None:
    if response.status_code in RETRYABLE_STATUS:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        response.close()
        raise TransientHTTPError(response.status_code, response.url, retry_after)


@dataclass
class RetryLog:
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    last_status: int | None = None


def describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def backoff_wait(base_s: float, max_s: float) -> Callable[[RetryCallState], float]:
    """tenacity's wait for attempt n: exponential backoff with equal jitter, uniform(b/2, b) with
    b = min(max_s, base_s * 2**(n-1)): half the growth for sure, half random, so the retries of
    many files spread out. A failure carrying ``retry_after_s`` (the server's Retry-After) waits
    that long instead, but never longer than our own ``max_s``."""
    jittered = wait_exponential(multiplier=base_s / 2, max=max_s / 2) + wait_random_exponential(
        multiplier=base_s / 2, max=max_s / 2
    )

    def wait(state: RetryCallState) -> float:
        retry_after = getattr(state.outcome.exception(), "retry_after_s", None)
        return min(max_s, retry_after) if retry_after is not None else jittered(state)

    return wait


def with_retries(
    operation: Callable[[], T],
    *,
    attempts: int,
    backoff_base_s: float,
    backoff_max_s: float,
    log: RetryLog | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    within_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``operation`` up to ``attempts`` times (tenacity), waiting ``backoff_wait`` between.

    Only transient failures (plus the caller's ``retry_on``) are retried; the last is re-raised,
    as is the last failure when the next wait would end past ``within_s`` seconds from now (a
    deadline). ``log`` records every attempt so the ledger can show how hard a file was to get.
    """
    log = log if log is not None else RetryLog()

    def count(state: RetryCallState) -> None:
        log.attempts += 1

    def record(state: RetryCallState) -> None:
        exc = state.outcome.exception()
        if isinstance(exc, TransientHTTPError):
            log.last_status = exc.status
        log.errors.append(str(exc) if isinstance(exc, TransientHTTPError) else describe(exc))

    stop = stop_after_attempt(attempts)
    retrying = Retrying(
        stop=stop if within_s is None else stop | stop_before_delay(within_s),
        wait=backoff_wait(backoff_base_s, backoff_max_s),
        retry=retry_if_exception_type((TransientHTTPError, *RETRYABLE_EXCEPTIONS, *retry_on)),
        before=count,
        after=record,
        sleep=sleep,
        reraise=True,
    )
    return retrying(operation)


def utc_now() -> datetime:
    return datetime.now(UTC)
