"""A deterministic generator of the monthly event database (``database/{events,news}/month=YYYY-MM``).

The agent API, its latency bench and the split builders need a database of realistic size and
shape without running the whole pipeline. ``generate_event_database`` writes one events file and
one news file per month in exactly EVENT_DB_SCHEMA / NEWS_DB_SCHEMA:

- countries: the identity rows of the country table (real ISO codes), Zipf-like popularity with a
  hand-ordered head (USA, CHN, RUS, ...) the way GDELT's actor counts look;
- relations: every second-level CAMEO code, with GDELT's skew (statements 01, consultations 04,
  intent to cooperate 03, diplomatic cooperation 05 and fighting 19 dominate; inside a root the
  "not specified" code and a few known favourites such as 042/043/036/190 are heavier);
- daily_mentions: Pareto-tailed, always ≥ 50 (MIRAI's threshold), about 40% ≥ 100 (the test
  threshold); 1–12 article ids per quad, drawn from a per-day pool so articles are shared between
  quads the way one news story reports several events;
- news: one row per article id, dated on its quad's day, with a title and text built from country
  names, relation names and a small topic vocabulary, so BM25 and keyword filters have words to
  find.

Same arguments, same bytes: every random draw comes from ``random.Random`` seeded with the seed and
the month (never the range asked for, so a month's files do not depend on the months generated with
it), the rest is vectorised polars, and parquet files are written with fixed settings. Random
uniforms are drawn in Python (its generator is stable across versions, polars' hash is not) and
turned into categories with ``search_sorted`` over cumulative weights.
"""

from __future__ import annotations

import calendar
import hashlib
import random
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from pipeline.reference.tables import country_table, relation_table
from pipeline.splits.database import EVENT_DB_SCHEMA, NEWS_DB_SCHEMA
from pipeline.storage import DataLayout, write_sealed_parquet

GENERATOR_VERSION = "event-database-mirror-v1"
MIN_MENTIONS = 50
MAX_ARTICLES = 12
# Pareto shape of daily_mentions: P(m ≥ 100) = 0.5 ** 1.3 ≈ 0.41.
MENTIONS_ALPHA = 1.3
MAX_MENTIONS = 250_000
# Mean of the geometric-like article count (before the cap at 12): about 20% of quads get ≥ 5.
ARTICLES_SCALE = 2.3
# A day's article pool is this many times its quad count: quads share articles, as in GDELT.
ARTICLE_POOL_FACTOR = 1.6
ZIPF_EXPONENT = 1.15
# Candidates drawn per wanted quad; enough to cover the repeats of popular triples.
OVERDRAW = 1.4
# Fewer events are coded on weekends (Mon..Sun factors).
WEEKDAY_FACTOR = (1.05, 1.08, 1.08, 1.05, 1.0, 0.85, 0.8)

# The usual top of GDELT's international actor counts; every other country follows in code order.
HEAD_COUNTRIES = (
    "USA",
    "CHN",
    "RUS",
    "UKR",
    "ISR",
    "GBR",
    "IND",
    "IRN",
    "FRA",
    "DEU",
    "PSE",
    "TUR",
    "JPN",
    "CAN",
    "AUS",
    "SAU",
    "PAK",
    "KOR",
    "PRK",
    "SYR",
    "EGY",
    "IRQ",
    "AFG",
    "MEX",
    "ITA",
    "NGA",
    "QAT",
    "BRA",
    "ZAF",
    "LBN",
    "YEM",
    "PHL",
    "POL",
    "TWN",
    "ESP",
    "VEN",
    "ARE",
    "JOR",
    "AZE",
    "ARM",
    "SDN",
    "ETH",
    "KEN",
    "IDN",
    "BLR",
    "HUN",
    "SRB",
    "XKX",
    "VNM",
    "MMR",
)
# Share of events per CAMEO root, roughly GDELT's (statements, consultations, intent to cooperate,
# diplomatic cooperation and fighting first).
ROOT_WEIGHTS = {
    "01": 18.0,
    "02": 6.0,
    "03": 11.0,
    "04": 16.0,
    "05": 9.0,
    "06": 3.0,
    "07": 3.0,
    "08": 3.0,
    "09": 2.0,
    "10": 2.0,
    "11": 5.0,
    "12": 2.0,
    "13": 2.0,
    "14": 1.5,
    "15": 1.0,
    "16": 1.5,
    "17": 4.0,
    "18": 2.5,
    "19": 7.0,
    "20": 0.3,
}
# Second-level codes GDELT reports far more often than their siblings.
FAVOURITE_CODES = {
    "010": 4.0,
    "036": 4.0,
    "040": 3.0,
    "042": 5.0,
    "043": 4.0,
    "046": 3.0,
    "051": 3.0,
    "057": 3.0,
    "112": 3.0,
    "173": 3.0,
    "190": 5.0,
    "193": 2.0,
}
TOPICS = (
    "trade",
    "security",
    "border",
    "election",
    "sanctions",
    "ceasefire",
    "summit",
    "energy",
    "gas",
    "oil",
    "grain",
    "tariffs",
    "investment",
    "refugees",
    "migration",
    "drones",
    "missiles",
    "navy",
    "troops",
    "hostages",
    "aid",
    "humanitarian",
    "climate",
    "nuclear",
    "cyber",
    "embassy",
    "diplomats",
    "treaty",
    "alliance",
    "military",
    "exercises",
    "protests",
    "economy",
    "debt",
    "loans",
    "vaccines",
    "fishing",
    "airspace",
    "shipping",
    "ports",
    "pipeline",
    "weapons",
    "ammunition",
    "peace",
    "negotiations",
    "elections",
    "corruption",
    "journalists",
    "tourism",
    "students",
    "technology",
    "semiconductors",
    "minerals",
    "water",
    "dam",
    "floods",
    "earthquake",
    "famine",
    "terrorism",
    "smuggling",
)
OUTLETS = ("Reuters", "AP", "AFP", "the BBC", "Al Jazeera", "Xinhua", "local media", "state media")
TITLE_TEMPLATES = 4
# Quads per day before the weekday factor; 5000 gives about 150,000 quads a month.
DEFAULT_QUADS_PER_DAY = 5000


