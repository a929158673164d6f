"""A hostile S3 endpoint (docs/releases.md, "Threat model"): whoever runs the endpoint a release
store names controls every byte of every response, not only the objects. botocore reads the body
of every error and of every non-streaming reply (a listing page) whole into memory; an endpoint
answering with an endless body must be refused past pipeline.release.s3_store.MAX_RESPONSE_BYTES
in one line, with the process's memory bounded and nothing written. Served by a real HTTP server
on 127.0.0.1; each command runs in a child process whose address space is capped, so an unbounded
read shows as a MemoryError there instead of taking the test machine's memory."""

from __future__ import annotations

import http.server
import os
import resource
import socketserver
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ADDRESS_SPACE = 2 * 2**30  # far over what the command needs (~0.2 GB), far under an endless body


class _Endless(http.server.BaseHTTPRequestHandler):
    """Every request: the server's status, a Content-Length of 8 GiB and bytes until the client stops."""

    protocol_version = "HTTP/1.1"
    status = 500

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(8 * 2**30))
        self.end_headers()
        chunk = b"<Error><Code>InternalError</Code><Message>" + b"A" * 2**20
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(params=[500, 403, 200])
def endpoint(request):
    handler = type("Handler", (_Endless,), {"status": request.param})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _run(endpoint: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "MIRAI_S3_ENDPOINT_URL": endpoint,
        "MIRAI_S3_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    return subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, preexec_fn=_capped
    )


def test_mirai_download_refuses_an_endless_response_body(endpoint, tmp_path):
    dest = tmp_path / "releases"
    done = _run(
        endpoint, tmp_path, "-m", "pipeline.cli", "download", "latest", "--from", "s3://b/p", "--dest", str(dest)
    )
    lines = [line for line in done.stderr.splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(lines) == 1 and "MemoryError" not in lines[0], done.stderr[-2000:]
    # An error body is refused by the cap on what botocore reads whole; a 200 body of
    # latest.json (a streamed GetObject) by get_bytes' own limit on a pointer.
    assert "over 8,388,608 bytes" in lines[0] or "over 16,777,216 bytes" in lines[0], lines[0]
    assert not dest.exists() or not any(dest.rglob("*"))


LIST = """
import sys
from pipeline.config import Settings
from pipeline.release.layout import ReleaseError
from pipeline.release.store_uri import open_store
settings = Settings.from_env()
store = open_store(settings.dataset, settings.network, settings.release, uri="s3://b/p")
try:
    store.list_keys("submissions/", max_keys=10)
except ReleaseError as exc:
    print(f"refused: {exc}")
"""


def test_a_listing_with_an_endless_body_is_refused(endpoint, tmp_path):
    """What the submissions sensor and the live history index list: one page, read whole by botocore."""
    done = _run(endpoint, tmp_path, "-c", LIST)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: ") and len(done.stdout.splitlines()) == 1, done.stdout
    assert "over 8,388,608 bytes" in done.stdout, done.stdout
