"""Alerts against a real HTTP receiver on 127.0.0.1: delivery with retries and without leaking the
webhook's token, the run-failure sensor on a real failed run, and the freshness sensor's
once-per-breach state over consecutive ticks."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import polars as pl
import pytest

from assets.resources import resources_for, resources_from_env
from pipeline.alerts import Alert, newest_landed_slot, send_alert
from pipeline.config import AlertSettings
from pipeline.gdelt.ledger import LEDGER_SCHEMA, write_ledger
from pipeline.storage import DataLayout
from sensors.alerts import alert_on_run_failure, gdelt_freshness

from .settings_builder import make_settings
from .webhook import TOKEN, Receiver


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def webhook(receiver):
    """The receiver the sensors' Alerts resource posts to (_tick binds it)."""
    return receiver


def test_an_alert_is_posted_as_json_retried_on_503_and_never_carries_the_token(receiver):
    settings = make_settings(alert_webhook_url=receiver.url, alert_attempts=3)
    receiver.fail_next = 1
    lines: list[str] = []
    alert = Alert(
        "run_failure", "run of gdelt_ingest failed", {"error": "HTTP 403 for s3://AKIAX:topsecret@bucket/key"}
    )
    assert send_alert(alert, settings.alerts, settings.network.user_agent, lines.append, sleep=lambda s: None) == "sent"
    assert receiver.requests == 2
    [body] = receiver.bodies
    assert body["kind"] == "run_failure" and body["source"] == "mirai-pipeline"
    assert body["text"] == "[mirai-pipeline] run of gdelt_ingest failed"
    # Credentials inside a quoted URL are masked; the webhook's own token appears nowhere.
    assert body["error"] == "HTTP 403 for s3://***@bucket/key"
    assert TOKEN not in json.dumps(body) and not any(TOKEN in line for line in lines)


def test_without_a_webhook_the_alert_is_only_logged(receiver):
    lines: list[str] = []
    assert send_alert(Alert("freshness_breach", "stale"), AlertSettings(), "ua", lines.append) == "logged"
    assert receiver.requests == 0 and lines == ["alert freshness_breach: stale"]


@pytest.mark.parametrize("status", [503, 404])
def test_an_undeliverable_alert_fails_without_quoting_the_url(receiver, status):
    receiver.status = status
    lines: list[str] = []
    result = send_alert(
        Alert("run_failure", "x"),
        AlertSettings(webhook_url=receiver.url, attempts=3),
        "ua",
        lines.append,
        sleep=lambda s: None,
    )
    assert result == "failed"
    # 5xx is retried to the last attempt; a 4xx will not get better and is not.
    assert receiver.requests == (3 if status == 503 else 1)
    assert f"HTTP {status}" in lines[-1] and not any(TOKEN in line or "127.0.0.1" in line for line in lines)


@dg.op
def fetch_something():
    raise RuntimeError("GDELT index unreachable")


@dg.job
def doomed():
    fetch_something()


def _tick(sensor, instance, webhook, cursor=None, **settings):
    """One tick of the sensor, with every resource as definitions.py binds them and the alert
    settings pointing at the webhook receiver."""
    resources = resources_for(
        make_settings(alert_webhook_url=webhook.url, alert_attempts=2, alert_timeout_s=5, **settings)
    )
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources=resources,
        definitions=dg.Definitions(jobs=[doomed], sensors=[sensor], resources=resources),
    )
    return sensor.evaluate_tick(context)


def test_a_failed_run_posts_its_run_id_and_job_name_once(webhook, tmp_path):
    with dg.instance_for_test() as instance:
        # The first tick only places the cursor: runs that failed before the sensor existed are old news.
        first = _tick(alert_on_run_failure, instance, webhook, data_dir=str(tmp_path))
        result = doomed.execute_in_process(
            instance=instance, raise_on_error=False, tags={"dagster/partition": "2024-01-01"}
        )
        assert not result.success
        second = _tick(alert_on_run_failure, instance, webhook, cursor=first.cursor, data_dir=str(tmp_path))
        [body] = webhook.bodies
        assert (body["kind"], body["run_id"], body["job_name"], body["partition"]) == (
            "run_failure",
            result.run_id,
            "doomed",
            "2024-01-01",
        )
        assert "GDELT index unreachable" in body["error"]
        _tick(alert_on_run_failure, instance, webhook, cursor=second.cursor, data_dir=str(tmp_path))
        assert len(webhook.bodies) == 1


def test_an_undeliverable_run_failure_alert_fails_the_sensor_tick(webhook, tmp_path):
    webhook.status = 500
    with dg.instance_for_test() as instance:
        first = _tick(alert_on_run_failure, instance, webhook, data_dir=str(tmp_path))
        result = doomed.execute_in_process(instance=instance, raise_on_error=False)
        [reaction] = _tick(
            alert_on_run_failure, instance, webhook, cursor=first.cursor, data_dir=str(tmp_path)
        ).dagster_run_reactions
    assert reaction.dagster_run.run_id == result.run_id
    assert "not delivered" in reaction.error.to_string() and webhook.requests == 2


