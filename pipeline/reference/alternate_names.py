"""Every name we know for each ISO code: its display name first, then alternate names taken from
maintained sources only (none written by hand here):

- our country table (countries.csv): the display name, and CAMEO's spelling of an alias;
- pycountry (ISO 3166-1): each code's name, official name and common name;
- babel (Unicode CLDR): the English name of each territory in CLDR's region-neutral English
  locales, en, en_001 (world) and en_150 (Europe): "Russia", "Vatican City", "St Kitts & Nevis".
  The country variants (en_CA, en_IN, …) add only spellings pycountry mostly has ("Saint Lucia")
  and would take ~0.4 s to load in every sandbox child. Babel keeps CLDR's main name of a
  territory, not its alt="variant" and alt="short" forms ("Turkey", "Ivory Coast", "UK"), so those
  are not here.

A name two codes share is dropped from both, and so is a name that is another code's display name:
MIRAI's name→code map keeps one code per name, and a look-up by name must give one answer.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import version

import polars as pl
import pycountry
from babel import Locale
from babel.core import get_cldr_version, parse_locale
from babel.localedata import locale_identifiers

from pipeline.reference.tables import country_names, country_table


def country_name_sources() -> dict[str, str]:
    """The sources of the alternate names and their versions, for an export's metadata."""
    return {
        "pycountry": version("pycountry"),
        "babel": version("babel"),
        "cldr": get_cldr_version(),
    }


def _cldr_english_names() -> dict[str, set[str]]:
    """ISO alpha-3 -> the names CLDR's region-neutral English locales give its territory."""
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


@cache
def country_alternate_names() -> dict[str, list[str]]:
    """ISO code (sorted) -> [display name, alternate names…]; no name belongs to two codes."""
    display = dict(country_names().iter_rows())
    names: dict[str, list[str]] = {iso: [display[iso]] for iso in sorted(display)}
    for cameo_name, iso in country_table().filter(pl.col("iso3").is_not_null()).select("name", "iso3").iter_rows():
        names[iso].append(cameo_name)
    for entry in pycountry.countries:
        if entry.alpha_3 in names:
            names[entry.alpha_3] += [
                v for a in ("name", "official_name", "common_name") if (v := getattr(entry, a, None))
            ]
    for iso, cldr in _cldr_english_names().items():
        if iso in names:
            names[iso] += sorted(cldr)
    owners: dict[str, set[str]] = {}
    for iso, known in names.items():
        for name in known:
            owners.setdefault(name, set()).add(iso)
    displayed = set(display.values())
    return {
        iso: [
            known[0],
            *(n for n in dict.fromkeys(known[1:]) if n != known[0] and len(owners[n]) == 1 and n not in displayed),
        ]
        for iso, known in names.items()
    }
