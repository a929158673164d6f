"""A day whose article fetches mostly fail (issue 36, point 3): the ``articles_fetch_health`` check
warns, naming the dominant failure, and ``alert_on_articles_fetch_failing`` posts it once.

Everything is real: the articles asset fetches through the real fetcher (host names under the
reserved ``.invalid`` and ``.example`` TLDs really do not resolve: ``dns_error``; pages come from a
news server on 127.0.0.1), the check reads the real fetch ledger on a test instance, and the sensor
posts to a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import time
from datetime import date

import dagster as dg
import polars as pl
import pytest

from assets.articles import articles
from assets.resources import resources_for
from pipeline.articles.fetch_health import MAX_FAILURE_RATE, MIN_FETCHES, fetch_health
from pipeline.articles.ledger import FETCH_LEDGER_SCHEMA
from pipeline.events.quads import QUADS_SCHEMA
from pipeline.storage import DataLayout, atomic_write_parquet
from quality.event_checks import articles_fetch_health, articles_valid
from sensors.fetch_health import alert_on_articles_fetch_failing
from testbed.news import NewsServer, page_html

from .settings_builder import make_settings
from .webhook import Receiver

DAY = date(2024, 1, 1)
PAGES = {f"/news/{i}.html": page_html(f"story {i}") for i in range(30)}


@pytest.fixture
def webhook():
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def news():
    with NewsServer(PAGES) as server:
        yield server


def dead_urls(n: int, site: str = "gone") -> list[str]:
    """Article URLs on five hosts under .invalid (RFC 6761: never resolves)."""
    return [f"http://www{i % 5}.{site}.invalid/2024/01/01/story-{i}.html" for i in range(n)]


def write_quads(data_dir, urls: list[str]) -> None:
    """The day's one well-reported quad, reported by ``urls``."""
    quad = {"date": DAY, "s": "USA", "r": "042", "o": "CHN", "r1": "04", "daily_mentions": 80, "n_events": 1}
    quads = pl.DataFrame([quad | {"urls": urls, "n_urls": len(urls), "web_mention_urls": 0}], schema=QUADS_SCHEMA)
    atomic_write_parquet(quads, DataLayout(data_dir).daily_quads_path(DAY))


def resources(data_dir, webhook, **settings) -> dict:
    return resources_for(
        make_settings(
            data_dir=str(data_dir),
            fetch_allow_loopback=True,
            fetch_backoff_base_s=0.01,
            extract_workers=1,
            alert_webhook_url=webhook.url,
            alert_attempts=2,
            alert_timeout_s=5,
            **settings,
        )
    )


def materialize(instance, bound: dict, checks=(articles_fetch_health,)) -> dict[str, dg.AssetCheckEvaluation]:
    """One articles run of the day with its checks, as the hourly schedule's job runs it."""
    result = dg.materialize(
        [articles, *checks], partition_key=DAY.isoformat(), resources=bound, instance=instance, raise_on_error=False
    )
    assert result.success  # a day whose fetches fail is a successful run: the check is what says so
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def tick(instance, bound: dict, cursor: str | None = None):
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources=bound,
        definitions=dg.Definitions(sensors=[alert_on_articles_fetch_failing], resources=bound),
    )
    return alert_on_articles_fetch_failing.evaluate_tick(context)


def values(evaluation: dg.AssetCheckEvaluation) -> dict:
    return {key: value.value for key, value in evaluation.metadata.items()}


def test_a_day_whose_every_fetch_fails_with_dns_error_warns_and_alerts_once(tmp_path, webhook):
    """The reported day: 30 selected URLs, every fetch a dns_error, 0 rows, a successful run and a
    passing articles_valid. The new check fails with WARN naming dns_error; the alert is posted
    once, and the day's next hourly run (still failing) posts nothing more."""
    write_quads(tmp_path, dead_urls(30))
    bound = resources(tmp_path, webhook)
    with dg.instance_for_test() as instance:
        watching = tick(instance, bound)  # the sensor's first tick: from now on
        checks = materialize(instance, bound, (articles_valid, articles_fetch_health))

        assert checks["articles_valid"].passed  # the symptom: an empty day is a valid day
        health = checks["articles_fetch_health"]
        assert not health.passed and health.severity == dg.AssetCheckSeverity.WARN
        assert "30 of 30 attempted fetches failed (100%), most with dns_error (30)" in health.description
        meta = values(health)
        assert {k: meta[k] for k in ("selected", "attempted", "failed", "failure_rate", "dominant_reason")} == {
            "selected": 30,
            "attempted": 30,
            "failed": 30,
            "failure_rate": 1.0,
            "dominant_reason": "dns_error",
        }
        assert [r.data for r in health.metadata["failures_by_reason"].records] == [
            {"reason": "dns_error", "fetches": 30}
        ]

        alerted = tick(instance, bound, watching.cursor)
        [body] = webhook.bodies
        assert {
            k: body[k] for k in ("kind", "partition", "attempted", "failed", "failure_rate", "dominant_reason")
        } == {
            "kind": "articles_fetch_failing",
            "partition": "2024-01-01",
            "attempted": 30,
            "failed": 30,
            "failure_rate": 1.0,
            "dominant_reason": "dns_error",
        }
        assert body["dominant_count"] == 30 and "dns_error" in body["text"]

        # The next hourly run: the failed URLs wait for their retry, the check fails again.
        assert not materialize(instance, bound)["articles_fetch_health"].passed
        tick(instance, bound, alerted.cursor)
        assert len(webhook.bodies) == 1


