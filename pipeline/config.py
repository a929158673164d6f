"""The pipeline's settings, each declared once (README.md lists them, generated from here).

Each group below is one pydantic-settings class, one per system or concern the pipeline deals
with; each field carries its type, default, environment variable and description. ``Settings``
is the composite of the groups. The CLI and tests build settings directly
(``Settings.from_env``, or a group by its Python field names); the Dagster resources
(assets/resources.py) are generated from the same groups, one resource per group, and give back
the group instance. Building a group never reads the environment: only ``from_env`` does, so
nothing else reads os.environ. (Over 500 lines because it is the declaration of all 65 settings,
each with its meaning: splitting it would give them more than one home.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Annotated, Any, Self, get_type_hints

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

# HTTPS keeps the index and files private and unaltered in transit; the index's md5 per file stays
# the integrity check (pipeline/gdelt/download.py), so a mirror may still be plain HTTP.
DEFAULT_GDELT_BASE_URL = "https://data.gdeltproject.org/gdeltv2"
# Cap on one GDELT zip member unzipped. Real 15-minute files unpack to 0.6-0.9 MB (exports) and at
# most ~12 MB (the largest catch-up mentions file among GDELT 2.0's first 1000 index lines, 1.95 MB
# zipped, at the 4-6x ratio of real files); 32 MiB leaves more than twice that. Evidence in
# docs/data-layout.md ("Hostile GDELT files").
DEFAULT_MAX_UNCOMPRESSED_MB = 32


def _from_env(parse) -> BeforeValidator:
    """The environment's spelling of a type (as README.md documents it), parsed by ``parse``;
    values that are not strings (code, Dagster resources) go to pydantic's own validation."""
    return BeforeValidator(lambda raw: parse(raw) if isinstance(raw, str) else raw)


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected a boolean: 1/0, true/false, yes/no or on/off")


Int = Annotated[int, _from_env(int)]
Float = Annotated[float, _from_env(float)]
Bool = Annotated[bool, _from_env(_parse_bool)]
EnvPath = Annotated[Path, _from_env(Path)]
Date = Annotated[date, _from_env(date.fromisoformat)]
OptionalDate = Annotated[date | None, _from_env(date.fromisoformat)]


def setting(default: Any, env: str, description: str, **bounds: Any) -> Any:
    """A setting's default, environment variable (exact name) and description; ``bounds`` are
    pydantic's (``ge=0``)."""
    return Field(default=default, validation_alias=env, description=description, **bounds)


class SettingsGroup(BaseSettings):
    """One group of settings. Built from its Python field names (code, tests, the Dagster
    resources), it never reads the environment; ``from_env`` reads only the environment."""

    # Exact names (as the README lists them), an empty value is unset, other variables are ignored.
    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True, validate_by_name=True
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """The values the environment sets (``env``, default os.environ; an empty value counts as
        unset); the rest keep their defaults. A bad value raises pydantic's ValidationError."""
        if env is None:
            return cls(**EnvSettingsSource(cls)())
        return cls(**{name: env[name] for name, _ in cls.env_fields() if env.get(name)})

    @classmethod
    def env_fields(cls) -> Iterator[tuple[str, FieldInfo]]:
        """(environment variable, field) for each field, in declaration order."""
        for info in cls.model_fields.values():
            yield info.validation_alias, info

    @classmethod
    def env_name(cls, field: str) -> str:
        return cls.model_fields[field].validation_alias


