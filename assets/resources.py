"""Dagster resources: one per settings group of pipeline/config.py, generated from it.

Each resource's config fields are its group's fields (same names, defaults and descriptions, the
description led by the environment variable; Dagster config types, so paths are str), shown on the
Resources page and in the launchpad, where a run can override them. ``settings()`` gives back the
group instance pipeline/ code takes, and ``compose`` the Settings of several. definitions.py builds
them with ``resources_from_env``: a field whose environment variable (README.md's table) is set
takes its value, so every variable keeps working; the alert webhook URL, a secret, stays a
``dg.EnvVar``. Tests swap resources (``resources_for``) instead of setting variables.
docs/deploy.md ("Resources") says how the launchpad and the environment relate. The partitions'
dates (CalendarSettings) are no resource: partitions are fixed when the code location loads
(assets/partitions.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

import dagster as dg
from pydantic import Field, create_model

from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.config import (
    AlertSettings,
    ArticleSettings,
    DatasetSettings,
    GdeltSettings,
    LiveSettings,
    NetworkSettings,
    ReleaseSettings,
    SandboxSettings,
    Settings,
    SettingsGroup,
    groups,
)
from pipeline.evaluation.llm import DEFAULT_MAX_TOKENS, DEFAULT_N_CTX, DEFAULT_SEED, ClientSettings
from pipeline.evaluation.throughput import RateLimits


def _config_value(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


class GroupResource(dg.ConfigurableResource):
    """A resource holding one settings group (``group``), field for field."""

    group: ClassVar[type[SettingsGroup]]
    # The group's attribute in Settings.
    group_name: ClassVar[str]

    def settings(self) -> SettingsGroup:
        return self.group(**{name: getattr(self, name) for name in self.group.model_fields})

    @classmethod
    def of(cls, settings: SettingsGroup, **fields: object) -> Self:
        """The resource holding the values ``settings`` was given (the rest keep their defaults,
        so the Resources page shows what was set), then ``fields``."""
        values = {name: _config_value(getattr(settings, name)) for name in settings.model_fields_set}
        return cls(**{**values, **fields})


def fields_of(group: type[SettingsGroup]) -> type[GroupResource]:
    """A GroupResource with one config field per field of ``group``, for a resource to subclass."""
    group_name = next(name for name, cls in groups().items() if cls is group)
    fields = {
        name: (
            str if info.annotation is Path else info.annotation,
            Field(default=_config_value(info.default), description=f"{info.validation_alias}: {info.description}"),
        )
        for name, info in group.model_fields.items()
    }
    resource = create_model(f"{group.__name__}Fields", __base__=GroupResource, __module__=__name__, **fields)
    resource.group, resource.group_name = group, group_name
    return resource


class Dataset(fields_of(DatasetSettings)):
    """Where the data live and what the dataset is: the data directory, MIRAI's thresholds and the
    split parameters, the agent registry."""


class Network(fields_of(NetworkSettings)):
    """What every HTTP client shares: the User-Agent, and the GDELT feed's and the release store's
    connect/read timeouts."""


class GdeltFeed(fields_of(GdeltSettings)):
    """GDELT 2.0's 15-minute file feed and its index (pipeline/gdelt)."""


class ArticleFetcher(fields_of(ArticleSettings)):
    """News sites: fetching (bounded, polite, SSRF-guarded), extraction and the OBELICS filter
    (pipeline/articles)."""


class ReleaseBucket(fields_of(ReleaseSettings)):
    """Where monthly releases are published: S3, an S3-compatible store or a local directory
    (pipeline/release/store_uri.py; the S3 store keeps its own checksummed transfers). The S3 client is built when an
    asset or the monthly schedule opens the store, never at load."""


class Alerts(fields_of(AlertSettings)):
    """The alert webhook (pipeline/alerts.py). Its URL carries a token: set it as
    MIRAI_ALERT_WEBHOOK_URL, which the resource holds as an EnvVar, never as a value."""


class LlmRuntime(fields_of(SandboxSettings)):
    """How LLM agents are run, beyond their registry entry; recorded in every run's scores.json.
    Its sandbox switch is SandboxSettings'; the other fields are run options, not settings."""

    max_tokens: int = DEFAULT_MAX_TOKENS  # per model reply
    n_ctx: int = DEFAULT_N_CTX  # context of a local GGUF model (capped at its training context)
    n_threads: int = 0  # CPU threads of a local model; 0 = llama.cpp's choice
    seed: int = DEFAULT_SEED

    sandbox_memory_mb: int = Field(
        default=DEFAULT_MEMORY_MB,
        description="what each ReAct episode's code sandbox may allocate (MB) when its agents.yaml entry sets no "
        "sandbox_memory_mb; with the machine's memory it bounds how many sandboxes run at once",
    )
    max_concurrency: int = Field(
        default=0,
        description="cap on each agent's episodes at once (agents.yaml concurrency: 8 for an endpoint, 1 for a "
        "GGUF model); 0 = no cap beyond the agent's own and the sandboxes' memory",
    )
    requests_per_minute: int = Field(
        default=0, description="an endpoint's requests per minute when its agents.yaml entry sets none; 0 = unlimited"
    )
    tokens_per_minute: int = Field(
        default=0, description="an endpoint's tokens per minute when its agents.yaml entry sets none; 0 = unlimited"
    )

    def rate_limits(self) -> RateLimits:
        return RateLimits(self.requests_per_minute or None, self.tokens_per_minute or None)

    def client_settings(self) -> ClientSettings:
        return ClientSettings(
            max_tokens=self.max_tokens, n_ctx=self.n_ctx, n_threads=self.n_threads or None, seed=self.seed
        )


class LiveRounds(fields_of(LiveSettings)):
    """Daily live rounds (docs/live.md): what a round asks and when its answers are resolved."""


def compose(*resources: GroupResource) -> Settings:
    """The Settings pipeline/ code takes: the given resources' groups; a group not given keeps its
    defaults (each asset passes every resource whose settings its code reads)."""
    return Settings(**{resource.group_name: resource.settings() for resource in resources})


# Each resource by the key definitions.py binds it to.
_RESOURCES: dict[str, type[GroupResource]] = {
    "dataset": Dataset,
    "network": Network,
    "gdelt": GdeltFeed,
    "fetcher": ArticleFetcher,
    "release_store": ReleaseBucket,
    "alerts": Alerts,
    "live": LiveRounds,
    "llm": LlmRuntime,
}


def resources_for(settings: Settings | None = None) -> dict[str, dg.ConfigurableResource]:
    """Every resource, keyed as definitions.py binds them, holding the values ``settings`` (default:
    the defaults) was given. Tests and the demo pass what they change."""
    settings = settings or Settings()
    return {key: cls.of(getattr(settings, cls.group_name)) for key, cls in _RESOURCES.items()}


def resources_from_env(env: Mapping[str, str] | None = None) -> dict[str, dg.ConfigurableResource]:
    """The deployment's resources: each field whose environment variable is set (and not empty)
    takes its value; the rest keep their defaults, so the Resources page shows what the
    environment changed. A bad value fails the code location's load with the variable named."""
    env = os.environ if env is None else env
    settings = Settings.from_env(env)
    resources = resources_for(settings)
    if "webhook_url" in settings.alerts.model_fields_set:
        # The value is replaced: the resource reads the variable when a run or sensor starts.
        resources["alerts"] = Alerts.of(settings.alerts, webhook_url=dg.EnvVar(AlertSettings.env_name("webhook_url")))
    return resources
