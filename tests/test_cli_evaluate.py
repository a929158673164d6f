"""`mirai evaluate` as a model builder runs it: a release published by the real code and fetched
with `mirai download`, a real OpenAI-compatible server on 127.0.0.1 (testbed/chat.py, scripted
replies), the command as a subprocess, then `mirai score` on what it wrote. Its numbers must be
the harness's own (evaluate_agent in-process on the same replies); a killed run resumes without
redoing an episode; the API key shows nowhere."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from pipeline.agent_api import EventDatabase
from pipeline.cli import build_parser, main
from pipeline.cli.evaluate import evaluate_registry_entry
from pipeline.evaluation.registry import parse_agents
from pipeline.evaluation.run import evaluate_agent
from pipeline.evaluation.submit import prepare, score_locally
from pipeline.release.publish import publish_release
from pipeline.release.store_uri import open_store
from pipeline.splits.split import Override, build_split
from testbed.chat import ChatServer, react_policy
from testbed.database import generate_event_database

from .settings_builder import make_settings

MIRAI = str(Path(sys.executable).with_name("mirai"))
MONTH = date(2024, 2, 1)
NOW = datetime(2024, 4, 1, tzinfo=UTC)
KEY_ENV, KEY = "MIRAI_TEST_EVALUATE_KEY", "sk-test-9f3c2a7e51d04b8c"
SAMPLE = 5


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """2024-02 published to a local bucket (two small generated database months, a forced split
    with a sample of SAMPLE queries) and downloaded with `mirai download`."""
    root = tmp_path_factory.mktemp("evaluate-release")
    data_dir = root / "data"
    generate_event_database(data_dir, date(2024, 1, 1), 2, seed=5, quads_per_day=12)
    settings = make_settings(data_dir=data_dir, release_uri=str(root / "bucket"), split_sample_size=SAMPLE)
    build_split(
        MONTH, settings.dataset, settings.gdelt, now=NOW, override=Override("test", "no ledgers in this test", NOW)
    )
    publish_release(
        MONTH, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    assert main(["download", "2024-02", "--from", str(root / "bucket"), "--dest", str(root / "dl")]) == 0
    return root / "dl" / "2024-02"


# Codes the generated split's sample holds some of, at both levels: the scores are not all 0.
FINAL_ANSWER = json.dumps({"01": ["010", "011"], "04": ["040", "046"], "15": ["150"], "17": ["173"]})


class Recorder:
    """react_policy's turns (two or three, a real API call in some) ending in FINAL_ANSWER, noting
    each request's query (its first user message), so a test sees which episodes a run made."""

    def __init__(self):
        self.queries: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict]) -> str:
        with self._lock:
            self.queries.append(next(m["content"] for m in messages if m["role"] == "user"))
        reply = react_policy(messages)
        return (
            reply[: reply.index("Final Answer:")] + f"Final Answer: {FINAL_ANSWER}"
            if "Final Answer:" in reply
            else reply
        )


def _flags(base_url: str) -> list[str]:
    return [
        "--endpoint", base_url, "--model", "scripted", "--api-key-env", KEY_ENV, "--knowledge-cutoff", "2023-06",
        "--price-per-million-input-tokens", "0.5", "--price-per-million-output-tokens", "1.5",
    ]  # fmt: skip


