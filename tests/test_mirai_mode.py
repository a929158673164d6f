"""The `mirai` comparability mode (docs/mirai.md, "The `mirai` mode"): registry fields and their
record, prompts with the database's first day and the API subset, MIRAI's loop and answer
extraction, tool subsets refused in the sandbox, and MIRAI's entity counting. Episodes use the
scripted chat client of tests/test_agents.py; code runs in the real sandbox."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import polars as pl
import pytest

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.environment import API_FUNCTIONS, EVENT_FUNCTIONS, NEWS_FUNCTIONS, TOOL_SUBSETS
from pipeline.agent_api.types import MIRAI, rendering
from pipeline.evaluation.agent_config import agent_config_hash
from pipeline.evaluation.agents import react_environment, run_react, run_single_turn
from pipeline.evaluation.board import leaderboard
from pipeline.evaluation.llm import LLMError
from pipeline.evaluation.mirai_mode import mirai_answer
from pipeline.evaluation.mirai_predictions import export_predictions
from pipeline.evaluation.prompts import api_description, system_prompt
from pipeline.evaluation.registry import Agent, RegistryError, parse_agents
from pipeline.evaluation.replies import parse_action
from pipeline.evaluation.run import evaluate_agent, evaluate_baseline
from pipeline.evaluation.trajectory import AgentSpec, Query
from pipeline.storage import DataLayout
from testbed.database import generate_event_database
from tests.test_agents import ScriptedClient

QUERY = Query("2024-02-00001", date(2024, 2, 10), "USA", "CHN", "United States", "China")
DIST = "get_relation_distribution(head_entities=['USA'], tail_entities=['CHN'])"
# MIRAI's observation of a repeated action (agents/react_agents.py in github.com/yecchen/MIRAI).
REPEATED = (
    "The same action has been executed before. Try a different action with correct format. If you are collecting "
    "data with code, please make sure your action is a valid and executable code with correct syntax based on the "
    "API description; If you are making the final forecast, please start the action immediately with 'Final "
    "Answer:' without enclosing within triple backticks, for example, 'Action: Final Answer: {}'"
)
LLM = {"name": "m", "kind": "llm", "gguf": "m.gguf", "knowledge_cutoff": "2023-10"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirai-mode-db")
    generate_event_database(root, date(2024, 1, 1), 2, seed=5, quads_per_day=40)
    return root


@pytest.fixture(scope="module")
def database(data_dir):
    return EventDatabase(data_dir)


def spec(mode="mirai", action_type="single_function", tools="full", max_steps=20) -> AgentSpec:
    return AgentSpec("react", action_type, 0.0, max_steps, 256, mode=mode, tools=tools)


def episode(database, replies, agent_spec):
    client = ScriptedClient(replies)
    trajectory = run_react(
        client,
        agent_spec,
        QUERY,
        QUERY.date - timedelta(days=1),
        lambda: react_environment(database, agent_spec, QUERY.date, 1),
        first_day=database.start,
    )
    assert not client.replies, "the script was not used up"
    return trajectory, client


# --- the registry and the record ------------------------------------------------------------------


def test_registry_mode_and_tools_are_validated_with_defaults():
    react, mirai_kg, direct = parse_agents(
        {
            "agents": [
                LLM,
                LLM | {"name": "k", "mode": "mirai", "tools": "kg", "action_type": "code_block"},
                LLM | {"name": "d", "strategy": "direct", "mode": "mirai"},
            ]
        }
    )
    assert (react.mode, react.tools) == ("native", "full")
    assert (mirai_kg.mode, mirai_kg.tools) == ("mirai", "kg")
    assert (direct.mode, direct.tools) == ("mirai", None)  # Direct calls no tools
    with pytest.raises(RegistryError) as info:
        parse_agents(
            {
                "agents": [
                    LLM | {"mode": "paper"},
                    LLM | {"name": "t", "tools": "events"},
                    LLM | {"name": "c", "strategy": "cot", "tools": "kg"},
                    {"name": "b", "kind": "baseline", "baseline": "empty", "mode": "mirai"},
                ]
            }
        )
    message = str(info.value)
    assert "mode must be one of native, mirai, got 'paper'" in message
    assert "tools must be one of full, kg, news, got 'events'" in message
    assert "tools applies only to strategy react" in message
    assert "unknown fields for a baseline agent: ['mode']" in message


def test_config_hash_is_unchanged_at_the_defaults_and_changes_otherwise():
    (agent,) = parse_agents({"agents": [LLM]})
    # The hash as computed before mode and tools existed: the entry's other fields (without the
    # throughput, price and sandbox memory fields added since, which are never hashed).
    later = (
        "mode",
        "tools",
        "concurrency",
        "price_per_million_input_tokens",
        "price_per_million_output_tokens",
        "sandbox_memory_mb",
    )
    before = {k: v for k, v in dataclasses.asdict(agent).items() if k not in later}
    if before.get("endpoint"):
        before["endpoint"] = {
            k: v for k, v in before["endpoint"].items() if k not in ("requests_per_minute", "tokens_per_minute")
        }
    old_hash = hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert agent_config_hash(agent) == old_hash
    assert agent_config_hash(dataclasses.replace(agent, mode="mirai")) != old_hash
    assert agent_config_hash(dataclasses.replace(agent, tools="news")) != old_hash


def _split() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "query_id": [QUERY.query_id],
            "date": [QUERY.date],
            "s": ["USA"],
            "o": ["CHN"],
            "answer_dict": [json.dumps({"04": ["042"]})],
        }
    )


def test_mode_and_tools_are_recorded_on_every_run_and_the_leaderboard(data_dir, database):
    agent = Agent(
        name="mirai-kg",
        kind="llm",
        knowledge_cutoff=date(2023, 12, 31),
        distances=(1,),
        rounds=1,
        gguf=Path(data_dir / "none.gguf"),
        strategy="react",
        action_type="single_function",
        temperature=0.0,
        max_steps=20,
        mode="mirai",
        tools="kg",
    )
    replies = ['Thought: enough\nAction: Final Answer: {"04": ["042"]}', '<answer>{"04": ["042"]}</answer>']
    _, record = evaluate_agent(_split(), data_dir, agent, 1, client=ScriptedClient(replies), database=database)
    assert (record["mode"], record["tools"]) == ("mirai", "kg")
    assert record["answer_sources"] == {"extraction": 1} and record["metrics"]["level2_f1"] == 100
    # The exported file carries the extraction's reply as MIRAI's ext_request (issue 34, point 3).
    run_dir = DataLayout(data_dir).evaluation_dir(date(2024, 2, 1), "mirai-kg", "queries", 1)
    export_predictions(run_dir, data_dir / "exported")
    [exported] = json.loads((data_dir / "exported/round1" / f"{QUERY.query_id}.json").read_text())
    assert exported["ext_request"] == replies[1] and exported["end_state"] == "Final Answer"
    baseline = Agent(name="empty", kind="baseline", knowledge_cutoff=None, distances=(1,), rounds=1, baseline="empty")
    _, base_record = evaluate_baseline(_split(), data_dir, baseline, 1)
    assert (base_record["mode"], base_record["tools"]) == (None, None)
    # A run stored before the fields existed reads as what it was: native, with the full API.
    old = data_dir / "evaluations/2024-02/old/queries/distance=1/scores.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({k: v for k, v in record.items() if k not in ("mode", "tools")} | {"agent": "old"}))
    rows = {r["agent"]: r for r in leaderboard(data_dir).iter_rows(named=True)}
    assert (rows["mirai-kg"]["mode"], rows["mirai-kg"]["tools"]) == ("mirai", "kg")
    assert (rows["old"]["mode"], rows["old"]["tools"]) == ("native", "full")
    assert (rows["empty"]["mode"], rows["empty"]["tools"]) == (None, None)


# --- prompts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tools", list(TOOL_SUBSETS))
def test_prompts_state_the_first_day_and_only_the_subsets_functions(tools):
    text = system_prompt("react", "single_function", 20, tools=tools, first_day=date(2023, 1, 1))
    assert "It starts on January 1, 2023 (2023-01-01)" in text
    offered = [name for name in API_FUNCTIONS if f"def {name}(" in text]
    assert offered == list(TOOL_SUBSETS[tools])
    assert ("class NewsArticle(" in text) == (tools != "kg")
    assert "news articles" in text.split("It starts on")[0]  # what the database holds, per subset
    # The action example calls a function the agent has.
    example = text.split("for example ")[-1].split("(")[0]
    assert example in TOOL_SUBSETS[tools]
    with pytest.raises(ValueError, match="first day"):
        system_prompt("react", "single_function", 20, tools=tools)
    assert api_description(tools).count("def ") == len(TOOL_SUBSETS[tools])


# --- tool subsets -------------------------------------------------------------------------------


def test_functions_outside_the_subset_are_refused_in_both_action_types(database):
    for tools, absent, present in (("kg", NEWS_FUNCTIONS, EVENT_FUNCTIONS), ("news", EVENT_FUNCTIONS, NEWS_FUNCTIONS)):
        env = database.environment(QUERY.date, 1, tools=tools)
        functions = env.functions()
        for name in absent:
            with pytest.raises(NameError, match=rf"{name} is not available: .* \(tools: {tools}\)"):
                functions[name]()
        assert all(getattr(functions[name], "__self__", None) is env for name in present)
    trajectory, _ = episode(
        database,
        ["Action: get_news_articles(head_entities=['USA'])", 'Final Answer: {"04": ["042"]}'],
        spec(mode="native", tools="kg"),
    )
    refused = trajectory.steps[0]
    assert refused.observation.startswith(
        "NameError: get_news_articles is not available: this agent has the events-only"
    )
    assert refused.error == refused.observation.strip()
    # The code-block path: a second agent, same sandbox rules.
    trajectory, _ = episode(
        database,
        [
            "Action:\n```python\nprint(count_events(head_entities=['USA']) >= 0)\nget_news_articles()\n```",
            'Final Answer: {"04": ["042"]}',
        ],
        spec(mode="native", action_type="code_block", tools="kg"),
    )
    block = trajectory.steps[0]
    assert block.observation.startswith("True\nNameError: get_news_articles is not available")
    assert block.error.startswith("NameError: get_news_articles is not available")


# --- MIRAI's loop -------------------------------------------------------------------------------


def test_mirai_answer_reads_what_miraIs_extraction_reads():
    assert mirai_answer('I think\n<answer>{"04": ["042",\n "043"]}</answer>') == {"04": ["042", "043"]}
    assert mirai_answer("<answer> {} </answer>") == {}
    assert mirai_answer('Final Answer: {"04": ["042"]}') is None  # no tags: nothing
    assert mirai_answer("<answer>['04']</answer>") is None


def test_mirai_repeats_are_not_run_and_the_fourth_ends_the_episode(database):
    trajectory, client = episode(
        database,
        [f"Thought: t{i}\nAction: {DIST}" for i in range(4)] + ['Reasoning. <answer>{"04": ["042"]}</answer>'],
        spec(),
    )
    assert trajectory.end_state == "repeated_actions" and trajectory.n_actions == 4
    first, *repeats = trajectory.steps[:4]
    assert first.action_kind == "call" and first.observation.startswith("{CAMEOCode(")
    assert [s.action_kind for s in repeats] == ["repeated"] * 3 and all(s.observation is None for s in repeats)
    # MIRAI's text (agents/react_agents.py, ReactAgent.step, a repeated action).
    assert client.calls[2][-1]["content"] == f"Observation: {REPEATED}"
    # The answer is always extracted by a separate request: one user message, the last useful step.
    extraction = client.calls[-1]
    assert [m["role"] for m in extraction] == ["user"] and DIST in extraction[0]["content"]
    assert "<answer>" in extraction[0]["content"] and "January 1, 2024" in extraction[0]["content"]
    assert (trajectory.answer, trajectory.answer_source) == ({"04": ["042"]}, "extraction")
    assert trajectory.steps[-1].kind == "extraction"


def test_mirai_invalid_actions_null_actions_and_expressions(database):
    trajectory, client = episode(
        database,
        [
            "Thought: I am not sure yet.\nAction:",  # empty: told so, not counted as invalid
            "Action: get_events(head_entities=['USA'], tail_entities=['CHN'])[:2]",  # MIRAI eval()s expressions
            "Action: count_events(head_entities=['USA']) > 0",
            "Action: get_events(date_range=DateRange('2024-02-01', '2024-02-20'))",  # DateGateError
            "Action: count_events(",  # not Python
            "Action: __import__('os').system('id')",  # runs in the sandbox, which refuses it
            "no tags here",  # extraction: nothing readable
        ],
        spec(),
    )
    assert trajectory.end_state == "invalid_actions" and trajectory.n_actions == 6
    null, sliced, compared, gated, broken, escape = trajectory.steps[:6]
    assert null.action_kind == "null" and null.error is None
    assert client.calls[1][-1]["content"] == "Observation: No feedback from the environment due to the null action."
    assert sliced.observation.startswith("[Event(") and sliced.observation.count("Event(date=") == 2
    assert compared.observation == "True"
    assert gated.error.startswith("invalid action: DateGateError")
    # MIRAI shows str() of the exception, then its note for function calls (react_agents.py).
    assert client.calls[4][-1]["content"] == (
        f"Observation: Invalid action: {gated.error.removeprefix('invalid action: DateGateError: ')}. Please make "
        "sure your action is a valid and executable function call with correct arguments based on the API description."
    )
    assert broken.error.startswith("invalid action: SyntaxError") and broken.observation is None
    assert "ImportError: import of 'os' is not allowed" in escape.error
    assert (trajectory.answer, trajectory.answer_source) == ({}, "none")
    # Native mode still accepts only one call of an API function.
    assert parse_action("Action: count_events(head_entities=['USA']) > 0", "single_function")[2].kind == "invalid"


def test_mirai_final_answer_is_extracted_and_code_blocks_follow_mirai(database):
    trajectory, client = episode(
        database,
        [
            "Action:\n```python\nn = count_events(head_entities=['USA'])\n```",  # no print(): invalid
            "Action:\n```python\nn = count_events(head_entities=['USA'])\nfor e in []:\n    print(e)\n```",  # printed nothing
            "Action: print('n =', n)\nn",  # unfenced code runs whole; a last expression is not echoed
            'Thought: done\nAction: Final Answer: {"04": ["042"]}',
            "<answer>{}</answer>",  # the extractor's reading is the answer, as in MIRAI
        ],
        spec(action_type="code_block", max_steps=5),
    )
    silent, empty, printed, final, _ = trajectory.steps
    assert silent.error == "invalid action: No print() statement in the action"
    # MIRAI's texts (agents/react_agents.py, the code-block branch of ReactAgent.step).
    assert client.calls[1][-1]["content"] == (
        "Observation: Invalid action: No print() statement in the action. If you are collecting data with code, "
        "please make sure your action is a valid and executable block of code with correct syntax based on the API "
        "description, and use print() for outputs; If you are making the final forecast, please start the action "
        "immediately with 'Final Answer:' without enclosing within triple backticks, for example, 'Action: Final "
        "Answer: {}'"
    )
    assert empty.error is None
    assert empty.observation == "No printed output from the action because you are printing an empty object."
    assert printed.observation.startswith("n = ") and printed.observation.count("\n") == 1
    assert trajectory.end_state == "final_answer" and final.action_kind == "final"
    info = client.calls[-1][0]["content"]
    assert "Final Answer: {" in info and "print('n =', n)" in info and "for e in []" not in info  # the last two
    assert (trajectory.answer, trajectory.answer_source) == ({}, "extraction")


def test_mirai_max_steps_and_direct_extraction(database):
    trajectory, _ = episode(
        database,
        [f"Action: count_events(head_entities=['{c}'])" for c in ("USA", "CHN")] + ['<answer>{"01": []}</answer>'],
        spec(max_steps=2),
    )
    assert (trajectory.end_state, trajectory.answer) == ("max_steps", {"01": []})
    client = ScriptedClient(['Final Answer: {"04": ["042"]}', '<answer>{"04": ["040"]}</answer>'])
    direct = run_single_turn(
        client, AgentSpec("direct", None, 0.0, None, 256, mode="mirai"), QUERY, QUERY.date - timedelta(days=1)
    )
    assert direct.end_state == "final_answer" and direct.answer == {"04": ["040"]}
    assert "No database was used" in client.calls[-1][0]["content"]
    # The answer is only ever the extracted one: a failed extraction leaves none.
    failed = run_single_turn(
        ScriptedClient(['Final Answer: {"04": ["042"]}', LLMError("HTTP 500")]),
        AgentSpec("direct", None, 0.0, None, 256, mode="mirai"),
        QUERY,
        QUERY.date - timedelta(days=1),
    )
    assert (failed.answer, failed.answer_source, failed.steps[-1].error) == ({}, "none", "HTTP 500")


# --- get_entity_distribution --------------------------------------------------------------------


@pytest.mark.parametrize("role", ["head", "tail", "both", None])
@pytest.mark.parametrize("partners", [None, ["USA", "CHN"]])
def test_entity_distribution_counts_as_mirais_code_in_mode_mirai(database, role, partners):
    documented = database.environment(QUERY.date, 1)
    mirai = database.environment(QUERY.date, 1, count_both_actors=True)
    events = documented.tables()[0].select(pl.col("s").cast(pl.String), pl.col("o").cast(pl.String)).rows()
    # MIRAI's APIs/api_implementation.py: the role picks the column that must hold a partner,
    # then both actor columns of the kept events are counted.
    wanted = set(partners or [])
    keep = {
        "head": lambda s, o: o in wanted,
        "tail": lambda s, o: s in wanted,
        "both": lambda s, o: s in wanted or o in wanted,
        None: lambda s, o: s in wanted or o in wanted,
    }[role]
    kept = [(s, o) for s, o in events if partners is None or keep(s, o)]
    expected = Counter([s for s, _ in kept] + [o for _, o in kept])
    got = mirai.get_entity_distribution(interacted_entities=partners, entity_role=role)
    assert {iso.code: n for iso, n in got.items()} == dict(expected)
    assert list(got.values()) == sorted(got.values(), reverse=True)
    # The documented meaning stays the default: 'head' counts subjects only.
    if role == "head":
        heads = Counter(s for s, o in events if partners is None or o in wanted)
        assert {
            iso.code: n
            for iso, n in documented.get_entity_distribution(interacted_entities=partners, entity_role=role).items()
        } == dict(heads)


def test_mode_mirai_reaches_the_sandboxs_entity_counting(database):
    trajectory, _ = episode(
        database,
        [
            "Action: get_entity_distribution(interacted_entities=['CHN'], entity_role='head')",
            "<answer>{}</answer>",
        ],
        spec(max_steps=1),
    )
    env = database.environment(QUERY.date, 1, count_both_actors=True, dialect="mirai")
    expected = env.get_entity_distribution(interacted_entities=["CHN"], entity_role="head")
    # CHN is counted, as the object of every kept event: MIRAI's counting, not the documented one.
    with rendering(MIRAI):
        assert str(expected) == trajectory.steps[0].observation and "ISOCode(code='CHN')" in str(expected)
    documented = database.environment(QUERY.date, 1).get_entity_distribution(
        interacted_entities=["CHN"], entity_role="head"
    )
    assert str(documented) != str(expected)


def test_mode_mirai_code_blocks_import_numpy_and_pandas_native_ones_cannot(database):
    script = [
        "Action:\n```python\nimport numpy as np\nimport pandas as pd\n"
        "print(int(np.arange(4).sum()), len(pd.DataFrame({'a': [1, 2]})))\n```",
        'Action: Final Answer: {"04": ["042"]}',
    ]
    trajectory, client = episode(database, [*script, "<answer>{}</answer>"], spec(action_type="code_block"))
    assert trajectory.steps[0].observation.strip() == "6 2"
    modules = client.calls[0][0]["content"]
    assert "numpy" in modules and "pandas" in modules  # the prompt offers what the sandbox loaded
    trajectory, client = episode(database, script, spec(mode="native", action_type="code_block"))
    assert "ImportError" in trajectory.steps[0].observation and "numpy" in trajectory.steps[0].observation
    assert "numpy" not in client.calls[0][0]["content"]
