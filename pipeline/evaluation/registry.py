"""The agent registry: ``agents.yaml`` lists every forecaster the leaderboard evaluates.

Loading validates every entry and reports all problems at once, each naming its entry and field,
so a typo never silently turns into a default. Whether an agent may be ranked on a month depends
on its knowledge cutoff (MIRAI, arXiv:2407.01231, §3.3: a model is evaluated honestly only on
months after its training data ends); ``eligibility`` says so with a reason. The format is in
docs/evaluation.md.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import yaml

from pipeline.agent_api.environment import TOOL_SUBSETS
from pipeline.evaluation.baselines import BASELINE_METHODS

KINDS = ("baseline", "llm")
STRATEGIES = ("direct", "cot", "react")
ACTION_TYPES = ("single_function", "code_block")
# native: this harness's loop; mirai: MIRAI's own loop and answer extraction, for comparing with
# the paper (docs/mirai.md, "The `mirai` mode").
MODES = ("native", "mirai")
TOOLS = tuple(TOOL_SUBSETS)  # the paper's Table 3 API subsets: full, kg (events only), news (news only)
# MIRAI §3.1 ran every agent at temperature 0.4 with at most 20 tool calls (§3.2).
DEFAULT_TEMPERATURE = 0.4
DEFAULT_MAX_STEPS = 20
DEFAULT_DISTANCES = (1,)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a directory name under evaluations/YYYY-MM/
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")

_COMMON_FIELDS = {"name", "kind", "knowledge_cutoff", "distances", "rounds"}
_BASELINE_FIELDS = _COMMON_FIELDS | {"baseline", "top_k"}
LLM_FIELDS = _COMMON_FIELDS | {
    "endpoint",
    "gguf",
    "strategy",
    "action_type",
    "temperature",
    "max_steps",
    "mode",
    "tools",
    "concurrency",
    "sandbox_memory_mb",
    "price_per_million_input_tokens",
    "price_per_million_output_tokens",
}
_ENDPOINT_FIELDS = {"base_url", "model", "api_key_env", "requests_per_minute", "tokens_per_minute"}
# Episodes in flight at once (docs/evaluation.md, "Concurrency"): an HTTP endpoint waits on the
# network, so several episodes overlap; a GGUF model (its server, model_server.py) computes on this machine's cores
# and holds one context, so it runs one episode at a time.
DEFAULT_HTTP_CONCURRENCY = 8
# Only the react strategy calls tools, so only it has an action type and a step budget (MIRAI's
# eval.py sets both to "none"/0 for direct and cot).
_REACT_ONLY = ("action_type", "max_steps", "tools", "sandbox_memory_mb")


class RegistryError(ValueError):
    """agents.yaml is malformed; the message lists every problem found."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible chat endpoint; the key is read from the environment variable named
    here, never written in the registry."""

    base_url: str
    model: str
    api_key_env: str | None
    requests_per_minute: int | None = None  # the provider's limits; None: LlmRuntime's default
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Agent:
    name: str
    kind: str  # one of KINDS
    knowledge_cutoff: date | None  # the last day of training data; None for a model-free baseline
    distances: tuple[int, ...]  # days between the visible history's end and the query day
    rounds: int
    baseline: str | None = None  # for kind baseline: one of BASELINE_METHODS
    top_k: int | None = None  # for the frequency baseline; None picks it from the data
    endpoint: Endpoint | None = None  # for kind llm: an endpoint or a local gguf file, not both
    gguf: Path | None = None
    strategy: str | None = None
    action_type: str | None = None
    temperature: float | None = None
    max_steps: int | None = None
    mode: str | None = None  # for kind llm: one of MODES
    tools: str | None = None  # for strategy react: one of TOOLS
    concurrency: int | None = None  # for kind llm: episodes at once (DEFAULT_HTTP_CONCURRENCY; 1 for gguf)
    # For strategy react: what each episode's code sandbox may allocate (MB); None: LlmRuntime's.
    sandbox_memory_mb: int | None = None
    price_per_million_input_tokens: float | None = None  # USD, for scores.json's cost_usd
    price_per_million_output_tokens: float | None = None

    @property
    def episode_concurrency(self) -> int:
        """Episodes run at once: the entry's ``concurrency``, else DEFAULT_HTTP_CONCURRENCY for an
        endpoint; always 1 for a GGUF model (validated) and a baseline."""
        if self.kind != "llm" or self.endpoint is None:
            return 1
        return self.concurrency or DEFAULT_HTTP_CONCURRENCY


def parse_cutoff(value: object) -> date:
    """A knowledge cutoff: a date (YAML's 2023-10-31, or the string) or a month "2023-10", which
    means its last day, so a month-level cutoff never makes a model look older than it is."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    if isinstance(value, str):
        month = _MONTH.match(value)
        if month:
            year, mon = int(month[1]), int(month[2])
            if 1 <= mon <= 12:
                return date(year, mon, calendar.monthrange(year, mon)[1])
        else:
            try:
                return date.fromisoformat(value)
            except ValueError:
                pass
    raise ValueError(f"knowledge_cutoff must be a date YYYY-MM-DD or a month YYYY-MM, got {value!r}")


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return value


def _choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{field} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _distances(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"distances must be a non-empty list of days, got {value!r}")
    days = tuple(_positive_int(v, "every distance") for v in value)
    if len(set(days)) != len(days):
        raise ValueError(f"distances repeat a value: {value!r}")
    return days


def _endpoint(value: object) -> Endpoint:
    if not isinstance(value, dict):
        raise ValueError(f"endpoint must be a mapping with base_url, model and api_key_env, got {value!r}")
    limits = {
        field: _positive_int(value[field], f"endpoint.{field}")
        for field in ("requests_per_minute", "tokens_per_minute")
        if value.get(field) is not None
    }
    unknown = sorted(set(value) - _ENDPOINT_FIELDS)
    if unknown:
        hint = " (put the key in an environment variable and name it in api_key_env)" if "api_key" in unknown else ""
        raise ValueError(f"endpoint has unknown fields {unknown}{hint}")
    base_url, model, key_env = value.get("base_url"), value.get("model"), value.get("api_key_env")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint.base_url must be an http(s) URL, got {base_url!r}")
    if not isinstance(model, str) or not model:
        raise ValueError(f"endpoint.model must be a model name, got {model!r}")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_VAR.match(key_env)):
        raise ValueError(f"endpoint.api_key_env must be an environment variable name, got {key_env!r}")
    return Endpoint(base_url=base_url, model=model, api_key_env=key_env, **limits)


