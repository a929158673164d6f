"""Helpers shared by the great-expectations suite tests."""

from __future__ import annotations

import polars as pl

from quality.suites import SuiteResult


def set_row(df: pl.DataFrame, index: int, **values) -> pl.DataFrame:
    """``df`` with the given columns replaced in row ``index`` only."""
    at = pl.int_range(pl.len()) == index
    return df.with_columns(
        pl.when(at).then(pl.lit(v, df.schema[c])).otherwise(pl.col(c)).alias(c) for c, v in values.items()
    )


def failure(res: SuiteResult, expectation: str, column: str | None = None) -> dict:
    matches = [f for f in res.failures if f["expectation"] == expectation and (column is None or f["column"] == column)]
    assert matches, f"{expectation} on {column} not among the failures: {res.failures}"
    return matches[0]


def assert_fails_only(res: SuiteResult, expectation: str, column: str | None = None) -> dict:
    assert not res.passed
    f = failure(res, expectation, column)
    assert len(res.failures) == 1, res.failures
    return f
