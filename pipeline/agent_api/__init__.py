"""MIRAI's agent API over the monthly event database, behind a hard date gate.

``open_environment(data_dir, query_date, distance_days=1)`` (or ``EventDatabase(data_dir)
.environment(...)`` for many queries) gives an Environment holding only events and news dated on or
before ``query_date - distance_days``; its methods are MIRAI's functions (arXiv:2407.01231,
Appendix E, Table 12) and ``run_code`` runs an agent's code block in a locked-down child process.
``audit.leakage_violations`` checks an environment for leaks. User documentation: docs/agent_api.md.
"""

from pipeline.agent_api.environment import (
    API_FUNCTIONS,
    Environment,
    EventDatabase,
    open_environment,
)
from pipeline.agent_api.types import (
    CAMEOCode,
    Country,
    Date,
    DateGateError,
    DateRange,
    Event,
    ISOCode,
    NewsArticle,
    Relation,
)

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
