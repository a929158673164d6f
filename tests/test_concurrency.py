"""Concurrent episodes (pipeline/evaluation/run.py run_episodes, throughput.py): the same stored
run whatever the concurrency, a killed run resumed without redoing finished episodes, 429s and
Retry-After, requests/tokens per minute, the sandbox memory cap and cost accounting. Against a
real OpenAI-compatible server on 127.0.0.1 (testbed/chat.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from pipeline.agent_api import EventDatabase, cutoff_gate
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.agent_api.sandbox_spares import SPARES
from pipeline.evaluation import throughput
from pipeline.evaluation.agent_config import agent_config_hash, endpoint_limits
from pipeline.evaluation.agents import react_environment
from pipeline.evaluation.episodes import episode_concurrency, sandbox_slots
from pipeline.evaluation.llm import HttpSettings, LLMError, ModelUnavailable, OpenAIChatClient
from pipeline.evaluation.registry import Agent, Endpoint, RegistryError, parse_agents
from pipeline.evaluation.run import checkpoint_path, evaluate_agent
from pipeline.evaluation.throughput import (
    SANDBOX_PRIVATE_MB,
    EpisodeLog,
    Progress,
    RateLimiter,
    RateLimits,
    SandboxSlots,
    sandbox_cap,
    sandbox_start_mb,
)
from pipeline.evaluation.trajectory import AgentSpec
from pipeline.http import parse_retry_after
from pipeline.storage import DataLayout
from testbed.chat import ChatServer, api_calls_policy
from testbed.database import generate_event_database

MONTH = date(2024, 2, 1)
PAIRS = [("USA", "CHN"), ("RUS", "UKR"), ("FRA", "DEU"), ("IND", "PAK"), ("ISR", "IRN"), ("GBR", "USA")]
TIMINGS = {"latency_s", "env_s", "wall_s", "model_s"}  # wall-clock fields: the only ones allowed to differ


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrency-db")
    generate_event_database(root, date(2024, 1, 1), 2, seed=3, quads_per_day=40)
    return root


def split() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "query_id": [f"2024-02-{i:05d}" for i in range(1, len(PAIRS) + 1)],
            "date": [date(2024, 2, 10) + timedelta(days=i) for i in range(len(PAIRS))],
            "s": [s for s, _ in PAIRS],
            "o": [o for _, o in PAIRS],
            "answer_dict": [json.dumps({"04": ["042"]})] * len(PAIRS),
        }
    )


def agent(base_url: str, **fields) -> Agent:
    return Agent(
        name="http-react",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=2,
        endpoint=Endpoint(base_url, "scripted", None),
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=4,
        **fields,
    )


def run_dir(data_dir: Path) -> Path:
    return DataLayout(data_dir).evaluation_dir(MONTH, "http-react", "t", 1)


def stored(directory: Path) -> tuple[pl.DataFrame, list[dict], dict]:
    """The run's files without their wall-clock fields."""
    results = pl.read_parquet(directory / "results.parquet").drop("model_s", "env_s", "wall_s")
    lines = []
    for line in (directory / "trajectories.jsonl").read_text().splitlines():
        record = {k: v for k, v in json.loads(line).items() if k not in TIMINGS}
        record["steps"] = [{k: v for k, v in s.items() if k not in TIMINGS} for s in record["steps"]]
        lines.append(record)
    scores = json.loads((directory / "scores.json").read_text())
    for key in ("evaluated_at", "model_s", "results_sha256", "trajectories_sha256"):
        scores.pop(key)
    return results, lines, scores


def _russia_fails(messages: list[dict]) -> int | None:
    return 400 if any("RUS" in m["content"] for m in messages if m["role"] == "user") else None


