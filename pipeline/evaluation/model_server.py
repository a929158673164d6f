"""A local GGUF model behind llama-cpp-python's own OpenAI-compatible server, in a child process.

llama.cpp is native code: a crash in it (a CPU it was not built for, a bad model file) kills the
process it runs in. Run inside the evaluation, it would take down the Dagster run worker and every
episode of the run; behind `python -m llama_cpp.server` it takes down only that server. The harness
then talks to the model through the same OpenAI-compatible client as every endpoint agent (one LLM
code path: retries, token counts, the same request body), and ``LlamaServerClient`` turns a death
of its server into one failed reply (the episode ends as "error", saying so) and starts it again,
once; a second death stops the agent's evaluation (``ModelUnavailable``). docs/evaluation.md,
"Local GGUF models", says what an operator sees.

The server listens on 127.0.0.1 only, on a socket the harness bound and handed over (no other
process can take the port first), behind a random API key, and exits by itself within a second
when the process that started it dies (SIGKILL or OOM included), so a killed run leaves no model
holding gigabytes of memory. Its settings (the key among them) go in a private config file, not on
a command line other users can read in /proc, and its environment holds none of the variables
llama-cpp-python's settings would read.
"""

from __future__ import annotations

import faulthandler
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import requests

from pipeline.evaluation.llm import ClientSettings, LLMError, ModelUnavailable, OpenAIChatClient, Reply

