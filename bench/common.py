"""What every benchmark prints and measures the same way: the machine, and a process's own peak
RSS. Linux carries ``ru_maxrss`` across fork and exec, so a worker subprocess would report its
parent's peak; ``VmHWM`` belongs to the address space exec created."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path


def own_peak_rss_mib() -> float:
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine(libraries: dict[str, str]) -> str:
    """CPU model, cores, memory, OS, Python and the given library versions."""
    cpuinfo = Path("/proc/cpuinfo")
    models = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    meminfo = Path("/proc/meminfo")
    mem = (
        next(
            (int(line.split()[1]) / 2**20 for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")),
            0.0,
        )
        if meminfo.exists()
        else 0.0
    )
    versions = ", ".join(f"{name} {version}" for name, version in libraries.items())
    return (
        f"{models[0] if models else platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}, {versions}"
    )
