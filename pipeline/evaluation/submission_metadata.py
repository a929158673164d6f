"""A submission's submission.json, checked field by field (docs/evaluation.md, "Submissions"): a
monthly submission's fields (``Metadata``, ``parse_metadata``, and ``cutoff_rule``, registry's
contamination rule on them) and a live round's (``LiveMetadata``, ``parse_live_metadata``,
docs/live.md, "Submitting"). The file is a stranger's: its size is capped before it is parsed and
each problem is one line. Out of submissions.py, which processes uploads, because the store's
pipeline and `mirai submit` (pipeline/evaluation/submit.py) both check the same fields.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import date

from pipeline.evaluation.registry import Agent, eligibility
from pipeline.release.layout import SUBMISSION_META, is_day, is_month, shown

# submission.json is a dozen short fields (~400 bytes); 16 KiB leaves room and bounds the parse
# (16 Ki nested brackets at most, past Python's recursion limit, which is caught).
MAX_METADATA_BYTES = 16 * 2**10
MAX_TEXT_CHARS = 200  # model and contact: a name and an e-mail address or URL
QUERY_SETS = ("queries", "queries_sample")
API_MODES = ("native", "mirai")
ACTION_TYPES = ("single_function", "code_block", "none")
MAX_DISTANCE = 365
MAX_ROUNDS = 100
MAX_TOKENS = 10**15
MAX_COST_USD = 10**9
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
REQUIRED_FIELDS = (
    "model",
    "knowledge_cutoff",
    "contact",
    "month",
    "query_set",
    "distance",
    "rounds",
    "api_mode",
    "action_type",
)
OPTIONAL_FIELDS = ("tokens_in", "tokens_out", "cost_usd")


@dataclass(frozen=True)
class Metadata:
    model: str
    knowledge_cutoff: date
    contact: str
    month: str
    query_set: str
    distance: int
    rounds: int
    api_mode: str
    action_type: str
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None

    def first_day(self) -> date:
        return date.fromisoformat(f"{self.month}-01")


# --- metadata -----------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    duplicate = next((k for k in keys if keys.count(k) > 1), None)
    if duplicate is not None:
        raise ValueError(f"the field {shown(duplicate)} appears twice")
    return dict(pairs)


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    if len(value) > MAX_TEXT_CHARS:
        return f"is longer than {MAX_TEXT_CHARS} characters"
    if _CONTROL.search(value):
        return "contains a control character"
    return None


def _int_problem(value: object, low: int, high: int) -> str | None:
    if type(value) is not int or not low <= value <= high:
        return f"must be a whole number from {low} to {high:,}, got {shown(value)}"
    return None


def _choice_problem(value: object, choices: tuple[str, ...]) -> str | None:
    return None if value in choices and isinstance(value, str) else f"must be one of {', '.join(choices)}"


def _field_problem(name: str, value: object) -> str | None:
    if name in ("model", "contact"):
        return _text_problem(value)
    if name == "knowledge_cutoff":
        if not (isinstance(value, str) and _DAY.fullmatch(value)):
            return f"must be a date YYYY-MM-DD, got {shown(value)}"
        try:
            date.fromisoformat(value)
        except ValueError:
            return f"is not a real date: {shown(value)}"
        return None
    if name == "month":
        return None if is_month(value) else f"must be a month YYYY-MM, got {shown(value)}"
    if name == "query_set":
        return _choice_problem(value, QUERY_SETS)
    if name == "api_mode":
        return _choice_problem(value, API_MODES)
    if name == "action_type":
        return _choice_problem(value, ACTION_TYPES)
    if name == "distance":
        return _int_problem(value, 1, MAX_DISTANCE)
    if name == "rounds":
        return _int_problem(value, 1, MAX_ROUNDS)
    if value is None:  # the optional, self-reported costs
        return None
    if name == "cost_usd":
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_COST_USD:
            return f"must be null or a number of dollars from 0 to {MAX_COST_USD:,}, got {shown(value)}"
        return None
    return _int_problem(value, 0, MAX_TOKENS)


def metadata_object(raw: bytes) -> tuple[dict | None, list[str]]:
    """submission.json as a JSON object, or (None, the one line saying why it is not one)."""
    if len(raw) > MAX_METADATA_BYTES:
        return None, [f"{SUBMISSION_META} is larger than {MAX_METADATA_BYTES:,} bytes"]
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        return None, [f"{SUBMISSION_META} is not UTF-8 text"]
    except RecursionError:
        return None, [f"{SUBMISSION_META}: JSON nested too deeply"]
    except ValueError as exc:
        return None, [f"{SUBMISSION_META} is not valid JSON ({str(exc).splitlines()[0][:120]})"]
    if not isinstance(value, dict):
        return None, [f"{SUBMISSION_META} is not a JSON object but {type(value).__name__}"]
    return value, []


def _checked_fields(
    value: dict, required: tuple[str, ...], optional: tuple[str, ...], known_as: str, check
) -> tuple[dict, list[str]]:
    """(the fields that hold, one line per unknown, missing or invalid field), each field checked
    by ``check(name, value)`` -> a problem or None."""
    allowed = required + optional
    problems = [
        f"{SUBMISSION_META}: unknown field {shown(key)} ({known_as} are {', '.join(allowed)})"
        for key in value
        if key not in allowed
    ]
    good = {}
    for name in allowed:
        if name not in value:
            if name in required:
                problems.append(f"{SUBMISSION_META}: the field {name!r} is missing")
            continue
        problem = check(name, value[name])
        if problem:
            problems.append(f"{SUBMISSION_META}: {name} {problem}")
        else:
            good[name] = value[name]
    return good, problems


def _live_field_problem(name: str, value: object) -> str | None:
    if name == "round":
        return None if is_day(value) else f"must be a day YYYY-MM-DD, got {shown(value)}"
    if name == "owner_key":  # a secret: never quoted
        ok = isinstance(value, str) and MIN_OWNER_KEY_CHARS <= len(value) <= MAX_OWNER_KEY_CHARS and value.isprintable()
        return (
            None if ok else f"must be {MIN_OWNER_KEY_CHARS} to {MAX_OWNER_KEY_CHARS} printable characters (not shown)"
        )
    return _field_problem(name, value)


def parse_metadata(raw: bytes) -> tuple[Metadata | None, dict, list[str]]:
    """(the metadata when every field holds, the fields that hold, one line per problem)."""
    value, problems = metadata_object(raw)
    if value is None:
        return None, {}, problems
    good, problems = _checked_fields(value, REQUIRED_FIELDS, OPTIONAL_FIELDS, "the fields", _field_problem)
    if problems:
        return None, good, problems
    meta = Metadata(**{**good, "knowledge_cutoff": date.fromisoformat(good["knowledge_cutoff"])})
    return meta, good, []


def cutoff_rule(meta: Metadata) -> tuple[bool, str]:
    """registry.eligibility's rule, applied to a submission as to a registered agent: rankable only
    when the knowledge cutoff falls before the month's first day (MIRAI §3.3)."""
    agent = Agent(
        name="submission",
        kind="llm",
        knowledge_cutoff=meta.knowledge_cutoff,
        distances=(meta.distance,),
        rounds=meta.rounds,
    )
    eligible, _ = eligibility(agent, meta.first_day())
    if eligible:
        return True, f"knowledge cutoff {meta.knowledge_cutoff} is before {meta.month}"
    return False, (
        f"contaminated: knowledge cutoff {meta.knowledge_cutoff} is not before {meta.first_day()}: the model may have "
        f"seen {meta.month}'s events, so it is scored and shown, never ranked"
    )


