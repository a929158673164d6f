"""Great Expectations 1.x suites for the pipeline's tables, run on polars frames.

Plain functions: no dagster here (quality/event_checks.py wraps them in asset checks). GX is
imported inside the functions only, because ``import great_expectations`` costs seconds and
everything that loads the code location (``dg check defs``, sensors, the code server) would pay it.
GX has no polars engine and costs per expectation, not per row, so each suite checks the stored
dtypes on the polars side, computes its row rules (``RowRule``) with polars into one column that GX
validates as one expectation, hands GX the table rules and only the values of the columns they
read; one ephemeral context per process. The suites, their rules and why: docs/architecture.md
(the checks) and docs/benchmarks.md, "Day suites".
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.gdelt.schema import EXPORT_SCHEMA

SLOT_MINUTES = 15
MAX_UNEXPECTED_VALUES = 5
SCHEMA_CHECK = "polars_schema_matches"  # the failure type of the polars-side dtype check


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    passed: bool
    statistics: dict[str, Any]
    # One dict per failed expectation: expectation (GX type or SCHEMA_CHECK), column, rule,
    # unexpected_count, unexpected_values (a few), and observed / exception when GX gives them.
    failures: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None

    @property
    def failed_expectations(self) -> set[str]:
        return {f["expectation"] for f in self.failures}

    def failures_frame(self) -> pl.DataFrame:
        """One row per failed expectation, for the check's table: its examples (unexpected values
        from the data, so possibly from a hostile GDELT file) as JSON, cut at 300 characters."""
        rows = []
        for f in self.failures:
            examples = f.get("unexpected_values") or f.get("exception") or f.get("observed") or ""
            rows.append(
                {
                    "expectation": f["expectation"],
                    "column": f.get("column") or "",
                    "rule": f.get("rule") or "",
                    "unexpected": f.get("unexpected_count"),
                    "examples": (json.dumps(examples, default=str) if not isinstance(examples, str) else examples)[
                        :300
                    ],
                }
            )
        schema = {"expectation": pl.String, "column": pl.String, "rule": pl.String, "unexpected": pl.Int64}
        return pl.DataFrame(rows, schema={**schema, "examples": pl.String})


# ---------------------------------------------------------------------------------------------
# Shared machinery


def _schema_failures(df: pl.DataFrame, expected: pl.Schema, where: str | None = None) -> list[dict[str, Any]]:
    """Column names, order and dtypes as stored, checked on the polars side."""
    actual = df.schema
    if actual == expected:
        return []
    problems: list[str] = []
    if list(actual.names()) != list(expected.names()):
        missing = [c for c in expected.names() if c not in actual]
        extra = [c for c in actual.names() if c not in expected]
        problems.append(
            f"columns differ: missing={missing}, extra={extra}, count={len(actual)}/{len(expected)}"
            if missing or extra
            else "columns out of order"
        )
    problems += [f"{c}: {actual[c]} != {dtype}" for c, dtype in expected.items() if c in actual and actual[c] != dtype]
    return [
        {
            "expectation": SCHEMA_CHECK,
            "column": None,
            "rule": f"stored schema{' of ' + where if where else ''}",
            "unexpected_count": len(problems),
            "unexpected_values": problems[:MAX_UNEXPECTED_VALUES],
        }
    ]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _failure(r) -> dict[str, Any]:
    kwargs = r.expectation_config.kwargs
    result = r.result or {}
    column = kwargs.get("column") or kwargs.get("column_list")
    if column is None and "column_A" in kwargs:
        column = [kwargs["column_A"], kwargs["column_B"]]
    if r.expectation_config.type.startswith("expect_table_"):
        column = "(table)"
    out: dict[str, Any] = {
        "expectation": r.expectation_config.type,
        "column": column if isinstance(column, str) or column is None else ", ".join(map(str, column)),
        "rule": (r.expectation_config.meta or {}).get("rule"),
        "unexpected_count": result.get("unexpected_count"),
        "unexpected_values": _jsonable(list(result.get("partial_unexpected_list") or [])[:MAX_UNEXPECTED_VALUES]),
    }
    if "observed_value" in result:
        out["observed"] = str(_jsonable(result["observed_value"]))[:300]
    if (result.get("details") or {}).get("mismatched"):
        out["observed"] = str(_jsonable(result["details"]["mismatched"]))[:300]
    info = r.exception_info or {}
    messages = (
        [info.get("exception_message")]
        if "raised_exception" in info
        else [v.get("exception_message") for v in info.values() if isinstance(v, dict)]
    )
    messages = [m for m in messages if m]
    if messages:
        out["exception"] = messages[0][:300]
    return out


@dataclass(frozen=True)
class RowRule:
    """A rule each row must meet, computed by polars as a boolean column (``violated``).

    A suite's row rules reach GX as one expectation: ``ROW_VIOLATIONS`` (the names of the rules a
    row breaks, null when it breaks none) must be null. GX's cost is per expectation (metric graph
    and pydantic copies of every kwarg, value sets included), not per row: one wide expectation
    instead of one per rule made the day suites several times cheaper (docs/benchmarks.md).
    A failure still names the rule, the columns it reads, its exact count and a few examples;
    ``expectation`` is the GX expectation type the rule states, so reports read as before.
    """

    expectation: str
    columns: tuple[str, ...]
    rule: str
    violated: pl.Expr


ROW_VIOLATIONS = "_row_rule_violations"
ROW_RULES_EXPECTATION = "expect_column_values_to_be_null"  # what GX runs on ROW_VIOLATIONS


def not_null(column: str, rule: str) -> RowRule:
    return RowRule("expect_column_values_to_not_be_null", (column,), rule, pl.col(column).is_null())


def in_set(column: str, values: list[str], rule: str) -> RowRule:
    """Nulls pass, as in GX (a ``not_null`` rule catches them)."""
    return RowRule(
        "expect_column_values_to_be_in_set",
        (column,),
        rule,
        pl.col(column).is_not_null() & ~pl.col(column).is_in(values),
    )


def at_least(column: str, low: int, rule: str, below: int | None = None) -> RowRule:
    """``low <= value`` (and ``value < below`` when given); nulls pass, as in GX."""
    value = pl.col(column)
    outside = value < low if below is None else (value < low) | (value >= below)
    return RowRule("expect_column_values_to_be_between", (column,), rule, value.is_not_null() & outside)


def is_null(column: str, rule: str) -> RowRule:
    return RowRule("expect_column_values_to_be_null", (column,), rule, pl.col(column).is_not_null())


def matches(column: str, regex: str, rule: str) -> RowRule:
    """The value contains a match of ``regex`` (``re.search``, as GX's pandas engine); nulls pass,
    as in GX (a ``not_null`` rule catches them)."""
    return RowRule(
        "expect_column_values_to_match_regex",
        (column,),
        rule,
        pl.col(column).is_not_null() & ~pl.col(column).str.contains(regex),
    )


def only_where(condition: pl.Expr, rule: RowRule) -> RowRule:
    """``rule`` on the rows where ``condition`` is true (GX's ``row_condition``); rows where it is
    false or null pass."""
    return RowRule(rule.expectation, rule.columns, rule.rule, condition & rule.violated)


def pair_equal(a: str, b: str, rule: str) -> RowRule:
    """GX's pair rule: a row with both values missing is skipped; one missing value is unequal."""
    return RowRule(
        "expect_column_pair_values_to_be_equal",
        (a, b),
        rule,
        ~(pl.col(a).is_null() & pl.col(b).is_null()) & pl.col(a).ne_missing(pl.col(b)),
    )


def differ(a: str, b: str, rule: str) -> RowRule:
    """GX's unique-within-record on two columns: equal values break it, a missing value does not."""
    return RowRule(
        "expect_select_column_values_to_be_unique_within_record",
        (a, b),
        rule,
        pl.col(a).is_not_null() & pl.col(b).is_not_null() & (pl.col(a) == pl.col(b)),
    )


def _apply_row_rules(
    df: pl.DataFrame, rules: list[RowRule]
) -> tuple[pl.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """``df`` with ``ROW_VIOLATIONS`` added; the failure of each broken rule (count and examples);
    and the rules that could not be computed (a missing column or a wrong dtype, also reported by
    the schema check), each as a failure with its exception, as GX reported such an expectation."""
    flags: dict[str, pl.Series] = {}
    failures: list[dict[str, Any]] = []
    unusable: list[dict[str, Any]] = []
    for i, r in enumerate(rules):
        base = {"expectation": r.expectation, "column": ", ".join(r.columns), "rule": r.rule}
        try:
            flag = df.select(r.violated.fill_null(False)).to_series()
        except pl.exceptions.PolarsError as exc:
            unusable.append(
                {
                    **base,
                    "unexpected_count": None,
                    "unexpected_values": [],
                    "exception": f"{type(exc).__name__}: {exc}"[:300],
                }
            )
            continue
        flags[f"_rule_{i}"] = flag
        count = int(flag.sum())
        if count:
            shown = df.filter(flag).select(r.columns).head(MAX_UNEXPECTED_VALUES)
            examples = shown.to_series().to_list() if len(r.columns) == 1 else shown.rows()
            failures.append(
                {
                    **base,
                    "unexpected_count": count,
                    "unexpected_values": _jsonable(examples),
                    "validated_by": f"{ROW_RULES_EXPECTATION} on {ROW_VIOLATIONS}",
                }
            )
    if flags:
        marks = pl.DataFrame(flags)
        named = [
            pl.when(pl.col(f"_rule_{i}")).then(pl.lit(r.rule)) for i, r in enumerate(rules) if f"_rule_{i}" in flags
        ]
        violations = marks.select(
            pl.concat_str(named, separator="; ", ignore_nulls=True).replace("", None).alias(ROW_VIOLATIONS)
        ).to_series()
    else:
        violations = pl.Series(ROW_VIOLATIONS, [None] * df.height, pl.String)
    return df.with_columns(violations), failures, unusable


# One ephemeral GX context per process (nothing on disk), with each suite's batch definition and
# ExpectationSuite built on first use: building them cost as much as validating a small day.
# ``Batch.validate`` stores no results, so the cached context does not grow from run to run.
_gx_lock = threading.Lock()
_gx_cache: dict[str, Any] = {}


def _validation_of(suite_name: str, expectations: Callable[[], list]) -> tuple[Any, Any]:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    if "context" not in _gx_cache:
        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # no tqdm spam in Dagster logs
        _gx_cache["context"] = ctx
        _gx_cache["source"] = ctx.data_sources.add_pandas("mirai_tables")
    if suite_name not in _gx_cache:
        batch = _gx_cache["source"].add_dataframe_asset(suite_name).add_batch_definition_whole_dataframe("whole")
        _gx_cache[suite_name] = (batch, gx.ExpectationSuite(name=suite_name, expectations=expectations()))
    return _gx_cache[suite_name]


def _run(
    suite_name: str,
    df: pl.DataFrame,
    expectations: Callable[[], list],
    rules: list[RowRule],
    schema_failures: list[dict[str, Any]],
    extra_stats: dict[str, Any],
) -> SuiteResult:
    """Validate ``df`` (polars, derived columns included) with GX: the suite's own expectations
    (built once per process by ``expectations``) and, when it has row rules, their combined column."""
    import great_expectations.expectations as gxe

    df, row_failures, unusable = _apply_row_rules(df, rules) if rules else (df, [], [])

    def suite_expectations() -> list:
        combined = [gxe.ExpectColumnValuesToBeNull(column=ROW_VIOLATIONS, meta={"rule": "every row rule of the suite"})]
        return expectations() + (combined if rules else [])

    with _gx_lock:
        batch, suite = _validation_of(suite_name, suite_expectations)
        frame = _gx_frame(df, suite)
        res = batch.get_batch(batch_parameters={"dataframe": frame}).validate(suite, result_format="SUMMARY")
    failures = list(schema_failures)
    for r in res.results:
        if r.success:
            continue
        is_row_rules = r.expectation_config.kwargs.get("column") == ROW_VIOLATIONS
        failures += row_failures if is_row_rules and row_failures else [_failure(r)]
    failures += unusable
    stats = {
        **extra_stats,
        **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in dict(res.statistics).items()},
        "rules": len(suite.expectations) - (1 if rules else 0) + len(rules),
        "schema_problems": sum(f["unexpected_count"] for f in schema_failures),
    }
    return SuiteResult(
        suite_name,
        passed=bool(res.success) and not schema_failures and not unusable,
        statistics=stats,
        failures=failures,
    )


def _gx_frame(df: pl.DataFrame, suite) -> Any:
    """``df`` as the pandas frame GX validates: the columns an expectation reads with their
    values, every other column by name only (zeros). The suites' only table rule reads names (the
    ordered column list; dtypes are checked on the polars side), so the results are the same, but
    GX hashes every batch it gets (a fingerprint, twice per ``Batch.validate``) and converting and
    hashing the raw_events day's 61 columns was a third of the suite's time."""
    read: set[str] = set()
    for e in suite.expectations:
        if e.expectation_type.startswith("expect_table_"):
            continue
        read.update(
            c
            for c in [
                getattr(e, "column", None),
                getattr(e, "column_A", None),
                getattr(e, "column_B", None),
                *(getattr(e, "column_list", None) or []),
            ]
            if c
        )
    return df.select(pl.col(c) if c in read else pl.lit(0, pl.Int8).alias(c) for c in df.columns).to_pandas()


def _empty(suite_name: str, schema_failures: list[dict[str, Any]], note: str, **stats: Any) -> SuiteResult:
    return SuiteResult(
        suite_name, passed=not schema_failures, statistics={"rows": 0, **stats}, failures=schema_failures, note=note
    )


def _derived(
    df: pl.DataFrame, column: str, expected: pl.DataType, expr: pl.Expr, name: str, out: pl.DataType
) -> pl.Expr:
    """A derived column, or nulls when its source column is absent or not of the stored type
    (the schema check reports that; the expectation on the derived column then fails too)."""
    ok = column in df.columns and df.schema[column] == expected
    return (expr if ok else pl.lit(None, out)).alias(name)


# ---------------------------------------------------------------------------------------------
# raw_events: the parsed GDELT export rows of one day, one frame per 15-minute slot


def slot_of_file(path: Path) -> datetime:
    """``20240101101500.parquet`` -> 2024-01-01 10:15 UTC."""
    return datetime.strptime(path.name.split(".", 1)[0], "%Y%m%d%H%M%S").replace(tzinfo=UTC)


def read_raw_events_day(directory: Path) -> dict[datetime, pl.DataFrame]:
    """Every slot parquet of a day's ``parsed/export/date=…`` directory, keyed by its slot."""
    if not directory.exists():
        return {}
    return {slot_of_file(p): pl.read_parquet(p) for p in sorted(directory.glob("[0-9]*.parquet"))}


RAW_DERIVED = ["slot", "_dateadded_offset_s", ROW_VIOLATIONS]


def validate_raw_events(slots: Mapping[datetime, pl.DataFrame]) -> SuiteResult:
    """The parsed export rows of one day, given per slot (the time in the file's name)."""
    import great_expectations.expectations as gxe

    schema_failures = [
        f for slot, df in slots.items() for f in _schema_failures(df, EXPORT_SCHEMA, where=f"slot {slot:%Y%m%d%H%M%S}")
    ]
    total = sum(df.height for df in slots.values())
    if total == 0:
        return _empty("raw_events", schema_failures, "no parsed export rows for this day", files=len(slots))
    # Each row's slot, repeated per file in one expression (a literal per file cost more than
    # validating the day once GX ran one expectation for the row rules).
    per_file = pl.DataFrame(
        {"slot": list(slots), "rows": [df.height for df in slots.values()]},
        schema={"slot": pl.Datetime("us", "UTC"), "rows": pl.UInt32},
    )
    slot = per_file.filter(pl.col("rows") > 0).select(pl.col("slot").repeat_by("rows").explode()).to_series()
    rows = pl.concat(list(slots.values()), how="diagonal_relaxed").with_columns(slot)
    rows = rows.with_columns(
        _derived(
            rows,
            "DATEADDED",
            EXPORT_SCHEMA["DATEADDED"],
            (pl.col("DATEADDED") - pl.col("slot")).dt.total_seconds(),
            "_dateadded_offset_s",
            pl.Int64,
        )
    )
    slot_seconds = SLOT_MINUTES * 60

    def expectations() -> list:  # called once per process (_validation_of)
        return [
            gxe.ExpectTableColumnsToMatchOrderedList(
                column_list=[*EXPORT_SCHEMA.names(), *RAW_DERIVED],
                meta={"rule": "raw: exactly the 61 export columns, in order"},
            ),  # raw schema (dtypes: polars side)
            gxe.ExpectColumnValuesToBeUnique(
                column="GLOBALEVENTID", meta={"rule": "raw: GLOBALEVENTID unique over the day"}
            ),  # raw: event key (rule 1 input)
        ]

    rules = [
        not_null("GLOBALEVENTID", "raw: GLOBALEVENTID present"),  # raw: event key
        not_null("_dateadded_offset_s", "raw: DATEADDED present"),  # raw: publication time (rule 2 input)
        at_least(
            "_dateadded_offset_s", 0, "raw: DATEADDED within [slot, slot + 15 min)", below=slot_seconds
        ),  # raw: file/slot consistency
    ]
    return _run(
        "raw_events",
        rows,
        expectations,
        rules,
        schema_failures,
        {"rows": total, "files": len(slots), "first_slot": str(min(slots)), "last_slot": str(max(slots))},
    )


# ---------------------------------------------------------------------------------------------
# events: the normalised international events of one day (pipeline/events/normalize.py rules)

EVENTS_DERIVED = ["_r_prefix", "_date_added_day", ROW_VIOLATIONS]


def validate_events(events: pl.DataFrame) -> SuiteResult:
    import great_expectations.expectations as gxe

    from pipeline.events.normalize import EVENTS_SCHEMA
    from pipeline.reference.tables import iso3_codes, level2_codes

    schema_failures = _schema_failures(events, EVENTS_SCHEMA)
    if events.height == 0:
        return _empty("events", schema_failures, "no events on this day")
    df = events.with_columns(
        _derived(events, "r", pl.String(), pl.col("r").str.slice(0, 2), "_r_prefix", pl.String),
        # date_added is stored in UTC, so its calendar day is the UTC day.
        _derived(
            events,
            "date_added",
            EVENTS_SCHEMA["date_added"],
            pl.col("date_added").dt.date(),
            "_date_added_day",
            pl.Date,
        ),
    )
    iso3, level2 = sorted(iso3_codes()), sorted(level2_codes())

    def expectations() -> list:  # called once per process (_validation_of)
        return [
            gxe.ExpectTableColumnsToMatchOrderedList(
                column_list=[*EVENTS_SCHEMA.names(), *EVENTS_DERIVED], meta={"rule": "events: stored columns, in order"}
            ),  # schema (dtypes: polars side)
            gxe.ExpectColumnValuesToBeUnique(
                column="event_id", meta={"rule": "1: GLOBALEVENTID deduplicated"}
            ),  # rule 1
        ]

    rules = [
        not_null("event_id", "1: event_id present"),  # rule 1
        not_null("date", "2: date present"),  # rule 2
        pair_equal("date", "_date_added_day", "2: date is the UTC day of date_added"),  # rule 2
        not_null("s", "3: s mapped"),  # rule 3
        in_set("s", iso3, "3: s is an ISO 3166-1 alpha-3 country"),  # rule 3
        not_null("o", "3: o mapped"),  # rule 3
        in_set("o", iso3, "3: o is an ISO 3166-1 alpha-3 country"),  # rule 3
        differ("s", "o", "4: no domestic event (s != o)"),  # rule 4
        not_null("r", "5: r present"),  # rule 5
        in_set("r", level2, "5: r is a MIRAI level-2 CAMEO code"),  # rule 5
        pair_equal("r1", "_r_prefix", "5: r1 is the first two digits of r"),  # rule 5
    ]
    days = events.get_column("date").drop_nulls().unique().sort().to_list() if "date" in events.columns else []
    return _run(
        "events",
        df,
        expectations,
        rules,
        schema_failures,
        {"rows": events.height, "days": ", ".join(str(d) for d in days[:3]) + (" …" if len(days) > 3 else "")},
    )


# ---------------------------------------------------------------------------------------------
# daily_quads: one row per (date, s, r, o)

QUAD_KEY = ["date", "s", "r", "o"]


def validate_daily_quads(quads: pl.DataFrame) -> SuiteResult:
    import great_expectations.expectations as gxe

    from pipeline.events.quads import QUADS_SCHEMA

    schema_failures = _schema_failures(quads, QUADS_SCHEMA)
    if quads.height == 0:
        return _empty("daily_quads", schema_failures, "no quads on this day")

    def expectations() -> list:  # called once per process (_validation_of)
        return [
            gxe.ExpectTableColumnsToMatchOrderedList(
                column_list=[*QUADS_SCHEMA.names(), ROW_VIOLATIONS], meta={"rule": "quads: stored columns, in order"}
            ),  # schema (dtypes: polars side)
            gxe.ExpectCompoundColumnsToBeUnique(
                column_list=QUAD_KEY, meta={"rule": "quads: one row per (date, s, r, o)"}
            ),  # compound key unique
        ]

    rules = [
        *[not_null(c, f"quads: key column {c} present") for c in QUAD_KEY],  # compound key complete
        at_least("daily_mentions", 1, "quads: daily_mentions >= 1"),  # a quad is mentioned
        at_least("n_events", 1, "quads: n_events >= 1"),  # a quad has events
    ]
    return _run(
        "daily_quads",
        quads,
        expectations,
        rules,
        schema_failures,
        {
            "rows": quads.height,
            "total_mentions": int(quads.get_column("daily_mentions").sum())
            if "daily_mentions" in quads.columns and quads.schema["daily_mentions"].is_numeric()
            else None,
        },
    )


# ---------------------------------------------------------------------------------------------
# articles: one row per stored article page of the day's selection (pipeline/articles/day.py)

ARTICLE_PROFILES = ("mirai", "obelics")
URL_MD5_REGEX = r"^[0-9a-f]{32}$"  # hashlib.md5(...).hexdigest()
NON_BLANK_REGEX = r"\S"  # at least one non-whitespace character


def filter_label(failing_filter: str) -> str:
    """``failing_filter`` without the per-document detail: ``extraction:failed: ValueError: …`` and
    ``extraction:crashed: exit code -9`` count as ``extraction:failed`` and ``extraction:crashed``."""
    return failing_filter.split(": ", 1)[0]


def article_counts(articles: pl.DataFrame) -> dict[str, int]:
    """rows, kept, dropped, and dropped per failing filter (``dropped_<filter_label>``), from the file."""
    if not {"kept", "failing_filter"} <= set(articles.columns) or articles.schema["kept"] != pl.Boolean:
        return {"rows": articles.height}
    kept = int(articles.get_column("kept").sum())
    dropped = articles.filter(~pl.col("kept").fill_null(False))
    counts = {"rows": articles.height, "kept": kept, "dropped": dropped.height}
    labels = dropped.get_column("failing_filter").cast(pl.String).fill_null("(none)").to_list()
    for label, n in sorted(Counter(filter_label(v) for v in labels).items()):
        counts[f"dropped_{label}"] = n
    return counts


def validate_articles(articles: pl.DataFrame) -> SuiteResult:
    """The day's articles parquet (``ARTICLES_SCHEMA``)."""
    import great_expectations.expectations as gxe

    from pipeline.articles.day import ARTICLES_SCHEMA

    schema_failures = _schema_failures(articles, ARTICLES_SCHEMA)
    counts = article_counts(articles)
    if articles.height == 0:
        return _empty(
            "articles", schema_failures, "no articles on this day", **{k: v for k, v in counts.items() if k != "rows"}
        )

    def expectations() -> list:  # called once per process (_validation_of)
        return [
            gxe.ExpectTableColumnsToMatchOrderedList(
                column_list=[*ARTICLES_SCHEMA.names(), ROW_VIOLATIONS],
                meta={"rule": "articles: stored columns, in order"},
            ),  # schema (dtypes: polars side)
            gxe.ExpectColumnValuesToBeUnique(
                column="url", meta={"rule": "articles: one row per normalised url"}
            ),  # key
            gxe.ExpectColumnValuesToBeUnique(column="url_md5", meta={"rule": "articles: url_md5 unique"}),
        ]

    kept, dropped = pl.col("kept"), ~pl.col("kept")  # null kept: neither (the not_null rule reports it)
    rules = [
        not_null("url", "articles: url present"),  # key
        not_null("url_md5", "articles: url_md5 present"),  # id in the ledger / HTML store
        matches("url_md5", URL_MD5_REGEX, "articles: url_md5 is 32 lowercase hex digits"),
        not_null("kept", "articles: every row is kept or dropped"),
        only_where(kept, not_null("text", "kept: text present")),
        only_where(kept, matches("text", NON_BLANK_REGEX, "kept: text non-empty")),
        only_where(kept, not_null("abstract", "kept: abstract present")),
        only_where(kept, matches("abstract", NON_BLANK_REGEX, "kept: abstract non-empty")),
        only_where(kept, not_null("lang", "kept: lang present")),
        only_where(kept, in_set("lang", ["en"], "kept: lang is 'en'")),
        only_where(kept, is_null("failing_filter", "kept: no failing_filter")),
        only_where(dropped, not_null("failing_filter", "dropped: failing_filter named")),
        not_null("profile", "articles: profile present"),
        in_set("profile", list(ARTICLE_PROFILES), "articles: profile is mirai or obelics"),
        not_null("n_words", "articles: n_words present"),
        at_least("n_words", 0, "articles: n_words >= 0"),
    ]
    return _run("articles", articles, expectations, rules, schema_failures, counts)