def test_concurrent_episodes_store_the_same_run_as_sequential_ones(data_dir, tmp_path):
    with ChatServer(fail_when=_russia_fails) as server:
        evaluate_agent(split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=1)
        assert server.max_in_flight == 1
        sequential = run_dir(data_dir).parent / "sequential"
        shutil.copytree(run_dir(data_dir), sequential)
        server.gather(4)
        evaluate_agent(split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=4)
        assert server.max_in_flight == 4, "the episodes did not overlap"
    before, after = stored(sequential), stored(run_dir(data_dir))
    assert before[0].equals(after[0])
    assert before[1] == after[1]
    assert before[2] == after[2]
    # Ordered by (round, query), not by completion.
    assert [(line["round"], line["query_id"]) for line in after[1]] == [
        (r, q) for r in range(2) for q in split().get_column("query_id")
    ]
    # The failed episode (its model answers 400) is stored as an error; the others are kept.
    states = [line["end_state"] for line in after[1]]
    assert states.count("error") == 2 and states.count("final_answer") == 10
    assert any(line["sandbox"] for line in after[1]), "no episode ran code in a sandbox"
    assert not checkpoint_path(run_dir(data_dir)).exists()


def test_live_sandboxes_never_exceed_their_slots(data_dir):
    """Every episode runs code (a sandbox each); 4 episodes at once share 2 sandbox slots: the
    others wait for a slot before their first code, and all finish."""
    slots = SandboxSlots(2)
    with ChatServer(api_calls_policy(3)) as server:
        server.gather(4)  # the 4 episodes' first requests are in flight together
        _, record = evaluate_agent(
            split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=4, sandboxes=slots
        )
        assert server.max_in_flight == 4
    assert record["end_states"] == {"final_answer": 12}
    assert slots.max_live == 2 and slots.live == 0


_RESUMABLE_RUN = """
import json, sys
from datetime import date
from pipeline.evaluation.registry import Agent, Endpoint
from pipeline.evaluation.run import evaluate_agent
import polars as pl
args = json.loads(sys.argv[1])
agent = Agent(name="http-react", kind="llm", knowledge_cutoff=date(2023, 12, 31), distances=(1,), rounds=2,
              endpoint=Endpoint(args["base_url"], "scripted", None), strategy="react",
              action_type="single_function", temperature=0.0, max_steps=4)
evaluate_agent(pl.read_parquet(args["split"]), args["data_dir"], agent, 1, query_set="t", concurrency=2)
"""


def _complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_killed_run_resumes_without_redoing_finished_episodes(data_dir, tmp_path):
    """Only "invalid action, then final answer" episodes (two requests each, no sandbox): the
    server answers 6 requests, then holds the rest until the process is killed."""

    def two_turns(messages):
        turns = sum(m["role"] == "assistant" for m in messages)
        return "Action: look around" if turns == 0 else 'Action: Final Answer: {"04": ["042"]}'

    split().write_parquet(tmp_path / "split.parquet")
    checkpoint = checkpoint_path(run_dir(data_dir))
    checkpoint.unlink(missing_ok=True)
    with ChatServer(two_turns, hold_after=6) as server:
        args = {"base_url": server.base_url, "split": str(tmp_path / "split.parquet"), "data_dir": str(data_dir)}
        child = subprocess.Popen([sys.executable, "-c", _RESUMABLE_RUN, json.dumps(args)])
        try:
            # Both worker threads waiting on held requests: every episode they finished is on disk.
            deadline = time.monotonic() + 120
            while server.held < 2 and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.held == 2, "the run did not reach the held requests"
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        finished = _complete_lines(checkpoint)
        assert 1 <= finished <= 3
        server.release()
        before = server.requests
        evaluate_agent(split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=2)
        # Exactly the unfinished episodes were asked again: 12 episodes, 2 requests each.
        assert server.requests - before == 2 * (12 - finished)
        assert not checkpoint.exists()
        # The resumed run stores what an uninterrupted one does.
        fresh = tmp_path / "fresh"
        shutil.copytree(data_dir / "database", fresh / "database")
        evaluate_agent(split(), fresh, agent(server.base_url), 1, query_set="t", concurrency=2)
    assert stored(run_dir(data_dir))[1:] == stored(run_dir(fresh))[1:]
    assert stored(run_dir(data_dir))[0].equals(stored(run_dir(fresh))[0])


