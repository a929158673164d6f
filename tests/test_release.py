"""Monthly releases against a real S3 server (SeaweedFS on 127.0.0.1) and the local-directory
store: publish/download round trip, immutability, the crash mid-upload, a corrupted object, a
bucket holding a different release, resumed downloads, the CLI and the Dagster asset."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
import threading
import urllib.request
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pytest
import requests
import yaml

from pipeline.cli import main
from pipeline.config import NetworkSettings, ReleaseSettings, Settings
from pipeline.release import publish as release
from pipeline.release.download import ChecksumMismatch, download_release
from pipeline.release.layout import INDEX_KEY, LATEST_KEY, ReleaseError, release_key
from pipeline.release.publish import (
    PublishResult,
    ReleaseConflict,
    build_index,
    plan_release,
    publish_release,
    sha256_hex,
)
from pipeline.release.s3_store import S3Store
from pipeline.release.store import LocalStore, ReleaseNotReady
from pipeline.release.store_uri import open_store
from pipeline.splits.database import build_event_database
from pipeline.splits.split import build_split
from pipeline.storage import DataLayout
from testbed.s3 import LocalS3

from .month_builder import Quad, write_month
from .s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3
from .settings_builder import make_settings
from .test_splits import QUADS

JAN, FEB = date(2024, 1, 1), date(2024, 2, 1)
AFTER_GRACE = datetime(2024, 3, 4, tzinfo=UTC)
JAN_QUADS = [
    Quad(date(2024, 1, 10), "FRA", "036", "DEU", 100, kept=5),
    Quad(date(2024, 1, 31), "USA", "042", "CHN", 300, kept=6),
]
BIG = 12 * 2**20  # over the 5 MiB multipart threshold the S3 tests use: a 3-part upload


def _build(settings: Settings, month: date, quads) -> None:
    write_month(settings, month, quads)
    build_event_database(month, settings.dataset, settings.articles)
    build_split(month, settings.dataset, settings.gdelt, now=AFTER_GRACE)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """January and February built by the real pipeline, plus a December 2023 database month of
    random bytes large enough for a multipart upload. Tests publish from it, never write to it."""
    settings = make_settings(data_dir=tmp_path_factory.mktemp("release") / "data")
    _build(settings, JAN, JAN_QUADS)
    _build(settings, FEB, QUADS)
    layout = DataLayout(settings.dataset.data_dir)
    dec = date(2023, 12, 1)
    layout.database_path("events", dec).write_bytes(os.urandom(BIG))
    layout.database_path("news", dec).write_bytes(os.urandom(1000))
    return settings.dataset.data_dir


def _s3_settings(data_dir: Path, server: SeaweedS3, bucket: str, **overrides) -> Settings:
    return make_settings(
        data_dir=data_dir,
        release_uri=f"s3://{bucket}/mirai/v1",
        s3_endpoint_url=server.endpoint,
        s3_region="us-east-1",
        s3_max_attempts=2,
        release_multipart_threshold_mb=5,
        release_multipart_chunk_mb=5,
        release_concurrency=4,
        **overrides,
    )


def _publish(month: date, settings: Settings) -> PublishResult:
    """Publish to the store the settings name (MIRAI_RELEASE_URI), as `mirai publish` does."""
    store = open_store(settings.dataset, settings.network, settings.release)
    return publish_release(month, settings.dataset, settings.release, store)


def _source_bytes(data_dir: Path, month: date) -> dict[str, bytes]:
    """Release name → the bytes it was published from (a local file, or croissant.json's, made in memory)."""
    plan = plan_release(month, make_settings(data_dir=data_dir).dataset, ReleaseSettings())
    sources = {}
    for o in plan.objects:
        with o.open() as fh:
            sources[o.name] = fh.read()
    return sources


def _assert_identical(directory: Path, data_dir: Path, month: date, only_split: bool = False) -> None:
    sources = _source_bytes(data_dir, month)
    expected = {n for n in sources if not (only_split and n.startswith(("database/", "mirai/")))}
    got = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()} - {"manifest.json"}
    assert got == expected
    for name in expected:
        assert (directory / name).read_bytes() == sources[name], name


def _a_different_february(tmp_path: Path, data_dir: Path) -> Settings:
    """The same month rebuilt with another sample size: a different release for 2024-02."""
    copy = tmp_path / "other"
    shutil.copytree(data_dir, copy)
    # Without the random-bytes December: the split's MIRAI files (pipeline/splits/mirai_files.py) read
    # every database month up to February, and those bytes are no parquet file.
    layout = DataLayout(copy)
    for table in ("events", "news"):
        layout.database_path(table, date(2023, 12, 1)).unlink()
    settings = make_settings(data_dir=copy, split_sample_size=1)
    build_split(FEB, settings.dataset, settings.gdelt, now=AFTER_GRACE)
    return settings


# --- S3 (SeaweedFS) -----------------------------------------------------------------------------


