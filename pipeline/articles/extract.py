"""Article extraction with trafilatura: title, main text, publication date, language.

``extract`` runs in-process. ``ExtractionPool`` (and ``extract_isolated`` for one document) runs it in
worker processes that are killed when a document exceeds its time limit: trafilatura's own
``EXTRACTION_TIMEOUT`` only exists in its CLI (trafilatura#704), and some pages make it run for
minutes (#651, #750). A worker that dies is recorded and replaced; the run goes on.

Why not pebble's ProcessPool (https://github.com/noxdafox/pebble): its workers share one task pipe
and the parent learns which worker took a task from an acknowledgement its message thread reads. A
worker that dies before that acknowledgement is read (a page that crashes a C parser at once, while
the parent is busy filtering) has no task on record, and pebble then declares the whole pool broken
("All workers expired", ``find_expired_task`` in pebble/pool/process.py): every pending document
fails and the pool refuses new ones. With pebble 5.2.3, 30 immediately crashing documents among 60
and a busy parent thread, that stopped 7 of 9 runs; this pool (one pipe per worker, the parent
watching each worker's own pipe) recorded every document in each run.

Choices (trafilatura's Python usage and settings docs, https://trafilatura.readthedocs.io/en/latest/usage-python.html):

- ``deduplicate=False``: trafilatura's dedup keeps a process-global cache, so a document's text would
  depend on the documents extracted before it in the same process;
- comments are not extracted (reader comments are not the article);
- the text is trafilatura's TXT rendering, one paragraph per line (``"\\n"``); the OBELICS filters
  split on that;
- the date is htmldate's original publication date from the page's metadata, without the slow
  free-text search (trafilatura#779);
- before trafilatura sees a page, its size and element tree are bounded (``Limits``), and a result
  shorter than trafilatura's own ``MIN_EXTRACTED_SIZE`` is recorded as a failed extraction.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from multiprocessing.connection import Connection, wait

import trafilatura
from lxml import etree
from trafilatura import bare_extraction
from trafilatura.settings import set_date_params

from pipeline.articles.langid import identify
from pipeline.articles.obelics import words

# trafilatura settings.cfg ``MIN_EXTRACTED_SIZE = 250``: below this many characters trafilatura
# itself considers an extraction failed and retries with its fallbacks. A text still shorter after
# them is what a page without a recoverable body yields (a photo caption, a consent notice), not an
# article; we record it as ``error="too_short"`` (keeping the text for inspection).
MIN_TEXT_CHARS = 250

# Error values of ``Extracted.error``.
TOO_LARGE = "too_large"
TREE_TOO_LARGE = "tree_too_large"
TREE_TOO_DEEP = "tree_too_deep"
UNPARSABLE = "unparsable"
NO_TEXT = "no_text"
TOO_SHORT = "too_short"
TIMEOUT = "timeout"
CRASHED = "crashed"  # the worker process died; the exit code follows after ": "
FAILED = "failed"  # trafilatura raised; the exception follows after ": "


@dataclass(frozen=True)
class Limits:
    """Bounds checked before trafilatura runs.

    The 15 fixture pages (../shared/fixtures/html) are at most 1.4 MB, 2,080 elements and 27 levels
    deep, and extract in at most ~0.3 s; trafilatura's docs suggest a 20 MB file cap and, as an
    example, a 50,000-node tree cap (https://trafilatura.readthedocs.io/en/latest/settings.html).
    """

    max_bytes: int = 10 * 2**20
    max_elements: int = 50_000
    max_depth: int = 200  # libxml2 stops nesting at 256 anyway


DEFAULT_LIMITS = Limits()
# Per-document wall time in a worker: ~30x the slowest fixture page.
DEFAULT_TIMEOUT_S = 10.0
# Address-space cap of a worker (RLIMIT_AS); a worker uses ~110 MB after the 15 fixture pages.
DEFAULT_WORKER_MEMORY_MB = 2048


@dataclass(frozen=True)
class Extracted:
    title: str | None
    text: str  # paragraphs separated by "\n"; "" when nothing was extracted
    date: str | None  # YYYY-MM-DD, the page's own publication date if it declares one
    lang: str | None  # fastText lid.176 top-1 label of the text
    lang_score: float | None
    n_words: int  # OBELICS words (obelics.words)
    error: str | None = None  # None when the text is usable; otherwise one of the values above
    seconds: float = field(default=0.0, compare=False)  # wall time of the extraction


def _failure(error: str, started: float, document=None) -> Extracted:
    """A failed extraction; what trafilatura did extract (``document``) is kept for inspection."""
    title, text, date = (document.title, document.text, document.date) if document else (None, "", None)
    return Extracted(title, text, date, None, None, len(words(text)), error, time.perf_counter() - started)


@cache
def _deeper_than(depth: int) -> etree.XPath:
    """True when some element is nested more than ``depth`` deep: one C-level pass over the tree."""
    return etree.XPath("boolean(/" + "/".join(["*"] * (depth + 1)) + ")")


def extract(html: bytes, url: str, limits: Limits = DEFAULT_LIMITS) -> Extracted:
    """Extract one page in this process (no time limit: use ``ExtractionPool`` for untrusted pages)."""
    started = time.perf_counter()
    if len(html) > limits.max_bytes:
        return _failure(TOO_LARGE, started)
    try:
        tree = trafilatura.load_html(html)
        if tree is None:
            return _failure(UNPARSABLE, started)
        if int(tree.xpath("count(//*)")) > limits.max_elements:
            return _failure(TREE_TOO_LARGE, started)
        if _deeper_than(limits.max_depth)(tree):
            return _failure(TREE_TOO_DEEP, started)
        document = bare_extraction(
            tree,
            url=url,
            with_metadata=True,
            include_comments=False,
            deduplicate=False,
            date_extraction_params=set_date_params(extensive=False),
        )
    except Exception as exc:  # a parser or extractor bug on one page must not stop the batch
        return _failure(f"{FAILED}: {type(exc).__name__}: {exc}"[:300], started)
    if document is None or not document.text:
        return _failure(NO_TEXT, started)
    text = document.text
    if len(text) < MIN_TEXT_CHARS:
        return _failure(TOO_SHORT, started, document)
    guess = identify(text)
    return Extracted(
        title=document.title,
        text=text,
        date=document.date,
        lang=guess.lang,
        lang_score=guess.score,
        n_words=len(words(text)),
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------------------------
# Worker processes with a per-document time limit
# ---------------------------------------------------------------------------------------------

Extractor = Callable[[bytes, str, Limits], Extracted]


def _serve(conn: Connection, extractor: Extractor, limits: Limits, memory_mb: int | None) -> None:
    """Worker loop: receive (html, url), send back the Extracted, until None or the pipe closes."""
    if memory_mb:  # past it allocations fail (MemoryError) instead of the machine swapping
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    # Warm up (trafilatura's first-call setup, the language model) before the first timed document.
    extractor(b"<html><body><article><p>" + b"Warm-up paragraph. " * 20 + b"</p></article></body></html>", "", limits)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(extractor(job[0], job[1], limits))


def _context() -> multiprocessing.context.BaseContext:
    # forkserver: workers fork from a clean server process that has imported this module once, so a
    # restart after a kill is cheap, and nothing is forked from a parent that may run threads.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")


class _Worker:
    def __init__(self, pool: ExtractionPool):
        self._pool = pool
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.done = 0

    def submit(self, html: bytes, url: str) -> None:
        if self.process is None or self.done >= self._pool.max_tasks_per_worker:
            self.stop()
            ours, theirs = self._pool.ctx.Pipe()
            self.process = self._pool.ctx.Process(
                target=_serve,
                args=(theirs, self._pool.extractor, self._pool.limits, self._pool.memory_mb),
                daemon=True,
            )
            self.process.start()
            theirs.close()
            self.conn, self.done = ours, 0
        self.conn.send((html, url))

    def receive(self) -> Extracted | None:
        """The result, or None if the worker died (it is then reaped)."""
        try:
            result = self.conn.recv()
        except (EOFError, OSError):
            return None
        self.done += 1
        return result

    def exit_code(self) -> int | None:
        self.process.join(timeout=1.0)
        return self.process.exitcode

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.conn.close()
            self.process = self.conn = None

    def stop(self) -> None:
        """Ask an idle worker to exit (recycling, closing); kill it if it does not."""
        if self.process is None:
            return
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=2.0)
        self.kill()


class ExtractionPool:
    """``workers`` extraction processes; each document gets ``timeout_s`` seconds of wall time.

    A worker over the limit is killed and the document recorded as ``error="timeout"``; a worker that
    dies (a crash, or an allocation past ``memory_mb``) is recorded as ``error="crashed: exit code N"``;
    both are replaced on the next document. A new worker's start-up counts against its first
    document's time. Workers are recycled every ``max_tasks_per_worker`` documents, which also bounds
    the growth of trafilatura's caches (trafilatura#216).
    """

    def __init__(
        self,
        workers: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        limits: Limits = DEFAULT_LIMITS,
        *,
        memory_mb: int | None = DEFAULT_WORKER_MEMORY_MB,
        max_tasks_per_worker: int = 500,
        extractor: Extractor = extract,
    ):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.timeout_s = timeout_s
        self.limits = limits
        self.memory_mb = memory_mb
        self.max_tasks_per_worker = max_tasks_per_worker
        self.extractor = extractor  # a module-level function: it is sent to the workers by name
        self.ctx = _context()
        self._workers = [_Worker(self) for _ in range(workers)]

    def __enter__(self) -> ExtractionPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()

    def map(self, docs: Iterable[tuple[bytes, str]]) -> Iterator[Extracted]:
        """Extract ``(html, url)`` pairs, yielding results in input order."""
        pending = iter(enumerate(docs))
        idle = list(self._workers)
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (document index, start time)
        results: dict[int, Extracted] = {}
        next_out, exhausted = 0, False
        try:
            while not exhausted or busy or results:
                while idle and not exhausted:
                    item = next(pending, None)
                    if item is None:
                        exhausted = True
                    elif len(item[1][0]) > self.limits.max_bytes:  # refused without shipping it
                        results[item[0]] = _failure(TOO_LARGE, time.perf_counter())
                    else:
                        worker = idle.pop()
                        started = time.perf_counter()
                        try:
                            worker.submit(*item[1])
                            busy[worker] = (item[0], started)
                        except OSError:  # the worker died before taking the document
                            results[item[0]] = _failure(f"{CRASHED}: exit code {worker.exit_code()}", started)
                            worker.kill()
                            idle.append(worker)
                if busy:
                    deadline = min(start for _, start in busy.values()) + self.timeout_s
                    wait([w.conn for w in busy], timeout=max(0.0, deadline - time.perf_counter()))
                    for worker, (index, start) in list(busy.items()):
                        result = self._collect(worker, start)
                        if result is not None:
                            results[index] = result
                            del busy[worker]
                            idle.append(worker)
                while next_out in results:
                    yield results.pop(next_out)
                    next_out += 1
        finally:  # stopped early: a result still in flight must not reach the next map()
            for worker in busy:
                worker.kill()

    def _collect(self, worker: _Worker, start: float) -> Extracted | None:
        """The finished, failed or timed-out result of a busy worker, or None if it is still running."""
        if worker.conn.poll():
            result = worker.receive()
            if result is not None:
                return result
            code = worker.exit_code()
            worker.kill()
            return _failure(f"{CRASHED}: exit code {code}", start)
        if time.perf_counter() - start >= self.timeout_s:
            worker.kill()
            return _failure(TIMEOUT, start)
        return None

    def extract(self, html: bytes, url: str) -> Extracted:
        [result] = self.map([(html, url)])
        return result


def extract_isolated(
    html: bytes, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, limits: Limits = DEFAULT_LIMITS
) -> Extracted:
    """``extract`` in a fresh worker process, killed after ``timeout_s`` seconds."""
    with ExtractionPool(1, timeout_s, limits) as pool:
        return pool.extract(html, url)
