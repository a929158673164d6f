"""Shared fixtures: a generated GDELT mirror served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest

from pipeline.config import Settings

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures"
MIRROR_DAY = date(2024, 1, 1)


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
    return Settings(
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