def test_a_healthy_day_passes_and_alerts_nothing(tmp_path, webhook, news):
    """25 pages fetched and 5 gone (404): a failure rate of 17 %, an ordinary day."""
    gone = [news.url_for(f"/removed/{i}.html") for i in range(5)]
    write_quads(tmp_path, [news.url_for(f"/news/{i}.html") for i in range(25)] + gone)
    bound = resources(tmp_path, webhook)
    with dg.instance_for_test() as instance:
        watching = tick(instance, bound)
        health = materialize(instance, bound)["articles_fetch_health"]
        tick(instance, bound, watching.cursor)
    assert health.passed, health.description
    meta = values(health)
    assert (meta["attempted"], meta["failed"], meta["dominant_reason"]) == (30, 5, "http_404")
    assert health.description.startswith("5 of 30 attempted fetches failed (17%)")
    assert webhook.requests == 0


def test_a_day_with_fewer_fetches_than_the_minimum_passes_whatever_its_rate(tmp_path, webhook):
    write_quads(tmp_path, dead_urls(MIN_FETCHES - 1))
    bound = resources(tmp_path, webhook)
    with dg.instance_for_test() as instance:
        watching = tick(instance, bound)
        health = materialize(instance, bound)["articles_fetch_health"]
        tick(instance, bound, watching.cursor)
    assert health.passed and "too few to judge" in health.description
    assert (values(health)["attempted"], values(health)["failed"]) == (MIN_FETCHES - 1, MIN_FETCHES - 1)
    assert webhook.requests == 0


def test_a_day_that_recovers_and_fails_again_alerts_again(tmp_path, webhook, news):
    """DNS fails for www.site.example's 30 URLs (alert), comes back (they are fetched on their
    retry: the check passes, which re-arms the alert), then 40 new URLs of another site fail: 40
    of 70 is above the threshold, and that is a second alert."""
    site = [f"http://www.site.example/news/{i}.html" for i in range(30)]
    write_quads(tmp_path, site)
    # Retries due after ~1 s instead of 1 h, so the day's next run retries the failed URLs.
    fast_retries = {"fetch_retry_schedule_h": "0.0003,0.0003,0.0003"}
    outage = resources(tmp_path, webhook, **fast_retries)
    # With DNS back: www.site.example resolves (to the news server).
    resolved = resources(tmp_path, webhook, fetch_host_map=f"www.site.example=127.0.0.1:{news.port}", **fast_retries)
    with dg.instance_for_test() as instance:
        cursor = tick(instance, outage).cursor
        assert not materialize(instance, outage)["articles_fetch_health"].passed
        cursor = tick(instance, outage, cursor).cursor
        assert [b["failed"] for b in webhook.bodies] == [30]

        time.sleep(1.2)
        assert materialize(instance, resolved)["articles_fetch_health"].passed
        cursor = tick(instance, resolved, cursor).cursor
        assert len(webhook.bodies) == 1

        write_quads(tmp_path, site + dead_urls(40, site="other"))
        health = materialize(instance, resolved)["articles_fetch_health"]
        assert not health.passed and values(health)["failure_rate"] == round(40 / 70, 4)
        tick(instance, resolved, cursor)
    assert [(b["attempted"], b["failed"], b["dominant_reason"]) for b in webhook.bodies] == [
        (30, 30, "dns_error"),
        (70, 40, "dns_error"),
    ]


def test_the_threshold_is_more_than_the_maximum_rate_and_404s_are_named_by_code():
    """The library alone, on a hand-built ledger: exactly MAX_FAILURE_RATE failing is still
    healthy; one more failure is not. http_error is split by its code, ties broken by name."""
    half = MIN_FETCHES // 2

    def ledger(failed: int, codes=(404,)) -> tuple[pl.DataFrame, list[str]]:
        urls = [f"https://news.example/{i}" for i in range(MIN_FETCHES)]
        rows = [
            {"url": u, "status": "http_error" if i < failed else "fetched", "http_status": codes[i % len(codes)]}
            for i, u in enumerate(urls)
        ]
        frame = pl.DataFrame(rows, schema={"url": pl.String, "status": pl.String, "http_status": pl.Int16})
        return frame.match_to_schema(FETCH_LEDGER_SCHEMA, missing_columns="insert"), urls

    at_limit = fetch_health(*ledger(half))
    assert at_limit.failure_rate == MAX_FAILURE_RATE and at_limit.healthy
    over = fetch_health(*ledger(half + 1, codes=(404, 403)))
    assert not over.healthy
    assert over.failures_by_reason == {"http_404": 6, "http_403": 5} and over.dominant_reason == "http_404"
    assert fetch_health(*ledger(half, codes=(404, 403))).dominant_reason == "http_403"  # a tie: by name
    untried = fetch_health(ledger(half + 1)[0], [*ledger(0)[1], "https://news.example/never-tried"])
    assert (untried.selected, untried.attempted) == (MIN_FETCHES + 1, MIN_FETCHES)


def test_definitions_register_the_check_in_the_articles_job_and_the_sensor_running():
    import definitions

    check_key = dg.AssetCheckKey(dg.AssetKey("articles"), "articles_fetch_health")
    job = definitions.defs.resolve_job_def("articles_daily")
    assert "articles_articles_fetch_health" in {node.name for node in job.graph.nodes}
    assert check_key in definitions.defs.resolve_asset_graph().asset_check_keys
    spec = next(iter(articles_fetch_health.check_specs))
    assert not spec.blocking
    sensor = definitions.defs.resolve_sensor_def("alert_on_articles_fetch_failing")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING and "Running by default" in sensor.description
