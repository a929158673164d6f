"""Dagster resources: one per external system the pipeline talks to, plus the data layout.

Each resource holds its part of pipeline.config.Settings as typed config fields (shown, with their
defaults, on the Resources page and in the launchpad, where a run can override them), and
``pipeline_settings`` merges the parts an asset uses back into the plain Settings that pipeline/
code takes. definitions.py builds them with ``resources_from_env``: a field whose environment
variable (README.md's table) is set takes its value, so every variable keeps working; the alert
webhook URL, a secret, stays a ``dg.EnvVar``. Tests swap resources (``resources_for``) instead of
setting variables. docs/deploy.md ("Resources") says how the launchpad and the environment relate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import dagster as dg
from pydantic import Field

from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.config import Settings, env_names
from pipeline.evaluation.llm import DEFAULT_MAX_TOKENS, DEFAULT_N_CTX, DEFAULT_SEED, ClientSettings
from pipeline.evaluation.throughput import RateLimits

_DEFAULT = Settings()


class SettingsPart(dg.ConfigurableResource):
    """A resource whose fields are Settings fields of the same name (Dagster config types: paths as
    str). ``_RENAMED`` maps a field whose name reads badly inside its resource."""

    _RENAMED: ClassVar[Mapping[str, str]] = {}

    def settings_values(self) -> dict[str, object]:
        return {self._RENAMED.get(name, name): getattr(self, name) for name in type(self).model_fields}

    @classmethod
    def settings_field(cls, name: str) -> str:
        return cls._RENAMED.get(name, name)

    @classmethod
    def from_settings(cls, settings: Settings, only: set[str] | None = None, **fields) -> SettingsPart:
        """The resource holding ``settings``' values (only the Settings fields in ``only``, if
        given; the rest keep their defaults), then ``fields`` (its own field names)."""
        values: dict[str, object] = {}
        for name in cls.model_fields:
            field = cls.settings_field(name)
            if only is None or field in only:
                value = getattr(settings, field)
                values[name] = str(value) if isinstance(value, Path) else value
        return cls(**{**values, **fields})


class Dataset(SettingsPart):
    """Where the data live and what the dataset is: the data directory, MIRAI's thresholds and the
    split parameters, the agent registry. The partitions' start and end dates are not here: Dagster
    partitions are fixed when the code location loads, so they come from MIRAI_START_DATE and
    MIRAI_END_DATE only (assets/partitions.py)."""

    data_dir: str = Field(
        default=str(_DEFAULT.data_dir), description="MIRAI_DATA_DIR: root of every stored file (docs/data-layout.md)"
    )
    day_lock_timeout_s: float = Field(
        default=_DEFAULT.day_lock_timeout_s, description="wait for another run's lock on a day"
    )
    user_agent: str = Field(
        default=_DEFAULT.user_agent, description="User-Agent of every request (GDELT, news sites, webhook)"
    )
    article_min_mentions: int = Field(
        default=_DEFAULT.article_min_mentions,
        description="quads with at least this many daily mentions get articles (MIRAI §2)",
    )
    test_min_mentions: int = Field(
        default=_DEFAULT.test_min_mentions, description="a test query's quad needs this many daily mentions"
    )
    test_min_articles: int = Field(
        default=_DEFAULT.test_min_articles, description="... and this many filtered articles"
    )
    split_sample_size: int = Field(default=_DEFAULT.split_sample_size, description="queries in the balanced sample")
    split_seed: int = Field(default=_DEFAULT.split_seed, description="seed of the balanced sample")
    split_grace_days: int = Field(
        default=_DEFAULT.split_grace_days, description="days after a month's end before its split"
    )
    agent_distance_days: int = Field(
        default=_DEFAULT.agent_distance_days, description="an agent answering for day t sees data up to t - distance"
    )
    agents_file: str = Field(default=str(_DEFAULT.agents_file), description="the agent registry (docs/evaluation.md)")
    generated_source: str = Field(
        default=_DEFAULT.generated_source, description='"" = GDELT\'s feed; else names generated data (the demo)'
    )


class GdeltFeed(SettingsPart):
    """GDELT 2.0's 15-minute file feed and its index (pipeline/gdelt)."""

    _RENAMED: ClassVar[Mapping[str, str]] = {"base_url": "gdelt_base_url"}

    base_url: str = Field(default=_DEFAULT.gdelt_base_url, description="GDELT_BASE_URL: the feed or a mirror")
    connect_timeout_s: float = Field(default=_DEFAULT.connect_timeout_s, description="also the release store's")
    read_timeout_s: float = Field(default=_DEFAULT.read_timeout_s, description="also the release store's")
    download_deadline_s: float = Field(default=_DEFAULT.download_deadline_s, description="wall-clock cap per file")
    download_concurrency: int = _DEFAULT.download_concurrency
    download_attempts: int = _DEFAULT.download_attempts
    backoff_base_s: float = _DEFAULT.backoff_base_s
    backoff_max_s: float = _DEFAULT.backoff_max_s
    missing_grace_hours: float = Field(
        default=_DEFAULT.missing_grace_hours, description="an unlisted slot is pending this long, then missing"
    )
    late_after_hours: float = Field(
        default=_DEFAULT.late_after_hours, description="a file landing this long after its slot is late"
    )
    max_uncompressed_mb: int = Field(default=_DEFAULT.max_uncompressed_mb, description="cap on one zip member unzipped")


