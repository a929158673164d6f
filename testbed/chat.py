"""A scripted OpenAI-compatible chat endpoint on 127.0.0.1, for the concurrency tests and
bench/evaluate_llm.py: ``POST /v1/chat/completions`` answers with ``policy(messages)`` after
``latency_s``, with a deterministic ``usage`` (characters / 4), so that a run against it gives
the same trajectories whatever order its requests arrive in. It counts requests, the most in
flight at once, can answer the first requests with a status (429 with a Retry-After, say), and
can hold requests past a number until ``release()`` (to kill a client mid-run at a known point),
and can make its next requests wait for each other (``gather``: overlap shown without timing).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Policy = Callable[[list[dict]], str]


def _assistant_turns(messages: list[dict]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _answer(messages: list[dict]) -> str:
    """A second-level CAMEO code that depends only on the query (the first user message)."""
    query = next(m["content"] for m in messages if m["role"] == "user")
    code = int(hashlib.sha256(query.encode()).hexdigest(), 16) % 20 + 1
    return json.dumps({f"{code:02d}": [f"{code:02d}0"]})


def react_policy(messages: list[dict]) -> str:
    """Native ReAct in two or three turns: an invalid action (no sandbox), then, for queries whose
    answer code is even, a real API call (a sandbox), then the final answer."""
    answer = _answer(messages)
    turns = _assistant_turns(messages)
    if turns == 0:
        return "Thought: I should look first.\nAction: look at the news"
    if turns == 1 and int(json.loads(answer).popitem()[0]) % 2 == 0:
        return 'Thought: count them.\nAction: count_events(head_entities=["USA"])'
    return f"Thought: enough.\nAction: Final Answer: {answer}"


def null_action_policy(messages: list[dict]) -> str:
    """Mode mirai with only empty actions (not run, not counted as invalid): an episode makes
    max_steps requests and one answer extraction, and never starts a sandbox. The answer sits in
    the thought, where the extraction finds it."""
    return f"Thought: <answer>{_answer(messages)}</answer> noted.\nAction:"


class ChatServer:
    def __init__(
        self,
        policy: Policy = react_policy,
        *,
        latency_s: float = 0.0,
        failures: list[tuple[int, dict[str, str]]] | None = None,
        fail_when: Callable[[list[dict]], int | tuple[int, dict[str, str]] | None] | None = None,
        hold_after: int | None = None,
    ):
        self.policy, self.latency_s = policy, latency_s
        self.failures = list(failures or [])  # (status, headers) answered to the first requests
        self.fail_when = fail_when  # a status (or status and headers) for a conversation, e.g. 400 for one query
        self.hold_after = hold_after
        self._gather_until = self._gather = 0
        self.requests = 0
        self.in_flight = self.max_in_flight = self.held = 0
        self._lock = threading.Condition()
        self._release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a requests session uses
            # Headers and body go out as two writes: with Nagle's algorithm the body would wait
            # for the client's delayed ACK (~40 ms a reply on Linux), which real servers do not add.
            disable_nagle_algorithm = True

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer._serve(self, body)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self.httpd = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def _serve(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        with self._lock:
            self.requests += 1
            number = self.requests
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            failure = self.failures.pop(0) if self.failures else None
            hold = self.hold_after is not None and number > self.hold_after
            self.held += hold
            self._lock.notify_all()
            if number <= self._gather_until:  # a sequential client would wait 30 s here
                self._lock.wait_for(lambda: self.max_in_flight >= self._gather, timeout=30)
        try:
            if hold:
                self._release.wait()
            if self.latency_s:
                time.sleep(self.latency_s)
            messages = body["messages"]
            status = self.fail_when(messages) if self.fail_when else None
            if failure is not None:
                status, headers = failure
                self._send(handler, status, {"error": "scripted failure"}, headers)
            elif status is not None:
                status, headers = status if isinstance(status, tuple) else (status, {})
                self._send(handler, status, {"error": "scripted failure"}, headers)
            else:
                text = self.policy(messages)
                usage = {
                    "prompt_tokens": sum(len(m["content"]) for m in messages) // 4,
                    "completion_tokens": len(text) // 4,
                }
                self._send(handler, 200, {"choices": [{"message": {"content": text}}], "usage": usage}, {})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed
        finally:
            with self._lock:
                self.in_flight -= 1

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def gather(self, n: int) -> None:
        """The next ``n`` requests wait (up to 30 s) until ``n`` are in flight at once: a concurrent
        client shows its overlap in ``max_in_flight`` (reset here) without any timing."""
        with self._lock:
            self.max_in_flight = self.in_flight
            self._gather, self._gather_until = n, self.requests + n

    def release(self) -> None:
        """Answer the held requests (and every later one)."""
        self.hold_after = None
        self._release.set()

    def close(self) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ChatServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def api_calls_policy(steps: int) -> Policy:
    """Native ReAct with a real API call (a sandbox round trip) in each of the first ``steps`` - 1
    turns, two calls alternating so that none is a repeat, then the final answer: ``steps``
    requests per episode."""

    def policy(messages: list[dict]) -> str:
        turns = _assistant_turns(messages)
        if turns >= steps - 1:
            return f"Thought: enough.\nAction: Final Answer: {_answer(messages)}"
        entity = ("head_entities", "tail_entities")[turns % 2]
        return f'Thought: count.\nAction: count_events({entity}=["USA"])'

    return policy


def main() -> None:
    """``python -m testbed.chat --policy null --latency 0.2``: serve until stdin closes, having
    printed the base URL (bench/evaluate_llm.py runs it apart, so its CPU is not the harness's)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", choices=("react", "null", "calls"), default="react")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    policy = {"react": react_policy, "null": null_action_policy, "calls": api_calls_policy(args.steps)}[args.policy]
    with ChatServer(policy, latency_s=args.latency) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()
        print(server.requests, server.max_in_flight, flush=True)


if __name__ == "__main__":
    main()
