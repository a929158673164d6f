"""The resources as Dagster shows them: the code location (definitions.py, loaded in its own
process as the webserver loads it) answers GraphQL with every resource, every config field and its
default, the deployment's environment as configured values (the webhook URL as an env var, never
its value), and accepts a launchpad override of any resource; a run with an override uses it."""

from __future__ import annotations

import dataclasses
import json
from contextlib import ExitStack
from datetime import timedelta

import dagster as dg
import pytest
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

from assets.resources import (
    Alerts,
    ArticleFetcher,
    Dataset,
    GdeltFeed,
    LiveRounds,
    LlmRuntime,
    Network,
    ReleaseBucket,
    compose,
    resources_for,
    resources_from_env,
)
from pipeline.config import CalendarSettings, Settings, groups

from .conftest import ROOT
from .settings_builder import make_settings

RESOURCES = {
    "dataset": Dataset,
    "network": Network,
    "gdelt": GdeltFeed,
    "fetcher": ArticleFetcher,
    "release_store": ReleaseBucket,
    "alerts": Alerts,
    "live": LiveRounds,
    "llm": LlmRuntime,
}
SECRET_URL = "https://hooks.example.org/services/T0/B0/s3cr3t-token"

RESOURCES_QUERY = """
query ($selector: RepositorySelector!) {
  allTopLevelResourceDetailsOrError(repositorySelector: $selector) {
    __typename
    ... on ResourceDetailsList { results {
      name description resourceType
      configFields { name description defaultValueAsJson isRequired }
      configuredValues { key value type }
      assetKeysUsing { path } schedulesUsing sensorsUsing
    } }
    ... on PythonError { message }
  }
}"""

VALIDATE_QUERY = """
query ($pipeline: PipelineSelector!, $config: RunConfigData) {
  isPipelineConfigValid(pipeline: $pipeline, mode: "default", runConfigData: $config) {
    __typename
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""


@pytest.fixture(scope="module")
def resources_page():
    """Every top-level resource's details, from the code location loaded with a deployment's
    environment: a webhook URL (a secret), a split seed and a GDELT mirror."""
    env = {
        "MIRAI_ALERT_WEBHOOK_URL": SECRET_URL,
        "MIRAI_SPLIT_SEED": "7",
        "GDELT_BASE_URL": "http://mirror.test/gdeltv2",
    }
    with dg.instance_for_test() as instance, ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)  # the code server process inherits it, as a deployment's would
            context = stack.enter_context(define_out_of_process_context(str(ROOT / "definitions.py"), "defs", instance))
        selector = {"repositoryLocationName": context.code_location_names[0], "repositoryName": "__repository__"}
        result = execute_dagster_graphql(context, RESOURCES_QUERY, {"selector": selector})
        details = result.data["allTopLevelResourceDetailsOrError"]
        assert details["__typename"] == "ResourceDetailsList", details
        yield {"resources": {r["name"]: r for r in details["results"]}, "context": context, "selector": selector}


def test_every_resource_and_config_field_is_listed_with_its_default(resources_page):
    resources = resources_page["resources"]
    assert set(resources) == set(RESOURCES)
    for name, cls in RESOURCES.items():
        fields = {f["name"]: f for f in resources[name]["configFields"]}
        assert set(fields) == set(cls.model_fields), name
        for field_name, info in cls.model_fields.items():
            # Every field has a default (nothing is required to launch) and shows it.
            assert not fields[field_name]["isRequired"], (name, field_name)
            assert json.loads(fields[field_name]["defaultValueAsJson"]) == info.default, (name, field_name)
        assert resources[name]["description"], name
        # Each field a group's is that group's, described with its environment variable.
        for field_name, info in cls.group.model_fields.items():
            assert fields[field_name]["description"] == f"{info.validation_alias}: {info.description}", field_name
    # The resources cover every group but the partitions' dates (fixed when the code location loads).
    assert set(groups().values()) - {cls.group for cls in RESOURCES.values()} == {CalendarSettings}
    assert {"gdelt_files", "articles", "release"} <= {k["path"][0] for k in resources["dataset"]["assetKeysUsing"]}
    assert "monthly_release_daily" in resources["release_store"]["schedulesUsing"]
    assert {"alert_on_run_failure", "gdelt_freshness"} <= set(resources["alerts"]["sensorsUsing"])


def test_the_environment_shows_as_configured_values_and_the_secret_as_an_env_var(resources_page):
    resources = resources_page["resources"]
    configured = {
        (name, v["key"]): (v["value"], v["type"]) for name, r in resources.items() for v in r["configuredValues"]
    }
    assert configured[("alerts", "webhook_url")] == ("MIRAI_ALERT_WEBHOOK_URL", "ENV_VAR")
    assert configured[("dataset", "split_seed")] == ("7", "VALUE")
    assert configured[("gdelt", "base_url")] == ('"http://mirror.test/gdeltv2"', "VALUE")
    assert configured[("dataset", "split_sample_size")] == ("100", "VALUE")  # unset: the default
    assert SECRET_URL not in json.dumps(resources)


def test_the_launchpad_accepts_a_resource_override_and_refuses_a_mistyped_one(resources_page):
    context, selector = resources_page["context"], resources_page["selector"]
    pipeline = {
        "pipelineName": "gdelt_ingest",
        "repositoryName": selector["repositoryName"],
        "repositoryLocationName": selector["repositoryLocationName"],
    }

    def validate(config: dict) -> dict:
        return execute_dagster_graphql(context, VALIDATE_QUERY, {"pipeline": pipeline, "config": config}).data[
            "isPipelineConfigValid"
        ]

    ok = validate(
        {
            "resources": {
                "gdelt": {"config": {"base_url": "http://other.test", "download_attempts": 2}},
                "dataset": {"config": {"data_dir": "/srv/mirai"}},
            }
        }
    )
    assert ok["__typename"] == "PipelineConfigValidationValid", ok
    bad = validate({"resources": {"gdelt": {"config": {"download_attempts": "many"}}}})
    assert bad["__typename"] == "RunConfigValidationInvalid"
    assert "download_attempts" in json.dumps(bad["errors"])


def test_a_run_config_override_reaches_the_pipeline_settings(tmp_path):
    """What the launchpad sends (run config) replaces the bound resource's field for that run."""
    seen = {}

    @dg.asset
    def probe(dataset: Dataset, gdelt: GdeltFeed) -> None:
        seen["settings"] = compose(dataset, gdelt)

    resources = resources_for(make_settings(data_dir=str(tmp_path / "bound")))
    config = {
        "resources": {
            "gdelt": {"config": {"download_attempts": 9}},
            "dataset": {"config": {"data_dir": str(tmp_path / "run")}},
        }
    }
    assert dg.materialize([probe], resources=resources, run_config=config).success
    assert (seen["settings"].dataset.data_dir, seen["settings"].gdelt.download_attempts) == (tmp_path / "run", 9)


