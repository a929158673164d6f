"""The sandbox child: ``python -m pipeline.agent_api.sandbox_child``, started by sandbox.Sandbox.

Start-up, in this order: import everything agent code may use (polars, the API, the allow-listed
modules) and warm every cache that reads a file; read the configuration and the environment's
gated tables (Arrow IPC) from stdin; build the Environment; lock down (lockdown.py); reply with
what the lockdown applied; then run code blocks until stdin closes. The child is never given a
path to the database, so the only rows it can hold are the ones the parent sent.

Wire format both ways: a 4-byte big-endian length, then the payload (JSON, or IPC bytes for the
tables). A request is ``{"id": n, "code": ...}``, its reply ``{"id": n, "output": ...}``; the parent
checks every reply against that shape and a size cap (sandbox.py), since agent code can write
anything to the pipe.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import struct
import sys
from datetime import date

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
MAX_OBSERVATION_CHARS = 20_000
TRUNCATION_NOTE = f"\n[output truncated at {MAX_OBSERVATION_CHARS} characters]"


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


def _guarded_import(real_import):
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name.partition(".")[0] not in ALLOWED_MODULES:
            raise ImportError(
                f"import of {name!r} is not allowed in the sandbox; allowed: {', '.join(sorted(ALLOWED_MODULES))}"
            )
        return real_import(name, globals, locals, fromlist, level)

    return __import__


def agent_namespace(env) -> dict:
    """The globals agent code runs in: the API bound to ``env``, its data classes, safe builtins."""
    from pipeline.agent_api import types

    safe = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    safe["__import__"] = _guarded_import(builtins.__import__)
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


def _prepare_imports() -> None:
    import landlockpy
    import polars as pl
    import pyseccomp

    from pipeline.agent_api import lookup

    # Both find and load their C libraries now: after lockdown no file can be opened.
    pyseccomp.system_arch()
    landlockpy.abi_version()

    for name in ALLOWED_MODULES:
        __import__(name)
    lookup.warm_caches()
    # Start polars' thread pool and compile paths now: later, no thread may read cgroup files.
    frame = pl.DataFrame({"a": [1, 2, 2], "t": ["x y", "y", "z"]})
    frame.group_by("a").len().sort("a")
    frame.filter(pl.col("t").str.contains("(?i)y")).select(pl.col("t").str.count_matches(r"\bx"))


def main() -> None:
    import polars as pl

    from pipeline.agent_api.environment import Environment
    from pipeline.agent_api.lockdown import lock_down

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _prepare_imports()
    config = json.loads(read_message(stdin))
    events = pl.read_ipc(io.BytesIO(read_message(stdin)))
    news = pl.read_ipc(io.BytesIO(read_message(stdin)))
    env = Environment(
        events,
        news,
        start=date.fromisoformat(config["start"]),
        cutoff=date.fromisoformat(config["cutoff"]),
        query_date=date.fromisoformat(config["query_date"]),
        distance_days=config["distance_days"],
        tools=config["tools"],
        count_both_actors=config["count_both_actors"],
    )
    # Exercise every table path once so nothing lazy is left to initialise after lockdown.
    env.get_events(text_description="warm up")
    env.get_news_articles(keywords=["warm"])
    namespace = agent_namespace(env)
    del events, news
    report = lock_down(
        memory_mb=config["memory_mb"],
        cpu_budget_s=config["cpu_budget_s"],
        allowed_modules=ALLOWED_MODULES,
        parent_mount_namespace=config["parent_mount_namespace"],
    )
    write_message(stdout, json.dumps({"ready": report}).encode())
    while True:
        try:
            request = json.loads(read_message(stdin))
        except EOFError:
            return
        output = run_block(request["code"], namespace)
        write_message(stdout, json.dumps({"id": request["id"], "output": output}).encode())


if __name__ == "__main__":
    main()
