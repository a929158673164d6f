"""Article fetching: URL normalisation, outbound safety, robots.txt, hostile servers, the fetch
ledger and its retry schedule, and real concurrency — all against real sockets on 127.0.0.1."""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
import requests
import trustme

from pipeline.articles import safety
from pipeline.articles.checked_get import fetch_robots_txt
from pipeline.articles.fetch import fetch_article, fetch_articles, fetch_many, read_html
from pipeline.articles.ledger import (
    FETCH_LEDGER_SCHEMA,
    due_urls,
    empty_ledger,
    read_ledger,
    record_outcomes,
    summarize,
)
from pipeline.articles.outcome import FetchOutcome
from pipeline.articles.robots import RobotsCache
from pipeline.articles.safety import UnsafeURL, check_url, make_safe_session
from pipeline.articles.urls import normalize_url, url_md5
from pipeline.config import Settings
from pipeline.storage import DataLayout
from testbed.news import NewsServer, page_html

from .settings_builder import make_settings

NOW = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
PAGES = {f"/news/{i}.html": page_html(f"story {i}") for i in range(40)}


@pytest.fixture
def news():
    with NewsServer(PAGES, stall_s=5.0, drip_interval_s=0.1, retry_after_s=1) as srv:
        yield srv


@pytest.fixture
def fs(tmp_path: Path) -> Settings:
    """Fast, loopback-allowed settings: every hostile case ends within a couple of seconds."""
    return make_settings(
        data_dir=tmp_path / "data",
        fetch_allow_loopback=True,
        fetch_connect_timeout_s=1.0,
        fetch_read_timeout_s=1.0,
        fetch_deadline_s=2.0,
        fetch_attempts=2,
        fetch_backoff_base_s=0.01,
        fetch_backoff_max_s=1.5,
        fetch_concurrency=16,
        fetch_per_host=16,
        day_lock_timeout_s=10.0,
    )


def rows_by_url(ledger: pl.DataFrame) -> dict[str, dict]:
    return {row["url"]: row for row in ledger.iter_rows(named=True)}


# --- URL normalisation ---


def test_normalize_url_removes_only_cosmetic_differences():
    assert normalize_url("HTTP://News.Example.COM:80/a/B.html?utm_source=x&id=7&fbclid=1#top") == (
        "http://news.example.com/a/B.html?id=7"
    )
    assert normalize_url("https://ex.com:443") == "https://ex.com/"
    assert normalize_url("https://ex.com:8443/x?") == "https://ex.com:8443/x"
    assert normalize_url("http://ex.com./p?GCLID=a&UTM_Medium=b") == "http://ex.com/p"
    # path case, query order and percent-encoding are the server's business
    assert normalize_url("http://ex.com/A%2Fb?b=1&a=2") == "http://ex.com/A%2Fb?b=1&a=2"
    assert normalize_url("  not a url ") == "not a url"
    assert url_md5("http://EX.com/a#x") == url_md5("http://ex.com:80/a?utm_campaign=z")
    assert url_md5("http://ex.com/a?x=1&y=2") != url_md5("http://ex.com/a?y=2&x=1")


# --- outbound safety ---


