"""URL normalisation for the fetch-once-ever dedup of article URLs.

Two GDELT rows that point at the same article often differ only in case, a default port, a
fragment or a tracking parameter (``utm_*``, ``fbclid``…). ``normalize_url`` removes exactly those
differences and nothing else: path and query keep their order and percent-encoding byte for byte,
because a server may treat ``/a%2Fb`` and ``/a/b`` (or ``?b=1&a=2`` and ``?a=2&b=1``) differently.
``url_md5`` of the normalised URL names the stored HTML and keys the fetch ledger.
"""

from __future__ import annotations

import hashlib
from urllib.parse import SplitResult, urlsplit, urlunsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
# Click/campaign trackers that never select content; compared case-insensitively.
TRACKING_PARAMS = frozenset(
    {
        "fbclid",
        "gclid",
        "gclsrc",
        "dclid",
        "gbraid",
        "wbraid",
        "msclkid",
        "yclid",
        "twclid",
        "ttclid",
        "igshid",
        "mc_cid",
        "mc_eid",
        "_ga",
        "_gl",
        "_hsenc",
        "_hsmi",
        "mkt_tok",
        "oly_anon_id",
        "oly_enc_id",
        "vero_id",
        "vero_conv",
    }
)
TRACKING_PREFIXES = ("utm_",)


def _is_tracking(pair: str) -> bool:
    name = pair.split("=", 1)[0].lower()
    return name in TRACKING_PARAMS or name.startswith(TRACKING_PREFIXES)


def _netloc(parts: SplitResult, scheme: str) -> str:
    host = (parts.hostname or "").rstrip(".")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # a non-numeric or out-of-range port: leave the authority alone
        return parts.netloc.lower()
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}" if "@" in parts.netloc else host
    if port is not None and DEFAULT_PORTS.get(scheme) != port:
        netloc += f":{port}"
    return netloc


def normalize_url(url: str) -> str:
    """Lowercase scheme and host, drop a default port, a trailing dot of the host, the fragment
    and tracking query parameters; an empty path becomes ``/``. Never raises: a string that is not
    a parseable URL comes back stripped (the fetcher then refuses it with a clear status)."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    scheme = parts.scheme.lower()
    if not parts.netloc:
        return urlunsplit((scheme, parts.netloc, parts.path, parts.query, "")) if scheme else url
    query = "&".join(p for p in parts.query.split("&") if p and not _is_tracking(p))
    path = parts.path or "/"
    return urlunsplit((scheme, _netloc(parts, scheme), path, query, ""))


def url_md5(url: str) -> str:
    """md5 hex digest of the normalised URL: the article's id in the ledger and the HTML store."""
    return hashlib.md5(normalize_url(url).encode("utf-8", "surrogatepass")).hexdigest()


def host_key(url: str) -> str:
    """The host a URL connects to (lowercase), for per-host concurrency limits; '' if none."""
    try:
        return (urlsplit(url).hostname or "").rstrip(".")
    except ValueError:
        return ""
