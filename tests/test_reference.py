"""The versioned reference tables: CAMEO country -> ISO 3166-1 alpha-3, every country's names, MIRAI's
CAMEO relations and their descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pycountry
import pytest

from pipeline.agent_api.lookup import map_cameo_to_relation, map_relation_description_to_cameo
from pipeline.reference import (
    COUNTRY_NAME_SOURCES,
    RELATION_DESCRIPTION_VERSION,
    cameo_to_iso3,
    country_alternate_names,
    country_name_table,
    country_names,
    country_table,
    iso3_codes,
    level1_codes,
    level2_codes,
    region_table,
    relation_descriptions,
    relation_table,
    tables,
)
from pipeline.reference.build import (
    CONTINENTS,
    build_country_name_table,
    build_country_table,
    build_region_table,
    cldr_english_names,
    countryinfo_names,
    iso_names,
    name_sources,
    pycountry_names,
    read_cameo_countries,
    read_geonames_continents,
    record_name_sources,
    render_csv,
)
from pipeline.reference.tables import COUNTRIES_CSV, COUNTRY_NAMES_CSV, REGIONS_CSV

from .conftest import shared_fixture

ALIASES = {"ROM": "ROU", "TMP": "TLS", "IMY": "IMN", "MTN": "MNE", "WSB": "PSE", "GZS": "PSE", "BAG": "IRQ"}
# The 28 region or pseudo-country codes of CAMEO.country.txt, as listed in SOURCES.md.
REGION_CODES = (
    "WSB BAG GZS AFR ASA BLK CRB CAU CFR CAS CEU EIN EAF EEU EUR LAM MEA MDT NAF NMR PGS SCN SAM SAS SEA SAF WAF WST"
).split()


def _status(code: str) -> str:
    return country_table().filter(pl.col("cameo_code") == code).get_column("status").item()


# --- countries -------------------------------------------------------------------------------


def test_committed_countries_csv_is_the_build_output():
    cameo = read_cameo_countries(shared_fixture("reference/CAMEO.country.txt"))
    rebuilt = render_csv(build_country_table(cameo, iso_names()))
    assert rebuilt == COUNTRIES_CSV.read_text(encoding="utf-8"), (
        "countries.csv is stale: rerun `python -m pipeline.reference.build --cameo "
        "../shared/fixtures/reference/CAMEO.country.txt`, review the diff, bump COUNTRY_TABLE_VERSION"
    )


def test_committed_regions_csv_is_the_build_output():
    continents = read_geonames_continents(shared_fixture("reference/countryInfo.txt"))
    rebuilt = render_csv(build_region_table(country_table(), continents))
    assert rebuilt == REGIONS_CSV.read_text(encoding="utf-8"), (
        "regions.csv is stale: rerun `python -m pipeline.reference.build` (see its docstring), "
        "review the diff, bump REGION_TABLE_VERSION"
    )


def test_every_normalised_country_has_one_region():
    regions = region_table()
    assert set(regions.get_column("iso3")) == iso3_codes()
    assert regions.get_column("iso3").is_unique().all()
    assert dict(regions.select("iso3", "region").iter_rows())["XKX"] == "Europe"
    assert set(regions.get_column("region")) <= set(CONTINENTS.values())


def test_region_build_refuses_a_country_without_a_continent():
    with pytest.raises(ValueError, match="without a GeoNames continent"):
        build_region_table(country_table(), {"USA": "NA"})


def test_every_iso_code_maps_to_itself():
    mapping = dict(cameo_to_iso3().iter_rows())
    for country in pycountry.countries:
        assert mapping.get(country.alpha_3) == country.alpha_3, country
        assert _status(country.alpha_3) == "identity"


def test_iso_codes_missing_from_cameo_are_kept():
    for code in ("SSD", "CUW", "SXM", "JEY", "GGY", "XKX"):
        assert _status(code) == "identity"
        assert code in iso3_codes()


def test_aliases():
    mapping = dict(cameo_to_iso3().iter_rows())
    for code, iso in ALIASES.items():
        assert mapping[code] == iso
        assert _status(code) == "alias"
    assert country_table().filter(pl.col("status") == "alias").height == len(ALIASES)


def test_regions_and_dissolved_codes_are_excluded():
    assert len(REGION_CODES) == 28
    mapping = dict(cameo_to_iso3().iter_rows())
    for code in REGION_CODES:
        if code in ALIASES:
            continue
        assert _status(code) == "excluded", code
        assert code not in mapping
    assert _status("ANT") == "excluded"
    excluded = country_table().filter(pl.col("status") == "excluded")
    assert set(excluded.get_column("cameo_code")) == (set(REGION_CODES) - set(ALIASES)) | {"ANT"}


def test_country_table_shape():
    table = country_table()
    assert table.columns == ["cameo_code", "iso3", "name", "status", "reason"]
    assert table.get_column("cameo_code").is_unique().all()
    assert set(table.get_column("status")) == {"identity", "alias", "excluded"}
    assert table.filter((pl.col("status") == "excluded") & pl.col("iso3").is_not_null()).is_empty()
    assert table.filter((pl.col("status") != "excluded") & pl.col("iso3").is_null()).is_empty()
    assert table.filter(pl.col("name").is_null() | pl.col("reason").is_null()).is_empty()
    assert iso3_codes() == {c.alpha_3 for c in pycountry.countries} | {"XKX"}
    assert iso3_codes() >= set(cameo_to_iso3().get_column("iso3"))


def test_build_refuses_a_cameo_code_without_a_rule(tmp_path):
    source = tmp_path / "CAMEO.country.txt"
    source.write_bytes(shared_fixture("reference/CAMEO.country.txt").read_bytes() + b"ZZZ\tAtlantis\r\n")
    with pytest.raises(ValueError, match="ZZZ"):
        build_country_table(read_cameo_countries(source), iso_names())


def test_reader_tolerates_lf_and_bad_bytes(tmp_path):
    source = tmp_path / "cameo.txt"
    source.write_bytes(b"CODE\tLABEL\nREU\tR\xe9union\r\nWST\tThe West\n\n")
    table = read_cameo_countries(source)
    assert set(table) == {"REU", "WST"}
    assert table["WST"] == "The West"


# --- country names (country_names.csv) --------------------------------------------------------


def test_committed_country_names_csv_is_the_build_output():
    # Built from the committed countries.csv and the installed pycountry, babel and countryinfo: no
    # ../shared needed.
    rebuilt = render_csv(
        build_country_name_table(country_table(), pycountry_names(), cldr_english_names(), countryinfo_names())
    )
    assert rebuilt == COUNTRY_NAMES_CSV.read_text(encoding="utf-8"), (
        "country_names.csv is stale: rerun `python -m pipeline.reference.build` (see its docstring), "
        "review the diff, bump COUNTRY_NAMES_VERSION"
    )


def test_recorded_name_sources_are_the_installed_ones():
    assert COUNTRY_NAME_SOURCES == name_sources(), (
        "country_names.csv was built with other pycountry/babel/CLDR/countryinfo versions: rerun "
        "`python -m pipeline.reference.build`, which rewrites tables.COUNTRY_NAME_SOURCES"
    )
    text = Path(tables.__file__).read_text(encoding="utf-8")
    assert record_name_sources(text, COUNTRY_NAME_SOURCES) == text  # the line is exactly what the build writes


def test_country_names_start_with_the_display_name_and_belong_to_one_code():
    table = country_name_table()
    assert table.columns == ["iso3", "name", "source"]
    assert set(table.get_column("source")) == {"display", "cameo", "pycountry", "cldr", "countryinfo"}
    names = country_alternate_names()
    assert list(names) == sorted(iso3_codes())
    assert {iso: known[0] for iso, known in names.items()} == dict(country_names().iter_rows())
    firsts = table.filter(pl.col("iso3").is_first_distinct())
    assert set(firsts.get_column("source")) == {"display"} and (table.get_column("source") == "display").sum() == 250
    assert table.get_column("name").is_unique().all()  # MIRAI's name->code map keeps one code per name
    assert "Russia" in names["RUS"] and "Gaza Strip" in names["PSE"]
    # The common English names CLDR's main names lack come from countryinfo.
    by_name = dict(table.select("name", "iso3").iter_rows())
    for name, iso in (("Turkey", "TUR"), ("Ivory Coast", "CIV"), ("UK", "GBR"), ("Holland", "NLD")):
        assert by_name[name] == iso and name in names[iso]
    assert table.filter(pl.col("name") == "Turkey").get_column("source").item() == "countryinfo"


def test_countryinfo_names_are_its_iso_records_without_codes_or_demonyms():
    names = countryinfo_names()
    assert {"Turkey", "Turkiye", "Republic of Turkey"} <= set(names["TUR"])
    assert {"UK", "Great Britain"} <= set(names["GBR"]) and "Wales" not in names["GBR"]  # data_no_iso/ is left out
    assert not {"TR", "TUR", "GB", "GBR"} & {*names["TUR"], *names["GBR"]}  # its own codes among its spellings
    assert "Thai" not in names["THA"] and "Togolese" not in names["TGO"]  # demonyms
    spellings = [name for known in names.values() for name in known]
    assert all(name and name == name.strip() for name in spellings)  # Eritrea's "" and Peru's " República del Perú"
    assert "República del Perú" in names["PER"]


def test_a_shared_name_or_another_codes_display_name_is_left_out():
    countries = pl.DataFrame(
        [
            ("AAA", "AAA", "Alpha", "identity"),
            ("BBB", "BBB", "Beta", "identity"),
            ("OLD", "AAA", "Old Alpha", "alias"),
            ("REG", None, "Region", "excluded"),
        ],
        schema=["cameo_code", "iso3", "name", "status"],
        orient="row",
    )
    iso_sources = {"AAA": ["Alpha", "Republic of Alpha", "Shared"], "BBB": ["Beta", "Shared"], "CCC": ["Gamma"]}
    cldr = {"AAA": {"Beta", "Alfa", "Republic of Alpha"}, "BBB": {"B-Land"}}
    countryinfo = {"AAA": ["Alfa", "Alpha Land", "Both"], "BBB": ["Bland", "Both"], "CCC": ["Gamma Land"]}
    rows = build_country_name_table(countries, iso_sources, cldr, countryinfo).rows()
    assert rows == [
        ("AAA", "Alpha", "display"),
        ("AAA", "Old Alpha", "cameo"),
        ("AAA", "Republic of Alpha", "pycountry"),
        ("AAA", "Alfa", "cldr"),
        ("AAA", "Alpha Land", "countryinfo"),
        ("BBB", "Beta", "display"),
        ("BBB", "B-Land", "cldr"),
        ("BBB", "Bland", "countryinfo"),
    ]


# --- relations -------------------------------------------------------------------------------


def test_relation_table_matches_the_paper_count():
    table = relation_table()
    assert table.height == 149
    assert table.columns == ["code", "name", "level1", "level1_name", "quad_class", "mirai_quad_class"]
    assert table.get_column("code").is_unique().all()
    assert all(re.fullmatch(r"\d{3}", code) for code in table.get_column("code"))
    assert table.filter(pl.col("level1") != pl.col("code").str.slice(0, 2)).is_empty()
    assert level1_codes() == {f"{root:02d}" for root in range(1, 21)}
    assert len(level2_codes()) == 149
    assert {"010", "042", "106", "190"} <= level2_codes()
    # One name per root.
    assert table.select("level1", "level1_name").unique().height == 20


def test_quad_classes_by_root():
    gdelt = {1: range(1, 6), 2: range(6, 10), 3: range(10, 15), 4: range(15, 21)}
    mirai = {1: range(1, 5), 2: range(5, 9), 3: range(9, 17), 4: range(17, 21)}
    for code, root, quad, mirai_quad in (
        relation_table().select("code", pl.col("level1").cast(pl.Int32), "quad_class", "mirai_quad_class").iter_rows()
    ):
        assert root in gdelt[quad], code
        assert root in mirai[mirai_quad], code


def test_relations_are_gdelt_codes_plus_three():
    lookup = shared_fixture("reference/CAMEO.eventcodes.txt").read_bytes().decode("utf-8", errors="replace")
    gdelt = {line.split("\t", 1)[0] for line in lookup.splitlines()[1:] if re.match(r"\d{3}\t", line)}
    # 106 is lost in GDELT's lookup (merged into the 1056 line); 155 and 176 (cyber) are not in it.
    assert level2_codes() == gdelt | {"106", "155", "176"}


# --- relation descriptions (cameo_descriptions.csv) ---------------------------------------------


def test_every_relation_code_has_a_codebook_description():
    table = relation_descriptions()
    assert table.columns == ["code", "description", "codebook_section"]
    assert table.get_column("code").to_list() == sorted(level1_codes() | level2_codes())
    assert table.height == 169
    assert RELATION_DESCRIPTION_VERSION == "cameo-descriptions-v1"
    for code, description, section in table.iter_rows():
        assert description.strip() and description.endswith("."), code
        root = int(code[:2])
        if code in {"155", "176"}:  # the cyber codes came after v1.1b3; MIRAI's appendix G.2 names them
            assert section.startswith("not in CAMEO 1.1b3") and f"§2.{root} " in section, code
        elif len(code) == 2:
            assert section.startswith(f"CAMEO 1.1b3 §2.{root}, {code} "), code
        else:
            assert section == f"CAMEO 1.1b3 §2.{root}, {code}", code
    assert table.get_column("description").is_unique().all()


def test_descriptions_are_not_derived_from_the_names():
    """v1 of the agent API composed each description from its name ("Make a visit. A second-level
    CAMEO relation under 04 (Consult) ..."); the table replaces that with the codebook's meaning."""
    names = dict(relation_table().select("code", "name").iter_rows())
    names |= dict(relation_table().select("level1", "level1_name").unique().iter_rows())
    for code, description in relation_descriptions().select("code", "description").iter_rows():
        assert not description.lower().startswith(names[code].lower()), code
        assert "relation table" not in description and "CAMEO relation" not in description, code


@pytest.mark.parametrize(
    ("phrase", "code"),
    [
        ("travels to the target's territory", "042"),
        ("places civilians in harm's way", "184"),
        ("refuse food", "142"),
        ("formal veto", "129"),
        ("condolences", "018"),
        ("extraditions", "063"),
        ("debt relief", "071"),
        ("forcibly removes large numbers of people", "201"),
    ],
)
def test_a_description_phrase_finds_its_code(phrase, code):
    found = [r.cameo_code.code for r in map_relation_description_to_cameo(phrase)]
    assert found and found[0] == code, found


def test_a_whole_description_is_an_exact_match():
    # As in MIRAI, whose look-up takes a relation's description as well as its name verbatim.
    for code, description in relation_descriptions().select("code", "description").iter_rows():
        assert [r.cameo_code.code for r in map_relation_description_to_cameo(description)] == [code]
        assert map_cameo_to_relation(code).description == description