def _cumulative(weights: list[float]) -> pl.Series:
    cum = pl.Series(weights, dtype=pl.Float64).cum_sum()
    return cum / cum[-1]


def _countries() -> pl.DataFrame:
    """Identity rows ordered by popularity: the curated head, then the rest by code."""
    table = country_table().filter(pl.col("status") == "identity").select("iso3", "name")
    head = {code: rank for rank, code in enumerate(HEAD_COUNTRIES)}
    ordered = table.with_columns(
        pl.col("iso3").replace_strict(head, default=len(head), return_dtype=pl.Int64).alias("head_rank")
    ).sort("head_rank", "iso3")
    return ordered.with_row_index("rank").select("rank", "iso3", "name")


def _relations() -> pl.DataFrame:
    rel = relation_table().select("code", "name", "level1", "level1_name")
    root = pl.col("level1").replace_strict(ROOT_WEIGHTS, return_dtype=pl.Float64)
    within = pl.when(pl.col("code").str.ends_with("0")).then(3.0).otherwise(1.0) * pl.col("code").replace_strict(
        FAVOURITE_CODES, default=1.0, return_dtype=pl.Float64
    )
    # A root's weight is shared among its children in proportion to their within-root weight.
    return rel.with_columns((root * within / within.sum().over("level1")).alias("weight"))


def _uniforms(rng: random.Random, n: int) -> pl.Series:
    # 1 - random() lies in (0, 1]: safe for logs and negative powers.
    rnd = rng.random
    return pl.Series([1.0 - rnd() for _ in range(n)], dtype=pl.Float64)


def _pick(cumulative: pl.Series, u: pl.Series) -> pl.Series:
    """Category indices for uniforms u, by inverse CDF over normalised cumulative weights."""
    return cumulative.search_sorted(u, side="left").clip(0, len(cumulative) - 1).cast(pl.Int64)


def _day_counts(first: date, quads_per_day: int) -> pl.DataFrame:
    days = [first + timedelta(days=i) for i in range(calendar.monthrange(first.year, first.month)[1])]
    return pl.DataFrame(
        {
            "date": pl.Series(days, dtype=pl.Date),
            "target": [max(1, round(quads_per_day * WEEKDAY_FACTOR[day.weekday()])) for day in days],
        }
    )


