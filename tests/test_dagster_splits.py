"""The monthly assets on a real Dagster instance: event_database and test_split materialised for a
hand-built month, the closed-month rule surfacing as a failed run, the operator override, and the
daily schedule's decisions."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from assets.database import event_database
from assets.partitions import monthly_partitions
from assets.resources import resources_for
from assets.splits import test_split as split_asset
from pipeline.agent_api.audit import leakage_audit
from pipeline.splits.split import Closure
from pipeline.storage import DataLayout
from quality.split_checks import split_leakage_audit
from sensors.monthly import SUMMARY_MAX_CHARS, monthly_release_daily, open_months_summary

from .month_builder import Quad, write_month
from .settings_builder import make_settings
from .test_splits import QUADS

FEB = date(2024, 2, 1)


@pytest.fixture
def month_dir(tmp_path):
    settings = make_settings(data_dir=tmp_path / "data")
    write_month(settings, FEB, QUADS)
    return settings.dataset.data_dir


def _materialize(data_dir, instance, run_config=None, raise_on_error=True):
    return dg.materialize(
        [event_database, split_asset, split_leakage_audit],
        partition_key="2024-02-01",
        resources=resources_for(make_settings(data_dir=str(data_dir))),
        instance=instance,
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def test_materialize_a_closed_month(month_dir):
    with dg.instance_for_test() as instance:
        result = _materialize(month_dir, instance)
        assert result.success
        meta = result.asset_materializations_for_node("test_split")[0].metadata
        assert meta["dagster/row_count"].value == 2
        for figure in ("relation_distribution", "country_pairs", "queries_by_month", "slot_ledger", "obelics_funnel"):
            assert meta[f"{figure}.png"].value.startswith(f"![{figure}](data:image/png;base64,")
        db_meta = result.asset_materializations_for_node("event_database")[0].metadata
        assert db_meta["events"].value == 10  # 12 quads: one at 49 mentions, one with no kept article
        [audit] = result.get_asset_check_evaluations()
        assert audit.passed and audit.metadata["query dates audited"].value == 2
        assert audit.metadata["sandbox probed on"].value == "2024-02-03, 2024-02-29"
    assert (DataLayout(month_dir).split_dir(FEB) / "manifest.json").exists()


def test_an_open_month_fails_with_the_reason_and_an_override_is_recorded(tmp_path):
    settings = make_settings(data_dir=tmp_path / "data")
    write_month(settings, FEB, QUADS, slot_status="pending")
    with dg.instance_for_test() as instance:
        result = _materialize(settings.dataset.data_dir, instance, raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert "slots not settled: 5568 pending" in failure.step_failure_data.error.message
        forced = _materialize(
            settings.dataset.data_dir,
            instance,
            run_config={
                "ops": {"test_split": {"config": {"override_by": "ops", "override_reason": "slots lost upstream"}}}
            },
        )
        assert forced.success
    manifest = json.loads((DataLayout(settings.dataset.data_dir).split_dir(FEB) / "manifest.json").read_text())
    assert manifest["override"]["by"] == "ops" and manifest["override"]["reason"] == "slots lost upstream"


def test_schedule_waits_for_closure_then_requests_the_month_once(tmp_path):
    settings = make_settings(data_dir=tmp_path / "data", start_date=date(2024, 2, 1))
    write_month(settings, FEB, [Quad(date(2024, 2, 3), "FRA", "036", "DEU", 100, kept=5)], slot_status="pending")
    resources = resources_for(make_settings(data_dir=str(settings.dataset.data_dir)))

    def tick(at: datetime):
        with dg.build_schedule_context(scheduled_execution_time=at, resources=resources) as context:
            return monthly_release_daily(context)

    early = tick(datetime(2024, 3, 2, 6, tzinfo=UTC))
    assert isinstance(early, dg.SkipReason) and "grace period" in early.skip_message
    pending = tick(datetime(2024, 3, 5, 6, tzinfo=UTC))
    assert "5568 pending" in pending.skip_message
    write_month(settings, FEB, [Quad(date(2024, 2, 3), "FRA", "036", "DEU", 100, kept=5)], slot_status="landed")
    requests = tick(datetime(2024, 3, 5, 6, tzinfo=UTC))
    assert [(r.partition_key, r.run_key) for r in requests] == [("2024-02-01", "release-2024-02-01@2024-03-05")]


def test_schedule_sums_up_many_open_months_by_cause(tmp_path):
    """Years of open months make one bounded skip reason: per cause, how many months as ranges and
    the first thing to act on, not one clause per month."""
    settings = make_settings(data_dir=tmp_path / "data")
    write_month(settings, date(2025, 9, 1), [], slot_status="pending")  # 96 slots × 2 files a day
    write_month(settings, date(2025, 10, 1), [])  # settled; in its grace period until Nov 4
    now = datetime(2025, 11, 2, 6, tzinfo=UTC)
    first = date.fromisoformat(monthly_partitions.get_partition_keys(current_time=now)[0])
    months = len(monthly_partitions.get_partition_keys(current_time=now))
    with dg.build_schedule_context(
        scheduled_execution_time=now, resources=resources_for(make_settings(data_dir=str(settings.dataset.data_dir)))
    ) as context:
        skip = monthly_release_daily(context)
    assert isinstance(skip, dg.SkipReason) and len(skip.skip_message) <= SUMMARY_MAX_CHARS
    assert skip.skip_message == (
        f"{months} months open: {months - 2} months ({first:%Y-%m}..2025-08) wait for gdelt_files on "
        f"{(date(2025, 9, 1) - first).days} days (no slot ledger; first {first}, last 2025-08-31); "
        "2025-09 waits for gdelt_files slots to settle (5760 pending on 30 days; first 2025-09-01); "
        "2025-10 waits for the grace period (until 2025-11-04T00:00:00+00:00)"
    )


def test_the_open_months_summary_stays_bounded():
    every_other = [date(2000 + n // 12, n % 12 + 1, 1) for n in range(0, 600, 2)]  # 300 months, no two adjacent
    closures = [
        Closure(m, False, ("",), {"failed": 1}, days_without_ledger=(m,), days_unsettled=(m + timedelta(days=1),))
        for m in every_other
    ]
    summary = open_months_summary(closures)
    assert len(summary) <= SUMMARY_MAX_CHARS
    assert summary.startswith(
        "300 months open: 300 months (2000-01, 2000-03, 2000-05 and 297 more) wait for gdelt_files on 300 days "
        "(no slot ledger; first 2000-01-01, last 2049-11-01); "
        "300 months (2000-01, 2000-03, 2000-05 and 297 more) wait for gdelt_files slots to settle (300 failed"
    )


def test_leakage_audit_fails_a_split_whose_month_is_not_after_its_history_cutoff(month_dir):
    with dg.instance_for_test() as instance:
        assert _materialize(month_dir, instance).success
    manifest_path = DataLayout(month_dir).split_dir(FEB) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["history_cutoff"] = "2024-02-10"  # as if the database had been built past the split's start
    manifest_path.write_text(json.dumps(manifest))
    audit = leakage_audit(make_settings(data_dir=month_dir).dataset, FEB)
    assert audit.violations == ("the split month 2024-02 does not start after the history cutoff 2024-02-10",)
