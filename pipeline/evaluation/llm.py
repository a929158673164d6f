"""The chat client of LLM agents: an OpenAI-compatible HTTP endpoint. A local GGUF model is asked
through the same client, at llama-cpp-python's server in a child process (model_server.py). It
takes a list of chat messages and returns a ``Reply`` with the text, the tokens in and out and the
wall time of the call, which the harness stores per step.

The API key of an endpoint is read from the environment variable the registry names, at call
time, and never appears in a log line, an exception or a stored record.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import requests
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from pipeline.evaluation.throughput import RateLimiter, estimate_tokens
from pipeline.http import backoff_wait, parse_retry_after

DEFAULT_MAX_TOKENS = 1024
DEFAULT_N_CTX = 8192  # of a GGUF model: SmolLM2 and Llama-3.1-class models all handle 8k; capped by the model's own
DEFAULT_SEED = 0
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
UNAVAILABLE_STATUSES = frozenset({401, 403, 404})  # bad key, no access, unknown model or URL


class LLMError(RuntimeError):
    """The model could not produce this reply (after retries); the message never holds the key.
    The episode ends in state "error" and the evaluation goes on. ``unanswered`` says why no
    answer came, when none did: "timeout" or "connection" (refused or cut); None when the server
    answered with an error. ``transport``: no completion came through (no answer, a status the
    client retries, such as 429 and 5xx, until its attempts ran out, or a body that is not a
    completion), so asking again later may well succeed; False when the endpoint refused this
    request (another 4xx, e.g. a prompt over its context). Default: whether no answer came."""

    def __init__(self, message: str, *, unanswered: str | None = None, transport: bool | None = None):
        super().__init__(message)
        self.unanswered = unanswered
        self.transport = unanswered is not None if transport is None else transport


class _Failure(Exception):
    """One failed call: retried (tenacity) when ``retryable``, waiting ``retry_after_s`` if the
    server said so; the message never holds the key."""

    def __init__(
        self, problem: str, *, retryable: bool, retry_after_s: float | None = None, unanswered: str | None = None
    ):
        super().__init__(problem)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.unanswered = unanswered


class ModelUnavailable(RuntimeError):
    """The model cannot be used at all (no key, a rejected key, an unknown model, no GGUF file, a
    model server that will not start or died twice): the evaluation stops instead of storing a run
    of failed episodes."""


@dataclass(frozen=True)
class Reply:
    text: str
    tokens_in: int
    tokens_out: int
    latency_s: float  # wall time of the call, retries and waits included


class ChatClient(Protocol):
    """What the harness needs from a model: one chat completion per call; ``close`` frees what
    the client holds (connections, a model server)."""

    def chat(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, stop: list[str]
    ) -> Reply: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HttpSettings:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # a long completion streams nothing until it is done
    attempts: int = 5
    backoff_base_s: float = 2.0
    backoff_max_s: float = 60.0


class OpenAIChatClient:
    """``POST {base_url}/chat/completions`` of any OpenAI-compatible server (OpenAI, vLLM,
    llama.cpp's server, Ollama, ...). Retries connection errors, timeouts, 408/409/425/429 and 5xx
    (tenacity) with exponential backoff and jitter, honouring a Retry-After up to ``backoff_max_s``
    (``pipeline.http.backoff_wait``). With a ``limiter`` every attempt first waits for the
    endpoint's requests/tokens per minute, and a 429 pauses every thread sharing it
    (``throughput.RateLimiter``). Safe to share between threads: each has its own session
    (connection pool) unless one is given. ``api_key`` is a key the harness made itself (a local
    model server's), sent instead of ``api_key_env``'s; ``extra_body`` adds fields beyond OpenAI's
    to every request; ``trust_env`` False ignores the environment's proxies and .netrc (for a
    server on this machine, whose key no proxy may see)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None,
        *,
        seed: int = DEFAULT_SEED,
        http: HttpSettings = HttpSettings(),
        session: requests.Session | None = None,
        limiter: RateLimiter | None = None,
        api_key: str | None = None,
        extra_body: Mapping[str, object] | None = None,
        trust_env: bool = True,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.seed = seed
        self.http = http
        self.limiter = limiter
        self.extra_body = dict(extra_body or {})
        self.trust_env = trust_env
        self._api_key = api_key
        self._session = session
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._sessions_lock = threading.Lock()

    @property
    def session(self) -> requests.Session:
        if self._session is not None:
            return self._session
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
            self._local.session.trust_env = self.trust_env
            with self._sessions_lock:
                self._sessions.append(self._local.session)
        return self._local.session

    def close(self) -> None:
        """Closes the connection pools this client opened (a session handed to it stays open)."""
        with self._sessions_lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """Raise ModelUnavailable unless the endpoint answers at all (``GET {base_url}/models``,
        once, no retries): a run against a server that is not there says so before its first
        episode. Any HTTP answer counts (a server without /models answers 404); 401 and 403 say
        the key is refused."""
        base = self.url.removesuffix("/chat/completions")
        try:
            response = self.session.get(base + "/models", headers=self._headers(), timeout=timeout_s)
        except requests.RequestException as exc:
            reason = type(exc).__name__ if not str(exc) else str(exc).splitlines()[0][:160]
            raise ModelUnavailable(f"the endpoint {base} does not answer ({reason}); is the server running?") from None
        if response.status_code in (401, 403):
            raise ModelUnavailable(f"the endpoint {base} refused the key: HTTP {response.status_code}")

    def _headers(self) -> dict[str, str]:
        if self._api_key is not None:
            return {"Authorization": f"Bearer {self._api_key}"}
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ModelUnavailable(f"environment variable {self.api_key_env} (the endpoint's api_key_env) is not set")
        return {"Authorization": f"Bearer {key}"}

    def chat(self, messages, *, temperature, max_tokens, stop) -> Reply:
        payload = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stop": stop or None,
            "seed": self.seed,
            **self.extra_body,
        }
        started = time.perf_counter()
        attempts = 0
        estimate = estimate_tokens(messages, max_tokens)

        def attempt() -> Reply:
            nonlocal attempts
            attempts += 1
            entry = self.limiter.acquire(estimate) if self.limiter else None
            try:
                response = self.session.post(
                    self.url,
                    json=payload,
                    headers=self._headers(),
                    timeout=(self.http.connect_timeout_s, self.http.read_timeout_s),
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                unanswered = "timeout" if isinstance(exc, requests.Timeout) else "connection"
                raise _Failure(type(exc).__name__, retryable=True, unanswered=unanswered) from exc
            if response.status_code == 200:
                reply = self._reply(response, started)
                if self.limiter:
                    self.limiter.settle(entry, reply.tokens_in + reply.tokens_out or estimate)
                    self.limiter.succeeded()
                return reply
            problem = f"HTTP {response.status_code}: {response.text[:300]}"
            if response.status_code in UNAVAILABLE_STATUSES:
                raise ModelUnavailable(f"{self.model} at {self.url}: {problem}")
            delay = parse_retry_after(response.headers.get("Retry-After"))
            if response.status_code == 429 and self.limiter:
                self.limiter.throttled(delay)
                # The limiter's pause holds this caller's retry too (in acquire), as it holds every
                # other caller: one place waits, and counts the wait for the run's report.
                delay = 0.0
            raise _Failure(problem, retryable=response.status_code in RETRY_STATUSES, retry_after_s=delay)

        retrying = Retrying(
            stop=stop_after_attempt(max(1, self.http.attempts)),
            wait=backoff_wait(self.http.backoff_base_s, self.http.backoff_max_s),
            retry=retry_if_exception(lambda exc: isinstance(exc, _Failure) and exc.retryable),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Failure as exc:
            raise LLMError(
                f"{self.model} at {self.url}: {exc} (after {attempts} attempt(s))",
                unanswered=exc.unanswered,
                transport=exc.retryable,
            ) from None

    def _reply(self, response: requests.Response, started: float) -> Reply:
        try:
            body = response.json()
            text = body["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError(
                f"{self.model}: malformed completion ({type(exc).__name__}): {response.text[:300]}", transport=True
            ) from exc
        usage = body.get("usage") or {}
        return Reply(
            text,
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
            time.perf_counter() - started,
        )


@dataclass(frozen=True)
class ClientSettings:
    """Run-time knobs that are not part of an agent's registry entry (recorded with each run)."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    n_ctx: int = DEFAULT_N_CTX
    n_threads: int | None = None
    seed: int = DEFAULT_SEED
    http: HttpSettings = HttpSettings()
