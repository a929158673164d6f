"""Column-schema-change checks: each parquet asset's latest materialisation against the one before
it (``dagster/column_schema``, assets/metadata.py), warning on an added or removed column or a changed
type, which a reader of the files would meet. `evaluation` has none: its columns differ by agent kind
(ReAct runs add the episode columns), so successive partitions would differ by design."""

import dagster as dg

from assets.articles import articles, fetch_ledger
from assets.database import event_database
from assets.evaluations import leaderboard
from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.live import live_round
from assets.live_history import live_history
from assets.live_resolution import live_resolution
from assets.splits import test_split

# The assets whose every materialisation carries its columns.
SCHEMA_DECLARING = [
    gdelt_files,
    gdelt_events,
    gdelt_mentions,
    events,  # and unmapped_codes, the multi-asset's other table
    daily_quads,
    articles,
    fetch_ledger.key,
    event_database,
    test_split,
    leaderboard,
    live_round,
    live_history,
    live_resolution,
]
# One checks definition per asset (Dagster builds one for all the assets it is given), so a run or a
# test can take an asset's check with it.
column_schema_checks = [
    checks for asset in SCHEMA_DECLARING for checks in dg.build_column_schema_change_checks(assets=[asset])
]
