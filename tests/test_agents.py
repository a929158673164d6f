"""The LLM agent harness with a scripted chat client (pipeline/evaluation/{agents,llm,prompts}.py,
evaluate_agent in run.py): action parsing, every end state, the extra final-answer request, the
stored trajectories, and the OpenAI-compatible client against a local HTTP server."""

from __future__ import annotations

import json
import threading
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata

import polars as pl
import pytest

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.environment import API_FUNCTIONS
from pipeline.evaluation.agents import run_react, run_single_turn
from pipeline.evaluation.board import leaderboard
from pipeline.evaluation.llm import (
    HttpSettings,
    LLMError,
    ModelUnavailable,
    OpenAIChatClient,
    Reply,
)
from pipeline.evaluation.prompts import api_description, system_prompt
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.replies import execution_error, parse_action
from pipeline.evaluation.run import RESULT_DESCRIPTIONS, evaluate_agent
from pipeline.evaluation.trajectory import CONSECUTIVE_LIMIT, AgentSpec, Query
from pipeline.storage import DataLayout
from testbed.database import generate_event_database

QUERY = Query("2024-02-00001", date(2024, 2, 10), "USA", "CHN", "United States", "China")
CUTOFF = date(2024, 2, 9)
FIRST = date(2024, 1, 1)  # the generated database's first day
DIST = 'get_relation_distribution(head_entities=["USA"], tail_entities=["CHN"])'


