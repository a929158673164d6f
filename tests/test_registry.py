"""agents.yaml: loading, validation errors, and eligibility (pipeline/evaluation/registry.py)."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import pytest
import yaml

from pipeline.evaluation.registry import (
    Agent,
    Endpoint,
    RegistryError,
    eligibility,
    load_agents,
    parse_agents,
    parse_cutoff,
)

ROOT = Path(__file__).resolve().parents[1]

LLM = {
    "name": "gpt-4o-mini-react",
    "kind": "llm",
    "endpoint": {"base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"},
    "knowledge_cutoff": date(2023, 10, 31),
}


def parse(*entries: dict) -> tuple[Agent, ...]:
    return parse_agents({"agents": list(entries)}, base_dir=Path("/registry"))


def problems(*entries: dict) -> str:
    with pytest.raises(RegistryError) as info:
        parse(*entries)
    return str(info.value)


def test_repository_agents_yaml_lists_the_three_baselines():
    agents = load_agents(ROOT / "agents.yaml")
    assert [(a.name, a.kind, a.baseline) for a in agents] == [
        ("recurrency", "baseline", "recurrency"),
        ("frequency", "baseline", "frequency"),
        ("empty", "baseline", "empty"),
    ]
    assert agents[0].distances == (1, 7, 30, 90) and agents[2].distances == (1,)
    assert all(a.knowledge_cutoff is None and a.rounds == 1 for a in agents)


def test_commented_llm_examples_in_agents_yaml_are_valid():
    # The example entries are the comment lines that hold YAML ("  # - name: ..." and "  #   field: ...").
    lines = (ROOT / "agents.yaml").read_text().splitlines()
    examples = "\n".join(line[4:] for line in lines if re.match(r"^  # (- |  )", line))
    agents = parse_agents({"agents": yaml.safe_load(examples)}, base_dir=ROOT)
    assert [a.kind for a in agents] == ["llm", "llm"]
    assert agents[0].knowledge_cutoff == date(2023, 10, 31)  # "2023-10" is the month's last day
    assert agents[1].gguf == ROOT / "models" / "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"


def test_llm_defaults():
    (agent,) = parse(LLM)
    assert agent.endpoint == Endpoint("https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY")
    # MIRAI's setting: react, single function, temperature 0.4, 20 steps; one round at distance 1.
    assert (agent.strategy, agent.action_type, agent.temperature, agent.max_steps) == (
        "react",
        "single_function",
        0.4,
        20,
    )
    assert (agent.rounds, agent.distances, agent.gguf) == (1, (1,), None)


def test_direct_strategy_has_no_tool_settings():
    (agent,) = parse({**LLM, "strategy": "direct", "rounds": 5, "distances": [1, 7]})
    assert (agent.action_type, agent.max_steps, agent.rounds, agent.distances) == (None, None, 5, (1, 7))
    assert "action_type applies only to strategy react" in problems(
        {**LLM, "strategy": "cot", "action_type": "code_block"}
    )


def test_local_gguf_is_relative_to_the_registry():
    entry = {k: v for k, v in LLM.items() if k != "endpoint"} | {"gguf": "models/m.gguf"}
    assert parse(entry)[0].gguf == Path("/registry/models/m.gguf")


def test_yaml_file_round_trip(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  - {name: f5, kind: baseline, baseline: frequency, top_k: 5}\n"
        "  - name: local\n    kind: llm\n    gguf: m.gguf\n    knowledge_cutoff: 2023-12\n    strategy: cot\n"
    )
    frequency, local = load_agents(path)
    assert frequency.top_k == 5 and local.gguf == tmp_path / "m.gguf"
    assert local.knowledge_cutoff == date(2023, 12, 31)
    path.write_text("agents: [\n")
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_agents(path)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "x", "kind": "oracle"}, "kind must be one of baseline, llm"),
        ({"name": "x", "kind": "baseline"}, "baseline is required"),
        (
            {"name": "x", "kind": "baseline", "baseline": "magic"},
            "baseline must be one of recurrency, frequency, empty",
        ),
        (
            {"name": "x", "kind": "baseline", "baseline": "recurrency", "top_k": 3},
            "top_k applies only to the frequency",
        ),
        ({"name": "x", "kind": "baseline", "baseline": "frequency", "top_k": 0}, "top_k must be a positive integer"),
        ({"name": "x", "kind": "baseline", "baseline": "empty", "rounds": 3}, "rounds must be 1 for a baseline"),
        (
            {"name": "x", "kind": "baseline", "baseline": "empty", "temperature": 0.4},
            "unknown fields for a baseline agent: ['temperature']",
        ),
        ({"name": "x", "kind": "baseline", "baseline": "empty", "distances": []}, "distances must be a non-empty list"),
        ({"name": "x", "kind": "baseline", "baseline": "empty", "distances": [1, 1]}, "distances repeat"),
        (
            {"name": "x", "kind": "baseline", "baseline": "empty", "distances": [0]},
            "every distance must be a positive integer",
        ),
        ({**LLM, "temprature": 0.4}, "unknown fields for a llm agent: ['temprature']"),
        ({**LLM, "temperature": 3}, "temperature must be a number from 0 to 2"),
        ({**LLM, "strategy": "tot"}, "strategy must be one of direct, cot, react"),
        ({**LLM, "action_type": "shell"}, "action_type must be one of single_function, code_block"),
        ({**LLM, "max_steps": -1}, "max_steps must be a positive integer"),
        ({**LLM, "rounds": True}, "rounds must be a positive integer"),
        ({**LLM, "knowledge_cutoff": "2023-13"}, "knowledge_cutoff must be a date YYYY-MM-DD or a month YYYY-MM"),
        ({k: v for k, v in LLM.items() if k != "knowledge_cutoff"}, "knowledge_cutoff is required for an llm agent"),
        ({k: v for k, v in LLM.items() if k != "endpoint"}, "exactly one of endpoint"),
        ({**LLM, "gguf": "m.gguf"}, "exactly one of endpoint"),
        ({**LLM, "endpoint": {**LLM["endpoint"], "api_key": "sk-..."}}, "name it in api_key_env"),
        ({**LLM, "endpoint": {**LLM["endpoint"], "base_url": "api.openai.com"}}, "base_url must be an http(s) URL"),
        ({**LLM, "endpoint": {**LLM["endpoint"], "api_key_env": "OPENAI KEY"}}, "environment variable name"),
        ({**LLM, "endpoint": "https://api.openai.com/v1"}, "endpoint must be a mapping"),
        (
            {**{k: v for k, v in LLM.items() if k != "endpoint"}, "gguf": "model.bin"},
            "gguf must be the path of a .gguf",
        ),
        ({**LLM, "name": "a/b"}, "name must be letters, digits"),
        ({**LLM, "name": None}, "name must be letters, digits"),
    ],
)
def test_invalid_entries_name_the_problem(entry, message):
    assert message in problems(entry)


def test_every_problem_is_reported_with_its_entry():
    text = problems(
        {"name": "ok", "kind": "baseline", "baseline": "empty"},
        {**LLM, "temperature": 9, "rounds": 0},
        {"name": "ok", "kind": "baseline", "baseline": "empty"},
        "not a mapping",
    )
    (second,) = [line for line in text.splitlines() if "agent #2 ('gpt-4o-mini-react'): " in line]
    assert "temperature must be" in second and "rounds must be a positive integer" in second
    assert "agent #3 ('ok'): the name 'ok' is already used" in text
    assert "agent #4: expected a mapping" in text


@pytest.mark.parametrize("document", [None, [], {"agents": "recurrency"}, {"agents": [], "extra": 1}])
def test_document_shape(document):
    with pytest.raises(RegistryError, match="expected a mapping with one key, agents"):
        parse_agents(document)


def test_parse_cutoff():
    assert parse_cutoff("2024-02") == date(2024, 2, 29)  # leap year
    assert parse_cutoff("2023-10-15") == date(2023, 10, 15)
    assert parse_cutoff(date(2023, 10, 15)) == date(2023, 10, 15)
    for bad in ("2023-00", "2023/10", "yesterday", 2023):
        with pytest.raises(ValueError):
            parse_cutoff(bad)


def test_eligibility_requires_a_cutoff_before_the_month():
    (agent,) = parse({**LLM, "knowledge_cutoff": "2023-10"})  # through 2023-10-31
    assert eligibility(agent, date(2023, 11, 1)) == (True, "knowledge cutoff 2023-10-31 is before 2023-11")
    assert eligibility(agent, date(2023, 11, 20))[0]  # any day names its month
    eligible, reason = eligibility(agent, date(2023, 10, 1))
    assert not eligible
    assert "2023-10-31 is not before 2023-10-01" in reason and "contaminated" in reason
    (same_day,) = parse({**LLM, "knowledge_cutoff": date(2023, 11, 1)})
    assert not eligibility(same_day, date(2023, 11, 1))[0]  # a cutoff on the first day already sees it


def test_baselines_are_always_eligible():
    (agent,) = parse({"name": "recurrency", "kind": "baseline", "baseline": "recurrency"})
    eligible, reason = eligibility(agent, date(2024, 2, 1))
    assert eligible and "baseline" in reason