def _mirai(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MIRAI, *args], capture_output=True, text=True, timeout=300, env=os.environ | {KEY_ENV: KEY})


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _no_key_anywhere(root: Path, *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for path in root.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_evaluate_then_score_gives_the_harness_s_numbers(release, tmp_path, monkeypatch):
    out = tmp_path / "predictions.jsonl"
    with ChatServer(Recorder()) as server:
        evaluated = _mirai("evaluate", str(release), *_flags(server.base_url), "--concurrency", "2", "--out", str(out))
        assert evaluated.returncode == 0, evaluated.stderr
        served = server.requests
    assert f"{SAMPLE}/{SAMPLE} episodes" in evaluated.stdout
    assert f"{SAMPLE} predictions in {out}" in evaluated.stdout
    scored = _mirai("score", str(out), "--split", str(release), "--sample", "--out", str(tmp_path / "card"))
    assert scored.returncode == 0, scored.stderr
    card = json.loads((tmp_path / "card" / "scorecard.json").read_text())
    assert card["queries"] == SAMPLE and card["missing"]["count"] == 0

    # The same agent entry, run in-process by the harness on the same scripted replies.
    monkeypatch.setenv(KEY_ENV, KEY)
    with ChatServer(Recorder()) as server:
        args = build_parser().parse_args(["evaluate", str(release), *_flags(server.base_url)])
        (agent,) = parse_agents({"agents": [evaluate_registry_entry(args)]})
        results, record = evaluate_agent(
            release / "queries_sample.parquet", tmp_path / "reference", agent, 1, database=EventDatabase(release)
        )
        assert server.requests == served
    expected = [
        {"query_id": q, "answer": json.loads(p), "ranked": list(r)}
        for q, p, r in results.select("query_id", "prediction", "ranked").iter_rows()
    ]
    assert _lines(out) == expected
    for metric, value in record["metrics"].items():
        if metric in card["metrics"]:
            assert card["metrics"][metric]["value"] == pytest.approx(value, abs=5e-5), (
                metric
            )  # the card rounds to 4 places
    assert {"level2_f1", "mrr"} <= set(card["metrics"]) & set(record["metrics"])
    assert 0 < card["metrics"]["level2_f1"]["value"] < card["metrics"]["level1_f1"]["value"] < 100  # percent
    cost = (record["tokens_in"] * 0.5 + record["tokens_out"] * 1.5) / 1e6
    assert f"tokens in/out {record['tokens_in']}/{record['tokens_out']}, cost ${cost:.4f}" in evaluated.stdout

    # mirai submit's own checks (all but the upload) take the file, with the run's tokens and cost.
    meta = {
        "model": "scripted", "knowledge_cutoff": "2023-06-30", "contact": "me@example.org", "month": "2024-02",
        "query_set": "queries_sample", "distance": 1, "rounds": 1, "api_mode": "native",
        "action_type": "single_function", "tokens_in": record["tokens_in"], "tokens_out": record["tokens_out"],
        "cost_usd": record["cost_usd"],
    }  # fmt: skip
    (tmp_path / "submission.json").write_text(json.dumps(meta))
    prepared, problems = prepare("scripted-2024-02", out, tmp_path / "submission.json")
    assert problems == []
    assert score_locally(prepared, release).card["metrics"] == card["metrics"]
    _no_key_anywhere(tmp_path, evaluated.stdout, evaluated.stderr)


def test_a_killed_run_resumes_without_redoing_an_episode(release, tmp_path):
    out = tmp_path / "predictions.jsonl"
    command = [MIRAI, "evaluate", str(release), "--concurrency", "1", "--out", str(out)]
    recorder = Recorder()
    with ChatServer(recorder, hold_after=4) as server:  # the 5th request waits: an episode is in flight
        command += _flags(server.base_url)
        first = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {KEY_ENV: KEY}
        )
        deadline = time.monotonic() + 120
        while server.held == 0 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.held == 1, first.communicate()
        first.send_signal(signal.SIGINT)
        stdout1, stderr1 = first.communicate(timeout=60)
        assert first.returncode == 130 and "mirai evaluate: interrupted" in stderr1, stderr1
        assert not out.exists()
        (checkpoint,) = (tmp_path / "predictions.jsonl.run").rglob("*.episodes.jsonl")
        done = {json.loads(line)["query_id"] for line in checkpoint.read_text().splitlines()}
        assert 1 <= len(done) < SAMPLE

        server.release()
        recorder.queries.clear()
        second = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ | {KEY_ENV: KEY})
        assert second.returncode == 0, second.stderr
        assert "resuming from" in second.stdout and f"{SAMPLE}/{SAMPLE} episodes" in second.stdout
        assert len(set(recorder.queries)) == SAMPLE - len(done)  # only the episodes not checkpointed ran
        assert len(_lines(out)) == SAMPLE and not checkpoint.exists()
        written = out.read_bytes()

        # Run again: the stored run is reused, no request is made, the file is the same.
        recorder.queries.clear()
        third = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ | {KEY_ENV: KEY})
        assert third.returncode == 0, third.stderr
        assert "no episode re-run" in third.stdout and recorder.queries == []
        assert out.read_bytes() == written
    scored = _mirai("score", str(out), "--split", str(release), "--sample")
    assert scored.returncode == 0, scored.stderr
    _no_key_anywhere(tmp_path, stdout1, stderr1, second.stdout, second.stderr, third.stdout, third.stderr)


