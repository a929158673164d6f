"""The slot ledger: one row per 15-minute slot and file kind of a day, saying what happened to it.

Statuses (a file is "green" when landed or late):
- ``landed``   verified against the index and stored in the raw store
- ``late``     landed, but more than ``late_after_hours`` after its slot, having been unavailable
               to an earlier run (unlisted, 404, failed or corrupt): GDELT published it late
- ``pending``  not listed / not downloadable yet, still inside the grace period; retried
- ``missing``  still not listed / 404 after the grace period (a GDELT gap); still retried by runs
- ``corrupt``  the last attempt's bytes failed size or md5 verification, or ``parse_day`` found the
               landed zip damaged on disk (no longer its md5); kept in quarantine, retried
- ``failed``   the last attempt hit network or HTTP errors after all retries
- ``quarantined`` GDELT's index vouches for the bytes (size and md5 match) but they are not a
               usable file: the zip does not open or inflates past the cap, or the CSV is not the
               GDELT format of its kind (e.g. 60 columns). The file is kept in quarantine with a
               note; the slot is neither fetched nor parsed again until the index lists another
               size or md5 for it. ``last_error`` says why
- ``not_due``  the slot lies in the future
"""

from __future__ import annotations

from datetime import date

import polars as pl

from pipeline.columns import Columns
from pipeline.markdown import markdown_text
from pipeline.storage import DataLayout, atomic_write_parquet

LEDGER_VERSION = "1"
STATUSES = ("landed", "late", "pending", "missing", "corrupt", "failed", "quarantined", "not_due")
GREEN = ("landed", "late")
TS = pl.Datetime("us", "UTC")

LEDGER_COLUMNS = Columns(
    {
        "day": (pl.Date, "The UTC day the slot belongs to"),
        "slot": (TS, "Start of the 15-minute slot (UTC)"),
        "kind": (pl.String, "GDELT file kind: export or mentions"),
        "status": (pl.String, "landed, late, pending, missing, corrupt, failed, quarantined or not_due"),
        "listed": (pl.Boolean, "Whether GDELT's file index (masterfilelist.txt, lastupdate.txt) lists the file"),
        "expected_size": (pl.Int64, "Size in bytes GDELT's file index gives"),
        "expected_md5": (pl.String, "md5 GDELT's file index gives"),
        "size": (pl.Int64, "Size in bytes of the stored zip"),
        "path": (pl.String, "The stored file, relative to MIRAI_DATA_DIR"),
        "attempts": (pl.Int32, "HTTP attempts over all runs"),
        "http_status": (pl.Int16, "HTTP status of the last attempt"),
        "last_error": (pl.String, "Why the last attempt failed (or the file is quarantined)"),
        "quarantined": (pl.Int32, "Bad copies kept under quarantine/"),
        "first_checked_at": (TS, "When a run first looked at the slot"),
        "unavailable_since": (TS, "First run that could not get the file"),
        "landed_at": (TS, "When the file landed"),
        "updated_at": (TS, "When a run last updated the row"),
    }
)
LEDGER_SCHEMA = LEDGER_COLUMNS.schema


def read_ledger(layout: DataLayout, day: date) -> pl.DataFrame:
    path = layout.slot_ledger_path(day)
    if not path.exists():
        return LEDGER_SCHEMA.to_frame()
    return pl.read_parquet(path).match_to_schema(LEDGER_SCHEMA)


def write_ledger(layout: DataLayout, day: date, ledger: pl.DataFrame) -> None:
    atomic_write_parquet(
        ledger.match_to_schema(LEDGER_SCHEMA).sort("slot", "kind"),
        layout.slot_ledger_path(day),
        metadata={"ledger_version": LEDGER_VERSION},
    )


def summarize(ledger: pl.DataFrame) -> dict[str, int]:
    """Count of files per status (every status present, zeros included)."""
    counts = dict(ledger.group_by("status").len().iter_rows())
    return {status: int(counts.get(status, 0)) for status in STATUSES}


def problems(ledger: pl.DataFrame) -> pl.DataFrame:
    """Rows a maintainer should look at: everything not green and not simply in the future."""
    return ledger.filter(~pl.col("status").is_in([*GREEN, "not_due"]) | (pl.col("status") == "late")).select(
        "slot", "kind", "status", "attempts", "http_status", "last_error"
    )


def _cell(value: object) -> str:
    return str(value) if isinstance(value, int | float) else markdown_text(str(value))


def to_markdown(df: pl.DataFrame, limit: int = 50) -> str:
    """A small Markdown table for Dagster metadata and the CLI; text cells are inert Markdown
    (codes and reasons can come from a hostile GDELT file)."""
    if df.height == 0:
        return "_none_"
    cols = df.columns
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = "".join(
        "| " + " | ".join("" if v is None else _cell(v) for v in row) + " |\n" for row in df.head(limit).iter_rows()
    )
    more = f"\n… and {df.height - limit} more rows\n" if df.height > limit else ""
    return head + body + more
