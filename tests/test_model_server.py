"""A GGUF agent's model runs in llama-cpp-python's own server, a child process (model_server.py):
SmolLM2-135M on CPU, killed with SIGKILL in the middle of a reply, between replies, twice, and with
the process that started it; a file that is no model. Nothing here mocks the server or the model."""

from __future__ import annotations

import http.server
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import polars as pl
import pytest
import requests

from pipeline.evaluation.llm import ClientSettings, HttpSettings, LLMError, ModelUnavailable
from pipeline.evaluation.model_server import LlamaServerClient
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.run import checkpoint_path, evaluate_agent
from pipeline.storage import DataLayout
from testbed.database import generate_event_database

from .test_concurrency import MONTH, split, stored
from .test_dagster_evaluations import model_server_children, smollm2_gguf

SETTINGS = ClientSettings(max_tokens=32, n_ctx=4096)
QUERY_SET = "t"


@pytest.fixture(scope="module")
def gguf() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("model-server-db")
    generate_event_database(root, date(2024, 1, 1), 2, seed=3, quads_per_day=40)
    return root


def smollm2_agent(gguf: Path) -> Agent:
    return Agent(
        name="smollm2-react",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=1,
        gguf=gguf,
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=2,
    )


def run_dir(data_dir: Path) -> Path:
    return DataLayout(data_dir).evaluation_dir(MONTH, "smollm2-react", QUERY_SET, 1)


def cpu_ticks(pid: int) -> int:
    """User + system CPU time of a process, all its threads, in clock ticks (proc(5), stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def is_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_reapable(child: int, timeout_s: float = 10.0) -> bool:
    """Waits until this process's ``child`` has ended whole and can be reaped (a killed process's
    main thread shows "Z" before its other threads are gone), without reaping it."""
    deadline = time.monotonic() + timeout_s
    while os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class KillingClient:
    """The agent's real client, whose server gets SIGKILL while it computes the reply of the calls
    listed in ``mid_reply`` (once its CPU time moves: the request has arrived), or just before the
    calls in ``between`` (after it is gone). ``killed`` holds the calls where that happened."""

    def __init__(self, inner: LlamaServerClient, *, mid_reply=(), between=()):
        self.inner, self.mid_reply, self.between = inner, set(mid_reply), set(between)
        self.calls, self.killed = 0, []

    def chat(self, messages, **kwargs):
        call, self.calls = self.calls, self.calls + 1
        pid = self.inner.server_pid
        if call in self.between and pid is not None:
            os.kill(pid, signal.SIGKILL)
            assert wait_reapable(pid)
            self.killed.append(call)
        if call not in self.mid_reply or pid is None:
            return self.inner.chat(messages, **kwargs)
        replied = threading.Event()

        def kill_once_busy():
            start = cpu_ticks(pid)
            while not replied.is_set():
                if cpu_ticks(pid) >= start + 2:  # 20 ms of CPU: it is reading the prompt
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(call)
                    return
                time.sleep(0.002)

        killer = threading.Thread(target=kill_once_busy)
        killer.start()
        try:
            return self.inner.chat(messages, **kwargs)
        finally:
            replied.set()
            killer.join()

    def close(self):
        self.inner.close()


def evaluate(data_dir: Path, gguf: Path, client) -> dict:
    """The agent's run on 3 queries, its client handed in (evaluate_agent leaves it open)."""
    checkpoint_path(run_dir(data_dir)).unlink(missing_ok=True)
    shutil.rmtree(run_dir(data_dir), ignore_errors=True)
    try:
        _, record = evaluate_agent(
            split().head(3),
            data_dir,
            smollm2_agent(gguf),
            1,
            query_set=QUERY_SET,
            client=client,
            client_settings=SETTINGS,
        )
    finally:
        client.close()
    return record


@pytest.fixture(scope="module")
def uninterrupted(data_dir, gguf, tmp_path_factory):
    """The run with no kill, stored aside, and its episodes' model calls (call index → episode)."""
    evaluate(data_dir, gguf, LlamaServerClient(gguf, SETTINGS))
    kept = tmp_path_factory.mktemp("uninterrupted") / "run"
    shutil.copytree(run_dir(data_dir), kept)
    results, lines, scores = stored(kept)
    calls = [
        line["query_id"] for line in lines for step in line["steps"] if step["reply"] or step["tokens_out"]
    ]  # one per model reply, in order (the run is sequential: one episode at a time)
    return results, lines, scores, calls


