"""Okapi BM25 as MIRAI ranks news, and the analysed variant the relation look-up uses.

Scores come from rank_bm25's ``BM25Okapi`` (k1 = 1.5, b = 0.75, idf floored at 0.25 x the mean
idf), the library and settings MIRAI's ``get_events`` / ``get_news_articles`` use
(``APIs/api_implementation.py`` in github.com/yecchen/MIRAI). The index is built over the documents
being ranked in that call and nothing else: an index over every month would carry term statistics
of articles after the cutoff into the ranking, a quiet leak. MIRAI does the same (it builds
``BM25Okapi`` over the filtered articles on every call), so gating costs no compatibility.

MIRAI's analysis is none: a document is ``title + " " + text`` split on single spaces, the query
likewise, case and punctuation kept ("Election," and "election" are different terms). The relation
look-up stands in for MIRAI's embedding search, so it analyses (lowercase, drop stopwords, strip
suffixes) to let "arrests" find "Arrest or detain"; see docs/agent_api.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from rank_bm25 import BM25Okapi

TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were will with "
    "not specified other otherwise".split()
)
_SUFFIXES = ("ations", "ation", "ions", "ion", "ings", "ing", "ies", "es", "ed", "s")
MIN_STEM = 4


def mirai_document(title: str, text: str) -> str:
    """The text MIRAI ranks for an article: its title and full text joined by one space."""
    return f"{title} {text}"


def mirai_tokens(text: str) -> list[str]:
    """MIRAI's tokenisation: ``str.split(" ")``, so runs of spaces give empty tokens, as there."""
    return text.split(" ")


def rank_mirai(documents: Sequence[str], query: str, limit: int) -> list[int]:
    """Positions in ``documents`` of the ``limit`` best matches for ``query``, best first, as MIRAI
    orders them: BM25Okapi scores over MIRAI's tokens, highest first, equal scores later document
    first.

    MIRAI takes ``np.argsort(scores)[::-1]``; numpy's default sort is not stable, so its order among
    equal scores depends on the numpy build and CPU (SIMD sorts). Later-first is what that expression
    gives wherever the sort keeps equal keys in place (all-equal scores on every build; small arrays
    on numpy 1.x without AVX-512), and it is the same on every machine."""
    if not documents or limit <= 0:
        return []
    scores = BM25Okapi([mirai_tokens(doc) for doc in documents]).get_scores(mirai_tokens(query))
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
    if not documents:
        return np.zeros(0)
    terms = list(dict.fromkeys(analysed_terms(query)))
    return BM25Okapi([analysed_terms(doc) for doc in documents]).get_scores(terms)
