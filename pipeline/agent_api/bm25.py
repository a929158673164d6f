"""Okapi BM25 as MIRAI ranks news, and the analysed variant the relation look-up uses.

MIRAI's ``get_events`` / ``get_news_articles`` (``APIs/api_implementation.py`` in
github.com/yecchen/MIRAI) rank with ``BM25Okapi`` of rank_bm25 (github.com/dorianbrown/rank_bm25,
0.2.2; k1 = 1.5, b = 0.75, a negative idf replaced by 0.25 x the mean idf of the corpus's terms).
``okapi_scores`` computes the same scores, bit for bit (tests/test_agent_api.py checks it against
rank_bm25 on random corpora), with polars doing the counting: rank_bm25 builds a Python dict per
document, 2 to 20 times slower on a month of articles (seconds for an agent's broad text search).

The index is built over the documents being ranked in that call and nothing else: an index over
every month would carry term statistics of articles after the cutoff into the ranking, a quiet
leak. MIRAI does the same (it builds ``BM25Okapi`` over the filtered articles on every call), so
gating costs no compatibility.

MIRAI's analysis is none: a document is ``title + " " + text`` split on single spaces, the query
likewise, case and punctuation kept ("Election," and "election" are different terms). The relation
look-up stands in for MIRAI's embedding search, so it analyses (lowercase, drop stopwords, strip
suffixes) to let "arrests" find "Arrest or detain"; see docs/agent_api.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import polars as pl

# rank_bm25 0.2.2's BM25Okapi defaults, which MIRAI uses.
K1 = 1.5
B = 0.75
EPSILON = 0.25
TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were will with "
    "not specified other otherwise".split()
)
_SUFFIXES = ("ations", "ation", "ions", "ion", "ings", "ing", "ies", "es", "ed", "s")
MIN_STEM = 4


def mirai_tokens(title: pl.Expr, text: pl.Expr) -> pl.Expr:
    """The terms MIRAI ranks an article by: ``(title + " " + text).split(" ")`` (runs of spaces give
    empty terms, as there)."""
    return pl.concat_str([title, text], separator=" ").str.split(" ")


def _idf(n_docs: int, doc_freq: int) -> float:
    # math.log, not np.log: numpy's SIMD log may differ from libm's in the last bit.
    return math.log(n_docs - doc_freq + 0.5) - math.log(doc_freq + 0.5)


def _mean_idf(tokens: pl.Series, n_docs: int) -> float:
    """rank_bm25's ``average_idf``: the idf of every distinct term, summed in order of first
    appearance (its dict's order) and divided by their number."""
    vocab = (
        pl.DataFrame({"doc": pl.int_range(len(tokens), eager=True), "term": tokens})
        .explode("term")
        .with_row_index("pos")
        .group_by("term")
        .agg(pl.col("doc").n_unique().alias("df"), pl.col("pos").first())
        .sort("pos")
        .get_column("df")
    )
    idf_of = {int(freq): _idf(n_docs, int(freq)) for freq in vocab.unique()}
    idf = vocab.replace_strict(idf_of, return_dtype=pl.Float64).to_numpy()
    # Sequential sum, as rank_bm25's loop (np.add.accumulate never reassociates).
    return float(np.add.accumulate(idf)[-1]) / len(idf)


def okapi_scores(tokens: pl.Series, query: Sequence[str]) -> np.ndarray:
    """rank_bm25 ``BM25Okapi(list(tokens)).get_scores(query)``: one score per document of
    ``tokens`` (a List[String] series), every query term counted as often as it occurs."""
    n_docs = len(tokens)
    if n_docs == 0:
        return np.zeros(0)
    doc_len = tokens.list.len().cast(pl.Int64).to_numpy()
    avgdl = int(doc_len.sum()) / n_docs
    freqs = {term: tokens.list.count_matches(term).cast(pl.Int64).to_numpy() for term in dict.fromkeys(query)}
    idf = {term: _idf(n_docs, df) for term, tf in freqs.items() if (df := int(np.count_nonzero(tf)))}
    if any(value < 0 for value in idf.values()):
        floor = EPSILON * _mean_idf(tokens, n_docs)
        idf = {term: floor if value < 0 else value for term, value in idf.items()}
    score = np.zeros(n_docs)
    for term in query:  # the same expression, in the same order, as rank_bm25's get_scores
        tf = freqs[term]
        score += (idf.get(term) or 0) * (tf * (K1 + 1) / (tf + K1 * (1 - B + B * doc_len / avgdl)))
    return score


def rank_mirai(tokens: pl.Series, query: str, limit: int) -> list[int]:
    """Positions in ``tokens`` (see ``mirai_tokens``) of the ``limit`` best documents for ``query``,
    best first, as MIRAI orders them: highest BM25Okapi score first, equal scores later document
    first.

    MIRAI takes ``np.argsort(scores)[::-1]``; numpy's default sort is not stable, so its order among
    equal scores depends on the numpy build and CPU (SIMD sorts). Later-first is what that expression
    gives wherever the sort keeps equal keys in place (a stable sort; all-equal scores on the builds
    we tried), and it is the same on every machine."""
    if len(tokens) == 0 or limit <= 0:
        return []
    scores = okapi_scores(tokens, query.split(" "))
    return np.argsort(scores, kind="stable")[::-1][:limit].tolist()


def stem(token: str) -> str:
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= MIN_STEM:
            return token[: -len(suffix)]
    return token


def analysed_terms(text: str) -> list[str]:
    """Lowercased letter-and-digit runs without stopwords, each reduced by a crude suffix stripper."""
    return [stem(token) for token in TOKEN.findall(text.lower()) if token not in STOPWORDS]


def analysed_scores(documents: Sequence[str], query: str) -> np.ndarray:
    """BM25Okapi score of every document for ``query``, both analysed by ``analysed_terms``; each
    query term counts once."""
    tokens = pl.Series([analysed_terms(doc) for doc in documents], dtype=pl.List(pl.String))
    return okapi_scores(tokens, list(dict.fromkeys(analysed_terms(query))))
