"""How the gated tables reach a sandbox child (issue 18): Arrow files written once per cutoff and
handed to the child as read-only descriptors it maps (pipeline/agent_api/table_files.py).

The files must hold nothing after their cutoff, be written once and atomically however many
episodes ask at once, and give agent code that owns the interpreter (the bypass of
test_sandbox_attacks.py) no way to write to them, to reach another cutoff's file, or to keep a
descriptor it could read later rows through.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import sys
import threading
import zlib
from datetime import date, timedelta

import polars as pl
import pytest

from pipeline.agent_api import Environment, EventDatabase
from pipeline.agent_api.audit import leakage_violations
from pipeline.agent_api.lockdown import SECCOMP_ARCHES, machine
from pipeline.agent_api.sandbox import SandboxError
from pipeline.agent_api.table_files import TableFiles
from testbed.database import generate_event_database
from tests.test_sandbox_attacks import BYPASS, NUMBERS

sandboxed = pytest.mark.skipif(
    sys.platform != "linux" or machine() not in SECCOMP_ARCHES,
    reason=f"the sandbox's OS layer is built for Linux {', '.join(SECCOMP_ARCHES)}",
)
QUERY = date(2023, 12, 10)  # cutoff 2023-12-09: November whole, December up to the 9th


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("table-files-db")
    generate_event_database(root, date(2023, 11, 1), 2, seed=9, quads_per_day=20)
    database = EventDatabase(root)
    yield database
    database.table_files.close()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_each_cutoffs_files_hold_exactly_its_gated_rows(db):
    for cutoff in (date(2023, 10, 30), date(2023, 11, 1), date(2023, 11, 30), date(2023, 12, 9), date(2024, 1, 5)):
        parts = db.gated_files(cutoff)
        events = pl.concat([pl.read_ipc(e) for e, _ in parts])
        news = pl.concat([pl.read_ipc(n) for _, n in parts])
        gated_events, gated_news = db.gated_tables(cutoff)
        assert events.equals(gated_events) and news.equals(gated_news), cutoff
        # The part of the cutoff's own month is cut at the cutoff: no file for it holds a later row.
        for path in parts[-1]:
            assert (pl.read_ipc(path).get_column("date") <= cutoff).all(), (cutoff, path.name)
    # A complete month is one file shared by every later cutoff; files are read-only, the directory private.
    assert db.gated_files(date(2023, 12, 9))[0] == db.gated_files(date(2023, 12, 20))[0]
    assert stat.S_IMODE(db.table_files.directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in db.table_files.directory.iterdir()} == {0o400}
    assert not list(db.table_files.directory.glob(".*"))  # no partial file left behind


def test_concurrent_askers_of_one_part_get_one_write(tmp_path):
    files = TableFiles()
    builds, barrier = [], threading.Barrier(8)
    frame = pl.DataFrame({"date": [date(2023, 1, 1)]})

    def build():
        builds.append(1)
        return frame, frame

    def ask(out):
        barrier.wait()
        out.append(files.part("p", build))

    results: list = []
    threads = [threading.Thread(target=ask, args=(results,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(set(results)) == 1
    directory = files.directory
    files.close()
    assert not directory.exists()
    with pytest.raises(ValueError):
        TableFiles().part("../escape", build)


def test_the_audit_reads_the_files_the_child_maps(db):
    """An environment whose in-memory tables are gated but whose table files are not (the full
    database) is caught twice: by the files themselves and by the child's own tables."""
    cutoff = QUERY - timedelta(days=1)
    events, news = db.gated_tables(cutoff)
    leaky = Environment(
        events,
        news,
        start=db.start,
        cutoff=cutoff,
        query_date=QUERY,
        distance_days=1,
        table_files=lambda: db.gated_files(db.last_day),
    )
    try:
        violations = leakage_violations(leaky)
    finally:
        leaky.close()
    assert any(v.startswith("the table file upto=") for v in violations), violations
    assert any(v.startswith("sandbox tables") for v in violations), violations
    assert not any("events table holds" in v for v in violations)