def _gguf(value: object, base_dir: Path) -> Path:
    if not isinstance(value, str) or not value.endswith(".gguf"):
        raise ValueError(f"gguf must be the path of a .gguf file, got {value!r}")
    path = Path(value).expanduser()
    # Relative to agents.yaml, so the registry means the same thing from any working directory.
    return path if path.is_absolute() else base_dir / path


def _temperature(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise ValueError(f"temperature must be a number from 0 to 2, got {value!r}")
    return float(value)


def _price(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"a price per million tokens must be a number of US dollars, 0 or more, got {value!r}")
    return float(value)


def _parse_agent(entry: dict, base_dir: Path) -> Agent:
    """One validated entry; raises ValueError with every problem of the entry, "; "-joined."""
    problems: list[str] = []

    def check(field: str, parse, default=None):
        if field not in entry:
            return default
        try:
            return parse(entry[field])
        except ValueError as exc:
            problems.append(str(exc))
            return default

    kind = entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    allowed = _BASELINE_FIELDS if kind == "baseline" else LLM_FIELDS
    unknown = sorted(set(entry) - allowed)
    if unknown:
        problems.append(f"unknown fields for a {kind} agent: {unknown}")
    common = {
        "name": entry["name"],
        "kind": kind,
        "knowledge_cutoff": check("knowledge_cutoff", parse_cutoff),
        "distances": check("distances", _distances, DEFAULT_DISTANCES),
        "rounds": check("rounds", lambda v: _positive_int(v, "rounds"), 1),
    }
    if kind == "baseline":
        agent = Agent(
            **common,
            baseline=check("baseline", lambda v: _choice(v, "baseline", BASELINE_METHODS)),
            top_k=check("top_k", lambda v: _positive_int(v, "top_k")),
        )
        if "baseline" not in entry:
            problems.append(f"baseline is required for a baseline agent (one of {', '.join(BASELINE_METHODS)})")
        if agent.top_k is not None and agent.baseline != "frequency":
            problems.append("top_k applies only to the frequency baseline")
        if agent.rounds != 1:
            problems.append("rounds must be 1 for a baseline: baselines are deterministic")
    else:
        strategy = check("strategy", lambda v: _choice(v, "strategy", STRATEGIES), "react")
        react = strategy == "react"
        if not react:
            problems.extend(f"{f} applies only to strategy react" for f in _REACT_ONLY if f in entry)
        agent = Agent(
            **common,
            endpoint=check("endpoint", _endpoint),
            gguf=check("gguf", lambda v: _gguf(v, base_dir)),
            strategy=strategy,
            action_type=check("action_type", lambda v: _choice(v, "action_type", ACTION_TYPES), "single_function")
            if react
            else None,
            temperature=check("temperature", _temperature, DEFAULT_TEMPERATURE),
            max_steps=check("max_steps", lambda v: _positive_int(v, "max_steps"), DEFAULT_MAX_STEPS) if react else None,
            mode=check("mode", lambda v: _choice(v, "mode", MODES), "native"),
            tools=check("tools", lambda v: _choice(v, "tools", TOOLS), "full") if react else None,
            concurrency=check("concurrency", lambda v: _positive_int(v, "concurrency")),
            sandbox_memory_mb=check("sandbox_memory_mb", lambda v: _positive_int(v, "sandbox_memory_mb"))
            if react
            else None,
            price_per_million_input_tokens=check("price_per_million_input_tokens", _price),
            price_per_million_output_tokens=check("price_per_million_output_tokens", _price),
        )
        if "gguf" in entry and (agent.concurrency or 1) > 1:
            problems.append("concurrency must be 1 for a gguf model: its model server answers one request at a time")
        if ("price_per_million_input_tokens" in entry) != ("price_per_million_output_tokens" in entry):
            problems.append("give both price_per_million_input_tokens and price_per_million_output_tokens, or neither")
        if ("endpoint" in entry) == ("gguf" in entry):
            problems.append("an llm agent needs exactly one of endpoint (base_url, model, api_key_env) or gguf")
        if "knowledge_cutoff" not in entry:
            problems.append(
                "knowledge_cutoff is required for an llm agent (it decides which months it may be ranked on)"
            )
    if problems:
        raise ValueError("; ".join(problems))
    return agent


def parse_agents(document: object, source: str = "agents.yaml", base_dir: Path = Path(".")) -> tuple[Agent, ...]:
    """Validate a parsed registry document ``{"agents": [...]}``; raise RegistryError listing
    every problem, each prefixed with the entry it belongs to."""
    if not isinstance(document, dict) or not isinstance(document.get("agents"), list) or set(document) != {"agents"}:
        raise RegistryError(f"{source}: expected a mapping with one key, agents, holding a list of agents")
    agents, problems, seen = [], [], set()
    for index, entry in enumerate(document["agents"], 1):
        name = entry.get("name") if isinstance(entry, dict) else None
        where = f"{source}: agent #{index}" + (f" ({name!r})" if isinstance(name, str) else "")
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping of fields, got {entry!r}")
            continue
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(
                f"{where}: name must be letters, digits, '.', '_' or '-' (it names a directory), got {name!r}"
            )
            continue
        if name in seen:
            problems.append(f"{where}: the name {name!r} is already used by an earlier agent")
            continue
        seen.add(name)
        try:
            agents.append(_parse_agent(entry, base_dir))
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    if problems:
        raise RegistryError("\n".join(problems))
    return tuple(agents)


def load_agents(path: Path | str) -> tuple[Agent, ...]:
    """Read and validate an agents.yaml."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RegistryError(f"{path}: not valid YAML: {exc}") from exc
    return parse_agents(document, str(path), path.parent)


def eligibility(agent: Agent, month: date) -> tuple[bool, str]:
    """Whether the agent may be ranked on the month's split: only when its knowledge cutoff falls
    before the month's first day (MIRAI §3.3). A forced run of an ineligible agent is stored with
    ``contaminated: true`` and never ranked."""
    first = month.replace(day=1)
    cutoff = agent.knowledge_cutoff
    if cutoff is None:
        return True, "no knowledge cutoff: a model-free baseline reads only the date-gated event history"
    if cutoff < first:
        return True, f"knowledge cutoff {cutoff} is before {first:%Y-%m}"
    return False, (
        f"knowledge cutoff {cutoff} is not before {first}: the model may have seen {first:%Y-%m}'s events, "
        "so a forced run is stored as contaminated and never ranked"
    )
