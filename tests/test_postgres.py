"""The deployed Dagster instance for real: deploy/dagster.yaml on a PostgreSQL server started here
(Debian's postgresql package, 127.0.0.1, a free port), a day materialised through the `dagster`
CLI in its own process, and the runs, events and pool limits read back from PostgreSQL."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import MIRROR_DAY, ROOT
from .run_recovery import FAILED_WITHIN_S, NEXT_RUN_DONE_WITHIN_S, killed_worker_recovers

psycopg2 = pytest.importorskip("psycopg2", reason="dagster-postgres (the `test` extra) brings psycopg2")

BIN = Path(sys.executable).parent
DAY_ASSETS = ["gdelt_files", "gdelt_events", "gdelt_mentions", "events", "unmapped_codes", "daily_quads"]
# Every check of the day's assets runs in the ingest run (events_history_current included).
DAY_CHECKS = [
    ("gdelt_files", "gdelt_files_all_green"),
    ("gdelt_events", "parsed_files_intact"),
    ("gdelt_mentions", "parsed_files_intact"),
    ("gdelt_events", "gdelt_events_valid"),
    ("events", "events_valid"),
    ("events", "events_history_current"),
    ("daily_quads", "daily_quads_valid"),
    # Each day asset's column schema against its previous materialisation (quality/schema_checks.py).
    *((asset, "column_schema_change") for asset in DAY_ASSETS),
]
PASSWORD = "mirai-test-password"


def _server_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL server (initdb lives outside PATH there), else one on PATH."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user() -> tuple[list[str], str | None]:
    """PostgreSQL refuses to run as root: under root, run its binaries as the package's `postgres`
    user (or `nobody`) through runuser."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return ["runuser", "-u", name, "--"], name
    pytest.skip("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL")


@dataclass
class Postgres:
    host: str
    port: int
    db: str
    user: str
    password: str

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.db,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg2.connect(
            host=self.host, port=self.port, dbname=self.db, user=self.user, password=self.password
        ) as conn:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()


@pytest.fixture(scope="module")
def postgres():
    bin_dir = _server_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` "
            "package (`make test` does so when run as root with apt-get)"
        )
    prefix, user = _as_server_user()
    # Not under pytest's tmp_path: that is private to root, and the server user must enter it.
    base = Path(tempfile.mkdtemp(prefix="mirai-pg-"))
    data, log = base / "data", base / "server.log"
    (base / "pwfile").write_text(PASSWORD + "\n")
    if user:
        shutil.chown(base, user)
        shutil.chown(base / "pwfile", user)
    port = _free_port()

    def run(*args):
        return subprocess.run([*prefix, *map(str, args)], check=True, capture_output=True, text=True, timeout=60)

    try:
        # Password (scram) over TCP, like a real deployment; the socket lives in our temp dir only.
        run(
            bin_dir / "initdb",
            "-D",
            data,
            "-U",
            "dagster",
            "--pwfile",
            base / "pwfile",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        run(
            bin_dir / "pg_ctl",
            "-D",
            data,
            "-l",
            log,
            "-w",
            "-t",
            "30",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off -c full_page_writes=off",
            "start",
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        raise AssertionError(
            f"PostgreSQL did not start: {exc.stderr}\n{log.read_text() if log.exists() else ''}"
        ) from exc
    server = Postgres("127.0.0.1", port, "dagster", "dagster", PASSWORD)
    admin = psycopg2.connect(host=server.host, port=port, dbname="postgres", user=server.user, password=PASSWORD)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("CREATE DATABASE dagster")
    admin.close()
    try:
        yield server
    finally:
        subprocess.run(
            [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)


def _dagster_home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    return home


def test_a_day_materialises_on_the_deployed_instance_in_postgresql(tmp_path, mirror, postgres):
    home = _dagster_home(tmp_path)
    env = {
        **os.environ,
        **postgres.env(),
        "DAGSTER_HOME": str(home),
        "MIRAI_DATA_DIR": str(tmp_path / "data"),
        "GDELT_BASE_URL": mirror.base_url,
        "MIRAI_BACKOFF_BASE_S": "0.01",
    }
    proc = subprocess.run(
        # The job the 15-minute schedule launches, for one daily partition.
        [
            str(BIN / "dagster"),
            "job",
            "execute",
            "-m",
            "definitions",
            "-j",
            "gdelt_ingest",
            "--tags",
            json.dumps({"dagster/partition": MIRROR_DAY.isoformat()}),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # Nothing went to SQLite: the instance directory holds no storage of its own.
    assert not list(home.rglob("*.db"))
    runs = postgres.query("SELECT run_id, status FROM runs")
    assert len(runs) == 1 and runs[0][1] == "SUCCESS"
    run_id = runs[0][0]
    materialised = postgres.query(
        "SELECT asset_key, partition FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        (run_id,),
    )
    assert sorted(materialised) == sorted((f'["{a}"]', MIRROR_DAY.isoformat()) for a in DAY_ASSETS)
    # The step in the gdelt_http pool took its one slot (created at the default limit) and gave it back.
    assert postgres.query('SELECT concurrency_key, "limit", using_default_limit FROM concurrency_limits') == [
        ("gdelt_http", 1, True)
    ]
    assert postgres.query("SELECT concurrency_key, run_id FROM concurrency_slots") == [("gdelt_http", None)]
    # The day's checks ran in the same run and were recorded there too.
    # Named, not counted: a check added to the job then shows up here by name.
    evaluated = postgres.query(
        "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_CHECK_EVALUATION'", (run_id,)
    )
    names = sorted(
        (
            json.loads(row[0])["dagster_event"]["event_specific_data"]["asset_key"]["path"][0],
            json.loads(row[0])["dagster_event"]["event_specific_data"]["check_name"],
        )
        for row in evaluated
    )
    assert names == sorted(DAY_CHECKS)
    assert postgres.query(
        "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'STEP_FAILURE'", (run_id,)
    ) == [(0,)]


def test_the_deployed_instance_reads_back_from_postgresql_with_its_limits(tmp_path, postgres, monkeypatch):
    import dagster as dg

    for name, value in postgres.env().items():
        monkeypatch.setenv(name, value)
    with dg.DagsterInstance.from_config(str(_dagster_home(tmp_path))) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 4
        assert {"key": "dagster/backfill", "limit": 2} in queue.tag_concurrency_limits
        # Both project pools fall back to the default limit of 1 unless set in the database.
        for pool in ("gdelt_http", "article_fetch"):
            info = instance.event_log_storage.get_concurrency_info(pool)
            assert (info.limit, info.using_default_limit) == (1, True)
        assert instance.run_monitoring_enabled and instance.run_retries_enabled


def test_a_killed_run_worker_does_not_stall_the_deployed_instance(tmp_path, mirror, postgres):
    """Issue 31 on deploy/dagster.yaml (PostgreSQL, the queue's limits, run retries): the run whose
    worker was killed mid-download is failed, its slot freed by run_worker_watch, and the next run,
    launched meanwhile and waiting for the slot, lands the day (tests/run_recovery.py)."""
    recovery = killed_worker_recovers(
        _dagster_home(tmp_path), tmp_path / "data", mirror, postgres.env(), with_code_server=False
    )
    print(f"failed after {recovery.failed_after_s:.0f} s, next run done after {recovery.next_run_done_after_s:.0f} s")
    assert recovery.failed_after_s < FAILED_WITHIN_S
    assert recovery.next_run_done_after_s < NEXT_RUN_DONE_WITHIN_S
    assert {status: n for status, n in recovery.ledger.items() if n} == {"landed": 190, "missing": 2}
