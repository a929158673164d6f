"""Great Expectations suites (quality/suites.py) as Dagster asset checks on the event tables.

Each check reads its partition's parquet from disk through DataLayout (the assets write files
themselves, there is no IO manager to load from), runs the suite and reports the statistics and
the failed expectations. GX is imported inside the suites, never when this module loads.

Before its suite, each check of a sealed file (events, daily quads, articles) compares the file
with the sha256 recorded when it was written (pipeline/storage.py): a changed file fails with
ERROR, since a suite would read damage that still decodes as data.

- ``gdelt_events_valid``: non-blocking; a bad raw day is reported, the events rules still run
  (they drop duplicates and misaligned rows on their own).
- ``events_valid``: blocking; a failure stops ``daily_quads`` (and anything else downstream) in
  the same run, so bad events never reach the benchmark.
- ``daily_quads_valid``: blocking, for the monthly/benchmark assets that will sit downstream.
- ``articles_valid``: non-blocking; reports the day's articles file with its counts (rows, kept,
  dropped per failing filter). The fetch counts (selected, fetched, failed) are in the articles
  asset's own metadata: the file holds only the stored pages.
- ``articles_fetch_health``: non-blocking WARN; the day's fetches from the fetch ledger, failing
  when most of them failed (pipeline/articles/fetch_health.py), naming the dominant failure. A
  day whose every fetch failed has an empty, valid articles file: ``articles_valid`` passes it.
  ``alert_on_articles_fetch_failing`` (sensors/fetch_health.py) posts its failures.
"""

import json
from datetime import date
from pathlib import Path

import dagster as dg
import polars as pl

from assets.ingest import gdelt_events
from assets.metadata import frame_table
from assets.partitions import daily_partitions
from assets.resources import ArticleFetcher, Dataset
from pipeline.articles.fetch_health import day_fetch_health
from pipeline.storage import DataLayout, seal_problem
from quality.suites import (
    SuiteResult,
    read_raw_events_day,
    validate_articles,
    validate_daily_quads,
    validate_events,
    validate_raw_events,
)


def _result(res: SuiteResult, source: Path) -> dg.AssetCheckResult:
    metadata: dict[str, dg.RawMetadataValue] = {
        "suite": res.suite,
        "source": dg.MetadataValue.path(str(source)),
        **{k: v for k, v in res.statistics.items() if v is not None},
        "failed_expectations": len(res.failures),
    }
    if res.failures:
        metadata["failures"] = frame_table(res.failures_frame())
        metadata["failures_json"] = dg.MetadataValue.json(json.loads(json.dumps(res.failures, default=str)))
    if res.note:
        metadata["note"] = res.note
    description = res.note or (
        f"{res.suite}: all expectations met"
        if res.passed
        else f"{res.suite}: failed " + ", ".join(sorted(res.failed_expectations))
    )
    return dg.AssetCheckResult(
        passed=res.passed, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata, description=description
    )


def _missing(path: Path, what: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"source": dg.MetadataValue.path(str(path))},
        description=f"{what} file is missing: the asset was not materialised for this partition",
    )


def _validate_file(layout: DataLayout, path: Path, what: str, validate) -> dg.AssetCheckResult:
    """Run a suite on one partition's parquet file; fail when the asset wrote none, or when the
    file's bytes are not those it was written with (the suite would read damage as data)."""
    if not path.exists():
        return _missing(path, what)
    damage = seal_problem(layout, path)
    if damage:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"source": dg.MetadataValue.path(str(path)), "damage": damage},
            description=f"{what} file changed after it was written ({damage}); materialise the partition "
            "again to rebuild it (nothing downstream reads it until then)",
        )
    return _result(validate(pl.read_parquet(path)), path)


