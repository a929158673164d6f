"""Okapi BM25 over a polars text column, computed on the candidate set of each call.

Corpus statistics (document frequencies, average length) come from the documents being ranked,
never from a precomputed index over the whole database: an index built over every month would
carry term statistics of articles after the cutoff into the ranking, a quiet leak. MIRAI ranked
the same way (rank_bm25's BM25Okapi built over the filtered documents).

Tokens are runs of letters and digits, lowercased. Query terms are reduced by a crude suffix
stripper and matched as word prefixes in the text (``attacks`` -> ``\\battack\\w*`` matches
"attacked", "attacking"), which stands in for a stemmer without a dependency.
"""

from __future__ import annotations

import re

import polars as pl

# Robertson & Zaragoza (2009), "The Probabilistic Relevance Framework: BM25 and Beyond", §3.3:
# k1 in [1.2, 2.0] and b = 0.75 are the usual defaults; rank_bm25 (MIRAI's library) uses 1.5/0.75.
K1 = 1.5
B = 0.75
TOKEN = re.compile(r"[a-z0-9]+")
TOKEN_PATTERN = r"[A-Za-z0-9]+"
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "will",
        "with",
        "not",
        "specified",
        "other",
        "otherwise",
    ]
)
_SUFFIXES = ("ations", "ation", "ions", "ion", "ings", "ing", "ies", "es", "ed", "s")
MIN_STEM = 4


def stem(token: str) -> str:
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= MIN_STEM:
            return token[: -len(suffix)]
    return token


def query_terms(text: str) -> list[str]:
    """Distinct stems of a query, in order of appearance, without stopwords."""
    seen: dict[str, None] = {}
    for token in TOKEN.findall(text.lower()):
        if token not in STOPWORDS:
            seen.setdefault(stem(token), None)
    return list(seen)


def _term_pattern(term: str) -> str:
    # The stem as a word prefix, case-insensitive: the text itself is never lowercased (a copy).
    return rf"(?i)\b{re.escape(term)}[a-z0-9]*"


def token_count(text: pl.Expr) -> pl.Expr:
    """Document length in tokens (what BM25 normalises term frequency by)."""
    return text.str.count_matches(TOKEN_PATTERN).cast(pl.Float64)


def bm25_scores(frame: pl.DataFrame, texts: tuple[str, ...], length: str, query: str) -> pl.Series:
    """BM25 score of every row for ``query`` (0.0 where no term matches); a row's document is the
    text of its ``texts`` columns together.

    ``length`` names a column holding each document's token count (see ``token_count``)."""
    terms = query_terms(query)
    if not terms or frame.height == 0:
        return pl.Series("score", [0.0] * frame.height, dtype=pl.Float64)
    n_docs = frame.height
    tf_cols = [f"__tf{i}" for i in range(len(terms))]
    with_tf = frame.select(
        pl.col(length).cast(pl.Float64).alias("__len"),
        *(
            pl.sum_horizontal(pl.col(text).str.count_matches(_term_pattern(term)) for text in texts)
            .cast(pl.Float64)
            .alias(col)
            for term, col in zip(terms, tf_cols)
        ),
    )
    norm = K1 * (1.0 - B + B * pl.col("__len") / pl.col("__len").mean().clip(lower_bound=1.0))
    parts = []
    for col in tf_cols:
        df = (pl.col(col) > 0).sum().cast(pl.Float64)
        # The "+1" form of the idf (Lucene's) stays positive for terms in more than half the documents.
        idf = ((n_docs - df + 0.5) / (df + 0.5) + 1.0).log()
        parts.append(idf * pl.col(col) * (K1 + 1.0) / (pl.col(col) + norm))
    return with_tf.select(pl.sum_horizontal(parts).alias("score")).get_column("score")