class DatasetSettings(SettingsGroup):
    """Where the data live and what the dataset is: the data directory, MIRAI's thresholds and the
    split parameters, the agent registry."""

    data_dir: EnvPath = setting(
        Path("./data"), "MIRAI_DATA_DIR", "root of all stored data (layout in docs/data-layout.md)"
    )
    day_lock_timeout_s: Float = setting(
        1800.0, "MIRAI_DAY_LOCK_TIMEOUT_S", "how long a run waits for another run's lock on the same day"
    )
    article_min_mentions: Int = setting(
        50,
        "MIRAI_ARTICLE_MIN_MENTIONS",
        (
            "articles are fetched for quads with at least this many daily mentions, and the event "
            "database keeps those quads (MIRAI paper, arXiv:2407.01231, §2)"
        ),
    )
    test_min_mentions: Int = setting(
        100, "MIRAI_TEST_MIN_MENTIONS", "a quad is test-grade with at least this many daily mentions (MIRAI §2.3)"
    )
    test_min_articles: Int = setting(
        5,
        "MIRAI_TEST_MIN_ARTICLES",
        "a query is kept only if each of its test-grade quads has at least this many kept articles (MIRAI §2.3)",
    )
    split_sample_size: Int = setting(
        100, "MIRAI_SPLIT_SAMPLE_SIZE", "queries in each month's balanced sample (MIRAI §2.3: 100)"
    )
    split_seed: Int = setting(0, "MIRAI_SPLIT_SEED", "seed of the balanced sampler (recorded in the manifest)")
    split_grace_days: Int = setting(
        3,
        "MIRAI_SPLIT_GRACE_DAYS",
        "days after a month ends before its split is built (if every slot landed or is confirmed missing)",
    )
    agent_distance_days: Int = setting(
        1,
        "MIRAI_AGENT_DISTANCE_DAYS",
        "an agent answering a query for day t sees events and articles up to t − this many days",
    )
    agents_file: EnvPath = setting(
        Path("./agents.yaml"),
        "MIRAI_AGENTS_FILE",
        (
            "the agent registry: the evaluation sensor evaluates every agent in it on each new split "
            "(docs/evaluation.md)"
        ),
    )
    generated_source: str = setting(
        "",
        "MIRAI_GENERATED_SOURCE",
        (
            "set when the data are generated, not GDELT's (`mirai demo` sets `generated mirror, seed "
            "N`): recorded as the source in every split and release manifest, and said in the first "
            "lines of every dataset card. Empty: the source recorded is the GDELT feed at "
            "`GDELT_BASE_URL`"
        ),
    )


class CalendarSettings(SettingsGroup):
    """The daily partitions' first and last day. Not a Dagster resource: partitions are fixed when
    the code location loads (assets/partitions.py), so only the environment sets them."""

    start_date: Date = setting(date(2023, 1, 1), "MIRAI_START_DATE", "first daily partition (ISO date)")
    end_date: OptionalDate = setting(
        None,
        "MIRAI_END_DATE",
        (
            "last daily partition, inclusive (ISO date; the monthly ones end with the last month ended "
            "by then); empty: today's day is the newest. The demo sets both dates to its own days"
        ),
    )


class NetworkSettings(SettingsGroup):
    """What every HTTP client of the pipeline shares: its User-Agent, and the connect/read timeouts
    of the GDELT feed and the release store (news sites have their own, in ArticleSettings)."""

    user_agent: str = setting(
        "mirai-pipeline/0.1 (+https://github.com/mirai-pipeline; GDELT benchmark builder)",
        "MIRAI_USER_AGENT",
        "User-Agent of every request (GDELT, news sites, the release store, the webhook)",
    )
    connect_timeout_s: Float = setting(
        10.0, "MIRAI_HTTP_CONNECT_TIMEOUT_S", "connect timeout of a GDELT or release-store request"
    )
    read_timeout_s: Float = setting(
        60.0,
        "MIRAI_HTTP_READ_TIMEOUT_S",
        "read timeout (between bytes) of a GDELT or release-store request",
    )