# Agent code with the guards off: every descriptor number the child could hold is probed with raw
# syscalls (lseek finds regular files, read shows what they are, write tries to change them), then
# every mapping of a table file (sandbox_child.MAPPINGS) is asked to become
# writable with mprotect, and a shared writable mapping of it is asked for with mmap.
PROBE = (
    BYPASS
    + """
_json = _B['__import__']('json')
_pa = _sys.modules['pyarrow']
_crc32 = _B['__import__']('binascii').crc32
_libc.lseek.restype = _ctypes.c_long
_libc.read.restype = _libc.write.restype = _ctypes.c_long
_libc.mprotect.restype = _ctypes.c_int
_libc.mmap.restype = _ctypes.c_void_p
_report = {'regular': {}, 'written': [], 'mprotect': [], 'mmap': []}
for _fd in range(3, 4096):
    if _libc.lseek(_fd, _ctypes.c_long(0), 0) != 0:
        continue
    _buf = _ctypes.create_string_buffer(1 << 24)
    _n = _libc.read(_fd, _buf, 1 << 24)
    _report['regular'][_fd] = [_buf.raw[:6].hex() if _n > 0 else '', _crc32(_buf.raw[: max(_n, 0)])]
    if _libc.write(_fd, b'MIRAI', 5) > 0:
        _report['written'].append(_fd)
for _m in _sys.modules['__main__'].MAPPINGS:
    _page = _pa.py_buffer(_m).address & ~4095
    _ctypes.set_errno(0)
    _report['mprotect'].append((_libc.mprotect(_ctypes.c_void_p(_page), 4096, 3), _ctypes.get_errno()))
for _fd in range(3, 64):
    _ctypes.set_errno(0)
    _addr = _libc.mmap(None, 4096, 3, 1, _fd, _ctypes.c_long(0))
    _report['mmap'].append((_addr not in (None, 2**64 - 1), _ctypes.get_errno()))
print(_json.dumps(_report))
"""
)


@sandboxed
def test_agent_code_can_neither_write_the_files_nor_reach_another_cutoffs(db):
    env = db.environment(QUERY)
    later = db.gated_files(date(2023, 12, 31))  # another cutoff's files exist on disk meanwhile
    files = sorted({p for part in env.table_files() + later for p in part})
    before = {p: _sha(p) for p in files}
    try:
        expected = env.count_events()
        out = env.run_code(PROBE)
        assert "guards off" in out, out
        report = json.loads(out.splitlines()[-1])
        # The only table files open in the child are its own parts (CPython's mmap keeps a
        # read-only duplicate of each mapped descriptor, Modules/mmapmodule.c); no other cutoff's
        # file, not the later part of the same month. (Other regular files: /dev/null copies.)
        own = {zlib.crc32(p.read_bytes()) for part in env.table_files() for p in part}
        arrow = [crc for head, crc in report["regular"].values() if head == "4152524f5731"]  # "ARROW1"
        assert arrow and set(arrow) <= own, report
        assert report["written"] == [], report
        # The child maps one events and one news file per part; none can be made writable.
        assert len(report["mprotect"]) == 2 * len(env.table_files()), report
        assert all(rc == -1 for rc, _ in report["mprotect"]), report
        assert not any(ok for ok, _ in report["mmap"]), report
        # Nor opened by path: the cache directory does not exist for the child.
        openat = NUMBERS["openat"][SECCOMP_ARCHES.index(machine())]
        opened = env.run_code(
            f"print(_libc.syscall({openat}, -100, {str(files[-1]).encode()!r}, 0, 0), _ctypes.get_errno())"
        )
        assert opened.split()[0] == "-1", opened
        # The child still answers from its own cutoff's rows, the files are unchanged.
        assert env.run_code("print(count_events(), max(e.date.date for e in get_events()))").split() == [
            str(expected),
            str(env.cutoff),
        ]
    finally:
        env.close()
    assert {p: _sha(p) for p in files} == before


@sandboxed
def test_table_files_that_cannot_be_written_are_a_sandbox_error_leaving_no_descriptor(db):
    """A full temp dir (ENOSPC from the second part's write, the first part already open) refuses
    the code block with a clear SandboxError and closes what was opened."""
    cutoff = QUERY - timedelta(days=1)
    events, news = db.gated_tables(cutoff)
    first = db.gated_files(cutoff)[0]

    def full_disk():
        yield first
        raise OSError(errno.ENOSPC, "No space left on device")

    env = Environment(
        events, news, start=db.start, cutoff=cutoff, query_date=QUERY, distance_days=1, table_files=lambda: full_disk()
    )
    open_before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(SandboxError, match=r"table files could not be prepared: .*No space left"):
        env.run_code("1")
    assert sorted(os.listdir("/proc/self/fd")) == open_before
    env.close()