START_TIMEOUT_S = 600.0  # loading an 8B model from a cold disk takes minutes on CPU
POLL_S = 0.2
RESTARTS = 1
# Sampling as llama.cpp's own defaults (and llama-cpp-python's Llama) have it: the server's request
# model defaults repeat_penalty to 1.1 instead (llama_cpp/server/types.py, repeat_penalty_field).
SAMPLING = {"repeat_penalty": 1.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
LOG_TAIL_BYTES = 64 * 1024
READY = "mirai model server: model loaded, serving"  # the child's line between loading and serving
LOG_LINE_CHARS = 300


def runtime() -> str:
    """What serves a GGUF model, for the run's record: llama-cpp-python's version (its llama.cpp)."""
    try:
        return f"llama-cpp-python {metadata.version('llama-cpp-python')} (llama_cpp.server, a child process)"
    except metadata.PackageNotFoundError:
        return "llama-cpp-python is not installed"


def _child_environment() -> dict[str, str]:
    """The server's environment: what running Python needs, and OpenMP's thread settings. Nothing
    else, since llama-cpp-python's settings classes read any variable named like one of their
    fields (MODEL, N_CTX, CHAT_FORMAT, API_KEY, ...) from the environment, and the run worker's
    must not change the model's."""
    keep = {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONPATH", "LD_LIBRARY_PATH"}
    return {k: v for k, v in os.environ.items() if k in keep or k.startswith("OMP_")}


def how_it_ended(returncode: int) -> str:
    """A child's return code in words: 'was killed by signal 9 (SIGKILL)' or 'exited with status 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


class LlamaServer:
    """One child process serving one GGUF file with llama-cpp-python's server on 127.0.0.1 (on a
    socket this process bound); ``start`` returns once it answers (the model loaded), or raises
    ModelUnavailable with the server's own words.
    ``n_ctx`` is capped by the child at the model's training context; ``n_threads`` None is
    llama.cpp's choice."""

    def __init__(
        self, gguf: Path, *, n_ctx: int, n_threads: int | None, seed: int, start_timeout_s: float = START_TIMEOUT_S
    ):
        self.gguf = Path(gguf)
        self.n_ctx, self.n_threads, self.seed, self.start_timeout_s = n_ctx, n_threads, seed, start_timeout_s
        self.api_key = secrets.token_urlsafe(32)
        self._dir: Path | None = None
        self._process: subprocess.Popen | None = None
        self._log = None
        self._stopped_because: str | None = None
        self.base_url = ""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    def stop_process(self, reason: str | None = None) -> None:
        """Ends the server process (SIGKILL) and reaps it, keeping its log for ``last_words``;
        ``reason`` is then what ``ended`` says."""
        self._stopped_because = reason
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()

    def ended(self) -> str | None:
        """None while the server runs; else how it ended ('was killed by signal 11 (SIGSEGV)')."""
        if self._process is None or self._process.poll() is None:
            return None
        return self._stopped_because or how_it_ended(self._process.returncode)

    def last_words(self, *, since_ready: bool) -> str:
        """The last line the server printed that is not one of uvicorn's own INFO lines (an access
        log line says nothing of why it ended), as ' (its last output: ...)', or ''. With
        ``since_ready`` only what it printed after its model loaded: its loader's lines are no
        reason for a later death."""
        if self._dir is None or not (self._dir / "server.log").exists():
            return ""
        with open(self._dir / "server.log", "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = log.read().decode("utf-8", "replace").splitlines()
        if since_ready:
            lines = lines[len(lines) - lines[::-1].index(READY) :] if READY in lines else []
        said = [line.strip() for line in lines if line.strip() and not line.startswith("INFO:")]
        return f" (its last output: {said[-1][:LOG_LINE_CHARS]})" if said else ""

    def start(self) -> None:
        if not self.gguf.is_file():
            raise ModelUnavailable(f"GGUF model file {self.gguf} does not exist")
        try:
            self._start()
        except BaseException:  # an interrupt (Ctrl-C, a terminated Dagster run) too: no server left behind
            self.stop()
            raise

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="mirai-model-server-"))  # mode 0700: the key stays private
        config = {
            "api_key": self.api_key,
            "model": {
                "model": str(self.gguf.resolve()),
                "model_alias": self.gguf.name,
                "n_ctx": self.n_ctx,
                "n_gpu_layers": 0,
                "seed": self.seed,
                # The server's own defaults differ from llama-cpp-python's Llama here: logits of
                # every prompt token (for logprobs, which the harness never asks; 20-25 % slower
                # replies, bench/gguf_server.py) and the weights locked in RAM.
                "logits_all": False,
                "use_mlock": False,
                "verbose": False,
                **({"n_threads": self.n_threads} if self.n_threads else {}),
            },
        }
        config_file = self._dir / "config.json"
        config_file.write_text(json.dumps(config))
        self._log = open(self._dir / "server.log", "ab")  # closed in stop()
        # Bound and listening before the child exists, and handed to it: no other process can take
        # the port between a choice and a bind, and the harness's key goes to no one else.
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.base_url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(config_file), str(listener.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(listener.fileno(),),
                env=_child_environment(),
                start_new_session=True,  # a Ctrl-C at the terminal reaches the harness, which stops it
            )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with requests.Session() as session:
            session.trust_env = False  # no proxy from the environment sees the key or answers for the server
            while True:
                ended = self.ended()
                if ended is not None:
                    words = self.last_words(since_ready=False)
                    self.stop()
                    raise ModelUnavailable(f"the model server for {self.gguf.name} {ended} while starting{words}")
                try:
                    response = session.get(
                        f"{self.base_url}/models", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=5
                    )
                    if response.status_code == 200:
                        return
                except requests.RequestException:
                    pass  # not serving yet: the model is still loading
                if time.monotonic() > deadline:
                    self.stop()
                    raise ModelUnavailable(
                        f"the model server for {self.gguf.name} did not answer within "
                        f"{self.start_timeout_s:.0f} s of its start"
                    )
                time.sleep(POLL_S)

    def stop(self) -> None:
        """Ends the server (SIGKILL: it holds nothing to save, and uvicorn's graceful shutdown would
        wait for a reply in flight) and removes its config and log."""
        self.stop_process()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class LlamaServerClient:
    """The chat client of a ``gguf`` agent: its model in a ``LlamaServer`` started on first use,
    asked through ``OpenAIChatClient``. A reply the server died during raises LLMError saying so
    (that episode ends as "error"); the next call starts a new server, once (``restarts``); after
    that a death raises ModelUnavailable. ``close`` stops the server."""

    def __init__(
        self,
        gguf: Path | str,
        settings: ClientSettings | None = None,
        *,
        restarts: int = RESTARTS,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        self.gguf = Path(gguf)
        self.settings = settings or ClientSettings()
        self.start_timeout_s = start_timeout_s
        # One attempt a reply: the server is on this machine, and a failed request means a dead or
        # refusing server, which a retry does not mend (a dead one is handled here instead).
        self.http = replace(self.settings.http, attempts=1)
        self.restarts_left = restarts
        self._lock = threading.Lock()
        self._server: LlamaServer | None = None
        self._client: OpenAIChatClient | None = None
        self._deaths: list[str] = []
        self._closed = False

    @property
    def server(self) -> LlamaServer | None:
        """The server started for this client, None before the first request and after close."""
        return self._server

    @property
    def server_pid(self) -> int | None:
        return self._server.pid if self._server is not None else None

    def _running(self) -> tuple[LlamaServer, OpenAIChatClient]:
        """The live server and its client: started on the first call, and again, ``restarts``
        times, when found dead."""
        with self._lock:
            if self._closed:
                raise ModelUnavailable(f"the model server for {self.gguf.name} was stopped: its client is closed")
            ended = self._server.ended() if self._server is not None else None
            if ended is not None:
                self._deaths.append(ended + self._words(self._server))
                if self.restarts_left <= 0:
                    raise ModelUnavailable(
                        f"the model server for {self.gguf.name} died {len(self._deaths)} time(s) "
                        f"({'; '.join(self._deaths)}); it is not started again"
                    )
                self.restarts_left -= 1
                self._stop()
            if self._server is None:
                server = LlamaServer(
                    self.gguf,
                    n_ctx=self.settings.n_ctx,
                    n_threads=self.settings.n_threads,
                    seed=self.settings.seed,
                    start_timeout_s=self.start_timeout_s,
                )
                server.start()
                self._server = server
                self._client = OpenAIChatClient(
                    server.base_url,
                    self.gguf.name,
                    None,
                    api_key=server.api_key,
                    seed=self.settings.seed,
                    http=self.http,
                    extra_body=SAMPLING,
                    trust_env=False,  # no proxy from the environment sees the key or answers for the server
                )
            return self._server, self._client

    def chat(self, messages, *, temperature, max_tokens, stop) -> Reply:
        server, client = self._running()
        try:
            return client.chat(messages, temperature=temperature, max_tokens=max_tokens, stop=stop)
        except LLMError as exc:
            if exc.unanswered is None:
                raise  # the server answered: it refused this request (e.g. a context overflow)
            if self._closed:
                raise LLMError(
                    f"the model server for {self.gguf.name} was stopped: the evaluation ended", transport=True
                ) from None
            if exc.unanswered == "timeout" and server.ended() is None:
                # A hung server, or one still computing the abandoned reply, which would hold every
                # later request behind it (llama-cpp-python checks for a gone client only before it
                # starts): stopped, and started again for the next reply like a dead one.
                ended = f"did not answer within {self.http.read_timeout_s:.0f} s and was stopped"
                server.stop_process(ended)
            else:
                for _ in range(int(1 / POLL_S)):  # a dying server may close its socket before it is reaped
                    ended = server.ended()
                    if ended is not None:
                        break
                    time.sleep(POLL_S)
                else:
                    raise
            after = "it is started again for the next reply" if self.restarts_left > 0 else "it is not started again"
            raise LLMError(
                f"the model server for {self.gguf.name} {ended} during this reply{self._words(server)}; {after}",
                transport=True,
            ) from None

    @staticmethod
    def _words(server: LlamaServer) -> str:
        """What the server said before it ended: nothing for a SIGKILL, which it did not see coming."""
        if server.returncode == -signal.SIGKILL:
            return ""
        return server.last_words(since_ready=True)

    def _stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    def close(self) -> None:
        """Stops the server; a later request raises ModelUnavailable instead of starting one."""
        self._closed = True
        with self._lock:
            self._stop()

    def __enter__(self) -> LlamaServerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the child ------------------------------------------------------------------------------------


def _exit_with(parent: int, directory: Path) -> None:
    """Exits this process as soon as ``parent`` is gone (this process re-parented), removing the
    server's directory, which the parent would have removed: Linux's PR_SET_PDEATHSIG would follow
    the parent's *thread*, and the harness may start a server from a worker thread that ends before
    the evaluation does."""
    while os.getppid() == parent:
        time.sleep(0.5)
    shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)


