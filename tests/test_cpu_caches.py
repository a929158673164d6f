"""The cache sweep of a backward handover (pipeline/agent_api/cpu_caches.py): sized from what
sysfs says each CPU caches, run on every CPU the process may use, affinity restored. What it
removes is measured by bench/cache_residue.py, not timed here."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.agent_api import cpu_caches


def fake_cpu(root: Path, cpu: int, caches: list[tuple[str, str]]) -> None:
    for index, (kind, size) in enumerate(caches):
        directory = root / f"cpu{cpu}" / "cache" / f"index{index}"
        directory.mkdir(parents=True)
        (directory / "type").write_text(kind + "\n")
        (directory / "size").write_text(size + "\n")
        (directory / "coherency_line_size").write_text("64\n")


def test_a_cpu_s_caches_are_its_data_and_unified_ones(tmp_path):
    fake_cpu(tmp_path, 0, [("Data", "32K"), ("Instruction", "32K"), ("Unified", "512K"), ("Unified", "32768K")])
    assert cpu_caches.visible_cache_bytes(0, tmp_path) == (32 + 512 + 32768) << 10
    assert cpu_caches.visible_cache_bytes(1, tmp_path) == 0  # not listed
    assert cpu_caches.line_bytes(tmp_path) == 64
    assert cpu_caches._bytes("2M") == 2 << 20


def test_the_sweep_runs_on_every_allowed_cpu_and_gives_the_thread_its_affinity_back(tmp_path, monkeypatch):
    fake_cpu(tmp_path, 0, [("Unified", "64K")])
    allowed = os.sched_getaffinity(0)
    pinned = []
    real = os.sched_setaffinity

    def record(pid, cpus):
        pinned.append(set(cpus))
        real(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", record)
    cpu_caches.sweep_cpu_caches(tmp_path)
    assert pinned == [{cpu} for cpu in sorted(allowed)] + [allowed]
    assert os.sched_getaffinity(0) == allowed
