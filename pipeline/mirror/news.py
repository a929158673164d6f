"""A news-site HTTP server on 127.0.0.1 for the article fetcher's tests, benchmark and demo.

``NewsServer(pages={"/a.html": "<html>…"}, root=None, latency_s=0.0)`` serves HTML pages from a dict
(path → str/bytes) and/or a directory, adds ``latency_s`` before every response (the benchmark's
200 ms per response), and offers hostile endpoints, each of which the fetcher must survive in
bounded time:

==========================  ====================================================================
path                        what the client gets
==========================  ====================================================================
``/hostile/huge``           200 text/html, Content-Length 50 MB, streamed until the client quits
``/hostile/huge-chunked``   the same 50 MB, chunked, no Content-Length (only a streaming cap helps)
``/hostile/gzip-bomb``      200 text/html, ``Content-Encoding: gzip``, ~130 KB inflating to 128 MB
``/hostile/slow-drip``      200 text/html, Content-Length 1 MB, 64 bytes every ``drip_interval_s``
``/hostile/stall``          nothing for ``stall_s``, then a page (a read timeout)
``/hostile/loop-a``         302 → ``/hostile/loop-b`` → 302 → ``/hostile/loop-a`` …
``/hostile/cookie-wall``    302 to itself with a Set-Cookie, then (with the cookie) a page: not a loop
``/hostile/chain/<n>``      302 → ``/hostile/chain/<n+1>``, forever (too many redirects)
``/hostile/to-metadata``    302 → ``http://169.254.169.254/latest/meta-data/``
``/hostile/to-file``        302 → ``file:///etc/passwd``
``/hostile/bad-gzip``       200 text/html, ``Content-Encoding: gzip``, a body that is not gzip
``/hostile/brotli``         200 text/html, ``Content-Encoding: br`` although we never ask for it
``/hostile/pdf``            200 application/pdf
``/hostile/no-type-binary`` 200 without Content-Type, binary body (sniffed: not HTML)
``/hostile/no-type-html``   200 without Content-Type, an HTML body (sniffed: HTML)
``/hostile/retry-after/…``  429 with ``Retry-After: retry_after_s`` the first ``retry_after_times``
                            requests of each such path, then a page
``/hostile/retry-after-long``  429 with ``Retry-After: 7200``, always
``/hostile/500``            500, always
``/hostile/404``            404
``/hostile/reset``          the connection reset (RST) before any response
``/hostile/reset-mid-body`` headers and half the body, then RST
``/redirect?to=<url>``      302 → ``<url>`` (e.g. another server, or ``/private/…``)
``/robots.txt``             ``robots_txt`` (default: ``Disallow: /private/``) with
                            ``robots_status`` (default 200); ``robots_txt=None`` → 404
``/private/…``              a page, but disallowed by the default robots.txt
==========================  ====================================================================

Every request is logged (``srv.requests``: time, method, path, status, bytes, host, user_agent);
``srv.count(path)`` counts requests for one path, and ``srv.max_in_flight`` is the largest number
of requests handled at once (to check per-host limits and the benchmark's real concurrency).
"""

from __future__ import annotations

import functools
import socket
import struct
import sys
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from pipeline.mirror.local import LocalServer, resolve_under

DEFAULT_ROBOTS = "User-agent: *\nDisallow: /private/\n"
METADATA_URL = "http://169.254.169.254/latest/meta-data/"
HUGE_BYTES = 50 * 2**20
BOMB_BYTES = 128 * 2**20
DRIP_BYTES = 2**20
_FILLER = (b"<p>" + b"lorem ipsum dolor sit amet " * 37 + b"</p>\n") * 64  # ~64 KB of HTML


def page_html(title: str, paragraphs: int = 5) -> bytes:
    body = "".join(f"<p>{title}: paragraph {i} of a generated news article.</p>" for i in range(paragraphs))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><article><h1>{title}</h1>{body}</article></body></html>").encode()


