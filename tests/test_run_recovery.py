"""Issue 31: a run worker killed mid-step (SIGKILL, as the OOM killer sends) must not stall
ingestion. Under the real daemon on the shipped single-machine instance (deploy/dagster-local.yaml,
SQLite), the killed run is marked failed, its `gdelt_http` slot freed, and the next run lands the
day's slots without anyone's help (tests/run_recovery.py; the PostgreSQL instance in test_postgres.py)."""

from __future__ import annotations

import shutil

import pytest

from .conftest import ROOT
from .run_recovery import FAILED_WITHIN_S, NEXT_RUN_DONE_WITHIN_S, killed_worker_recovers


@pytest.mark.parametrize("with_code_server", [False, True], ids=["worker", "worker-and-code-server"])
def test_a_killed_run_worker_is_failed_and_the_next_run_lands_the_day(tmp_path, mirror, with_code_server):
    """Worker alone: Dagster's code server sees it die and fails the run, but leaves its pool slot
    claimed; the watch frees it. With its code server: nothing in Dagster notices, the run stays
    STARTED; the watch fails it and frees the slot."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-local.yaml", home / "dagster.yaml")
    recovery = killed_worker_recovers(home, tmp_path / "data", mirror, {}, with_code_server=with_code_server)
    print(
        f"killed after {recovery.landed_before_kill} downloads; failed after {recovery.failed_after_s:.0f} s, "
        f"next run done after {recovery.next_run_done_after_s:.0f} s"
    )
    if with_code_server:
        assert "run worker (pid" in recovery.failure_message, recovery.failure_message
    assert recovery.failed_after_s < FAILED_WITHIN_S
    assert recovery.next_run_done_after_s < NEXT_RUN_DONE_WITHIN_S
    # Every listed file landed; the slots missing are the generated feed outage (testbed/generate.py).
    assert {status: n for status, n in recovery.ledger.items() if n} == {"landed": 190, "missing": 2}