class ScriptedClient:
    """Replies from a script, in order; a reply that is an exception is raised instead. Records
    every conversation it was sent. Zero think time, so timings measure the harness alone."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls: list[list[dict]] = []

    def chat(self, messages, *, temperature, max_tokens, stop) -> Reply:
        self.calls.append([dict(m) for m in messages])
        assert self.replies, "the harness asked for more replies than the script has"
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return Reply(
            reply, tokens_in=sum(len(m["content"]) for m in messages) // 4, tokens_out=len(reply) // 4, latency_s=0.0
        )


def react(action_type="single_function", max_steps=6) -> AgentSpec:
    return AgentSpec("react", action_type, 0.0, max_steps, 256)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents-db")
    generate_event_database(root, date(2024, 1, 1), 2, seed=3, quads_per_day=40)
    return root


@pytest.fixture(scope="module")
def database(data_dir):
    return EventDatabase(data_dir)


def episode(database, replies, spec=None, query=QUERY):
    client = ScriptedClient(replies)
    spec = spec or react()
    trajectory = run_react(
        client,
        spec,
        query,
        query.date - timedelta(days=1),
        lambda: database.environment(query.date, 1, tools=spec.tools, count_both_actors=spec.mode == "mirai"),
        first_day=database.start,
    )
    assert not client.replies, "the script was not used up"
    return trajectory, client


# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "kind", "code"),
    [
        (
            f"Thought: look at the pair.\nAction: {DIST}",
            "call",
            "get_relation_distribution(head_entities=['USA'], tail_entities=['CHN'])",
        ),
        ("Action: `count_events(head_entities = ['USA'])`", "call", "count_events(head_entities=['USA'])"),
        ("Action:\n```python\ncount_events()\n```", "call", "count_events()"),
        ("count_events()", "call", "count_events()"),  # no labels at all: the reply is the action
        ("Thought: hmm\nAction: I should look at the events first.", "invalid", ""),
        ("Action: print(count_events())", "invalid", ""),  # not an API function
        ("Action: count_events(); count_events()", "invalid", ""),  # two statements
        ("Action: __import__('os').system('id')", "invalid", ""),
    ],
)
def test_single_function_actions(reply, kind, code):
    _, _, action = parse_action(reply, "single_function")
    assert action.kind == kind
    assert action.code == code


def test_final_answers_and_code_blocks():
    thought, action_text, action = parse_action(
        'Thought: enough.\nAction: Final Answer: {"04": ["042"]}', "single_function"
    )
    assert (thought, action.kind, action.answer) == ("enough.", "final", {"04": ["042"]})
    assert action_text == 'Final Answer: {"04": ["042"]}'
    # An empty forecast is an answer; "Final Answer:" without an object is an invalid action.
    assert parse_action("Action: Final Answer: {}", "code_block")[2].answer == {}
    assert parse_action("Action: Final Answer: consult and cooperate", "code_block")[2].kind == "invalid"
    block = parse_action("Thought: t\nAction:\n```python\nx = count_events()\nprint(x)\n```", "code_block")[2]
    assert (block.kind, block.code) == ("code", "x = count_events()\nprint(x)")
    assert parse_action(f"Action: {DIST}", "code_block")[2].kind == "invalid"  # a code block needs its fence
    # "Final Answer:" in the thought does not spoil a valid call; with no valid action it counts.
    assert (
        parse_action(f"Thought: before the Final Answer: I need data\nAction: {DIST}", "single_function")[2].kind
        == "call"
    )
    assert parse_action('Final Answer: {"04": ["042"]}\nAction: none', "single_function")[2].answer == {"04": ["042"]}
    # Repeats are recognised through whitespace and quoting differences.
    a = parse_action(f"Action: {DIST}", "single_function")[2]
    b = parse_action(
        "Action: get_relation_distribution( head_entities=['USA'],tail_entities=['CHN'] )", "single_function"
    )[2]
    assert a.key == b.key


def test_execution_errors_are_told_apart_from_values():
    assert execution_error("DateGateError: date_range end 2024-03-01 is after ...", "single_function").startswith(
        "DateGateError"
    )
    assert execution_error("[Event(...)]", "single_function") is None
    assert (
        execution_error("12\nNameError: name 'x' is not defined\n", "code_block")
        == "NameError: name 'x' is not defined"
    )
    assert execution_error("count: 12\n", "code_block") is None


def test_api_description_is_generated_from_the_environment():
    text = api_description()
    assert all(f"def {name}(" in text for name in API_FUNCTIONS)
    assert "At most 30 matching events" in text  # get_events' docstring
    # The system prompt does not depend on the query, so a local model reuses its cached prefix.
    assert "USA" not in system_prompt("react", "code_block", 5, first_day=FIRST).split("```python")[0][-200:]
    assert system_prompt("react", "single_function", 7, first_day=FIRST).count("at most 7 actions") == 1


# --- episodes --------------------------------------------------------------------------------------


def test_final_answer_after_a_call(database):
    trajectory, client = episode(
        database,
        [
            f"Thought: first the pair's history.\nAction: {DIST}",
            'Thought: 042 dominates.\nAction: Final Answer: {"04": ["042"]}',
        ],
    )
    assert (trajectory.end_state, trajectory.answer_source, trajectory.answer) == (
        "final_answer",
        "final_answer",
        {"04": ["042"]},
    )
    first, last = trajectory.steps
    assert first.thought == "first the pair's history." and first.action_kind == "call" and first.error is None
    assert first.observation.startswith("{CAMEOCode(") and first.env_s > 0 and first.tokens_in > 0
    assert last.action_kind == "final" and last.observation is None
    # The model saw its own turn and then the observation, as a user message.
    assert client.calls[1][-2]["role"] == "assistant" and client.calls[1][-1]["content"].startswith(
        "Observation: {CAMEOCode("
    )
    assert "February 10, 2024" in client.calls[0][1]["content"] and "(2024-02-09)" in client.calls[0][1]["content"]
    record = trajectory.record()
    assert record["n_actions"] == 2 and json.dumps(record)  # JSON-ready


def test_max_steps_then_one_final_request(database):
    trajectory, client = episode(
        database,
        [
            f"Thought: a\nAction: {DIST}",
            "Thought: b\nAction: count_events(head_entities=['USA'])",
            'Final Answer: {"03": ["036"]}',  # the extra request
        ],
        spec=react(max_steps=2),
    )
    assert trajectory.end_state == "max_steps"
    assert (trajectory.answer, trajectory.answer_source) == ({"03": ["036"]}, "final_request")
    assert [s.kind for s in trajectory.steps] == ["react", "react", "final_request"]
    request = client.calls[-1]
    assert [m["role"] for m in request] == ["system", "user"]  # a fresh conversation ...
    assert request[0] == client.calls[0][0]  # ... under the episode's system prompt (a cached prefix)
    assert (
        "count_events(head_entities=['USA'])" in request[1]["content"]
        and "Observation: {CAMEOCode(" in request[1]["content"]
    )


def test_consecutive_invalid_actions_end_the_episode(database):
    trajectory, client = episode(
        database,
        [
            "Thought: I think they will consult.",  # no action
            # an executed action that raises counts as invalid too
            "Action: get_events(date_range=DateRange('2024-02-01', '2024-02-20'))",
            "Action: print('hi')",
            "Final Answer: nothing",  # the extra request, with no object in it
        ],
    )
    assert trajectory.end_state == "invalid_actions" and len(trajectory.steps) == CONSECUTIVE_LIMIT + 1
    assert trajectory.steps[1].action_kind == "call" and trajectory.steps[1].error.startswith("DateGateError")
    assert "invalid action" in trajectory.steps[2].error
    assert (trajectory.answer, trajectory.answer_source) == ({}, "none")
    # The model was told what was wrong after each invalid action.
    assert client.calls[1][-1]["content"].startswith("Observation: Invalid action: the action must be one Python call")
    assert client.calls[2][-1]["content"].startswith("Observation: DateGateError: date_range end 2024-02-20 is after")


def test_a_valid_action_resets_the_invalid_count(database):
    trajectory, _ = episode(
        database,
        [
            "Action: nope",
            "Action: nope again",
            f"Action: {DIST}",
            "Action: nope",
            "Action: nope?",
            'Action: Final Answer: {"01": ["010"]}',
        ],
    )
    assert trajectory.end_state == "final_answer" and trajectory.n_actions == 6


def test_repeated_actions_end_the_episode(database):
    trajectory, client = episode(
        database,
        [
            f"Action: {DIST}",
            "Action: get_relation_distribution(head_entities=['USA'], tail_entities=['CHN'])",
            f"Thought: once more\nAction: {DIST}",
            '{"04": ["043"]}',
        ],
    )
    assert trajectory.end_state == "repeated_actions" and trajectory.n_actions == CONSECUTIVE_LIMIT
    assert all(s.error is None for s in trajectory.steps[:3])
    assert "(You took this same action in your previous step.)" in client.calls[2][-1]["content"]
    assert (trajectory.answer, trajectory.answer_source) == ({"04": ["043"]}, "final_request")


def test_model_failure_ends_in_error_and_the_final_request_is_still_made(database):
    trajectory, _ = episode(database, [f"Action: {DIST}", LLMError("HTTP 500"), 'Final Answer: {"04": ["042"]}'])
    assert trajectory.end_state == "error" and trajectory.error == "LLMError: HTTP 500"
    assert trajectory.steps[1].error == "LLMError: HTTP 500"
    assert trajectory.answer_source == "final_request"
    failed_twice, _ = episode(database, [LLMError("down"), LLMError("still down")])
    assert (failed_twice.end_state, failed_twice.answer, failed_twice.steps[-1].error) == ("error", {}, "still down")


def test_a_query_on_the_databases_first_day_runs_with_an_empty_history(database):
    early = Query("2024-01-00001", date(2024, 1, 1), "USA", "CHN", "United States", "China")
    trajectory, _ = episode(
        database,
        [
            "Action: count_events(head_entities=['USA'], tail_entities=['CHN'])",
            'Final Answer: {"01": ["010"]}',
        ],
        query=early,
    )
    assert trajectory.end_state == "final_answer" and trajectory.answer == {"01": ["010"]}
    assert trajectory.steps[0].observation.strip() == "0"  # nothing is visible before the database starts


def test_code_blocks_keep_variables_and_stay_in_the_sandbox(database):
    trajectory, _ = episode(
        database,
        [
            "Thought: count\nAction:\n```python\nn = count_events(head_entities=['USA'], tail_entities=['CHN'])\nprint('n =', n)\n```",
            "Action:\n```python\nprint(n > 0)\nimport os\n```",
            'Final Answer: {"04": ["042"]}',
        ],
        spec=react("code_block"),
    )
    first, second, _ = trajectory.steps
    assert first.observation.startswith("n = ") and first.error is None
    assert second.observation.startswith("True\nImportError: import of 'os' is not allowed")
    assert second.error.startswith("ImportError")


@pytest.mark.parametrize("strategy", ["direct", "cot"])
def test_single_turn_strategies(strategy):
    spec = AgentSpec(strategy, None, 0.0, None, 256)
    answered = run_single_turn(
        ScriptedClient(['Reasoning...\nFinal Answer: {"04": ["042"], "19": ["190"]}']), spec, QUERY, CUTOFF
    )
    assert (answered.end_state, answered.answer, len(answered.steps)) == (
        "final_answer",
        {"04": ["042"], "19": ["190"]},
        1,
    )
    client = ScriptedClient(["They will probably talk.", '{"04": ["040"]}'])
    missing = run_single_turn(client, spec, QUERY, CUTOFF)
    assert (missing.end_state, missing.answer_source, missing.answer) == ("no_answer", "final_request", {"04": ["040"]})
    assert "They will probably talk." in client.calls[1][1]["content"]


# --- a stored run ----------------------------------------------------------------------------------


def _split(data_dir) -> pl.DataFrame:
    answers = [{"04": ["042"]}, {"19": ["190", "193"]}]
    return pl.DataFrame(
        {
            "query_id": ["2024-02-00001", "2024-02-00002"],
            "date": [date(2024, 2, 10), date(2024, 2, 11)],
            "s": ["USA", "RUS"],
            "o": ["CHN", "UKR"],
            "answer_dict": [json.dumps(a) for a in answers],
        }
    )


def test_evaluate_agent_stores_scores_and_trajectories(data_dir):
    agent = Agent(
        name="scripted",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=2,
        gguf=data_dir / "none.gguf",
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=3,
    )
    # Episodes run in cutoff order, the rounds of a query together (episodes._pending).
    replies = [
        # q1 round 0: a call then a right answer; round 1: a wrong answer at once
        f"Action: {DIST}",
        'Final Answer: {"04": ["042"]}',
        'Final Answer: {"01": ["010"]}',
        # q2 round 0: three invalid actions then the final request; round 1: a wrong answer at once
        "x",
        "y",
        "z",
        '{"19": ["190"]}',
        'Final Answer: {"01": ["010"]}',
    ]
    results, record = evaluate_agent(
        _split(data_dir), data_dir, agent, 1, client=ScriptedClient(replies), query_set="t"
    )
    directory = DataLayout(data_dir).evaluation_dir(date(2024, 2, 1), "scripted", "t", 1)
    assert sorted(p.name for p in directory.iterdir()) == ["results.parquet", "scores.json", "trajectories.jsonl"]
    assert json.loads((directory / "scores.json").read_text()) == record
    assert record["rounds"] == 2 and record["n"] == 2 and not record["contaminated"]
    assert record["end_states"] == {"final_answer": 3, "invalid_actions": 1}
    assert record["answer_sources"] == {"final_answer": 3, "final_request": 1}
    # Every column (an LLM run's episode columns too) is described for the evaluation asset's Columns tab.
    assert set(results.columns) == set(RESULT_DESCRIPTIONS)
    # Round 0 scores L2 F1 100 (042 exact) and 66.7 (190 of 190/193); round 1 scores 0.
    assert record["metrics"]["level2_f1"] == pytest.approx((100 + 200 / 3) / 2 / 2)
    assert record["metrics_std"]["level2_f1"] == pytest.approx(((100 + 200 / 3) / 2) / 2**0.5)
    assert results.get_column("round").to_list() == [0, 0, 1, 1]
    assert results.get_column("ranked").to_list()[:2] == [["042"], ["190"]]
    lines = [json.loads(line) for line in (directory / "trajectories.jsonl").read_text().splitlines()]
    assert [(line["round"], line["query_id"]) for line in lines] == [
        (0, "2024-02-00001"),
        (0, "2024-02-00002"),
        (1, "2024-02-00001"),
        (1, "2024-02-00002"),
    ]
    assert lines[1]["end_state"] == "invalid_actions" and len(lines[1]["steps"]) == 4
    assert record["model"] == {
        "gguf": "none.gguf",
        "gguf_bytes": None,
        "runtime": f"llama-cpp-python {metadata.version('llama-cpp-python')} (llama_cpp.server, a child process)",
    }
    assert record["harness"]["prompt_version"]


def test_evaluate_agent_stores_max_at_k_repeated_and_avg_steps_and_the_board_shows_them(data_dir):
    """Three rounds of two queries (gold 042; 190 + 193), hand-scored in the comments."""
    from pipeline.evaluation.board import markdown_table, summary

    agent = Agent(
        name="scripted3",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=3,
        gguf=data_dir / "none.gguf",
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=3,
    )
    # Episodes run in cutoff order, the rounds of a query together (episodes._pending).
    replies = [
        # q1: round 0 {04: [042]} in 1 step; round 1 {04: [042, 043]} (1 step); round 2 {} (1 step)
        'Final Answer: {"04": ["042"]}',
        'Final Answer: {"04": ["042", "043"]}',
        "Final Answer: {}",
        # q2: round 0 a call, then {19: [190]} (2 steps); round 1 three invalid actions, then
        # {19: [193]} from the final request (3 steps: the request is not a step); round 2
        # {19: [190, 193], 01: [010]} (1 step)
        f"Action: {DIST}",
        'Final Answer: {"19": ["190"]}',
        "x",
        "y",
        "z",
        '{"19": ["193"]}',
        'Final Answer: {"19": ["190", "193"], "01": ["010"]}',
    ]
    _, record = evaluate_agent(_split(data_dir), data_dir, agent, 1, client=ScriptedClient(replies), query_set="t")
    # Max@3: q1 round 0 (L2 F1 100 > 66.7 > 0); q2 round 2 (L2 P 66.7 R 100 F1 80 beats 66.7 and
    # 66.7), whose L1 {01, 19} scores P 50 R 100 F1 66.7.
    assert record["max_at_k"]["level2_f1"] == pytest.approx((100 + 80) / 2)
    assert record["max_at_k"]["level1_f1"] == pytest.approx((100 + 200 / 3) / 2)
    # repeated: q1 {04: [042]} (042 in rounds 0 and 1), q2 {19: [190, 193]} (190 in 0 and 2, 193
    # in 1 and 2; 01/010 once): both exact.
    assert record["repeated"]["level2_f1"] == pytest.approx(100)
    assert record["avg_steps"] == pytest.approx((1 + 2 + 1 + 3 + 1 + 1) / 6)
    # The mean is unchanged by all this: round L2 F1s (100 + 66.7)/2, (66.7 + 66.7)/2, (0 + 80)/2.
    assert record["metrics"]["level2_f1"] == pytest.approx((100 + 200 / 3 + 400 / 3 + 80) / 6)

    board = leaderboard(data_dir).filter(pl.col("agent") == "scripted3")
    row = board.row(0, named=True)
    assert row["aggregation"] == "mean ± std of 3 rounds; Max@3; repeated (≥ 2 of 3); avg steps"
    assert row["max_at_k_level2_f1"] == pytest.approx(90) and row["repeated_level2_f1"] == pytest.approx(100)
    assert row["avg_steps"] == pytest.approx(1.5) and row["rank"] == 1
    table = markdown_table(summary(board)).splitlines()
    assert table[0].endswith("| max_at_k_level2_f1 | repeated_level2_f1 | avg_steps | aggregation |")
    assert table[2].endswith(
        # "@" escaped, as every cell's (GFM would link a bare address); it renders as "Max@3".
        "| 90.00 | 100.00 | 1.50 | mean ± std of 3 rounds; Max\\@3; repeated (≥ 2 of 3); avg steps |"
    )


# --- the OpenAI-compatible client ------------------------------------------------------------------


class _Server:
    """A chat-completions endpoint that fails with the given statuses first, then answers."""

    def __init__(self, failures: list[int]):
        self.failures = list(failures)
        self.requests: list[tuple[dict, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((body, self.headers.get("Authorization")))
                if outer.failures:
                    self.send_response(outer.failures.pop(0))
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(b'{"error": "busy"}')
                    return
                payload = {
                    "choices": [{"message": {"content": "Final Answer: {}"}}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3},
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


FAST = HttpSettings(connect_timeout_s=2, read_timeout_s=5, attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)


def test_openai_client_retries_and_sends_the_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-secret-123")
    server = _Server([503, 429])
    try:
        client = OpenAIChatClient(server.base_url, "m", "TEST_LLM_KEY", seed=5, http=FAST)
        reply = client.chat([{"role": "user", "content": "q"}], temperature=0.0, max_tokens=8, stop=["Observation:"])
    finally:
        server.close()
    assert (reply.text, reply.tokens_in, reply.tokens_out) == ("Final Answer: {}", 11, 3)
    assert len(server.requests) == 3
    body, auth = server.requests[-1]
    assert auth == "Bearer sk-secret-123"
    assert (body["model"], body["seed"], body["max_tokens"], body["stop"]) == ("m", 5, 8, ["Observation:"])


def test_openai_client_failures_never_show_the_key(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-secret-123")
    server = _Server([401, 400])
    client = OpenAIChatClient(server.base_url, "m", "TEST_LLM_KEY", http=FAST)
    question = [{"role": "user", "content": "q"}]
    try:
        # A rejected key makes the model unavailable: the evaluation stops.
        with pytest.raises(ModelUnavailable) as rejected:
            client.chat(question, temperature=0.0, max_tokens=8, stop=[])
        # A 400 (e.g. a prompt over the context) fails this one reply.
        with pytest.raises(LLMError) as bad_request:
            client.chat(question, temperature=0.0, max_tokens=8, stop=[])
    finally:
        server.close()
    assert len(server.requests) == 2  # neither is retried
    assert "HTTP 401" in str(rejected.value) and "HTTP 400" in str(bad_request.value)
    assert "sk-secret" not in str(rejected.value) + str(bad_request.value)
    monkeypatch.delenv("TEST_LLM_KEY")
    with pytest.raises(ModelUnavailable, match=r"TEST_LLM_KEY .* is not set"):
        client.chat(question, temperature=0, max_tokens=1, stop=[])


def test_a_missing_model_stops_the_evaluation_and_stores_nothing(data_dir):
    agent = Agent(
        name="missing",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=1,
        gguf=data_dir / "missing.gguf",
        strategy="direct",
        temperature=0.0,
    )
    with pytest.raises(ModelUnavailable, match=r"missing.gguf does not exist"):
        evaluate_agent(_split(data_dir), data_dir, agent, 1, query_set="t")
    assert not (DataLayout(data_dir).root / "evaluations/2024-02/missing").exists()
