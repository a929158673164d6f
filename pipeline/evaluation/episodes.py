"""An LLM run's episodes: every (round, query) episode, run up to the run's concurrency at once,
each checkpointed as it finishes, their live sandboxes bounded by the machine's memory and as many
warm spares kept (docs/evaluation.md, "Concurrency, rate limits and resume").

pipeline/evaluation/run.py scores and stores the trajectory records they return.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import date, timedelta

import polars as pl

from pipeline.agent_api import EventDatabase
from pipeline.agent_api.sandbox import DEFAULT_MEMORY_MB
from pipeline.agent_api.sandbox_spares import SPARES
from pipeline.evaluation.agents import code_libraries, react_environment, run_react, run_single_turn
from pipeline.evaluation.llm import ChatClient, ModelUnavailable
from pipeline.evaluation.registry import Agent
from pipeline.evaluation.throughput import (
    SANDBOX_SHARED_MB,
    SPARE_PRIVATE_MB,
    EpisodeLog,
    Progress,
    SandboxSlots,
    sandbox_cap,
    sandbox_start_mb,
)
from pipeline.evaluation.trajectory import AgentSpec, Query, Trajectory

# Episodes in a row that failed on transport (every retry of a request spent: trajectory.FAILURES)
# before the run stops: an endpoint that went away would otherwise cost every remaining episode its
# retries (15-30 s each) only to record it for the next run to do again.
TRANSPORT_FAILURES_TO_STOP = 3


class _SpareDemand:
    """The warm spares a concurrent ReAct run keeps (sandbox_spares.SparePool): one per live sandbox
    slot, started ahead while the first replies are awaited, and never more than the episodes
    that have yet to start a sandbox, so that no spare is started only to be stopped unused."""

    def __init__(self, libraries: tuple[str, ...], slots: int, episodes: int):
        self._libraries, self._slots, self._left = libraries, slots, episodes
        self._lock = threading.Lock()
        self._n = min(slots, episodes)
        SPARES.reserve(libraries, self._n)

    def started(self) -> None:
        """One episode has taken its sandbox, or ended without one."""
        with self._lock:
            self._left -= 1
            old, self._n = self._n, min(self._slots, self._left)
            if old != self._n:
                SPARES.resize(self._libraries, old, self._n)

    def release(self) -> None:
        with self._lock:
            SPARES.release(self._libraries, self._n)


class _CutoffOrder:
    """A run's sandboxes take the cutoff gate in cutoff order: an episode's first code block waits
    until every episode of an earlier cutoff in the run has ended. Inside a run the gate then never
    passes from a later cutoff to an earlier one, whose first block would start at a moment the
    later episode chose by when it ended (a re-attack of issue 30 read 4-5 bits from that moment).
    The run starts its episodes in cutoff order, so the earlier ones are running by then."""

    def __init__(self, cutoffs: list[date]):
        self._left = Counter(cutoffs)
        self._changed = threading.Condition()

    def wait_for_earlier(self, cutoff: date) -> None:
        with self._changed:
            self._changed.wait_for(lambda: min(self._left, default=cutoff) >= cutoff)

    def ended(self, cutoff: date) -> None:
        with self._changed:
            if cutoff in self._left:
                self._left[cutoff] -= 1
                if not self._left[cutoff]:
                    del self._left[cutoff]
                self._changed.notify_all()


class _SlottedEnvironment:
    """An episode's Environment whose sandbox counts against the run's SandboxSlots: the first
    code run (which starts the sandbox) waits for the episodes of earlier cutoffs (_CutoffOrder)
    and for a slot, closing (which stops it) frees it. ``started`` is called once the slot is taken
    (the run's _SpareDemand)."""

    def __init__(self, env, slots: SandboxSlots, started: Callable[[], None], order: _CutoffOrder | None, cutoff: date):
        self._env, self._slots, self._held, self._started = env, slots, False, started
        self._order, self._cutoff = order, cutoff

    def run_code(self, code: str, timeout_s: float | None = None, memory_mb: int | None = None) -> str:
        if not self._held:
            if self._order is not None:
                self._order.wait_for_earlier(self._cutoff)
            self._slots.acquire()
            self._held = True
            self._started()
        return self._env.run_code(code, timeout_s=timeout_s, memory_mb=memory_mb)

    @property
    def sandbox_report(self) -> dict | None:
        return self._env.sandbox_report

    def __enter__(self) -> _SlottedEnvironment:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._env.close()
        finally:
            if self._held:
                self._held = False
                self._slots.release()


def _pending(queries: list[Query], rounds: int, records: dict) -> list[tuple[int, Query]]:
    """The (round, query) episodes not in ``records``, in cutoff order across rounds (the distance
    is the run's), rounds apart within a cutoff: an episode's sandbox holds the cutoff gate from its
    first block to its end, so episodes in flight together share a cutoff, and inside a run the gate
    passes from earlier cutoffs to later ones only (_CutoffOrder), one episode at a time as well as
    many: a run that went round by round handed the gate back to the first cutoff at each new round,
    at a moment the last cutoff's agent chose."""
    return sorted(
        ((r, q) for r in range(rounds) for q in queries if (r, q.query_id) not in records),
        key=lambda episode: (episode[1].date, episode[0]),
    )


class _TransportStop:
    """Counts episodes that failed on transport in a row, in the order they finish, and stops the
    run (ModelUnavailable) at TRANSPORT_FAILURES_TO_STOP."""

    def __init__(self):
        self._in_a_row, self._lock = 0, threading.Lock()

    def note(self, record: dict) -> None:
        with self._lock:
            self._in_a_row = self._in_a_row + 1 if record.get("failure") == "transport" else 0
            if self._in_a_row == TRANSPORT_FAILURES_TO_STOP:
                raise ModelUnavailable(
                    f"the endpoint stopped answering: {TRANSPORT_FAILURES_TO_STOP} episodes in a row failed on "
                    f"transport (the last: {record.get('error')}); the episodes not run are left to the next run"
                )


def _episode(
    client: ChatClient,
    spec: AgentSpec,
    query: Query,
    distance: int,
    database: EventDatabase | None,
    database_lock: threading.Lock,
    sandboxes: SandboxSlots,
    started: Callable[[], None],
    order: _CutoffOrder | None,
) -> Trajectory:
    cutoff = query.date - timedelta(days=distance)
    if spec.strategy != "react":
        return run_single_turn(client, spec, query, cutoff)

    def environment():
        # EventDatabase loads its months on first use with no lock of its own; opening an
        # environment is a concat and a slice, and its sandbox starts later, in this episode's thread.
        with database_lock:
            env = react_environment(database, spec, query.date, distance)
        return _SlottedEnvironment(env, sandboxes, started, order, cutoff)

    return run_react(client, spec, query, cutoff, environment, first_day=database.start)


def _failed_episode(spec: AgentSpec, query: Query, exc: Exception) -> Trajectory:
    """An episode the harness itself could not finish: stored in end state "error" like a model
    failure, so that the other episodes' results are kept."""
    trajectory = Trajectory(query.query_id, spec.strategy, spec.action_type if spec.strategy == "react" else None)
    trajectory.end_state, trajectory.error = "error", f"{type(exc).__name__}: {exc}"
    trajectory.failed("harness")
    return trajectory


def episode_concurrency(agent: Agent, requested: int | None = None) -> int:
    """Episodes at once: ``requested`` or the agent's own (registry.Agent.episode_concurrency),
    never more than 1 for a GGUF model (its server answers one request at a time). (Their sandboxes are bounded apart, by
    ``sandbox_slots``: an episode waiting on the model holds no sandbox until its first code.)"""
    if agent.endpoint is None:
        return 1
    return max(1, requested or agent.episode_concurrency)


def sandbox_slots(concurrency: int, tables_mb: float, memory_mb: int = DEFAULT_MEMORY_MB) -> SandboxSlots:
    """Live sandboxes at most: as many as the episodes, and no more than fit in the machine's
    available memory (throughput.sandbox_cap), each with a warm spare beside it (the run reserves
    one spare per slot: sandbox_spares.SparePool), all mapping ``tables_mb`` of gated tables and the
    libraries' code (shared, once), and each sandbox allowed ``memory_mb`` on top of its start."""
    per_pair_mb = sandbox_start_mb(tables_mb) + SPARE_PRIVATE_MB
    shared_mb = tables_mb + SANDBOX_SHARED_MB
    return SandboxSlots(min(concurrency, sandbox_cap(memory_mb, per_pair_mb, shared_mb=shared_mb)))


def gated_tables_mb(database: EventDatabase, frame: pl.DataFrame, distance: int) -> float:
    """The largest gated tables an episode's sandbox gets: those of the latest query's cutoff."""
    events, news = database.gated_tables(frame.get_column("date").max() - timedelta(days=distance))
    return (events.estimated_size() + news.estimated_size()) / 2**20


def run_episodes(
    client: ChatClient,
    spec: AgentSpec,
    queries: list[Query],
    rounds: int,
    distance: int,
    database: EventDatabase | None,
    *,
    concurrency: int,
    log: EpisodeLog,
    progress: Progress,
    sandboxes: SandboxSlots | None = None,
) -> list[list[dict]]:
    """Every (round, query) episode's trajectory record, in round then query order whatever the
    order they ran in (cutoff order) or finished in; episodes in ``log`` are not
    run again, and each one run is appended to it as it finishes. ModelUnavailable stops the run
    (after the episodes in flight finish), and so do TRANSPORT_FAILURES_TO_STOP episodes in a row
    that failed on transport: the rest are left to the next run.
    ``sandboxes`` bounds the live sandboxes (default: one per episode in flight)."""
    lock, stop = threading.Lock(), _TransportStop()
    sandboxes = sandboxes or SandboxSlots(concurrency)
    records: dict[tuple[int, str], dict] = dict(log.done)
    for record in records.values():
        progress.done += 1
        progress.tokens_in += record["tokens_in"]
        progress.tokens_out += record["tokens_out"]
    pending = _pending(queries, rounds, records)
    # One at a time the order of ``pending`` is the order the gate is taken in.
    order = _CutoffOrder([q.date - timedelta(days=distance) for _, q in pending]) if concurrency > 1 else None
    spares = (
        _SpareDemand(code_libraries(spec), sandboxes.n, len(pending))
        if spec.strategy == "react" and concurrency > 1 and pending
        else None
    )

    def work(round_no: int, query: Query) -> None:
        once = threading.Lock()  # the episode counts once in the spare demand: at its sandbox or its end

        def started() -> None:
            if spares is not None and once.acquire(blocking=False):
                spares.started()

        try:
            trajectory = _episode(client, spec, query, distance, database, lock, sandboxes, started, order)
        except ModelUnavailable:
            raise
        except Exception as exc:
            trajectory = _failed_episode(spec, query, exc)
        finally:
            started()
            if order is not None:
                order.ended(query.date - timedelta(days=distance))
        # Through JSON once, so that a fresh episode's record and a resumed one's are the same.
        record = json.loads(json.dumps(trajectory.record(), default=str))
        log.append(round_no, query.query_id, record)
        records[(round_no, query.query_id)] = record
        progress.add(record["tokens_in"], record["tokens_out"])
        stop.note(record)

    if concurrency <= 1:
        for round_no, query in pending:
            work(round_no, query)
    else:
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="episode")
        try:
            for future in as_completed([pool.submit(work, r, q) for r, q in pending]):
                future.result()  # the first failure (ModelUnavailable) stops the run
        finally:
            # On a failure or an interruption (a terminated Dagster run) no new episode starts;
            # those in flight finish and are checkpointed, so the next run need not redo them.
            pool.shutdown(wait=True, cancel_futures=True)
            if spares is not None:
                spares.release()
    return [[records[(r, q.query_id)] for q in queries] for r in range(rounds)]
