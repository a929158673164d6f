"""The data-quality suites (quality/suites.py) and their Dagster asset checks (quality/event_checks.py).

Each suite passes on good data (hand-built frames, a real GDELT export, the pipeline's own output)
and fails on each kind of bad data with the failing expectation named. The Dagster tests run the
real assets on a data dir written here (or on the generated mirror) and show that a failed
``events_valid`` blocks ``daily_quads`` in the same run while ``gdelt_events_valid`` does not.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.resources import resources_for
from pipeline.events.normalize import EVENTS_SCHEMA, normalize_events
from pipeline.events.quads import QUADS_SCHEMA, daily_quads
from pipeline.gdelt.schema import EXPORT_SCHEMA
from pipeline.reference.tables import iso3_codes, level2_codes
from pipeline.storage import DataLayout, atomic_write_parquet, write_sealed_parquet
from quality.suites import (
    SCHEMA_CHECK,
    read_raw_events_day,
    validate_daily_quads,
    validate_events,
    validate_raw_events,
)

from .conftest import MIRROR_DAY, shared_fixture
from .gx_helpers import assert_fails_only, failure, set_row
from .settings_builder import make_settings
from .table_metadata import table_text

UTC = UTC
DAY = MIRROR_DAY  # inside the daily partitions (they start at MIRAI_START_DATE, 2023-01-01)
SLOT = datetime(DAY.year, DAY.month, DAY.day, 10, 15, tzinfo=UTC)
REAL_EXPORT = "gdelt/narayave-Insight-GDELT-Feed/b412634/20190121220000.export.CSV"
REAL_SLOT = datetime(2019, 1, 21, 22, 0, tzinfo=UTC)

UNIQUE = "expect_column_values_to_be_unique"
NOT_NULL = "expect_column_values_to_not_be_null"
BETWEEN = "expect_column_values_to_be_between"
IN_SET = "expect_column_values_to_be_in_set"
PAIR_EQUAL = "expect_column_pair_values_to_be_equal"
WITHIN_RECORD = "expect_select_column_values_to_be_unique_within_record"
COMPOUND_UNIQUE = "expect_compound_columns_to_be_unique"
COLUMN_LIST = "expect_table_columns_to_match_ordered_list"


# --- builders -------------------------------------------------------------------------------


def raw_rows(slot: datetime, ids: list[int], pairs: list[tuple[str, str, str]] | None = None) -> pl.DataFrame:
    """Parsed export rows of one slot (EXPORT_SCHEMA), international and MIRAI-valid by default:
    (Actor1CountryCode, Actor2CountryCode, EventBaseCode) cycle through ``pairs``."""
    pairs = pairs or [("USA", "CHN", "042"), ("FRA", "DEU", "036"), ("RUS", "UKR", "190")]
    n = len(ids)
    cyc = [pairs[i % len(pairs)] for i in range(n)]
    data: dict[str, list] = {c: [None] * n for c in EXPORT_SCHEMA.names()}
    data.update(
        GLOBALEVENTID=ids,
        SQLDATE=[slot.date()] * n,
        MonthYear=[slot.year * 100 + slot.month] * n,
        Year=[slot.year] * n,
        Actor1CountryCode=[p[0] for p in cyc],
        Actor2CountryCode=[p[1] for p in cyc],
        IsRootEvent=[1] * n,
        EventCode=[p[2] for p in cyc],
        EventBaseCode=[p[2] for p in cyc],
        EventRootCode=[p[2][:2] for p in cyc],
        QuadClass=[1] * n,
        GoldsteinScale=[1.0] * n,
        NumMentions=[2 + i % 3 for i in range(n)],
        NumSources=[1] * n,
        NumArticles=[2] * n,
        AvgTone=[-1.5] * n,
        DATEADDED=[slot] * n,
        SOURCEURL=[f"https://news.example/{slot:%H%M}/{i}" for i in ids],
    )
    return pl.DataFrame(data, schema=EXPORT_SCHEMA)


def raw_day(n_slots: int = 3, per_slot: int = 6) -> dict[datetime, pl.DataFrame]:
    return {
        SLOT + timedelta(minutes=15 * k): raw_rows(
            SLOT + timedelta(minutes=15 * k), list(range(1000 * k, 1000 * k + per_slot))
        )
        for k in range(n_slots)
    }


def good_events() -> pl.DataFrame:
    """Hand-built rows of EVENTS_SCHEMA obeying every rule."""
    rows = [
        (1, "USA", "042", "CHN", "USA", "CHN", 4, SLOT),
        (2, "FRA", "036", "DEU", "FRA", "DEU", 3, SLOT),
        (3, "USA", "042", "CHN", "USA", "CHN", 7, SLOT + timedelta(minutes=15)),
        (4, "RUS", "190", "UKR", "RUS", "UKR", 9, SLOT + timedelta(hours=13, minutes=30)),
    ]
    return pl.DataFrame(
        {
            "event_id": [r[0] for r in rows],
            "date": [DAY] * len(rows),
            "s": [r[1] for r in rows],
            "r": [r[2] for r in rows],
            "o": [r[3] for r in rows],
            "r1": [r[2][:2] for r in rows],
            "s_cameo": [r[4] for r in rows],
            "o_cameo": [r[5] for r in rows],
            "event_code": [r[2] for r in rows],
            "quad_class": [1] * len(rows),
            "goldstein": [1.0] * len(rows),
            "num_mentions": [r[6] for r in rows],
            "num_sources": [1] * len(rows),
            "num_articles": [1] * len(rows),
            "avg_tone": [0.5] * len(rows),
            "date_added": [r[7] for r in rows],
            "url": [f"https://news.example/{r[0]}" for r in rows],
        },
        schema=EVENTS_SCHEMA,
    )


def test_reference_sets_hold_the_codes_the_builders_use():
    assert {"USA", "CHN", "FRA", "DEU", "RUS", "UKR"} <= iso3_codes()
    assert {"042", "036", "190"} <= level2_codes()


# --- raw_events -------------------------------------------------------------------------------


def test_raw_events_pass_on_a_hand_built_day():
    res = validate_raw_events(raw_day())
    assert res.passed, res.failures
    assert res.statistics["rows"] == 18 and res.statistics["files"] == 3
    assert res.statistics["unsuccessful_expectations"] == 0 and res.statistics["schema_problems"] == 0


def test_raw_events_pass_on_a_real_gdelt_file():
    from pipeline.gdelt.parse import parse_export

    path = shared_fixture(REAL_EXPORT)
    rows = parse_export(path.read_bytes(), source=path.name).rows
    res = validate_raw_events({REAL_SLOT: rows})
    assert res.passed, res.failures
    assert res.statistics["rows"] == rows.height > 1000


def test_raw_duplicate_globaleventid_across_slots_fails():
    day = raw_day()
    first, second = list(day)[:2]
    day[second] = set_row(day[second], 0, GLOBALEVENTID=int(day[first]["GLOBALEVENTID"][0]))
    f = assert_fails_only(validate_raw_events(day), UNIQUE, "GLOBALEVENTID")
    assert f["unexpected_count"] == 2 and f["unexpected_values"] == [0, 0]


def test_raw_null_globaleventid_fails():
    day = raw_day()
    slot = next(iter(day))
    day[slot] = set_row(day[slot], 0, GLOBALEVENTID=None)
    assert_fails_only(validate_raw_events(day), NOT_NULL, "GLOBALEVENTID")


@pytest.mark.parametrize("offset", [timedelta(minutes=15), timedelta(seconds=-1), timedelta(days=1)])
def test_raw_dateadded_outside_its_slot_fails(offset):
    day = raw_day()
    slot = list(day)[1]
    day[slot] = set_row(day[slot], 0, DATEADDED=slot + offset)
    f = assert_fails_only(validate_raw_events(day), BETWEEN, "_dateadded_offset_s")
    assert f["unexpected_count"] == 1 and f["unexpected_values"] == [int(offset.total_seconds())]


def test_raw_dateadded_at_the_last_second_of_its_slot_passes():
    day = raw_day()
    slot = next(iter(day))
    day[slot] = set_row(day[slot], 0, DATEADDED=slot + timedelta(minutes=14, seconds=59))
    assert validate_raw_events(day).passed


def test_raw_wrong_dtype_fails_on_the_polars_side():
    day = raw_day()
    slot = list(day)[2]
    day[slot] = day[slot].with_columns(pl.col("NumMentions").cast(pl.Int64))
    f = assert_fails_only(validate_raw_events(day), SCHEMA_CHECK)
    assert f["unexpected_values"] == ["NumMentions: Int64 != Int32"]
    assert f"{slot:%Y%m%d%H%M%S}" in f["rule"]


def test_raw_missing_column_fails_in_polars_and_in_gx():
    day = {slot: df.drop("SOURCEURL") for slot, df in raw_day().items()}
    res = validate_raw_events(day)
    assert not res.passed
    assert "missing=['SOURCEURL']" in failure(res, SCHEMA_CHECK)["unexpected_values"][0]
    failure(res, COLUMN_LIST)


def test_raw_empty_day_passes_with_a_note():
    res = validate_raw_events({})
    assert res.passed and res.note and res.statistics["rows"] == 0
    empty_slot = {SLOT: EXPORT_SCHEMA.to_frame()}
    assert validate_raw_events(empty_slot).passed


def test_raw_day_is_read_back_with_slots_from_the_file_names(tmp_path):
    layout = DataLayout(tmp_path)
    for slot, df in raw_day().items():
        atomic_write_parquet(df, layout.parsed_path("export", slot))
    read = read_raw_events_day(layout.parsed_dir("export", DAY))
    assert list(read) == list(raw_day())
    assert validate_raw_events(read).passed
    assert read_raw_events_day(tmp_path / "absent") == {}


# --- events -----------------------------------------------------------------------------------


def test_events_pass_on_hand_built_rows():
    res = validate_events(good_events())
    assert res.passed, res.failures
    assert res.statistics["rules"] == 13 and res.statistics["rows"] == 4


def test_events_pass_on_the_normaliser_output_of_a_real_gdelt_file():
    from pipeline.gdelt.parse import parse_export

    path = shared_fixture(REAL_EXPORT)
    events = normalize_events(parse_export(path.read_bytes(), source=path.name).rows)
    assert events.height > 100
    res = validate_events(events)
    assert res.passed, res.failures


@pytest.mark.parametrize(
    ("change", "expectation", "column"),
    [
        ({"event_id": 2}, UNIQUE, "event_id"),  # rule 1: duplicate event_id
        ({"event_id": None}, NOT_NULL, "event_id"),
        ({"date": date(2023, 12, 31)}, PAIR_EQUAL, "date, _date_added_day"),  # rule 2: misaligned
        ({"s": "EUR"}, IN_SET, "s"),  # rule 3: a region, not an ISO country
        ({"o": "US"}, IN_SET, "o"),  # rule 3: alpha-2 is not alpha-3
        ({"s": None}, NOT_NULL, "s"),
        ({"o": "USA"}, WITHIN_RECORD, "s, o"),  # rule 4: domestic (s == o)
        ({"r": "999", "r1": "99"}, IN_SET, "r"),  # rule 5: not a level-2 code
        ({"r": "04", "r1": "04"}, IN_SET, "r"),  # rule 5: a level-1 root is not level 2
        ({"r1": "05"}, PAIR_EQUAL, "r1, _r_prefix"),  # rule 5: r1 not the root of r
    ],
)
def test_events_fail_on_bad_rows(change, expectation, column):
    f = assert_fails_only(validate_events(set_row(good_events(), 0, **change)), expectation, column)
    assert f["unexpected_count"] == (2 if expectation == UNIQUE else 1)
    assert f["rule"]  # every expectation names the rule it guards


def test_a_row_breaking_two_rules_names_each_rule_with_its_count_and_examples():
    # The row rules reach GX as one expectation over a polars-computed column; each broken rule
    # is still reported on its own, with the rule's name, its column, exact count and examples.
    bad = set_row(set_row(good_events(), 0, s="EUR", r="999", r1="99"), 2, r="998", r1="99")
    res = validate_events(bad)
    assert not res.passed and len(res.failures) == 2, res.failures
    s_rule, r_rule = failure(res, IN_SET, "s"), failure(res, IN_SET, "r")
    assert (s_rule["rule"], s_rule["unexpected_count"], s_rule["unexpected_values"]) == (
        "3: s is an ISO 3166-1 alpha-3 country",
        1,
        ["EUR"],
    )
    assert (r_rule["rule"], r_rule["unexpected_count"], r_rule["unexpected_values"]) == (
        "5: r is a MIRAI level-2 CAMEO code",
        2,
        ["999", "998"],
    )
    assert s_rule["validated_by"] == "expect_column_values_to_be_null on _row_rule_violations"
    assert res.statistics["unsuccessful_expectations"] == 1  # the one combined GX expectation
    # The check's table: a row per broken rule.
    table = res.failures_frame().select("column", "rule", "unexpected", "examples").rows()
    assert sorted(table) == [
        ("r", "5: r is a MIRAI level-2 CAMEO code", 2, '["999", "998"]'),
        ("s", "3: s is an ISO 3166-1 alpha-3 country", 1, '["EUR"]'),
    ]


def test_suites_built_once_per_process_keep_no_state_between_days():
    bad = set_row(good_events(), 0, o="USA")
    first = validate_events(bad)
    assert validate_events(good_events()).passed
    again = validate_events(bad)
    assert first.failures == again.failures and failure(again, WITHIN_RECORD)["unexpected_count"] == 1


def test_a_row_rule_on_a_missing_column_fails_with_its_error():
    res = validate_events(good_events().drop("o"))
    assert not res.passed
    assert "missing=['o']" in failure(res, SCHEMA_CHECK)["unexpected_values"][0]
    failure(res, COLUMN_LIST)
    assert "ColumnNotFoundError" in failure(res, NOT_NULL, "o")["exception"]
    assert "ColumnNotFoundError" in failure(res, WITHIN_RECORD, "s, o")["exception"]


def test_events_date_added_in_the_evening_of_the_previous_day_is_misaligned():
    # 23:59 UTC of Dec 31 belongs to Dec 31, whatever the local time elsewhere.
    bad = set_row(good_events(), 0, date_added=datetime(2023, 12, 31, 23, 59, tzinfo=UTC))
    f = assert_fails_only(validate_events(bad), PAIR_EQUAL, "date, _date_added_day")
    ((stored, derived),) = f["unexpected_values"]  # GX reports the (date, day of date_added) pair
    assert stored.startswith("2024-01-01") and derived.startswith("2023-12-31")


def test_events_wrong_dtype_fails_on_the_polars_side():
    res = validate_events(good_events().with_columns(pl.col("date_added").dt.replace_time_zone(None)))
    f = failure(res, SCHEMA_CHECK)
    assert (
        "date_added: Datetime(time_unit='us', time_zone=None) != Datetime(time_unit='us', time_zone='UTC')"
        in f["unexpected_values"]
    )
    assert not res.passed


def test_events_empty_day_passes_with_a_note():
    res = validate_events(EVENTS_SCHEMA.to_frame())
    assert res.passed and res.note == "no events on this day"


# --- daily_quads ------------------------------------------------------------------------------


def test_daily_quads_pass_on_the_pipeline_aggregate():
    quads = daily_quads(good_events())
    assert quads.height == 3  # USA-042-CHN twice in one quad
    res = validate_daily_quads(quads)
    assert res.passed, res.failures
    assert res.statistics["total_mentions"] == 4 + 3 + 7 + 9


def test_duplicate_quad_key_fails():
    quads = daily_quads(good_events())
    bad = pl.concat([quads, quads.head(1)])
    f = assert_fails_only(validate_daily_quads(bad), COMPOUND_UNIQUE, "date, s, r, o")
    assert f["unexpected_count"] == 2


def test_daily_mentions_zero_fails():
    bad = set_row(daily_quads(good_events()), 0, daily_mentions=0)
    f = assert_fails_only(validate_daily_quads(bad), BETWEEN, "daily_mentions")
    assert f["unexpected_values"] == [0]


def test_n_events_zero_fails():
    assert_fails_only(validate_daily_quads(set_row(daily_quads(good_events()), 0, n_events=0)), BETWEEN, "n_events")


def test_daily_quads_empty_day_passes_with_a_note():
    res = validate_daily_quads(QUADS_SCHEMA.to_frame())
    assert res.passed and res.note


def test_failures_make_the_check_s_table():
    res = validate_daily_quads(set_row(daily_quads(good_events()), 0, daily_mentions=0))
    frame = res.failures_frame()
    assert frame.columns == ["expectation", "column", "rule", "unexpected", "examples"]
    assert frame.get_column("column").to_list() == ["daily_mentions"]
    assert "quads: daily_mentions >= 1" in frame.item(0, "rule")


# --- Dagster: the checks on real runs ---------------------------------------------------------


def _write_parsed_day(data_dir: Path, day: dict[datetime, pl.DataFrame]) -> None:
    layout = DataLayout(data_dir)
    for slot, df in day.items():
        atomic_write_parquet(df, layout.parsed_path("export", slot))


def _run(data_dir: Path, instance, *, include_quads_check: bool = True):
    from assets.events import daily_quads as daily_quads_asset
    from assets.events import events
    from assets.ingest import gdelt_events
    from quality.event_checks import daily_quads_valid, events_valid, gdelt_events_valid

    # gdelt_events finds no ledger here, so it parses nothing and keeps the files written above.
    return dg.materialize(
        [
            gdelt_events,
            events,
            daily_quads_asset,
            gdelt_events_valid,
            events_valid,
            *([daily_quads_valid] if include_quads_check else []),
        ],
        partition_key=DAY.isoformat(),
        resources=resources_for(make_settings(data_dir=str(data_dir))),
        instance=instance,
        raise_on_error=False,
    )


def _evaluations(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def _materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def test_checks_pass_on_a_good_day(tmp_path):
    _write_parsed_day(tmp_path, raw_day())
    with dg.instance_for_test() as instance:
        result = _run(tmp_path, instance)
    assert result.success
    evals = _evaluations(result)
    assert {name: e.passed for name, e in evals.items()} == {
        "gdelt_events_valid": True,
        "events_valid": True,
        "daily_quads_valid": True,
    }
    assert evals["events_valid"].metadata["rows"].value == 18
    assert evals["events_valid"].metadata["unsuccessful_expectations"].value == 0
    assert {"events", "daily_quads"} <= _materialized(result)


def test_empty_day_passes_every_check_with_a_note(tmp_path):
    with dg.instance_for_test() as instance:
        result = _run(tmp_path, instance)
    assert result.success
    evals = _evaluations(result)
    assert all(e.passed for e in evals.values()) and len(evals) == 3
    assert evals["gdelt_events_valid"].metadata["note"].value == "no parsed export rows for this day"


def test_bad_raw_day_fails_gdelt_events_valid_without_blocking(tmp_path):
    day = raw_day()
    slot = list(day)[1]
    day[slot] = set_row(day[slot], 0, DATEADDED=slot + timedelta(hours=1))  # outside its slot
    _write_parsed_day(tmp_path, day)
    with dg.instance_for_test() as instance:
        result = _run(tmp_path, instance)
    evals = _evaluations(result)
    raw = evals["gdelt_events_valid"]
    assert not raw.passed and raw.severity == dg.AssetCheckSeverity.ERROR
    assert "_dateadded_offset_s" in table_text(raw.metadata["failures"])
    assert raw.metadata["failures_json"].value[0]["expectation"] == BETWEEN
    # Non-blocking: the events rules still ran and the rest of the day was built.
    assert result.success
    assert {"events", "daily_quads"} <= _materialized(result)
    assert evals["events_valid"].passed


def test_failed_events_check_blocks_daily_quads(tmp_path, monkeypatch):
    import assets.events as event_assets
    from pipeline.events.daily import build_events as real_build_events

    def build_domestic_events(day, dataset):
        """The real rules, then a bug: the first event becomes domestic (s == o). Written the way
        build_events writes (sealed), so the suite, not the digest, is what finds it."""
        built = real_build_events(day, dataset)
        layout = DataLayout(dataset.data_dir)
        path = layout.events_path(day)
        write_sealed_parquet(layout, set_row(pl.read_parquet(path), 0, o="USA", s="USA"), path)
        return built

    monkeypatch.setattr(event_assets, "build_events", build_domestic_events)
    _write_parsed_day(tmp_path, raw_day())
    with dg.instance_for_test() as instance:
        result = _run(tmp_path, instance)
        evals = _evaluations(result)
        check = evals["events_valid"]
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert check.metadata["failures_json"].value[0]["expectation"] == WITHIN_RECORD
        assert "4: no domestic event (s != o)" in table_text(check.metadata["failures"])
        # Blocking: the run fails and daily_quads is neither run nor written.
        assert not result.success
        assert "events" in _materialized(result)
        assert "daily_quads" not in _materialized(result)
        assert instance.get_latest_materialization_event(dg.AssetKey("daily_quads")) is None
        assert "daily_quads_valid" not in evals
    assert not DataLayout(tmp_path).daily_quads_path(DAY).exists()
    assert evals["gdelt_events_valid"].passed  # the raw rows were fine


def test_definitions_carry_the_checks_without_importing_great_expectations():
    import subprocess
    import sys

    code = (
        "import sys, definitions as d;"
        "keys = d.defs.resolve_job_def('gdelt_ingest').asset_layer.asset_graph.asset_check_keys;"
        "print(sorted(k.name for k in keys));"
        "print('great_expectations' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    names, gx_loaded = out.stdout.strip().splitlines()[-2:]
    assert {"gdelt_events_valid", "events_valid", "daily_quads_valid"} <= set(eval(names))
    assert gx_loaded == "False"


def test_checks_pass_on_a_real_pipeline_day(tmp_path, mirror):
    """The whole chain on the generated GDELT mirror (malformed lines, gaps, aliases, regions,
    late re-reports): the pipeline's own output meets every expectation."""
    from assets.events import daily_quads as daily_quads_asset
    from assets.events import events
    from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
    from quality.event_checks import daily_quads_valid, events_valid, gdelt_events_valid

    resources = resources_for(make_settings(data_dir=str(tmp_path / "data"), gdelt_base_url=mirror.base_url))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [
                gdelt_files,
                gdelt_events,
                gdelt_mentions,
                events,
                daily_quads_asset,
                gdelt_events_valid,
                events_valid,
                daily_quads_valid,
            ],
            partition_key=MIRROR_DAY.isoformat(),
            resources=resources,
            instance=instance,
        )
    assert result.success
    evals = _evaluations(result)
    assert {n: e.passed for n, e in evals.items()} == {
        "gdelt_events_valid": True,
        "events_valid": True,
        "daily_quads_valid": True,
    }, {n: e.metadata.get("failures") for n, e in evals.items()}
    assert evals["gdelt_events_valid"].metadata["rows"].value > 10_000
    assert evals["events_valid"].metadata["rows"].value > 1_000