def _trained_context(gguf: str) -> int | None:
    """The model's training context (GGUF metadata), read with the vocabulary only, no weights."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(gguf.encode(), params)
    if not model:
        return None  # the server's own load then says what is wrong with the file
    try:
        return int(llama_cpp.llama_model_n_ctx_train(model))
    finally:
        llama_cpp.llama_model_free(model)


def main(argv: list[str]) -> None:
    """`python -m pipeline.evaluation.model_server CONFIG FD PARENT_PID`: llama-cpp-python's server
    (its app, as `python -m llama_cpp.server` builds it, under uvicorn) on the listening socket FD,
    with the context capped at the model's training context (positions past it are not
    meaningful), ending with its parent."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    faulthandler.enable()  # a native crash leaves its Python stack in the log
    config_file, listener, parent = Path(argv[0]), socket.socket(fileno=int(argv[1])), int(argv[2])
    threading.Thread(target=_exit_with, args=(parent, config_file.parent), daemon=True, name="exit-with-parent").start()
    config = json.loads(config_file.read_text())
    config_file.unlink()  # the key stays in this process's memory only
    model = config["model"]
    trained = _trained_context(model["model"])
    if trained and trained < model["n_ctx"]:
        model["n_ctx"] = trained
    app = create_app(server_settings=ServerSettings(api_key=config["api_key"]), model_settings=[ModelSettings(**model)])
    print(READY, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="info")).run(sockets=[listener])


if __name__ == "__main__":
    main(sys.argv[1:])
