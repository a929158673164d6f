"""kill -9 during each stage, then re-run: the result equals an uninterrupted run's.

One clean run of every stage (ingestion, normalisation, article fetching, split build, release)
is made first, with a copy of the data directory before each stage. Each case starts from that
copy, kills the stage at a seeded point, re-runs it to the end and compares every file with the
clean run (helpers.assert_same_data says which bytes may differ and why). Kill points are either
exact (the process kills itself before its N-th commit, driver.py) or external (we SIGKILL it once
the data directory holds k new files, with the server slowed so the kill lands mid-stage).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.mirror.generate import MirrorOptions, generate_mirror, news_sites
from pipeline.mirror.news import NewsServer
from pipeline.mirror.serve import MirrorServer

from ..month_builder import write_month
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
            data_dir, self.mirror.base_url,
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
    generate_mirror(base / "mirror", D1, D2, seed=11, slots=SLOTS,
                    options=MirrorOptions(event_scale=0.1, stories_per_day=4, url_scheme="http"))
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
        write_month(Settings(data_dir=month), FEB, QUADS)
        before = _snapshot(month, base / "before-split")
        commits = must_finish(w.env(month), "split", FEB.isoformat(), AFTER_GRACE)
        w.cases["split"] = Case("split", (FEB.isoformat(), AFTER_GRACE), before, _snapshot(month, base / "after-split"), commits)
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


def _kill_and_rerun(world: World, case: Case, tmp_path: Path, *, kill_at=None, kill_when=None,
                    data: Path | None = None) -> tuple[Path, list[str]]:
    data = data or _snapshot(case.before, tmp_path / "data")
    args = case.args
    store = None
    if case.stage == "release":
        store = tmp_path / "store"
        args = (*args, str(store))
    killed = run_stage(world.env(data), case.stage, *args, kill_at=kill_at,
                       kill_when=(lambda: kill_when(data)) if kill_when else None)
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
