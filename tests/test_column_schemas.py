"""Every parquet asset declares its columns (``dagster/column_schema``) from the declaration its
code writes with (pipeline.columns.Columns), each column described; its materialisations carry the
columns of what was written, and the column-schema-change checks cover it."""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
import polars as pl
import pytest

from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.metadata import COLUMN_SCHEMA, table_schema
from pipeline.articles.day import ARTICLES_COLUMNS
from pipeline.articles.ledger import FETCH_LEDGER_COLUMNS
from pipeline.columns import Columns
from pipeline.evaluation.board import BOARD_COLUMNS
from pipeline.events.normalize import EVENTS_COLUMNS, UNMAPPED_CODES_COLUMNS
from pipeline.events.quads import QUADS_COLUMNS
from pipeline.gdelt.ledger import LEDGER_COLUMNS
from pipeline.gdelt.schema import EXPORT_COLUMNS, MENTIONS_COLUMNS
from pipeline.live.resolve import ANSWERS_COLUMNS
from pipeline.live.rounds import QUESTIONS_COLUMNS
from pipeline.release.tables import EVENT_DB_COLUMNS, NEWS_DB_COLUMNS, QUERIES_COLUMNS
from quality.schema_checks import column_schema_checks

from .conftest import MIRROR_DAY
from .dagster_day import materialised_day

# The columns each asset's files are written with (pipeline/), by asset key.
WRITTEN_WITH: dict[str, Columns] = {
    "gdelt_files": LEDGER_COLUMNS,
    "gdelt_events": EXPORT_COLUMNS,
    "gdelt_mentions": MENTIONS_COLUMNS,
    "events": EVENTS_COLUMNS,
    "unmapped_codes": UNMAPPED_CODES_COLUMNS,
    "daily_quads": QUADS_COLUMNS,
    "articles": ARTICLES_COLUMNS,
    "fetch_ledger": FETCH_LEDGER_COLUMNS,
    "event_database": EVENT_DB_COLUMNS,
    "test_split": QUERIES_COLUMNS,
    "leaderboard": BOARD_COLUMNS,
    "live_round": QUESTIONS_COLUMNS,
    "live_history": EVENT_DB_COLUMNS,
    "live_resolution": ANSWERS_COLUMNS,
}
# Its columns depend on the agent's kind: given at materialisation only, from the file written.
SCHEMA_AT_MATERIALISATION = {"evaluation"}


def columns_of(metadata: Mapping[str, object]) -> dg.TableSchema | None:
    """The ``dagster/column_schema`` of definition or materialisation metadata, if it has one."""
    value = metadata.get(COLUMN_SCHEMA)
    return value.schema if isinstance(value, dg.TableSchemaMetadataValue) else value


def _specs() -> dict[str, dg.AssetSpec]:
    from definitions import defs

    return {spec.key.to_user_string(): spec for spec in defs.resolve_all_asset_specs()}


def test_every_parquet_asset_declares_the_schema_it_is_written_with():
    specs = _specs()
    parquet = {key for key, spec in specs.items() if "parquet" in spec.kinds}
    # A new parquet asset names its schema here (or says why it cannot).
    assert parquet - SCHEMA_AT_MATERIALISATION <= set(WRITTEN_WITH)
    for key, columns in WRITTEN_WITH.items():
        assert columns_of(specs[key].metadata) == table_schema(columns.schema, columns.descriptions), key
    assert COLUMN_SCHEMA not in specs["evaluation"].metadata
    for key in ("event_database", "live_history"):
        news = specs[key].metadata["news columns"]
        assert news == dg.MetadataValue.table_schema(
            table_schema(NEWS_DB_COLUMNS.schema, NEWS_DB_COLUMNS.descriptions)
        ), key


def test_every_column_the_ui_lists_has_a_description():
    """The Columns tab of every asset (and its other column lists, the news table's) says what
    each column holds: a column added to a declaration without a description fails here."""
    described = {}
    for key, spec in _specs().items():
        for label, value in spec.metadata.items():
            schema = value.schema if isinstance(value, dg.TableSchemaMetadataValue) else value
            if isinstance(schema, dg.TableSchema):
                described[f"{key} {label}"] = [c.name for c in schema.columns if not (c.description or "").strip()]
    assert {f"{key} {COLUMN_SCHEMA}" for key in WRITTEN_WITH} <= set(described)
    assert {where: blank for where, blank in described.items() if blank} == {}


def test_a_column_cannot_be_declared_without_a_description():
    with pytest.raises(ValueError, match="'rows'"):
        Columns({"code": (pl.String, "An actor code"), "rows": (pl.Int64, " ")})
    columns = Columns({"code": (pl.String, "An actor code"), "rows": (pl.Int64, "Rows naming it")})
    assert columns.schema == pl.Schema({"code": pl.String, "rows": pl.Int64})
    assert columns.descriptions == {"code": "An actor code", "rows": "Rows naming it"}


def test_the_schema_change_checks_cover_every_declared_schema():
    from definitions import defs

    covered = {spec.asset_key.to_user_string() for checks in column_schema_checks for spec in checks.check_specs}
    assert covered == set(WRITTEN_WITH)
    assert all(checks in defs.asset_checks for checks in column_schema_checks)


def test_a_materialised_day_writes_the_declared_columns(tmp_path, mirror):
    """The files the day's assets write have the declared columns, in order and type, and each
    materialisation says so; a second materialisation passes the schema-change checks."""
    day_assets = [gdelt_files, gdelt_events, gdelt_mentions, events, daily_quads]
    with materialised_day(tmp_path, mirror, day_assets) as (layout, resources, instance, result):
        written = {
            "gdelt_files": layout.slot_ledger_path(MIRROR_DAY),
            "gdelt_events": next(layout.parsed_dir("export", MIRROR_DAY).glob("*.parquet")),
            "gdelt_mentions": next(layout.parsed_dir("mentions", MIRROR_DAY).glob("*.parquet")),
            "events": layout.events_path(MIRROR_DAY),
            "unmapped_codes": layout.unmapped_codes_path(MIRROR_DAY),
            "daily_quads": layout.daily_quads_path(MIRROR_DAY),
        }
        specs = _specs()
        materialisations = {m.asset_key.to_user_string(): m for m in result.get_asset_materialization_events()}
        for key, path in written.items():
            declared = columns_of(specs[key].metadata)
            assert table_schema(pl.read_parquet_schema(path), WRITTEN_WITH[key].descriptions) == declared, key
            recorded = materialisations[key].materialization.metadata
            assert columns_of(recorded) == declared, key
        day_keys = {key for asset in day_assets for key in asset.keys}
        day_checks = [c for c in column_schema_checks if {spec.asset_key for spec in c.check_specs} <= day_keys]
        again = dg.materialize(
            [*day_assets, *day_checks], partition_key=MIRROR_DAY.isoformat(), resources=resources, instance=instance
        )
        checks = again.get_asset_check_evaluations()
        assert {c.asset_key.to_user_string() for c in checks} == set(written)
        assert [(c.asset_key.to_user_string(), c.description) for c in checks if not c.passed] == []