def test_an_unusable_model_stops_the_run_and_keeps_the_finished_episodes(data_dir):
    """A 401 on one query's conversation (the key was revoked, say) stops the run without storing
    it; the episodes that finished are checkpointed and not asked again by the next run."""

    def revoked(messages):
        return 401 if any("ISR" in m["content"] for m in messages if m["role"] == "user") else None

    checkpoint = checkpoint_path(run_dir(data_dir))
    checkpoint.unlink(missing_ok=True)
    shutil.rmtree(run_dir(data_dir), ignore_errors=True)
    with ChatServer(fail_when=revoked) as server:
        with pytest.raises(ModelUnavailable, match="HTTP 401"):
            evaluate_agent(split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=3)
        assert not run_dir(data_dir).exists()
        kept = {(e["round"], e["query_id"]) for e in map(json.loads, checkpoint.read_text().splitlines())}
        assert kept
        server.fail_when = None
        before = server.requests
        _, record = evaluate_agent(split(), data_dir, agent(server.base_url), 1, query_set="t", concurrency=3)
        asked = server.requests - before
    assert sum(record["end_states"].values()) == 12
    # Exactly the requests (steps) of the episodes that were not kept.
    lines = [json.loads(line) for line in (run_dir(data_dir) / "trajectories.jsonl").read_text().splitlines()]
    assert asked == sum(len(t["steps"]) for t in lines if (t["round"], t["query_id"]) not in kept)
    assert not checkpoint.exists()


def test_the_checkpoint_drops_a_line_cut_by_a_kill_and_other_runs_lines(tmp_path):
    path = tmp_path / "distance=1.episodes.jsonl"
    log = EpisodeLog(path, "run-a")
    log.append(0, "q1", {"tokens_in": 1})
    EpisodeLog(path, "run-b").append(0, "q2", {"tokens_in": 2})
    with open(path, "ab") as fh:
        fh.write(b'{"run": "run-a", "round": 0, "query_id": "q3", "traj')
    reopened = EpisodeLog(path, "run-a")
    assert reopened.done == {(0, "q1"): {"tokens_in": 1}}
    reopened.append(1, "q1", {"tokens_in": 3})
    assert EpisodeLog(path, "run-a").done == {(0, "q1"): {"tokens_in": 1}, (1, "q1"): {"tokens_in": 3}}


# --- rate limits ------------------------------------------------------------------------------------


class FakeClock:
    """A clock that advances only when the limiter sleeps, so waits are computed, never timed."""

    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def test_requests_per_minute_over_a_sliding_window():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(requests_per_minute=3), clock=clock, sleep=clock.sleep)
    for step in (0, 10, 20):
        clock.now = 1000.0 + step
        limiter.acquire(1)
    assert clock.sleeps == []
    assert limiter.wait_s(1) == pytest.approx(40.0)  # the first request leaves the window at 1060
    limiter.acquire(1)  # sleeps until then
    assert clock.sleeps == [40.0] and clock.now == pytest.approx(1060.0)
    assert limiter.wait_s(1) == pytest.approx(10.0)  # the second (sent at 1010) is next to leave
    # Six requests at once: every window of 60 s holds at most three.
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(requests_per_minute=3), clock=clock, sleep=clock.sleep)
    sent = [limiter.acquire(1)[0] for _ in range(6)]
    assert sent == [1000.0, 1000.0, 1000.0, 1060.0, 1060.0, 1060.0]