@pytest.mark.parametrize(
    "url, reason",
    [
        ("file:///etc/passwd", "scheme"),
        ("ftp://example.com/a", "scheme"),
        ("gopher://example.com/", "scheme"),
        ("http://user:secret@example.com/", "credentials"),
        ("http://example.com@127.0.0.1/", "credentials"),
        ("http://127.0.0.1/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://10.0.0.8/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[fc00::1]/", "private"),  # IPv6 ULA
        ("http://[fd12:3456::1]/", "private"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://100.100.100.200/", "metadata"),
        ("http://224.0.0.1/", "multicast"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://100.64.0.1/", "non-global"),
        ("http://[::ffff:192.168.0.1]/", "embeds"),
        ("http:///nohost", "no host"),
    ],
)
def test_check_url_refuses(url, reason):
    with pytest.raises(UnsafeURL, match=reason):
        check_url(url, resolve=False)


def fake_dns(monkeypatch, table: dict[str, list[str]], calls: list | None = None):
    real = safety.resolve_host

    def resolve(host, port):
        if calls is not None:
            calls.append(host)
        if host not in table:
            return real(host, port)
        return [
            (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
            for ip in table[host]
        ]

    monkeypatch.setattr(safety, "resolve_host", resolve)


def test_every_resolved_address_is_checked(monkeypatch):
    fake_dns(monkeypatch, {"news.example": ["93.184.216.34"], "mixed.example": ["93.184.216.34", "10.1.2.3"]})
    check_url("http://news.example/a")
    check_url("https://[2606:4700:4700::1111]/", resolve=False)
    with pytest.raises(UnsafeURL, match=r"10.1.2.3"):
        check_url("http://mixed.example/a")


def test_hostname_resolving_to_loopback_needs_the_explicit_setting(news, fs):
    with pytest.raises(UnsafeURL, match="loopback"):
        check_url("http://localhost/")
    check_url("http://localhost/", allow_loopback=True)
    with pytest.raises(UnsafeURL, match="loopback"):
        check_url("http://2130706433/")  # 127.0.0.1 in decimal: caught after resolution

    strict = make_settings(fs, fetch_allow_loopback=False)
    outcome, body = fetch_article(
        make_safe_session(strict.network, strict.articles), f"http://localhost:{news.port}/news/1.html", strict.articles
    )
    assert (outcome.status, body) == ("blocked_unsafe", None)
    assert news.requests == []  # refused before a single byte was sent


def test_connection_goes_to_the_checked_address(news, fs, monkeypatch):
    """The adapter resolves once, checks, and connects to that answer (no second lookup that a
    rebinding DNS server could answer differently); Host header and URL keep the name."""
    calls: list[str] = []
    fake_dns(monkeypatch, {"pinned.example": ["127.0.0.1"], "evil.example": ["169.254.169.254"]}, calls)
    outcome, body = fetch_article(
        make_safe_session(fs.network, fs.articles), f"http://pinned.example:{news.port}/news/2.html", fs.articles
    )
    assert outcome.status == "fetched" and body == PAGES["/news/2.html"]
    assert news.requests[-1]["host"] == f"pinned.example:{news.port}"
    assert calls.count("pinned.example") == 1  # one keep-alive connection, one lookup

    # The connection layer refuses on its own, even when the URL check was skipped.
    session = make_safe_session(fs.network, fs.articles)
    with pytest.raises(UnsafeURL, match="metadata"):
        session.get(f"http://evil.example:{news.port}/", timeout=1)
    strict = make_settings(fs, fetch_allow_loopback=False)
    strict_session = make_safe_session(strict.network, strict.articles)
    with pytest.raises(UnsafeURL, match="loopback"):
        strict_session.get(f"http://pinned.example:{news.port}/news/2.html", timeout=1)


def test_a_new_answer_is_checked_again_when_the_old_one_expires(news, fs, monkeypatch):
    """DNS rebinding across requests: the name first answers with the site, later with the metadata
    address. The later answer is checked before anything connects to it."""
    answers = iter([["127.0.0.1"], ["169.254.169.254"]])
    monkeypatch.setattr(
        safety,
        "resolve_host",
        lambda host, port: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in next(answers)],
    )
    monkeypatch.setattr(safety, "ADDRESS_TTL_S", 0.0)
    session = make_safe_session(fs.network, fs.articles)
    url = f"http://rebind.example:{news.port}/news/5.html"
    assert session.get(url, timeout=2).content == PAGES["/news/5.html"]
    with pytest.raises(UnsafeURL, match="metadata"):
        session.get(url, timeout=2)
    assert [r["path"] for r in news.requests] == ["/news/5.html"]


def test_an_address_that_refuses_gives_way_to_the_next_checked_one(news, fs, monkeypatch):
    """A name with several addresses (an IPv6 one this machine cannot use, another that refuses)
    is fetched from the one that answers, which is tried first from then on; a mixed answer with
    one private address is refused before any of them is tried."""
    calls: list[str] = []
    fake_dns(
        monkeypatch,
        {"multi.example": ["::1", "127.0.0.2", "127.0.0.1"], "mixed.example": ["127.0.0.1", "10.1.2.3"]},
        calls,
    )
    session = make_safe_session(fs.network, fs.articles)
    url = f"http://multi.example:{news.port}/news/6.html"
    for _ in range(2):
        assert session.get(url, timeout=2).content == PAGES["/news/6.html"]
    assert session.get_adapter(url).targets("multi.example", news.port)[0] == ("127.0.0.1", news.port)
    assert calls == ["multi.example"]
    assert news.requests[-1]["host"] == f"multi.example:{news.port}"
    with pytest.raises(UnsafeURL, match=r"private address 10.1.2.3"):
        session.get(f"http://mixed.example:{news.port}/news/6.html", timeout=2)
    assert len(news.requests) == 2


def test_proxy_settings_are_never_used(news, fs, monkeypatch):
    """A proxy would resolve the name itself, after our check: proxy variables in the environment
    are ignored and an explicit proxy is refused."""
    with NewsServer({}) as proxy:
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(var, proxy.url)
        for var in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(var, raising=False)
        outcome, body = fetch_article(
            make_safe_session(fs.network, fs.articles), news.url_for("/news/7.html"), fs.articles
        )
        assert (outcome.status, body) == ("fetched", PAGES["/news/7.html"])
        with pytest.raises(UnsafeURL, match="proxies"):
            make_safe_session(fs.network, fs.articles).get(
                news.url_for("/news/7.html"), proxies={"http": proxy.url}, timeout=2
            )
        assert proxy.requests == []


@pytest.fixture
def tls_site():
    """An HTTPS server on 127.0.0.1 whose certificate, from a throwaway CA, names only secure.test.
    Yields the CA and the port, and records the SNI name and Host header of each connection."""
    ca = trustme.CA()
    seen: list[tuple[str, str | None]] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("secure.test").configure_cert(context)
    context.sni_callback = lambda _sock, name, _ctx: seen.append(("sni", name))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(("host", self.headers.get("Host")))
            body = page_html("over tls")
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield ca, httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_tls_is_verified_against_the_host_name_not_the_checked_address(tls_site, fs, tmp_path):
    """The socket goes to the checked address, but SNI, the Host header and certificate
    verification use the name: the same server under a name its certificate lacks is refused,
    and so is its certificate without our CA."""
    ca, port, seen = tls_site
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings = make_settings(fs, fetch_host_map=f"secure.test=127.0.0.1:{port},other.test=127.0.0.1:{port}")
    session = make_safe_session(settings.network, settings.articles)
    session.verify = str(ca_file)
    response = session.get("https://secure.test/a", timeout=5)
    assert response.status_code == 200 and b"over tls" in response.content
    assert seen == [("sni", "secure.test"), ("host", "secure.test")]
    with pytest.raises(requests.exceptions.SSLError, match=r"secure.test|other.test|hostname"):
        session.get("https://other.test/a", timeout=5)
    with pytest.raises(requests.exceptions.SSLError, match="certificate verify failed"):
        make_safe_session(settings.network, settings.articles).get("https://secure.test/a", timeout=5)
    assert [entry for entry in seen if entry[0] == "host"] == [("host", "secure.test")]


def test_unresolvable_host_is_a_dns_error_not_a_robots_block(fs, monkeypatch):
    real = safety.resolve_host

    def resolve(host, port):
        if host == "gone.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port)

    monkeypatch.setattr(safety, "resolve_host", resolve)
    for settings in (fs, make_settings(fs, fetch_respect_robots=False)):
        batch = fetch_many(["http://gone.example/story.html"], settings.dataset, settings.network, settings.articles)
        outcome = batch.outcomes[0]
        assert (outcome.status, outcome.retryable, outcome.error_class) == ("dns_error", True, "NameResolutionError")
        assert outcome.attempts <= 1  # a dead domain is not hammered within the run


# --- hostile servers ---

HOSTILE = {
    # path: (status, http_status, retry scheduled (True) / given up (False))
    "/hostile/huge": ("too_large", 200, False),
    "/hostile/huge-chunked": ("too_large", 200, False),
    "/hostile/gzip-bomb": ("too_large", 200, False),
    "/hostile/slow-drip": ("timeout", 200, True),
    "/hostile/stall": ("timeout", None, True),
    "/hostile/loop-a": ("redirect_loop", 302, False),
    "/hostile/chain/0": ("too_many_redirects", 302, False),
    "/hostile/to-metadata": ("blocked_unsafe", None, False),
    "/hostile/to-file": ("blocked_unsafe", None, False),
    "/hostile/pdf": ("not_html", 200, False),
    "/hostile/no-type-binary": ("not_html", 200, False),
    "/hostile/bad-gzip": ("decode_error", 200, False),
    "/hostile/brotli": ("decode_error", 200, False),
    "/hostile/retry-after-long": ("http_error", 429, True),
    "/hostile/500": ("http_error", 500, True),
    "/hostile/404": ("http_error", 404, False),
    "/hostile/reset": ("connection_error", None, True),
    "/hostile/reset-mid-body": ("connection_error", 200, True),
}


def wait_for(predicate, timeout_s: float = 2.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_hostile_servers_are_bounded_recorded_and_the_run_goes_on(news, fs):
    good = [
        "/news/1.html",
        "/news/2.html",
        "/hostile/no-type-html",
        "/hostile/retry-after/batch",
        "/hostile/cookie-wall",
    ]
    foreign = [
        "file:///etc/passwd",
        f"http://user:pw@127.0.0.1:{news.port}/news/3.html",
        "http://169.254.169.254/latest/meta-data/",
        "ftp://127.0.0.1/x",
    ]
    urls = [news.url_for(p) for p in [*HOSTILE, *good]] + foreign
    started = time.monotonic()
    run = fetch_articles(urls, fs.dataset, fs.network, fs.articles, now=NOW)
    elapsed = time.monotonic() - started
    assert elapsed < 6.0, f"a hostile server held the run for {elapsed:.1f}s"

    ledger = read_ledger(DataLayout(fs.dataset.data_dir))
    rows = rows_by_url(ledger)
    assert run.due == len(urls) == ledger.height
    for outcome in run.batch.outcomes:
        assert outcome.elapsed_s < 3.0, outcome  # each one bounded by the deadline/timeouts

    for path, (status, http_status, retried) in HOSTILE.items():
        row = rows[normalize_url(news.url_for(path))]
        assert (row["status"], row["http_status"]) == (status, http_status), (path, row)
        assert row["error_class"] and row["last_error"], path
        assert row["html_path"] is None and row["fetched_at"] is None
        assert row["gave_up"] is (not retried), path
        assert (row["next_retry_at"] is not None) is retried, path

    # the run went on: the good pages in the same batch were fetched and stored compressed
    layout = DataLayout(fs.dataset.data_dir)
    for path in good:
        row = rows[news.url_for(path)]
        assert row["status"] == "fetched" and row["http_status"] == 200, row
        assert row["html_path"] == f"raw_html/{row['url_md5'][:2]}/{row['url_md5']}.html.gz"
        assert gzip.decompress((fs.dataset.data_dir / row["html_path"]).read_bytes()) == read_html(
            layout, row["url_md5"]
        )
        assert row["bytes"] == len(read_html(layout, row["url_md5"])) and row["next_retry_at"] is None
    assert read_html(layout, url_md5(news.url_for("/news/1.html"))) == PAGES["/news/1.html"]

    for url in foreign:
        assert rows[normalize_url(url)]["status"] == "blocked_unsafe" and rows[normalize_url(url)]["gave_up"]
    assert "credentials" in rows[normalize_url(foreign[1])]["last_error"]

    # specifics
    meta = rows[news.url_for("/hostile/to-metadata")]
    assert meta["final_url"] == "http://169.254.169.254/latest/meta-data/" and "metadata" in meta["last_error"]
    assert "after decoding" in rows[news.url_for("/hostile/gzip-bomb")]["last_error"]
    assert "after decoding" in rows[news.url_for("/hostile/huge-chunked")]["last_error"]
    assert "Content-Length" in rows[news.url_for("/hostile/huge")]["last_error"]
    loop = rows[news.url_for("/hostile/loop-a")]
    assert loop["final_url"] == news.url_for("/hostile/loop-a")
    assert news.count("/hostile/chain/5") == 1 and news.count("/hostile/chain/6") == 0  # 5 redirects, no more
    # 429 with Retry-After: 1 was waited for (honoured), then the page came
    hits = [e["time"] for e in news.requests if e["path"] == "/hostile/retry-after/batch"]
    assert len(hits) == 2 and hits[1] - hits[0] >= 0.9
    assert rows[news.url_for("/hostile/retry-after/batch")]["attempts"] == 2
    # a Retry-After longer than we wait in a run defers the URL to a later run (not 1 h: 2 h)
    assert rows[news.url_for("/hostile/retry-after-long")]["next_retry_at"] == NOW + timedelta(hours=2)
    assert rows[news.url_for("/hostile/500")]["next_retry_at"] == NOW + timedelta(hours=1)
    assert rows[news.url_for("/hostile/500")]["attempts"] == 2  # retried in-run, then left for later
    assert news.count("/hostile/reset") == 2

    # the 50 MB bodies were abandoned early (the server logs a request once the client hung up)
    def huge():
        return [e for e in news.requests if e["path"].startswith("/hostile/huge")]

    assert wait_for(lambda: len(huge()) == 2)
    assert all(e["bytes"] < 50 * 2**20 for e in huge()), huge()

    counts = summarize(ledger)
    assert counts["urls"] == len(urls) and counts["fetched"] == len(good)
    assert counts["retry_pending"] == sum(1 for s in HOSTILE.values() if s[2])


def test_retry_after_is_honoured_then_the_page_arrives(news, fs):
    started = time.monotonic()
    outcome, body = fetch_article(
        make_safe_session(fs.network, fs.articles), news.url_for("/hostile/retry-after/solo"), fs.articles
    )
    assert outcome.status == "fetched" and outcome.attempts == 2 and body
    assert 0.9 <= time.monotonic() - started < 2.0


# --- robots.txt ---


def test_robots_honoured_cached_once_per_host_and_checked_on_every_hop(news, fs):
    with NewsServer(PAGES) as other:
        urls = [news.url_for(p) for p in list(PAGES)[:12]] + [
            news.url_for("/private/secret.html"),
            news.url_for(f"/redirect?to={other.url}/private/elsewhere.html"),
            news.url_for(f"/redirect?to={other.url}/news/5.html"),
        ]
        wide = make_settings(fs, fetch_per_host=8)
        batch = fetch_many(urls, wide.dataset, wide.network, wide.articles, now=NOW)
        out = batch.by_url()
        assert news.count("/robots.txt") == 1 and other.count("/robots.txt") == 1  # cached per host
        assert batch.robots_requests == 2
        blocked = out[news.url_for("/private/secret.html")]
        assert (blocked.status, blocked.error_class, blocked.retryable) == ("blocked_robots", "RobotsDisallowed", False)
        assert news.count("/private/secret.html") == 0
        hop = out[news.url_for(f"/redirect?to={other.url}/private/elsewhere.html")]
        assert hop.status == "blocked_robots" and hop.final_url == f"{other.url}/private/elsewhere.html"
        assert other.count("/private/elsewhere.html") == 0
        assert out[news.url_for(f"/redirect?to={other.url}/news/5.html")].status == "fetched"
        assert sum(o.status == "fetched" for o in batch.outcomes) == 13
        assert all(e["user_agent"] == fs.network.user_agent for e in news.requests)

        rude = make_settings(fs, fetch_respect_robots=False)
        ignored = fetch_many([news.url_for("/private/other.html")], rude.dataset, rude.network, rude.articles)
        assert ignored.outcomes[0].status == "fetched" and ignored.robots_requests == 0


def test_robots_unreachable_disallows_and_missing_allows(fs):
    with NewsServer(PAGES, robots_status=503) as down, NewsServer(PAGES, robots_txt=None) as missing:
        batch = fetch_many(
            [down.url_for("/news/1.html"), missing.url_for("/news/1.html")], fs.dataset, fs.network, fs.articles
        )
        out = batch.by_url()
        refused = out[down.url_for("/news/1.html")]
        assert (refused.status, refused.error_class, refused.retryable) == ("blocked_robots", "RobotsUnavailable", True)
        assert down.count("/news/1.html") == 0
        assert out[missing.url_for("/news/1.html")].status == "fetched"


def test_robots_cache_expires_after_its_ttl(news, fs):
    clock = [0.0]
    short = make_settings(fs, fetch_robots_ttl_s=60)
    robots = RobotsCache(short.network, short.articles, fetcher=fetch_robots_txt, clock=lambda: clock[0])
    session = make_safe_session(fs.network, fs.articles)
    assert robots.allowed(session, news.url_for("/news/1.html"))
    assert not robots.allowed(session, news.url_for("/private/x"))
    clock[0] = 59
    robots.allowed(session, news.url_for("/news/2.html"))
    assert news.count("/robots.txt") == 1
    clock[0] = 61
    robots.allowed(session, news.url_for("/news/2.html"))
    assert news.count("/robots.txt") == 2


# RFC 9309 cases the stdlib's urllib.robotparser got wrong (each case has at least one URL it
# answered the other way): (robots.txt, paths it allows, paths it refuses).
RFC9309_CASES = {
    "longest match wins (§2.2.2)": (
        "User-agent: *\nDisallow: /news/\nAllow: /news/public/\n",
        ["/news/public/a.html"],
        ["/news/a.html"],
    ),
    "$ anchors a rule to the end: only the home page is allowed (§2.2.3)": (
        "User-agent: *\nAllow: /$\nDisallow: /\n",
        ["/"],
        ["/news/1.html"],
    ),
    "* matches any characters, $ the end (§2.2.3)": (
        "User-agent: *\nDisallow: /*.pdf$\nDisallow: /*/print\n",
        ["/files/a.pdf?page=2", "/2024/story.html"],
        ["/files/a.pdf", "/2024/print/story.html"],
    ),
    "groups naming the same product token are merged (§2.2.1)": (
        "User-agent: mirai-pipeline\nDisallow: /a/\n\nUser-agent: mirai-pipeline\nDisallow: /b/\n",
        ["/c/x.html"],
        ["/a/x.html", "/b/x.html"],
    ),
    "a group for another crawler whose name is inside ours does not apply (§2.2.1)": (
        "User-agent: pipeline\nDisallow: /\n\nUser-agent: *\nDisallow: /private/\n",
        ["/news/1.html"],
        ["/private/x.html"],
    ),
    "an encoded reserved character is not its decoded self (§2.2.2, RFC 3986 §2.2)": (
        "User-agent: *\nDisallow: /a%2Fb\nDisallow: /c/d\n",
        ["/a/b", "/c%2Fd"],
        ["/a%2fb", "/c/d"],
    ),
}


@pytest.mark.parametrize("case", RFC9309_CASES)
def test_robots_rules_match_as_rfc_9309_says(news, fs, case):
    robots_txt, allowed, refused = RFC9309_CASES[case]
    news.robots_txt = robots_txt
    # Rule matching only: a 1 s timeout on a loaded machine would read as "unreachable" (disallow all).
    fs = make_settings(fs, fetch_connect_timeout_s=10.0, fetch_read_timeout_s=10.0, fetch_deadline_s=20.0)
    robots = RobotsCache(fs.network, fs.articles, fetcher=fetch_robots_txt)
    session = make_safe_session(fs.network, fs.articles)
    verdicts = {p: robots.check(session, news.url_for(p)) for p in allowed + refused}
    assert not any(v.unreachable for v in verdicts.values()), verdicts
    assert {p: v.allowed for p, v in verdicts.items()} == dict.fromkeys(allowed, True) | dict.fromkeys(refused, False)
    assert news.count("/robots.txt") == 1


def test_robots_groups_follow_a_configured_user_agent(news, fs):
    news.robots_txt = "\ufeffUser-agent: OtherBot\nDisallow: /news/\n\nUser-agent: *\nDisallow: /\n"
    session = make_safe_session(fs.network, fs.articles)
    other_bot = make_settings(fs, user_agent="otherbot/2.0 (+https://example.org/bot)")
    ours = RobotsCache(other_bot.network, other_bot.articles, fetcher=fetch_robots_txt)
    assert ours.allowed(session, news.url_for("/sport/1.html"))  # its group, read past a BOM
    assert not ours.allowed(session, news.url_for("/news/1.html"))
    theirs = RobotsCache(fs.network, fs.articles, fetcher=fetch_robots_txt)  # mirai-pipeline: the * group
    assert not theirs.allowed(session, news.url_for("/sport/1.html"))


# --- the ledger and its retry schedule ---


def failure(url: str, status: str = "timeout", retryable: bool = True, attempts: int = 2) -> FetchOutcome:
    url = normalize_url(url)
    return FetchOutcome(
        url=url, url_md5=url_md5(url), status=status, error_class="X", error="x", attempts=attempts, retryable=retryable
    )


def test_retry_schedule_widens_then_gives_up():
    schedule = Settings().articles.fetch_retry_schedule
    assert schedule == (timedelta(hours=1), timedelta(hours=6), timedelta(hours=24))
    url = "http://news.example/a"
    ledger = record_outcomes(empty_ledger(), [failure(url)], NOW, schedule)
    row = rows_by_url(ledger)[url]
    assert (row["next_retry_at"], row["tries"], row["attempts"]) == (NOW + timedelta(hours=1), 1, 2)
    assert row["gave_up"] is False
    assert due_urls(ledger, [url], NOW + timedelta(minutes=59)) == []  # not due before
    t1 = NOW + timedelta(hours=1)
    assert due_urls(ledger, [url], t1) == [url]  # due after

    ledger = record_outcomes(ledger, [failure(url)], t1, schedule)
    assert rows_by_url(ledger)[url]["next_retry_at"] == t1 + timedelta(hours=6)
    t2 = t1 + timedelta(hours=6)
    ledger = record_outcomes(ledger, [failure(url)], t2, schedule)
    assert rows_by_url(ledger)[url]["next_retry_at"] == t2 + timedelta(hours=24)
    t3 = t2 + timedelta(hours=24)
    ledger = record_outcomes(ledger, [failure(url)], t3, schedule)
    row = rows_by_url(ledger)[url]
    assert (row["gave_up"], row["next_retry_at"], row["tries"], row["attempts"]) == (True, None, 4, 8)
    assert row["first_tried_at"] == NOW and row["last_tried_at"] == t3
    assert due_urls(ledger, [url], t3 + timedelta(days=365)) == []  # given up for good
    assert ledger.schema == FETCH_LEDGER_SCHEMA and ledger.height == 1


def test_final_statuses_give_up_at_once_and_fetched_stays_fetched():
    schedule = Settings().articles.fetch_retry_schedule
    final = failure("http://a.example/x", "not_html", retryable=False)
    ledger = record_outcomes(empty_ledger(), [final], NOW, schedule)
    assert rows_by_url(ledger)["http://a.example/x"]["gave_up"] is True
    ok = FetchOutcome(
        url="http://a.example/y",
        url_md5=url_md5("http://a.example/y"),
        status="fetched",
        http_status=200,
        attempts=1,
        bytes=10,
        html_path="raw_html/xx/y.html.gz",
    )
    ledger = record_outcomes(ledger, [ok], NOW, schedule)
    # a concurrent run's late failure for the same URL does not undo the fetch
    ledger = record_outcomes(ledger, [failure("http://a.example/y")], NOW, schedule)
    row = rows_by_url(ledger)["http://a.example/y"]
    assert row["status"] == "fetched" and row["html_path"] == "raw_html/xx/y.html.gz" and row["next_retry_at"] is None
    assert due_urls(ledger, ["http://A.example/y#frag", "http://a.example/z"], NOW + timedelta(days=9)) == [
        "http://a.example/z"
    ]


def test_fetched_once_ever_across_days_and_failures_wait_for_their_retry(news, fs):
    day1 = [news.url_for("/news/1.html?utm_source=gdelt"), news.url_for("/news/2.html"), news.url_for("/hostile/500")]
    run1 = fetch_articles(day1, fs.dataset, fs.network, fs.articles, now=NOW)
    assert (run1.due, run1.batch.counts()["fetched"]) == (3, 2)

    day2 = [
        f"HTTP://127.0.0.1:{news.port}/news/1.html#comments",
        news.url_for("/news/2.html"),
        news.url_for("/hostile/500"),
        news.url_for("/news/3.html"),
    ]
    run2 = fetch_articles(day2, fs.dataset, fs.network, fs.articles, now=NOW + timedelta(minutes=10))
    assert (run2.due, run2.already_fetched, run2.waiting) == (1, 2, 1)
    assert news.count("/news/1.html") == 1 and news.count("/news/2.html") == 1  # fetched once ever
    assert news.count("/hostile/500") == 2  # day 1's two attempts only: not due yet

    run3 = fetch_articles(day2, fs.dataset, fs.network, fs.articles, now=NOW + timedelta(hours=1))
    assert run3.due == 1 and news.count("/hostile/500") == 4
    row = rows_by_url(read_ledger(DataLayout(fs.dataset.data_dir)))[news.url_for("/hostile/500")]
    assert (row["tries"], row["attempts"], row["next_retry_at"]) == (2, 4, NOW + timedelta(hours=7))


# --- concurrency ---


def test_32_concurrent_requests_really_run_in_parallel(fs):
    with NewsServer(PAGES, latency_s=0.2) as slow:
        urls = [slow.url_for(p) for p in list(PAGES)[:32]]
        started = time.monotonic()
        wide = make_settings(fs, fetch_concurrency=32, fetch_per_host=32, fetch_deadline_s=10)
        batch = fetch_many(urls, wide.dataset, wide.network, wide.articles)
        elapsed = time.monotonic() - started
        assert batch.counts()["fetched"] == 32
        assert elapsed < 1.5, f"32 × 200 ms took {elapsed:.2f}s: requests were serialised"
        assert slow.max_in_flight >= 24


def test_per_host_limit_holds_while_other_hosts_proceed(fs, monkeypatch):
    # The limit is per host name (two ports of 127.0.0.1 are one host), so give each server a name.
    fake_dns(monkeypatch, {"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]})
    with NewsServer(PAGES, latency_s=0.2) as a, NewsServer(PAGES, latency_s=0.2) as b:
        urls = [f"http://a.example:{a.port}{p}" for p in list(PAGES)[:6]]
        urls += [f"http://b.example:{b.port}{p}" for p in list(PAGES)[:6]]
        started = time.monotonic()
        capped = make_settings(fs, fetch_concurrency=16, fetch_per_host=2, fetch_respect_robots=False)
        batch = fetch_many(urls, capped.dataset, capped.network, capped.articles)
        elapsed = time.monotonic() - started
        assert batch.counts()["fetched"] == 12
        assert a.max_in_flight == 2 and b.max_in_flight == 2
        assert 0.55 < elapsed < 1.2  # 3 rounds of 200 ms per host, both hosts at once


# --- settings ---


def test_fetch_settings_from_env():
    s = Settings.from_env(
        {
            "MIRAI_FETCH_ALLOW_LOOPBACK": "yes",
            "MIRAI_FETCH_RESPECT_ROBOTS": "0",
            "MIRAI_FETCH_RETRY_SCHEDULE_H": "0.5, 2",
            "MIRAI_FETCH_MAX_BYTES": "1000",
        }
    )
    assert (s.articles.fetch_allow_loopback, s.articles.fetch_respect_robots, s.articles.fetch_max_bytes) == (
        True,
        False,
        1000,
    )
    assert s.articles.fetch_retry_schedule == (timedelta(minutes=30), timedelta(hours=2))
    defaults = Settings()
    assert (defaults.articles.fetch_allow_loopback, defaults.articles.fetch_respect_robots) == (False, True)
    assert defaults.articles.fetch_max_bytes == 5 * 2**20
    with pytest.raises(ValueError, match="MIRAI_FETCH_ALLOW_LOOPBACK"):
        Settings.from_env({"MIRAI_FETCH_ALLOW_LOOPBACK": "maybe"})
    with pytest.raises(ValueError, match="MIRAI_FETCH_RETRY_SCHEDULE_H"):
        _ = make_settings(fetch_retry_schedule_h="1,soon").articles.fetch_retry_schedule