def test_the_model_answers_from_a_child_process_on_127_0_0_1_behind_a_key(gguf):
    with LlamaServerClient(gguf, SETTINGS) as client:
        reply = client.chat([{"role": "user", "content": "Say hello."}], temperature=0.0, max_tokens=8, stop=[])
        pid = client.server_pid
        assert reply.text and reply.tokens_in > 0 and 0 < reply.tokens_out <= 8
        assert "pipeline.evaluation.model_server" in Path(f"/proc/{pid}/cmdline").read_text()
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid())
        url = client.server.base_url + "/chat/completions"
        assert url.startswith("http://127.0.0.1:")
        # Without the key the server refuses; the key is on no command line.
        assert requests.post(url, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30).status_code == 401
        assert client.server.api_key not in Path(f"/proc/{pid}/cmdline").read_text()
    assert wait_gone(pid, 10), "close() left the model server running"


def test_the_run_worker_s_environment_does_not_reach_the_server_s_settings(gguf, monkeypatch):
    """llama-cpp-python's settings read variables named like their fields: none reaches the server."""
    for name, value in {
        "API_KEY": "known",
        "MODEL": "/nonexistent.gguf",
        "N_CTX": "16",
        "CHAT_FORMAT": "bogus",
    }.items():
        monkeypatch.setenv(name, value)
    with LlamaServerClient(gguf, SETTINGS) as client:
        reply = client.chat([{"role": "user", "content": "Say hello."}], temperature=0.0, max_tokens=4, stop=[])
        assert reply.tokens_out > 0 and reply.tokens_in > 16
        url = client.server.base_url + "/chat/completions"
        refused = requests.post(
            url,
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": "Bearer known"},
            timeout=30,
        )
        assert refused.status_code == 401


def test_kill_9_mid_reply_fails_that_episode_and_the_rest_match_an_uninterrupted_run(data_dir, gguf, uninterrupted):
    results, lines, scores, calls = uninterrupted
    # Kill during the second reply of the first episode that asks twice (mid-episode), else the second call.
    first_of = {q: calls.index(q) for q in dict.fromkeys(calls)}
    target = next((first_of[q] + 1 for q in first_of if calls.count(q) > 1), 1)
    client = KillingClient(LlamaServerClient(gguf, SETTINGS), mid_reply={target})
    record = evaluate(data_dir, gguf, client)
    assert client.killed == [target], "the server answered before it could be killed mid-reply"
    victim = calls[target]
    after_results, after_lines, _ = stored(run_dir(data_dir))
    by_query = {line["query_id"]: line for line in after_lines}
    assert by_query[victim]["end_state"] == "error"
    assert "the model server for SmolLM2" in by_query[victim]["error"]
    assert "was killed by signal 9 (SIGKILL) during this reply" in by_query[victim]["error"]
    assert by_query[victim]["error"].endswith("; it is started again for the next reply")
    # Every other episode is the uninterrupted run's, byte for byte but for wall-clock fields.
    assert [line for line in after_lines if line["query_id"] != victim] == [
        line for line in lines if line["query_id"] != victim
    ]
    assert after_results.filter(pl.col("query_id") != victim).equals(results.filter(pl.col("query_id") != victim))
    assert record["end_states"].get("error", 0) == 1 + scores["end_states"].get("error", 0)


def test_a_server_gone_between_replies_is_restarted_and_nothing_is_lost(data_dir, gguf, uninterrupted):
    results, lines, *_ = uninterrupted
    client = KillingClient(LlamaServerClient(gguf, SETTINGS), between={1})
    evaluate(data_dir, gguf, client)
    assert client.killed == [1]
    after_results, after_lines, _ = stored(run_dir(data_dir))
    assert after_lines == lines and after_results.equals(results)


def test_a_second_death_stops_the_agent_and_keeps_the_finished_episodes(data_dir, gguf, uninterrupted):
    *_, calls = uninterrupted
    second_episode = calls.index(sorted(set(calls))[1])  # the first call of the second episode
    client = KillingClient(LlamaServerClient(gguf, SETTINGS), between={1, second_episode})
    with pytest.raises(ModelUnavailable, match=r"died 2 time\(s\) .*SIGKILL.*; it is not started again"):
        evaluate(data_dir, gguf, client)
    assert client.killed == [1, second_episode]
    assert not run_dir(data_dir).exists()  # no run of failed episodes is stored
    kept = [json.loads(line) for line in checkpoint_path(run_dir(data_dir)).read_text().splitlines()]
    assert [k["query_id"] for k in kept] == [calls[0]]  # the first episode, whole despite the first death
    assert client.inner.server_pid is None