@functools.lru_cache(maxsize=2)
def gzip_bomb(inflated_bytes: int = BOMB_BYTES) -> bytes:
    """A gzip member of zeros inflating to ``inflated_bytes`` (made in 1 MB steps, never held whole)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * 2**20
    out = [comp.compress(block) for _ in range(inflated_bytes // len(block))]
    out.append(comp.flush())
    return b"".join(out)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # The benchmark runs 32+ concurrent clients; the default backlog of 5 would drop connects.
    request_queue_size = 128
    news: NewsServer

    def handle_error(self, request, client_address) -> None:
        """Quiet about clients that hang up (the fetcher drops hostile responses on purpose)."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, socket.timeout)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms per response), which would swamp a 200 ms latency benchmark.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args) -> None:
        """Silenced: ``NewsServer.requests`` is the log tests read."""

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        news = self.server.news
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        entry = {"time": time.time(), "method": self.command, "path": path, "query": parts.query, "status": None,
                 "bytes": 0, "host": self.headers.get("Host"), "user_agent": self.headers.get("User-Agent")}
        news.record(entry)  # on arrival, filled in as the response goes out (see serve.py)
        news.enter()
        try:
            if news.latency_s and news.wait(news.latency_s):
                self.close_connection = True
                return
            self._route(path, parts.query, send_body, entry)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout):
            self.close_connection = True  # the client gave up (as it should on hostile endpoints)
        finally:
            news.leave()

    # --- responses ---

    def _head(self, status: int, headers: dict[str, str], entry: dict) -> None:
        entry["status"] = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(self, status: int, data: bytes, content_type: str | None, entry: dict, send_body: bool,
              headers: dict[str, str] | None = None) -> None:
        all_headers = {"Content-Length": str(len(data))}
        if content_type:
            all_headers["Content-Type"] = content_type
        all_headers.update(headers or {})
        self._head(status, all_headers, entry)
        if send_body:
            self.wfile.write(data)
            entry["bytes"] = len(data)

    def _redirect(self, location: str, entry: dict, send_body: bool) -> None:
        self._send(302, b"", None, entry, send_body, {"Location": location})

    def _reset(self) -> None:
        # SO_LINGER 0 turns the close into a RST.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _stream(self, total: int, entry: dict, chunked: bool, interval_s: float = 0.0, chunk: bytes = _FILLER) -> None:
        news = self.server.news
        sent = 0
        while sent < total:
            piece = chunk[: total - sent]
            if chunked:
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                self.wfile.write(piece)
            sent += len(piece)
            entry["bytes"] = sent
            if interval_s and news.wait(interval_s):
                break
            if news.stopping:
                break
        if chunked and sent >= total:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = sent < total

    def _route(self, path: str, query: str, send_body: bool, entry: dict) -> None:
        news = self.server.news
        html = "text/html; charset=utf-8"
        if path == "/robots.txt":
            if news.robots_txt is None:
                return self._send(404, b"no robots.txt\n", "text/plain", entry, send_body)
            return self._send(news.robots_status, news.robots_txt.encode(), "text/plain", entry, send_body)
        if path == "/redirect":
            target = parse_qs(query).get("to", ["/"])[0]
            return self._redirect(target, entry, send_body)
        if path.startswith("/hostile/"):
            return self._hostile(path[len("/hostile/"):], entry, send_body)
        if path.startswith("/private/"):
            return self._send(200, page_html(f"private {path}"), html, entry, send_body)
        data = news.page(path)
        if data is None:
            return self._send(404, b"not found\n", "text/plain", entry, send_body)
        self._send(200, data, html, entry, send_body)

    def _hostile(self, name: str, entry: dict, send_body: bool) -> None:
        news = self.server.news
        html = "text/html; charset=utf-8"
        if name in ("huge", "huge-chunked"):
            chunked = name == "huge-chunked"
            headers = {"Content-Type": html}
            headers.update({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(HUGE_BYTES)})
            self._head(200, headers, entry)
            if send_body:
                self._stream(HUGE_BYTES, entry, chunked)
            return
        if name == "gzip-bomb":
            return self._send(200, gzip_bomb(), html, entry, send_body, {"Content-Encoding": "gzip"})
        if name == "slow-drip":
            self._head(200, {"Content-Type": html, "Content-Length": str(DRIP_BYTES)}, entry)
            if send_body:
                self._stream(DRIP_BYTES, entry, False, news.drip_interval_s, b"<p>" + b"d" * 57 + b"</p>")
            return
        if name == "stall":
            if news.wait(news.stall_s):
                self.close_connection = True
                return
            return self._send(200, page_html("stalled"), html, entry, send_body)
        if name == "cookie-wall":
            if "wall=passed" in (self.headers.get("Cookie") or ""):
                return self._send(200, page_html("behind the wall"), html, entry, send_body)
            return self._send(302, b"", None, entry, send_body,
                              {"Location": "/hostile/cookie-wall", "Set-Cookie": "wall=passed; Path=/"})
        if name == "loop-a":
            return self._redirect("/hostile/loop-b", entry, send_body)
        if name == "loop-b":
            return self._redirect("/hostile/loop-a", entry, send_body)
        if name.startswith("chain/"):
            n = int(name.split("/", 1)[1] or 0)
            return self._redirect(f"/hostile/chain/{n + 1}", entry, send_body)
        if name == "to-metadata":
            return self._redirect(METADATA_URL, entry, send_body)
        if name == "to-file":
            return self._redirect("file:///etc/passwd", entry, send_body)
        if name == "brotli":
            return self._send(200, b"\x1b\x03\x00\xf8\xa5\x10\x1c", html, entry, send_body, {"Content-Encoding": "br"})
        if name == "bad-gzip":
            return self._send(200, b"\x1f\x8b\x08\x00 this is not gzip at all", html, entry, send_body,
                              {"Content-Encoding": "gzip"})
        if name == "pdf":
            pdf = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n"
            return self._send(200, pdf, "application/pdf", entry, send_body)
        if name == "no-type-binary":
            return self._send(200, bytes(range(256)) * 8, None, entry, send_body)
        if name == "no-type-html":
            return self._send(200, page_html("sniffed"), None, entry, send_body)
        if name.startswith("retry-after/"):
            if news.hit(name) <= news.retry_after_times:
                return self._send(429, b"slow down\n", "text/plain", entry, send_body,
                                  {"Retry-After": str(news.retry_after_s)})
            return self._send(200, page_html(f"after 429 {name}"), html, entry, send_body)
        if name == "retry-after-long":
            return self._send(429, b"slow down\n", "text/plain", entry, send_body, {"Retry-After": "7200"})
        if name == "500":
            return self._send(500, b"server error\n", "text/plain", entry, send_body)
        if name == "404":
            return self._send(404, b"not found\n", "text/plain", entry, send_body)
        if name == "reset":
            return self._reset()
        if name == "reset-mid-body":
            data = page_html("cut", 400)
            self._head(200, {"Content-Type": html, "Content-Length": str(len(data))}, entry)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self._reset()
        self._send(404, b"no such hostile endpoint\n", "text/plain", entry, send_body)


