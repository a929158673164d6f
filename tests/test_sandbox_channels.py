"""Two sandboxes running at once are adversaries too (issue 30): an episode with a late cutoff must
not be able to pass what it sees to one with an early cutoff through a kernel object they share.

Each test switches the Python-level guards off in both sandboxes first (test_sandbox_attacks.py's
BYPASS) and then does the attack with raw syscalls, as agent code that owns the interpreter would.
The first layer is the cutoff gate (pipeline/agent_api/cutoff_gate.py): a sandbox of one cutoff
does not exist, stopped or running, while one of another cutoff runs, so no contention channel (CPU
time, a kernel lock through a mapped file) and no kernel state a sandbox keeps (its mappings in a
shared file's tree) carries a bit. Between its blocks a sandbox is stopped, even one that answers its
block early and tries to run on. The other tests give each sandbox a gate of its own, to attack the
kernel layers alone:
- a futex on a page both map from the same file (libc's text): a shared futex is keyed by (inode,
  offset), so the late sandbox's wake would reach the early one's wait;
- the page cache of the table files every sandbox maps: MADV_PAGEOUT and MADV_COLD would drop a
  sibling's (and every later episode's) table pages, a channel that outlives the sandbox. The
  kernel honours them only for the file's owner, so the files belong to no sandbox's uid either.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import pytest

from pipeline.agent_api import EventDatabase, cutoff_gate, lockdown
from pipeline.agent_api.cutoff_gate import CutoffGate
from pipeline.agent_api.table_files import table_owner
from testbed.database import generate_event_database

from .test_sandbox_attacks import BYPASS, _nr, pytestmark  # noqa: F401 (the same platform skip)

EARLY, LATE = date(2023, 12, 5), date(2023, 12, 20)


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    root = tmp_path_factory.mktemp("channel-db")
    generate_event_database(root, date(2023, 11, 1), 2, seed=11, quads_per_day=20)
    return EventDatabase(root)


def started(env, gate: CutoffGate):
    """``env`` with its sandbox started under ``gate`` and the Python guards off."""
    with pytest.MonkeyPatch.context() as patch:  # a Sandbox takes the module's gate when it is made
        patch.setattr(cutoff_gate, "CUTOFF_GATE", gate)
        assert env.run_code(BYPASS).strip() == "guards off"
    return env


@pytest.fixture
def early_and_late(database, tmp_path):
    """Each under a gate of its own: what the kernel layers alone allow two sandboxes running at once."""
    early, late = database.environment(EARLY), database.environment(LATE)
    try:
        yield started(early, CutoffGate(tmp_path / "early")), started(late, CutoffGate(tmp_path / "late"))
    finally:
        early.close()
        late.close()


@pytest.fixture
def late(database, tmp_path):
    """One late sandbox under a gate of its own, for the tests of what it may do between blocks."""
    env = database.environment(LATE)
    try:
        yield started(env, CutoffGate(tmp_path / "gate"))
    finally:
        env.close()


SLEEP_AND_SAY_WHEN = """
_t = _sys.modules['time']
_start = _t.monotonic()
_t.sleep(0.6)
print(_start, _t.monotonic())
"""


def test_episodes_of_different_cutoffs_never_overlap(database, tmp_path):
    """Two episodes of the early cutoff and one of the late start together under one gate, as on a
    machine: from its first block until its sandbox is closed an episode never overlaps one of
    another cutoff (each early one waits 0.5 s between its block and its close, where the late
    one's block fitted while the gate was held for a block only), and the early ones overlap."""
    gate, spans = CutoffGate(tmp_path / "gate", handover_grid_s=0), {}  # a late-first order hands back at once

    def episode(i: int, cutoff: date) -> None:
        env = started(database.environment(cutoff), gate)
        try:
            start, _ = map(float, env.run_code(SLEEP_AND_SAY_WHEN, timeout_s=60).split())
            time.sleep(0.5)
        finally:
            env.close()
        spans[i] = (cutoff, start, time.monotonic())

    threads = [threading.Thread(target=episode, args=(i, c)) for i, c in enumerate((EARLY, EARLY, LATE))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(spans) == 3, spans

    def overlap(a, b):
        return spans[a][1] < spans[b][2] and spans[b][1] < spans[a][2]

    assert not overlap(0, 2) and not overlap(1, 2), spans
    # Which cutoff got the gate first is the scheduler's choice; the two early ones ran together
    # unless the late one came between them.
    if not spans[0][1] < spans[2][1] < spans[1][1] and not spans[1][1] < spans[2][1] < spans[0][1]:
        assert overlap(0, 1), spans


# The sender of the fourth re-attack of issue 30: it splits its mapping of a table part (a file an
# early sandbox maps too) into one mapping a page, which stays in the file's tree of mappings while
# the sandbox is stopped and would make the early sandbox's own splits slower.
SPLIT_A_SHARED_FILE = """
_gc = _B['__import__']('gc')
_pa = _sys.modules['pyarrow']
_m = max((m for m in _gc.get_objects() if type(m).__name__ == 'mmap'), key=len)
_address, _splits = _pa.py_buffer(_m).address, 0
for _page in range(0, len(_m) // 4096, 2):
    _splits += _libc.syscall(_ctypes.c_long(MADVISE), _ctypes.c_long(_address + 4096 * _page), _ctypes.c_long(4096), _ctypes.c_long(1)) == 0
print(_splits)
"""


def mappings(pid: int) -> int:
    return len(Path(f"/proc/{pid}/maps").read_text().splitlines())


def test_an_early_episode_runs_only_once_a_late_sandbox_and_its_mappings_are_gone(database, tmp_path):
    gate = CutoffGate(tmp_path / "gate", handover_grid_s=0)  # the grid is tests/test_cutoff_gate.py's
    late = started(database.environment(LATE), gate)
    early = database.environment(EARLY)
    try:
        pid = late._sandbox._child.sandbox.pid
        before = mappings(pid)
        splits = int(late.run_code(f"MADVISE = {_nr('madvise')}\n" + SPLIT_A_SHARED_FILE, timeout_s=60))
        assert splits >= 20 and mappings(pid) >= before + splits, (before, splits, mappings(pid))
        early_block = {}

        def run_early() -> None:
            started(early, gate)
            early_block["start"] = float(early.run_code(SLEEP_AND_SAY_WHEN, timeout_s=60).split()[0])

        thread = threading.Thread(target=run_early)
        thread.start()
        time.sleep(1.0)
        assert "start" not in early_block, "the early episode ran beside a stopped late sandbox"
        late.close()
        closed = time.monotonic()
        assert not Path(f"/proc/{pid}").exists()  # its mappings went with it, before the gate opened
        thread.join(60)
        assert early_block["start"] > closed, (early_block, closed)
    finally:
        late.close()
        early.close()


def frame(obj: str) -> str:
    """Agent code that writes one protocol message (4-byte length, JSON) to the sandbox's stdout."""
    return (
        f"_b = _sys.modules['json'].dumps({obj}).encode()\n"
        "_m = len(_b).to_bytes(4, 'big') + _b\n"
        "_libc.write(1, _m, len(_m))\n"
    )


# The early sandbox answers its block at once with a reply of its own making, then keeps running,
# noting every moment it did not run; it answers the next block itself with what it noted. Its
# clock starts before the reply: the stop may come before the loop's first turn.
RUN_ON_AFTER_REPLY = (
    """
_t = _sys.modules['time']
_gaps, _last = [], _t.monotonic()
_end = _last + 2.0
"""
    + frame("{'id': 2, 'output': 'answered early'}")
    + """
while _last < _end:
    _now = _t.monotonic()
    if _now - _last > 0.1:
        _gaps.append((_last, _now))
    _last = _now
_head = _ctypes.create_string_buffer(4)
_libc.read(0, _head, 4)
_size = int.from_bytes(_head.raw, 'big')
_body = _ctypes.create_string_buffer(_size)
_got = 0
while _got < _size:
    _got += _libc.read(0, _ctypes.byref(_body, _got), _size - _got)
_id = _sys.modules['json'].loads(_body.raw)['id']
"""
    + frame("{'id': _id, 'output': _sys.modules['json'].dumps(_gaps)}")
    + "_libc._exit(0)\n"
)


def test_a_sandbox_that_runs_on_after_its_reply_is_stopped_until_its_next_block(late):
    assert late.run_code(RUN_ON_AFTER_REPLY, timeout_s=60) == "answered early"
    between = time.monotonic()
    time.sleep(0.6)
    until = time.monotonic()
    gaps = json.loads(late.run_code("", timeout_s=60))
    # It did not run from its forged reply until its next block.
    assert any(start <= between and until <= end for start, end in gaps), (gaps, between, until)


# Both sides find the same byte of libc's text (the same file, so the same futex key if shared).
LIBC_WORD = "_addr = _ctypes.cast(_libc.syscall, _ctypes.c_void_p).value & ~3\n"


def receiver(futex: int) -> str:
    """Waits (3 s at most) on the word, as a shared futex, then as a private one; prints
    "op rc errno" for each."""
    return LIBC_WORD + (
        "_value = _ctypes.c_int.from_address(_addr).value\n"
        "_timeout = _ctypes.create_string_buffer((3).to_bytes(8, 'little') + (0).to_bytes(8, 'little'), 16)\n"
        "for _op in (0, 128):\n"
        "    _ctypes.set_errno(0)\n"
        f"    _rc = _libc.syscall(_ctypes.c_long({futex}), _ctypes.c_long(_addr), _ctypes.c_long(_op),"
        " _ctypes.c_long(_value), _timeout, _ctypes.c_long(0), _ctypes.c_long(0))\n"
        "    print(_op, _rc, _ctypes.get_errno())\n"
    )


def sender(futex: int, seconds: float) -> str:
    """Wakes every waiter on the word, shared and private, for ``seconds``; prints how many woke."""
    return LIBC_WORD + (
        "_woken = 0\n_end = _sys.modules['time'].monotonic() + " + str(seconds) + "\n"
        "while _sys.modules['time'].monotonic() < _end:\n"
        "    for _op in (1, 129):\n"
        f"        _n = _libc.syscall(_ctypes.c_long({futex}), _ctypes.c_long(_addr), _ctypes.c_long(_op),"
        " _ctypes.c_long(2**31 - 1), _ctypes.c_long(0), _ctypes.c_long(0), _ctypes.c_long(0))\n"
        "        _woken += max(_n, 0)\n"
        "    _sys.modules['time'].sleep(0.005)\n"
        "print(_woken)\n"
    )


def test_a_late_sandbox_cannot_wake_an_early_one_through_a_futex(early_and_late):
    early, late = early_and_late
    futex = _nr("futex")
    results = {}

    def run(name, env, code):
        results[name] = env.run_code(code, timeout_s=60)

    waiting = threading.Thread(target=run, args=("early", early, receiver(futex)))
    waiting.start()
    time.sleep(0.5)  # the early sandbox is in its first wait
    run("late", late, sender(futex, 7.0))
    waiting.join()
    (shared, private), woken = (
        (tuple(map(int, line.split())) for line in results["early"].strip().splitlines()),
        int(results["late"].strip()),
    )
    # The shared wait fails at once ("the word changed", before the kernel keys it); the private
    # one is keyed by the early sandbox's own address space, so nothing the late one does ends it
    # before its time-out.
    assert shared == (0, -1, errno.EAGAIN), results
    assert private == (128, -1, errno.ETIMEDOUT), results
    assert woken == 0, results


JOIN_UNDER_THE_FILTER = """
import ctypes, os, time
from pipeline.agent_api import lockdown
libc = ctypes.CDLL(None, use_errno=True)
body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _: time.sleep(1.0))
thread = ctypes.c_ulong()
assert libc.pthread_create(ctypes.byref(thread), None, body, None) == 0
lockdown.seccomp_filter(os.getpid()).load()
print("joined", libc.pthread_join(thread, None), flush=True)
"""


def test_a_thread_joined_under_the_filter_does_not_end_the_process():
    # pthread_join waits on the thread's tid word as a shared futex; polars' tokio pool joins its
    # idle threads as they exit, and glibc aborted the sandbox when that wait was refused with EPERM
    # (1 block in 12 after a pause of over 10 s, under load).
    done = subprocess.run(
        [sys.executable, "-c", JOIN_UNDER_THE_FILTER],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert (done.returncode, done.stdout) == (0, "joined 0\n"), done.stderr


def resident_pages(path: Path) -> tuple[int, int]:
    """(resident pages, pages) of a file in the page cache, by mincore(2) on a private mapping."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with open(path, "rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0, ctypes.get_errno()
        resident = sum(byte & 1 for byte in vector)
        del address
    return resident, pages


PAGE_OUT = """
_gc = _B['__import__']('gc')
_pa = _sys.modules['pyarrow']
_maps = [m for m in _gc.get_objects() if type(m).__name__ == 'mmap']
for _m in _maps:
    _address = _pa.py_buffer(_m).address
    for _advice in (21, 20):  # MADV_PAGEOUT, MADV_COLD
        _ctypes.set_errno(0)
        _rc = _libc.syscall(_ctypes.c_long(MADVISE), _ctypes.c_long(_address), _ctypes.c_long(len(_m)), _ctypes.c_long(_advice))
        print(_advice, _rc, _ctypes.get_errno())
print('maps', len(_maps))
"""


def test_a_sandbox_cannot_page_out_the_tables_its_siblings_map(early_and_late):
    _, late = early_and_late
    files = [path for part in late.table_files() for path in part]
    for path in files:  # read whole, as a sibling sandbox reading its tables would
        path.read_bytes()
    before = {path: resident_pages(path) for path in files}
    assert all(resident == pages for resident, pages in before.values()), before
    lines = late.run_code(f"MADVISE = {_nr('madvise')}\n" + PAGE_OUT, timeout_s=60).strip().splitlines()
    assert lines[-1] == f"maps {len(files)}", lines  # it reached every table it maps
    assert {tuple(map(int, line.split()))[1:] for line in lines[:-1]} == {(-1, errno.EPERM)}, lines
    assert {path: resident_pages(path) for path in files} == before


def page_out_from_a_user_namespace(path: Path) -> None:
    """MADV_PAGEOUT over the whole file from a child that, like a sandbox child, got a read-only
    descriptor and then entered a user namespace of its own (root inside, this uid outside), with
    no seccomp filter: what a child that got past its filter could still ask of the kernel."""
    child = os.fork()
    if child == 0:
        try:
            with open(path, "rb") as file:
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            lockdown.enter_namespaces()
            mapped.read()  # fault every page in: pageout walks the caller's own page tables
            mapped.madvise(MADV_PAGEOUT)
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


MADV_PAGEOUT = 21


@pytest.mark.skipif(os.geteuid() != 0, reason="table parts are given to the overflow uid only by a root process")
def test_table_parts_belong_to_no_sandbox_so_even_an_unfiltered_child_cannot_page_them_out(database, tmp_path):
    _, news = database.environment(LATE).table_files()[0]
    assert (news.stat().st_uid, news.stat().st_gid) == table_owner() != (0, 0)
    own_copy = tmp_path / "own.arrow"  # the same bytes, owned by this process's uid: the attack works
    shutil.copyfile(news, own_copy)
    for path in (own_copy, news):
        with open(path, "rb") as file:  # written back: the kernel pages out clean pages only
            os.fsync(file.fileno())
        path.read_bytes()
        assert resident_pages(path)[0] == resident_pages(path)[1]
        page_out_from_a_user_namespace(path)
    assert resident_pages(own_copy)[0] < resident_pages(own_copy)[1] // 2
    assert resident_pages(news)[0] == resident_pages(news)[1]


def evict(path: Path) -> None:
    """Drop the file's clean pages that no process maps from the page cache, as memory pressure on
    the host would (pressure takes mapped pages too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # written back first: only clean pages can go
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def page_residency(path: Path, offset: int = 0, length: int | None = None) -> list[bool]:
    """Whether each page of ``length`` bytes of a file from ``offset`` (page-aligned) is in the page
    cache, by mincore(2) on a private mapping."""
    libc = ctypes.CDLL(None, use_errno=True)
    length = path.stat().st_size - offset if length is None else length
    with open(path, "rb") as file, mmap.mmap(file.fileno(), length, access=mmap.ACCESS_COPY, offset=offset) as mapped:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        vector = (ctypes.c_ubyte * ((length + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vector) == 0, ctypes.get_errno()
        del address
    return [bool(byte & 1) for byte in vector]


# Both sides find the mapping of the shared complete-month part by its length; readahead is
# switched off on it (MADV_RANDOM, an allowed advice) so that one touch brings in one page.
PART_PAGES = """
_pa = _sys.modules['pyarrow']
_gc = _B['__import__']('gc')
_m = next(m for m in _gc.get_objects() if type(m).__name__ == 'mmap' and len(m) == SIZE)
_address = _pa.py_buffer(_m).address
_libc.syscall(_ctypes.c_long(MADVISE), _ctypes.c_long(_address), _ctypes.c_long(len(_m)), _ctypes.c_long(1))
_pages = [_address + k * 4096 for k in PAGES]
"""
WRITE_BITS = (
    PART_PAGES
    + """
for _page, _bit in zip(_pages, PATTERN):
    if _bit:
        _ctypes.c_char.from_address(_page).value
print('written')
"""
)
# The receiver's side of both attacks: the time of a first touch of each page in _pages, in ns.
TIME_FIRST_TOUCHES = """
_clock = _sys.modules['time'].perf_counter_ns
_times = []
for _page in _pages:
    _t = _clock()
    _ctypes.c_char.from_address(_page).value
    _times.append(_clock() - _t)
print(' '.join(map(str, _times)))
"""
READ_BITS = PART_PAGES + TIME_FIRST_TOUCHES
PATTERN = [1, 0, 1, 1, 0, 0, 1, 0] * 2
NOT_RESIDENT_NS = 25_000  # a page read in on the fault: 45-120 µs measured; a resident one: < 11 µs


def test_a_late_sandbox_cannot_set_page_cache_bits_an_early_one_reads(early_and_late):
    """The page cache as a channel: the pages of a month part both sandboxes map are evicted from
    outside (memory pressure), the late sandbox touches the pages of its message's 1 bits, the
    early one times a first touch of each. The attacker picks pages that are not resident if there
    are any; every shared page stays resident whatever happens outside, so there are none and the
    early sandbox reads no pattern (without that, it read the pattern exactly)."""
    early, late = early_and_late
    _, news = early.table_files()[0]  # the complete month before both cutoffs: the same file
    assert news in late.table_files()[0]
    evict(news)
    residency = page_residency(news)
    blank = [k for k, resident in enumerate(residency) if not resident]
    pages = (blank if len(blank) >= len(PATTERN) else list(range(0, len(residency), 2)))[: len(PATTERN)]
    assert len(pages) == len(PATTERN)
    head = f"MADVISE = {_nr('madvise')}\nSIZE = {news.stat().st_size}\nPAGES = {pages}\nPATTERN = {PATTERN}\n"
    assert late.run_code(head + WRITE_BITS, timeout_s=60).strip() == "written"
    times = [int(t) for t in early.run_code(head + READ_BITS, timeout_s=60).split()]
    read = [int(t < NOT_RESIDENT_NS) for t in times]
    assert blank == [] and read != PATTERN, times


def sandbox_child_pid(env) -> int:
    """The process that runs the agent's code: the only child of the spare's waiter (it forks the
    sandbox child into the new PID namespace), as the host numbers it."""
    waiter = env._sandbox._child.proc.pid
    [child] = Path(f"/proc/{waiter}/task/{waiter}/children").read_text().split()
    return int(child)


def mapped_files(pid: int) -> set[Path]:
    files = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and Path(fields[5]).is_file():
            files.add(Path(fields[5]))
    return files


def test_the_library_pages_a_sandbox_maps_stay_resident(early_and_late):
    """The same channel through the code both sandboxes map (polars alone is 130 MiB): after every
    file a child maps is evicted from outside, every page of each is still resident, the parts of
    the files no segment maps included (a child can grow a mapping over them: the next test)."""
    early, _ = early_and_late
    files = mapped_files(sandbox_child_pid(early))
    assert any("polars" in str(path) for path in files), files
    waiter = mapped_files(early._sandbox._child.proc.pid)
    assert any(".so" in path.name for path in files - waiter), "a library the child imports after the fork"
    for path in files:
        evict(path)
    missing = {path.name: page_residency(path).count(False) for path in files}
    assert {name: n for name, n in missing.items() if n} == {}


# Agent code finds a library's load address (the dynamic linker's _r_debug list, no syscall), copies
# its first page with mremap(MREMAP_DONTUNMAP) and grows the copy over the whole file: pages past
# the loaded segments (symbol tables, section headers) that no segment maps: its last pages.
LIBRARY_TAIL = """
_c = _ctypes
def _sc(*a):
    return _libc.syscall(*[_c.c_long(x) for x in a])
_lm = _c.c_void_p.from_address(_c.addressof(_c.c_int.in_dll(_c.CDLL(None), '_r_debug')) + 8).value
while LIBRARY not in (_c.c_char_p.from_address(_lm + 8).value or b''):
    _lm = _c.c_void_p.from_address(_lm + 24).value
_base = _c.c_void_p.from_address(_lm).value
_u64, _u16 = (lambda a: _c.c_uint64.from_address(a).value), (lambda a: _c.c_uint16.from_address(a).value)
_size = _u64(_base + 40) + _u16(_base + 60) * _u16(_base + 58)
_copy = _sc(MREMAP, _base, 4096, 4096, 1 | 4, 0)
_big = _sc(MREMAP, _copy, 4096, (_size + 4095) // 4096 * 4096, 1, 0)
_sc(MADVISE, _big, (_size + 4095) // 4096 * 4096, 1)
_last = (_size + 4095) // 4096 - 1
_pages = [_big + 4096 * k for k in range(_last - 2 * len(PATTERN), _last)]
"""
SEND_TAIL = (
    LIBRARY_TAIL
    + """
for _i, _bit in enumerate(PATTERN):
    _c.c_char.from_address(_pages[2 * _i + _bit]).value
print('sent', len(_pages))
"""
)
READ_TAIL = LIBRARY_TAIL + TIME_FIRST_TOUCHES


@pytest.mark.parametrize("library", ["libpython", "unicodedata"])
def test_a_late_sandbox_cannot_signal_through_library_pages_it_maps_itself(early_and_late, library):
    """The re-attacks of issue 30 that broke the first versions of this defence: while only the
    mapped ranges were kept, libpython's tail carried 256 bits with 0 errors; while only the spare's
    waiter's files were kept, _pydantic_core (which the sandbox child then imported after the
    fork) carried 1,632 bits with 6 % errors; unicodedata is such a library now. The late sandbox touches page 2i or 2i+1 of the library's
    tail for bit i; the early one times both."""
    early, late = early_and_late
    path = next(path for path in mapped_files(sandbox_child_pid(early)) if path.name.startswith(library))
    evict(path)
    assert all(page_residency(path)), f"{path.name}'s pages were evicted"
    head = (
        f"MREMAP = {_nr('mremap')}\nMADVISE = {_nr('madvise')}\nPATTERN = {PATTERN}\nLIBRARY = {library.encode()!r}\n"
    )
    assert late.run_code(head + SEND_TAIL, timeout_s=60).strip() == f"sent {2 * len(PATTERN)}"
    times = [int(t) for t in early.run_code(head + READ_TAIL, timeout_s=60).split()]
    read = [int(times[2 * i] >= NOT_RESIDENT_NS) for i in range(len(PATTERN))]
    slow = [t for t in times if t >= NOT_RESIDENT_NS]
    assert len(slow) <= 2 and read != PATTERN, times


# The re-attack of the gate (issue 30): agent code keeps running on one of polars' pool threads (a
# background query's map_batches callback). That thread forges the block's reply, then sends the
# child SIGCONT over and over to cancel the stop between blocks, logging each stretch it ran, until
# the next request comes, which it answers with its log. Meanwhile the main thread either sleeps
# or ends alone with exit(2): a zombie main thread made /proc say the child was stopped.
POOL_THREAD_RUNS_ON = (
    """
_pl, _t, _json = _sys.modules['polars'], _sys.modules['time'], _sys.modules['json']
class _PollFd(_ctypes.Structure):
    _fields_ = [('fd', _ctypes.c_int), ('events', _ctypes.c_short), ('revents', _ctypes.c_short)]
_stdin = _PollFd(0, 1, 0)  # POLLIN
def _run_on(series):
    _t.sleep(0.2)  # the main thread sleeps or has ended by now
"""
    + "\n".join("    " + line for line in frame("{'id': 2, 'output': 'answered early'}").splitlines())
    + """
    _pid, _stretches, _refused = _libc.getpid(), [], set()
    start = last = _t.monotonic()
    _tries = 0  # at least these, whenever the stop comes
    while _tries < 1000 or _libc.poll(_ctypes.byref(_stdin), 1, 0) == 0:
        _tries += 1
        _ctypes.set_errno(0)
        _refused.add((_libc.kill(_pid, 18), _ctypes.get_errno()))  # SIGCONT
        now = _t.monotonic()
        if now - last > 0.001:
            _stretches.append((start, last))
            start = now
        last = now
    _stretches.append((start, last))
    _head = _ctypes.create_string_buffer(4)
    _libc.read(0, _head, 4)
    _body = _ctypes.create_string_buffer(int.from_bytes(_head.raw, 'big'))
    _libc.read(0, _body, len(_body))
    _report = {'stretches': _stretches, 'refused': sorted(_refused)}
"""
    + "\n".join("    " + line for line in frame("{'id': 3, 'output': _json.dumps(_report)}").splitlines())
    + """
    _libc._exit(0)
_query = _pl.LazyFrame({'a': [1]}).select(_pl.col('a').map_batches(_run_on, return_dtype=_pl.Int64)).collect(background=True)
"""
)
MAIN_THREAD = {
    "sleeps": "_t.sleep(60)\n",
    # exit(2) itself, not glibc's _exit (exit_group): its number per architecture (asm/unistd.h).
    "ends alone": "_libc.syscall(_ctypes.c_long(EXIT), _ctypes.c_long(0))\n",
}


@pytest.mark.parametrize("main_thread", list(MAIN_THREAD))
def test_a_pool_thread_that_signals_sigcont_does_not_run_between_blocks(late, main_thread):
    code = (POOL_THREAD_RUNS_ON + MAIN_THREAD[main_thread]).replace("EXIT", str(_EXIT[lockdown.machine()]))
    assert late.run_code(code, timeout_s=60) == "answered early"
    between = time.monotonic()
    time.sleep(0.6)
    until = time.monotonic()
    report = json.loads(late.run_code("", timeout_s=60))
    # It ran, its own SIGCONT was refused every time, and it did not run between its blocks.
    assert report["stretches"] and report["refused"] == [[-1, errno.EPERM]], report
    ran = [(s, e) for s, e in report["stretches"] if s < until and between < e]
    assert ran == [], (ran, between, until)


_EXIT = {"x86_64": 60, "aarch64": 93}


# kill(2)/tgkill(2) read the signal as an int: a filter comparing 64 bits would let 18 | 1 << 32
# (SIGCONT) through (the second re-attack of the gate did). The stop signals are refused too, and
# the real-time ones (32-64), each of which queues against the host user's pending-signal count,
# which the third re-attack read 32 bits through.
SIGNAL_ITSELF = """
_nr = {'kill': NR_KILL, 'tgkill': NR_TGKILL}
_pid, _tid = _libc.getpid(), _libc.syscall(_ctypes.c_long(NR_GETTID))
for _sig in (18, 18 | 1 << 32, 18 | 1 << 63, 19, 20, 21, 22, 32, 40, 64, 0):
    for _name, _args in (('kill', (_pid, _sig)), ('tgkill', (_pid, _tid, _sig))):
        _ctypes.set_errno(0)
        _rc = _libc.syscall(_ctypes.c_long(_nr[_name]), *[_ctypes.c_long(a - (1 << 64) if a >= 1 << 63 else a) for a in _args])
        print(_name, _sig, _rc, _ctypes.get_errno())
"""
_SYSCALLS = {
    "x86_64": {"NR_KILL": 62, "NR_TGKILL": 234, "NR_GETTID": 186},
    "aarch64": {"NR_KILL": 129, "NR_TGKILL": 131, "NR_GETTID": 178},
}


def test_a_sandbox_cannot_send_itself_sigcont_or_a_stop_signal_whatever_the_upper_bits(late):
    code = SIGNAL_ITSELF
    for name, number in _SYSCALLS[lockdown.machine()].items():
        code = code.replace(name, str(number))
    results = [line.split() for line in late.run_code(code, timeout_s=60).strip().splitlines()]
    assert len(results) == 22, results
    for name, sig, rc, err in results:
        expected = ("0", "0") if sig == "0" else ("-1", str(errno.EPERM))  # signal 0 only asks "am I here"
        assert (rc, err) == expected, (name, sig, rc, err)


# A child that touches 200 MB and then breaks the protocol (closes its stdout): the kernel takes tens
# of milliseconds to tear it down, at a moment the child chose, so its block waits for that too.
BREAK_AFTER_FILLING = """
_filled = bytearray(200 * 2**20)
for _i in range(0, len(_filled), 4096):
    _filled[_i] = 1
_libc.close(1)
_sys.modules['time'].sleep(30)
"""


def test_a_killed_child_is_gone_before_its_block_returns(late):
    pid = late._sandbox._child.sandbox.pid
    ended = late.run_code(BREAK_AFTER_FILLING, timeout_s=60)
    assert "ended the sandbox process" in ended, ended
    try:
        threads = [
            (Path(f"/proc/{pid}/task") / task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in os.listdir(f"/proc/{pid}/task")
        ]
    except (FileNotFoundError, ProcessLookupError):
        threads = []
    assert set(threads) <= {"Z", "X"}, threads


# 100 MB written and 15,000 mappings: a teardown of tens of milliseconds, long past a bound of zero.
FILL_AND_SPLIT = """
_filled = bytearray(100 * 2**20)
for _i in range(0, len(_filled), 4096):
    _filled[_i] = 1
_libc.mmap.restype = _ctypes.c_void_p
_libc.mmap.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int, _ctypes.c_int, _ctypes.c_int, _ctypes.c_long]
_libc.mprotect.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int]
_region = _libc.mmap(None, 15000 * 8192, 3, 0x22, -1, 0)
print(sum(_libc.mprotect(_region + 8192 * _i, 4096, 1) == 0 for _i in range(15000)))
"""


def test_an_episode_gives_the_gate_back_only_once_its_child_has_ended(database, tmp_path, monkeypatch):
    """Closing an episode kills its child and waits STOP_TIMEOUT_S for the kernel to end it; a
    child that took longer (a crash dumped to a pipe, whose helper the kernel waits for where
    kernel.core_pipe_limit is set, or a loaded machine) was still there when the lease was given back, beside the next cutoff's sandboxes.
    Here the bound is zero, so every child takes longer."""
    from pipeline.agent_api import sandbox

    gate = CutoffGate(tmp_path / "gate", handover_grid_s=0)
    late = started(database.environment(LATE), gate)
    try:
        assert late.run_code(FILL_AND_SPLIT, timeout_s=60).strip() == "15000"
        pidfd = os.pidfd_open(late._sandbox._child.sandbox.pid)
        monkeypatch.setattr(sandbox, "STOP_TIMEOUT_S", 0.0)
    finally:
        late.close()
    try:
        assert select.select([pidfd], [], [], 0)[0], "the late child still existed when its lease was given back"
    finally:
        os.close(pidfd)
    with gate.hold(EARLY) as waited:  # and the lease was given back
        assert waited < 5


# A clock id made from a pid reads that process's CPU time (clock_getcpuclockid(3)): (~pid << 3) | 2.
READ_CLOCKS = """
_ts = _ctypes.create_string_buffer(16)
for _clock in (1, 2, 3, ~1 << 3 | 2, ~PARENT << 3 | 2, ~0 << 3 | 2, 12, 1 | 1 << 32):
    _ctypes.set_errno(0)
    _rc = _libc.syscall(_ctypes.c_long(NR_CLOCK_GETTIME), _ctypes.c_long(_clock), _ts)
    print(_clock, _rc, _ctypes.get_errno())
"""
_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}


def test_a_sandbox_reads_its_own_clocks_and_no_other_process_cpu_time(late):
    code = READ_CLOCKS.replace("NR_CLOCK_GETTIME", str(_CLOCK_GETTIME[lockdown.machine()]))
    code = code.replace("PARENT", str(os.getpid()))
    results = [line.split() for line in late.run_code(code, timeout_s=60).strip().splitlines()]
    assert [(rc, err) for _, rc, err in results[:3]] == [("0", "0")] * 3, results  # monotonic, own CPU time
    assert {(rc, err) for _, rc, err in results[3:]} == {("-1", str(errno.EPERM))}, results


def test_a_sigcont_to_the_evaluation_process_group_does_not_resume_a_stopped_child(late):
    """A shell's fg or bg, GNU timeout and the kernel's orphaned-group rule signal the process
    group: the sandbox children are in a session of their own."""
    pid = late._sandbox._child.sandbox.pid
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat[2]) != os.getpgrp() and int(stat[3]) != os.getsid(0), stat
    os.killpg(os.getpgrp(), signal.SIGCONT)
    time.sleep(0.2)
    states = {
        (Path(f"/proc/{pid}/task") / task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in os.listdir(f"/proc/{pid}/task")
    }
    assert states == {"T"}, states


# The huge zero page: one physical 2 MiB folio of zeros that the kernel allocates on the first read
# fault of a THP-eligible anonymous region anywhere on the machine (MADV_HUGEPAGE, an advice the
# allocators use) and frees only at the next reclaim after the last process mapping it has ended
# (mm/huge_memory.c, get_huge_zero_folio and its shrinker). Its existence outlives a sandbox: a
# late sandbox that read-faults such a region makes it exist, and an early one that starts later
# times its own first read fault, 0.02-0.09 ms when it exists against 0.17-2.5 ms when the kernel
# must allocate and clear it (a re-attack read 16 bits of 16 that way, with a reclaim between bits,
# its only reset). With THP off for the child's whole memory (PR_SET_THP_DISABLE, which the
# allowlist lets no child undo) a read fault maps the 4 KiB zero page, which always exists.
READ_FAULT_HUGEPAGE_REGIONS = """
_c = _ctypes
def _sc(*a):
    return _libc.syscall(*[_c.c_long(x) for x in a])
_base = _sc(MMAP, 0, 12 << 20, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
_start = (_base + (2 << 20) - 1) & ~((2 << 20) - 1)
_regions = [_start + k * (2 << 20) for k in range(1, 4)]
_advised = [_sc(MADVISE, _region, 2 << 20, 14) for _region in _regions]  # MADV_HUGEPAGE
_read = [_c.c_char.from_address(_region).value for _region in _regions]
print(_advised, _regions)
"""
_MMAP = {"x86_64": 9, "aarch64": 222}


def mapped_pages(pid: int, addresses: list[int]) -> list[bool]:
    """Whether the page at each address of process ``pid`` is mapped (pagemap(5), bit 63)."""
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        present = []
        for address in addresses:
            pagemap.seek(address // mmap.PAGESIZE * 8)
            present.append(bool(int.from_bytes(pagemap.read(8), "little") >> 63))
    return present


def test_a_sandbox_never_maps_the_machine_s_huge_zero_page(early_and_late):
    """Each sandbox read-faults the first byte of three 2 MiB regions advised MADV_HUGEPAGE (the
    late one as a sender, the early one as a receiver would): the page after that byte stays
    unmapped, where the huge zero folio maps all 512 pages of a region at once."""
    if not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():
        pytest.skip("this kernel has no transparent huge pages")
    code = READ_FAULT_HUGEPAGE_REGIONS.replace("MMAP", str(_MMAP[lockdown.machine()]))
    code = code.replace("MADVISE", str(_nr("madvise")))
    for env in early_and_late:
        advised, regions = json.loads("[" + env.run_code(code, timeout_s=60).strip().replace("] [", "], [") + "]")
        assert advised == [0, 0, 0], advised  # honest allocators' advice still answers
        pid = sandbox_child_pid(env)
        assert mapped_pages(pid, regions) == [True] * 3
        assert mapped_pages(pid, [region + mmap.PAGESIZE for region in regions]) == [False] * 3
