"""The versioned reference tables: CAMEO actor country -> ISO 3166-1 alpha-3, every country's names,
MIRAI's CAMEO relations and their descriptions.

All are CSV files committed next to this module, so the pipeline needs nothing outside the
repository at run time. Every column is read as text because codes carry leading zeros ("010")
that a numeric type would drop. Frames are cached: treat them as read-only.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import polars as pl

# Bump when countries.csv changes (rerun build.py); data built under one version is not
# comparable with data built under another, because rows may move between kept and dropped.
COUNTRY_TABLE_VERSION = "countries-v1"
# Bump when regions.csv changes (rerun build.py).
REGION_TABLE_VERSION = "regions-v1"
# Bump when cameo_relations.csv changes.
RELATION_TABLE_VERSION = "cameo-relations-v1"
# Bump when cameo_descriptions.csv changes: the descriptions agents read (map_cameo_to_relation) and
# match against (map_relation_description_to_cameo), so answers under two versions may differ.
RELATION_DESCRIPTION_VERSION = "cameo-descriptions-v1"
# Bump when country_names.csv changes (rerun build.py): the look-up (map_country_name_to_iso) and
# MIRAI's dict_iso2alternames_GeoNames.json take their names from it.
COUNTRY_NAMES_VERSION = "country-names-v2"
# The versions of the sources country_names.csv was built from; build.py rewrites this line.
COUNTRY_NAME_SOURCES = {"pycountry": "26.2.16", "babel": "2.18.0", "cldr": "47", "countryinfo": "1.0.1"}

COUNTRIES_CSV = Path(__file__).with_name("countries.csv")
RELATIONS_CSV = Path(__file__).with_name("cameo_relations.csv")
DESCRIPTIONS_CSV = Path(__file__).with_name("cameo_descriptions.csv")
REGIONS_CSV = Path(__file__).with_name("regions.csv")
COUNTRY_NAMES_CSV = Path(__file__).with_name("country_names.csv")

COUNTRY_COLUMNS = ("cameo_code", "iso3", "name", "status", "reason")
REGION_COLUMNS = ("iso3", "continent", "region")
DESCRIPTION_COLUMNS = ("code", "description", "codebook_section")
COUNTRY_NAME_COLUMNS = ("iso3", "name", "source")
_RELATION_SCHEMA = {
    "code": pl.String,
    "name": pl.String,
    "level1": pl.String,
    "level1_name": pl.String,
    "quad_class": pl.Int8,
    "mirai_quad_class": pl.Int8,
}


@cache
def country_table() -> pl.DataFrame:
    """One row per code: cameo_code, iso3 (null when excluded), name, status, reason."""
    return pl.read_csv(COUNTRIES_CSV, schema=dict.fromkeys(COUNTRY_COLUMNS, pl.String))


@cache
def cameo_to_iso3() -> pl.DataFrame:
    """The join table for normalising actor country codes: identity and alias rows only, so an
    inner join drops regions and other excluded codes."""
    return country_table().filter(pl.col("status") != "excluded").select("cameo_code", "iso3")


@cache
def iso3_codes() -> frozenset[str]:
    """Every code a normalised country can take: current ISO 3166-1 alpha-3 plus XKX."""
    return frozenset(country_table().get_column("iso3").drop_nulls())


@cache
def relation_table() -> pl.DataFrame:
    """MIRAI's second-level CAMEO relations: code, name, level1, level1_name, quad_class
    (GDELT's QuadClass), mirai_quad_class (the grouping MIRAI's evaluation uses)."""
    return pl.read_csv(RELATIONS_CSV, schema=_RELATION_SCHEMA)


@cache
def relation_descriptions() -> pl.DataFrame:
    """One row per relation code, the 20 roots ("04") and every 3-digit code: code, description
    (our paraphrase of the CAMEO codebook's definition), codebook_section (where in Schrodt's CAMEO
    codebook v1.1b3, 2012, the definition is)."""
    return pl.read_csv(DESCRIPTIONS_CSV, schema=dict.fromkeys(DESCRIPTION_COLUMNS, pl.String))


@cache
def named_relations() -> pl.DataFrame:
    """Every relation, first level ("04") and second level ("042"), by code: code, name,
    description. What the agent API shows of a relation and MIRAI's dict_code2relation.json holds."""
    table = relation_table()
    first = table.select(pl.col("level1").alias("code"), pl.col("level1_name").alias("name")).unique("code")
    named = pl.concat([first, table.select("code", "name")])
    both = named.join(relation_descriptions().select("code", "description"), on="code", how="left").sort("code")
    missing = both.filter(pl.col("description").is_null()).get_column("code").to_list()
    if missing:
        raise ValueError(f"cameo_descriptions.csv has no description for relation codes {missing}")
    return both


@cache
def level2_codes() -> frozenset[str]:
    """The 3-digit relation codes, e.g. "042"."""
    return frozenset(relation_table().get_column("code"))


@cache
def level1_codes() -> frozenset[str]:
    """The 2-digit root codes, "01" to "20"."""
    return frozenset(relation_table().get_column("level1"))


@cache
def region_table() -> pl.DataFrame:
    """One row per normalised country code: iso3, continent (GeoNames code), region (its name)."""
    return pl.read_csv(REGIONS_CSV, schema=dict.fromkeys(REGION_COLUMNS, pl.String))


@cache
def country_names() -> pl.DataFrame:
    """iso3 -> the display name of its identity row (aliases name the CAMEO spelling instead)."""
    return country_table().filter(pl.col("status") == "identity").select("iso3", "name")


@cache
def country_name_table() -> pl.DataFrame:
    """Every name of every ISO code: iso3, name, source (display, cameo, pycountry, cldr or countryinfo). Each
    code's display name comes first, then its alternate names; no name belongs to two codes."""
    return pl.read_csv(COUNTRY_NAMES_CSV, schema=dict.fromkeys(COUNTRY_NAME_COLUMNS, pl.String))


@cache
def country_alternate_names() -> dict[str, list[str]]:
    """ISO code (sorted) -> [display name, alternate names...]: MIRAI's dict_iso2alternames_GeoNames.json."""
    names: dict[str, list[str]] = {}
    for iso, name in country_name_table().select("iso3", "name").iter_rows():
        names.setdefault(iso, []).append(name)
    return names