class ArticleFetcher(SettingsPart):
    """News sites: fetching (bounded, polite, SSRF-guarded), extraction and the OBELICS filter
    (pipeline/articles)."""

    article_include_mention_urls: bool = _DEFAULT.article_include_mention_urls
    article_profile: str = Field(
        default=_DEFAULT.article_profile, description="OBELICS filter profile: mirai | obelics"
    )
    article_domain_dedup: bool = _DEFAULT.article_domain_dedup
    extract_workers: int = _DEFAULT.extract_workers
    extract_timeout_s: float = _DEFAULT.extract_timeout_s
    fetch_concurrency: int = _DEFAULT.fetch_concurrency
    fetch_per_host: int = _DEFAULT.fetch_per_host
    fetch_max_bytes: int = Field(default=_DEFAULT.fetch_max_bytes, description="cap on a body after decompression")
    fetch_connect_timeout_s: float = _DEFAULT.fetch_connect_timeout_s
    fetch_read_timeout_s: float = _DEFAULT.fetch_read_timeout_s
    fetch_deadline_s: float = Field(default=_DEFAULT.fetch_deadline_s, description="wall-clock cap per URL")
    fetch_attempts: int = _DEFAULT.fetch_attempts
    fetch_backoff_base_s: float = _DEFAULT.fetch_backoff_base_s
    fetch_backoff_max_s: float = _DEFAULT.fetch_backoff_max_s
    fetch_max_redirects: int = _DEFAULT.fetch_max_redirects
    fetch_allow_loopback: bool = Field(
        default=_DEFAULT.fetch_allow_loopback, description="tests and the local demo only"
    )
    fetch_host_map: str = Field(
        default=_DEFAULT.fetch_host_map, description="reserved-TLD names to fixed addresses (the demo)"
    )
    fetch_respect_robots: bool = _DEFAULT.fetch_respect_robots
    fetch_robots_ttl_s: float = _DEFAULT.fetch_robots_ttl_s
    fetch_retry_schedule_h: str = Field(
        default=_DEFAULT.fetch_retry_schedule_h, description="hours after each failed run before a retry"
    )


class ReleaseBucket(SettingsPart):
    """Where monthly releases are published: S3, an S3-compatible store or a local directory
    (pipeline/release/store_uri.py; the S3 store keeps its own checksummed transfers). The S3 client is built when an
    asset or the monthly schedule opens the store, never at load."""

    _RENAMED: ClassVar[Mapping[str, str]] = {
        "uri": "release_uri",
        "public_url": "release_public_url",
        "multipart_threshold_mb": "release_multipart_threshold_mb",
        "multipart_chunk_mb": "release_multipart_chunk_mb",
        "concurrency": "release_concurrency",
        "signed_download": "release_signed_download",
    }

    uri: str = Field(
        default=_DEFAULT.release_uri,
        description='MIRAI_RELEASE_URI: s3://bucket/prefix or a path; "" = <data_dir>/releases-bucket',
    )
    public_url: str = Field(
        default=_DEFAULT.release_public_url, description='base of releases/index.json\'s URLs; "" = derived'
    )
    s3_endpoint_url: str = Field(default=_DEFAULT.s3_endpoint_url, description='"" = AWS; else any S3-compatible store')
    s3_region: str = Field(default=_DEFAULT.s3_region, description='"" = the AWS chain\'s region')
    s3_max_attempts: int = _DEFAULT.s3_max_attempts
    multipart_threshold_mb: int = _DEFAULT.release_multipart_threshold_mb
    multipart_chunk_mb: int = _DEFAULT.release_multipart_chunk_mb
    concurrency: int = Field(
        default=_DEFAULT.release_concurrency, description="requests in flight per upload or download"
    )
    signed_download: bool = _DEFAULT.release_signed_download


