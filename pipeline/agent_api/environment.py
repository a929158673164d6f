"""The date-gated forecasting environment: MIRAI's agent API over our monthly event database.

One ``Environment`` answers for one query ``(t, s, ?, o)``: it holds the events and news dated on
or before its cutoff ``t - distance_days`` and nothing later, because ``EventDatabase.environment``
never opens a month after the cutoff month and slices that one at the cutoff; every function also
refuses a date reaching past the cutoff with a DateGateError naming it. There is no global table
and no end-date knob, unlike MIRAI's API (docs/agent_api.md, "The gate").

Layout in memory: events and news are sorted ascending (events by date, then mentions; news by
date), so "newest first" is a reversed tail, and each event's ``article_idx`` holds row numbers in
the concatenated news table. Months are concatenated oldest first, every month before the cutoff
month is complete and the cutoff month's news is a date-sorted prefix, so these row numbers do not
depend on the cutoff and are computed once per month in ``EventDatabase``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Self

import polars as pl

from pipeline.agent_api import lookup, mirai_order
from pipeline.agent_api.bm25 import mirai_tokens, okapi_scores, rank_mirai
from pipeline.agent_api.table_files import TableFiles
from pipeline.agent_api.types import (
    MIRAI,
    RENDERINGS,
    CAMEOCode,
    Date,
    DateGateError,
    DateRange,
    Event,
    ISOCode,
    coerce_cameo,
    coerce_date,
    coerce_date_range,
    coerce_iso,
    coerce_list,
    date_header,
)
from pipeline.reference.tables import iso3_codes, level1_codes, level2_codes

MAX_EVENTS = 30
MAX_ARTICLES = 15
ENTITY_ROLES = ("head", "tail", "both")
# The paper's API subsets (MIRAI, arXiv:2407.01231, Table 3; APIs/api_description_{kg,news}.py in
# github.com/yecchen/MIRAI): the lookups plus the event functions, or plus the news functions.
LOOKUP_FUNCTIONS = (
    "map_country_name_to_iso",
    "map_iso_to_country_name",
    "map_relation_description_to_cameo",
    "map_cameo_to_relation",
    "get_parent_relation",
    "get_child_relations",
    "get_sibling_relations",
)
EVENT_FUNCTIONS = ("count_events", "get_events", "get_entity_distribution", "get_relation_distribution")
NEWS_FUNCTIONS = ("count_news_articles", "get_news_articles", "browse_news_article")
TOOL_SUBSETS = {
    "full": LOOKUP_FUNCTIONS + EVENT_FUNCTIONS + NEWS_FUNCTIONS,
    "kg": LOOKUP_FUNCTIONS + EVENT_FUNCTIONS,
    "news": LOOKUP_FUNCTIONS + NEWS_FUNCTIONS,
}
TOOL_SUBSET_NAMES = {"full": "the full API", "kg": "the events-only API", "news": "the news-only API"}
ISO_ENUM = pl.Enum(sorted(iso3_codes()))
REL_ENUM = pl.Enum(sorted(level2_codes()))
ROOT_ENUM = pl.Enum(sorted(level1_codes()))
EVENT_COLUMNS = ("date", "s", "r", "o", "r1", "daily_mentions", "article_idx")
NEWS_COLUMNS = ("article_id", "date", "title", "text")
_ENUMS = {"iso": ISO_ENUM, "relation": REL_ENUM}


@functools.lru_cache(maxsize=1024)
def _codes(codes: tuple[str, ...], enum: str) -> pl.Expr:
    """A list literal for ``is_in`` (a bare Series of the column's type is deprecated there).
    Cached: a Series of an Enum type costs more to build than most filters it serves, and the
    same codes come back call after call (the split's leakage audit makes thousands of calls)."""
    return pl.lit(pl.Series(codes, dtype=_ENUMS[enum])).implode()


@dataclass(frozen=True)
class _Filter:
    """A normalised event filter: bounds inside the gate, codes as strings."""

    start: date | None
    end: date | None
    heads: list[str] | None
    tails: list[str] | None
    relations: list[str] | None

    def expr(self) -> pl.Expr:
        parts = [pl.lit(True)]
        if self.start is not None:
            parts.append(pl.col("date") >= self.start)
        if self.end is not None:
            parts.append(pl.col("date") <= self.end)
        if self.heads is not None:
            parts.append(pl.col("s").is_in(_codes(tuple(self.heads), "iso")))
        if self.tails is not None:
            parts.append(pl.col("o").is_in(_codes(tuple(self.tails), "iso")))
        if self.relations is not None:
            parts.append(pl.col("r").is_in(_codes(tuple(self.relations), "relation")))
        return pl.all_horizontal(parts)

    @property
    def selects_events(self) -> bool:
        return self.heads is not None or self.tails is not None or self.relations is not None


class Environment:
    """MIRAI's API (Table 12) over one query's gated tables. Methods take the API's data classes or
    plain strings ("2023-11-02", "AUS", "042").

    ``tools`` ("full", "kg" or "news", TOOL_SUBSETS) is the API an agent's code gets: ``functions()``
    binds only those, and a call of any other API function raises a NameError saying why.
    ``count_both_actors`` makes get_entity_distribution count as MIRAI's code does rather than as
    its docstring says (docs/mirai.md, "The `mirai` mode"). ``dialect`` "mirai" (types.MIRAI; default
    "native") gives MIRAI's text and order: its sandbox child renders the data classes as MIRAI's
    code prints them, ``browse_news_article`` heads an article with ``Date('…'):``, and what MIRAI
    leaves to pandas' and numpy's sorts (equal counts, same-day rows, equal BM25 scores) comes in
    the order those sorts give (``mirai_order``)."""

    def __init__(
        self,
        events: pl.DataFrame,
        news: pl.DataFrame,
        *,
        start: date,
        cutoff: date,
        query_date: date,
        distance_days: int,
        allow_unconfined_sandbox: bool = False,
        sandbox_handover_grid_s: float | None = None,
        tools: str = "full",
        count_both_actors: bool = False,
        dialect: str = "native",
        code_libraries: tuple[str, ...] = (),
        memory_mb: int | None = None,
        table_files: Callable[[], list[tuple[Path, Path]]] | None = None,
    ):
        if tools not in TOOL_SUBSETS:
            raise ValueError(f"tools must be one of {', '.join(TOOL_SUBSETS)}, got {tools!r}")
        if dialect not in RENDERINGS:
            raise ValueError(f"dialect must be one of {', '.join(RENDERINGS)}, got {dialect!r}")
        self.tools = tools
        self.count_both_actors = count_both_actors
        self.dialect = dialect
        self._events = events
        self._news = news
        self.start = start
        self.cutoff = cutoff
        self.query_date = query_date
        self.distance_days = distance_days
        # The operator's explicit choice to run code blocks where the seccomp allowlist cannot be
        # installed (setting MIRAI_SANDBOX_ALLOW_UNCONFINED); see sandbox.py.
        self.allow_unconfined_sandbox = allow_unconfined_sandbox
        self.sandbox_handover_grid_s = sandbox_handover_grid_s  # MIRAI_SANDBOX_HANDOVER_GRID_S
        # Libraries code blocks may import beyond the standard-library modules (numpy, pandas, ...);
        # loaded in the sandbox process before lockdown (docs/agent_api.md, "Code blocks").
        self.code_libraries = tuple(code_libraries)
        # What its code blocks may allocate (MB; None: sandbox.DEFAULT_MEMORY_MB), unless a
        # run_code call says otherwise: an evaluation sets it per agent (docs/evaluation.md, "Memory").
        self.memory_mb = memory_mb
        # How the sandbox child gets these tables (files it maps read-only: table_files.py). An
        # EventDatabase passes its shared per-cutoff parts; otherwise they are written on first use.
        self._table_files = table_files
        self._own_files: TableFiles | None = None
        self._sandbox = None

    # --- the gate ---------------------------------------------------------------------------

    def _gate_error(self, what: str, day: date) -> DateGateError:
        if day < self.start:
            return DateGateError(f"{what} {day} is before the database starts ({self.start})")
        return DateGateError(
            f"{what} {day} is after the environment's cutoff {self.cutoff} (query date {self.query_date} minus "
            f"{self.distance_days} day(s)): nothing after the cutoff is visible"
        )

    def check_date(self, value: Date | str, what: str = "date") -> date:
        day = coerce_date(value).to_date()
        if not self.start <= day <= self.cutoff:
            raise self._gate_error(what, day)
        return day

    def _bounds(self, date_range: DateRange | None) -> tuple[date | None, date | None]:
        rng = coerce_date_range(date_range)
        if rng is None:
            return None, None
        start = None if rng.start_date is None else self.check_date(rng.start_date, "date_range start")
        end = None if rng.end_date is None else self.check_date(rng.end_date, "date_range end")
        return start, end

    def _filter(self, date_range=None, head_entities=None, tail_entities=None, relations=None) -> _Filter:
        start, end = self._bounds(date_range)
        heads = coerce_list(head_entities, coerce_iso)
        tails = coerce_list(tail_entities, coerce_iso)
        rels = coerce_list(relations, coerce_cameo)
        return _Filter(
            start,
            end,
            None if heads is None else [c.code for c in heads],
            None if tails is None else [c.code for c in tails],
            None if rels is None else lookup.expand_relations(rels),
        )

    # --- countries and relations (no dates involved) -----------------------------------------

    map_country_name_to_iso = staticmethod(lookup.map_country_name_to_iso)
    map_iso_to_country_name = staticmethod(lookup.map_iso_to_country_name)
    map_relation_description_to_cameo = staticmethod(lookup.map_relation_description_to_cameo)
    map_cameo_to_relation = staticmethod(lookup.map_cameo_to_relation)
    get_parent_relation = staticmethod(lookup.get_parent_relation)
    get_child_relations = staticmethod(lookup.get_child_relations)
    get_sibling_relations = staticmethod(lookup.get_sibling_relations)

    # --- events ------------------------------------------------------------------------------

    def _matching_events(self, flt: _Filter) -> pl.DataFrame:
        return self._events.filter(flt.expr())

    @staticmethod
    def _to_events(frame: pl.DataFrame) -> list[Event]:
        return [
            Event(Date(d.isoformat()), ISOCode(s), CAMEOCode(r), ISOCode(o))
            for d, s, r, o in frame.select("date", "s", "r", "o").iter_rows()
        ]

    def count_events(self, date_range=None, head_entities=None, tail_entities=None, relations=None) -> int:
        """Number of (date, head, relation, tail) events matching every given condition."""
        return self._matching_events(self._filter(date_range, head_entities, tail_entities, relations)).height

    def get_events(
        self,
        date_range=None,
        head_entities=None,
        tail_entities=None,
        relations=None,
        text_description: str | None = None,
    ) -> list[Event]:
        """At most 30 matching events: newest first, or, given ``text_description``, the events reported
        by the 30 source articles most relevant to it (BM25 over title and text; words match exactly,
        case-sensitive), most relevant article first."""
        matches = self._matching_events(self._filter(date_range, head_entities, tail_entities, relations))
        if self.dialect == MIRAI:
            return self._mirai_events(matches, text_description)
        if not text_description:
            return self._to_events(matches.tail(MAX_EVENTS).reverse())
        # As MIRAI (docs/mirai.md): rank the matching events' articles with MIRAI's BM25 (bm25.py), walk
        # the best 30 in rank order and take the events each one reports, newest first.
        ranked = matches.with_row_index("__event").reverse().with_row_index("__order")
        links = ranked.select("__event", "__order", pl.col("article_idx").alias("idx")).explode("idx").drop_nulls()
        links = links.filter(pl.col("idx") < self._news.height)
        articles = links.get_column("idx").unique().sort()
        top = self._rank_articles(articles, text_description, MAX_EVENTS)
        ordered = (
            links.join(top.select("idx", pl.int_range(pl.len()).alias("__rank")), on="idx")
            .group_by("__event", "__order")
            .agg(pl.col("__rank").min())
            .sort(["__rank", "__order"])
            .head(MAX_EVENTS)
            .join(ranked, on="__event", maintain_order="left")
        )
        return self._to_events(ordered)

    def _mirai_events(self, matches: pl.DataFrame, text_description: str | None) -> list[Event]:
        """get_events as MIRAI's code answers it (mirai_order.py): newest first in the order its
        sort gives same-day rows; with a text, the events of the best articles, walked in rank order
        until 30 or more are taken (MIRAI checks the count between articles only, and returns them
        as a set: here in the order they were taken)."""
        rows = mirai_order.kg_rows(matches)
        if not text_description:
            return self._to_events(rows[mirai_order.newest_first(rows.get_column("date"))[:MAX_EVENTS]])
        links = (
            rows.with_row_index("__row")
            .select("__row", pl.col("article_idx").alias("idx"))
            .explode("idx")
            .drop_nulls()
            .filter(pl.col("idx") < self._news.height)
        )
        top = self._rank_articles(links.get_column("idx").unique().sort(), text_description, MAX_EVENTS)
        rows_of = dict(links.group_by("idx").agg(pl.col("__row")).iter_rows())
        taken: dict[int, None] = {}
        for idx in top.get_column("idx"):  # at most 30 articles
            if len(taken) >= MAX_EVENTS:
                break
            article_rows = rows[rows_of[idx]]
            for position in mirai_order.newest_first(article_rows.get_column("date")):
                taken.setdefault(rows_of[idx][position])
        return self._to_events(rows[list(taken)])

    def get_entity_distribution(
        self, date_range=None, involved_relations=None, interacted_entities=None, entity_role: str | None = None
    ) -> dict[ISOCode, int]:
        """Countries and their number of matching events, most frequent first. ``entity_role``
        'head' counts subjects of events whose object is among ``interacted_entities``, 'tail' the
        objects of events whose subject is, 'both' or None both."""
        role = "both" if entity_role is None else entity_role
        if role not in ENTITY_ROLES:
            raise ValueError(f"entity_role must be one of {ENTITY_ROLES} or None, got {entity_role!r}")
        flt = self._filter(date_range, None, None, involved_relations)
        partners = coerce_list(interacted_entities, coerce_iso)
        partner_codes = None if partners is None else _codes(tuple(c.code for c in partners), "iso")
        matches = self._matching_events(flt)
        if self.dialect == MIRAI:
            matches = mirai_order.kg_rows(matches)
        if self.count_both_actors:
            sides = self._both_actor_sides(matches, role, partner_codes)
        else:
            sides = []
            for counted, other, wanted in (("s", "o", "head"), ("o", "s", "tail")):
                if role in (wanted, "both"):
                    side = matches if partner_codes is None else matches.filter(pl.col(other).is_in(partner_codes))
                    sides.append(side.select(pl.col(counted).alias("entity")))
        if self.dialect == MIRAI:  # MIRAI's value_counts, over its rows in data_kg order
            counted = mirai_order.value_counts(pl.concat(sides).get_column("entity"))
            return {ISOCode(code): n for code, n in counted}
        counts = pl.concat(sides).group_by("entity").len()
        counts = counts.with_columns(pl.col("entity").cast(pl.String)).sort(["len", "entity"], descending=[True, False])
        return {ISOCode(code): n for code, n in counts.iter_rows()}

    @staticmethod
    def _both_actor_sides(matches: pl.DataFrame, role: str, partner_codes: pl.Expr | None) -> list[pl.DataFrame]:
        """MIRAI's counting (get_entity_distribution in APIs/api_implementation.py): the role only
        picks which column must hold a partner (object for 'head', subject for 'tail', either for
        'both'); then both actor columns of every kept event are counted."""
        if partner_codes is not None:
            keep = {
                "head": pl.col("o").is_in(partner_codes),
                "tail": pl.col("s").is_in(partner_codes),
                "both": pl.col("s").is_in(partner_codes) | pl.col("o").is_in(partner_codes),
            }[role]
            matches = matches.filter(keep)
        return [matches.select(pl.col(column).alias("entity")) for column in ("s", "o")]

    def get_relation_distribution(
        self, date_range=None, head_entities=None, tail_entities=None
    ) -> dict[CAMEOCode, int]:
        """Second-level relations and their number of matching events, most frequent first."""
        matches = self._matching_events(self._filter(date_range, head_entities, tail_entities, None))
        if self.dialect == MIRAI:
            counted = mirai_order.value_counts(mirai_order.kg_rows(matches).get_column("r"))
            return {CAMEOCode(code): n for code, n in counted}
        counts = (
            matches.group_by("r")
            .len()
            .with_columns(pl.col("r").cast(pl.String))
            .sort(["len", "r"], descending=[True, False])
        )
        return {CAMEOCode(code): n for code, n in counts.iter_rows()}

    # --- news --------------------------------------------------------------------------------

    def _rank_articles(self, idx: pl.Series, text_description: str, limit: int) -> pl.DataFrame:
        """The ``limit`` news rows among ``idx`` (ascending row numbers) most relevant to
        ``text_description``, best first, with their row number ``idx``."""
        docs = self._news[idx].with_columns(idx.alias("idx"))
        tokens = docs.select(mirai_tokens(pl.col("title"), pl.col("text"))).to_series()
        if self.dialect == MIRAI:
            scores = okapi_scores(tokens, text_description.split(" ")) if len(tokens) else []
            return docs[pl.Series(mirai_order.best_first(scores, limit), dtype=pl.Int64)]
        return docs[pl.Series(rank_mirai(tokens, text_description, limit), dtype=pl.Int64)]

    def _matching_articles(self, date_range, head_entities, tail_entities, relations, keywords) -> pl.DataFrame:
        """Rows of the news table matching the filters, oldest first, with their row number ``idx``."""
        flt = self._filter(date_range, head_entities, tail_entities, relations)
        if flt.selects_events:
            idx = self._matching_events(flt).select(pl.col("article_idx").explode().drop_nulls().unique().sort())
            idx = idx.filter(pl.col("article_idx") < self._news.height).get_column("article_idx")
            articles = self._news[idx].with_columns(idx.alias("idx"))
        else:
            articles = self._news.with_row_index("idx")
            bounds = [pl.lit(True)]
            if flt.start is not None:
                bounds.append(pl.col("date") >= flt.start)
            if flt.end is not None:
                bounds.append(pl.col("date") <= flt.end)
            articles = articles.filter(pl.all_horizontal(bounds))
        words = coerce_keywords(keywords)
        if words:
            pattern = "(?i)" + "|".join(re.escape(w) for w in words)
            articles = articles.filter(pl.col("title").str.contains(pattern) | pl.col("text").str.contains(pattern))
        return articles

    def count_news_articles(
        self, date_range=None, head_entities=None, tail_entities=None, relations=None, keywords=None
    ) -> int:
        """Number of articles matching every condition; ``keywords``: any one of them must appear."""
        return self._matching_articles(date_range, head_entities, tail_entities, relations, keywords).height

    def get_news_articles(
        self,
        date_range=None,
        head_entities=None,
        tail_entities=None,
        relations=None,
        keywords=None,
        text_description: str | None = None,
    ) -> list[tuple[Date, str]]:
        """At most 15 (date, title) pairs: newest first, or most relevant to ``text_description`` first
        (BM25 over title and text; words match exactly, case-sensitive)."""
        articles = self._matching_articles(date_range, head_entities, tail_entities, relations, keywords)
        if not text_description and self.dialect == MIRAI:
            top = articles[mirai_order.newest_first(articles.get_column("date"))[:MAX_ARTICLES]]
        elif not text_description:
            top = articles.tail(MAX_ARTICLES).reverse()
        else:
            top = self._rank_articles(articles.get_column("idx"), text_description, MAX_ARTICLES)
        return [(Date(d.isoformat()), title) for d, title in top.select("date", "title").iter_rows()]

    def browse_news_article(self, date: Date | str, title: str) -> str:
        """The date, title and full text of the article with that date and title."""
        day = self.check_date(date)
        if not isinstance(title, str):
            raise TypeError(f"title must be a string, got {type(title).__name__}")
        same_day = self._news.filter(pl.col("date") == day)
        found = same_day.filter(pl.col("title") == title)
        if found.height == 0:
            found = same_day.filter(pl.col("title").str.strip_chars().str.to_lowercase() == title.strip().lower())
        if found.height == 0:
            raise ValueError(f"no article titled {title!r} on {day}; get_news_articles lists titles")
        row = found.row(0, named=True)
        return f"{date_header(day.isoformat(), self.dialect)}\n{row['title']}\n{row['text']}"

    # --- code blocks -------------------------------------------------------------------------

    def run_code(self, code: str, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        """Run an agent's code block in this environment's sandbox process; return the observation.
        Variables persist between calls. See sandbox.py for what the sandbox allows."""
        # Imported here, not at the top, though no cycle needs it (sandbox.py imports no module that
        # imports this one): every sandbox child imports this module (sandbox_child.serve_episode),
        # and must not import sandbox.py, whose import builds the parent's spare pool (via sandbox_spares.py) and registers
        # its exit and at-fork hooks (sandbox_spares.SPARES); only the parent runs code blocks.
        from pipeline.agent_api.sandbox import Sandbox

        if self._sandbox is None:
            memory = {} if self.memory_mb is None else {"memory_mb": self.memory_mb}
            self._sandbox = Sandbox(
                self,
                allow_unconfined=self.allow_unconfined_sandbox,
                libraries=self.code_libraries,
                handover_grid_s=self.sandbox_handover_grid_s,
                **memory,
            )
        return self._sandbox.run(code, timeout_s=timeout_s, memory_mb=memory_mb)

    @property
    def sandbox_report(self) -> dict | None:
        """What the lockdown of this environment's latest sandbox process applied (None if no code
        block has run): the layers docs/agent_api.md describes and the child's limits."""
        return None if self._sandbox is None else self._sandbox.last_report

    def close(self) -> None:
        """Stop the sandbox process, if one was started."""
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # --- what the sandbox needs ----------------------------------------------------------------

    def tables(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """This environment's (gated) events and news tables."""
        return self._events, self._news

    def table_files(self) -> list[tuple[Path, Path]]:
        """These tables as (events, news) Arrow file parts for a sandbox child to map: the
        database's shared per-cutoff parts, or this environment's own, written once."""
        if self._table_files is not None:
            return self._table_files()
        if self._own_files is None:
            self._own_files = TableFiles()
        return [self._own_files.part("tables", self.tables)]

    def functions(self) -> dict:
        """The names an agent's code calls: the functions of this environment's ``tools`` subset,
        bound to it; every other API function is a stand-in that only refuses."""
        offered = TOOL_SUBSETS[self.tools]
        return {name: getattr(self, name) if name in offered else _refusal(name, self.tools) for name in API_FUNCTIONS}


def unavailable_message(name: str, tools: str) -> str:
    return (
        f"{name} is not available: this agent has {TOOL_SUBSET_NAMES[tools]} (tools: {tools}), "
        f"whose functions are {', '.join(TOOL_SUBSETS[tools])}"
    )


def _refusal(name: str, tools: str):
    def refuse(*args, **kwargs):
        raise NameError(unavailable_message(name, tools))

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


def coerce_keywords(keywords) -> list[str]:
    if keywords is None:
        return []
    if isinstance(keywords, str):
        keywords = [keywords]
    words = [str(k).strip() for k in keywords]
    return [w for w in words if w]


API_FUNCTIONS = TOOL_SUBSETS["full"]