def test_tokens_per_minute_count_the_estimate_until_the_server_says():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(tokens_per_minute=100), clock=clock, sleep=clock.sleep)
    entry = limiter.acquire(80)
    assert limiter.wait_s(50) == pytest.approx(60.0)
    limiter.settle(entry, 30)  # the reply's usage: 30 tokens
    assert limiter.wait_s(50) == 0.0
    assert limiter.wait_s(500) == pytest.approx(60.0)  # more than a minute's worth: alone in the window


def test_a_429_pauses_every_caller_for_retry_after_then_backs_off_exponentially():
    clock = FakeClock()
    limiter = RateLimiter(clock=clock, sleep=clock.sleep)
    assert limiter.throttled(7.0) == 7.0
    assert limiter.wait_s(1) == pytest.approx(7.0)  # for any thread, not only the throttled one
    assert [limiter.throttled(None) for _ in range(3)] == [2.0, 4.0, 8.0]  # the 2nd, 3rd, 4th 429 in a row
    assert limiter.throttled(1e9) == 60.0  # a hostile Retry-After is capped
    limiter.succeeded()
    assert limiter.throttled(None) == 1.0
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now.timestamp()) == 30.0  # RFC 9110's HTTP-date form
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_the_client_honours_429_and_retry_after_from_a_real_server():
    clock = FakeClock()
    limiter = RateLimiter(clock=clock, sleep=clock.sleep)
    http = HttpSettings(connect_timeout_s=2, read_timeout_s=5, attempts=3, backoff_base_s=0.01, backoff_max_s=0.01)
    with ChatServer(failures=[(429, {"Retry-After": "3"})]) as server:
        client = OpenAIChatClient(server.base_url, "m", None, http=http, limiter=limiter)
        reply = client.chat([{"role": "user", "content": "q"}], temperature=0.0, max_tokens=8, stop=[])
        assert server.requests == 2
    assert reply.text.startswith("Thought:")
    # The retry waited for the server's 3 s (on the limiter's clock) before its second request.
    assert clock.sleeps == [3.0] and limiter.throttles == 1


def test_a_failed_reply_says_whether_it_failed_on_transport():
    """Issue 33: the kind of failure is data on the error (LLMError.transport), which decides
    whether an episode is run again, never its message text: a refused connection and a 503 after
    the retries are transport; a 400 is the endpoint refusing the request."""
    http = HttpSettings(connect_timeout_s=2, read_timeout_s=5, attempts=2, backoff_base_s=0.01, backoff_max_s=0.01)
    messages = [{"role": "user", "content": "q"}]
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(LLMError) as refused:
        OpenAIChatClient(f"http://127.0.0.1:{port}/v1", "m", None, http=http).chat(
            messages, temperature=0.0, max_tokens=8, stop=[]
        )
    assert refused.value.transport and refused.value.unanswered == "connection"
    for status, transport in ((503, True), (400, False)):
        with ChatServer(fail_when=lambda messages, status=status: status) as server:
            with pytest.raises(LLMError) as failed:
                OpenAIChatClient(server.base_url, "m", None, http=http).chat(
                    messages, temperature=0.0, max_tokens=8, stop=[]
                )
        assert failed.value.transport is transport and f"HTTP {status}" in str(failed.value)


def test_the_client_keeps_requests_per_minute_against_a_real_server():
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(requests_per_minute=2), clock=clock, sleep=clock.sleep)
    with ChatServer() as server:
        client = OpenAIChatClient(server.base_url, "m", None, limiter=limiter)
        for _ in range(5):
            client.chat([{"role": "user", "content": "q"}], temperature=0.0, max_tokens=8, stop=[])
        assert server.requests == 5
    assert clock.sleeps == [60.0, 60.0]  # requests 3 and 5 waited a window each


# --- concurrency settings, memory, cost, progress ---------------------------------------------------