class GdeltSettings(SettingsGroup):
    """GDELT 2.0's 15-minute file feed and its index (pipeline/gdelt)."""

    base_url: str = setting(
        DEFAULT_GDELT_BASE_URL,
        "GDELT_BASE_URL",
        "where the index and files are fetched from (a mirror works: files are fetched by name under this URL)",
    )
    download_deadline_s: Float = setting(
        600.0,
        "MIRAI_DOWNLOAD_DEADLINE_S",
        "wall-clock cap for one file, so a trickling server cannot hold a run (it never trips the read timeout)",
    )
    download_concurrency: Int = setting(8, "MIRAI_DOWNLOAD_CONCURRENCY", "parallel GDELT downloads per day")
    download_attempts: Int = setting(
        4, "MIRAI_DOWNLOAD_ATTEMPTS", "attempts per file per run (timeouts, resets, 429, 5xx, size/md5 mismatch)"
    )
    backoff_base_s: Float = setting(
        2.0, "MIRAI_BACKOFF_BASE_S", "first wait between download attempts, doubling after each (with jitter)"
    )
    backoff_max_s: Float = setting(
        120.0, "MIRAI_BACKOFF_MAX_S", "longest wait between download attempts; `Retry-After` is honoured up to it"
    )
    missing_grace_hours: Float = setting(
        24.0,
        "MIRAI_MISSING_GRACE_HOURS",
        (
            "an unlisted or 404 slot is `pending` until this long after its slot, then `missing`; later"
            " runs keep retrying it either way"
        ),
    )
    late_after_hours: Float = setting(
        2.0,
        "MIRAI_LATE_AFTER_HOURS",
        "a file that was unavailable earlier and lands more than this after its slot is `late`",
    )
    max_uncompressed_mb: Int = setting(
        DEFAULT_MAX_UNCOMPRESSED_MB,
        "MIRAI_MAX_UNCOMPRESSED_MB",
        (
            "cap in MiB on a GDELT zip member unzipped (zip-bomb guard; real files unpack to 0.6-12 MB,"
            ' docs/data-layout.md "Hostile GDELT files")'
        ),
    )

    @property
    def max_uncompressed_bytes(self) -> int:
        return self.max_uncompressed_mb * 2**20


