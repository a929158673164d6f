"""Regenerate countries.csv from GDELT's CAMEO actor-country lookup, pycountry and the rules below,
regions.csv from GeoNames, and country_names.csv from countries.csv, pycountry, CLDR (babel) and
countryinfo.

    python -m pipeline.reference.build --cameo ../shared/fixtures/reference/CAMEO.country.txt \
        --geonames ../shared/fixtures/reference/countryInfo.txt

The committed CSV files are this script's output; tests/test_reference.py rebuilds them and fails
on any difference, so a rule change (or a pycountry or babel release that renames a country) must be
followed by a rerun and a bump of the table's version in tables.py. The run also rewrites
tables.py's COUNTRY_NAME_SOURCES line with the versions of pycountry, babel, CLDR and countryinfo it used.

Row rules of countries.csv, one row per code (sorted by code):
  identity  every current ISO 3166-1 alpha-3 code (pycountry) plus EXTRA_IDENTITY; iso3 = code
  alias     a CAMEO code for a place that ISO codes differently (ALIASES); iso3 = that ISO code
  excluded  any other CAMEO code (EXCLUDED): regions, blocs, a dissolved country; iso3 empty
A CAMEO code that is neither ISO nor in ALIASES/EXCLUDED stops the build: each one needs a
decision with a reason, not a silent default.
"""

from __future__ import annotations

import argparse
import json
import re
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path

import polars as pl
import pycountry
from babel import Locale
from babel.core import get_cldr_version, parse_locale
from babel.localedata import locale_identifiers

from pipeline.reference import tables
from pipeline.reference.tables import (
    COUNTRIES_CSV,
    COUNTRY_COLUMNS,
    COUNTRY_NAME_COLUMNS,
    COUNTRY_NAMES_CSV,
    REGION_COLUMNS,
    REGIONS_CSV,
)

# Kosovo has no ISO 3166-1 code. XKX is the user-assigned code used by the World Bank and
# GeoNames, and MIRAI's own country list (paper Table 14) includes "XKX Kosovo", so the benchmark
# must accept it even though CAMEO.country.txt has no Kosovo row.
EXTRA_IDENTITY: dict[str, tuple[str, str]] = {
    "XKX": (
        "Kosovo",
        "not in ISO 3166-1: user-assigned code (World Bank, GeoNames); listed in MIRAI paper Table 14",
    ),
}

# CAMEO code -> (ISO 3166-1 alpha-3, why). Sources: ISO 3166-1 change history as recorded in
# pycountry.historic_countries (TMP), the ISO 3166 maintenance-agency newsletters (ROM, IMN, MNE),
# and the CAMEO labels themselves for the sub-national codes.
ALIASES: dict[str, tuple[str, str]] = {
    "ROM": ("ROU", "renamed code: ISO 3166-1 replaced Romania's ROM with ROU in 2002; CAMEO kept ROM"),
    "TMP": ("TLS", "renamed code: ISO 3166-1 withdrew TMP (East Timor) on 2002-05-20 for TLS; CAMEO kept TMP"),
    "IMY": ("IMN", "CAMEO-only code for the Isle of Man, which received ISO 3166-1 IMN in 2006"),
    "MTN": ("MNE", "CAMEO-only code for Montenegro, which received ISO 3166-1 MNE on independence in 2006"),
    "WSB": ("PSE", "sub-national: the West Bank is part of ISO PSE (Palestine)"),
    "GZS": ("PSE", "sub-national: the Gaza Strip is part of ISO PSE (Palestine)"),
    "BAG": ("IRQ", "sub-national: Baghdad, capital of Iraq, which CAMEO codes like a country"),
}

# CAMEO code -> why it maps to no country. The region list is CAMEO.country.txt's own (GDELT's
# https://www.gdeltproject.org/data/lookups/CAMEO.country.txt); ANT's dates come from
# pycountry.historic_countries.
EXCLUDED: dict[str, str] = {
    "AFR": "region: the African continent",
    "ASA": "region: the Asian continent",
    "BLK": "region: the Balkans, several states of south-east Europe",
    "CRB": "region: the Caribbean, island and coastal states",
    "CAU": "region: the Caucasus, spanning ARM, AZE, GEO and part of RUS",
    "CFR": "region: Central Africa, several states",
    "CAS": "region: Central Asia, several states",
    "CEU": "region: Central Europe, several states",
    "EIN": "region: the East Indies (Malay Archipelago), spanning IDN, MYS, PHL and others",
    "EAF": "region: Eastern Africa, several states",
    "EEU": "region: Eastern Europe, several states",
    "EUR": "region: the European continent (EUR also appears inside actor codes such as IGOEUREEC)",
    "LAM": "region: Latin America, spanning two continents",
    "MEA": "region: the Middle East, several states",
    "MDT": "region: the Mediterranean basin, states on three continents",
    "NAF": "region: North Africa, several states",
    "NMR": "region: North America, several states",
    "PGS": "region: the Persian Gulf littoral states",
    "SCN": "region: Scandinavia (DNK, NOR, SWE)",
    "SAM": "region: the South American continent",
    "SAS": "region: South Asia, several states",
    "SEA": "region: Southeast Asia, several states",
    "SAF": "region: Southern Africa, several states",
    "WAF": "region: West Africa, several states",
    "WST": "pseudo-country: 'The West', a political bloc rather than a territory",
    "ANT": (
        "dissolved: the Netherlands Antilles split on 2010-10-10 into CUW, SXM and BES; "
        "ISO 3166-1 withdrew ANT on 2010-12-15, so it has no single successor"
    ),
}