def _month_quads(
    rng: random.Random, first: date, quads_per_day: int, countries: pl.DataFrame, relations: pl.DataFrame
) -> pl.DataFrame:
    """Unique (date, s, r, o) quads with mentions and the number of article draws.

    Popular triples repeat within a day, so each day draws OVERDRAW times its target and keeps the
    first ``target`` distinct quads.
    """
    days = _day_counts(first, quads_per_day)
    candidates = days.select("date", (pl.col("target") * OVERDRAW).ceil().cast(pl.Int64).alias("n")).select(
        pl.col("date").repeat_by("n").explode()
    )
    n = candidates.height
    n_countries = countries.height
    country_cdf = _cumulative([1.0 / (rank + 1) ** ZIPF_EXPONENT for rank in range(n_countries)])
    relation_cdf = _cumulative(relations.get_column("weight").to_list())
    frame = candidates.with_columns(
        s_rank=_pick(country_cdf, _uniforms(rng, n)),
        o_rank=_pick(country_cdf, _uniforms(rng, n)),
        r_idx=_pick(relation_cdf, _uniforms(rng, n)),
        u_mentions=_uniforms(rng, n),
        u_articles=_uniforms(rng, n),
    )
    return (
        frame.with_columns(
            # No domestic events: move a self-loop's object to the next country in rank order.
            pl.when(pl.col("s_rank") == pl.col("o_rank"))
            .then((pl.col("o_rank") + 1) % n_countries)
            .otherwise(pl.col("o_rank"))
            .alias("o_rank"),
            (MIN_MENTIONS * pl.col("u_mentions").pow(-1.0 / MENTIONS_ALPHA))
            .floor()
            .clip(MIN_MENTIONS, MAX_MENTIONS)
            .cast(pl.Int64)
            .alias("daily_mentions"),
            (1 + (-pl.col("u_articles").log() * ARTICLES_SCALE).floor())
            .clip(1, MAX_ARTICLES)
            .cast(pl.Int64)
            .alias("draws"),
        )
        .unique(["date", "s_rank", "r_idx", "o_rank"], keep="first", maintain_order=True)
        .join(days.select("date", "target"), on="date", how="left", maintain_order="left")
        .filter(pl.int_range(pl.len()).over("date") < pl.col("target"))
        .drop("u_mentions", "u_articles", "target")
        .with_row_index("quad")
    )


def _article_draws(rng: random.Random, quads: pl.DataFrame) -> pl.DataFrame:
    """One row per (quad, article) link: each quad draws ``draws`` articles from its day's pool."""
    pool = (
        quads.group_by("date")
        .agg(pl.len().alias("day_quads"))
        .with_columns((pl.col("day_quads") * ARTICLE_POOL_FACTOR).ceil().cast(pl.Int64).alias("pool"))
    )
    links = (
        quads.select("quad", "date", pl.int_ranges(0, "draws").alias("k"))
        .explode("k")
        .join(pool.select("date", "pool"), on="date", how="left", maintain_order="left")
    )
    return (
        links.with_columns(
            (_uniforms(rng, links.height) * pl.col("pool"))
            .floor()
            .cast(pl.Int64)
            .clip(0, pl.col("pool") - 1)
            .alias("slot")
        )
        .unique(["quad", "slot"], maintain_order=True)
        .select("quad", "date", "slot")
    )


def _article_ids(seed: int, articles: pl.DataFrame) -> pl.Series:
    # md5 like the real article ids (md5 of a URL); a Python loop, but over unique articles only.
    keys = zip(articles.get_column("date").to_list(), articles.get_column("slot").to_list())
    return pl.Series("article_id", [hashlib.md5(f"{seed}/{day}/{slot}".encode()).hexdigest() for day, slot in keys])


def _articles(seed: int, links: pl.DataFrame) -> pl.DataFrame:
    """One row per linked (date, slot): its md5 id and the first quad citing it (which its words
    are about)."""
    articles = links.group_by("date", "slot").agg(pl.col("quad").min()).sort("date", "slot")
    return articles.with_columns(_article_ids(seed, articles))


