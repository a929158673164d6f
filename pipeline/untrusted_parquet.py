"""Parquet from outside (a submitted predictions file, a handed-over split), decoded under a memory
bound the file cannot lie about.

A parquet footer states sizes (a row group's ``total_byte_size``, a page's uncompressed size) and
the reader believes them: a 132 KB file whose footer understates 4 GiB of highly compressible
strings passed a footer check and then aborted the whole process (a Rust allocation failure,
SIGABRT). So the file is decoded in a child process whose address space is capped
(RLIMIT_AS: its size after importing polars plus ``budget_bytes``); the child hands the table back
as Arrow IPC. A decode that needs more memory ends the child, never the caller, and is refused
in one line. The cost is a Python start and a polars import, ~0.3 s a file.

The caller still reads a file's footer (its columns, row counts) before handing it over, and a
footer is parsed into objects hundreds of times its size (a 3-byte Thrift ColumnChunk becomes a
C++ object of several hundred: a 12 MB footer took 2.9 GB): ``check_footer`` refuses a footer
longer than MAX_FOOTER_BYTES before anything parses it. It then parses it with pyarrow, which
refuses a schema nested more than 100 levels deep: polars' reader walks the schema recursively
and a 24 KB footer of 3,000 nested groups overflowed its stack (SIGSEGV) in
``pl.read_parquet_schema``, which a caller runs in its own process.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Sequence

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

TIMEOUT_S = 120.0
# The child's own tables and buffers besides the decoded data (polars' working memory).
HEADROOM_BYTES = 128 * 2**20
_MEMORY_EXIT = 3
_UNREADABLE_EXIT = 4


# Our own files' footers are a few KB (1.8 KB for a generated database month, a split or a
# predictions file has 2-5 columns); a real month of ~10M events in ~40 row groups of ~20 columns
# stays near 100 KB. The parse of 1 MiB costs at most a few hundred MB.
MAX_FOOTER_BYTES = 1 << 20
_TRAILER = b"PAR1"


class UntrustedParquetError(ValueError):
    """The file could not be decoded within its bounds; the message is one line."""


def check_footer(source: bytes | os.PathLike) -> None:
    """Raise UntrustedParquetError unless ``source`` (a file's bytes or its path) ends as a parquet
    file does, with a footer of at most MAX_FOOTER_BYTES (checked on the last 8 bytes, before
    anything parses the footer) that pyarrow parses (its schema at most 100 levels deep)."""
    if isinstance(source, bytes):
        size, tail = len(source), source[-8:]
    else:
        with open(source, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(size - 8, 0))
            tail = fh.read(8)
    length = int.from_bytes(tail[:4], "little")
    if len(tail) < 8 or tail[4:] != _TRAILER or length > size - 12:  # 12: the leading and trailing marks
        raise UntrustedParquetError("not a readable parquet file (no parquet footer at its end)")
    if length > MAX_FOOTER_BYTES:
        raise UntrustedParquetError(f"its footer is {length:,} bytes, more than the {MAX_FOOTER_BYTES:,} allowed")
    try:  # bounded by the length just checked; pyarrow refuses a schema nested past 100 levels
        pq.read_metadata(pa.BufferReader(source) if isinstance(source, bytes) else source)
    except (OSError, pa.ArrowException) as exc:
        said = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UntrustedParquetError(f"not a readable parquet file (its footer: {said})") from None


def read_untrusted_parquet(data: bytes, budget_bytes: int, columns: list[str] | None = None) -> pl.DataFrame:
    """The parquet file ``data`` as a DataFrame (only ``columns`` when given), decoded in a child
    process that may use at most ``budget_bytes`` beyond its start; else UntrustedParquetError."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(budget_bytes + HEADROOM_BYTES), json.dumps(columns)],
            input=data,
            capture_output=True,
            timeout=TIMEOUT_S,
            # One thread: a thread pool's stacks would count against the address space.
            env=os.environ | {"POLARS_MAX_THREADS": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UntrustedParquetError(f"decoding it took more than {TIMEOUT_S:.0f} s") from None
    if done.returncode == 0:
        return pl.read_ipc(io.BytesIO(done.stdout))
    if done.returncode == _UNREADABLE_EXIT:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UntrustedParquetError(f"not a readable parquet file ({said[-1][:200] if said else 'no reason given'})")
    if done.returncode == _MEMORY_EXIT or done.returncode in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGKILL):
        raise UntrustedParquetError(
            f"decoding it needs more than {budget_bytes // 2**20} MiB of memory (its sizes as stated are not its own)"
        )
    raise UntrustedParquetError(f"its decoder ended with status {done.returncode}")


def text_bytes(frame: pl.DataFrame, columns: Sequence[str] | None = None) -> tuple[int, int]:
    """(the longest cell, all cells) in bytes of the frame's String columns (those of ``columns``
    only, when given), measured on the columns: decoded values may share one buffer (a dictionary
    page), so text is counted here before any row becomes a Python string."""
    names = [c for c, dtype in frame.schema.items() if dtype == pl.String and (columns is None or c in columns)]
    if not names or not frame.height:
        return 0, 0
    lengths = pl.col(names).str.len_bytes()
    longest, total = frame.select(
        pl.max_horizontal(lengths.max()).alias("longest"), pl.sum_horizontal(lengths.sum()).alias("total")
    ).row(0)
    return longest or 0, total or 0


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _decode(budget: int, columns: list[str] | None) -> int:
    data = sys.stdin.buffer.read()
    limit = _address_space_bytes() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        table = pl.read_parquet(io.BytesIO(data), columns=columns)
        out = io.BytesIO()
        table.write_ipc(out, compression="uncompressed")
    except MemoryError:
        return _MEMORY_EXIT
    except Exception as exc:  # polars' and pyarrow's errors for a damaged file or a missing column
        if "memory" in str(exc).lower() or "alloc" in str(exc).lower():
            return _MEMORY_EXIT
        print(type(exc).__name__, file=sys.stderr)
        return _UNREADABLE_EXIT
    sys.stdout.buffer.write(out.getbuffer())
    return 0


if __name__ == "__main__":
    sys.exit(_decode(int(sys.argv[1]), json.loads(sys.argv[2])))