_CODE = re.compile(r"[A-Z]{3}")


def read_cameo_countries(path: Path) -> dict[str, str]:
    """CAMEO.country.txt as {code: label}.

    The published copies differ in line endings (CRLF vs LF) and some labels carry broken bytes
    (`REU Runion`), so lines are split on any newline and undecodable bytes are replaced rather
    than fatal; labels only name alias and excluded rows.
    """
    text = path.read_bytes().decode("utf-8-sig", errors="replace")
    table: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        code, sep, label = line.partition("\t")
        code = code.strip()
        if number == 1 and code == "CODE":
            continue
        if not sep or not _CODE.fullmatch(code):
            raise ValueError(f"{path}:{number}: expected 'CODE<TAB>LABEL', got {line!r}")
        if code in table:
            raise ValueError(f"{path}:{number}: code {code} appears twice")
        table[code] = label.strip()
    return table


def iso_names() -> dict[str, str]:
    """Current ISO 3166-1 alpha-3 -> display name: pycountry's common_name where it has one
    ("Iran", "South Korea"), else its ISO short name ("Russian Federation")."""
    return {c.alpha_3: getattr(c, "common_name", None) or c.name for c in pycountry.countries}


def build_country_table(cameo: dict[str, str], iso: dict[str, str]) -> pl.DataFrame:
    """The countries table from the CAMEO lookup and the ISO list; see the module docstring."""
    for code in [*ALIASES, *EXCLUDED]:
        if code not in cameo:
            raise ValueError(f"rule for {code} but no such code in the CAMEO table: drop or fix the rule")
        if code in iso:
            raise ValueError(f"rule for {code} but {code} is an ISO code and so an identity row")
    for code, (target, _) in ALIASES.items():
        if target not in iso:
            raise ValueError(f"alias {code} -> {target}: {target} is not a current ISO 3166-1 code")
    unruled = sorted(set(cameo) - set(iso) - set(EXTRA_IDENTITY) - set(ALIASES) - set(EXCLUDED))
    if unruled:
        raise ValueError(f"CAMEO codes without a rule (add them to ALIASES or EXCLUDED): {unruled}")

    cameo_name_of = {target: code for code, (target, _) in ALIASES.items() if target not in cameo}
    rows: list[dict[str, str | None]] = []
    for code, name in iso.items():
        if code in cameo:
            reason = "ISO 3166-1 alpha-3, same code in CAMEO"
        elif code in cameo_name_of:
            reason = f"ISO 3166-1 alpha-3; CAMEO lists it only as {cameo_name_of[code]}"
        else:
            # GDELT's coder knows codes its published lookup lacks: SSD occurs in real exports.
            reason = "ISO 3166-1 alpha-3 missing from CAMEO; kept as GDELT emits codes beyond its lookup (e.g. SSD)"
        rows.append({"cameo_code": code, "iso3": code, "name": name, "status": "identity", "reason": reason})
    for code, (name, reason) in EXTRA_IDENTITY.items():
        rows.append({"cameo_code": code, "iso3": code, "name": name, "status": "identity", "reason": reason})
    for code, (target, reason) in ALIASES.items():
        rows.append({"cameo_code": code, "iso3": target, "name": cameo[code], "status": "alias", "reason": reason})
    for code, reason in EXCLUDED.items():
        rows.append({"cameo_code": code, "iso3": None, "name": cameo[code], "status": "excluded", "reason": reason})

    schema = dict.fromkeys(COUNTRY_COLUMNS, pl.String)
    return pl.DataFrame(rows, schema=schema).sort("cameo_code")


# GeoNames countryInfo.txt's continent codes (https://download.geonames.org/export/dump/readme.txt).
# MIRAI balanced its sample over regions from a continents2.csv it never published; GeoNames is
# public, covers every code in countries.csv (XKX included) and gives one continent per country.
CONTINENTS: dict[str, str] = {
    "AF": "Africa",
    "AN": "Antarctica",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "OC": "Oceania",
    "SA": "South America",
}