class ArticleSettings(SettingsGroup):
    """News sites: fetching (bounded, polite, and safe against hostile servers), extraction and
    the OBELICS filter (pipeline/articles)."""

    article_include_mention_urls: Bool = setting(
        False, "MIRAI_ARTICLE_INCLUDE_MENTION_URLS", "also fetch the first-day WEB mention URLs of those quads' events"
    )
    article_profile: str = setting(
        "mirai",
        "MIRAI_ARTICLE_PROFILE",
        "OBELICS filter profile: `mirai` (MIRAI's thresholds) or `obelics` (the released OBELICS ones)",
    )
    article_domain_dedup: Bool = setting(
        False,
        "MIRAI_ARTICLE_DOMAIN_DEDUP",
        "with the `obelics` profile: drop paragraphs repeated within one domain over the day (OBELICS step 09)",
    )
    extract_workers: Int = setting(2, "MIRAI_EXTRACT_WORKERS", "text extraction worker processes")
    extract_timeout_s: Float = setting(
        10.0,
        "MIRAI_EXTRACT_TIMEOUT_S",
        "wall time per document; a worker over it is killed and the page recorded as `timeout`",
    )
    fetch_concurrency: Int = setting(
        16, "MIRAI_FETCH_CONCURRENCY", "article fetch worker threads (each with its own pooled session)"
    )
    fetch_per_host: Int = setting(2, "MIRAI_FETCH_PER_HOST", "article requests in flight to one host at a time")
    fetch_max_bytes: Int = setting(
        5 * 2**20, "MIRAI_FETCH_MAX_BYTES", "cap on an article body after decompression (gzip-bomb guard)"
    )
    fetch_connect_timeout_s: Float = setting(
        5.0, "MIRAI_FETCH_CONNECT_TIMEOUT_S", "connect timeout of an article request"
    )
    fetch_read_timeout_s: Float = setting(15.0, "MIRAI_FETCH_READ_TIMEOUT_S", "read timeout of an article request")
    fetch_deadline_s: Float = setting(
        60.0,
        "MIRAI_FETCH_DEADLINE_S",
        "wall-clock cap per article URL over all attempts, redirects and waits (slow-drip guard)",
    )
    fetch_attempts: Int = setting(
        3, "MIRAI_FETCH_ATTEMPTS", "attempts per article URL per run (timeouts, resets, 429, 5xx)"
    )
    fetch_backoff_base_s: Float = setting(
        1.0, "MIRAI_FETCH_BACKOFF_BASE_S", "first wait between article attempts, doubling after each"
    )
    fetch_backoff_max_s: Float = setting(
        20.0,
        "MIRAI_FETCH_BACKOFF_MAX_S",
        (
            "longest in-run wait between article attempts (also for `Retry-After`); a longer "
            "`Retry-After` defers the URL to a later run"
        ),
    )
    fetch_max_redirects: Int = setting(
        5, "MIRAI_FETCH_MAX_REDIRECTS", "redirect hops followed per article URL (each hop re-checked for safety)"
    )
    fetch_allow_loopback: Bool = setting(
        False,
        "MIRAI_FETCH_ALLOW_LOOPBACK",
        "allow 127.0.0.0/8 and ::1 as article hosts (tests and the local demo only)",
    )
    fetch_host_map: str = setting(
        "",
        "MIRAI_FETCH_HOST_MAP",
        (
            "`*.example=127.0.0.1:PORT,...`: connect to these names at a fixed address instead of "
            "resolving them; only names under the reserved `.example` / `.test` / `.invalid` / "
            "`.localhost` TLDs (the demo's news sites). Empty in production"
        ),
    )
    fetch_respect_robots: Bool = setting(
        True, "MIRAI_FETCH_RESPECT_ROBOTS", "honour robots.txt (RFC 9309) for article URLs"
    )
    fetch_robots_ttl_s: Float = setting(
        86400.0,
        "MIRAI_FETCH_ROBOTS_TTL_S",
        "how long a host's robots.txt verdict is cached within a process (RFC 9309 §2.4: at most 24 h)",
    )
    fetch_retry_schedule_h: str = setting(
        "1,6,24",
        "MIRAI_FETCH_RETRY_SCHEDULE_H",
        "hours after each failed run before an article URL is retried; after the last step it is given up",
    )

    @property
    def fetch_retry_schedule(self) -> tuple[timedelta, ...]:
        """``fetch_retry_schedule_h`` ("1,6,24") as delays after the 1st, 2nd, 3rd… failed run."""
        name = self.env_name("fetch_retry_schedule_h")
        try:
            hours = [float(part) for part in self.fetch_retry_schedule_h.split(",") if part.strip()]
        except ValueError as exc:
            raise ValueError(f"{name}={self.fetch_retry_schedule_h!r}: {exc}") from exc
        if any(h <= 0 for h in hours):
            raise ValueError(f"{name}={self.fetch_retry_schedule_h!r}: delays must be > 0")
        return tuple(timedelta(hours=h) for h in hours)


class ReleaseSettings(SettingsGroup):
    """Where monthly releases are published (pipeline/release/publish.py, store_uri.py,
    s3_store.py; docs/releases.md): S3, an S3-compatible store or a local directory. Its HTTP
    timeouts are NetworkSettings'."""

    uri: str = setting(
        "",
        "MIRAI_RELEASE_URI",
        (
            "where monthly releases are published and `mirai download` reads: `s3://bucket/prefix`, "
            "`file:///path` or a path; empty: `$MIRAI_DATA_DIR/releases-bucket`, a local directory with"
            " the bucket's layout (docs/releases.md)"
        ),
    )
    public_url: str = setting(
        "",
        "MIRAI_RELEASE_PUBLIC_URL",
        (
            "the public base URL of the store's root (e.g. "
            "`https://<bucket>.s3.<region>.amazonaws.com/<prefix>` or a CDN): `releases/index.json` and"
            " `latest.json` then carry absolute URLs beside the files' relative keys. Empty: they carry"
            " keys only, never an endpoint's address"
        ),
    )
    s3_endpoint_url: str = setting(
        "",
        "MIRAI_S3_ENDPOINT_URL",
        (
            "an S3-compatible store (SeaweedFS, MinIO, Ceph, R2…), addressed path-style; empty: AWS. "
            "Credentials always come from the standard AWS chain "
            "(`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, instance role), never from "
            "these settings, and are never logged"
        ),
    )
    s3_region: str = setting(
        "",
        "MIRAI_S3_REGION",
        "region of the release bucket; empty: the AWS chain's (`AWS_REGION`, ~/.aws/config), else us-east-1",
    )
    s3_max_attempts: Int = setting(
        5, "MIRAI_S3_MAX_ATTEMPTS", "attempts per S3 request (botocore's standard retry mode: throttling, 5xx, resets)"
    )
    multipart_threshold_mb: Int = setting(
        64,
        "MIRAI_RELEASE_MULTIPART_THRESHOLD_MB",
        (
            "files from this size go up in parts, each SHA-256-checked by the server; smaller files are"
            " one PUT carrying the file's SHA-256 (the one recorded when it was written, else hashed "
            "once). 64 keeps the database months (~30 MB) single PUTs"
        ),
    )
    multipart_chunk_mb: Int = setting(8, "MIRAI_RELEASE_MULTIPART_CHUNK_MB", "part size of a multipart upload")
    concurrency: Int = setting(
        10,
        "MIRAI_RELEASE_CONCURRENCY",
        "requests in flight when publishing (parts and files), and files fetched at once by `mirai download`",
    )
    signed_download: Bool = setting(
        False,
        "MIRAI_RELEASE_SIGNED_DOWNLOAD",
        "`mirai download` signs its requests with AWS credentials (a private bucket); anonymous by default",
    )


