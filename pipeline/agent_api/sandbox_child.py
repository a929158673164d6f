"""The sandbox's processes: ``python -m pipeline.agent_api.sandbox_child --control=FD``, started by
sandbox.py once per set of libraries, is a *template*; every sandbox child is forked from it.

The template imports what agent code may use (polars, pyarrow, the allow-listed modules, the
libraries named in ``--libraries``) but runs no polars query, since polars' thread pool does not
survive fork(2). Then, for each request on its control socket (the word ``fork`` and five
descriptors: stdin, stdout, stderr, handover socket, status pipe), it forks a child and answers
with a pidfd of it. That child keeps only those five descriptors, enters new user, mount, IPC,
network and PID namespaces and forks the *sandbox child* (PID 1 there); it waits for it and writes
its exit code to the status pipe (the parent cannot wait for a process it did not start). The
sandbox child imports the API and warms every cache that reads a file, then is a *warm spare*
holding no table and no code until the parent hands it an episode over the handover socket: the
configuration, then the read-only descriptors of the environment's gated table files (SCM_RIGHTS,
one message per part); it closes that socket, maps the files and closes their descriptors, builds
the Environment, locks down (lockdown.py), replies with what the lockdown applied, then runs code
blocks until stdin closes. It is never given a path, only descriptors of its cutoff's files, so
the only rows it can hold are the ones on or before its cutoff (docs/agent_api.md, "Warm spares").

Wire format both ways: a 4-byte big-endian length, then a JSON payload. A request is ``{"id": n, "code": ...}``, its reply ``{"id": n, "output": ...}``; the parent
checks every reply against that shape and a size cap (sandbox.py), since agent code can write
anything to the pipe.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import io
import json
import os
import resource
import socket
import struct
import sys
import traceback
from datetime import date

from pipeline.agent_api.sandbox_protocol import (
    FORK,
    FORKED,
    HANDOVER_FD,
    LIBRARIES,
    MAX_OBSERVATION_CHARS,
    SPARE_DESCRIPTORS,
    STATUS_FD,
    TRUNCATION_NOTE,
    WARM,
)

# Every other import of this module is inside the function that uses it, and must stay there:
# this module is the template's __main__ (and the parent imports it for ALLOWED_MODULES), and the
# template imports only what _import_for_template and _load_libraries name (landlockpy, polars,
# pyarrow, pyseccomp, the allow-listed modules, the libraries), in that order, and runs no polars
# query. The API (environment, lookup, types) is imported in each sandbox child after the fork:
# importing environment.py reads the reference tables with polars (its enums), which starts
# polars' thread pool, and a child forked from a template with a pool inherits its state without
# its threads (docs/agent_api.md, "Warm spares"). lockdown (and fcntl, mmap) are imported by the
# forked processes that use them (fork_spare, serve_episode), not by the template. None of these
# imports hides a cycle: no module they import imports this one (sandbox.py shares only
# sandbox_protocol.py with it).

# Modules agent code may import. Each is imported before lockdown, so importing it later reads
# no file; anything else is refused by the import guard and the audit hook.
ALLOWED_MODULES = frozenset(
    {
        "math",
        "cmath",
        "statistics",
        "collections",
        "itertools",
        "functools",
        "operator",
        "datetime",
        "calendar",
        "json",
        "re",
        "random",
        "string",
        "textwrap",
        "heapq",
        "bisect",
        "decimal",
        "fractions",
        "typing",
        "dataclasses",
        "copy",
        "pprint",
        "enum",
        "time",
    }
)
# Builtins agent code does not get: file and console access, the interactive helpers.
REMOVED_BUILTINS = ("open", "input", "breakpoint", "help", "exit", "quit", "copyright", "credits", "license")
WARM_UP_ROWS = 256
# The read-only mappings of the table files (MAP_SHARED, PROT_READ), held for the child's lifetime:
# the tables' buffers point into them.
MAPPINGS: list = []


def read_message(stream) -> bytes:
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError("sandbox pipe closed")
    (size,) = struct.unpack(">I", header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("sandbox pipe closed mid-message")
    return payload


def write_message(stream, payload: bytes) -> None:
    stream.write(struct.pack(">I", len(payload)) + payload)
    stream.flush()


# Audit events a library raises in ordinary use, allowed in a child that loaded it (the audit hook
# is a convenience, not a defence: docs/agent_api.md). pandas walks frames (sys._getframe) to
# attribute warnings and to resolve names in DataFrame.query/eval, reads functions' __code__ and
# __defaults__ (object.__getattr__) through inspect.signature, e.g. in resample and pivot_table,
# and sets attributes on the classes collections.namedtuple builds (object.__setattr__), e.g. in
# DataFrame.itertuples. scikit-learn calls inspect.signature too (BaseEstimator.get_params) and
# builds array.array buffers (its text vectorizers); networkx's argmap decorator compiles each
# decorated function's wrapper on first call and sets its __code__ (object.__setattr__).
_INTROSPECTION = ("sys._getframe", "object.__getattr__", "object.__setattr__")
LIBRARY_EVENTS = {"pandas": _INTROSPECTION, "sklearn": (*_INTROSPECTION, "array.__new__"), "networkx": _INTROSPECTION}


def _guarded_import(real_import, libraries: frozenset[str]):
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.partition(".")[0]
        if level != 0 or not (top in ALLOWED_MODULES or top in libraries):
            missing = " (not loaded in this sandbox)" if top in LIBRARIES else ""
            allowed = ", ".join(sorted(ALLOWED_MODULES | libraries))
            raise ImportError(f"import of {name!r} is not allowed in the sandbox{missing}; allowed: {allowed}")
        return real_import(name, globals, locals, fromlist, level)

    return __import__


def agent_namespace(env, libraries: frozenset[str] = frozenset()) -> dict:
    """The globals agent code runs in: the API bound to ``env``, its data classes, safe builtins.
    ``libraries``: the LIBRARIES this child loaded, importable besides ALLOWED_MODULES."""
    from pipeline.agent_api import types

    safe = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    safe["__import__"] = _guarded_import(builtins.__import__, libraries)
    namespace = {"__builtins__": safe, "__name__": "__agent__"}
    for name in (
        "Date",
        "DateRange",
        "ISOCode",
        "Country",
        "CAMEOCode",
        "Relation",
        "Event",
        "NewsArticle",
        "DateGateError",
    ):
        namespace[name] = getattr(types, name)
    namespace.update(env.functions())
    return namespace


def run_block(code: str, namespace: dict) -> str:
    """Execute ``code``; return captured stdout plus the repr of a final expression, or the error as
    'ErrorType: message' after whatever was printed before it."""
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        tree = ast.parse(code, mode="exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<agent>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<agent>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}")
    finally:
        sys.stdout, sys.stderr = saved
    text = out.getvalue()
    if len(text) > MAX_OBSERVATION_CHARS:
        text = text[:MAX_OBSERVATION_CHARS] + TRUNCATION_NOTE
    return text


def _import_for_template() -> None:
    """What every spare needs, imported once in the template. No polars query runs here: polars
    starts its thread pool on the first one, and a forked child would inherit the pool's state
    without its threads."""
    import landlockpy
    import polars  # noqa: F401
    import pyarrow.ipc  # noqa: F401
    import pyseccomp

    # Both find and load their C libraries now: after lockdown no file can be opened.
    pyseccomp.system_arch()
    landlockpy.abi_version()
    for name in ALLOWED_MODULES:
        __import__(name)


def _warm_spare() -> None:
    """In each sandbox child, after the fork: the API (its import reads the reference tables with
    polars), the look-up caches, polars' thread pool and compiled paths; later no thread may read
    a file."""
    import polars as pl

    from pipeline.agent_api import lookup

    lookup.warm_caches()
    frame = pl.DataFrame({"a": [1, 2, 2], "t": ["x y", "y", "z"]})
    frame.group_by("a").len().sort("a")
    frame.filter(pl.col("t").str.contains("(?i)y")).select(pl.col("t").str.count_matches(r"\bx"))


def _load_libraries(requested: list[str]) -> tuple[frozenset[str], str]:
    """Import the requested LIBRARIES this interpreter has, with the submodules they load lazily on
    first use, since after lockdown no file can be read to import anything. Returns the names
    loaded and a description for the report: each with its version, or why it is not loaded (not
    installed, or its import failed: a broken optional install costs that library, not the
    sandbox)."""
    loaded, described = set(), []
    for name in requested:
        if importlib.util.find_spec(name) is None:
            described.append(f"{name} not installed")
            continue
        try:
            module = importlib.import_module(name)
            _WARM_UPS[name](module)
        except Exception as exc:
            described.append(f"{name} failed to import ({type(exc).__name__}: {str(exc)[:100]})")
            continue
        loaded.add(name)
        described.append(f"{name} {getattr(module, '__version__', '(no version)')}")
    return frozenset(loaded), ", ".join(described) or "none"


def _warm_numpy(np) -> None:
    # Submodules numpy imports on first attribute access (numpy/__init__.py, __getattr__), but
    # testing, matlib, f2py and typing, which are not for analysing data.
    for sub in ("linalg", "fft", "random", "polynomial", "ma", "ctypeslib", "char", "rec", "strings", "dtypes"):
        importlib.import_module(f"numpy.{sub}")
    rng = np.random.default_rng(0)
    sample = rng.normal(size=(8, 8))
    np.linalg.solve(sample + 8 * np.eye(8), np.ones(8))
    np.percentile(sample, [10, 50]), np.histogram(sample), np.corrcoef(sample), str(sample)


def _warm_pandas(pd) -> None:
    frame = pd.DataFrame(
        {"date": pd.to_datetime(["2023-11-01", "2023-11-02", "2023-11-02"]), "r": ["010", "042", "010"], "n": [1, 2, 3]}
    )
    frame.groupby("r")["n"].agg(["sum", "mean", "count"]).sort_values("sum")
    frame.pivot_table(index="date", columns="r", values="n", aggfunc="sum", fill_value=0)
    frame.set_index("date").resample("D")["n"].sum().rolling(2).mean()
    frame.merge(frame, on="r").describe(include="all")
    frame["r"].value_counts(normalize=True), frame["r"].str.startswith("0"), frame.to_dict("records")
    repr(frame), frame.to_string(), frame.to_csv(), frame.to_json(), frame.to_html(), str(frame.dtypes)
    if importlib.util.find_spec("pyarrow") is not None:  # pandas' Arrow-backed dtypes load modules on first use
        frame["r"].astype("string[pyarrow]").str.len(), frame["n"].astype("int64[pyarrow]").sum()


def _warm_networkx(nx) -> None:
    graph = nx.DiGraph([("USA", "CHN"), ("CHN", "RUS"), ("RUS", "USA")])
    nx.degree_centrality(graph), nx.betweenness_centrality(graph), nx.shortest_path(graph, "USA", "RUS")
    list(nx.connected_components(graph.to_undirected())), nx.to_numpy_array(graph)
    try:  # these import scipy on first use
        nx.pagerank(graph), nx.adjacency_matrix(graph)
    except ImportError:  # scipy is optional for networkx: without it they fail after lockdown too
        pass


# scikit-learn's subpackages are imported only when named (sklearn/__init__.py): the common ones.
SKLEARN_SUBPACKAGES = (
    "linear_model",
    "cluster",
    "ensemble",
    "tree",
    "neighbors",
    "naive_bayes",
    "svm",
    "decomposition",
    "preprocessing",
    "impute",
    "metrics",
    "model_selection",
    "pipeline",
    "feature_extraction.text",
)


def _warm_sklearn(sklearn) -> None:
    for sub in SKLEARN_SUBPACKAGES:
        importlib.import_module(f"sklearn.{sub}")
    x, y = [[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [2.0, 0.0]], [0, 1, 0, 1]
    sklearn.linear_model.LogisticRegression().fit(x, y).get_params()
    sklearn.ensemble.RandomForestClassifier(n_estimators=2, random_state=0).fit(x, y).predict(x)
    sklearn.cluster.KMeans(n_clusters=2, n_init=1, random_state=0).fit(x)
    sklearn.feature_extraction.text.TfidfVectorizer().fit_transform(["troops moved", "talks resumed"])


_WARM_UPS = {"numpy": _warm_numpy, "pandas": _warm_pandas, "networkx": _warm_networkx, "sklearn": _warm_sklearn}


def _map_table(fd: int):
    """An Arrow IPC file on an inherited read-only descriptor as a DataFrame over its mapped bytes
    (MAP_SHARED, PROT_READ): string views and fixed-width buffers are used in place, not copied.
    The descriptor is closed; the mapping keeps the file."""
    import mmap

    import polars as pl
    import pyarrow as pa
    import pyarrow.ipc

    try:
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    MAPPINGS.append(mapped)
    return pl.from_arrow(pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))).read_all(), rechunk=False)


def map_tables(table_fds: list[list[int]]):
    """(events, news): the parts on ``table_fds`` ([events fd, news fd] per part), concatenated in
    order without copying."""
    import polars as pl

    parts = [(_map_table(events_fd), _map_table(news_fd)) for events_fd, news_fd in table_fds]
    return pl.concat([e for e, _ in parts], rechunk=False), pl.concat([n for _, n in parts], rechunk=False)


def receive_episode(handover: int) -> tuple[dict, list[list[int]]]:
    """Tell the parent this spare is warm (its imports done: the pool starts the next spare only
    then, so spares never warm side by side), then wait for an episode: the configuration and
    the (events, news) descriptors per part, over the SOCK_SEQPACKET socket ``handover`` (one
    message each), which is then closed: after this the child holds no channel to the parent but
    its pipes."""
    with socket.socket(fileno=handover) as channel:
        channel.send(WARM)
        config = json.loads(channel.recv(1 << 20))
        table_fds = []
        for _ in range(config["parts"]):
            _, fds, flags, _ = socket.recv_fds(channel, 1, 2)
            if len(fds) != 2 or flags & socket.MSG_CTRUNC:
                raise RuntimeError(f"a table part with {len(fds)} descriptors, not 2 (flags {flags:#x})")
            table_fds.append(fds)
    return config, table_fds


def serve_episode(loaded: frozenset[str], libraries: str, namespaces: str) -> int:
    """The sandbox child: warm up, wait as a spare on HANDOVER_FD, then serve one episode."""
    from pipeline.agent_api.environment import Environment
    from pipeline.agent_api.lockdown import lock_down
    from pipeline.agent_api.types import set_rendering

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _warm_spare()
    config, table_fds = receive_episode(HANDOVER_FD)
    events, news = map_tables(table_fds)
    settings = {
        "start": date.fromisoformat(config["start"]),
        "cutoff": date.fromisoformat(config["cutoff"]),
        "query_date": date.fromisoformat(config["query_date"]),
        "distance_days": config["distance_days"],
        "tools": config["tools"],
        "count_both_actors": config["count_both_actors"],
        "dialect": config["dialect"],
    }
    # The process serves this one environment: its data classes print in its dialect.
    set_rendering(config["dialect"])
    env = Environment(events, news, **settings)
    # Exercise every table path once so nothing lazy is left to initialise after lockdown: on the
    # first rows only (same schema, same code paths), since a full scan would read every mapped page.
    sample = Environment(events.head(WARM_UP_ROWS), news.head(WARM_UP_ROWS), **settings)
    sample.get_events(text_description="warm up")
    sample.get_news_articles(keywords=["warm"])
    del sample
    namespace = agent_namespace(env, loaded)
    del events, news
    report = lock_down(
        memory_mb=config["memory_mb"],
        cpu_budget_s=config["cpu_budget_s"],
        allowed_modules=ALLOWED_MODULES,
        libraries=loaded,
        library_events=frozenset(event for name in loaded for event in LIBRARY_EVENTS.get(name, ())),
        parent_mount_namespace=config["parent_mount_namespace"],
    )
    report["libraries"] = libraries
    report["namespaces"] = namespaces
    write_message(stdout, json.dumps({"ready": report}).encode())
    while True:
        try:
            request = json.loads(read_message(stdin))
        except EOFError:
            return 0
        output = run_block(request["code"], namespace)
        write_message(stdout, json.dumps({"id": request["id"], "output": output}).encode())


def _keep_only(fds: list[int]) -> None:
    """Renumber ``fds`` to 0, 1, ... and close every other descriptor (the template's control
    socket included)."""
    import fcntl

    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in fds]  # above the targets, then down
    for target, fd in enumerate(moved):
        os.dup2(fd, target)
    os.closerange(len(fds), resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def fork_spare(fds: list[int], template_pid: int, loaded: frozenset[str], libraries: str) -> int:
    """In the template's forked child: keep the request's descriptors only, enter new namespaces,
    fork the sandbox child (serve_episode) and report its exit code on STATUS_FD. Returns this
    process's exit code (the sandbox child's, in the sandbox child)."""
    from pipeline.agent_api.lockdown import NAMESPACES, die_with_parent, enter_namespaces

    _keep_only(fds)
    namespaces = enter_namespaces()
    # After unshare(2): a change of credentials clears the parent-death signal (prctl(2)).
    die_with_parent(template_pid)
    waiter = os.getpid()
    sandbox = os.fork()
    if sandbox == 0:
        os.close(STATUS_FD)
        # PID 1 of a new namespace sees no parent (getppid() is 0): nothing to check against.
        die_with_parent(None if namespaces == NAMESPACES else waiter)
        return serve_episode(loaded, libraries, namespaces)
    for fd in (0, 1, HANDOVER_FD):
        os.close(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(sandbox, 0)[1])
    os.write(STATUS_FD, str(code).encode())
    return 0


def serve_template(control_fd: int, requested: list[str]) -> None:
    """Import once, then fork a spare per request on ``control_fd`` until the parent closes it."""
    _import_for_template()
    loaded, libraries = _load_libraries(requested)
    template_pid = os.getpid()
    control = socket.socket(fileno=control_fd)
    control.send(WARM)
    while True:
        message, fds, flags, _ = socket.recv_fds(control, 64, len(SPARE_DESCRIPTORS))
        if not message:
            return
        while True:  # reap the forked children that have ended (each one's pidfd is the parent's)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if message != FORK or len(fds) != len(SPARE_DESCRIPTORS) or flags & socket.MSG_CTRUNC:
            raise RuntimeError(f"a fork request {message[:20]!r} with {len(fds)} descriptors (flags {flags:#x})")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.detach()
                code = fork_spare(fds, template_pid, loaded, libraries)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(control, [FORKED], [pidfd])
        finally:
            os.close(pidfd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--libraries", default="", help="comma-separated names from LIBRARIES")
    parser.add_argument("--control", type=int, required=True, help="the inherited socket fork requests arrive on")
    args = parser.parse_args()
    serve_template(args.control, [name for name in args.libraries.split(",") if name])


if __name__ == "__main__":
    main()