def read_geonames_continents(path: Path) -> dict[str, str]:
    """GeoNames countryInfo.txt as {ISO3: continent code}; '#' lines are comments, and copies
    differ in whether the header line ("ISO<TAB>ISO3...") keeps its '#'."""
    table: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if not line or line.startswith("#") or fields[:2] == ["ISO", "ISO3"]:
            continue
        if len(fields) < 9 or not _CODE.fullmatch(fields[1]) or fields[8] not in CONTINENTS:
            raise ValueError(f"{path}:{number}: expected GeoNames countryInfo columns (ISO3 2nd, continent 9th)")
        table[fields[1]] = fields[8]
    return table


def build_region_table(countries: pl.DataFrame, continents: dict[str, str]) -> pl.DataFrame:
    """One row per ISO code of the countries table: iso3, continent (GeoNames code), region."""
    codes = sorted(countries.get_column("iso3").drop_nulls().unique())
    missing = [code for code in codes if code not in continents]
    if missing:
        raise ValueError(f"ISO codes without a GeoNames continent (add a rule): {missing}")
    rows = [{"iso3": c, "continent": continents[c], "region": CONTINENTS[continents[c]]} for c in codes]
    return pl.DataFrame(rows, schema=dict.fromkeys(REGION_COLUMNS, pl.String))


def pycountry_names() -> dict[str, list[str]]:
    """ISO alpha-3 -> pycountry's (ISO 3166-1) name, official name and common name, those it has."""
    return {
        entry.alpha_3: [v for a in ("name", "official_name", "common_name") if (v := getattr(entry, a, None))]
        for entry in pycountry.countries
    }


def cldr_english_names() -> dict[str, set[str]]:
    """ISO alpha-3 -> the names CLDR's region-neutral English locales (en, en_001 for the world,
    en_150 for Europe) give its territory. The country variants (en_CA, en_IN, ...) add only
    spellings pycountry mostly has ("Saint Lucia"). Babel keeps CLDR's main name of a territory,
    not its alt="variant" and alt="short" forms ("Turkey", "Ivory Coast", "UK"): countryinfo's
    names bring those."""
    alpha3 = {entry.alpha_2: entry.alpha_3 for entry in pycountry.countries}
    names: dict[str, set[str]] = {}
    for ident in locale_identifiers():
        language, region, script, *_ = parse_locale(ident)
        # en_Dsrt and en_Shaw write English in the Deseret and Shavian scripts.
        if language != "en" or script not in (None, "Latn") or not (region is None or region.isdigit()):
            continue
        for alpha2, name in Locale.parse(ident).territories.items():
            if alpha2 in alpha3:
                names.setdefault(alpha3[alpha2], set()).add(name)
    return names


def countryinfo_names() -> dict[str, list[str]]:
    """ISO alpha-3 -> the countryinfo package's name of the country and its alternate spellings, in
    the package's order: the common English names CLDR's main names lack ("Turkey", "Ivory Coast",
    "UK", "Holland", "Swaziland") and native and official ones ("Österreich", "Republic of Korea").

    Only the records of its data/ folder, the ISO countries (its loader treats them as the ISO
    record); data_no_iso/ holds places without a code of their own, some tagged with their
    country's (Wales -> GBR), and a part of a country is not a name of it. A spelling is trimmed
    and left out when it is empty, an ISO 3166-1 code of any country (the package lists each
    country's codes among its spellings: "TR", "TUR"), or the record's demonym ("Thai",
    "Togolese"), a word for its people."""
    codes = {str(getattr(c, a)) for c in pycountry.countries for a in ("alpha_2", "alpha_3", "numeric")}
    names: dict[str, list[str]] = {}
    # data/ also ships an index.js; the package's loader reads the *.json files.
    records = [path for path in files("countryinfo").joinpath("data").iterdir() if path.name.endswith(".json")]
    for path in sorted(records, key=lambda path: path.name):
        record = json.loads(path.read_text(encoding="utf-8"))
        alpha3 = (record.get("ISO") or {}).get("alpha3")
        spellings = (s.strip() for s in [record.get("name") or "", *(record.get("altSpellings") or [])])
        kept = [s for s in spellings if s and s not in codes and s != record.get("demonym")]
        if alpha3:
            names.setdefault(alpha3, []).extend(kept)
    return names


