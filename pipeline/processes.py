"""Whether a process of this machine is still the one that was started: for telling a run whose
worker was killed (SIGKILL, the OOM killer) from one that is still working (sensors/run_health.py).

A pid alone does not say it: a killed worker's pid can be reused by any later process, and a killed
child stays a zombie until its parent reaps it. proc(5) gives a live process's state and its start
time in clock ticks after boot (/proc/<pid>/stat, fields 3 and 22) and the boot time (/proc/stat,
btime).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

# /proc/<pid>/stat states of a process that will never run again (proc(5)): zombie, dead.
GONE_STATES = frozenset("ZXx")


def boot_time() -> datetime:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return datetime.fromtimestamp(int(line.split()[1]), UTC)
    raise OSError("no btime in /proc/stat")


def process_started_at(pid: int) -> datetime | None:
    """When process ``pid`` started, or None when there is no such process or it has exited (a
    zombie). Raises OSError where there is no /proc to ask."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in GONE_STATES:
        return None
    ticks = int(fields[19])
    return boot_time() + timedelta(seconds=ticks / os.sysconf("SC_CLK_TCK"))


def still_running(pid: int, seen_at: datetime, slack: timedelta = timedelta(seconds=2)) -> bool:
    """True while ``pid`` is the live process that was already running at ``seen_at`` (a process
    started later under the same pid is another one). ``slack`` covers the tick rounding of start
    times and a clock that moved a little."""
    started = process_started_at(pid)
    return started is not None and started <= seen_at + slack