@dg.asset_check(asset=gdelt_events, partitions_def=daily_partitions, blocking=False)
def gdelt_events_valid(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """The day's parsed export rows: 61 typed columns in order, GLOBALEVENTID non-null and unique
    over the day, DATEADDED inside the 15-minute slot of its file. A day without landed slots
    passes with a note."""
    day = date.fromisoformat(context.partition_key)
    directory = DataLayout(Path(dataset.data_dir)).parsed_dir("export", day)
    return _result(validate_raw_events(read_raw_events_day(directory)), directory)


@dg.asset_check(asset=dg.AssetKey("events"), partitions_def=daily_partitions, blocking=True)
def events_valid(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """The day's events obey MIRAI's rules: event_id unique, s/o ISO alpha-3 and different,
    r a level-2 CAMEO code with r1 its root, date the UTC day of date_added. Blocking."""
    layout = DataLayout(Path(dataset.data_dir))
    return _validate_file(
        layout, layout.events_path(date.fromisoformat(context.partition_key)), "events", validate_events
    )


@dg.asset_check(asset=dg.AssetKey("daily_quads"), partitions_def=daily_partitions, blocking=True)
def daily_quads_valid(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """One row per (date, s, r, o), each with daily_mentions >= 1 and n_events >= 1. Blocking."""
    layout = DataLayout(Path(dataset.data_dir))
    return _validate_file(
        layout, layout.daily_quads_path(date.fromisoformat(context.partition_key)), "daily_quads", validate_daily_quads
    )


@dg.asset_check(asset=dg.AssetKey("events"), partitions_def=daily_partitions, blocking=False)
def events_history_current(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """Rules 1 and 6 read every earlier day. If an earlier day was ingested (or gained slots)
    after this day was normalised, this day's events may keep a URL or event id that now belongs
    to an earlier day: warn, so the day is re-materialised."""
    from pipeline.events.daily import history_fingerprint
    from pipeline.storage import read_parquet_metadata

    day = date.fromisoformat(context.partition_key)
    layout = DataLayout(Path(dataset.data_dir))
    path = layout.events_path(day)
    if not path.exists():
        return _missing(path, "events")
    built = read_parquet_metadata(path).get("history_fingerprint")
    now = history_fingerprint(layout, day)
    return dg.AssetCheckResult(
        passed=built == now,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"built_against": built or "", "history_now": now},
        description=None if built == now else "earlier days changed since this day was normalised: re-materialise it",
    )


@dg.asset_check(asset=dg.AssetKey("articles"), partitions_def=daily_partitions, blocking=False)
def articles_valid(context: dg.AssetCheckExecutionContext, dataset: Dataset) -> dg.AssetCheckResult:
    """The day's articles: url and url_md5 unique (url_md5 32 hex digits); kept rows carry text,
    an abstract, lang "en" and no failing filter; dropped rows name their failing filter; profile
    mirai/obelics; n_words >= 0. Metadata: rows, kept, dropped and `dropped_<filter>` from the file.
    Non-blocking: a bad article row is reported, nothing downstream is held back."""
    layout = DataLayout(Path(dataset.data_dir))
    return _validate_file(
        layout, layout.articles_path(date.fromisoformat(context.partition_key)), "articles", validate_articles
    )


@dg.asset_check(asset=dg.AssetKey("articles"), partitions_def=daily_partitions, blocking=False)
def articles_fetch_health(
    context: dg.AssetCheckExecutionContext, dataset: Dataset, fetcher: ArticleFetcher
) -> dg.AssetCheckResult:
    """The day's article fetches in the fetch ledger: warns when at least MIN_FETCHES were
    attempted and more than MAX_FAILURE_RATE of them failed (pipeline/articles/fetch_health.py),
    naming the dominant failure (dns_error, http_404, timeout, ...). Metadata: selected, attempted,
    failed, failure_rate and the failures by reason. Non-blocking: the articles that were fetched
    are kept, and later runs retry the rest on the ledger's schedule."""
    health = day_fetch_health(date.fromisoformat(context.partition_key), dataset.settings(), fetcher.settings())
    return dg.AssetCheckResult(
        passed=health.healthy,
        severity=dg.AssetCheckSeverity.WARN,
        description=health.describe(),
        metadata={
            "selected": health.selected,
            "attempted": health.attempted,
            "failed": health.failed,
            "failure_rate": round(health.failure_rate, 4),
            "dominant_reason": health.dominant_reason or "",
            "dominant_count": health.dominant_count,
            "failures_by_reason": frame_table(health.failures_frame()),
            "min_fetches": health.min_fetches,
            "max_failure_rate": health.max_failure_rate,
        },
    )