def test_several_rounds_go_to_mirai_round_directories_that_score(release, tmp_path):
    out = tmp_path / "rounds"
    with ChatServer(Recorder()) as server:
        evaluated = _mirai("evaluate", str(release), *_flags(server.base_url), "--rounds", "2", "--out", str(out))
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"{2 * SAMPLE}/{2 * SAMPLE} episodes" in evaluated.stdout
    assert sorted(p.name for p in out.iterdir()) == ["round1", "round2"]
    assert len(list((out / "round2").glob("*.json"))) == SAMPLE
    scored = _mirai("score", str(out), "--split", str(release), "--sample", "--out", str(tmp_path / "card"))
    assert scored.returncode == 0, scored.stderr
    assert json.loads((tmp_path / "card" / "scorecard.json").read_text())["rounds"] == 2


def test_a_rate_limited_endpoint_is_waited_for_and_the_run_says_so(release, tmp_path):
    """The endpoint's first two answers are 429 with a Retry-After: the run waits, loses nothing,
    writes what an unthrottled run writes, and its last lines say how long it waited and why."""
    out, unthrottled = tmp_path / "predictions.jsonl", tmp_path / "unthrottled.jsonl"
    with ChatServer(Recorder(), failures=[(429, {"Retry-After": "1"})] * 2) as server:
        limited = _mirai("evaluate", str(release), *_flags(server.base_url), "--concurrency", "2", "--out", str(out))
    assert limited.returncode == 0, limited.stderr
    waited = re.search(r"rate limits: waited (\d+\.\d) s in all, 2 429 response\(s\) from the endpoint", limited.stdout)
    assert waited and float(waited[1]) >= 1.0, limited.stdout
    with ChatServer(Recorder()) as server:
        plain = _mirai("evaluate", str(release), *_flags(server.base_url), "--out", str(unthrottled))
    assert plain.returncode == 0 and "rate limits" not in plain.stdout, plain.stdout
    assert _lines(out) == _lines(unthrottled)


def test_a_rejected_key_stops_the_run_in_one_line(release, tmp_path):
    out = tmp_path / "predictions.jsonl"
    with ChatServer(Recorder(), fail_when=lambda messages: 401) as server:
        refused = _mirai("evaluate", str(release), *_flags(server.base_url), "--out", str(out))
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("mirai evaluate: error: scripted at ") and "401" in refused.stderr
    assert not out.exists()
    _no_key_anywhere(tmp_path, refused.stdout, refused.stderr)