class NewsServer(LocalServer):
    """Serve pages and hostile endpoints on 127.0.0.1 (``with NewsServer(...) as srv``)."""

    thread_name = "news"

    def __init__(self, pages: dict[str, str | bytes] | None = None, root: Path | None = None, *, port: int = 0,
                 latency_s: float = 0.0, robots_txt: str | None = DEFAULT_ROBOTS, robots_status: int = 200,
                 retry_after_times: int = 1, retry_after_s: int = 1, drip_interval_s: float = 0.1,
                 stall_s: float = 10.0):
        self.pages = {p: (v.encode() if isinstance(v, str) else v) for p, v in (pages or {}).items()}
        self.root = Path(root).resolve() if root is not None else None
        self.latency_s = latency_s
        self.robots_txt = robots_txt
        self.robots_status = robots_status
        self.retry_after_times = retry_after_times
        self.retry_after_s = retry_after_s
        self.drip_interval_s = drip_interval_s
        self.stall_s = stall_s
        self._hits: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0  # most requests handled at the same time (per-host limit checks)
        super().__init__(_HTTPServer(("127.0.0.1", port), _Handler))
        self._httpd.news = self

    def url_for(self, path: str) -> str:
        return self.url + path

    def page(self, path: str) -> bytes | None:
        if path in self.pages:
            return self.pages[path]
        if self.root is None:
            return None
        target = resolve_under(self.root, path)
        return target.read_bytes() if target is not None and target.is_file() else None

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def hit(self, key: str) -> int:
        """Count a request for ``key``; the count including this one."""
        with self._lock:
            self._hits[key] = self._hits.get(key, 0) + 1
            return self._hits[key]

    def count(self, path: str) -> int:
        return sum(1 for e in self.requests if e["path"] == path)
