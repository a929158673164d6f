"""MIRAI's agent API over the monthly event database, behind a hard date gate.

``open_environment(data_dir, query_date, distance_days=1)`` (or ``EventDatabase(data_dir)
.environment(...)`` for many queries) gives an Environment holding only events and news dated on or
before ``query_date - distance_days``; its methods are MIRAI's functions (arXiv:2407.01231,
Appendix E, Table 12) and ``run_code`` runs an agent's code block in a locked-down child process.
``audit.leakage_violations`` checks an environment for leaks. User documentation: docs/agent_api.md.
"""

import importlib

# Loaded on first use (PEP 562): the sandbox's template imports sandbox_child.py from this package
# and must not import the API, whose import runs polars queries (the reference tables) and so starts
# polars' thread pool, which a forked child cannot use (sandbox_child.py).
_MODULE_OF = {
    "API_FUNCTIONS": "environment",
    "Environment": "environment",
    "EventDatabase": "event_database",
    "open_environment": "event_database",
    **dict.fromkeys(
        ("CAMEOCode", "Country", "Date", "DateGateError", "DateRange", "Event", "ISOCode", "NewsArticle", "Relation"),
        "types",
    ),
}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.agent_api.{_MODULE_OF[name]}"), name)


__all__ = [
    "API_FUNCTIONS",
    "CAMEOCode",
    "Country",
    "Date",
    "DateGateError",
    "DateRange",
    "Environment",
    "Event",
    "EventDatabase",
    "ISOCode",
    "NewsArticle",
    "Relation",
    "open_environment",
]
