"""One settings object, read from the environment (documented in README.md).

The Dagster resources (assets/resources.py) are built from it and build it back for pipeline/
code; the CLI and tests build it directly. The environment is read through pydantic-settings
(``_EnvSettings`` below); nothing else reads os.environ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import date, timedelta
from functools import partial
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

# HTTPS keeps the index and files private and unaltered in transit; the index's md5 per file stays
# the integrity check (pipeline/gdelt/download.py), so a mirror may still be plain HTTP.
DEFAULT_GDELT_BASE_URL = "https://data.gdeltproject.org/gdeltv2"
# Cap on one GDELT zip member unzipped. Real 15-minute files unpack to 0.6-0.9 MB (exports) and at
# most ~12 MB (the largest catch-up mentions file among GDELT 2.0's first 1000 index lines, 1.95 MB
# zipped, at the 4-6x ratio of real files); 32 MiB leaves more than twice that. Evidence in
# docs/data-layout.md ("Hostile GDELT files").
DEFAULT_MAX_UNCOMPRESSED_MB = 32


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path("./data")
    gdelt_base_url: str = DEFAULT_GDELT_BASE_URL
    start_date: date = date(2023, 1, 1)
    # HTTP: GDELT files are small (~100-400 KB) but a catch-up burst can be 10x that.
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    # Wall-clock cap per file: a server trickling bytes never trips the read timeout.
    download_deadline_s: float = 600.0
    download_concurrency: int = 8
    download_attempts: int = 4
    backoff_base_s: float = 2.0
    backoff_max_s: float = 120.0
    # A slot GDELT has not listed (or 404s) is "pending" until this many hours after its slot,
    # then "missing"; later runs keep retrying it either way.
    missing_grace_hours: float = 24.0
    # A file that landed this many hours after its slot, having been unavailable before, is "late".
    late_after_hours: float = 2.0
    # Cap on one zip member unzipped, in MiB (see DEFAULT_MAX_UNCOMPRESSED_MB).
    max_uncompressed_mb: int = DEFAULT_MAX_UNCOMPRESSED_MB
    user_agent: str = "mirai-pipeline/0.1 (+https://github.com/mirai-pipeline; GDELT benchmark builder)"
    day_lock_timeout_s: float = 1800.0
    # Articles: MIRAI fetched the articles of quads with more than 50 daily mentions (MIRAI paper, arXiv:2407.01231, §2).
    article_min_mentions: int = 50
    article_include_mention_urls: bool = False  # also first-day WEB mention URLs of those quads
    article_profile: str = "mirai"  # OBELICS filter profile: mirai | obelics
    article_domain_dedup: bool = False  # obelics profile only: OBELICS' per-domain paragraph dedup
    extract_workers: int = 2
    extract_timeout_s: float = 10.0
    # Article fetching (pipeline/articles): bounded, polite, and safe against hostile servers.
    fetch_concurrency: int = 16  # worker threads, each with its own pooled session
    fetch_per_host: int = 2  # requests in flight to one host at a time
    fetch_max_bytes: int = 5 * 2**20  # cap on a body *after* decompression (gzip-bomb guard)
    fetch_connect_timeout_s: float = 5.0
    fetch_read_timeout_s: float = 15.0
    # Wall-clock cap per URL over all attempts, redirects and backoff: a slow-drip body ends here.
    fetch_deadline_s: float = 60.0
    fetch_attempts: int = 3  # per URL per run (timeouts, resets, 429, 5xx)
    fetch_backoff_base_s: float = 1.0
    # Longest in-run wait (also for Retry-After); a longer Retry-After defers the URL to a later run.
    fetch_backoff_max_s: float = 20.0
    fetch_max_redirects: int = 5
    fetch_allow_loopback: bool = False  # tests and the local demo only
    # "*.example=127.0.0.1:8080,...": connect to these reserved-TLD names at a fixed address instead
    # of resolving them (the demo's news sites; pipeline/articles/safety.py HostMap). Empty in production.
    fetch_host_map: str = ""
    fetch_respect_robots: bool = True
    fetch_robots_ttl_s: float = 86400.0  # RFC 9309 §2.4: a cached robots.txt is used for at most 24 h
    # Later runs retry a failed URL this many hours after each failure, then give up.
    fetch_retry_schedule_h: str = "1,6,24"
    # Monthly test splits (MIRAI §2.3: 100 daily mentions, 5 articles, 100 sampled queries).
    test_min_mentions: int = 100
    test_min_articles: int = 5
    split_sample_size: int = 100
    split_seed: int = 0
    split_grace_days: int = 3  # days after a month's end before its split is built
    agent_distance_days: int = 1  # an agent answering for day t sees data up to t - distance
    # Live rounds (docs/live.md): each day D a round asks (t, s, o) for t = D + h, h in the horizons,
    # about pairs sampled (seeded) from the window's test-grade activity, a share of them less active;
    # a target date is resolved once its slots are settled and this grace has passed.
    live_horizons: str = "1,7"  # days after the publication day D
    live_round_size: int = 100  # questions per round, split evenly over the horizons
    live_window_days: int = 28  # history the sampler looks at: D - window .. D - 1
    live_quiet_share: float = 0.25  # share of pairs drawn from the window's less active pairs
    live_seed: int = 0
    live_resolution_grace_hours: float = 24.0
    # The agent registry the evaluation sensor and asset read (docs/evaluation.md).
    agents_file: Path = Path("./agents.yaml")
    # Monthly releases (pipeline/release/publish.py, store.py; docs/releases.md). "" = the embedded default, a local
    # directory <data_dir>/releases-bucket with the bucket's layout; else s3://bucket/prefix or a path.
    release_uri: str = ""
    # Base of the plain HTTPS URLs in releases/index.json; "" derives it from the bucket and endpoint.
    release_public_url: str = ""
    s3_endpoint_url: str = ""  # "" = AWS; any S3-compatible store otherwise (path-style addressing)
    s3_region: str = ""  # "" = the AWS chain's region (AWS_REGION, ~/.aws/config), else us-east-1
    s3_max_attempts: int = 5  # botocore "standard" retries per request (throttling, 5xx, resets)
    # Files from this size go up in parts. Below it, one PUT carrying the file's sha256 (the one
    # recorded when it was written, when there is one: the file is not read to plan it); a
    # multipart file is read and hashed part by part first, and 64 MiB keeps the database months
    # (~30 MB) single PUTs.
    release_multipart_threshold_mb: int = 64
    release_multipart_chunk_mb: int = 8
    release_concurrency: int = 10  # requests in flight (parts and files) per upload or download
    release_signed_download: bool = False  # `mirai download` signs requests (private buckets)
    # Alerts (pipeline/alerts.py, sensors/alerts.py): "" = alerts are only logged. The URL is a secret
    # (webhook URLs carry their token): it is never logged nor put in a payload.
    alert_webhook_url: str = ""
    alert_timeout_s: float = 10.0
    alert_attempts: int = 3
    # The freshness alert fires when the newest landed slot is older than this (GDELT publishes
    # every 15 minutes, so an hour is four missed slots).
    freshness_hours: float = 1.0
    # What the data are built from, recorded in every split and release manifest and card: "" means
    # GDELT's feed at gdelt_base_url; anything else names generated data ("generated mirror, seed
    # 0", set by `mirai demo`), which every card then says in its first lines.
    generated_source: str = ""
    # Last daily partition (inclusive); None = open-ended (today's day is the newest partition). The
    # demo sets it so that its Dagster UI shows its own days, not every day since start_date.
    end_date: date | None = None
    # Run agents' code blocks even where the sandbox's seccomp allowlist cannot be installed (an
    # architecture other than x86_64/aarch64, or no seccomp): an operator's explicit, recorded choice.
    sandbox_allow_unconfined: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> Settings:
        """The settings the environment sets (``env``, default os.environ; an empty value counts
        as unset), then ``overrides``. A bad value raises ValueError naming the variable."""
        try:
            if env is None:
                loaded = _EnvSettings()
            else:
                loaded = _MappingSettings(**{k: v for k, v in env.items() if v != ""})
        except ValidationError as exc:
            error = exc.errors()[0]
            name = error["loc"][0]
            message = str(error.get("ctx", {}).get("error") or error["msg"])
            raise ValueError(f"{name}={error['input']!r}: {message}") from None
        return cls(**{**loaded.model_dump(exclude_unset=True), **overrides})

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)

    @property
    def max_uncompressed_bytes(self) -> int:
        return self.max_uncompressed_mb * 2**20

    @property
    def live_horizon_days(self) -> tuple[int, ...]:
        """``live_horizons`` ("1,7") as sorted distinct day counts, each in 1..31."""
        try:
            days = sorted({int(part) for part in self.live_horizons.split(",") if part.strip()})
        except ValueError as exc:
            raise ValueError(f"MIRAI_LIVE_HORIZONS={self.live_horizons!r}: {exc}") from exc
        if not days or not all(1 <= d <= 31 for d in days):
            raise ValueError(f"MIRAI_LIVE_HORIZONS={self.live_horizons!r}: give day counts from 1 to 31, e.g. 1,7")
        return tuple(days)

    @property
    def fetch_retry_schedule(self) -> tuple[timedelta, ...]:
        """``fetch_retry_schedule_h`` ("1,6,24") as delays after the 1st, 2nd, 3rd… failed run."""
        try:
            hours = [float(part) for part in self.fetch_retry_schedule_h.split(",") if part.strip()]
        except ValueError as exc:
            raise ValueError(f"MIRAI_FETCH_RETRY_SCHEDULE_H={self.fetch_retry_schedule_h!r}: {exc}") from exc
        if any(h <= 0 for h in hours):
            raise ValueError(f"MIRAI_FETCH_RETRY_SCHEDULE_H={self.fetch_retry_schedule_h!r}: delays must be > 0")
        return tuple(timedelta(hours=h) for h in hours)

    @property
    def source(self) -> dict[str, object]:
        """Where the data come from, as manifests record it (docs/splits.md)."""
        if self.generated_source:
            return {"generated": True, "description": self.generated_source}
        return {
            "generated": False,
            "description": f"GDELT 2.0 event feed at {self.gdelt_base_url}",
            "gdelt_base_url": self.gdelt_base_url,
        }


# Environment variable for each setting; the README's table is generated from this mapping.
_ENV_NAMES: dict[str, str] = {
    "data_dir": "MIRAI_DATA_DIR",
    "gdelt_base_url": "GDELT_BASE_URL",
    "start_date": "MIRAI_START_DATE",
    "connect_timeout_s": "MIRAI_HTTP_CONNECT_TIMEOUT_S",
    "read_timeout_s": "MIRAI_HTTP_READ_TIMEOUT_S",
    "download_deadline_s": "MIRAI_DOWNLOAD_DEADLINE_S",
    "download_concurrency": "MIRAI_DOWNLOAD_CONCURRENCY",
    "download_attempts": "MIRAI_DOWNLOAD_ATTEMPTS",
    "backoff_base_s": "MIRAI_BACKOFF_BASE_S",
    "backoff_max_s": "MIRAI_BACKOFF_MAX_S",
    "missing_grace_hours": "MIRAI_MISSING_GRACE_HOURS",
    "late_after_hours": "MIRAI_LATE_AFTER_HOURS",
    "max_uncompressed_mb": "MIRAI_MAX_UNCOMPRESSED_MB",
    "user_agent": "MIRAI_USER_AGENT",
    "day_lock_timeout_s": "MIRAI_DAY_LOCK_TIMEOUT_S",
    "article_min_mentions": "MIRAI_ARTICLE_MIN_MENTIONS",
    "article_include_mention_urls": "MIRAI_ARTICLE_INCLUDE_MENTION_URLS",
    "article_profile": "MIRAI_ARTICLE_PROFILE",
    "article_domain_dedup": "MIRAI_ARTICLE_DOMAIN_DEDUP",
    "extract_workers": "MIRAI_EXTRACT_WORKERS",
    "extract_timeout_s": "MIRAI_EXTRACT_TIMEOUT_S",
    "fetch_concurrency": "MIRAI_FETCH_CONCURRENCY",
    "fetch_per_host": "MIRAI_FETCH_PER_HOST",
    "fetch_max_bytes": "MIRAI_FETCH_MAX_BYTES",
    "fetch_connect_timeout_s": "MIRAI_FETCH_CONNECT_TIMEOUT_S",
    "fetch_read_timeout_s": "MIRAI_FETCH_READ_TIMEOUT_S",
    "fetch_deadline_s": "MIRAI_FETCH_DEADLINE_S",
    "fetch_attempts": "MIRAI_FETCH_ATTEMPTS",
    "fetch_backoff_base_s": "MIRAI_FETCH_BACKOFF_BASE_S",
    "fetch_backoff_max_s": "MIRAI_FETCH_BACKOFF_MAX_S",
    "fetch_max_redirects": "MIRAI_FETCH_MAX_REDIRECTS",
    "fetch_allow_loopback": "MIRAI_FETCH_ALLOW_LOOPBACK",
    "fetch_host_map": "MIRAI_FETCH_HOST_MAP",
    "fetch_respect_robots": "MIRAI_FETCH_RESPECT_ROBOTS",
    "fetch_robots_ttl_s": "MIRAI_FETCH_ROBOTS_TTL_S",
    "fetch_retry_schedule_h": "MIRAI_FETCH_RETRY_SCHEDULE_H",
    "test_min_mentions": "MIRAI_TEST_MIN_MENTIONS",
    "test_min_articles": "MIRAI_TEST_MIN_ARTICLES",
    "split_sample_size": "MIRAI_SPLIT_SAMPLE_SIZE",
    "split_seed": "MIRAI_SPLIT_SEED",
    "split_grace_days": "MIRAI_SPLIT_GRACE_DAYS",
    "live_horizons": "MIRAI_LIVE_HORIZONS",
    "live_round_size": "MIRAI_LIVE_ROUND_SIZE",
    "live_window_days": "MIRAI_LIVE_WINDOW_DAYS",
    "live_quiet_share": "MIRAI_LIVE_QUIET_SHARE",
    "live_seed": "MIRAI_LIVE_SEED",
    "live_resolution_grace_hours": "MIRAI_LIVE_RESOLUTION_GRACE_HOURS",
    "agent_distance_days": "MIRAI_AGENT_DISTANCE_DAYS",
    "agents_file": "MIRAI_AGENTS_FILE",
    "release_uri": "MIRAI_RELEASE_URI",
    "release_public_url": "MIRAI_RELEASE_PUBLIC_URL",
    "s3_endpoint_url": "MIRAI_S3_ENDPOINT_URL",
    "s3_region": "MIRAI_S3_REGION",
    "s3_max_attempts": "MIRAI_S3_MAX_ATTEMPTS",
    "release_multipart_threshold_mb": "MIRAI_RELEASE_MULTIPART_THRESHOLD_MB",
    "release_multipart_chunk_mb": "MIRAI_RELEASE_MULTIPART_CHUNK_MB",
    "release_concurrency": "MIRAI_RELEASE_CONCURRENCY",
    "release_signed_download": "MIRAI_RELEASE_SIGNED_DOWNLOAD",
    "alert_webhook_url": "MIRAI_ALERT_WEBHOOK_URL",
    "alert_timeout_s": "MIRAI_ALERT_TIMEOUT_S",
    "alert_attempts": "MIRAI_ALERT_ATTEMPTS",
    "freshness_hours": "MIRAI_FRESHNESS_HOURS",
    "generated_source": "MIRAI_GENERATED_SOURCE",
    "end_date": "MIRAI_END_DATE",
    "sandbox_allow_unconfined": "MIRAI_SANDBOX_ALLOW_UNCONFINED",
}


def env_names() -> dict[str, str]:
    return dict(_ENV_NAMES)


def _parse(type_name: str, raw: object) -> object:
    """The environment's spelling of each type (as README.md documents it); values that are not
    strings (Dagster resources pass typed values) go to pydantic's own validation."""
    if not isinstance(raw, str):
        return raw
    if type_name == "Path":
        return Path(raw)
    if type_name in ("date", "date | None"):
        return date.fromisoformat(raw)
    if type_name == "int":
        return int(raw)
    if type_name == "float":
        return float(raw)
    if type_name == "bool":
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected a boolean: 1/0, true/false, yes/no or on/off")
    return raw


# Dataclass field types are strings under `from __future__ import annotations`.
_TYPES = {"Path": Path, "date": date, "date | None": date | None, "int": int, "float": float, "bool": bool, "str": str}


class _EnvBase(BaseSettings):
    # Exact names (as the README lists them), an empty value is unset, other variables are ignored.
    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True)


# One field per Settings field, read from its variable in _ENV_NAMES.
_EnvSettings = create_model(
    "_EnvSettings",
    __base__=_EnvBase,
    **{
        f.name: (
            Annotated[_TYPES[f.type], BeforeValidator(partial(_parse, f.type))],
            Field(default=f.default, validation_alias=_ENV_NAMES[f.name]),
        )
        for f in fields(Settings)
    },
)


class _MappingSettings(_EnvSettings):
    """The same fields read from a given mapping only (``from_env(env=...)``: tests, the CLI's
    subprocess environments), never from os.environ."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings,)
