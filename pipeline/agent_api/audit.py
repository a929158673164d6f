"""A leakage audit of one environment: does anything dated after its cutoff get out?

``leakage_violations(env)`` returns one line per problem (an empty list means none found):

- the environment's own tables, or the table files its sandbox child maps, hold rows dated after
  the cutoff;
- a function returns an event or article dated after the cutoff, called with no filter, with the
  head countries, relations and words that are common in the environment, and with random ones;
- a count or distribution without a date range differs from the same call bounded at the cutoff
  (so rows after the cutoff are being counted somewhere);
- a date or date range past the cutoff, or before the database start, is not refused with
  DateGateError;
- the same probes through ``run_code``: the sandbox child's tables, its answers, and its refusals.

The probes call the public API only (plus ``env.tables()`` for the direct look), so an
Environment built without the gate (e.g. from unfiltered tables) is caught.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, timedelta

import polars as pl

from pipeline.agent_api.event_database import EventDatabase
from pipeline.agent_api.types import Date, DateGateError, DateRange
from pipeline.config import DatasetSettings
from pipeline.splits.database import MonthNotReady, month_days
from pipeline.splits.split import read_manifest
from pipeline.storage import DataLayout

RANDOM_WORDS = (
    "trade",
    "security",
    "border",
    "sanctions",
    "ceasefire",
    "summit",
    "visit",
    "military",
    "aid",
    "talks",
    "protest",
    "attack",
    "election",
    "nuclear",
    "refugees",
)
# Number of random (head, tail, relation) filters probed per environment.
RANDOM_PROBES = 6


def _late(day: date, cutoff: date) -> bool:
    return day > cutoff


def _check_tables(env, out: list[str]) -> None:
    events, news = env.tables()
    for name, frame in (("events", events), ("news", news)):
        late = frame.filter(frame.get_column("date") > env.cutoff)
        if late.height:
            out.append(
                f"the environment's {name} table holds {late.height} rows dated after the cutoff "
                f"{env.cutoff} (latest {late.get_column('date').max()})"
            )


def _check_table_files(env, out: list[str]) -> None:
    """The files a sandbox child maps (table_files.py), read the way the child reads them: every
    part must be on or before the cutoff."""
    for part in env.table_files():
        for path in part:
            frame = pl.read_ipc(path)
            late = frame.filter(frame.get_column("date") > env.cutoff)
            if late.height:
                out.append(
                    f"the table file {path.name} for the sandbox holds {late.height} rows dated after the cutoff "
                    f"{env.cutoff} (latest {late.get_column('date').max()})"
                )


def _check_events(env, label: str, events, out: list[str]) -> None:
    late = [e for e in events if _late(e.date.to_date(), env.cutoff)]
    if late:
        out.append(f"{label} returned {len(late)} events after the cutoff {env.cutoff}, e.g. {late[0]!r}")


def _check_articles(env, label: str, articles, out: list[str]) -> None:
    late = [(d, t) for d, t in articles if _late(d.to_date(), env.cutoff)]
    if late:
        out.append(f"{label} returned {len(late)} articles after the cutoff {env.cutoff}, e.g. {late[0]!r}")


def _filters(env, rng: random.Random) -> list[dict]:
    """No filter, the most common countries and relations, and random ones."""
    heads = list(env.get_entity_distribution(entity_role="head"))[:3]
    tails = list(env.get_entity_distribution(entity_role="tail"))[:3]
    relations = list(env.get_relation_distribution())[:3]
    every_country = list(env.get_entity_distribution())
    every_relation = list(env.get_relation_distribution())
    filters = [
        {},
        {"head_entities": heads},
        {"tail_entities": tails},
        {"relations": relations},
        {"head_entities": heads[:1], "tail_entities": tails[:1]},
        {"relations": ["01", "19"]},
    ]
    for _ in range(RANDOM_PROBES if every_country and every_relation else 0):
        filters.append(
            {
                "head_entities": rng.sample(every_country, min(2, len(every_country))),
                "tail_entities": rng.sample(every_country, min(2, len(every_country))),
                "relations": rng.sample(every_relation, min(3, len(every_relation))),
            }
        )
    return filters


def _check_functions(env, rng: random.Random, out: list[str]) -> None:
    cutoff = DateRange(None, Date(env.cutoff.isoformat()))
    words = rng.sample(RANDOM_WORDS, 3)
    for flt in _filters(env, rng):
        label = f"({', '.join(f'{k}={v!r}' for k, v in flt.items())})"
        _check_events(env, f"get_events{label}", env.get_events(**flt), out)
        _check_events(env, f"get_events{label} by text", env.get_events(**flt, text_description=" ".join(words)), out)
        if env.count_events(**flt) != env.count_events(cutoff, **flt):
            out.append(f"count_events{label} counts events after the cutoff {env.cutoff}")
        news_flt = dict(flt, keywords=words[:2])
        for kwargs in (flt, news_flt):
            articles = env.get_news_articles(**kwargs)
            _check_articles(env, f"get_news_articles{label}", articles, out)
            _check_articles(
                env,
                f"get_news_articles{label} by text",
                env.get_news_articles(**kwargs, text_description=" ".join(words)),
                out,
            )
            if env.count_news_articles(**kwargs) != env.count_news_articles(cutoff, **kwargs):
                out.append(f"count_news_articles{label} counts articles after the cutoff {env.cutoff}")
        for day, title in [(d, t) for d, t in articles if not _late(d.to_date(), env.cutoff)][:2]:
            if not env.browse_news_article(day, title).startswith(day.date):
                out.append(f"browse_news_article({day!r}, {title!r}) returned another day's article")
        if "relations" not in flt:
            pair = {k: v for k, v in flt.items() if k in ("head_entities", "tail_entities")}
            if env.get_relation_distribution(**pair) != env.get_relation_distribution(cutoff, **pair):
                out.append(f"get_relation_distribution{label} counts events after the cutoff {env.cutoff}")
    for role in ("head", "tail", "both"):
        if env.get_entity_distribution(entity_role=role) != env.get_entity_distribution(cutoff, entity_role=role):
            out.append(f"get_entity_distribution(entity_role={role!r}) counts events after the cutoff {env.cutoff}")


def _check_empty(env, out: list[str]) -> None:
    seen = {
        "count_events()": env.count_events(),
        "get_events()": len(env.get_events()),
        "count_news_articles()": env.count_news_articles(),
        "get_news_articles()": len(env.get_news_articles()),
        "get_relation_distribution()": len(env.get_relation_distribution()),
        "get_entity_distribution()": len(env.get_entity_distribution()),
    }
    out.extend(
        f"{call} shows {n} records although the cutoff {env.cutoff} is before the database starts"
        for call, n in seen.items()
        if n
    )


def _refused_calls(env) -> list[tuple[str, object]]:
    """(label, call) for every date-taking function with a date past the cutoff or before the start."""
    after = Date((env.cutoff + timedelta(days=1)).isoformat())
    before = Date((env.start - timedelta(days=1)).isoformat())
    ranges = {
        "end after the cutoff": DateRange(None, after),
        "start after the cutoff": DateRange(after, None),
        "start before the database": DateRange(before, None),
    }
    calls = []
    for what, rng in ranges.items():
        calls += [
            (f"count_events({what})", lambda r=rng: env.count_events(r)),
            (f"get_events({what})", lambda r=rng: env.get_events(r)),
            (f"get_entity_distribution({what})", lambda r=rng: env.get_entity_distribution(r)),
            (f"get_relation_distribution({what})", lambda r=rng: env.get_relation_distribution(r)),
            (f"count_news_articles({what})", lambda r=rng: env.count_news_articles(r)),
            (f"get_news_articles({what})", lambda r=rng: env.get_news_articles(r)),
        ]
    calls.append(("browse_news_article(a day after the cutoff)", lambda: env.browse_news_article(after, "")))
    return calls


def _check_refusals(env, out: list[str]) -> None:
    for label, call in _refused_calls(env):
        try:
            call()
        except DateGateError:
            continue
        except Exception as exc:
            out.append(f"{label} raised {type(exc).__name__} instead of DateGateError: {exc}")
            continue
        out.append(f"{label} was not refused")


def _check_sandbox(env, out: list[str]) -> None:
    cutoff = env.cutoff.isoformat()
    after = (env.cutoff + timedelta(days=1)).isoformat()
    probes = {
        # The child's own tables, read the way agent code could.
        "sandbox tables": "_e, _n = get_events.__self__.tables()\n"
        "print(max([d for d in (_e.get_column('date').max(), _n.get_column('date').max()) if d], default=''))",
        "sandbox get_events": "print(max((e.date.date for e in get_events()), default=''))",
        "sandbox get_news_articles": "print(max((d.date for d, _ in get_news_articles()), default=''))",
    }
    for label, code in probes.items():
        seen = env.run_code(code).strip()
        if seen and not seen[:4].isdigit():  # an error observation, not a date: the probe itself failed
            out.append(f"{label}: probe failed: {seen[:200]}")
        elif seen > cutoff:
            out.append(f"{label}: the sandbox sees data dated {seen}, after the cutoff {cutoff}")
    counted = env.run_code(f"print(count_events(), count_events(DateRange(None, Date('{cutoff}'))))").split()
    if len(counted) != 2 or counted[0] != counted[1] or int(counted[0]) != env.count_events():
        out.append(f"sandbox count_events disagrees with the gate: {' '.join(counted)[:200]}")
    refused = env.run_code(f"get_events(DateRange(None, Date('{after}')))")
    if not refused.startswith("DateGateError"):
        out.append(f"sandbox get_events with a range past the cutoff was not refused: {refused[:200]}")


def leakage_violations(env, *, rng: random.Random | None = None, sandbox: bool = True) -> list[str]:
    """Every way found in which ``env`` exposes data after its cutoff (empty: none found)."""
    rng = rng or random.Random(f"audit/{env.cutoff}")
    out: list[str] = []
    _check_tables(env, out)
    if sandbox:
        _check_table_files(env, out)
    if env.cutoff < env.start:
        # A query in the database's first days: no date is in range, so nothing may be visible.
        _check_empty(env, out)
        return out
    _check_functions(env, rng, out)
    _check_refusals(env, out)
    if sandbox:
        _check_sandbox(env, out)
    return out


@dataclass(frozen=True)
class LeakageAudit:
    month: date
    dates_audited: int
    sandbox_dates: tuple[date, ...]
    violations: tuple[str, ...]


def leakage_audit(dataset: DatasetSettings, month: date) -> LeakageAudit:
    """Audit a built split for leakage: the split month must start after the manifest's history
    cutoff, every query must fall in the month, and for every query date the date-gated agent API
    must show nothing dated after t − distance through any function (leakage_violations, above).
    Queries on one date share an environment, so each distinct date is audited once; the code-
    block sandbox (a child process per environment) is probed on the first and last dates."""
    month = month.replace(day=1)
    manifest = read_manifest(dataset, month)
    if manifest is None:
        raise MonthNotReady(f"{month:%Y-%m}: no split to audit")
    queries = pl.read_parquet(DataLayout(dataset.data_dir).split_dir(month) / "queries.parquet")
    violations = []
    cutoff = date.fromisoformat(manifest["history_cutoff"])
    if month <= cutoff:
        violations.append(f"the split month {month:%Y-%m} does not start after the history cutoff {cutoff}")
    outside = queries.filter((pl.col("date") < month) | (pl.col("date") > month_days(month)[-1]))
    if outside.height:
        violations.append(f"{outside.height} queries are dated outside {month:%Y-%m}, e.g. {outside.row(0)[:4]}")
    dates = sorted(set(queries.get_column("date")))
    sandboxed = tuple(sorted({dates[0], dates[-1]})) if dates else ()
    database = EventDatabase(dataset.data_dir)
    for day in dates:
        with database.environment(day, manifest["distance_days"]) as env:
            found = leakage_violations(env, rng=random.Random(f"{manifest['seed']}/{day}"), sandbox=day in sandboxed)
        violations += [f"{day}: {v}" for v in found]
    return LeakageAudit(month, len(dates), sandboxed, tuple(violations))
