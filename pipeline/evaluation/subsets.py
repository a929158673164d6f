"""`--limit N`: a handful of a query set's queries to try an agent on, the same ones on every
machine and in every command (`mirai evaluate`, `mirai score`, `mirai submit`;
docs/evaluate-your-agent.md, "A few queries first").

The subset is a rule, not a file: the N queries whose SHA-256 of SUBSET_SEED + query id is
smallest, in the query set's own order. It depends only on the query ids (not on a file's row
order or a random generator's version), so a subset of N is part of every larger one, and
anyone can redo it with ``sha256sum``. The queries file itself is never rewritten, so its sha256
still matches the release's manifest.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import polars_hash as plh

SUBSET_SEED = "mirai-limit-v1:"
SUBSET_RULE = f"the N queries with the smallest SHA-256 (hex) of {SUBSET_SEED!r} + query_id, in the query set's order"


def limit_queries(frame: pl.DataFrame, limit: int | None) -> pl.DataFrame:
    """The ``limit`` queries of ``frame`` (with a ``query_id`` column) that SUBSET_RULE picks;
    ``frame`` itself when ``limit`` is None or not below its height."""
    if limit is None or limit >= frame.height:
        return frame
    key = plh.concat_str(pl.lit(SUBSET_SEED), pl.col("query_id")).chash.sha2_256()
    return frame.filter(key.rank("ordinal") <= limit)


def limit_ids(query_ids: Sequence[str], limit: int | None) -> list[str]:
    """The query ids SUBSET_RULE picks of ``query_ids``, in their order."""
    return limit_queries(pl.DataFrame({"query_id": list(query_ids)}, schema={"query_id": pl.String}), limit)[
        "query_id"
    ].to_list()


def subset_record(limit: int | None, of: int) -> dict | None:
    """What a run or scorecard records of its subset: None for the whole query set."""
    if limit is None or limit >= of:
        return None
    return {"limit": limit, "of": of, "rule": SUBSET_RULE}


def is_subset(answered: set[str], query_ids: Sequence[str]) -> bool:
    """Whether ``answered`` is exactly the subset SUBSET_RULE picks of ``query_ids`` for its size,
    short of all of them: a `mirai evaluate --limit` run's predictions."""
    return 0 < len(answered) < len(query_ids) and set(limit_ids(query_ids, len(answered))) == answered