def test_a_file_that_is_no_model_refuses_the_agent_with_the_server_s_reason(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + os.urandom(4096))
    started = time.monotonic()
    with LlamaServerClient(junk, SETTINGS) as client, pytest.raises(ModelUnavailable) as refused:
        client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
    assert "the model server for junk.gguf exited with status" in str(refused.value)
    assert "while starting" in str(refused.value)
    assert time.monotonic() - started < 60


_STARTS_A_SERVER = """
import sys, time
from pipeline.evaluation.llm import ClientSettings
from pipeline.evaluation.model_server import LlamaServerClient
client = LlamaServerClient(sys.argv[1], ClientSettings(max_tokens=4, n_ctx=2048))
client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
print(client.server_pid, flush=True)
time.sleep(600)
"""


def test_a_killed_run_worker_leaves_no_model_server_behind(gguf, tmp_path):
    """The harness's process dies by SIGKILL (an OOM kill of the Dagster run worker): its model
    server, in a session of its own, ends by itself within seconds and removes its files."""
    worker = subprocess.Popen(
        [sys.executable, "-c", _STARTS_A_SERVER, str(gguf)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
    )
    try:
        ready, _, _ = select.select([worker.stdout], [], [], 120)
        assert ready, "the worker did not start its model server within 120 s"
        server_pid = int(worker.stdout.readline())
        assert not is_gone(server_pid) and list(tmp_path.glob("mirai-model-server-*"))
    finally:
        worker.kill()
        worker.wait()
    assert wait_gone(server_pid, 10), "the model server outlived the process that started it"
    assert not list(tmp_path.glob("mirai-model-server-*"))


def test_an_interrupt_while_the_server_starts_leaves_nothing_behind(gguf, tmp_path, monkeypatch):
    """Ctrl-C, or Dagster terminating the run, while the model loads: no server, no files."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # mkdtemp reads TMPDIR again

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt), LlamaServerClient(gguf, SETTINGS) as client:
            client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not model_server_children() and not list(tmp_path.glob("mirai-model-server-*"))


def test_a_hung_server_fails_its_reply_and_the_next_reply_gets_a_new_one(gguf):
    """SIGSTOP: the reply times out, the server is stopped (it would hold every later request
    behind the abandoned one) and counts as a death; the next reply starts a new server."""
    settings = ClientSettings(max_tokens=4, n_ctx=2048, http=HttpSettings(read_timeout_s=10))
    with LlamaServerClient(gguf, settings) as client:
        client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
        hung = client.server_pid
        os.kill(hung, signal.SIGSTOP)
        with pytest.raises(
            LLMError, match=r"did not answer within 10 s and was stopped during this reply; it is started"
        ):
            client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
        assert wait_gone(hung, 5)
        reply = client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
        assert reply.tokens_out > 0 and client.server_pid != hung and client.restarts_left == 0


def test_the_environment_s_proxy_never_sees_the_key_nor_answers_for_the_server(gguf, monkeypatch):
    seen = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.forge()

        def do_POST(self):
            self.forge()

        def forge(self):
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            body = json.dumps({"choices": [{"message": {"content": "FORGED"}}], "data": []}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        try:
            with LlamaServerClient(gguf, SETTINGS) as client:
                reply = client.chat([{"role": "user", "content": "Say hello."}], temperature=0.0, max_tokens=4, stop=[])
        finally:
            proxy.shutdown()
    assert reply.text != "FORGED" and reply.tokens_in > 0
    assert seen == []


def test_a_closed_client_starts_no_server(gguf):
    client = LlamaServerClient(gguf, SETTINGS)
    client.close()
    with pytest.raises(ModelUnavailable, match="its client is closed"):
        client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, stop=[])
    assert client.server_pid is None and not model_server_children()


def test_a_reply_that_outgrows_the_context_is_one_failed_reply_not_a_dead_server(gguf):
    with LlamaServerClient(gguf, ClientSettings(max_tokens=8, n_ctx=512)) as client:
        with pytest.raises(LLMError) as failed:
            client.chat([{"role": "user", "content": "word " * 2000}], temperature=0.0, max_tokens=8, stop=[])
        assert "model server" not in str(failed.value)
        pid = client.server_pid
        reply = client.chat([{"role": "user", "content": "Say hello."}], temperature=0.0, max_tokens=4, stop=[])
        assert reply.tokens_out > 0 and client.server_pid == pid
