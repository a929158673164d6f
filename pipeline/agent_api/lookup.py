"""Country and relation look-ups: the date-free half of the API (MIRAI Table 12, first group).

MIRAI matched unknown names with OpenAI embeddings. We stay offline and dependency-free:

- countries: every name we know for an ISO code (pipeline/reference/country_names.csv: our country
  table, pycountry's names, CLDR's English names, countryinfo's common and native names), compared
  without case, accents or punctuation, is scored against the query with difflib's ratio, boosted
  when one string contains the other or they share words; the best score per code ranks the codes.
- relations: BM25 (Okapi, as rank_bm25 computes it; see bm25.py) over each relation's "name: description"
  (the text MIRAI embedded), its parent's name, all analysed (lowercase, stemmed).

Relation descriptions are the versioned reference table ``cameo_descriptions.csv``
(``RELATION_DESCRIPTION_VERSION``): our paraphrases of the definitions in Schrodt's CAMEO codebook
v1.1b3 (2012), each with the codebook section it paraphrases (pipeline/reference/README.md).
"""

from __future__ import annotations

import re
import unicodedata
from difflib import SequenceMatcher
from functools import cache

import polars as pl

from pipeline.agent_api.bm25 import analysed_scores
from pipeline.agent_api.types import (
    CAMEOCode,
    Country,
    ISOCode,
    Relation,
    coerce_cameo,
    coerce_iso,
)
from pipeline.reference.tables import country_alternate_names, country_table, named_relations

TOP_K = 5
# Letters and digits of every script are kept: an ASCII-only pattern would turn a name in another
# script ("Российская Федерация", "中华人民共和国") into "", which every query contains.
_NON_WORD = re.compile(r"[\W_]+")


def _normalise(name: str) -> str:
    """Lower case, accents dropped ("Côte d’Ivoire" -> "cote d ivoire"), punctuation as spaces."""
    unaccented = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    return _NON_WORD.sub(" ", unaccented.lower()).strip()


@cache
def country_names() -> dict[str, str]:
    """ISO code -> its display name (our country table's identity row)."""
    rows = country_table().filter(pl.col("status") == "identity").select("iso3", "name").iter_rows()
    return dict(rows)


@cache
def _name_index() -> tuple[tuple[str, str], ...]:
    """(normalised name, ISO code) for every known name of every code."""
    pairs = {(_normalise(name), iso) for iso, names in country_alternate_names().items() for name in names}
    return tuple(sorted(pairs))


def _similarity(query: str, name: str) -> float:
    # Whole-string ratio, or a misspelt word matching one word of a long official name
    # ("Britian" in "United Kingdom of Great Britain and Northern Ireland").
    words = name.split()
    score = max(
        SequenceMatcher(None, query, name).ratio(),
        max(0.9 * SequenceMatcher(None, query, word).ratio() for word in words) if words else 0.0,
    )
    if query in name or name in query:
        score += 0.3
    shared = set(query.split()) & set(name.split())
    return score + 0.2 * len(shared)


def map_country_name_to_iso(name: str) -> list[Country]:
    """An exact (case-insensitive) name or ISO code gives that one country; otherwise the five most
    similar codes, best first."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    query = _normalise(name)
    names = country_names()
    if name.strip().upper() in names:
        iso = name.strip().upper()
        return [Country(ISOCode(iso), names[iso])]
    exact = sorted({iso for known, iso in _name_index() if known == query})
    if exact:
        return [Country(ISOCode(iso), names[iso]) for iso in exact]
    best: dict[str, float] = {}
    for known, iso in _name_index():
        best[iso] = max(best.get(iso, 0.0), _similarity(query, known))
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:TOP_K]
    return [Country(ISOCode(iso), names[iso]) for iso, _ in ranked]


def map_iso_to_country_name(iso_code: ISOCode | str) -> str:
    return country_names()[coerce_iso(iso_code).code]


@cache
def relations_frame() -> pl.DataFrame:
    """Every relation, first level ("04") and second level ("042"): code, name, description, and the
    text the look-up ranks (``search_text``)."""
    both = named_relations()
    first = both.filter(pl.col("code").str.len_chars() == 2).select("code", "name")
    parent = pl.col("code").str.slice(0, 2).replace_strict(dict(first.iter_rows()))
    return both.with_columns(pl.format("{}: {} {}", "name", "description", parent).alias("search_text"))


@cache
def _relations_by_code() -> dict[str, Relation]:
    return {
        code: Relation(CAMEOCode(code), name, description)
        for code, name, description in relations_frame().select("code", "name", "description").iter_rows()
    }


def map_cameo_to_relation(cameo_code: CAMEOCode | str) -> Relation:
    return _relations_by_code()[coerce_cameo(cameo_code).code]


def map_relation_description_to_cameo(description: str) -> list[Relation]:
    """An exact (case-insensitive) relation name, description or code gives that relation; otherwise
    the five best BM25 matches over names and descriptions, best first."""
    if not isinstance(description, str):
        raise TypeError(f"description must be a string, got {type(description).__name__}")
    frame = relations_frame()
    wanted = description.strip().lower()
    # MIRAI's look-up also takes a name or a description verbatim (api_implementation.py).
    exact = frame.filter(
        (pl.col("name").str.to_lowercase() == wanted)
        | (pl.col("description").str.to_lowercase() == wanted)
        | (pl.col("code") == wanted)
    )
    if exact.height:
        return [map_cameo_to_relation(code) for code in exact.get_column("code")]
    scores = analysed_scores(frame.get_column("search_text").to_list(), description)
    ranked = (
        frame.select("code")
        .with_columns(pl.Series("score", scores, dtype=pl.Float64))
        .filter(pl.col("score") > 0)
        .sort(["score", "code"], descending=[True, False])
        .head(TOP_K)
    )
    return [map_cameo_to_relation(code) for code in ranked.get_column("code")]


def get_parent_relation(cameo_code: CAMEOCode | str) -> Relation:
    code = coerce_cameo(cameo_code)
    if code.is_first_level:
        raise ValueError(f"only second-level (3-digit) relations have a parent, got {code.code}")
    return map_cameo_to_relation(code.code[:2])


def get_child_relations(cameo_code: CAMEOCode | str) -> list[Relation]:
    code = coerce_cameo(cameo_code)
    if not code.is_first_level:
        raise ValueError(f"only first-level (2-digit) relations have children, got {code.code}")
    return [rel for key, rel in _relations_by_code().items() if len(key) == 3 and key.startswith(code.code)]


def get_sibling_relations(cameo_code: CAMEOCode | str) -> list[Relation]:
    """The relations at the same level under the same parent, the given one included (as in MIRAI);
    for a first-level code, all twenty first-level relations."""
    code = coerce_cameo(cameo_code)
    if code.is_first_level:
        return [rel for key, rel in _relations_by_code().items() if len(key) == 2]
    return get_child_relations(code.code[:2])


def expand_relations(codes: list[CAMEOCode]) -> list[str]:
    """3-digit codes a relation filter stands for: a first-level code expands to its children."""
    out: set[str] = set()
    for code in codes:
        if code.is_first_level:
            out.update(rel.cameo_code.code for rel in get_child_relations(code))
        else:
            out.add(code.code)
    return sorted(out)


def warm_caches() -> None:
    """Load every table a look-up needs before a sandbox forbids opening files."""
    _name_index()
    _relations_by_code()
    map_country_name_to_iso("United States")
    map_relation_description_to_cameo("meet")
