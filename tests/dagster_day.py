"""A generated day materialised through Dagster, and one asset check run alone on it: what the
integrity tests (parsed files, sealed files) damage and re-check."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from assets.resources import resources_for
from pipeline.storage import DataLayout

from .conftest import MIRROR_DAY
from .settings_builder import make_settings

PARTITION = MIRROR_DAY.isoformat()


@contextmanager
def materialised_day(tmp_path: Path, mirror, definitions: list):
    """The mirror's day materialised with ``definitions`` (assets and checks) on a test instance;
    yields (layout, resources, instance, result)."""
    resources = resources_for(make_settings(data_dir=str(tmp_path / "data"), gdelt_base_url=mirror.base_url))
    with dg.instance_for_test() as instance:
        result = dg.materialize(definitions, partition_key=PARTITION, resources=resources, instance=instance)
        assert result.success
        yield DataLayout(tmp_path / "data"), resources, instance, result


def run_check_alone(check, asset, resources: dict, instance) -> dg.ExecuteInProcessResult:
    """A run of the check alone for the day (the partition given as the run's `dagster/partition`
    tag: a check-only selection has no assets to take a partitions definition from)."""
    job = dg.define_asset_job("check_only", selection=dg.AssetSelection.checks(check))
    defs = dg.Definitions(assets=[asset], asset_checks=[check], jobs=[job], resources=resources)
    return defs.resolve_job_def("check_only").execute_in_process(
        instance=instance, tags={"dagster/partition": PARTITION}, raise_on_error=False
    )