class AlertSettings(SettingsGroup):
    """Alerts (pipeline/alerts.py, sensors/alerts.py). The webhook URL is a secret (webhook URLs
    carry their token): it is never logged nor put in a payload, and the Dagster resource holds it
    as an EnvVar."""

    webhook_url: str = setting(
        "",
        "MIRAI_ALERT_WEBHOOK_URL",
        (
            "alerts (a failed run, stale data) are POSTed here as JSON with a Slack-compatible `text` "
            "field (docs/operations.md); empty: alerts are only logged. A secret: never logged or sent "
            "in a payload, held by the Dagster resource as an EnvVar"
        ),
    )
    timeout_s: Float = setting(10.0, "MIRAI_ALERT_TIMEOUT_S", "timeout of one webhook request")
    attempts: Int = setting(3, "MIRAI_ALERT_ATTEMPTS", "attempts per alert (timeouts, resets, 429, 5xx)")
    freshness_hours: Float = setting(
        1.0,
        "MIRAI_FRESHNESS_HOURS",
        (
            "the freshness alert fires once when the newest landed GDELT slot is older than this (an "
            "hour is four missed slots), and again after it has recovered"
        ),
    )


class LiveSettings(SettingsGroup):
    """Live rounds (docs/live.md): each day D a round asks (t, s, o) for t = D + h, h in the
    horizons, about pairs sampled (seeded) from the window's test-grade activity, a share of them
    less active; a target date is resolved once its slots are settled and the grace has passed."""

    horizons: str = setting(
        "1,7",
        "MIRAI_LIVE_HORIZONS",
        "a live round published on day D asks about the target dates D + h for each h (docs/live.md)",
    )
    round_size: Int = setting(100, "MIRAI_LIVE_ROUND_SIZE", "questions per live round, split evenly over the horizons")
    window_days: Int = setting(
        28,
        "MIRAI_LIVE_WINDOW_DAYS",
        "a live round samples pairs from the test-grade activity of the days D − this .. D − 1",
    )
    quiet_share: Float = setting(
        0.25,
        "MIRAI_LIVE_QUIET_SHARE",
        (
            "share of a live round's pairs drawn from the window's less active pairs, so that \"nothing "
            'happens" is a real answer'
        ),
    )
    seed: Int = setting(
        0, "MIRAI_LIVE_SEED", "seed of the live sampler (with the round's day; recorded in its manifest)"
    )
    resolution_grace_hours: Float = setting(
        24.0,
        "MIRAI_LIVE_RESOLUTION_GRACE_HOURS",
        "hours after a target date's slots are all landed or confirmed missing before its answers are resolved",
    )

    @property
    def horizon_days(self) -> tuple[int, ...]:
        """``horizons`` ("1,7") as sorted distinct day counts, each in 1..31."""
        name = self.env_name("horizons")
        try:
            days = sorted({int(part) for part in self.horizons.split(",") if part.strip()})
        except ValueError as exc:
            raise ValueError(f"{name}={self.horizons!r}: {exc}") from exc
        if not days or not all(1 <= d <= 31 for d in days):
            raise ValueError(f"{name}={self.horizons!r}: give day counts from 1 to 31, e.g. 1,7")
        return tuple(days)


