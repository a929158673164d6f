"""Versioned reference tables: CAMEO actor countries -> ISO 3166-1 alpha-3, their regions, and
MIRAI's CAMEO relations and their descriptions."""

from pipeline.reference.tables import (
    COUNTRY_TABLE_VERSION,
    REGION_TABLE_VERSION,
    RELATION_DESCRIPTION_VERSION,
    RELATION_TABLE_VERSION,
    cameo_to_iso3,
    country_names,
    country_table,
    iso3_codes,
    level1_codes,
    level2_codes,
    region_table,
    relation_descriptions,
    relation_table,
)

__all__ = [
    "COUNTRY_TABLE_VERSION",
    "REGION_TABLE_VERSION",
    "RELATION_DESCRIPTION_VERSION",
    "RELATION_TABLE_VERSION",
    "cameo_to_iso3",
    "country_names",
    "country_table",
    "iso3_codes",
    "level1_codes",
    "level2_codes",
    "region_table",
    "relation_descriptions",
    "relation_table",
]
