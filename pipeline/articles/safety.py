"""Outbound safety: which URLs the article fetcher may request, and which addresses it may connect to.

GDELT article URLs are untrusted input, and so is every redirect a news server sends. Two layers:

1. ``check_url`` — a static check of every URL before it is requested (the first URL and every
   redirect hop): only ``http``/``https``, no credentials in the URL, a host present, and when the
   host is an IP literal, that address must be public. With ``resolve=True`` it also resolves the
   host and checks *every* address (a name with one public and one private address is refused).

2. ``SafeHTTPAdapter`` — the check at connection time, which is the one that matters. For every
   request it resolves the host (or takes its ``HostMap`` target; an answer is reused for up to a
   minute), refuses unless every resolved address is allowed, and has urllib3 connect to one of
   exactly those checked addresses (the pool is keyed by the IP literal, so urllib3 does no lookup
   of its own). Checking and connecting with
   the same answer closes the DNS-rebinding window (a name that resolves to a public address for
   the check and to 169.254.169.254 for the connect), and it covers every hop and every new
   keep-alive connection without the fetcher having to remember. Only the socket's target is
   pinned: the Host header, TLS SNI and certificate verification still use the hostname, so HTTPS
   works as usual. Sessions made with ``make_safe_session`` also ignore proxy environment variables
   and ``.netrc`` (a proxy would do its own resolution and defeat the check).

Refused: loopback, private (RFC 1918, IPv6 ULA fc00::/7), link-local (169.254/16, fe80::/10),
multicast, reserved, unspecified, shared/CGNAT (100.64/10, via ``is_global``), any other non-global
address, IPv4-mapped/6to4/Teredo addresses wrapping one of those, and the cloud metadata addresses
(169.254.169.254, fd00:ec2::254, 100.100.100.200) explicitly. ``allow_loopback`` (tests and the
local demo, ``MIRAI_FETCH_ALLOW_LOOPBACK``) lets loopback addresses through and nothing else.

``HostMap`` (``MIRAI_FETCH_HOST_MAP``, empty by default) sends the connections for some host names
to a fixed address and port instead of resolving them, like curl's ``--resolve``: the demo serves
the generated mirror's news sites (``www.<site>.example``) from one local server this way, while
the URLs, Host headers, per-host limits and robots.txt stay those of the sites. Only names under
the reserved TLDs of RFC 2606 / 6761 (``.example``, ``.test``, ``.invalid``, ``.localhost``) can be
mapped, so no real site can ever be rerouted, and the target goes through the same address check
(a loopback target still needs ``allow_loopback``).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import NewConnectionError

from pipeline.config import ArticleSettings, NetworkSettings
from pipeline.http import make_session

ALLOWED_SCHEMES = ("http", "https")
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
RESERVED_TLDS = ("example", "test", "invalid", "localhost")  # RFC 2606, RFC 6761: never public names


@dataclass(frozen=True)
class HostMap:
    """Host names whose connections go to a fixed ``address:port`` (see the module docstring).

    Parsed from ``"pattern=address:port,..."``; a pattern is a host name or ``*.suffix`` (any name
    ending in ``.suffix``), under a reserved TLD; the address is an IP literal (IPv6 in brackets)."""

    entries: tuple[tuple[str, str, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> HostMap:
        entries = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            pattern, sep, target = item.partition("=")
            address, _, port = target.strip().rpartition(":")
            pattern, address = pattern.strip().lower().rstrip("."), address.strip("[]")
            if not sep or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"host map entry {item!r}: expected pattern=address:port")
            try:
                ipaddress.ip_address(address)
            except ValueError as exc:
                raise ValueError(f"host map entry {item!r}: {address!r} is not an IP address") from exc
            if pattern.rsplit(".", 1)[-1] not in RESERVED_TLDS or pattern in RESERVED_TLDS:
                raise ValueError(f"host map entry {item!r}: only names under {', '.join(RESERVED_TLDS)} can be mapped")
            entries.append((pattern, address, int(port)))
        return cls(tuple(entries))

    def target(self, host: str, port: int) -> tuple[str, int]:
        """Where a connection to ``host:port`` goes: the first matching entry's, else unchanged."""
        name = host.lower().rstrip(".")
        for pattern, address, mapped_port in self.entries:
            if name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
                return address, mapped_port
        return host, port