def test_s3_publish_then_download_round_trip_is_byte_identical_and_republish_is_a_no_op(
    data_dir, s3_server, bucket, tmp_path
):
    settings = _s3_settings(data_dir, s3_server, bucket)
    store = open_store(settings.dataset, settings.network, settings.release)
    first = publish_release(JAN, settings.dataset, settings.release, store)
    second = publish_release(FEB, settings.dataset, settings.release, store)
    assert first.manifest_written and second.manifest_written and second.index_written and second.latest_written
    assert set(second.uploaded) == set(_source_bytes(data_dir, FEB))

    admin = s3_server.client()
    head = admin.head_object(Bucket=bucket, Key="mirai/v1/releases/2024-02/queries.parquet", ChecksumMode="ENABLED")
    assert head["ContentType"] == "application/vnd.apache.parquet"
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == head["Metadata"]["sha256"]
    big = admin.head_object(
        Bucket=bucket, Key="mirai/v1/releases/2024-02/database/events/month=2023-12.parquet", ChecksumMode="ENABLED"
    )
    assert big["ChecksumSHA256"].endswith("-3")  # multipart, every part SHA-256 checked by the server
    types = {
        k: admin.head_object(Bucket=bucket, Key=f"mirai/v1/{k}")["ContentType"]
        for k in (release_key("2024-02", "README.md"), release_key("2024-02", "relation_distribution.png"), LATEST_KEY)
    }
    assert types == {
        "releases/2024-02/README.md": "text/markdown; charset=utf-8",
        "releases/2024-02/relation_distribution.png": "image/png",
        LATEST_KEY: "application/json",
    }

    before = {o["Key"]: o["LastModified"] for o in admin.list_objects_v2(Bucket=bucket)["Contents"]}
    again = publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    assert not again.changed and again.uploaded == [] and len(again.verified) == len(second.uploaded)
    assert {o["Key"]: o["LastModified"] for o in admin.list_objects_v2(Bucket=bucket)["Contents"]} == before

    # Anonymous (unsigned) download of latest: byte-identical to what was published.
    anonymous = open_store(settings.dataset, settings.network, settings.release, signed=False)
    result = download_release(anonymous, "latest", tmp_path / "dl")
    assert result.release == "2024-02" and set(result.downloaded) == set(second.uploaded)
    _assert_identical(tmp_path / "dl" / "2024-02", data_dir, FEB)
    manifest_bytes = (tmp_path / "dl" / "2024-02" / "manifest.json").read_bytes()
    assert sha256_hex(manifest_bytes) == second.manifest_sha256

    # index.json: every release with its manifest's sha256 and its files' keys, relative to the
    # store's root: no endpoint (the demo's changes port at every start) and, with no
    # MIRAI_RELEASE_PUBLIC_URL, no absolute URL at all. Fetched anonymously from wherever it is served.
    raw_index = admin.get_object(Bucket=bucket, Key="mirai/v1/" + INDEX_KEY)["Body"].read()
    index = json.loads(raw_index)
    assert [(e["release"], e["manifest_sha256"]) for e in index["releases"]] == [
        ("2024-01", first.manifest_sha256),
        ("2024-02", second.manifest_sha256),
    ]
    assert b"127.0.0.1" not in raw_index and b"://" not in raw_index
    key = index["releases"][1]["files"]["queries.parquet"]
    assert (
        key == "releases/2024-02/queries.parquet"
        and index["releases"][1]["manifest"] == "releases/2024-02/manifest.json"
    )
    url = f"{s3_server.endpoint}/{bucket}/mirai/v1/{key}"
    assert urllib.request.urlopen(url).read() == (data_dir / "splits/2024-02/queries.parquet").read_bytes()

    # A second download finds everything verified and transfers nothing.
    assert download_release(anonymous, "2024-02", tmp_path / "dl").bytes_downloaded == 0


