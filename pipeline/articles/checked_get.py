"""One GET whose every hop is checked and whose body is bounded, for articles and robots.txt alike.

``get_following_redirects`` follows redirects by hand, each hop re-checked by ``safety.check_url``
and (for articles) robots.txt, a return to a visited URL a ``redirect_loop``; ``read_capped`` reads
the decoded body up to a byte cap, checking the per-URL deadline after every socket read.
``fetch_robots_txt`` is the robots.txt fetcher ``fetch_many`` hands to ``RobotsCache``. What the
article path decides about the response (status, type, retries) stays in ``fetch``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin

import requests
import urllib3.exceptions as u3

from pipeline.articles.robots import ROBOTS_DEADLINE_S, ROBOTS_MAX_BYTES, RobotsCache, RobotsFetch
from pipeline.articles.safety import UnsafeURL, check_url
from pipeline.config import ArticleSettings
from pipeline.http import describe

CHUNK = 64 * 1024
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
SNIFF_BYTES = 512


class FetchFailure(Exception):
    """A final verdict reached inside an attempt (not retried in this run)."""

    def __init__(
        self,
        status: str,
        error: str,
        *,
        http_status: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        error_class: str | None = None,
    ):
        super().__init__(error)
        self.status = status
        self.http_status = http_status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.error_class = error_class or type(self).__name__


class DeadlineExceeded(Exception):
    """The per-URL wall-clock deadline passed."""


class BodyTooLarge(Exception):
    pass


@dataclass
class Hop:
    url: str
    http_status: int | None = None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("per-URL deadline exceeded")
    return left


def _timeouts(articles: ArticleSettings, deadline: float) -> tuple[float, float]:
    left = _remaining(deadline)
    return min(articles.fetch_connect_timeout_s, left), min(articles.fetch_read_timeout_s, left)


def read_capped(
    response: requests.Response,
    max_bytes: int,
    deadline: float,
    *,
    truncate: bool = False,
    on_head: Callable[[bytes], None] | None = None,
) -> bytes:
    """Read the decoded body, at most ``max_bytes`` (BodyTooLarge, or cut there with ``truncate``),
    giving up at ``deadline``. ``read1`` returns whatever one socket read brought, so the deadline is
    checked however slowly the server drips; urllib3 errors become the requests errors that
    ``with_retries`` knows."""
    raw = response.raw
    parts: list[bytes] = []
    size = 0
    head_done = on_head is None
    while True:
        _remaining(deadline)
        try:
            chunk = raw.read1(CHUNK, decode_content=True)
        except u3.ReadTimeoutError as exc:
            raise requests.ReadTimeout(str(exc)) from exc
        except u3.DecodeError as exc:
            raise requests.exceptions.ContentDecodingError(str(exc)) from exc
        except u3.SSLError as exc:
            raise requests.exceptions.SSLError(str(exc)) from exc
        except (u3.ProtocolError, OSError) as exc:
            raise requests.exceptions.ChunkedEncodingError(str(exc)) from exc
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            if truncate:
                parts.append(chunk[: len(chunk) - (size - max_bytes)])
                break
            raise BodyTooLarge(f"body exceeds {max_bytes} bytes after decoding")
        parts.append(chunk)
        if not head_done and size >= SNIFF_BYTES:
            head_done = True
            on_head(b"".join(parts))
    body = b"".join(parts)
    if not head_done and body:
        on_head(body)
    return body


def get_following_redirects(
    session: requests.Session,
    url: str,
    articles: ArticleSettings,
    deadline: float,
    hop: Hop,
    robots: RobotsCache | None = None,
) -> requests.Response:
    """GET ``url`` following redirects by hand; every hop is checked (safety, then robots). Returns
    the final, non-redirect response (streaming, unread)."""
    visited = {url}
    current = url
    for hops in range(articles.fetch_max_redirects + 1):
        hop.url, hop.http_status = current, None
        check_url(current, articles.fetch_allow_loopback, resolve=False)  # the adapter resolves and checks
        if robots is not None:
            verdict = robots.check(session, current)
            if not verdict.allowed and verdict.failure_status == "dns_error":
                raise FetchFailure("dns_error", verdict.reason, retryable=True, error_class="NameResolutionError")
            if not verdict.allowed:
                raise FetchFailure(
                    "blocked_robots",
                    verdict.reason,
                    retryable=verdict.unreachable,
                    error_class="RobotsUnavailable" if verdict.unreachable else "RobotsDisallowed",
                )
        try:
            response = session.get(current, stream=True, allow_redirects=False, timeout=_timeouts(articles, deadline))
        except requests.ConnectionError as exc:
            if _is_name_resolution_error(exc):
                raise FetchFailure(
                    "dns_error", describe(exc), retryable=True, error_class="NameResolutionError"
                ) from exc
            raise
        hop.http_status = response.status_code
        if response.status_code not in REDIRECT_CODES:
            return response
        location = response.headers.get("Location", "").strip()
        response.close()
        if not location:
            raise FetchFailure(
                "http_error", f"HTTP {response.status_code} without Location", http_status=response.status_code
            )
        target = urldefrag(urljoin(current, location))[0]
        # A consent or cookie wall redirects to the same URL once, after setting a cookie: that is
        # not a loop. Any other return to a visited URL is (and max_redirects bounds both).
        if target in visited and "Set-Cookie" not in response.headers:
            hop.url = target
            raise FetchFailure(
                "redirect_loop", f"redirect back to {target} after {hops + 1} hop(s)", http_status=response.status_code
            )
        visited.add(target)
        current = target
    hop.url = current
    raise FetchFailure(
        "too_many_redirects",
        f"more than {articles.fetch_max_redirects} redirects",
        http_status=hop.http_status,
    )


def _is_name_resolution_error(exc: BaseException) -> bool:
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen or e is None:
            continue
        seen.add(id(e))
        if isinstance(e, socket.gaierror):  # safety.SafeHTTPAdapter resolves names, not urllib3
            return True
        stack.extend([getattr(e, "reason", None), e.__cause__, e.__context__])
        stack.extend(a for a in e.args if isinstance(a, BaseException))
    return False


def fetch_robots_txt(session: requests.Session, robots_url: str, articles: ArticleSettings) -> RobotsFetch:
    """GET a robots.txt through the article path's safety (checked hops, ≤ 5 redirects, capped
    size and time), one attempt; ``robots.interpret`` decides what the result means."""
    deadline = time.monotonic() + min(ROBOTS_DEADLINE_S, articles.fetch_deadline_s)
    hop = Hop(robots_url)
    try:
        response = get_following_redirects(session, robots_url, articles, deadline, hop, robots=None)
        with response:
            if not 200 <= response.status_code < 300:
                return RobotsFetch(response.status_code)
            body = read_capped(response, ROBOTS_MAX_BYTES, deadline, truncate=True)
            return RobotsFetch(response.status_code, body.decode("utf-8", errors="replace"))
    except FetchFailure as exc:
        if exc.status in ("too_many_redirects", "redirect_loop"):
            return RobotsFetch(None, error=str(exc), unavailable=True)
        return RobotsFetch(None, error=f"{exc.status}: {exc}", failure_status=exc.status)
    except UnsafeURL as exc:
        return RobotsFetch(None, error=f"unsafe redirect: {exc.reason}", unavailable=True)
    except (requests.Timeout, DeadlineExceeded) as exc:
        return RobotsFetch(None, error=describe(exc), failure_status="timeout")
    except Exception as exc:  # resets, refused connections, decode errors: unreachable
        return RobotsFetch(None, error=describe(exc), failure_status="connection_error")