# --- live rounds (docs/live.md, "Submitting"; the rest: live/submissions.py) ------------------

LIVE_FIELDS = ("model", "knowledge_cutoff", "contact", "round")
# A secret of the submitter's own, the same in every submission of one model: only submissions
# carrying it count as that model's on the live board (docs/live.md, "Who a row belongs to").
LIVE_OPTIONAL_FIELDS = ("owner_key",)
MIN_OWNER_KEY_CHARS, MAX_OWNER_KEY_CHARS = 16, 256


@dataclass(frozen=True)
class LiveMetadata:
    model: str
    knowledge_cutoff: date
    contact: str
    round: date


def is_live_metadata(raw: bytes) -> bool:
    """Whether submission.json is an object with a "round" field: a live round's submission."""
    value, _ = metadata_object(raw)
    return value is not None and "round" in value


def parse_live_metadata(raw: bytes) -> tuple[LiveMetadata | None, dict, list[str]]:
    """As parse_metadata, for a live submission: model, knowledge_cutoff, contact and round."""
    value, problems = metadata_object(raw)
    if value is None:
        return None, {}, problems
    good, problems = _checked_fields(
        value, LIVE_FIELDS, LIVE_OPTIONAL_FIELDS, "a live round's fields", _live_field_problem
    )
    if problems:
        return None, good, problems
    meta = LiveMetadata(
        model=good["model"],
        knowledge_cutoff=date.fromisoformat(good["knowledge_cutoff"]),
        contact=good["contact"],
        round=date.fromisoformat(good["round"]),
    )
    return meta, good, []