def test_an_endpoint_that_is_not_running_is_one_line_before_any_episode(release, tmp_path):
    """Issue 33, point 1: against a port nothing listens on, the run printed no error, exited 0
    after 115 s with empty answers, and a re-run kept them."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    out, started = tmp_path / "predictions.jsonl", time.monotonic()
    refused = _mirai("evaluate", str(release), *_flags(f"http://127.0.0.1:{port}/v1"), "--out", str(out))
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert f"the endpoint http://127.0.0.1:{port}/v1 does not answer" in refused.stderr
    assert time.monotonic() - started < 60 and not out.exists()
    assert not any(path.is_file() for path in tmp_path.rglob("*.jsonl"))  # no episode was recorded


def _first_query_fails(status: int, headers: dict[str, str]):
    """A fail_when for ChatServer: every request of the first query it sees answered ``status``
    (with ``headers``) while ``failing[0]``; the others answered."""
    seen: list[str] = []
    failing = [True]

    def fail_when(messages: list[dict]):
        query = next(m["content"] for m in messages if m["role"] == "user")
        seen[:] = seen or [query]
        return (status, headers) if failing[0] and query == seen[0] else None

    return fail_when, failing


def test_an_episode_that_failed_on_transport_is_run_again_by_the_same_command(release, tmp_path):
    """Issue 33, point 1: an episode whose endpoint answered 503 through every retry is stored as
    failed on transport, the run exits 3 saying so, and the same command, once the endpoint is
    well, runs that episode and no other again (today: exit 0, and "no episode re-run")."""
    out = tmp_path / "predictions.jsonl"
    fail_when, failing = _first_query_fails(503, {"Retry-After": "0"})
    recorder = Recorder()
    with ChatServer(recorder, fail_when=fail_when) as server:
        command = ["evaluate", str(release), *_flags(server.base_url), "--concurrency", "1", "--out", str(out)]
        first = _mirai(*command)
        assert first.returncode == 3, (first.stdout, first.stderr)
        assert f"failed episodes: 1 of {SAMPLE} (transport 1)" in first.stdout
        assert len(first.stderr.splitlines()) == 1 and "1 episode(s) failed on transport" in first.stderr
        assert "next: mirai score" not in first.stdout and len(_lines(out)) == SAMPLE
        (scores,) = (tmp_path / "predictions.jsonl.run").rglob("scores.json")
        assert json.loads(scores.read_text())["failures"] == {"transport": 1}

        failing[0] = False
        recorder.queries.clear()
        second = _mirai(*command)
        assert second.returncode == 0, second.stderr
        assert "1 failed episode(s) of the run in" in second.stdout and "failed episodes" not in second.stdout
        assert len(set(recorder.queries)) == 1  # that episode only
        assert {line["answer"] == json.loads(FINAL_ANSWER) for line in _lines(out)} == {True}
        assert json.loads(scores.read_text())["failures"] == {}

        recorder.queries.clear()
        third = _mirai(*command)
        assert third.returncode == 0 and "no episode re-run" in third.stdout and recorder.queries == []


def test_retry_failed_runs_episodes_that_failed_otherwise_again(release, tmp_path):
    """An episode whose request the endpoint refused (400) is done: a re-run keeps it, and exits 0;
    --retry-failed runs it, and only it, again."""
    out = tmp_path / "predictions.jsonl"
    fail_when, failing = _first_query_fails(400, {})
    recorder = Recorder()
    with ChatServer(recorder, fail_when=fail_when) as server:
        command = ["evaluate", str(release), *_flags(server.base_url), "--concurrency", "1", "--out", str(out)]
        first = _mirai(*command)
        assert first.returncode == 0, first.stderr
        assert f"failed episodes: 1 of {SAMPLE} (request 1)" in first.stdout and "next: mirai score" in first.stdout

        failing[0] = False
        recorder.queries.clear()
        kept = _mirai(*command)
        assert kept.returncode == 0 and "no episode re-run" in kept.stdout and recorder.queries == []
        assert f"failed episodes: 1 of {SAMPLE} (request 1)" in kept.stdout

        retried = _mirai(*command, "--retry-failed")
        assert retried.returncode == 0, retried.stderr
        assert "1 failed episode(s) of the run in" in retried.stdout and len(set(recorder.queries)) == 1
        assert "failed episodes" not in retried.stdout
        assert {line["answer"] == json.loads(FINAL_ANSWER) for line in _lines(out)} == {True}


def _subset_rule(query_ids: list[str], n: int) -> list[str]:
    """docs/evaluate-your-agent.md's rule for --limit N, written out apart from the code."""
    picked = set(sorted(query_ids, key=lambda q: hashlib.sha256(f"mirai-limit-v1:{q}".encode()).hexdigest())[:n])
    return [q for q in query_ids if q in picked]


