"""HTTP plumbing shared by every downloader: one pooled session, and a retry loop that knows
which failures are worth retrying (timeouts, resets, 429, 5xx) and honours Retry-After."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, TypeVar

import requests
from requests.adapters import HTTPAdapter

from pipeline.config import Settings

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


def make_session(settings: Settings) -> requests.Session:
    session = requests.Session()
    session.headers["User-Agent"] = settings.user_agent
    # Pool as wide as the download pool so threads never wait on a connection slot.
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=max(settings.download_concurrency, 4), max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


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


def with_retries(
    operation: Callable[[], T],
    *,
    attempts: int,
    backoff_base_s: float,
    backoff_max_s: float,
    log: RetryLog | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``operation`` up to ``attempts`` times with exponential backoff and full jitter.

    Only transient failures (plus the caller's ``retry_on``) are retried; the last is re-raised. ``log`` records every attempt
    so the ledger can show how hard a file was to get.
    """
    log = log if log is not None else RetryLog()
    for attempt in range(1, attempts + 1):
        log.attempts += 1
        try:
            return operation()
        except TransientHTTPError as exc:
            log.errors.append(str(exc))
            log.last_status = exc.status
            if attempt == attempts:
                raise
            delay = exc.retry_after_s
        except (*RETRYABLE_EXCEPTIONS, *retry_on) as exc:
            log.errors.append(describe(exc))
            if attempt == attempts:
                raise
            delay = None
        backoff = min(backoff_max_s, backoff_base_s * 2 ** (attempt - 1))
        # Honour the server's Retry-After, but never wait longer than our own cap.
        wait = min(backoff_max_s, delay) if delay is not None else random.uniform(backoff / 2, backoff)
        sleep(wait)
    raise AssertionError("unreachable")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)
