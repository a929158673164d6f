"""robots.txt, fetched once per origin and cached, with RFC 9309 error semantics.

The file is requested through the same safe path as articles (``checked_get.fetch_robots_txt``,
which ``fetch_many`` hands to ``RobotsCache`` as its ``fetcher``: address checks on every hop, at
most 5 redirects, a total deadline, and a size cap), and parsed and matched
by protego (https://github.com/scrapy/protego), which follows RFC 9309 where the stdlib's
``urllib.robotparser`` does not: the longest matching rule wins (§2.2.2; on a tie, Allow), ``*`` and
a final ``$`` are wildcards (§2.2.3), groups naming the same product token are merged (§2.2.1), a
group applies only to a whole product token, not to a substring of ours, and percent-encoded
reserved characters such as ``%2F`` are not decoded before matching (§2.2.2, RFC 3986 §2.2). Groups
are chosen by our User-Agent's product token (RFC 9110 §10.1.5: its first product, ``mirai-pipeline``
by default). Crawl-delay is not honoured (RFC 9309 does not define it); ``fetch_per_host`` bounds
the load on a site instead.

What a fetch result means (RFC 9309 §2.3.1):

- 2xx: the rules apply. A body over 512 KiB is truncated, not refused (§2.5: parse at least 500 KiB).
- 3xx beyond 5 hops, or a redirect that may not be followed (unsafe target): "unavailable",
  treated like 4xx (§2.3.1.2).
- 4xx ("unavailable"): every URL on the origin is allowed (§2.3.1.3) — except 429, which says
  "slow down", not "no file": it is treated as unreachable, as Google's crawler does.
- 5xx, timeouts, resets, DNS errors ("unreachable"): the origin is completely disallowed (§2.3.1.4).
  URLs refused that way are recorded as ``blocked_robots`` with ``RobotsUnavailable`` and are
  retried by later runs on the ledger's schedule; an explicit ``Disallow`` is final.

One cache lives for one fetch run (``fetch_many`` makes it), entries expire after
``MIRAI_FETCH_ROBOTS_TTL_S`` (default 24 h, §2.4), and a per-origin lock makes concurrent workers
wait for a single robots.txt request instead of each sending one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from protego import Protego

from pipeline.config import ArticleSettings, NetworkSettings

ROBOTS_MAX_BYTES = 512 * 1024
ROBOTS_DEADLINE_S = 10.0


@dataclass(frozen=True)
class RobotsVerdict:
    allowed: bool
    reason: str  # "allowed" | "disallowed by robots.txt" | "robots.txt unreachable: …" | …
    unreachable: bool = False  # refused because robots.txt could not be read (5xx/timeout)
    # The fetch status of an unreachable robots.txt when it says the host itself is unusable
    # ("dns_error"): the article is then recorded with that status, not as blocked_robots.
    failure_status: str | None = None


@dataclass
class RobotsFetch:
    """What fetching /robots.txt produced: an HTTP status with text, or an error."""

    status: int | None
    text: str | None = None
    error: str | None = None
    unavailable: bool = False  # too many redirects / refused redirect target: treat as 4xx
    failure_status: str | None = None  # the fetch status of a network failure (timeout, dns_error…)


# How a RobotsCache gets a robots.txt: (session, robots.txt URL, article settings) -> RobotsFetch. Passed in
# (checked_get.fetch_robots_txt) rather than imported, since checked_get imports this module.
RobotsFetcher = Callable[[requests.Session, str, ArticleSettings], RobotsFetch]


@dataclass
class _Entry:
    mode: str  # rules | allow_all | disallow_all
    parser: Protego | None
    reason: str
    expires: float
    failure_status: str | None = None


def origin_of(url: str) -> tuple[str, str] | None:
    """(origin key, robots.txt URL) for an http(s) URL; robots.txt is per scheme, host and port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme not in ("http", "https") or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}", f"{parts.scheme}://{netloc}/robots.txt"


def product_token(user_agent: str) -> str:
    """The User-Agent's first product name (``mirai-pipeline`` of ``mirai-pipeline/0.1 (…)``): what
    robots.txt groups are matched against (RFC 9309 §2.2.1)."""
    return user_agent.split("/", 1)[0].strip()


def interpret(fetched: RobotsFetch) -> tuple[str, Protego | None, str]:
    """RFC 9309 §2.3.1: turn a robots.txt fetch into (mode, parser, reason)."""
    if fetched.unavailable:
        return "allow_all", None, f"robots.txt unavailable ({fetched.error}): allowed"
    if fetched.status is None:
        return "disallow_all", None, f"robots.txt unreachable: {fetched.error}"
    if 200 <= fetched.status < 300:
        # A UTF-8 byte order mark would otherwise hide the first line (RFC 9309 §2.3: UTF-8 text)
        return "rules", Protego.parse((fetched.text or "").lstrip("\ufeff")), "robots.txt rules"
    if fetched.status == 429 or fetched.status >= 500:
        return "disallow_all", None, f"robots.txt unreachable: HTTP {fetched.status}"
    if 400 <= fetched.status < 500:
        return "allow_all", None, f"robots.txt unavailable (HTTP {fetched.status}): allowed"
    return "disallow_all", None, f"robots.txt unreachable: unexpected HTTP {fetched.status}"


class RobotsCache:
    """Thread-safe robots.txt verdicts for one run."""

    def __init__(
        self,
        network: NetworkSettings,
        articles: ArticleSettings,
        *,
        fetcher: RobotsFetcher,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.articles = articles
        self.product_token = product_token(network.user_agent)
        self._clock = clock
        self._fetcher = fetcher
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.requests = 0  # robots.txt fetches made (one per origin unless the TTL expired)

    def _fetch(self, session: requests.Session, robots_url: str) -> RobotsFetch:
        return self._fetcher(session, robots_url, self.articles)

    def _entry(self, session: requests.Session, origin: str, robots_url: str) -> _Entry:
        entry = self._entries.get(origin)  # fast path, no lock: every request of a run asks
        if entry is not None and entry.expires > self._clock():
            return entry
        with self._guard:
            lock = self._locks.setdefault(origin, threading.Lock())
        with lock:  # one fetch per origin; other workers for the origin wait for its answer
            entry = self._entries.get(origin)
            if entry is not None and entry.expires > self._clock():
                return entry
            with self._guard:
                self.requests += 1
            fetched = self._fetch(session, robots_url)
            mode, parser, reason = interpret(fetched)
            expires = self._clock() + self.articles.fetch_robots_ttl_s
            entry = _Entry(mode, parser, reason, expires, fetched.failure_status)
            self._entries[origin] = entry
            return entry

    def check(self, session: requests.Session, url: str) -> RobotsVerdict:
        origin = origin_of(url)
        if origin is None:
            return RobotsVerdict(True, "no robots.txt for this URL")
        entry = self._entry(session, *origin)
        if entry.mode == "allow_all":
            return RobotsVerdict(True, entry.reason)
        if entry.mode == "disallow_all":
            return RobotsVerdict(False, entry.reason, unreachable=True, failure_status=entry.failure_status)
        assert entry.parser is not None
        if entry.parser.can_fetch(url, self.product_token):
            return RobotsVerdict(True, "allowed by robots.txt")
        return RobotsVerdict(False, "disallowed by robots.txt")

    def allowed(self, session: requests.Session, url: str) -> bool:
        return self.check(session, url).allowed