def _news(rng: random.Random, articles: pl.DataFrame, quads: pl.DataFrame, countries: pl.DataFrame) -> pl.DataFrame:
    """One news row per article, with a title and text about its quad."""
    n = articles.height
    n_topics, n_outlets, n_countries = len(TOPICS), len(OUTLETS), countries.height
    topic_idx = list(range(n_topics))

    def choice(size: int) -> pl.Series:
        return (_uniforms(rng, n) * size).floor().cast(pl.Int64).clip(0, size - 1)

    draws = pl.DataFrame(
        {
            "template": choice(TITLE_TEMPLATES),
            "t1": choice(n_topics),
            "t2": choice(n_topics),
            "t3": choice(n_topics),
            "outlet": choice(n_outlets),
            "third": choice(n_countries),
        }
    )
    names = countries.select("rank", "name")
    topic = {f"t{i}": pl.col(f"t{i}").replace_strict(topic_idx, list(TOPICS)) for i in (1, 2, 3)}
    frame = (
        pl.concat([articles, draws], how="horizontal")
        .join(
            quads.select("quad", "s_name", "o_name", "r_name", "level1_name"),
            on="quad",
            how="left",
            maintain_order="left",
        )
        .join(names.rename({"rank": "third", "name": "third_name"}), on="third", how="left", maintain_order="left")
        .with_columns(
            **topic,
            outlet=pl.col("outlet").replace_strict(list(range(n_outlets)), list(OUTLETS)),
            action=pl.col("r_name").str.replace(r", not specified$", "").str.to_lowercase(),
        )
    )
    title = (
        pl.when(pl.col("template") == 0)
        .then(pl.format("{} and {}: {}", "s_name", "o_name", "r_name"))
        .when(pl.col("template") == 1)
        .then(pl.format("{} moves to {} with {} amid {} row", "s_name", "action", "o_name", "t1"))
        .when(pl.col("template") == 2)
        .then(pl.format("{} talks: {} and {} on {}", "t1", "s_name", "o_name", "t2"))
        .otherwise(pl.format("{} responds as {} signals {}", "o_name", "s_name", "action"))
    )
    first = pl.format(
        "{} and {} were in the news as officials moved to {}, {} reported. It is the latest case of {} between the two, amid concerns over {} and {}.",
        "s_name",
        "o_name",
        "action",
        "outlet",
        pl.col("level1_name").str.to_lowercase(),
        "t1",
        "t2",
    )
    second = pl.format(
        "Talks on {} involving {} are expected to continue, according to diplomats in {}.", "t3", "third_name", "s_name"
    )
    return (
        frame.select(
            "article_id",
            "date",
            pl.format("https://news.example/{}/{}", pl.col("date").dt.strftime("%Y/%m/%d"), "article_id").alias("url"),
            title.alias("title"),
            pl.concat_str([first, second], separator="\n").alias("text"),
            pl.concat_str([title, first], separator="\n").alias("abstract"),
        )
        .cast(dict(NEWS_DB_SCHEMA))
        .select(list(NEWS_DB_SCHEMA))
    )


def generate_month(
    first: date, *, seed: int, quads_per_day: int = DEFAULT_QUADS_PER_DAY
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The (events, news) frames of the month starting at ``first``, in the database schemas."""
    rng = random.Random(f"{GENERATOR_VERSION}/{seed}/{first:%Y-%m}")
    countries, relations = _countries(), _relations()
    quads = _month_quads(rng, first, quads_per_day, countries, relations)
    quads = (
        quads.join(
            countries.rename({"rank": "s_rank", "iso3": "s", "name": "s_name"}),
            on="s_rank",
            how="left",
            maintain_order="left",
        )
        .join(
            countries.rename({"rank": "o_rank", "iso3": "o", "name": "o_name"}),
            on="o_rank",
            how="left",
            maintain_order="left",
        )
        .join(
            relations.with_row_index("r_idx").select(
                pl.col("r_idx").cast(pl.Int64),
                pl.col("code").alias("r"),
                pl.col("level1").alias("r1"),
                pl.col("name").alias("r_name"),
                "level1_name",
            ),
            on="r_idx",
            how="left",
            maintain_order="left",
        )
    )
    links = _article_draws(rng, quads)
    articles = _articles(seed, links)
    news = _news(rng, articles, quads, countries)
    linked = (
        links.join(articles.select("date", "slot", "article_id"), on=["date", "slot"], how="left")
        .group_by("quad")
        .agg(pl.col("article_id").unique().sort().alias("article_ids"))
    )
    events = (
        quads.join(linked, on="quad", how="left")
        .with_columns(pl.col("article_ids").list.len().cast(pl.UInt32).alias("n_articles"))
        .select(list(EVENT_DB_SCHEMA))
        .cast(dict(EVENT_DB_SCHEMA))
        .sort("date", "s", "o", "r")
    )
    return events, news


def _month_starts(first_month: date, months: int) -> list[date]:
    out, year, month = [], first_month.year, first_month.month
    for _ in range(months):
        out.append(date(year, month, 1))
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


def generate_event_database(
    data_dir: Path | str, first_month: date, months: int, *, seed: int, quads_per_day: int = DEFAULT_QUADS_PER_DAY
) -> dict:
    """Write ``months`` months of events and news under ``data_dir``; return the row counts.

    ``{"events": total, "news": total, "months": {"YYYY-MM": {"events": n, "news": m}}}``.
    """
    layout = DataLayout(data_dir)
    metadata = {"generator": GENERATOR_VERSION, "seed": str(seed), "quads_per_day": str(quads_per_day)}
    per_month: dict[str, dict[str, int]] = {}
    for first in _month_starts(first_month, months):
        events, news = generate_month(first, seed=seed, quads_per_day=quads_per_day)
        write_sealed_parquet(layout, events, layout.database_path("events", first), metadata)
        write_sealed_parquet(layout, news, layout.database_path("news", first), metadata)
        per_month[f"{first:%Y-%m}"] = {"events": events.height, "news": news.height}
    return {
        "events": sum(m["events"] for m in per_month.values()),
        "news": sum(m["news"] for m in per_month.values()),
        "months": per_month,
    }
