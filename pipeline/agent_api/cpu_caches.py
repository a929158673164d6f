"""Sweeping the CPU caches before a sandbox of an earlier cutoff runs (cutoff_gate.py).

A sandbox that ends leaves lines it loaded in the CPU's caches: the pages of every file that
sandboxes map alike (the Python executable, the libraries, the table parts) are the same physical
memory, so a later sandbox that times its own loads of those lines learns which ones the earlier
sandbox touched (Flush+Reload, Yarom and Falkner, USENIX Security 2014). From a later cutoff to an
earlier one that is a channel from the future: the gate sweeps the caches at every such handover,
by reading a buffer twice the size of every cache each CPU sees, once on each CPU the process may
run on (the private L1 and L2 of a core are not reached from another core).
bench/cache_residue.py measures what a sender's lines still tell a receiver with and without it.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

CPU_ROOT = Path("/sys/devices/system/cpu")
# Where sysfs does not say (some containers hide it): a guess larger than most machines' caches
# per core complex (32 MiB L3 + 1 MiB L2 per core on AMD EPYC; up to 4 MiB of L3 per core on Xeon).
FALLBACK_CACHE_BYTES = 64 << 20
FALLBACK_LINE_BYTES = 64
# Twice the caches, read twice: replacement policies that keep a line recently hit (RRIP and its
# kin) give it up only to lines hit as often.
SIZE_FACTOR = 2
PASSES = 2


def _bytes(text: str) -> int:
    """sysfs's cache size ("32K", "1M")."""
    text = text.strip()
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * unit


def visible_cache_bytes(cpu: int, root: Path = CPU_ROOT) -> int:
    """Every data or unified cache ``cpu`` loads through (its own and the ones it shares), in bytes;
    0 when sysfs does not list them."""
    total = 0
    for index in (root / f"cpu{cpu}" / "cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            total += _bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
    return total


def line_bytes(root: Path = CPU_ROOT) -> int:
    """The smallest coherency line any cache of CPU 0 has (every line of the buffer is read)."""
    sizes = []
    for path in (root / "cpu0" / "cache").glob("index*/coherency_line_size"):
        try:
            sizes.append(int(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(sizes, default=FALLBACK_LINE_BYTES)


def sweep_cpu_caches(root: Path = CPU_ROOT) -> float:
    """Read a buffer of SIZE_FACTOR times the caches each CPU sees, PASSES times on every CPU this
    process may use, so that no line an earlier process loaded is left in them. Returns the
    seconds it took. The calling thread's CPU affinity is restored."""
    started = time.monotonic()
    cpus = sorted(os.sched_getaffinity(0))
    size = SIZE_FACTOR * (max(visible_cache_bytes(cpu, root) for cpu in cpus) or FALLBACK_CACHE_BYTES)
    step = line_bytes(root)
    # Anonymous memory, written once so that every page is a page of its own (untouched pages all
    # map the one zero page, and reading them would sweep nothing).
    with mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as buffer:
        view = memoryview(buffer)
        try:
            view[:: mmap.PAGESIZE] = b"\x01" * len(range(0, size, mmap.PAGESIZE))
            affinity = os.sched_getaffinity(0)
            try:
                for cpu in cpus:
                    os.sched_setaffinity(0, {cpu})  # this thread only, and it moves at once
                    for _ in range(PASSES):
                        bytes(view[::step])  # one load of every line
            finally:
                os.sched_setaffinity(0, affinity)
        finally:
            view.release()
    return time.monotonic() - started