def _write_slots(data_dir, day: date, slots: list[datetime], status: str = "landed") -> None:
    rows = [{"day": day, "slot": s, "kind": kind, "status": status} for s in slots for kind in ("export", "mentions")]
    write_ledger(DataLayout(data_dir), day, pl.DataFrame(rows, schema=LEDGER_SCHEMA))


def _quarter(t: datetime) -> datetime:
    return t.replace(minute=t.minute - t.minute % 15, second=0, microsecond=0)


def test_newest_landed_slot_skips_slots_that_did_not_land(tmp_path):
    layout = DataLayout(tmp_path)
    assert newest_landed_slot(layout) is None
    old = datetime(2024, 1, 1, 23, 45, tzinfo=UTC)
    _write_slots(tmp_path, old.date(), [old - timedelta(minutes=15), old])
    _write_slots(tmp_path, date(2024, 1, 2), [datetime(2024, 1, 2, 0, 0, tzinfo=UTC)], status="pending")
    assert newest_landed_slot(layout) == old


def test_a_freshness_breach_posts_once_and_recovery_rearms_it(webhook, tmp_path):
    now = datetime.now(UTC)
    stale = _quarter(now - timedelta(hours=2))
    _write_slots(tmp_path, stale.date(), [stale])
    with dg.instance_for_test() as instance:
        tick = _tick(gdelt_freshness, instance, webhook, data_dir=str(tmp_path))
        assert [b["kind"] for b in webhook.bodies] == ["freshness_breach"]
        assert webhook.bodies[0]["newest_landed_slot"] == stale.isoformat()
        assert webhook.bodies[0]["age_hours"] >= 2 and webhook.bodies[0]["limit_hours"] == 1

        # Still stale: the next tick says so in its skip reason but posts nothing.
        tick = _tick(gdelt_freshness, instance, webhook, cursor=tick.cursor, data_dir=str(tmp_path))
        assert len(webhook.bodies) == 1 and "h old" in tick.skip_message
        assert "breach already announced, waits for gdelt_files to land a newer slot" in tick.skip_message

        fresh = _quarter(now - timedelta(minutes=10))
        _write_slots(tmp_path, fresh.date(), [stale, fresh] if fresh.date() == stale.date() else [fresh])
        tick = _tick(gdelt_freshness, instance, webhook, cursor=tick.cursor, data_dir=str(tmp_path))
        tick = _tick(gdelt_freshness, instance, webhook, cursor=tick.cursor, data_dir=str(tmp_path))
        assert [b["kind"] for b in webhook.bodies] == ["freshness_breach", "freshness_recovered"]

        # Re-armed: the next breach (a tighter limit here) is announced again.
        _tick(gdelt_freshness, instance, webhook, cursor=tick.cursor, data_dir=str(tmp_path), freshness_hours=0.01)
        assert [b["kind"] for b in webhook.bodies] == ["freshness_breach", "freshness_recovered", "freshness_breach"]


def test_an_undelivered_freshness_alert_is_retried_on_the_next_tick(webhook, tmp_path):
    stale = _quarter(datetime.now(UTC) - timedelta(hours=3))
    _write_slots(tmp_path, stale.date(), [stale])
    with dg.instance_for_test() as instance:
        webhook.status = 500
        with pytest.raises(Exception, match="not delivered"):
            _tick(gdelt_freshness, instance, webhook, data_dir=str(tmp_path))
        webhook.status = 200
        _tick(gdelt_freshness, instance, webhook, data_dir=str(tmp_path))
        assert [b["kind"] for b in webhook.bodies] == ["freshness_breach"]


def test_before_anything_landed_there_is_no_breach(webhook, tmp_path):
    with dg.instance_for_test() as instance:
        tick = _tick(gdelt_freshness, instance, webhook, data_dir=str(tmp_path))
    assert webhook.requests == 0 and tick.skip_message == (
        "no GDELT slot has landed yet: no gdelt_files partition has a landed slot "
        "(turn on gdelt_every_15_minutes or backfill the gdelt_ingest job)"
    )


def test_the_deployments_webhook_url_is_an_env_var_the_sensor_resolves(receiver, tmp_path, monkeypatch):
    """The secret's interface is its variable: the code location binds it as an EnvVar (shown by
    name in the UI), and the tick resolves it to post the alert."""
    monkeypatch.setenv("MIRAI_ALERT_WEBHOOK_URL", receiver.url)
    alerts = resources_from_env()["alerts"]
    assert isinstance(alerts.webhook_url, dg.EnvVar)
    resources = {**resources_for(make_settings(data_dir=str(tmp_path))), "alerts": alerts}
    stale = _quarter(datetime.now(UTC) - timedelta(hours=3))
    _write_slots(tmp_path, stale.date(), [stale])
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(
            instance=instance,
            resources=resources,
            definitions=dg.Definitions(sensors=[gdelt_freshness], resources=resources),
        )
        gdelt_freshness.evaluate_tick(context)
    assert [b["kind"] for b in receiver.bodies] == ["freshness_breach"]
