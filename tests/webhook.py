"""A webhook endpoint on 127.0.0.1 for the alert tests: the real HTTP POSTs the sensors send."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "T0KEN-s3cr3t-4242"


class Receiver:
    """A webhook endpoint: records every JSON body; answers `fail_next` requests with 503 first,
    or every request with `status` when set."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.requests = 0
        self.fail_next = 0
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.requests += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.fail_next:
                    receiver.fail_next -= 1
                    code = 503
                else:
                    code = receiver.status
                    if code == 200:
                        receiver.bodies.append(json.loads(body))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/{TOKEN}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
