"""The ``parsed_files_intact`` asset checks (quality/ingest_checks.py) on a real Dagster instance.

A generated day is materialised through Dagster; then a parsed file, the digest table or a raw
zip is damaged on disk, the check is run alone (nothing re-parsed), and what it reports is
compared with what was damaged. Re-materialising the asset repairs a parsed file.
"""

from __future__ import annotations

import dagster as dg
import pytest

from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from quality.ingest_checks import gdelt_events_intact, gdelt_mentions_intact

from .conftest import MIRROR_DAY
from .dagster_day import PARTITION, materialised_day, run_check_alone


@pytest.fixture
def materialised(tmp_path, mirror):
    """A day landed and parsed through Dagster, with both checks run in the same run."""
    with materialised_day(
        tmp_path, mirror, [gdelt_files, gdelt_events, gdelt_mentions, gdelt_events_intact, gdelt_mentions_intact]
    ) as day:
        yield day


def _evaluations(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.asset_check_key.asset_key.to_user_string(): e for e in result.get_asset_check_evaluations()}


def _run_export_check(resources, instance) -> dg.AssetCheckEvaluation:
    result = run_check_alone(gdelt_events_intact, gdelt_events, resources, instance)
    assert result.get_asset_materialization_events() == []
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.partition == PARTITION
    return evaluation


def _flip_bytes(path) -> None:
    data = bytearray(path.read_bytes())
    for pos in range(64, min(len(data) - 64, 512), 7):
        data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_checks_pass_on_what_the_day_just_parsed(materialised):
    layout, _, _, result = materialised
    evaluations = _evaluations(result)
    assert set(evaluations) == {"gdelt_events", "gdelt_mentions"}
    for kind, asset in (("export", "gdelt_events"), ("mentions", "gdelt_mentions")):
        check = evaluations[asset]
        files = sorted(layout.parsed_dir(kind, MIRROR_DAY).glob("*.parquet"))
        assert check.passed and check.check_name == "parsed_files_intact", check.description
        assert check.metadata["files_checked"].value == len(files) > 80
        assert check.metadata["bytes_checked"].value == sum(p.stat().st_size for p in files)
        assert check.metadata["raw_files_checked"].value == len(files)
        assert check.metadata["ms"].value >= 0


def test_a_damaged_parsed_file_fails_the_check_until_the_asset_re_parses_it(materialised):
    layout, resources, instance, _ = materialised
    path = sorted(layout.parsed_dir("export", MIRROR_DAY).glob("*.parquet"))[10]
    name = str(path.relative_to(layout.root))
    _flip_bytes(path)

    check = _run_export_check(resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert f"{name}: sha256 " in check.metadata["damaged"].value
    assert name in check.description and "next materialisation of gdelt_events" in check.description
    assert check.metadata["raw_damaged"].value == "none"

    # The next materialisation quarantines the file and parses its slot again; the check passes.
    result = dg.materialize(
        [gdelt_events, gdelt_events_intact], partition_key=PARTITION, resources=resources, instance=instance
    )
    [materialisation] = result.asset_materializations_for_node("gdelt_events")
    assert materialisation.metadata["parsed_this_run"].value == 1
    quarantined = materialisation.metadata["quarantined_this_run"].value
    assert f"- quarantine/parsed/export/date={PARTITION}/{path.name}." in quarantined
    assert _evaluations(result)["gdelt_events"].passed
    assert _run_export_check(resources, instance).passed


def test_a_damaged_raw_zip_warns_and_names_it(materialised):
    layout, resources, instance, _ = materialised
    raw = sorted((layout.root / "raw").rglob("*.export.CSV.zip"))[4]
    _flip_bytes(raw)
    check = _run_export_check(resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert f"{raw.relative_to(layout.root)}: md5 " in check.metadata["raw_damaged"].value
    assert check.metadata["damaged"].value == "none"


def test_a_damaged_digest_table_fails_the_check_as_the_table_alone(materialised):
    layout, resources, instance, _ = materialised
    table = layout.parsed_digests_path("export", MIRROR_DAY)
    table.write_bytes(table.read_bytes()[:100])
    check = _run_export_check(resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    [line] = check.metadata["damaged"].value.splitlines()
    assert line.startswith(f"- {table.relative_to(layout.root)}: ")


def test_a_day_parsed_before_digests_were_recorded_warns_until_it_is_materialised_again(materialised):
    layout, resources, instance, _ = materialised
    layout.parsed_digests_path("export", MIRROR_DAY).unlink()
    check = _run_export_check(resources, instance)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "parsed before digests were recorded" in check.description
    result = dg.materialize(
        [gdelt_events, gdelt_events_intact], partition_key=PARTITION, resources=resources, instance=instance
    )
    assert result.asset_materializations_for_node("gdelt_events")[0].metadata["parsed_this_run"].value == 0
    assert _evaluations(result)["gdelt_events"].passed