class Alerts(SettingsPart):
    """The alert webhook (pipeline/alerts.py). Its URL carries a token: set it as
    MIRAI_ALERT_WEBHOOK_URL, which the resource holds as an EnvVar, never as a value."""

    _RENAMED: ClassVar[Mapping[str, str]] = {
        "webhook_url": "alert_webhook_url",
        "timeout_s": "alert_timeout_s",
        "attempts": "alert_attempts",
    }

    webhook_url: str = Field(default="", description='MIRAI_ALERT_WEBHOOK_URL (a secret); "" = alerts are only logged')
    timeout_s: float = _DEFAULT.alert_timeout_s
    attempts: int = _DEFAULT.alert_attempts
    freshness_hours: float = Field(
        default=_DEFAULT.freshness_hours, description="alert when the newest landed slot is older"
    )


class LiveRounds(SettingsPart):
    """Daily live rounds (docs/live.md): what a round asks and when its answers are resolved."""

    horizons: str = Field(default=_DEFAULT.live_horizons, description="target dates t = D + h, e.g. 1,7")
    round_size: int = Field(default=_DEFAULT.live_round_size, description="questions per round")
    window_days: int = Field(default=_DEFAULT.live_window_days, description="history sampled: D - window .. D - 1")
    quiet_share: float = Field(default=_DEFAULT.live_quiet_share, description="share of less active pairs")
    seed: int = Field(default=_DEFAULT.live_seed, description="seed of the round's sample (with D)")
    resolution_grace_hours: float = Field(
        default=_DEFAULT.live_resolution_grace_hours, description="after a target date's slots settle"
    )

    _RENAMED: ClassVar[Mapping[str, str]] = {
        "horizons": "live_horizons",
        "round_size": "live_round_size",
        "window_days": "live_window_days",
        "quiet_share": "live_quiet_share",
        "seed": "live_seed",
        "resolution_grace_hours": "live_resolution_grace_hours",
    }


class LlmRuntime(dg.ConfigurableResource):
    """How LLM agents are run, beyond their registry entry; recorded in every run's scores.json."""

    max_tokens: int = DEFAULT_MAX_TOKENS  # per model reply
    n_ctx: int = DEFAULT_N_CTX  # context of a local GGUF model (capped at its training context)
    n_threads: int = 0  # CPU threads of a local model; 0 = llama.cpp's choice
    seed: int = DEFAULT_SEED
    sandbox_allow_unconfined: bool = Field(
        default=_DEFAULT.sandbox_allow_unconfined,
        description="MIRAI_SANDBOX_ALLOW_UNCONFINED: run code blocks where seccomp cannot be installed (recorded)",
    )

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


def pipeline_settings(dataset: Dataset, *parts: SettingsPart) -> Settings:
    """The plain Settings pipeline/ code takes: the layout and the given parts' values; a part not
    given keeps Settings' defaults (each asset passes every part whose settings its code reads)."""
    values = dataset.settings_values()
    for part in parts:
        values.update(part.settings_values())
    return Settings(**{k: _typed(k, v) for k, v in values.items()})


def _typed(field: str, value: object) -> object:
    return Path(value) if field in ("data_dir", "agents_file") else value


_PARTS = {
    "dataset": Dataset,
    "gdelt": GdeltFeed,
    "fetcher": ArticleFetcher,
    "release_store": ReleaseBucket,
    "alerts": Alerts,
    "live": LiveRounds,
}


def resources_for(
    settings: Settings | None = None, only: set[str] | None = None, **overrides
) -> dict[str, dg.ConfigurableResource]:
    """Every resource, keyed as definitions.py binds them, holding ``settings`` (default: Settings'
    defaults) with ``overrides`` (Settings field names). Tests and the demo pass what they change."""
    settings = (settings or Settings()).with_(**{k: _typed(k, v) for k, v in overrides.items()})
    only = None if only is None else only | set(overrides)
    resources: dict[str, dg.ConfigurableResource] = {
        key: cls.from_settings(settings, only) for key, cls in _PARTS.items()
    }
    llm_only = only is None or "sandbox_allow_unconfined" in only
    resources["llm"] = (
        LlmRuntime(sandbox_allow_unconfined=settings.sandbox_allow_unconfined) if llm_only else LlmRuntime()
    )
    return resources


def resources_from_env(env: Mapping[str, str] | None = None) -> dict[str, dg.ConfigurableResource]:
    """The deployment's resources: each field whose environment variable is set (and not empty)
    takes its value; the rest keep their defaults, so the Resources page shows what the
    environment changed. A bad value fails the code location's load with the variable named."""
    env = os.environ if env is None else env
    settings = Settings.from_env(env)
    names = env_names()
    only = {field for field, name in names.items() if env.get(name)}
    resources = resources_for(settings, only=only)
    if "alert_webhook_url" in only:
        resources["alerts"] = Alerts.from_settings(
            settings, only - {"alert_webhook_url"}, webhook_url=dg.EnvVar(names["alert_webhook_url"])
        )
    return resources