def test_limit_runs_a_reproducible_subset_that_score_and_submit_understand(release, tmp_path):
    """Issue 33, point 1 (and 7): `--limit 3` runs the 3 queries the documented rule picks; its
    printed `mirai score` command scores them as a subset of 3 of 5 (the release's files and
    their sha256 untouched); `mirai submit` scores the same subset and refuses to upload it."""
    out = tmp_path / "predictions.jsonl"
    all_ids = pl.read_parquet(release / "queries_sample.parquet").get_column("query_id").to_list()
    with ChatServer(Recorder()) as server:
        evaluated = _mirai("evaluate", str(release), *_flags(server.base_url), "--limit", "3", "--out", str(out))
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"3 queries (the --limit subset of {SAMPLE})" in evaluated.stdout and "3/3 episodes" in evaluated.stdout
    assert [line["query_id"] for line in _lines(out)] == _subset_rule(all_ids, 3)
    (scores,) = (tmp_path / "predictions.jsonl.run").rglob("scores.json")
    assert json.loads(scores.read_text())["subset"]["limit"] == 3
    hint = next(line for line in evaluated.stdout.splitlines() if line.startswith("next: mirai score "))
    assert "--limit 3" in hint

    scored = _mirai(*hint.removeprefix("next: mirai ").split(), "--out", str(tmp_path / "card"))
    assert scored.returncode == 0, scored.stderr
    assert f"a subset: 3 of {SAMPLE} queries (--limit 3" in scored.stdout and "0 missing" in scored.stdout
    card = json.loads((tmp_path / "card" / "scorecard.json").read_text())
    assert card["queries"] == 3 and card["subset"]["of"] == SAMPLE and card["split"]["manifest_checked"]

    meta = {
        "model": "scripted", "knowledge_cutoff": "2023-06-30", "contact": "me@example.org", "month": "2024-02",
        "query_set": "queries_sample", "distance": 1, "rounds": 1, "api_mode": "native",
        "action_type": "single_function", "tokens_in": None, "tokens_out": None, "cost_usd": None,
    }  # fmt: skip
    (tmp_path / "submission.json").write_text(json.dumps(meta))
    store = tmp_path / "store"
    submitted = _mirai(
        "submit", str(out), "--meta", str(tmp_path / "submission.json"), "--name", "try-3",
        "--split", str(release), "--store", str(store),
    )  # fmt: skip
    assert submitted.returncode == 1, submitted.stdout
    assert f"a subset: 3 of {SAMPLE} queries" in submitted.stdout
    assert "--limit 3 subset" in submitted.stderr and "nothing was uploaded" in submitted.stderr
    assert not any(path.is_file() for path in store.rglob("*"))


def test_a_terminal_gets_a_progress_bar_with_the_time_left(release, tmp_path):
    """Issue 33, point 1: on a terminal (stderr a pseudo-terminal) tqdm's bar with the episodes'
    rate and the time left; not the periodic lines, which remain for logs (the other tests)."""
    out = tmp_path / "predictions.jsonl"
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's 120 columns
    with ChatServer(Recorder()) as server:
        run = subprocess.Popen(
            [MIRAI, "evaluate", str(release), *_flags(server.base_url), "--concurrency", "1", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            env=os.environ | {KEY_ENV: KEY},
        )
        os.close(follower)
        shown = b""
        while True:  # until the child closes the terminal (EIO on Linux)
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        stdout, _ = run.communicate(timeout=300)
    os.close(leader)
    assert run.returncode == 0, shown
    bar = shown.decode(errors="replace")
    assert re.search(rf"{SAMPLE}/{SAMPLE} \[\d\d:\d\d<00:00, +[\d.]+(?:s/episode|episode/s)", bar), bar
    assert re.search(rf"[1-4]/{SAMPLE} \[\d\d:\d\d<\d\d:\d\d", bar), bar  # the time left, while it ran
    assert "tokens in/out" in bar
    assert "episodes, tokens in/out" not in stdout and f"{SAMPLE} predictions in {out}" in stdout


def test_an_endpoint_that_stops_answering_stops_the_run_after_a_few_episodes(release, tmp_path):
    """An endpoint that answers its models list but 503 to every completion: the run stops after
    TRANSPORT_FAILURES_TO_STOP episodes in a row failed on transport, in one line, instead of
    spending every remaining episode's retries; the next run of the same command runs them all."""
    out = tmp_path / "predictions.jsonl"
    recorder, down, refused = Recorder(), [True], set()

    def fail_when(messages: list[dict]):
        if down[0]:
            refused.add(next(m["content"] for m in messages if m["role"] == "user").splitlines()[0])  # the question
            return 503, {"Retry-After": "0"}
        return None

    with ChatServer(recorder, fail_when=fail_when) as server:
        command = ["evaluate", str(release), *_flags(server.base_url), "--concurrency", "1", "--out", str(out)]
        first = _mirai(*command)
        assert first.returncode == 1, (first.stdout, first.stderr)
        assert "the endpoint stopped answering: 3 episodes in a row failed on transport" in first.stderr
        assert len(first.stderr.strip().splitlines()) == 1, first.stderr
        assert len(refused) == 3  # the other SAMPLE - 3 episodes were not tried

        down[0] = False
        recorder.queries.clear()
        second = _mirai(*command)
        assert second.returncode == 0, second.stderr
        assert len(set(recorder.queries)) == SAMPLE and len(_lines(out)) == SAMPLE
