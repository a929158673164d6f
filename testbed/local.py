"""What every test server of the project shares: a ThreadingHTTPServer on 127.0.0.1, run in a
background thread (``with Server(...) as srv``) or in the calling thread (``serve_forever``, for
the CLI), with a request log for assertions and a stop signal that wakes sleeping handlers."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path


def resolve_under(root: Path, relative: str) -> Path | None:
    """``root/relative``, or None when the path would leave ``root`` (traversal, NUL, backslash)."""
    relative = relative.lstrip("/")
    if "\\" in relative or "\0" in relative or ".." in relative.split("/"):
        return None
    target = (root / relative).resolve()
    return target if target.is_relative_to(root) else None


class LocalServer:
    thread_name = "server"

    def __init__(self, httpd: ThreadingHTTPServer):
        self._httpd = httpd
        self._lock = threading.Lock()  # guards the request log (and subclasses' counters)
        self._log: list[dict] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def requests(self) -> list[dict]:
        """The request log so far (one dict per request; fields depend on the server)."""
        with self._lock:
            return [dict(e) for e in self._log]

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def record(self, entry: dict) -> None:
        with self._lock:
            self._log.append(entry)

    def wait(self, seconds: float) -> bool:
        """Sleep, waking early when the server stops; True if it is stopping."""
        return self._stopping.wait(seconds)

    def start(self):
        # A short poll interval: stop() waits up to one interval, and tests start many servers.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self.thread_name}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (Ctrl-C raises KeyboardInterrupt)."""
        try:
            self._httpd.serve_forever()
        finally:
            self._stopping.set()
            self._httpd.server_close()

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in stalls, drips and latency
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
