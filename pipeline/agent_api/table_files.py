"""Gated tables as files: written once, shared read-only with every sandbox child that needs them.

A sandbox child used to receive its environment's tables serialised over a pipe, once per episode:
with 14 months of history that is ~1.2 GB of news text copied twice per start. Instead the tables
are written once as uncompressed Arrow IPC files with string views (``CompatLevel.newest``), so a
child maps them (``mmap``, read-only) and pyarrow plus ``pl.from_arrow`` use the mapped bytes in
place: no copy, and the pages are the page cache's, shared by every child of that cutoff
(docs/agent_api.md, "How the tables reach the child").

A table is a list of parts (events file, news file); the child concatenates them. EventDatabase
makes one part per complete month (shared by every later cutoff) and one for the cutoff's month up
to the cutoff, so a file for cutoff d holds no row after d and the disk holds the database about
once, plus at most one partial month per cutoff seen.

Where the evaluation process may change a file's owner (it runs as root), each part belongs to the
kernel's overflow uid ("nobody"), which no sandbox runs as: the kernel pages out a file's cached pages
on `MADV_PAGEOUT`/`MADV_COLD` only for the file's owner or a writer (mm/madvise.c,
can_do_file_pageout), so a child that got past its seccomp filter still could not drop its siblings'
table pages. Elsewhere the filter alone refuses that advice (docs/agent_api.md, "Other episodes are
adversaries too").

Each part's pages are read in and locked in memory from when it is written until the object is
closed (shared_pages.py): their residency is no channel between the children that map them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import polars as pl

from pipeline.agent_api.shared_pages import SHARED_PAGES, FileKey

Tables = tuple[pl.DataFrame, pl.DataFrame]


def _remove(directory: Path, kept: list[FileKey]) -> None:
    for key in kept:
        SHARED_PAGES.release(key)
    shutil.rmtree(directory, ignore_errors=True)


def table_owner() -> tuple[int, int] | None:
    """(uid, gid) the parts are given to: the kernel's overflow ids, as root; None otherwise."""
    if os.geteuid() != 0:
        return None
    ids = []
    for name in ("overflowuid", "overflowgid"):
        try:
            ids.append(int(Path(f"/proc/sys/kernel/{name}").read_text()))
        except (OSError, ValueError):
            ids.append(65534)  # the kernel's default (include/linux/highuid.h)
    return ids[0], ids[1]


class TableFiles:
    """A private directory (mode 0700, under the system temp dir) of read-only part files, named by
    the caller. Each part is written once, by the first thread that asks for it, through a temporary
    name and ``os.replace``, so a reader never sees a partial file; concurrent askers of the same
    part wait for that one write. The directory is this object's alone (nothing else in this or
    another process writes into it) and is removed when the object is closed or collected, or at
    interpreter exit."""

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="mirai-gated-tables-"))
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._kept: list[FileKey] = []
        self._finalizer = weakref.finalize(self, _remove, self.directory, self._kept)

    def part(self, name: str, build: Callable[[], Tables]) -> tuple[Path, Path]:
        """The (events, news) files of part ``name``, written from ``build()`` if not yet there."""
        if "/" in name or name.startswith("."):
            raise ValueError(f"a part name is a plain file name stem, got {name!r}")
        paths = self.directory / f"{name}.events.arrow", self.directory / f"{name}.news.arrow"
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if not paths[1].exists():  # news is renamed into place last: its presence means complete
                for frame, path in zip(build(), paths, strict=True):
                    partial = path.with_name(f".{path.name}.partial")
                    frame.write_ipc(partial, compression="uncompressed", compat_level=pl.CompatLevel.newest())
                    partial.chmod(0o400)
                    if (owner := table_owner()) is not None:
                        os.chown(partial, *owner)
                    os.replace(partial, path)
                    # In memory from now on, before any child maps it (shared_pages.py).
                    self._kept.append(SHARED_PAGES.keep_file(path))
        return paths

    def size_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.directory.glob("*.arrow"))

    def close(self) -> None:
        self._finalizer()
