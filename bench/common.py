"""What every benchmark prints and measures the same way: the machine, and a process's own peak
RSS. Linux carries ``ru_maxrss`` across fork and exec, so a worker subprocess would report its
parent's peak; ``VmHWM`` belongs to the address space exec created. And the random API calls the
two MIRAI benches (mirai_api_equivalence.py, mirai_fidelity.py) replay through MIRAI's code and ours."""

from __future__ import annotations

import os
import platform
import random
import resource
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


def own_peak_rss_mib() -> float:
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine(libraries: dict[str, str]) -> str:
    """CPU model, cores, memory, OS, Python and the given library versions."""
    cpuinfo = Path("/proc/cpuinfo")
    models = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    meminfo = Path("/proc/meminfo")
    mem = (
        next(
            (int(line.split()[1]) / 2**20 for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")),
            0.0,
        )
        if meminfo.exists()
        else 0.0
    )
    versions = ", ".join(f"{name} {version}" for name, version in libraries.items())
    return (
        f"{models[0] if models else platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}, {versions}"
    )


@dataclass(frozen=True)
class CallPools:
    """What random API calls draw their arguments from: a split's database."""

    first: date  # the database's first day, where date ranges may start
    countries: list[str]  # every actor of an event
    news: pl.DataFrame
    words: list[str]  # keywords and text words: from 200 titles sampled with the seed


def call_pools(data_dir: Path, seed: int) -> CallPools:
    import polars as pl

    events = pl.read_parquet(data_dir / "database/events/*.parquet")
    news = pl.read_parquet(data_dir / "database/news/*.parquet")
    words = [
        w for t in news.get_column("title").sample(200, seed=seed) for w in t.split() if w.isalpha() and len(w) > 3
    ]
    return CallPools(
        first=events.get_column("date").min(),
        countries=sorted(set(events.get_column("s")) | set(events.get_column("o"))),
        news=news,
        words=words,
    )


def draw_api_calls(
    rng: random.Random,
    pools: CallPools,
    relations: dict[str, dict],
    n: int,
    *,
    query_date: Callable[[], date],
    country_name: Callable[[], str],
    relation_description: Callable[[str], str],
    title: Callable[[str], str] = lambda title: title,
    ranges_without_start: bool = False,
) -> list[dict]:
    """``n`` random calls of each API function as ``{"fn", "query_date", "cutoff", "args"}``. The
    hooks are where the benches differ (they draw from ``rng`` too, in this order): the query date
    of each call; the name a country look-up asks for; the text a relation look-up asks for, given
    the drawn code; the title ``browse_news_article`` asks for, given a real one; and whether 10%
    of the date ranges have no start."""
    import polars as pl

    from pipeline.agent_api.environment import API_FUNCTIONS

    level1 = [c for c in relations if len(c) == 2]
    level2 = [c for c in relations if len(c) == 3]
    countries, words = pools.countries, pools.words
    calls = []
    for fn in API_FUNCTIONS:
        for _ in range(n):
            day = query_date()
            cutoff = day - timedelta(days=1)

            def date_range(cutoff=cutoff):
                if rng.random() < 0.25:
                    return None
                a = pools.first + timedelta(days=rng.randrange((cutoff - pools.first).days + 1))
                b = a + timedelta(days=rng.randrange((cutoff - a).days + 1))
                start = a.isoformat() if not ranges_without_start or rng.random() < 0.9 else None
                return [start, b.isoformat() if rng.random() < 0.8 else None]

            def some(pool, most=3, p=0.5):
                return sorted(rng.sample(pool, rng.randint(1, most))) if rng.random() < p else None

            args: dict = {}
            if fn == "map_country_name_to_iso":
                args = {"name": country_name()}
            elif fn == "map_iso_to_country_name":
                args = {"iso_code": rng.choice(countries)}
            elif fn == "map_relation_description_to_cameo":
                args = {"description": relation_description(rng.choice(level1 + level2))}
            elif fn in ("map_cameo_to_relation", "get_sibling_relations"):
                args = {"cameo_code": rng.choice(level1 + level2)}
            elif fn == "get_parent_relation":
                args = {"cameo_code": rng.choice(level2)}
            elif fn == "get_child_relations":
                args = {"cameo_code": rng.choice(level1)}
            elif fn in ("count_events", "get_events", "count_news_articles", "get_news_articles"):
                args = {
                    "date_range": date_range(),
                    "head_entities": some(countries),
                    "tail_entities": some(countries),
                    "relations": some(level1 + level2, 2, 0.4),
                }
                if fn in ("count_news_articles", "get_news_articles"):
                    args["keywords"] = some(words, 2, 0.3)
                if fn in ("get_events", "get_news_articles") and rng.random() < 0.5:
                    args["text_description"] = " ".join(rng.sample(words, 3))
            elif fn == "get_entity_distribution":
                args = {
                    "date_range": date_range(),
                    "involved_relations": some(level1 + level2, 2, 0.4),
                    "interacted_entities": some(countries),
                    "entity_role": rng.choice([None, "head", "tail", "both"]),
                }
            elif fn == "get_relation_distribution":
                args = {"date_range": date_range(), "head_entities": some(countries), "tail_entities": some(countries)}
            elif fn == "browse_news_article":
                visible = pools.news.filter(pl.col("date") <= cutoff)
                row = visible.row(rng.randrange(visible.height), named=True)
                args = {"date": row["date"].isoformat(), "title": title(row["title"])}
            calls.append({"fn": fn, "query_date": day.isoformat(), "cutoff": cutoff.isoformat(), "args": args})
    return calls