NO_HOST_MAP = HostMap()


class UnsafeURL(Exception):
    """A URL or address the fetcher must not request; ``reason`` says which rule refused it.

    Deliberately not an OSError: urllib3 wraps OSErrors from a connect in its own errors (and
    requests would retry them); this one must surface unchanged."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def address_problem(ip: IPAddress, allow_loopback: bool = False) -> str | None:
    """Why ``ip`` may not be connected to, or None when it is a public address."""
    if ip in METADATA_ADDRESSES:
        return f"cloud metadata address {ip}"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            problem = address_problem(embedded, allow_loopback)
            return f"{ip} embeds {embedded}: {problem}" if problem else None
        if ip.scope_id:
            return f"scoped IPv6 address {ip}"
    if ip.is_loopback:
        return None if allow_loopback else f"loopback address {ip}"
    for label, flag in (
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return f"{label} address {ip}"
    if not ip.is_global:  # e.g. 100.64.0.0/10 shared address space (CGNAT)
        return f"non-global address {ip}"
    return None


def resolve_host(host: str, port: int) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` for a TCP connection, IPv4 and IPv6 (a module-level seam, so tests can fake
    DNS). Every answer is checked; an address family the machine cannot reach fails to connect and
    the adapter moves on to the next address."""
    return socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)


def checked_addresses(
    host: str, port: int, allow_loopback: bool = False, host_map: HostMap = NO_HOST_MAP
) -> list[tuple[Any, ...]]:
    """Resolve ``host`` (or take its ``host_map`` target) and return its addrinfo entries, or raise
    UnsafeURL if *any* address is refused (socket.gaierror when the name does not resolve)."""
    host, port = host_map.target(host.strip("[]"), port)
    infos = resolve_host(host, port)
    if not infos:
        raise socket.gaierror(f"no address for {host}")
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        problem = address_problem(ip, allow_loopback)
        if problem:
            raise UnsafeURL(f"{host} resolves to {problem}")
    return infos


def check_url(url: str, allow_loopback: bool = False, *, resolve: bool = True) -> None:
    """Raise UnsafeURL unless ``url`` may be fetched. ``resolve=False`` skips DNS (the fetcher's
    connection layer resolves and checks at connect time); DNS failures raise socket.gaierror."""
    if any(ch in url for ch in "\\\r\n\t\0 "):
        raise UnsafeURL("URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"unparseable URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise UnsafeURL(f"scheme {scheme or '(none)'!r} is not http or https")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise UnsafeURL("URL carries credentials")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeURL("URL has no host")
    try:
        literal: IPAddress | None = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        literal = None
    if literal is not None:
        problem = address_problem(literal, allow_loopback)
        if problem:
            raise UnsafeURL(problem)
    if resolve:
        checked_addresses(host, port or (443 if scheme == "https" else 80), allow_loopback)


# --- connection layer: resolve, check, connect to what was checked ---

ADDRESS_TTL_S = 60.0  # how long an adapter reuses a checked answer (a DNS cache, not a safety bound)


DEFAULT_PORTS = {"http": 80, "https": 443}


def _name_and_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 80)


def _host_header(url: str) -> str:
    """The Host header http.client would send for ``url``: the name, and the port unless default."""
    name, port = _name_and_port(url)
    name = name.rstrip(".")
    name = f"[{name}]" if ":" in name else name
    return name if port == DEFAULT_PORTS.get(urlsplit(url).scheme.lower()) else f"{name}:{port}"


def _failed_to_connect(exc: requests.ConnectionError) -> bool:
    """True when no connection was made (refused, unreachable): nothing was sent, another address
    may work. A connect timeout is not retried on the next address (the deadline would double)."""
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, NewConnectionError)


class SafeHTTPAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections go only to checked addresses (see the module docstring).

    Built on requests' public extension points (requests >= 2.32.2, ``HTTPAdapter`` docs):
    ``build_connection_pool_key_attributes`` resolves and checks the URL's host and keys the urllib3
    pool by the checked IP literal, so urllib3 connects to that address with no lookup of its own;
    for https the pool's ``server_hostname`` (a public urllib3 pool argument) keeps SNI and
    certificate verification on the host name. ``add_headers`` sends the name as the Host header,
    as requests-toolbelt's ``HostHeaderSSLAdapter`` does the other way round. ``send`` tries the
    next checked address when one refuses the connection (an unreachable IPv6 address before a
    working IPv4 one), and checked answers are reused for ``ADDRESS_TTL_S``."""

    def __init__(self, allow_loopback: bool = False, host_map: HostMap = NO_HOST_MAP, **kwargs):
        self.allow_loopback = allow_loopback
        self.host_map = host_map
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        # (name, port) -> (expiry, checked (address, port) targets, the one to try first leading)
        self.checked: dict[tuple[str, int], tuple[float, tuple[tuple[str, int], ...]]] = {}

    def targets(self, name: str, port: int) -> tuple[tuple[str, int], ...]:
        """The checked ``(address, port)`` targets of ``name:port``, resolved again once stale.
        Raises UnsafeURL, or requests.ConnectionError (from socket.gaierror) for a dead name."""
        entry = self.checked.get((name, port))
        if entry is None or entry[0] <= time.monotonic():
            try:
                infos = checked_addresses(name, port, self.allow_loopback, self.host_map)
            except socket.gaierror as exc:
                raise requests.ConnectionError(f"Failed to resolve {name!r} ({exc})") from exc
            entry = (time.monotonic() + ADDRESS_TTL_S, tuple((info[4][0], info[4][1]) for info in infos))
            self.checked[(name, port)] = entry
        return entry[1]

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        name, port = _name_and_port(request.url)
        address, target_port = self.targets(name, port)[0]
        if host_params["scheme"] == "https":
            pool_kwargs["server_hostname"] = name.rstrip(".")
        return {**host_params, "host": address, "port": target_port}, pool_kwargs

    def add_headers(self, request, **kwargs) -> None:
        # The pool's host is an address; the server must see the name (set on every hop, since
        # requests copies a request's headers when it follows a redirect itself).
        request.headers["Host"] = _host_header(request.url)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        key, tried = _name_and_port(request.url), set()
        while True:
            try:
                return super().send(request, stream, timeout, verify, cert, proxies)
            except requests.ConnectionError as exc:
                expiry, targets = self.checked.get(key, (0.0, ()))
                if not _failed_to_connect(exc) or not targets:
                    raise
                tried.add(targets[0])  # the target this attempt's pool was keyed by
                untried = tuple(t for t in targets if t not in tried)
                if not untried:
                    raise
                self.checked[key] = (expiry, untried + tuple(t for t in targets if t in tried))

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        raise UnsafeURL("proxies are not used for article fetching (they would bypass the address check)")

    __attrs__: ClassVar[list[str]] = [*HTTPAdapter.__attrs__, "allow_loopback", "host_map"]  # pickling keeps the policy


def make_safe_session(network: NetworkSettings, articles: ArticleSettings, pool_maxsize: int = 1) -> requests.Session:
    """A session for untrusted URLs: safe adapter on http and https, no proxies or .netrc from the
    environment, our User-Agent, and only the encodings the fetcher decodes itself."""
    session = make_session(network)  # our User-Agent; its plain adapters are replaced below
    session.trust_env = False
    session.headers.update(
        {
            "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1",
            "Accept-Encoding": "gzip, deflate",
        }
    )
    adapter = SafeHTTPAdapter(
        allow_loopback=articles.fetch_allow_loopback,
        host_map=HostMap.parse(articles.fetch_host_map),
        pool_connections=16,
        pool_maxsize=pool_maxsize,
        max_retries=0,
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
