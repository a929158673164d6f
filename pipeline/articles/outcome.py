"""What fetching one article URL gave: ``FetchOutcome`` and its ``STATUSES``.

A leaf module (no pipeline imports) shared by ``fetch``, which produces outcomes, and ``ledger``,
which records them.

Statuses (``FetchOutcome.status``); "retryable" ones are tried again by later runs on the ledger's
schedule (``MIRAI_FETCH_RETRY_SCHEDULE_H``), the others are final:

=====================  ==========================================================  =========
status                 meaning                                                     retryable
=====================  ==========================================================  =========
fetched                HTML stored under raw_html/                                 —
http_error             a non-200 final response (408/425/429/5xx retryable)        by code
not_html               a content type other than HTML/XHTML (or sniffed as not)    no
too_large              Content-Length or decoded body over MIRAI_FETCH_MAX_BYTES   no
empty                  200 with an empty body                                      no
blocked_unsafe         scheme, credentials or address refused (any hop)            no
blocked_robots         robots.txt disallows it (or robots.txt unreachable)         if unreachable
timeout                connect/read timeout or the per-URL deadline                yes
connection_error       refused, reset, broken body                                 yes
dns_error              the host name does not resolve                              yes
redirect_loop          a redirect back to a URL already visited                    no
too_many_redirects     more than MIRAI_FETCH_MAX_REDIRECTS hops                    no
decode_error           a Content-Encoding that does not decode                     no
invalid_url            a URL requests cannot even parse                            no
error                  an unexpected exception (a bug): recorded, the run goes on  no
=====================  ==========================================================  =========
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

STATUSES = (
    "fetched",
    "http_error",
    "not_html",
    "too_large",
    "empty",
    "blocked_unsafe",
    "blocked_robots",
    "timeout",
    "connection_error",
    "dns_error",
    "redirect_loop",
    "too_many_redirects",
    "decode_error",
    "invalid_url",
    "error",
)


@dataclass
class FetchOutcome:
    url: str  # normalised: the ledger key
    url_md5: str
    status: str
    http_status: int | None = None
    final_url: str | None = None  # the last URL requested (or the redirect target refused)
    error_class: str | None = None
    error: str | None = None
    attempts: int = 0  # HTTP attempts (each one follows the redirect chain from the start)
    bytes: int = 0  # decoded body bytes
    content_type: str | None = None
    fetched_at: datetime | None = None
    elapsed_s: float = 0.0
    retryable: bool = False  # should a later run try again (ledger schedule)
    retry_after_s: float | None = None  # server's Retry-After beyond our in-run wait
    html_path: str | None = None  # relative to MIRAI_DATA_DIR, when stored

    def as_dict(self) -> dict:
        return asdict(self)
