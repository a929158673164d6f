"""The chat client of LLM agents: an OpenAI-compatible HTTP endpoint. A local GGUF model is asked
through the same client, at llama-cpp-python's server in a child process (model_server.py). It
takes a list of chat messages and returns a ``Reply`` with the text, the tokens in and out and the
wall time of the call, which the harness stores per step.

The API key of an endpoint is read from the environment variable the registry names, at call
time, and never appears in a log line, an exception or a stored record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

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
    llama.cpp's server, Ollama, ...), through the ``openai`` client with its own retries off:
    retries are ours (tenacity), for connection errors, timeouts, 408/409/425/429 and 5xx, with
    exponential backoff and jitter, honouring a Retry-After up to ``backoff_max_s``
    (``pipeline.http.backoff_wait``), so that with a ``limiter`` every attempt first waits for the
    endpoint's requests/tokens per minute and a 429 pauses every thread sharing it
    (``throughput.RateLimiter``). Safe to share between threads (one connection pool). ``api_key``
    is a key the harness made itself (a local model server's), sent instead of ``api_key_env``'s;
    ``extra_body`` adds fields beyond OpenAI's to every request; ``trust_env`` False ignores the
    environment's proxies and .netrc (for a server on this machine, whose key no proxy may see).

    ``openai`` is imported by the methods that use it, not by this module: every Dagster process
    (webserver, daemon, each run worker) imports the module through the definitions, and the
    package's import is about 0.8 s of a process's ~2.6 s start, for processes that mostly never
    call a model."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None,
        *,
        seed: int = DEFAULT_SEED,
        http: HttpSettings = HttpSettings(),
        limiter: RateLimiter | None = None,
        api_key: str | None = None,
        extra_body: Mapping[str, object] | None = None,
        trust_env: bool = True,
    ):
        import openai  # imported on first use (the class docstring says why)

        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.seed = seed
        self.http = http
        self.limiter = limiter
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key
        self._client = openai.OpenAI(
            # The key goes in each request's headers (read at call time, see _headers); this one
            # only satisfies the client's check that some key is configured, and is never sent.
            api_key="sent-per-request",
            base_url=self.base_url,
            max_retries=0,
            timeout=openai.Timeout(http.read_timeout_s, connect=http.connect_timeout_s),
            http_client=openai.DefaultHttpxClient(trust_env=trust_env),
        )

    def close(self) -> None:
        """Closes the client's connection pool."""
        self._client.close()

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """Raise ModelUnavailable unless the endpoint answers at all (``GET {base_url}/models``,
        once, no retries): a run against a server that is not there says so before its first
        episode. Any HTTP answer counts (a server without /models answers 404); 401 and 403 say
        the key is refused."""
        import openai  # imported on first use (the class docstring says why)

        try:
            self._client.models.with_raw_response.list(extra_headers=self._headers(), timeout=timeout_s)
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            reason = str(cause).splitlines()[0][:160] if str(cause) else type(cause).__name__
            raise ModelUnavailable(
                f"the endpoint {self.base_url} does not answer ({reason}); is the server running?"
            ) from None
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise ModelUnavailable(
                    f"the endpoint {self.base_url} refused the key: HTTP {exc.status_code}"
                ) from None

    def _headers(self) -> dict[str, object]:
        import openai  # imported on first use (the class docstring says why)

        if self._api_key is not None:
            return {"Authorization": f"Bearer {self._api_key}"}
        if not self.api_key_env:
            return {"Authorization": openai.omit}  # no key: no Authorization header at all
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ModelUnavailable(f"environment variable {self.api_key_env} (the endpoint's api_key_env) is not set")
        return {"Authorization": f"Bearer {key}"}

    def chat(self, messages, *, temperature, max_tokens, stop) -> Reply:
        import openai  # imported on first use (the class docstring says why)

        request = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stop": stop or None,
            "seed": self.seed,
        }
        started = time.perf_counter()
        attempts = 0
        estimate = estimate_tokens(messages, max_tokens)

        def attempt() -> Reply:
            nonlocal attempts
            attempts += 1
            entry = self.limiter.acquire(estimate) if self.limiter else None
            try:
                raw = self._client.chat.completions.with_raw_response.create(
                    **request, extra_headers=self._headers(), extra_body=self.extra_body or None
                )
            except openai.APITimeoutError as exc:
                raise _Failure(type(exc.__cause__ or exc).__name__, retryable=True, unanswered="timeout") from exc
            except openai.APIConnectionError as exc:
                raise _Failure(type(exc.__cause__ or exc).__name__, retryable=True, unanswered="connection") from exc
            except openai.APIStatusError as exc:
                status, response = exc.status_code, exc.response
                problem = f"HTTP {status}: {response.text[:300]}"
                if status in UNAVAILABLE_STATUSES:
                    raise ModelUnavailable(f"{self.model} at {self.url}: {problem}") from None
                delay = parse_retry_after(response.headers.get("Retry-After"))
                if status == 429 and self.limiter:
                    self.limiter.throttled(delay)
                    # The limiter's pause holds this caller's retry too (in acquire), as it holds every
                    # other caller: one place waits, and counts the wait for the run's report.
                    delay = 0.0
                raise _Failure(problem, retryable=status in RETRY_STATUSES, retry_after_s=delay) from None
            reply = self._reply(raw, started)
            if self.limiter:
                self.limiter.settle(entry, reply.tokens_in + reply.tokens_out or estimate)
                self.limiter.succeeded()
            return reply

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

    def _reply(self, raw, started: float) -> Reply:
        """The completion's text and token counts; a body that is not a completion (not JSON, no
        choices) is an LLMError, as the server answered but gave nothing usable."""
        import openai  # imported on first use (the class docstring says why)

        try:
            completion = raw.parse()
            text = completion.choices[0].message.content or ""
            usage = completion.usage
        except (ValueError, AttributeError, IndexError, TypeError, openai.APIResponseValidationError) as exc:
            raise LLMError(
                f"{self.model}: malformed completion ({type(exc).__name__}): {raw.text[:300]}", transport=True
            ) from exc
        return Reply(
            text,
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
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
