"""An HTTP server for a generated mirror on 127.0.0.1, with faults injected on demand.

The downloader must survive what GDELT's server and the network do to it (404 for a listed file,
5xx, 429 with Retry-After, dropped connections, stalls, short or corrupted bodies), so tests
reproduce each of those against real sockets here, never against a mocked HTTP layer.

``MirrorServer(root)`` serves the files under ``root`` (``root/gdeltv2/...`` is what
``generate_mirror`` writes) at ``http://127.0.0.1:<port>/``. Files are read on every request, so
a test may rewrite ``masterfilelist.txt`` between runs. GET and HEAD, with a single
``Range: bytes=N-`` or ``bytes=N-M`` (206, or 416 when N is past the end), because the index
refresh asks for the tail of the master list only.

Faults: ``srv.faults.add(match, fault, times=None, **params)`` makes the next ``times`` requests
(every request when None) whose path contains ``match`` fail as ``fault``:

=================  ==========================================================  =================
fault              what the client sees                                        params (default)
=================  ==========================================================  =================
``404`` ``500``    that status, a short text body
``503`` ``429``    that status; ``Retry-After`` header when retry_after given  retry_after (429: 1)
``reset``          the connection closed (RST) with no response at all
``reset_mid_body`` full headers, half the body, then the connection closed
``slow``           the body in chunks with a pause before each                 delay_s (0.05),
                                                                               chunk_size (4096)
``stall``          nothing for delay_s, then the response (a read timeout)     delay_s (10)
``wrong_bytes``    200, right length, a few bytes changed (md5 mismatch)
``truncate``       200 with the first half only and a matching Content-Length
``empty``          200 with Content-Length 0
``gzip_bomb``      200 with ``Content-Encoding: gzip`` whatever the path or    inflated_bytes
                   Range: a few hundred KB inflating to that many zeros        (128 MiB)
=================  ==========================================================  =================

The same rules over HTTP: ``POST /_mirror/faults`` with a JSON list of
``{"match", "fault", "times", <params>...}`` objects, ``GET``/``DELETE /_mirror/faults``; and
``GET``/``DELETE /_mirror/requests`` for the request log (path, status, fault, time), which tests
assert on. Control requests are neither faulted nor logged.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from testbed.local import LocalServer, resolve_under
from testbed.news import BOMB_BYTES, gzip_bomb

CONTROL_PREFIX = "/_mirror/"
# Accepted params per fault; anything else is refused so a typo in a test cannot pass silently.
FAULTS: dict[str, frozenset[str]] = {
    "404": frozenset(),
    "500": frozenset(),
    "503": frozenset({"retry_after"}),
    "429": frozenset({"retry_after"}),
    "reset": frozenset(),
    "reset_mid_body": frozenset(),
    "slow": frozenset({"delay_s", "chunk_size"}),
    "stall": frozenset({"delay_s"}),
    "wrong_bytes": frozenset(),
    "truncate": frozenset(),
    "empty": frozenset(),
    "gzip_bomb": frozenset({"inflated_bytes"}),
}
_CONTENT_TYPES = {".zip": "application/zip", ".txt": "text/plain; charset=utf-8", ".json": "application/json"}
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class FaultRule:
    match: str  # substring of the request path
    fault: str
    times: int | None  # requests still to affect; None = all
    params: dict = field(default_factory=dict)
    hits: int = 0


def _rule(match: str, fault: str | int, times: int | None = None, **params) -> FaultRule:
    fault = str(fault)
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    unknown = set(params) - FAULTS[fault]
    if unknown:
        raise ValueError(f"fault {fault!r} takes no parameter(s) {', '.join(sorted(unknown))}")
    if times is not None and (not isinstance(times, int) or times < 1):
        raise ValueError(f"times must be a positive integer or None, not {times!r}")
    return FaultRule(str(match), fault, times, dict(params))


class FaultSet:
    """Thread-safe list of fault rules; the first live rule whose ``match`` is in the path wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(self, match: str, fault: str | int, times: int | None = None, **params) -> FaultRule:
        rule = _rule(match, fault, times, **params)
        with self._lock:
            self._rules.append(rule)
        return rule

    def load(self, specs: list[dict] | dict) -> None:
        """Add rules from JSON-style dicts ``{"match", "fault", "times", <params>...}``; all or
        none, so a rejected list leaves no half-applied faults behind."""
        rules = [_rule(**spec) for spec in ([specs] if isinstance(specs, dict) else specs)]
        with self._lock:
            self._rules.extend(rules)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, path: str) -> FaultRule | None:
        """The rule to apply to this request (its count consumed), or None."""
        with self._lock:
            for rule in self._rules:
                if rule.match in path and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    rule.hits += 1
                    return FaultRule(rule.match, rule.fault, rule.times, dict(rule.params), rule.hits)
        return None

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [asdict(rule) for rule in self._rules]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stalled handler must not keep the process alive
    mirror: MirrorServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as GDELT's server and requests sessions use
    server: _HTTPServer

    def log_message(self, format: str, *args) -> None:
        """Silenced: the mirror's own request log is what tests read."""

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def do_POST(self) -> None:
        self._control()

    def do_DELETE(self) -> None:
        self._control()

    # --- control endpoints ---

    def _control(self) -> None:
        mirror = self.server.mirror
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if path == CONTROL_PREFIX + "faults":
            if self.command == "POST":
                try:
                    mirror.faults.load(json.loads(body or b"[]"))
                except (ValueError, TypeError) as exc:  # bad JSON, unknown fault, bad params
                    return self._json(400, {"error": str(exc)})
            elif self.command == "DELETE":
                mirror.faults.clear()
            return self._json(200, mirror.faults.snapshot())
        if path == CONTROL_PREFIX + "requests" and self.command in ("GET", "HEAD", "DELETE"):
            if self.command == "DELETE":
                mirror.clear_requests()
            return self._json(200, mirror.requests)
        self._json(404, {"error": f"no control endpoint {self.command} {path}"})

    def _json(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    # --- files ---

    def _serve(self, send_body: bool) -> None:
        path = urlsplit(self.path).path
        if path.startswith(CONTROL_PREFIX):
            return self._control()
        mirror = self.server.mirror
        entry = {
            "time": time.time(),
            "method": self.command,
            "path": path,
            "range": self.headers.get("Range"),
            "status": None,
            "fault": None,
            "bytes": 0,
        }
        # Logged on arrival and filled in as the response goes out, so a client that has read its
        # whole response always finds the request in the log (recording afterwards raced it).
        mirror.record(entry)
        try:
            if mirror.latency_s:
                mirror.wait(mirror.latency_s)
            rule = mirror.faults.take(path)
            entry["fault"] = rule.fault if rule else None
            self._respond(rule, path, send_body, entry)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away (e.g. after its read timeout)

    def _respond(self, rule: FaultRule | None, path: str, send_body: bool, entry: dict) -> None:
        mirror = self.server.mirror
        fault = rule.fault if rule else None
        if fault == "stall":
            mirror.wait(float(rule.params.get("delay_s", 10)))
        if fault == "reset":
            # SO_LINGER 0 turns the close into a RST: the client gets no status line at all.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if fault in ("404", "500", "503", "429"):
            headers = {}
            if "retry_after" in rule.params or fault == "429":
                headers["Retry-After"] = str(rule.params.get("retry_after", 1))
            return self._send(
                int(fault), f"fault injected: {fault}\n".encode(), "text/plain", headers, send_body, entry
            )
        if fault == "gzip_bomb":  # what any server may answer a client that accepts gzip
            bomb = gzip_bomb(int(rule.params.get("inflated_bytes", BOMB_BYTES)))
            return self._send(200, bomb, "text/plain", {"Content-Encoding": "gzip"}, send_body, entry)

        target = mirror.resolve(path)
        if target is None:
            return self._send(403, b"forbidden\n", "text/plain", {}, send_body, entry)
        try:
            data = target.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return self._send(404, b"not found\n", "text/plain", {}, send_body, entry)
        content_type = _CONTENT_TYPES.get(target.suffix, "application/octet-stream")

        status, headers, size = 200, {"Accept-Ranges": "bytes"}, len(data)
        wanted = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        if wanted:
            first = int(wanted.group(1))
            last = min(int(wanted.group(2)) if wanted.group(2) else size - 1, size - 1)
            if first >= size:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, b"", content_type, headers, send_body, entry)
            if last >= first:  # an inverted range is invalid, and RFC 9110 says to ignore it
                status, data = 206, data[first : last + 1]
                headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        if fault == "wrong_bytes" and data:
            corrupt = bytearray(data)
            for pos in {len(data) // 3, len(data) // 2, (2 * len(data)) // 3}:
                corrupt[pos] ^= 0xFF
            data = bytes(corrupt)
        elif fault == "truncate":
            data = data[: len(data) // 2]
        elif fault == "empty":
            data = b""
        self._send(status, data, content_type, headers, send_body, entry, rule)

    def _send(
        self,
        status: int,
        data: bytes,
        content_type: str,
        headers: dict,
        send_body: bool,
        entry: dict,
        rule: FaultRule | None = None,
    ) -> None:
        entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not send_body:
            return
        fault = rule.fault if rule else None
        if fault == "reset_mid_body":
            entry["bytes"] = len(data) // 2
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True  # the rest never comes: the client sees a short body
        elif fault == "slow":
            delay = float(rule.params.get("delay_s", 0.05))
            chunk = int(rule.params.get("chunk_size", 4096))
            for offset in range(0, len(data), chunk):
                if self.server.mirror.wait(delay):
                    self.close_connection = True  # server stopping: abandon the response
                    return
                entry["bytes"] = offset + len(data[offset : offset + chunk])
                self.wfile.write(data[offset : offset + chunk])
        else:
            entry["bytes"] = len(data)
            self.wfile.write(data)


class MirrorServer(LocalServer):
    """Serve ``root`` on 127.0.0.1 in a background thread (``with MirrorServer(root) as srv``) or
    in the calling thread (``serve_forever``, for the CLI). ``port=0`` picks a free port.
    ``requests`` logs time, method, path, range, status (None when the connection was reset
    before a status), fault and bytes (body bytes sent)."""

    thread_name = "mirror"

    def __init__(self, root: Path, port: int = 0, latency_s: float = 0.0, faults_file: Path | None = None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"mirror directory {self.root} does not exist")
        self.latency_s = latency_s  # added before every file request
        self.faults = FaultSet()
        if faults_file is not None:
            self.faults.load(json.loads(Path(faults_file).read_text()))
        super().__init__(_HTTPServer(("127.0.0.1", port), _Handler))
        self._httpd.mirror = self

    @property
    def base_url(self) -> str:
        """Where GDELT's ``/gdeltv2`` lives on this mirror: the pipeline's GDELT base URL."""
        return f"{self.url}/gdeltv2"

    def resolve(self, url_path: str) -> Path | None:
        """The file for a URL path, or None when the path would leave the mirror directory."""
        return resolve_under(self.root, unquote(url_path))