class SandboxSettings(SettingsGroup):
    """The code sandbox of ReAct agents (pipeline/agent_api/sandbox.py)."""

    allow_unconfined: Bool = setting(
        False,
        "MIRAI_SANDBOX_ALLOW_UNCONFINED",
        (
            "run agents' code blocks even where the sandbox's seccomp allowlist cannot be installed (an"
            " architecture other than x86_64 or aarch64, or a kernel without seccomp): an operator's "
            "explicit, recorded choice; otherwise such episodes end in an error (docs/agent_api.md, "
            '"Threat model")'
        ),
    )
    handover_grid_s: Float = setting(
        30.0,
        "MIRAI_SANDBOX_HANDOVER_GRID_S",
        (
            "seconds of the wall clock on whose multiples a sandbox of an earlier cutoff starts after one"
            " of a later cutoff (between runs): a later agent can signal only which multiple, by stalling;"
            ' 0 starts at once (docs/agent_api.md, "The handover between cutoffs")'
        ),
        ge=0,
    )


@dataclass(frozen=True)
class Settings:
    """Every group: what the environment, the CLI and the tests assemble; a library function takes
    only the groups it reads (docs/architecture.md, "Settings")."""

    dataset: DatasetSettings = field(default_factory=DatasetSettings)
    calendar: CalendarSettings = field(default_factory=CalendarSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    gdelt: GdeltSettings = field(default_factory=GdeltSettings)
    articles: ArticleSettings = field(default_factory=ArticleSettings)
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment sets (``env``, default os.environ; an empty value counts
        as unset). A bad value raises ValueError naming the variable."""
        try:
            return cls(**{name: group.from_env(env) for name, group in groups().items()})
        except ValidationError as exc:
            error = exc.errors()[0]
            name = error["loc"][0]
            message = str(error.get("ctx", {}).get("error") or error["msg"])
            raise ValueError(f"{name}={error['input']!r}: {message}") from None


def data_source(dataset: DatasetSettings, gdelt: GdeltSettings) -> dict[str, object]:
    """Where the data come from, as split and live-round manifests record it (docs/splits.md)."""
    if dataset.generated_source:
        return {"generated": True, "description": dataset.generated_source}
    return {
        "generated": False,
        "description": f"GDELT 2.0 event feed at {gdelt.base_url}",
        "gdelt_base_url": gdelt.base_url,
    }


def groups() -> dict[str, type[SettingsGroup]]:
    """Each group's class, by its name in Settings, in the order README.md and `mirai --help` list them."""
    return get_type_hints(Settings)


def env_names() -> list[str]:
    """Every setting's environment variable, group by group (`mirai --help` lists them)."""
    return [name for group in groups().values() for name, _ in group.env_fields()]


def _shown_default(value: object) -> str:
    """A default as the environment would spell it, for the settings table."""
    if value is None or value == "":
        return "(empty)"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, Path) and not value.is_absolute():
        value = f"./{value}"
    return f"`{value}`"


def settings_table() -> str:
    """Every setting as a Markdown table (variable, Dagster resource, default, meaning), group by
    group: README.md's table is this text (`mirai settings` prints it; tests/test_foundation.py
    checks that they agree)."""
    rows = ["| variable | group | default | meaning |", "|---|---|---|---|"]
    for group_name, group in groups().items():
        for env, info in group.env_fields():
            meaning = info.description.replace("|", "\\|")
            rows.append(f"| `{env}` | {group_name} | {_shown_default(info.default)} | {meaning} |")
    return "\n".join(rows) + "\n"
