"""The chat client an LLM agent's registry entry describes: its endpoint's, or for a ``gguf`` agent
the client of a model server started for it (model_server.py). Either way the harness asks through
``OpenAIChatClient``."""

from __future__ import annotations

from pipeline.evaluation.llm import ChatClient, ClientSettings, OpenAIChatClient
from pipeline.evaluation.model_server import LlamaServerClient
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.throughput import RateLimiter


def client_for(agent: Agent, settings: ClientSettings | None = None, limiter: RateLimiter | None = None) -> ChatClient:
    """An endpoint's requests go through ``limiter`` (shared by the run's episodes) when given; a
    GGUF model's server is started on the first request and stopped by the client's ``close``."""
    settings = settings or ClientSettings()
    if agent.endpoint is not None:
        e = agent.endpoint
        return OpenAIChatClient(
            e.base_url, e.model, e.api_key_env, seed=settings.seed, http=settings.http, limiter=limiter
        )
    if agent.gguf is not None:
        return LlamaServerClient(agent.gguf, settings)
    raise ValueError(f"{agent.name} has neither an endpoint nor a gguf model")
