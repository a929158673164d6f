"""The Dagster code location (workspace.yaml loads this module)."""

import dagster as dg

from assets.articles import articles, fetch_ledger
from assets.database import event_database
from assets.evaluations import evaluation, leaderboard
from assets.events import daily_quads, events
from assets.ingest import gdelt_events, gdelt_files, gdelt_mentions
from assets.live import live_round
from assets.live_history import live_history
from assets.live_resolution import live_leaderboard, live_resolution
from assets.release import release
from assets.resources import resources_from_env
from assets.splits import test_split
from assets.submissions import submission
from quality.event_checks import (
    articles_fetch_health,
    articles_valid,
    daily_quads_valid,
    events_history_current,
    events_valid,
    gdelt_events_valid,
)
from quality.ingest_checks import gdelt_events_intact, gdelt_files_all_green, gdelt_mentions_intact
from quality.schema_checks import column_schema_checks
from quality.split_checks import split_leakage_audit
from quality.submission_checks import submission_accepted
from sensors.alerts import alert_on_run_failure, gdelt_freshness
from sensors.evaluations import evaluation_job, evaluation_sensor, leaderboard_job
from sensors.fetch_health import alert_on_articles_fetch_failing
from sensors.history import events_follow_history, events_follow_job
from sensors.live import live_history_daily, live_history_job, live_round_daily, live_round_job
from sensors.live_resolution import live_leaderboard_job, live_resolution_job, live_resolution_sensor
from sensors.monthly import monthly_release_daily, monthly_release_job
from sensors.run_health import run_worker_watch
from sensors.schedules import articles_hourly, articles_job, gdelt_every_15_minutes, gdelt_ingest_job
from sensors.submissions import submission_job, submission_sensor

defs = dg.Definitions(
    assets=[
        gdelt_files,
        gdelt_events,
        gdelt_mentions,
        events,
        daily_quads,
        articles,
        fetch_ledger,
        event_database,
        test_split,
        release,
        evaluation,
        leaderboard,
        submission,
        live_round,
        live_history,
        live_resolution,
        live_leaderboard,
    ],
    asset_checks=[
        gdelt_files_all_green,
        gdelt_events_intact,
        gdelt_mentions_intact,
        gdelt_events_valid,
        events_valid,
        events_history_current,
        daily_quads_valid,
        articles_valid,
        articles_fetch_health,
        split_leakage_audit,
        submission_accepted,
        *column_schema_checks,
    ],
    jobs=[
        gdelt_ingest_job,
        events_follow_job,
        articles_job,
        monthly_release_job,
        evaluation_job,
        leaderboard_job,
        submission_job,
        live_round_job,
        live_history_job,
        live_resolution_job,
        live_leaderboard_job,
    ],
    schedules=[gdelt_every_15_minutes, articles_hourly, monthly_release_daily, live_round_daily, live_history_daily],
    sensors=[
        alert_on_run_failure,
        alert_on_articles_fetch_failing,
        run_worker_watch,
        events_follow_history,
        gdelt_freshness,
        evaluation_sensor,
        submission_sensor,
        live_resolution_sensor,
    ],
    # Built from the environment when the code location loads (README.md's variables); the
    # launchpad overrides any field per run (docs/deploy.md, "Resources").
    resources=resources_from_env(),
)