def test_s3_server_killed_mid_upload_then_the_next_run_completes_the_release(data_dir, s3_server, bucket, tmp_path):
    settings = _s3_settings(data_dir, s3_server, bucket)
    publish_release(
        JAN, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    admin = s3_server.client()
    latest_key = f"mirai/v1/{LATEST_KEY}"

    # Crash the server in the middle of the 3-part upload of the 12 MiB file: once 4 MiB are sent
    # (every other file of the release together is far smaller). Its other parts may still land
    # while the server dies, but not the CompleteMultipartUpload, sent after every part is done.
    sent = []

    def crash_mid_multipart(nbytes: int) -> None:
        sent.append(nbytes)
        if sum(sent) >= 4 * 2**20 and s3_server.process is not None:
            s3_server.stop(kill=True)

    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever a server killed mid-upload makes boto3 raise
            publish_release(
                FEB,
                settings.dataset,
                settings.release,
                open_store(settings.dataset, settings.network, settings.release),
                progress=crash_mid_multipart,
            )
    finally:
        s3_server.start()

    feb = "mirai/v1/releases/2024-02/"
    left = [o["Key"] for o in admin.list_objects_v2(Bucket=bucket, Prefix=feb).get("Contents", [])]
    assert f"{feb}database/events/month=2023-12.parquet" not in left  # it did stop mid-upload
    assert f"{feb}manifest.json" not in left  # at most half a release, not committed
    assert json.loads(admin.get_object(Bucket=bucket, Key=latest_key)["Body"].read())["release"] == "2024-01"
    assert [
        e["release"] for e in build_index(open_store(settings.dataset, settings.network, settings.release))["releases"]
    ] == ["2024-01"]
    with pytest.raises(Exception, match="not published"):
        download_release(
            open_store(settings.dataset, settings.network, settings.release, signed=False),
            "2024-02",
            tmp_path / "early",
        )

    done = publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    assert done.manifest_written
    assert set(done.verified) == {k.removeprefix(feb) for k in left}  # what landed is verified, not re-sent
    assert set(done.uploaded) | set(done.verified) == set(_source_bytes(data_dir, FEB))
    assert json.loads(admin.get_object(Bucket=bucket, Key=latest_key)["Body"].read())["release"] == "2024-02"
    download_release(
        open_store(settings.dataset, settings.network, settings.release, signed=False), "latest", tmp_path / "dl"
    )
    _assert_identical(tmp_path / "dl" / "2024-02", data_dir, FEB)


def test_s3_corrupted_object_makes_download_fail_loudly_and_keep_nothing(
    data_dir, s3_server, bucket, tmp_path, monkeypatch, capsys
):
    settings = _s3_settings(data_dir, s3_server, bucket)
    publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    # Bit rot (or tampering) behind the publisher's back: other bytes, the same sha256 metadata.
    key = "mirai/v1/releases/2024-02/queries.parquet"
    admin = s3_server.client()
    original = admin.head_object(Bucket=bucket, Key=key)
    admin.put_object(Bucket=bucket, Key=key, Body=b"PAR1 not the published bytes", Metadata=original["Metadata"])

    monkeypatch.setenv("MIRAI_S3_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("MIRAI_S3_REGION", "us-east-1")
    dest = tmp_path / "dl"
    code = main(["download", "2024-02", "--dest", str(dest), "--from", settings.release.uri, "--only", "split"])
    err = capsys.readouterr().err
    assert code == 3
    assert "checksum mismatch" in err and "queries.parquet" in err and "nothing was kept" in err
    month_dir = dest / "2024-02"
    assert not (month_dir / "queries.parquet").exists() and not (month_dir / "manifest.json").exists()
    assert not list(month_dir.glob(".*.part"))
    with pytest.raises(ChecksumMismatch):
        download_release(
            open_store(settings.dataset, settings.network, settings.release, signed=False), "latest", tmp_path / "again"
        )


def test_s3_bucket_holding_a_different_release_is_refused_and_not_overwritten(data_dir, s3_server, bucket, tmp_path):
    settings = _s3_settings(data_dir, s3_server, bucket)
    publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    admin = s3_server.client()
    before = {o["Key"]: (o["ETag"], o["LastModified"]) for o in admin.list_objects_v2(Bucket=bucket)["Contents"]}

    other = _a_different_february(tmp_path, data_dir)
    other_s3 = _s3_settings(other.dataset.data_dir, s3_server, bucket)
    with pytest.raises(ReleaseConflict, match="already holds a different release 2024-02"):
        publish_release(
            FEB, other_s3.dataset, other_s3.release, open_store(other_s3.dataset, other_s3.network, other_s3.release)
        )
    assert {
        o["Key"]: (o["ETag"], o["LastModified"]) for o in admin.list_objects_v2(Bucket=bucket)["Contents"]
    } == before


def test_s3_an_unpublished_key_with_other_bytes_is_refused_before_anything_is_written(data_dir, s3_server, bucket):
    settings = _s3_settings(data_dir, s3_server, bucket)
    admin = s3_server.client()
    key = "mirai/v1/releases/2024-02/queries.parquet"
    admin.put_object(Bucket=bucket, Key=key, Body=b"someone else's queries")
    with pytest.raises(ReleaseConflict, match=r"queries.parquet"):
        publish_release(
            FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
        )
    assert [o["Key"] for o in admin.list_objects_v2(Bucket=bucket)["Contents"]] == [key]


def test_s3_download_resumes_a_partial_file_with_a_range_request(data_dir, s3_server, bucket, tmp_path):
    settings = _s3_settings(data_dir, s3_server, bucket)
    publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    name = "database/events/month=2023-12.parquet"
    source = (DataLayout(data_dir).database_path("events", date(2023, 12, 1))).read_bytes()
    target = tmp_path / "dl" / "2024-02" / name
    target.parent.mkdir(parents=True)
    part = target.with_name(f".{target.name}.part")
    part.write_bytes(source[: BIG // 3])  # an interrupted earlier run

    store = open_store(settings.dataset, settings.network, settings.release, signed=False)
    result = download_release(store, "2024-02", tmp_path / "dl", only="database")
    assert target.read_bytes() == source and not part.exists()
    small = sum(
        len(data) for n, data in _source_bytes(data_dir, FEB).items() if n.startswith("database/") and n != name
    )
    assert result.bytes_downloaded == BIG - BIG // 3 + small

    # A partial file whose bytes went bad is discarded and fetched again from the start.
    target.unlink()
    part.write_bytes(b"garbage" + source[7 : BIG // 2])
    download_release(store, "2024-02", tmp_path / "dl", only="database")
    assert target.read_bytes() == source and not part.exists()


def test_release_asset_publishes_once_and_never_shows_credentials(data_dir, s3_server, bucket):
    from assets.release import release
    from assets.resources import resources_for

    # The run's ReleaseBucket resource points at the test's S3 server (credentials: the AWS chain).
    resources = resources_for(_s3_settings(data_dir, s3_server, bucket))
    with dg.instance_for_test() as instance:
        runs = [
            dg.materialize([release], partition_key="2024-02-01", instance=instance, resources=resources)
            for _ in range(2)
        ]
        text = "\n".join(str(e) for r in runs for e in r.all_events)
        text += "\n".join(entry.user_message for r in runs for entry in instance.all_logs(r.run_id))
    metas = [r.asset_materializations_for_node("release")[0].metadata for r in runs]
    assert metas[0]["published_now"].value is True and metas[0]["uploaded"].value > 0
    assert metas[1]["published_now"].value is False and metas[1]["uploaded"].value == 0
    assert metas[0]["store"].value == f"s3://{bucket}/mirai/v1 (endpoint {s3_server.endpoint})"
    # No link to the endpoint's port, which a restarted server no longer has (no public URL configured).
    assert metas[0]["manifest_key"].value == "releases/2024-02/manifest.json" and "manifest_url" not in metas[0]
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    # The split's 6 (card, 2 query sets, 3 figures), 6 database months, MIRAI's 9 files.
    assert "uploading 23 files" in text


# --- local directory store ----------------------------------------------------------------------


def test_local_store_is_the_default_and_round_trips(data_dir, tmp_path):
    assert (
        open_store(make_settings(data_dir=tmp_path).dataset, NetworkSettings(), ReleaseSettings()).root
        == (tmp_path / "releases-bucket").resolve()
    )
    settings = make_settings(data_dir=data_dir, release_uri=str(tmp_path / "bucket"))
    store = open_store(settings.dataset, settings.network, settings.release)
    assert isinstance(store, LocalStore)
    for month in (FEB, JAN):  # publishing an older month afterwards keeps latest at the newest
        publish_release(month, settings.dataset, settings.release, store)
    root = tmp_path / "bucket" / "releases"
    assert json.loads((root / "latest.json").read_text())["release"] == "2024-02"
    assert (root / "2024-02" / "queries.parquet").read_bytes() == (
        data_dir / "splits/2024-02/queries.parquet"
    ).read_bytes()
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert not publish_release(FEB, settings.dataset, settings.release, store).changed
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == mtimes
    assert not list(root.rglob("*.part"))

    result = download_release(store, "latest", tmp_path / "dl", only="split")
    _assert_identical(tmp_path / "dl" / "2024-02", data_dir, FEB, only_split=True)
    assert "README.md" in result.downloaded and not any(n.startswith("database/") for n in result.downloaded)
    entry = json.loads((root / "index.json").read_text())["releases"][0]
    assert entry["files"]["queries.parquet"] == "releases/2024-01/queries.parquet"
    assert "urls" not in entry and "manifest_url" not in entry  # no public base URL configured


def test_the_release_asset_links_the_manifest_only_at_the_configured_public_url(data_dir, tmp_path):
    """The UI's link to a release's manifest stays valid: the store key always, a URL only under
    MIRAI_RELEASE_PUBLIC_URL (before: the store's own address, a demo's S3 port gone after it)."""
    from assets.release import release
    from assets.resources import resources_for

    metas = []
    for public in ("", "https://data.example.org/mirai/"):
        settings = make_settings(data_dir=data_dir, release_uri=str(tmp_path / "bucket"), release_public_url=public)
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [release], partition_key="2024-02-01", instance=instance, resources=resources_for(settings)
            )
        metas.append(result.asset_materializations_for_node("release")[0].metadata)
    assert [m["manifest_key"].value for m in metas] == ["releases/2024-02/manifest.json"] * 2
    assert "manifest_url" not in metas[0]
    assert metas[1]["manifest_url"].value == "https://data.example.org/mirai/releases/2024-02/manifest.json"


def test_index_carries_absolute_urls_only_from_the_configured_public_url(data_dir, tmp_path):
    settings = make_settings(
        data_dir=data_dir, release_uri=str(tmp_path / "bucket"), release_public_url="https://data.example.org/mirai/"
    )
    _publish(FEB, settings)
    index = json.loads((tmp_path / "bucket" / INDEX_KEY).read_text())
    entry = index["releases"][0]
    assert entry["files"]["queries.parquet"] == "releases/2024-02/queries.parquet"
    assert entry["urls"]["queries.parquet"] == "https://data.example.org/mirai/releases/2024-02/queries.parquet"
    assert entry["manifest_url"] == "https://data.example.org/mirai/releases/2024-02/manifest.json"
    latest = json.loads((tmp_path / "bucket" / LATEST_KEY).read_text())
    assert latest["manifest_url"] == entry["manifest_url"] and "urls" not in latest and "files" not in latest


def test_manifests_and_cards_record_their_source(data_dir, tmp_path):
    """Issue 20: a demo release must not pass for a real one. A split built from GDELT records the
    base URL; one built from generated data says so in its manifests and its card's first lines."""
    settings = make_settings(data_dir=data_dir, release_uri=str(tmp_path / "bucket"))
    _publish(FEB, settings)
    gdelt = json.loads((tmp_path / "bucket/releases/2024-02/manifest.json").read_text())
    assert (
        gdelt["source"]
        == gdelt["split"]["source"]
        == {
            "generated": False,
            "gdelt_base_url": Settings().gdelt.base_url,
            "description": f"GDELT 2.0 event feed at {Settings().gdelt.base_url}",
        }
    )
    card_text = (tmp_path / "bucket/releases/2024-02/README.md").read_text()
    assert (
        "GENERATED" not in card_text
        and f"| source | GDELT 2.0 event feed at {Settings().gdelt.base_url} |" in card_text
    )

    demo = make_settings(
        data_dir=tmp_path / "demo",
        release_uri=str(tmp_path / "demo-bucket"),
        generated_source="generated mirror, seed 7",
    )
    _build(demo, FEB, QUADS)
    _publish(FEB, demo)
    manifest = json.loads((tmp_path / "demo-bucket/releases/2024-02/manifest.json").read_text())
    assert (
        manifest["source"]
        == manifest["split"]["source"]
        == {"generated": True, "description": "generated mirror, seed 7"}
    )
    first_lines = (tmp_path / "demo-bucket/releases/2024-02/README.md").read_text().splitlines()[:3]
    # The card's title line says it first, whatever quoting YAML needs for the colon.
    assert yaml.safe_load(first_lines[1]) == {
        "pretty_name": "MIRAI test split 2024-02 (GENERATED data, not GDELT: generated mirror, seed 7)"
    }
    card_text = (tmp_path / "demo-bucket/releases/2024-02/README.md").read_text()
    assert "# MIRAI test split 2024-02: GENERATED data, not GDELT" in card_text
    assert "> **Generated data, not GDELT.** Built from generated mirror, seed 7" in card_text


def test_local_store_refuses_a_different_release(data_dir, tmp_path):
    bucket = tmp_path / "bucket"
    _publish(FEB, make_settings(data_dir=data_dir, release_uri=str(bucket)))
    manifest = (bucket / "releases/2024-02/manifest.json").read_bytes()
    other = make_settings(_a_different_february(tmp_path, data_dir), release_uri=str(bucket))
    with pytest.raises(ReleaseConflict):
        _publish(FEB, other)
    assert (bucket / "releases/2024-02/manifest.json").read_bytes() == manifest
    sample = (bucket / "releases/2024-02/queries_sample.parquet").read_bytes()
    assert sample == (data_dir / "splits/2024-02/queries_sample.parquet").read_bytes()


def test_local_download_detects_a_corrupted_file(data_dir, tmp_path):
    bucket = tmp_path / "bucket"
    _publish(FEB, make_settings(data_dir=data_dir, release_uri=f"file://{bucket}"))
    card = bucket / "releases/2024-02/README.md"
    card.write_text("tampered")
    with pytest.raises(ChecksumMismatch, match=r"README.md"):
        download_release(LocalStore(bucket), "2024-02", tmp_path / "dl")
    assert not (tmp_path / "dl/2024-02/README.md").exists()


def test_cli_release_and_download(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIRAI_DATA_DIR", str(data_dir))
    monkeypatch.setenv("MIRAI_RELEASE_URI", str(tmp_path / "bucket"))
    assert main(["release", "--month", "2024-02"]) == 0
    assert "release 2024-02 published" in capsys.readouterr().out
    assert main(["release", "--month", "2024-02"]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert main(["download", "--dest", str(tmp_path / "dl")]) == 0
    assert "all sha256 verified" in capsys.readouterr().out
    _assert_identical(tmp_path / "dl" / "2024-02", data_dir, FEB)
    assert main(["download", "2023-07", "--dest", str(tmp_path / "dl")]) == 1
    assert "not published" in capsys.readouterr().err


def test_release_waits_for_the_split(tmp_path):
    with pytest.raises(ReleaseNotReady, match="materialise test_split first"):
        plan_release(FEB, make_settings(data_dir=tmp_path).dataset, ReleaseSettings())


def test_s3_store_description_and_urls_carry_no_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    aws = S3Store("mirai-bench", "/v1/", ReleaseSettings(s3_region="eu-west-1"), NetworkSettings())
    assert aws.description == "s3://mirai-bench/v1 (AWS eu-west-1)"
    assert aws.public_url("releases/2024-02/database/events/month=2024-02.parquet") == (
        "https://mirai-bench.s3.eu-west-1.amazonaws.com/v1/releases/2024-02/database/events/month=2024-02.parquet"
    )
    cdn = S3Store("b", "", ReleaseSettings(public_url="https://data.example.org/mirai/"), NetworkSettings())
    assert cdn.public_url(INDEX_KEY) == "https://data.example.org/mirai/releases/index.json"


def test_s3_rejects_bytes_that_changed_after_planning(data_dir, s3_server, bucket, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    settings = _s3_settings(copy, s3_server, bucket)
    plan = plan_release(FEB, settings.dataset, settings.release)
    big = DataLayout(copy).database_path("events", date(2023, 12, 1))
    big.write_bytes(os.urandom(BIG))  # same size, other bytes: only the checksums can tell
    with pytest.raises(ReleaseError, match="changed since it was hashed or its sha256 recorded"):
        publish_release(
            FEB,
            settings.dataset,
            settings.release,
            open_store(settings.dataset, settings.network, settings.release),
            plan=plan,
        )
    listed = s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert not [o for o in listed if "events/month=2023-12" in o["Key"] or o["Key"].endswith("manifest.json")]


def test_leaderboard_is_published_as_a_pointer_and_rewritten_only_when_it_changes(tmp_path):
    from pipeline.release.layout import LEADERBOARD_KEYS
    from pipeline.release.publish import publish_leaderboard
    from pipeline.release.store import LocalStore

    store = LocalStore(tmp_path / "bucket")
    board, chart, page = tmp_path / "leaderboard.parquet", tmp_path / "leaderboard.png", tmp_path / "leaderboard.html"
    board.write_bytes(b"board v1")
    chart.write_bytes(b"\x89PNG chart")
    page.write_bytes(b"<!DOCTYPE html>")
    assert publish_leaderboard(store, board, chart, page) == list(LEADERBOARD_KEYS.values())
    assert publish_leaderboard(store, board, chart, page) == []
    board.write_bytes(b"board v2")
    assert publish_leaderboard(store, board, chart, page) == [LEADERBOARD_KEYS["parquet"]]
    assert store.get_bytes(LEADERBOARD_KEYS["parquet"]) == b"board v2"


def test_s3_uploads_send_unsigned_payload_only_with_their_sha256_checksum(data_dir, s3_server, bucket):
    """Over plain HTTP botocore would SHA-256 every uploaded body for SigV4 on top of its
    x-amz-checksum-sha256; only bodies that carry that checksum may skip payload signing."""
    settings = _s3_settings(data_dir, s3_server, bucket)
    store = open_store(settings.dataset, settings.network, settings.release)
    sent = []

    def record(request, **kwargs):
        payload = request.headers.get("X-Amz-Content-SHA256")
        sent.append(
            (
                request.method,
                payload.decode() if isinstance(payload, bytes) else payload,
                "x-amz-checksum-sha256" in request.headers,
            )
        )

    for client in (store.client, store._checksummed):
        client.meta.events.register("before-send.s3", record)
    publish_release(FEB, settings.dataset, settings.release, store)
    puts = [s for s in sent if s[0] == "PUT"]
    assert len(puts) >= len(_source_bytes(data_dir, FEB)) + 2  # every file (a part each), manifest, pointers
    assert all(payload == "UNSIGNED-PAYLOAD" for _, payload, checksum in puts if checksum)
    assert all(checksum for _, payload, checksum in sent if payload == "UNSIGNED-PAYLOAD")
    completes = [s for s in sent if s[0] == "POST" and s[1] != "UNSIGNED-PAYLOAD"]
    assert completes  # CompleteMultipartUpload carries no checksum: its body stays signed


def test_s3_first_publish_uploads_files_while_later_ones_are_still_being_planned(
    data_dir, s3_server, bucket, monkeypatch
):
    """The last file's planning waits until a request of an earlier file has been sent: a publish
    that planned the whole release before uploading would never send it (and the wait fails)."""
    settings = _s3_settings(data_dir, s3_server, bucket)
    store = open_store(settings.dataset, settings.network, settings.release)
    last = release.release_sources(FEB, settings.dataset).files[-1].name
    uploading = threading.Event()
    store._checksummed.meta.events.register("before-send.s3.PutObject", lambda **kwargs: uploading.set())
    store._checksummed.meta.events.register("before-send.s3.UploadPart", lambda **kwargs: uploading.set())
    planned = release._planned

    def plan_last_after_an_upload(source, release_settings):
        if source.name == last:
            assert uploading.wait(timeout=60), "nothing was uploaded before the last file was planned"
        return planned(source, release_settings)

    monkeypatch.setattr(release, "_planned", plan_last_after_an_upload)
    result = publish_release(FEB, settings.dataset, settings.release, store)
    assert result.manifest_written and set(result.uploaded) == set(_source_bytes(data_dir, FEB))
    assert result.manifest_sha256 == sha256_hex(plan_release(FEB, settings.dataset, settings.release).manifest_bytes)


def test_s3_a_file_changed_right_after_it_was_hashed_is_rejected_by_its_part_checksums(
    data_dir, s3_server, bucket, tmp_path, monkeypatch
):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    settings = _s3_settings(copy, s3_server, bucket)
    big = DataLayout(copy).database_path("events", date(2023, 12, 1))
    planned = release._planned

    def rewrite_after_hashing(source, release_settings):
        obj = planned(source, release_settings)
        if source.path == big:
            big.write_bytes(os.urandom(BIG))  # same size, other bytes: only the part checksums can tell
        return obj

    monkeypatch.setattr(release, "_planned", rewrite_after_hashing)
    with pytest.raises(ReleaseError, match="changed since it was hashed or its sha256 recorded"):
        publish_release(
            FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
        )
    listed = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in listed if "events/month=2023-12" in k or k.endswith(("manifest.json", LATEST_KEY))]
    uploads = s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert not uploads  # the failed multipart upload was aborted


def test_a_publish_reads_only_the_files_whose_sha256_was_not_recorded(
    data_dir, s3_server, bucket, tmp_path, monkeypatch
):
    """The split's files (sha256 in its manifest) and the sealed database months go up with their
    recorded sha256 without being read to plan them; only the card and the unsealed December
    month are hashed (December, over the multipart threshold, part by part)."""
    settings = _s3_settings(data_dir, s3_server, bucket)
    hashed = []
    digest = release._digest
    monkeypatch.setattr(release, "_digest", lambda path, part_size: hashed.append(path) or digest(path, part_size))
    result = publish_release(
        FEB, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    layout = DataLayout(data_dir)
    assert sorted(hashed) == sorted(
        [
            layout.split_dir(FEB) / "README.md",
            layout.database_path("events", date(2023, 12, 1)),
            layout.database_path("news", date(2023, 12, 1)),
        ]
    )
    assert result.manifest_written and set(result.uploaded) == set(_source_bytes(data_dir, FEB))
    downloaded = download_release(
        open_store(settings.dataset, settings.network, settings.release), "2024-02", tmp_path / "dl", bar=False
    )
    _assert_identical(downloaded.directory, data_dir, FEB)


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_sealed_database_file_damaged_since_it_was_written_is_refused_by_the_store(
    data_dir, tmp_path, where, request
):
    """Same size, other bytes: the PUT's recorded sha256 makes S3 answer BadDigest (the local store
    compares while copying); nothing of the release is committed."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    damaged = DataLayout(copy).database_path("events", JAN)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    if where == "s3":
        s3_server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
        settings = _s3_settings(copy, s3_server, bucket)
    else:
        settings = make_settings(data_dir=copy, release_uri=str(tmp_path / "bucket"))
    store = open_store(settings.dataset, settings.network, settings.release)
    with pytest.raises(ReleaseNotReady, match="changed since it was hashed or its sha256 recorded"):
        publish_release(FEB, settings.dataset, settings.release, store)
    assert store.get_bytes(release_key("2024-02", "manifest.json")) is None and store.get_bytes(LATEST_KEY) is None
    assert store.stat(release_key("2024-02", "database/events/month=2024-01.parquet")) is None


def test_a_sealed_database_file_of_another_size_stops_the_publish_naming_its_digest(data_dir, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    with DataLayout(copy).database_path("news", JAN).open("ab") as fh:
        fh.write(b"appended")
    bucket = tmp_path / "bucket"
    with pytest.raises(ReleaseNotReady, match=r"no longer matches its digest .*digests/database/news/month=2024-01"):
        _publish(FEB, make_settings(data_dir=copy, release_uri=str(bucket)))
    assert not (bucket / "releases/2024-02/manifest.json").exists()


def test_a_split_file_changed_since_its_manifest_stops_the_publish_before_the_manifest(data_dir, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    (copy / "splits/2024-02/queries_sample.parquet").write_bytes(b"not the sample")
    bucket = tmp_path / "bucket"
    with pytest.raises(ReleaseNotReady, match="no longer matches its split manifest"):
        _publish(FEB, make_settings(data_dir=copy, release_uri=str(bucket)))
    assert not (bucket / "releases/2024-02/manifest.json").exists() and not (bucket / LATEST_KEY).exists()
    assert not list(bucket.rglob("database/*/*.parquet"))  # the split's files are checked first


def test_a_durable_download_starts_writing_each_file_to_disk_while_it_streams(data_dir, tmp_path, monkeypatch):
    """Writeback is started every WRITEBACK bytes so that the final fsyncs do not wait for whole
    files (a plain download never starts it). The ranges asked for follow each other."""
    from pipeline.release import download

    bucket = tmp_path / "bucket"
    _publish(FEB, make_settings(data_dir=data_dir, release_uri=str(bucket)))
    asked = []
    monkeypatch.setattr(download, "WRITEBACK", 4 * 2**20)
    monkeypatch.setattr(download.os, "posix_fadvise", lambda fd, offset, length, advice: asked.append((offset, length)))
    download_release(LocalStore(bucket), "2024-02", tmp_path / "plain", only="database", workers=1)
    assert asked == []
    download_release(LocalStore(bucket), "2024-02", tmp_path / "dl", only="database", workers=1, durable=True)
    assert asked == [(0, 4 * 2**20), (4 * 2**20, 4 * 2**20), (8 * 2**20, 4 * 2**20)]  # the 12 MiB file only
    name = "database/events/month=2023-12.parquet"
    assert (tmp_path / "dl/2024-02" / name).read_bytes() == DataLayout(data_dir).database_path(
        "events", date(2023, 12, 1)
    ).read_bytes()


def test_a_durable_download_fsyncs_every_file_and_directory_before_the_manifest(data_dir, tmp_path, monkeypatch):
    """With durable=True (mirai download --fsync), manifest.json means every selected file is
    verified and on disk; without it nothing waits for the disk."""
    from pipeline.release import download

    bucket = tmp_path / "bucket"
    _publish(FEB, make_settings(data_dir=data_dir, release_uri=str(bucket)))
    target = tmp_path / "dl/2024-02"
    synced, fsync = [], download._fsync
    monkeypatch.setattr(download, "_fsync", lambda path: (synced.append(path), fsync(path)))
    write = download.atomic_write_bytes

    def write_manifest(path, data):
        if path.parent == target:
            on_disk = set(target.rglob("*")) | {target, target.parent}
            assert on_disk <= set(synced), sorted(on_disk - set(synced))
        write(path, data)

    monkeypatch.setattr(download, "atomic_write_bytes", write_manifest)
    download_release(LocalStore(bucket), "2024-02", tmp_path / "plain", workers=3)
    assert synced == []
    result = download_release(LocalStore(bucket), "2024-02", tmp_path / "dl", workers=3, durable=True)
    assert (target / "manifest.json").exists() and len(result.downloaded) == sum(p.is_file() for p in synced) > 0


def test_the_progress_bar_counts_every_byte_from_many_threads_and_is_silent_off_a_terminal(capsys):
    """boto3 calls the bar from its transfer threads and every byte counts; on a terminal it draws
    bytes, percent and the current file; under capture (stderr not a TTY) the default draws nothing."""
    from pipeline.release.download import ProgressBar

    bar = ProgressBar(8 * 2000 * 1024, enabled=True)
    bar.file("releases/2024-02/queries.parquet")
    threads = [threading.Thread(target=lambda: [bar(1024) for _ in range(2000)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bar(-1024)  # a resumed file that starts over takes its bytes back
    bar(1024)
    bar.close()
    drawn = capsys.readouterr().err
    assert bar.bar.n == 8 * 2000 * 1024
    assert "100%" in drawn and "queries.parquet" in drawn and "15.6M/15.6M" in drawn
    silent = ProgressBar(1024)
    silent.file("x")
    silent(1024)
    silent.close()
    assert not silent.enabled and capsys.readouterr().err == ""


def test_the_s3_server_s_other_ports_are_not_on_the_host_s_network(s3_server, bucket):
    """Issue 30: SeaweedFS's master handed a write token to any caller of /dir/assign, its filer's
    gRPC and HTTP APIs took anyone's reads and writes. weed runs in a network namespace of its own:
    from the host, every port but S3 refuses the connection, and the filer's and gateway's Unix
    sockets sit in a directory no other user can enter. S3 works as before."""
    if s3_server.isolation.startswith("none"):
        pytest.skip(f"the kernel refused SeaweedFS a network namespace here: {s3_server.isolation}")
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="submissions/x/submission.json", Body=b'{"contact": "me@example.org"}')
    for name, port in s3_server.ports.items():
        if name != "s3":
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{s3_server.ports['master']}/dir/assign", timeout=5)
    assert stat.S_IMODE(s3_server.sockets.stat().st_mode) == 0o700
    # weed's gRPC sockets live in the host's /tmp whatever the namespace: only their owner may connect.
    grpc_sockets = [sock for port in s3_server.ports.values() for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
    assert grpc_sockets and all(stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0 for sock in grpc_sockets)
    if os.geteuid() == 0:  # as another user, under the loosest umask: no socket of weed's lets it in
        child = os.fork()
        if child == 0:
            try:
                os.umask(0)
                os.setgid(65534)
                os.setuid(65534)
                for sock in (s3_server.sockets / "filer.sock", *grpc_sockets):
                    try:
                        socket.socket(socket.AF_UNIX).connect(str(sock))
                        os._exit(1)
                    except PermissionError:
                        pass
                os._exit(0)
            except BaseException:
                os._exit(2)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert client.get_object(Bucket=bucket, Key="submissions/x/submission.json")["Body"].read().startswith(b"{")


def test_without_a_namespace_the_filer_and_volume_server_take_no_anonymous_read_or_write(tmp_path):
    """Where the kernel refuses the namespace, weed's ports are on the host's loopback: with its JWT
    keys, the filer and the volume server refuse reads and writes without a token (issue 30: a
    submission's contact was read through the filer; an object written under releases/ there was
    then served by S3)."""
    bucket = "jwt-guarded"
    with LocalS3(tmp_path / "s3", bucket, isolate=False) as s3_server:
        assert s3_server.isolation.startswith("none")
        client = s3_server.client()
        client.put_object(Bucket=bucket, Key="submissions/x/submission.json", Body=b'{"contact": "me@example.org"}')
        filer = f"http://127.0.0.1:{s3_server.ports['filer']}/buckets/{bucket}"
        assert requests.get(f"{filer}/submissions/x/submission.json", timeout=10).status_code == 401
        listing = requests.get(f"{filer}/submissions/x/", headers={"Accept": "application/json"}, timeout=10)
        assert listing.status_code == 401
        assert requests.put(f"{filer}/releases/planted.txt", data=b"planted", timeout=10).status_code == 401
        with pytest.raises(client.exceptions.NoSuchKey):
            client.get_object(Bucket=bucket, Key="releases/planted.txt")
        # A file id of a volume the bucket has (the master's /dir/assign names none to a stranger:
        # test_without_a_namespace_no_stranger_reaches_the_master_or_the_grpc_apis).
        volume = f"http://127.0.0.1:{s3_server.ports['volume']}/1,01637037d6"
        assert requests.post(volume, files={"file": ("x", b"blob")}, timeout=10).status_code == 401
        assert requests.get(volume, timeout=10).status_code == 401
        volume_ui = f"http://127.0.0.1:{s3_server.ports['volume']}/ui/index.html"
        assert requests.get(volume_ui, timeout=10).status_code == 401
        assert client.get_object(Bucket=bucket, Key="submissions/x/submission.json")["Body"].read().startswith(b"{")


def _weed_shell(s3_server: LocalS3, commands: str) -> str:
    """``commands`` run by `weed shell` as a stranger on the host runs it: with no certificate, only
    the master's and the filer's host:port.grpc_port (what the shell reaches them by)."""
    import subprocess

    from testbed.s3 import weed_binary

    p = s3_server.ports
    try:
        done = subprocess.run(
            [
                weed_binary(),
                "shell",
                f"-master=127.0.0.1:{p['master']}.{p['master_grpc']}",
                f"-filer=127.0.0.1:{p['filer']}.{p['filer_grpc']}",
            ],
            input=commands,
            capture_output=True,
            text=True,
            timeout=10,
            env={k: v for k, v in os.environ.items() if not k.startswith("WEED_")},
        )
    except subprocess.TimeoutExpired as exc:  # it never connected
        return (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
    return done.stdout + done.stderr


def _master_token(s3_server: LocalS3, query: str) -> str | None:
    """The volume-server JWT the master's HTTP API hands out for ``query`` (/dir/assign, /dir/lookup),
    or None when it hands none to a stranger (plain HTTP or TLS without its CA's certificate)."""
    for scheme in ("http", "https"):
        try:
            answer = requests.get(f"{scheme}://127.0.0.1:{s3_server.ports['master']}/{query}", timeout=10, verify=False)
        except requests.ConnectionError:
            continue
        if answer.headers.get("Authorization"):
            return answer.headers["Authorization"]
    return None


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # a stranger checks no certificate
def test_without_a_namespace_no_stranger_reaches_the_master_or_the_grpc_apis(tmp_path):
    """Where the kernel refuses the namespace, the JWT keys alone did not hold: the filer's gRPC API
    (`weed shell`) named a submission's volume file id, the master's /dir/lookup gave anyone the
    volume server's read token for it (so a contact address was read) and its write token (so the
    object was overwritten), the filer's gRPC removed a release's object, and the master's
    /col/delete dropped the bucket's every volume. With mutual TLS on every gRPC port and on the
    master's HTTP API (testbed/s3.py), a peer without the CA's certificate gets none of that."""
    bucket = "mtls-guarded"
    with LocalS3(tmp_path / "s3", bucket, isolate=False) as s3_server:
        client = s3_server.client()
        contact = b'{"contact": "me@example.org"}'
        client.put_object(Bucket=bucket, Key="submissions/x/submission.json", Body=contact)
        client.put_object(Bucket=bucket, Key="releases/latest.json", Body=b'{"release": "2024-01"}')
        meta = _weed_shell(s3_server, f"fs.meta.cat /buckets/{bucket}/submissions/x/submission.json\n")
        fids = [line.split('"')[3] for line in meta.splitlines() if '"fileId"' in line]
        for fid in fids:  # what the filer named: read and write tokens for it, from the master
            read = _master_token(s3_server, f"dir/lookup?fileId={fid}&read=yes")
            volume = f"http://127.0.0.1:{s3_server.ports['volume']}/{fid}"
            assert (
                read is None or contact not in requests.get(volume, headers={"Authorization": read}, timeout=10).content
            )
        assert _master_token(s3_server, "dir/assign") is None
        assert _master_token(s3_server, "dir/lookup?fileId=1,01637037d6") is None
        _weed_shell(s3_server, f"fs.rm /buckets/{bucket}/releases/latest.json\n")
        for scheme in ("http", "https"):
            try:
                requests.get(
                    f"{scheme}://127.0.0.1:{s3_server.ports['master']}/col/delete?collection={bucket}",
                    timeout=10,
                    verify=False,
                )
            except requests.ConnectionError:
                pass
        assert client.get_object(Bucket=bucket, Key="submissions/x/submission.json")["Body"].read() == contact
        assert client.get_object(Bucket=bucket, Key="releases/latest.json")["Body"].read() == b'{"release": "2024-01"}'


def test_an_internal_port_taken_before_the_relay_holds_it_is_chosen_again(tmp_path):
    """The internal ports are chosen free, then held by the relay a moment later: something may
    bind one in between (a CI run saw it: "weed exited with 1"). The server starts with others."""
    server = LocalS3(tmp_path / "s3", "port-race")
    taken = server.ports["master"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        with server:
            assert server.ports["master"] != taken
            assert server.client().list_buckets()["Buckets"][0]["Name"] == "port-race"
    assert f"port {taken} is taken" in (tmp_path / "s3" / "weed.log").read_text()