def build_country_name_table(
    countries: pl.DataFrame,
    iso_sources: dict[str, list[str]],
    cldr: dict[str, set[str]],
    countryinfo: dict[str, list[str]],
) -> pl.DataFrame:
    """Every name of every ISO code of the countries table, by code (sorted): its display name
    (source display), then in this order CAMEO's spelling of an alias (cameo), pycountry's names
    (pycountry), CLDR's English names, sorted (cldr) and countryinfo's names (countryinfo), each
    under the first source that gives it. A name two codes share is dropped from both, and so is
    a name that is another code's display name: MIRAI's name->code map keeps one code per name,
    and a look-up by name must give one answer."""
    display = dict(countries.filter(pl.col("status") == "identity").select("iso3", "name").iter_rows())
    candidates: dict[str, list[tuple[str, str]]] = {iso: [(display[iso], "display")] for iso in sorted(display)}
    for cameo_name, iso in countries.filter(pl.col("iso3").is_not_null()).select("name", "iso3").iter_rows():
        candidates[iso].append((cameo_name, "cameo"))
    for iso, names in iso_sources.items():
        if iso in candidates:
            candidates[iso] += [(name, "pycountry") for name in names]
    for iso, names in cldr.items():
        if iso in candidates:
            candidates[iso] += [(name, "cldr") for name in sorted(names)]
    for iso, names in countryinfo.items():
        if iso in candidates:
            candidates[iso] += [(name, "countryinfo") for name in names]
    owners: dict[str, set[str]] = {}
    for iso, known in candidates.items():
        for name, _ in known:
            owners.setdefault(name, set()).add(iso)
    displayed = set(display.values())
    rows = []
    for iso, ((first, _), *rest) in candidates.items():
        rows.append((iso, first, "display"))
        seen = {first}
        for name, source in rest:
            if name not in seen and len(owners[name]) == 1 and name not in displayed:
                rows.append((iso, name, source))
            seen.add(name)
    return pl.DataFrame(rows, schema=dict.fromkeys(COUNTRY_NAME_COLUMNS, pl.String), orient="row")


def name_sources() -> dict[str, str]:
    """The installed versions of country_names.csv's sources, as tables.COUNTRY_NAME_SOURCES records them."""
    return {
        "pycountry": version("pycountry"),
        "babel": version("babel"),
        "cldr": get_cldr_version(),
        "countryinfo": version("countryinfo"),
    }


_NAME_SOURCES_LINE = re.compile(r"^COUNTRY_NAME_SOURCES = .*$", re.MULTILINE)


def record_name_sources(tables_text: str, sources: dict[str, str]) -> str:
    """tables.py's text with its COUNTRY_NAME_SOURCES line set to ``sources``."""
    line = f"COUNTRY_NAME_SOURCES = {json.dumps(sources)}"
    text, count = _NAME_SOURCES_LINE.subn(lambda _: line, tables_text)
    if count != 1:
        raise ValueError(f"expected one COUNTRY_NAME_SOURCES line in tables.py, found {count}")
    return text


def render_csv(table: pl.DataFrame) -> str:
    """The exact committed text: LF endings, quoting only where a field needs it."""
    return table.write_csv(line_terminator="\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameo", type=Path, required=True, help="GDELT's CAMEO.country.txt")
    parser.add_argument("--geonames", type=Path, required=True, help="GeoNames countryInfo.txt")
    parser.add_argument("--out", type=Path, default=COUNTRIES_CSV, help="default: the committed countries.csv")
    parser.add_argument("--regions-out", type=Path, default=REGIONS_CSV, help="default: the committed regions.csv")
    parser.add_argument(
        "--names-out", type=Path, default=COUNTRY_NAMES_CSV, help="default: the committed country_names.csv"
    )
    parser.add_argument(
        "--tables-py",
        type=Path,
        default=Path(tables.__file__),
        help="the tables.py whose COUNTRY_NAME_SOURCES line records the sources' versions; default: the package's",
    )
    args = parser.parse_args(argv)
    table = build_country_table(read_cameo_countries(args.cameo), iso_names())
    args.out.write_text(render_csv(table), encoding="utf-8", newline="")
    counts = dict(table.group_by("status").len().sort("status").iter_rows())
    print(f"wrote {args.out}: {table.height} rows {counts} (pycountry {pycountry.__version__})")
    regions = build_region_table(table, read_geonames_continents(args.geonames))
    args.regions_out.write_text(render_csv(regions), encoding="utf-8", newline="")
    print(f"wrote {args.regions_out}: {regions.height} rows")
    names = build_country_name_table(table, pycountry_names(), cldr_english_names(), countryinfo_names())
    args.names_out.write_text(render_csv(names), encoding="utf-8", newline="")
    by_source = dict(names.group_by("source").len().sort("source").iter_rows())
    print(f"wrote {args.names_out}: {names.height} names of {names.get_column('iso3').n_unique()} codes {by_source}")
    sources = name_sources()
    args.tables_py.write_text(
        record_name_sources(args.tables_py.read_text(encoding="utf-8"), sources), encoding="utf-8"
    )
    print(f"recorded {sources} in {args.tables_py}")


if __name__ == "__main__":
    main()