def test_resources_from_the_environment_hold_the_same_settings():
    env = {
        "MIRAI_DATA_DIR": "/srv/mirai",
        "MIRAI_FETCH_ALLOW_LOOPBACK": "yes",
        "MIRAI_RELEASE_URI": "s3://b/p",
        "MIRAI_ALERT_TIMEOUT_S": "3",
        "MIRAI_START_DATE": "2024-01-01",
        "MIRAI_SANDBOX_ALLOW_UNCONFINED": "1",
    }
    resources = resources_from_env(env)
    # The partitions' start date is not a resource field.
    expected = dataclasses.replace(Settings.from_env(env), calendar=CalendarSettings())
    assert compose(*resources.values()) == expected
    assert resources["llm"].allow_unconfined
    with pytest.raises(ValueError, match="MIRAI_FETCH_MAX_BYTES"):
        resources_from_env({"MIRAI_FETCH_MAX_BYTES": "5MB"})


def test_the_monthly_schedule_opens_the_store_only_once_a_month_has_ended(tmp_path):
    """A release URI that cannot be opened shows when the store is opened: not before the first
    month has ended (nothing to check), and on the first tick after it."""
    from assets.partitions import monthly_partitions
    from pipeline.release.layout import ReleaseError
    from sensors.monthly import monthly_release_daily

    resources = resources_for(make_settings(data_dir=str(tmp_path), release_uri="gopher://nowhere"))
    start = monthly_partitions.start
    with dg.build_schedule_context(scheduled_execution_time=start + timedelta(days=1), resources=resources) as context:
        result = monthly_release_daily(context)
    assert isinstance(result, dg.SkipReason) and "no month has ended" in result.skip_message
    with dg.build_schedule_context(scheduled_execution_time=start + timedelta(days=40), resources=resources) as context:
        with pytest.raises(ReleaseError, match="gopher"):
            monthly_release_daily(context)