def test_sandbox_cap_fits_the_limits_in_available_memory(monkeypatch):
    start = sandbox_start_mb(100.0)
    assert start == SANDBOX_PRIVATE_MB + 0.05 * 100  # its private pages, and those over the mapped tables
    per_sandbox = (start + 1024) * 2**20
    assert sandbox_cap(1024, start, available_bytes=10 * per_sandbox) == 8  # 80 % of the memory
    assert sandbox_cap(1024, start, available_bytes=per_sandbox // 2) == 1  # never 0: one at a time
    # The mapped tables count once, not per sandbox: 8 GB of them leave room for fewer sandboxes.
    assert sandbox_cap(1024, start, available_bytes=10 * per_sandbox, shared_mb=8 * 1024) == 1
    # A 24 GiB machine, a warm spare beside each live sandbox: with a 1 GiB limit 15 sandboxes of a
    # small database, 14 with 1.1 GB of gated tables (14 months); with the default 256 MB limit 42
    # and 36, so 32 episodes at once each get theirs.
    monkeypatch.setattr(throughput, "available_memory_bytes", lambda: 24 * 2**30)
    assert DEFAULT_MEMORY_MB == 256
    assert (sandbox_slots(64, 11, 1024).n, sandbox_slots(64, 1116, 1024).n) == (15, 14)
    assert (sandbox_slots(64, 11).n, sandbox_slots(64, 1116).n) == (42, 36)


def test_the_agents_memory_limit_reaches_its_sandboxes_and_a_run_keeps_a_spare_per_slot(data_dir, monkeypatch):
    """A run reserves a warm spare per sandbox slot, and fewer as its last episodes start their
    sandboxes (no spare is started only to be stopped unused), then releases them."""
    original = SPARES.resize
    reservations = []
    monkeypatch.setattr(
        SPARES, "resize", lambda libs, old, new: (reservations.append((libs, old, new)), original(libs, old, new))
    )
    with ChatServer(api_calls_policy(2)) as server:
        _, record = evaluate_agent(
            split(), data_dir, agent(server.base_url, sandbox_memory_mb=64), 1, query_set="t", concurrency=3
        )
    assert record["end_states"] == {"final_answer": 12}
    assert record["harness"]["sandbox_memory_mb"] == 64
    # 12 episodes, 3 slots on any machine here: 3 spares until 2 episodes are left to start, then 2, 1, 0.
    assert reservations == [((), None, 3), ((), 3, 2), ((), 2, 1), ((), 1, 0), ((), 0, None)]
    # The limit is the code's: a 100 MB allocation fails under 64 MB and fits the default.
    db = EventDatabase(data_dir)
    for memory_mb, expected in ((64, "MemoryError"), (DEFAULT_MEMORY_MB, "")):
        spec = AgentSpec("react", "code_block", 0.0, 4, 64, memory_mb=memory_mb)
        with react_environment(db, spec, date(2024, 2, 10), 1) as env:
            assert env.run_code("kept = 1\nb = bytearray(100 * 2**20)").startswith(expected)
            assert env.run_code("kept + 1").strip() == "2"


def test_concurrency_defaults_caps_and_registry_checks(monkeypatch):
    http = agent("http://x/v1")
    assert episode_concurrency(http) == 8  # registry.DEFAULT_HTTP_CONCURRENCY
    assert episode_concurrency(http, 64) == 64
    monkeypatch.setattr("pipeline.evaluation.episodes.sandbox_cap", lambda memory_mb, start_mb, shared_mb: 3)
    assert sandbox_slots(64, 10.0).n == 3 and sandbox_slots(2, 10.0).n == 2  # memory, or one per episode
    gguf = Agent(**{**http.__dict__, "endpoint": None, "gguf": Path("m.gguf")})
    assert episode_concurrency(gguf, 64) == 1  # its model server answers one request at a time
    entry = {"name": "a", "kind": "llm", "knowledge_cutoff": "2023-10", "gguf": "m.gguf", "concurrency": 4}
    with pytest.raises(RegistryError, match="concurrency must be 1 for a gguf model"):
        parse_agents({"agents": [entry]})
    with pytest.raises(RegistryError, match="requests_per_minute must be a positive integer"):
        parse_agents(
            {
                "agents": [
                    {
                        "name": "b",
                        "kind": "llm",
                        "knowledge_cutoff": "2023-10",
                        "endpoint": {"base_url": "https://e/v1", "model": "m", "requests_per_minute": 0},
                    }
                ]
            }
        )
    endpoint = {"base_url": "https://e/v1", "model": "m", "requests_per_minute": 500}
    (parsed,) = parse_agents(
        {
            "agents": [
                {"name": "c", "kind": "llm", "knowledge_cutoff": "2023-10", "endpoint": endpoint, "concurrency": 16}
            ]
        }
    )
    assert parsed.episode_concurrency == 16
    # The entry's limit wins; the one it does not set comes from LlmRuntime's defaults.
    assert endpoint_limits(parsed, RateLimits(60, 10_000)) == RateLimits(500, 10_000)
    # Throughput and price settings change no answer: the config hash (and the checkpoint) stay.
    (plain,) = parse_agents(
        {
            "agents": [
                {
                    "name": "c",
                    "kind": "llm",
                    "knowledge_cutoff": "2023-10",
                    "endpoint": {"base_url": "https://e/v1", "model": "m"},
                }
            ]
        }
    )
    assert agent_config_hash(plain) == agent_config_hash(parsed)
    # The sandbox's memory budget: react only, a positive number of MB, not part of the hash.
    base = {
        "name": "c",
        "kind": "llm",
        "knowledge_cutoff": "2023-10",
        "endpoint": {"base_url": "https://e/v1", "model": "m"},
    }
    (budget,) = parse_agents({"agents": [{**base, "sandbox_memory_mb": 512}]})
    assert budget.sandbox_memory_mb == 512 and agent_config_hash(budget) == agent_config_hash(plain)
    with pytest.raises(RegistryError, match="sandbox_memory_mb applies only to strategy react"):
        parse_agents({"agents": [{**base, "strategy": "direct", "sandbox_memory_mb": 512}]})
    with pytest.raises(RegistryError, match="sandbox_memory_mb must be a positive integer"):
        parse_agents({"agents": [{**base, "sandbox_memory_mb": 0}]})


def test_cost_is_the_tokens_times_the_prices_per_million(data_dir):
    entry = {"name": "priced", "kind": "llm", "knowledge_cutoff": "2023-10", "strategy": "direct"}
    with pytest.raises(RegistryError, match="give both price_per_million_input_tokens"):
        parse_agents(
            {
                "agents": [
                    {
                        **entry,
                        "endpoint": {"base_url": "https://e/v1", "model": "m"},
                        "price_per_million_input_tokens": 0.15,
                    }
                ]
            }
        )
    with ChatServer() as server:
        endpoint = {"base_url": server.base_url, "model": "m"}
        prices = {"price_per_million_input_tokens": 0.15, "price_per_million_output_tokens": 0.6}
        (priced,) = parse_agents({"agents": [{**entry, "endpoint": endpoint, **prices}]})
        (free,) = parse_agents({"agents": [{**entry, "endpoint": endpoint}]})
        _, with_price = evaluate_agent(split(), data_dir, priced, 1, query_set="t")
        _, without = evaluate_agent(split(), data_dir, free, 1, query_set="t")
    assert with_price["tokens_in"] > 0 and with_price["tokens_out"] > 0
    expected = (with_price["tokens_in"] * 0.15 + with_price["tokens_out"] * 0.6) / 1e6
    assert with_price["cost_usd"] == pytest.approx(expected)
    assert without["cost_usd"] is None and without["tokens_in"] == with_price["tokens_in"]


def test_progress_reports_at_a_bounded_rate():
    clock, lines = FakeClock(), []
    progress = Progress(5, lines.append, interval_s=30.0, clock=clock)
    for step in (0, 1, 2, 40, 41):
        clock.now = 1000.0 + step
        progress.add(10, 2)
    # The first, the first after 30 s, and the last episode.
    assert lines == [
        "1/5 episodes, tokens in/out 10/2",
        "4/5 episodes, tokens in/out 40/8",
        "5/5 episodes, tokens in/out 50/10",
    ]


@pytest.fixture
def leased(data_dir, monkeypatch) -> list[date]:
    """The cutoffs the machine's gate is leased for, in order, by a fresh run of the first two
    queries (2024-02-10 and 2024-02-11: cutoffs 02-09 and 02-10)."""

    class Leases(list):
        grids: list  # what each lease was asked to wait for at a backward handover

    leased = Leases()
    leased.grids = grids = []

    class RecordingGate(cutoff_gate.CutoffGate):
        def lease(self, cutoff, handover_grid_s=None):
            granted = super().lease(cutoff, handover_grid_s)
            leased.append(cutoff)
            grids.append(handover_grid_s)
            return granted

    monkeypatch.setattr(cutoff_gate, "CUTOFF_GATE", RecordingGate(cutoff_gate.CUTOFF_GATE.directory, handover_grid_s=0))
    shutil.rmtree(run_dir(data_dir), ignore_errors=True)
    checkpoint_path(run_dir(data_dir)).unlink(missing_ok=True)
    return leased


def test_a_later_cutoff_never_takes_the_gate_before_an_earlier_one_of_the_same_run(data_dir, leased):
    """A re-attack of issue 30: the episode whose sandbox takes the gate after another cutoff's
    starts at the moment that one ended, its agent's to choose (4-5 bits a handover). In a run the
    gate passes from earlier cutoffs to later ones only: here the later query's agent runs code at
    once while the earlier one's model is slow, and still the earlier cutoff's sandbox comes first."""
    calls = api_calls_policy(2)

    def slow_for_the_earlier_query(messages: list[dict]) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        if "on February 10, 2024?" in question and not any(m["role"] == "assistant" for m in messages):
            time.sleep(1.5)
        return calls(messages)

    frame = split().head(2)
    with ChatServer(slow_for_the_earlier_query) as server:
        one_round = dataclasses.replace(agent(server.base_url), rounds=1)
        _, record = evaluate_agent(frame, data_dir, one_round, 1, query_set="t", concurrency=2)
    assert record["end_states"] == {"final_answer": 2}
    assert leased == [date(2024, 2, 9), date(2024, 2, 10)], leased


def test_the_handover_grid_an_evaluation_is_given_reaches_its_leases(data_dir, leased):
    """MIRAI_SANDBOX_HANDOVER_GRID_S (the CLI's and the Dagster asset's) passes through the
    database and the environment to each episode's lease of the gate."""
    env = EventDatabase(data_dir, sandbox_handover_grid_s=7.5).environment(date(2024, 2, 10))
    try:
        assert env.run_code("print(1)").strip() == "1"
    finally:
        env.close()
    assert leased.grids == [7.5], leased.grids


def test_a_sequential_run_takes_the_gate_in_cutoff_order_across_rounds(data_dir, leased):
    """One episode at a time, a run that went round by round handed the gate from its last cutoff
    back to its first at every new round, at a moment the last cutoff's agent chose: the rounds of
    one cutoff run together, so the gate only passes forward in time inside the run."""
    frame = split().head(2)
    with ChatServer(api_calls_policy(2)) as server:  # one code block, then the answer
        two_rounds = dataclasses.replace(agent(server.base_url), rounds=2)
        _, record = evaluate_agent(frame, data_dir, two_rounds, 1, query_set="t", concurrency=1)
    assert record["end_states"] == {"final_answer": 4}
    assert leased == [date(2024, 2, 9)] * 2 + [date(2024, 2, 10)] * 2, leased
