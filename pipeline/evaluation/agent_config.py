"""An agent's registry entry as a stored run records it: its harness mode and tools, the config
hash that makes an edited entry a new agent (the sensor's run keys and a run's checkpoint key carry
it), the model it names, the cost of its tokens and its endpoint's rate limits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from pipeline.evaluation.model_server import runtime as model_server_runtime
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.throughput import UNLIMITED, RateLimits


def agent_mode(agent: Agent) -> str | None:
    """The harness mode of an LLM agent (native unless the registry says mirai); None for a
    baseline, which has no prompts or loop."""
    return None if agent.kind != "llm" else agent.mode or "native"


def agent_tools(agent: Agent) -> str | None:
    """The API subset a ReAct agent gets (full unless the registry says kg or news); None for an
    agent that calls no tools."""
    return None if agent.kind != "llm" or agent.strategy != "react" else agent.tools or "full"


# Fields added after the first evaluations: left out of the hash at these values, so the entries
# evaluated before they existed keep their hashes (and are not evaluated again).
_HASH_DEFAULTS = {"mode": (None, "native"), "tools": (None, "full")}


# How fast and at what price an agent runs, not what it answers: changing them neither re-runs the
# agent nor invalidates a half-finished run's checkpoint (docs/evaluation.md, "Concurrency").
# The sandbox's memory budget is a run-time budget like max_tokens: recorded with the harness (and
# so in the checkpoint's key), not a new agent.
_NOT_HASHED = {"concurrency", "price_per_million_input_tokens", "price_per_million_output_tokens", "sandbox_memory_mb"}


_ENDPOINT_NOT_HASHED = {"requests_per_minute", "tokens_per_minute"}


def agent_config_hash(agent: Agent) -> str:
    """A short hash of the agent's registry entry, without the _NOT_HASHED throughput and price
    settings: a changed entry is a new agent to evaluate (the sensor's run keys carry it)."""
    fields = {
        k: v
        for k, v in dataclasses.asdict(agent).items()
        if k not in _NOT_HASHED and v not in _HASH_DEFAULTS.get(k, ())
    }
    if fields.get("endpoint"):
        fields["endpoint"] = {k: v for k, v in fields["endpoint"].items() if k not in _ENDPOINT_NOT_HASHED}
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def model_description(agent: Agent) -> dict:
    if agent.endpoint is not None:
        return {"base_url": agent.endpoint.base_url, "model": agent.endpoint.model}
    size = agent.gguf.stat().st_size if agent.gguf.exists() else None
    return {"gguf": agent.gguf.name, "gguf_bytes": size, "runtime": model_server_runtime()}


def cost_usd(agent: Agent, tokens_in: int, tokens_out: int) -> float | None:
    """The run's estimated cost from the registry's prices per million tokens; None without them."""
    if agent.price_per_million_input_tokens is None or agent.price_per_million_output_tokens is None:
        return None
    return (tokens_in * agent.price_per_million_input_tokens + tokens_out * agent.price_per_million_output_tokens) / 1e6


def endpoint_limits(agent: Agent, defaults: RateLimits = UNLIMITED) -> RateLimits:
    """The endpoint's requests and tokens per minute from its registry entry, else ``defaults``
    (LlmRuntime's)."""
    e = agent.endpoint
    return RateLimits(
        (e and e.requests_per_minute) or defaults.requests_per_minute,
        (e and e.tokens_per_minute) or defaults.tokens_per_minute,
    )
