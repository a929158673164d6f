"""A deterministic generator of GDELT 2.0 feed files: our own fixture source.

``generate_mirror(out, start, end, seed)`` writes what ``http://data.gdeltproject.org/gdeltv2/``
would hold for those UTC days (15-minute ``export`` and ``mentions`` zips, ``masterfilelist.txt``,
``lastupdate.txt``) plus ``manifest.json``, which states what a correct reader must find in every
file. Same arguments, same bytes: every random choice comes from ``random.Random`` seeded with the
seed and the slot, and zip members carry the slot time as their timestamp.

The content of a slot depends only on ``seed`` and the slot's time, never on the range asked for:
generating more days, or more slots of a day, reproduces the files already written byte for byte
and appends to the index. Tests use that to make a mirror "publish" new files between runs.

Everything GDELT-specific the downstream code must survive is in here on purpose, in known amounts
(all recorded in the manifest): SQLDATE 1/7/30/365 days before DATEADDED, CAMEO aliases and region
codes among the countries, blank actors, unknown event codes, re-mentions of events from earlier
slots (some from before the range), URLs reported again on later days, lines with the wrong field
count or invalid UTF-8, a feed outage (slots missing from the index) with a near-empty file before
it and a catch-up burst after it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import re
import zipfile
from bisect import bisect_right
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

from pipeline.storage import atomic_write_bytes, remove_orphan_temps

SLOTS_PER_DAY = 96
GDELT_URL = "http://data.gdeltproject.org/gdeltv2/"
# GDELT 2.0's first full day. Day numbers count from here, and so do event ids: each day owns a
# block of DAY_ID_BLOCK ids starting at FIRST_EVENT_ID (about where GDELT 2.0's ids started), so a
# slot's ids are known without generating the days before it.
EPOCH = date(2015, 2, 19)
FIRST_EVENT_ID = 410_000_000
DAY_ID_BLOCK = 250_000
# zlib level 1: about 3x faster than the default for files ~15% larger; sizes are not under test.
ZIP_LEVEL = 1
EXPORT_FIELDS = 61
MENTIONS_FIELDS = 16
_FILE_NAME = re.compile(r"^\d{14}\.(export|mentions)\.CSV\.zip$")

# --- Curated code lists (our own data; CAMEO / FIPS codes as GDELT uses them) -----------------

# CAMEO country code | actor name | weight (share of actors). ISO-3 codes mostly, plus the
# CAMEO-only codes a normaliser must map: aliases of real countries (ROM, TMP, IMY, MTN), places
# (WSB, GZS, BAG), regions (AFR ... WST), the historical ANT, and SSD, which CAMEO lacks.
_COUNTRIES = """
USA|UNITED STATES|220; CHN|CHINA|42; RUS|RUSSIA|40; UKR|UKRAINE|30; ISR|ISRAEL|36; GBR|UNITED KINGDOM|34
FRA|FRANCE|24; DEU|GERMANY|20; IND|INDIA|30; IRN|IRAN|26; PAK|PAKISTAN|12; SYR|SYRIA|12; IRQ|IRAQ|11
AFG|AFGHANISTAN|9; TUR|TURKEY|11; SAU|SAUDI ARABIA|9; JPN|JAPAN|10; KOR|SOUTH KOREA|9; PRK|NORTH KOREA|8
CAN|CANADA|14; MEX|MEXICO|11; BRA|BRAZIL|7; AUS|AUSTRALIA|12; NGA|NIGERIA|9; ZAF|SOUTH AFRICA|7; EGY|EGYPT|7
PSE|PALESTINE|8; LBN|LEBANON|5; YEM|YEMEN|5; ITA|ITALY|8; ESP|SPAIN|6; POL|POLAND|5; VEN|VENEZUELA|6
PHL|PHILIPPINES|7; IDN|INDONESIA|5; CHE|SWITZERLAND|4; COL|COLOMBIA|4; ARE|UNITED ARAB EMIRATES|5; QAT|QATAR|4
JOR|JORDAN|3; LBY|LIBYA|3; KEN|KENYA|4; ETH|ETHIOPIA|3; SDN|SUDAN|3; BGD|BANGLADESH|3; LKA|SRI LANKA|2
MMR|MYANMAR|3; THA|THAILAND|3; VNM|VIETNAM|3; MYS|MALAYSIA|3; NZL|NEW ZEALAND|3; IRL|IRELAND|3; GRC|GREECE|3
SWE|SWEDEN|2; NOR|NORWAY|2; NLD|NETHERLANDS|3; BEL|BELGIUM|2; AUT|AUSTRIA|2; HUN|HUNGARY|2; BLR|BELARUS|2
GEO|GEORGIA|1; ARM|ARMENIA|1; AZE|AZERBAIJAN|1; KAZ|KAZAKHSTAN|1; CUB|CUBA|2; ARG|ARGENTINA|2; CHL|CHILE|1
PER|PERU|1; ISL|ICELAND|1; ROM|ROMANIA|2; MTN|MONTENEGRO|1; TMP|EAST TIMOR|0.5; IMY|ISLE OF MAN|0.5
WSB|WEST BANK|1.5; GZS|GAZA STRIP|2; BAG|BAGHDAD|0.5; ANT|NETHERLANDS ANTILLES|0.3; SSD|SOUTH SUDAN|1.5
AFR|AFRICA|5; EUR|EUROPE|6; WST|THE WEST|2; MEA|MIDDLE EAST|4; SAS|SOUTH ASIA|1; ASA|ASIA|3; LAM|LATIN AMERICA|1
NAF|NORTH AFRICA|0.5; EEU|EASTERN EUROPE|0.5; PGS|PERSIAN GULF|0.5; SEA|SOUTHEAST ASIA|0.5
"""
# Other names GDELT gives a country actor (demonyms, capitals); some are non-ASCII on purpose.
_COUNTRY_ALIASES = {
    "USA": ("AMERICAN", "WASHINGTON", "NEW YORK", "CALIFORNIA", "TEXAS"),
    "CHN": ("CHINESE", "BEIJING"),
    "RUS": ("RUSSIAN", "MOSCOW", "KREMLIN"),
    "UKR": ("UKRAINIAN", "KIEV"),
    "ISR": ("ISRAELI", "TEL AVIV", "JERUSALEM"),
    "GBR": ("BRITISH", "LONDON", "BIRMINGHAM"),
    "FRA": ("FRENCH", "PARIS"),
    "DEU": ("GERMAN", "BERLIN", "MÜNCHEN", "DÜSSELDORF"),
    "IND": ("INDIAN", "NEW DELHI", "MUMBAI"),
    "IRN": ("IRANIAN", "TEHRAN"),
    "BRA": ("BRAZILIAN", "SÃO PAULO"),
    "COL": ("COLOMBIAN", "BOGOTÁ"),
    "MEX": ("MEXICAN", "CIUDAD JUÁREZ"),
    "CHE": ("SWISS", "ZÜRICH"),
    "ISL": ("ICELANDIC", "REYKJAVÍK"),
    "TUR": ("TURKISH", "İSTANBUL"),
    "PSE": ("PALESTINIAN", "RAMALLAH"),
}
# CAMEO actor role | names GDELT prints for it | weight
_ROLES = """
GOV|GOVERNMENT,PRESIDENT,PRIME MINISTER,MINISTRY,KING,PUBLIC SECTOR|30; MIL|MILITARY,ARMY,SOLDIER,TROOP|12
COP|POLICE,POLICE OFFICER,SHERIFF|14; JUD|COURT,JUDGE,ATTORNEY,PROSECUTOR|9; LEG|CONGRESS,PARLIAMENT,SENATE,LAWMAKER|8
BUS|COMPANY,BUSINESS,INDUSTRY,FIRM|10; EDU|SCHOOL,STUDENT,UNIVERSITY,TEACHER|9; MED|MEDIA,JOURNALIST,NEWSPAPER|6
CVL|COMMUNITY,CITIZEN,RESIDENT,VILLAGER|8; OPP|PROTESTER,ACTIVIST,OPPOSITION,DEMONSTRATOR|7
REB|REBEL,INSURGENT,MILITANT|4; CRM|CRIMINAL,GANG,SMUGGLER|5; HLH|HOSPITAL,DOCTOR,HEALTH MINISTRY|4
LAB|UNION,WORKER|3; REF|REFUGEE,MIGRANT|3; SPY|INTELLIGENCE,SPY AGENCY|1; ENV|ENVIRONMENTALIST|1
"""
# Organisations and religious groups: code | name | known group | religion | type1
_GROUPS = """
IGOUNO|UNITED NATIONS|UNO||IGO; IGOEUREEC|EUROPEAN UNION|EEC||IGO; IGOWSTNAT|NATO|NAT||IGO
IGOUNOWHO|WORLD HEALTH ORGANIZATION|WHO||IGO; NGO|HUMAN RIGHTS GROUP|||NGO; NGOHRIAMN|AMNESTY INTERNATIONAL|AMN||NGO
JEW|RABBI||JEW|; MOS|MUSLIM||MOS|; CHRCTH|CATHOLIC||CHR|; CHRCTH|POPE||CHR|; HIN|HINDU||HIN|
"""

# CAMEO event code | Goldstein scale | weight. EventBaseCode is the first 3 characters and
# EventRootCode the first 2. 106 is on purpose: it occurs in GDELT but is missing from the
# published CAMEO lookup file.
_EVENT_CODES = """
010 0.0 120|011 -0.1 8|012 -0.4 23|013 0.4 14|014 0.0 3|015 0.0 9|016 3.4 4|017 0.0 9|018 3.4 3|019 3.4 3
020 3.0 100|0211 3.4 6|0214 3.4 13|0231 3.4 3|0233 3.4 3|025 3.0 2|030 4.0 23|0311 5.2 3|0331 5.2 3|036 4.0 73
040 1.0 47|041 1.0 8|042 1.9 125|043 2.8 120|044 2.5 4|045 5.0 3|046 7.0 13|050 3.5 25|051 3.4 135|052 3.5 4
057 8.0 17|060 6.0 32|061 6.4 12|062 7.4 9|064 7.0 4|070 7.0 8|071 7.4 15|072 8.3 9|073 7.4 4|075 7.0 2
080 5.0 20|081 5.0 3|0831 5.0 9|0841 7.0 7|084 7.0 21|0874 10.0 15|090 -2.0 35|091 -2.0 5|092 -2.0 4
100 -5.0 17|1011 -5.0 3|104 -5.0 3|106 -5.0 2|110 -2.0 28|111 -2.0 16|112 -2.0 16|114 -2.0 7|115 -2.0 4
120 -4.0 18|121 -4.0 4|125 -5.0 8|128 -5.0 3|130 -4.4 16|131 -5.8 3|138 -7.0 4|140 -6.5 4|141 -6.5 18
145 -7.5 6|150 -7.2 4|154 -7.2 2|160 -4.0 15|161 -4.0 3|163 -8.0 15|166 -7.0 2|170 -5.0 5|172 -5.0 7
173 -5.0 57|175 -9.0 4|180 -9.0 14|181 -9.0 3|182 -9.5 3|1831 -10.0 10|186 -10.0 9|190 -10.0 76
192 -9.5 26|193 -10.0 46|194 -10.0 6|195 -10.0 12|200 -10.0 2|202 -10.0 1
"""
# A malformed CAMEO triple GDELT-like data can carry; unknown codes must not fail a row.
_BAD_EVENT = "---\t---\t--\t1\t0.0"
_BAD_EVENT_SHARE = 0.0005

# ActionGeo rows: Type | FullName | FIPS country | ADM1 | ADM2 | Lat | Long | FeatureID | weight.
# Types: 1 country, 2 US state, 3 US city, 4 world city, 5 world ADM1. FIPS 10-4, not ISO: CH is
# China, AS Australia, GM Germany, SZ Switzerland. The ADM1 names with stray characters copy how
# GDELT's gazetteer prints some of them.
_GEO = """
1|United States|US|US||39.828175|-98.5795|US|30
1|United Kingdom|UK|UK||54|-4|UK|12
1|Israel|IS|IS||31.5|34.75|IS|8
1|China|CH|CH||35|105|CH|8
1|Russia|RS|RS||60|100|RS|7
1|Ukraine|UP|UP||49|32|UP|6
1|France|FR|FR||46|2|FR|4
1|Germany|GM|GM||51|9|GM|4
1|India|IN|IN||20|77|IN|6
1|Iran|IR|IR||32|53|IR|5
1|Syria|SY|SY||35|38|SY|3
1|Iraq|IZ|IZ||33|44|IZ|3
1|Canada|CA|CA||60|-96|CA|4
1|Mexico|MX|MX||23|-102|MX|3
1|Japan|JA|JA||36|138|JA|3
1|Saudi Arabia|SA|SA||25|45|SA|3
1|Australia|AS|AS||-27|133|AS|4
1|Nigeria|NI|NI||10|8|NI|3
1|Switzerland|SZ|SZ||47|8|SZ|1
2|California, United States|US|USCA||36.17|-119.746|CA|8
2|Texas, United States|US|USTX||31.106|-97.6475|TX|6
2|New York, United States|US|USNY||42.1497|-74.9384|NY|6
2|Florida, United States|US|USFL||27.8333|-81.717|FL|5
3|Washington, District of Columbia, United States|US|USDC|DC001|38.8951|-77.0364|531871|14
3|White House, District of Columbia, United States|US|USDC|DC001|38.8951|-77.0364|531871|4
3|New York, New York, United States|US|USNY|NY061|40.7143|-74.006|975772|8
3|Los Angeles, California, United States|US|USCA|CA037|34.0522|-118.244|1662328|5
3|Chicago, Illinois, United States|US|USIL|IL031|41.85|-87.6501|423587|4
3|Denver, Colorado, United States|US|USCO|CO031|39.7392|-104.985|201738|2
4|Jerusalem, Israel (general), Israel|IS|IS00|18315|31.7667|35.2333|-797092|8
4|Tel Aviv, Tel Aviv, Israel|IS|IS05|18316|32.0667|34.7667|-781545|3
4|Gaza, Gaza Strip (general), Gaza Strip|GZ|GZ00|40592|31.5|34.4667|-781210|4
4|Ramallah, West Bank (general), West Bank|WE|WE00|40593|31.9|35.2|-785311|2
4|Beijing, Beijing, China|CH|CH22|13001|39.9289|116.388|-1898541|5
4|Moscow, Moskva, Russia|RS|RS48|25106|55.7522|37.6156|-2960561|5
4|Kiev, Kyyiv, Misto, Ukraine|UP|UP12|27551|50.4333|30.5167|-1044367|4
4|London, London, City of, United Kingdom|UK|UKH9|40111|51.5|-0.116667|-2601889|6
4|Paris, France (general), France|FR|FR00|16282|48.8667|2.33333|-1456928|4
4|Berlin, Berlin, Germany|GM|GM16|17141|52.5167|13.4|-1746443|3
4|New Delhi, Delhi, India|IN|IN07|70141|28.6|77.2|-2106102|4
4|Tehran, Tehran, Iran|IR|IR26|20221|35.75|51.5148|10074674|3
4|Damascus, Dimashq, Syria|SY|SY13|26324|33.5|36.3|-2541260|3
4|Baghdad, Baghdad, Iraq|IZ|IZ07|20561|33.3386|44.3939|-3053452|3
4|Kabul, Kabol, Afghanistan|AF|AF13|10511|34.5167|69.1833|-3378435|2
4|Islamabad, Islamabad, Pakistan|PK|PK08|40591|33.7|73.1667|-1301828|2
4|Sanaa, Sana', Yemen|YM|YM16|32956|15.3547|44.2067|-3191442|2
4|Beirut, Beyrouth, Lebanon|LE|LE04|40613|33.8719|35.5097|-801546|2
4|Tokyo, Tokyo, Japan|JA|JA40|32560|35.685|139.751|-246227|2
4|Seoul, Soul-t'ukpyolsi, South Korea|KS|KS11|24984|37.5664|127|-716583|2
4|Ottawa, Ontario, Canada|CA|CA08|12605|45.4167|-75.7|-570760|2
4|Mexico City, Distrito Federal, Mexico|MX|MX09|19016|19.4342|-99.1386|-1658079|2
4|Sydney, New South Wales, Australia|AS|AS02|18521|-33.8833|151.217|-1603135|2
4|Abuja, Federal Capital Territory, Nigeria|NI|NI11|22041|9.08333|7.53333|-1997013|2
4|Cairo, Al Qahirah, Egypt|EG|EG11|16002|30.05|31.25|-290692|2
4|Ankara, Ankara, Turkey|TU|TU68|29901|39.9272|32.8644|-736233|1
4|São Paulo, São Paulo, Brazil|BR|BR27|11304|-23.5333|-46.6167|-1047527|0.2
4|Bogotá, Bogotá, Colombia|CO|CO34|14121|4.6|-74.0833|-578072|0.2
4|Zürich, Zürich, Switzerland|SZ|SZ25|26401|47.3667|8.55|-2554935|0.2
4|Kraków, Malopolskie, Poland|PL|PL77|23401|50.0833|19.9167|-509625|0.2
4|Düsseldorf, Nordrhein-Westfalen, Germany|GM|GM07|17311|51.2167|6.76667|-1764373|0.2
4|Reykjavík, Höfuðborgarsvæði, Iceland|IC|IC39|11811|64.15|-21.95|-2622112|0.2
4|Ciudad Juarez, Méco, Mexico|MX|MX06|19311|31.7333|-106.483|-1647285|0.2
4|Panama City, PanamáM, Panama|PM|PM08|93693|8.96667|-79.5333|-168008|0.2
5|Île-de-France, France|FR|FRA8||48.5|2.5|FRA8|0.2
5|Punjab, Pakistan|PK|PK04||30.8333|72.8333|PK04|1
5|Donetsk, Ukraine|UP|UP05||48|37.8|UP05|1
"""
# Share of blank (Type 0) ActionGeo; GDELT shows 2-3%.
_ACTION_GEO_BLANK = 0.025

# News sites for SOURCEURL and mentions: name | language of its slugs | weight. The .example TLD
# keeps the URLs unmistakably synthetic. Non-English slugs carry most of the non-ASCII text; their
# weights keep non-ASCII rows near the 2-5% of real exports.
_SITES = """
dailyherald|en|8; morningpost|en|8; capitaltimes|en|6; worldwire|en|10; eveningstar|en|5; metrojournal|en|5
riverside-gazette|en|3; northernchronicle|en|3; harbourtribune|en|3; valleynews|en|4; thenationalreport|en|6
globalobserver|en|7; asiadispatch|en|4; gulfherald|en|3; africanewsdesk|en|3; pacificpress|en|3
continentalreview|en|2; frontierledger|en|2; citizenvoice|en|2; heartlandcourier|en|3; el-correo-diario|es|1
noticias-del-sur|es|0.5; le-quotidien|fr|0.8; la-depeche-du-nord|fr|0.3; zeitung-heute|de|0.5; morgenblatt|de|0.3
"""
_SECTIONS = ("news", "world", "politics", "national", "local", "business", "opinion", "region", "security")
# Slug vocabularies, one per site language.
_WORDS = {
    "en": """police minister protest talks sanctions border election court army rebels president
        ceasefire strike attack summit trade deal aid vote council officials warns says meets
        accuses rejects urges calls probe arrested killed injured crisis government opposition
        leaders forces troops missile drone peace plan budget tariffs refugees health school
        students workers union farmers energy oil gas prices storm flood fire city village
        region state capital week report new""",
    "es": """gobierno presidente protesta policía frontera elecciones tribunal ejército acuerdo
        ayuda votación consejo crisis oposición líderes fuerzas paz plan presupuesto salud
        escuela estudiantes trabajadores sindicato energía petróleo precios tormenta ciudad
        región capital semana año informe nueva ministro sanciones cumbre comercio ataque
        huelga denuncia reunión detenidos muertos heridos migrantes economía reforma congreso
        senado fiscal juez alcalde vecinos campaña partido mañana seguridad justicia""",
    "fr": """gouvernement président manifestation police frontière élections tribunal armée
        accord aide vote conseil crise opposition dirigeants forces paix plan budget santé
        école étudiants travailleurs syndicat énergie pétrole prix tempête ville région
        capitale semaine année rapport nouvelle ministre sanctions sommet commerce attaque
        grève réunion arrêtés morts blessés migrants économie réforme assemblée sénat juge
        maire habitants campagne parti sécurité justice député préfet""",
    "de": """regierung präsident protest polizei grenze wahl gericht armee abkommen hilfe
        abstimmung rat krise opposition führung truppen frieden plan haushalt gesundheit
        schule studenten arbeiter gewerkschaft energie öl preise sturm stadt region hauptstadt
        woche jahr bericht neue minister sanktionen gipfel handel angriff streik treffen
        festnahmen tote verletzte migranten wirtschaft reform bundestag richter bürgermeister
        bürger wahlkampf partei sicherheit justiz länder straße""",
}
_BBC = "BBC Monitoring"  # GDELT's CITATIONONLY source: a citation, not a URL


@dataclass(frozen=True)
class MirrorOptions:
    """Ways a mirror may differ from the default (``generate_mirror(..., options=...)``), for the
    demo: the defaults reproduce the default mirror byte for byte.

    ``event_scale`` multiplies the events of every slot (gaps and near-empty files stay as they are),
    so a month fits in a few minutes. Fewer events alone would leave no quad with the mentions and
    articles a test query needs, because actors are drawn independently; ``stories_per_day`` adds
    what makes real quads well reported: a day's top stories, each an international (actor, event,
    actor) triple that many outlets report in separate articles throughout the day. Half of them
    run for a whole week, so the history baselines have something to recur on. ``url_scheme``
    is the scheme of the article URLs (the demo's news server speaks plain HTTP).
    """

    event_scale: float = 1.0
    stories_per_day: int = 0
    url_scheme: str = "https"

    def __post_init__(self) -> None:
        if not 0 < self.event_scale <= 1:
            raise ValueError(f"event_scale must be in (0, 1], got {self.event_scale}")
        if self.stories_per_day < 0:
            raise ValueError("stories_per_day must be >= 0")
        if self.url_scheme not in ("http", "https"):
            raise ValueError(f"url_scheme must be http or https, got {self.url_scheme!r}")


DEFAULT_OPTIONS = MirrorOptions()
# A story's events per day. Its events are widely covered (1-4 more mentions each than an ordinary
# event's ~2.3), so ~30 of them lift a quad past MIRAI's 100 daily mentions on most days, from
# 25-30 distinct articles (a test query needs 5 kept ones); the later stories of a day are smaller
# (STORY_WEIGHTS) and some days fall short, as real stories do.
STORY_EVENTS_PER_DAY = 30
STORY_WEIGHTS = (1.5, 1.3, 1.1, 1.0, 0.9, 0.8, 0.7, 0.7)
# Story actors: countries that make international news (bare country actors, ISO codes).
_STORY_COUNTRIES = (
    "USA CHN RUS UKR ISR GBR FRA DEU IND IRN PAK SYR TUR SAU JPN KOR PRK CAN MEX BRA AUS NGA EGY PSE IRQ "
    "AFG QAT VEN POL ITA"
).split()
_BLANK_ACTOR = "\t" * 9  # 10 empty fields
_BLANK_GEO = "0" + "\t" * 7  # Type 0 and 7 empty fields


def _parse_table(text: str) -> list[list[str]]:
    """Entries separated by ';' or newlines, fields by '|'."""
    return [entry.strip().split("|") for entry in re.split(r"[;\n]", text) if entry.strip()]


def _cum(weights: list[float]) -> list[float]:
    return list(accumulate(weights))


@dataclass(frozen=True)
class _Tables:
    """The code lists above, pre-joined into the TAB-separated field groups rows are made of."""

    actors: list[str]  # 10 fields each (Actor*Code ... Actor*Type3Code)
    actor_weights: list[float]
    events: list[str]  # EventCode, EventBaseCode, EventRootCode, QuadClass, GoldsteinScale
    event_cum: list[float]
    geos: list[str]  # 8 fields each (Type, FullName, CountryCode, ADM1, ADM2, Lat, Long, FeatureID)
    geo_cum: list[float]
    sites: list[tuple[str, str, str]]  # (domain, url prefix, language)
    site_cum: list[float]


def _actor_fields(code: str, name: str, country: str = "", group: str = "", religion: str = "", type1: str = "") -> str:
    # Code, Name, CountryCode, KnownGroupCode, EthnicCode, Religion1Code, Religion2Code, Type1-3
    return "\t".join((code, name, country, group, "", religion, "", type1, "", ""))


def _quad_class(root: int) -> int:
    # CAMEO roots 01-05 verbal cooperation, 06-09 material cooperation, 10-14 verbal conflict,
    # 15-20 material conflict.
    return 1 if root <= 5 else 2 if root <= 9 else 3 if root <= 14 else 4


@lru_cache(maxsize=1)
def _tables() -> _Tables:
    actors: list[str] = []
    weights: list[float] = []
    countries = [(c, n, float(w)) for c, n, w in _parse_table(_COUNTRIES)]
    roles = [(r, names.split(","), float(w)) for r, names, w in _parse_table(_ROLES)]
    role_total = sum(w for _, _, w in roles)
    # Shares of actor shapes, close to a real export file: a bare country, country + role
    # (USAGOV), a bare role (POLICE), an organisation or religious group.
    country_only, country_role, role_only, group = 0.50, 0.18, 0.28, 0.04
    country_total = sum(w for _, _, w in countries)
    for code, name, w in countries:
        share = w / country_total
        names = (name, *_COUNTRY_ALIASES.get(code, ()))
        for i, n in enumerate(names):
            # The country's own name carries most of the weight; aliases split the rest.
            part = 1.0 if len(names) == 1 else 0.7 if i == 0 else 0.3 / (len(names) - 1)
            actors.append(_actor_fields(code, n, code))
            weights.append(country_only * share * part)
        for role, _, rw in roles:
            actors.append(_actor_fields(code + role, name, code, type1=role))
            weights.append(country_role * share * rw / role_total)
    for role, role_names, rw in roles:
        for n in role_names:
            actors.append(_actor_fields(role, n, type1=role))
            weights.append(role_only * rw / role_total / len(role_names))
    groups = _parse_table(_GROUPS)
    for code, name, known, religion, type1 in groups:
        actors.append(_actor_fields(code, name, group=known, religion=religion, type1=type1))
        weights.append(group / len(groups))

    events: list[str] = []
    event_weights: list[float] = []
    for code, goldstein, w in (row.split() for row in re.split(r"[|\n]", _EVENT_CODES) if row.strip()):
        events.append("\t".join((code, code[:3], code[:2], str(_quad_class(int(code[:2]))), goldstein)))
        event_weights.append(float(w))
    events.append(_BAD_EVENT)
    event_weights.append(sum(event_weights) * _BAD_EVENT_SHARE / (1 - _BAD_EVENT_SHARE))

    geos: list[str] = []
    geo_weights: list[float] = []
    geo_rows = [line.split("|") for line in _GEO.strip().splitlines()]
    geo_total = sum(float(r[-1]) for r in geo_rows)
    for row in geo_rows:
        geos.append("\t".join(row[:-1]))
        geo_weights.append(float(row[-1]) / geo_total * (1 - _ACTION_GEO_BLANK))
    geos.append(_BLANK_GEO)
    geo_weights.append(_ACTION_GEO_BLANK)

    sites = []
    site_weights = []
    for name, lang, w in _parse_table(_SITES):
        domain = f"{name}.example"
        sites.append((domain, f"https://www.{domain}/", lang))
        site_weights.append(float(w))
    return _Tables(actors, weights, events, _cum(event_weights), geos, _cum(geo_weights), sites, _cum(site_weights))


_WORD_LISTS = {lang: words.split() for lang, words in _WORDS.items()}


def news_sites() -> dict[str, str]:
    """Domain → language of every generated news site (the demo's news server plays them)."""
    return {domain: lang for domain, _, lang in _tables().sites}


# --- Per-seed pools ------------------------------------------------------------------------------


def _gdelt_float(x: float) -> str:
    # GDELT prints tones with 15 significant digits and no trailing zeros (-0.522648083623693, 0).
    return f"{x:.15g}"


@dataclass(frozen=True)
class _Pools:
    """Per-seed pools of field groups that rows pick from, so a row costs a list lookup rather
    than a dozen random draws. Pools are large enough that repeats look like GDELT's own."""

    tones: list[str]  # AvgTone
    mention_tails: list[str]  # SentenceID ... Extras (10 fields)
    mention_values: list[int]  # NumMentions distribution
    mention_cum: list[float]
    counts: dict[int, list[str]]  # NumMentions -> variants of "NumMentions\tNumSources\tNumArticles"


@lru_cache(maxsize=4)
def _pools(seed: int) -> _Pools:
    rng = random.Random(f"mirai-mirror/pools/{seed}")
    tones = []
    for _ in range(8192):
        # A document tone is (positive - negative words) / words * 100; news skews negative.
        words = rng.randint(40, 2500)
        pos = rng.randint(0, words // 12)
        neg = rng.randint(0, words // 8)
        tones.append(_gdelt_float((pos - neg) / words * 100))
    tails = []
    for _ in range(8192):
        doc_len = rng.randint(300, 12000)
        action = rng.randint(0, doc_len - 1)
        a1 = -1 if rng.random() < 0.1 else max(0, action - rng.randint(0, 200))
        a2 = -1 if rng.random() < 0.3 else min(doc_len, action + rng.randint(0, 200))
        conf = rng.choices(range(10, 101, 10), weights=(28, 50, 12, 18, 22, 21, 2, 7, 1, 39))[0]
        tails.append(
            "\t".join(
                (
                    str(min(60, int(rng.expovariate(0.15)) + 1)),  # SentenceID
                    str(a1),
                    str(a2),
                    str(action),
                    "1" if rng.random() < 0.6 else "0",  # InRawText
                    str(conf),
                    str(doc_len),
                    rng.choice(tones),
                    "",  # MentionDocTranslationInfo: blank in the English feed
                    "",  # Extras
                )
            )
        )
    # NumMentions: most events get 1-3 mentions in their first batch, with a power-law tail up to
    # 400 so that busy (day, actor, actor, code) groups pass 50 and 100 mentions a day.
    values = list(range(1, 401))
    weights = [55.0, 19.0, 9.0] + [30.0 * m**-2.4 for m in values[3:]]
    counts: dict[int, list[str]] = {}
    for m in values:
        variants = []
        for _ in range(4):
            articles = m if rng.random() < 0.7 else rng.randint(max(1, m // 2), m)
            sources = articles if articles <= 1 else rng.randint(1, articles)
            variants.append(f"{m}\t{sources}\t{articles}")
        counts[m] = variants
    return _Pools(tones, tails, values, _cum(weights), counts)


# --- Day plans -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DayPlan:
    """What a day looks like before any row is drawn: events per slot and the outage."""

    day: date
    counts: tuple[int, ...]  # events per slot; 0 for gaps
    first_ids: tuple[int, ...]  # GLOBALEVENTID of each slot's first event
    gaps: frozenset[int]  # slot indexes absent from the index
    near_empty: int
    burst: int


@lru_cache(maxsize=4096)
def _day_plan(seed: int, day: date, scale: float = 1.0) -> _DayPlan:
    rng = random.Random(f"mirai-mirror/day/{seed}/{day.isoformat()}")
    counts = []
    for i in range(SLOTS_PER_DAY):
        # A daily wave (quietest around 03:00 UTC) plus noise, inside the 1,500-2,100 events per
        # file seen in real exports.
        wave = 1800 + 220 * math.sin(2 * math.pi * (i - 36) / SLOTS_PER_DAY)
        counts.append(min(2100, max(1500, round(wave + rng.randint(-120, 120)))))
    # The outage falls between 01:30 and 05:00 so a partial day of 24+ slots already shows it:
    # a near-empty file, 1-2 missing slots, then a catch-up burst, as in February 2015.
    start = rng.randint(6, 20)
    length = rng.choice((1, 1, 2))
    gaps = set(range(start, start + length))
    near_empty, burst = start - 1, start + length
    if rng.random() < 0.6:
        gaps.add(rng.randint(burst + 2, SLOTS_PER_DAY - 1))  # one isolated missing slot later on
    counts[near_empty] = rng.randint(0, 3)
    counts[burst] = round(counts[burst] * rng.uniform(6.5, 7.5))
    for g in gaps:
        counts[g] = 0
    if scale != 1.0:  # after every draw, so a scaled day keeps the default day's outage
        counts = [c if i == near_empty or not c else max(1, round(c * scale)) for i, c in enumerate(counts)]
    day_first = FIRST_EVENT_ID + (day - EPOCH).days * DAY_ID_BLOCK
    first_ids = tuple(day_first + c for c in accumulate([0, *counts[:-1]]))
    assert first_ids[-1] + counts[-1] - day_first <= DAY_ID_BLOCK
    return _DayPlan(day, tuple(counts), first_ids, frozenset(gaps), near_empty, burst)


def _slot_time(slot_no: int) -> datetime:
    return datetime.combine(EPOCH, datetime.min.time()) + timedelta(minutes=15 * slot_no)


def _slot_events(seed: int, slot_no: int, scale: float = 1.0) -> tuple[int, int]:
    """(first GLOBALEVENTID, event count) of any slot, 0 events for a gap or before GDELT 2.0."""
    if slot_no < 0:
        return 0, 0
    plan = _day_plan(seed, EPOCH + timedelta(days=slot_no // SLOTS_PER_DAY), scale)
    i = slot_no % SLOTS_PER_DAY
    return plan.first_ids[i], plan.counts[i]


# --- URLs ----------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    # splitmix64's finaliser: turns (seed, slot, index) into well-spread bits without a Random object.
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _document(seed: int, slot_no: int, j: int, scheme: str = "https") -> tuple[str, str]:
    """(domain, URL) of document ``j`` first published in slot ``slot_no``: a pure function, so a
    later slot can report the same URL again without replaying the earlier slot."""
    t = _tables()
    h = _mix(_mix(_mix(seed) ^ slot_no) ^ j)
    g = _mix(h)
    site = t.sites[bisect_right(t.site_cum, (h & 0xFFFF) / 0x10000 * t.site_cum[-1])]
    words = _WORD_LISTS[site[2]]
    n_words = 3 + (g & 3) + ((g >> 2) & 1)
    slug = "-".join(words[((g >> (8 + 8 * k)) & 255) % len(words)] for k in range(n_words))
    day = EPOCH + timedelta(days=slot_no // SLOTS_PER_DAY)
    section = _SECTIONS[(h >> 16) % len(_SECTIONS)]
    if (h >> 24) & 1:  # half the URLs end with a numeric article id, as many CMSs print them
        slug = f"{slug}-{(h >> 25) % 9_000_000 + 1_000_000}"
    prefix = site[1] if scheme == "https" else f"{scheme}{site[1][len('https') :]}"
    return site[0], f"{prefix}{section}/{day:%Y/%m/%d}/{slug}"


# --- One slot ------------------------------------------------------------------------------------


@dataclass
class _FileText:
    data: bytes  # the CSV member
    valid_rows: int
    malformed: list[tuple[int, str]]  # (1-based line number, reason)


@dataclass
class _SlotText:
    ts: str
    export: _FileText
    mentions: _FileText
    first_mentions: int
    re_mentions: int


# Invalid UTF-8 as surrogate escapes (U+DC80..U+DCFF encode to the single bytes 0x80..0xFF with
# errors="surrogateescape"): a stray 0xFF, a lead byte without its continuation, a truncated
# 3-byte sequence, an encoded surrogate, an overlong '/'.
_BAD_UTF8 = ("\udcff", "\udcc3(", "\udce2\udc82", "\udced\udca0\udc80", "\udcc0\udcaf")


def _corrupt(rows: list[str], rng: random.Random, n_fields: int, text_field: int) -> list[tuple[int, str]]:
    """Break a few rows in place, as GDELT files occasionally are: wrong field count (a dropped
    last field, a stray TAB, a line cut short) or invalid UTF-8 inside ``text_field``. Files of
    fewer than 20 rows are left alone so near-empty files hold exactly their 0-3 events."""
    if len(rows) < 20 or rng.random() >= 0.2:
        return []
    damaged = []
    for index in sorted(rng.sample(range(len(rows)), rng.randint(1, 3))):
        row = rows[index]
        if rng.random() < 0.5:
            how = rng.randrange(3)
            if how == 0:
                row = row[: row.rfind("\t")]
            elif how == 1:
                cut = rng.randint(1, len(row) - 1)
                row = row[:cut] + "\t" + row[cut:]
            else:
                fields = row.split("\t")
                row = "\t".join(fields[: rng.randint(2, n_fields - 2)])
            reason = "field_count"
        else:
            fields = row.split("\t")
            fields[text_field] += rng.choice(_BAD_UTF8)
            row = "\t".join(fields)
            reason = "invalid_utf8"
        rows[index] = row
        damaged.append((index + 1, reason))
    return damaged


def _encode(rows: list[str]) -> bytes:
    return "".join(r + "\n" for r in rows).encode("utf-8", "surrogateescape")


def _make_slot(seed: int, slot_no: int, opts: MirrorOptions = DEFAULT_OPTIONS) -> _SlotText:
    t = _tables()
    p = _pools(seed)
    scale, scheme = opts.event_scale, opts.url_scheme
    first_id, n = _slot_events(seed, slot_no, scale)
    when = _slot_time(slot_no)
    ts = f"{when:%Y%m%d%H%M%S}"
    rng = random.Random(f"mirai-mirror/slot/{seed}/{ts}")

    # Articles: consecutive events often come from the same article, as in real exports.
    article_of: list[int] = []
    n_articles = 0
    while len(article_of) < n:
        article_of.extend([n_articles] * rng.choices((1, 2, 3, 4, 5, 6), weights=(30, 25, 18, 12, 8, 7))[0])
        n_articles += 1
    del article_of[n:]
    # Document pool of this slot: its articles plus as many again that only mention events.
    n_docs = max(8, 2 * n_articles)
    docs: dict[int, tuple[str, str]] = {}

    def doc(j: int) -> tuple[str, str]:
        if j not in docs:
            docs[j] = _document(seed, slot_no, j, scheme)
        return docs[j]

    article_urls = []
    for j in range(n_articles):
        if rng.random() < 0.03:
            # Reported again 24-72 hours (1-3 calendar days) later: one of the first articles of
            # a slot back then (every non-empty slot has at least count // 6 articles).
            old = slot_no - rng.randint(SLOTS_PER_DAY, 3 * SLOTS_PER_DAY)
            _, old_count = _slot_events(seed, old, scale)
            if old_count:
                docs[j] = _document(seed, old, rng.randrange(max(1, old_count // 6)), scheme)
        article_urls.append(doc(j)[1])

    # SQLDATE: the DATEADDED day for ~95.5%, else exactly 1, 7, 30 or 365 days earlier.
    date_fields = []
    for back in (0, 1, 7, 30, 365):
        d = when.date() - timedelta(days=back)
        fraction = d.year + ((d.month - 1) * 30 + d.day) / 365  # GDELT's own approximation
        date_fields.append(f"{d:%Y%m%d}\t{d:%Y%m}\t{d.year}\t{fraction:.4f}")
    dates = rng.choices(date_fields, cum_weights=_cum([95.5, 1.3, 1.0, 1.0, 1.2]), k=n)

    # Blank actors: the share drifts per file within GDELT's observed 6-11% / 25-31%.
    blank1, blank2 = rng.uniform(0.065, 0.105), rng.uniform(0.255, 0.305)
    actor_total = sum(t.actor_weights)
    cum1 = _cum([w / actor_total * (1 - blank1) for w in t.actor_weights] + [blank1])
    cum2 = _cum([w / actor_total * (1 - blank2) for w in t.actor_weights] + [blank2])
    actor_pool = [*t.actors, _BLANK_ACTOR]
    actor1 = rng.choices(actor_pool, cum_weights=cum1, k=n)
    actor2 = rng.choices(actor_pool, cum_weights=cum2, k=n)
    roots = rng.choices(("0", "1"), k=n)
    events = rng.choices(t.events, cum_weights=t.event_cum, k=n)
    mentions = rng.choices(p.mention_values, cum_weights=p.mention_cum, k=n)
    variant = rng.choices(range(4), k=n)
    tones = rng.choices(p.tones, k=n)
    action_geo = rng.choices(t.geos, cum_weights=t.geo_cum, k=n)
    other_geo = rng.choices(t.geos, cum_weights=t.geo_cum, k=n)
    geo_roll = [rng.random() for _ in range(n)]
    if opts.stories_per_day:
        _tell_stories(seed, slot_no, opts, actor1, actor2, events, mentions, dates, date_fields[0])

    rows = []
    for i in range(n):
        # Actor geo: blank for a blank actor, otherwise mostly where the action happened.
        a1, a2, g, r = actor1[i], actor2[i], action_geo[i], geo_roll[i]
        g1 = _BLANK_GEO if a1 == _BLANK_ACTOR or r < 0.03 else (g if r < 0.85 else other_geo[i])
        g2 = _BLANK_GEO if a2 == _BLANK_ACTOR or r > 0.95 else (g if r < 0.75 else other_geo[i])
        rows.append(
            f"{first_id + i}\t{dates[i]}\t{a1}\t{a2}\t{roots[i]}\t{events[i]}\t{p.counts[mentions[i]][variant[i]]}"
            f"\t{tones[i]}\t{g1}\t{g2}\t{g}\t{ts}\t{article_urls[article_of[i]]}"
        )

    # Mentions. First mentions: NumMentions rows per event, the first from its own article, the
    # rest from other documents of the slot (NumArticles distinct ones; a document can mention
    # the event twice). Then re-mentions of events from earlier slots.
    tails = p.mention_tails
    first_tails = rng.choices(tails, k=n)
    mrows = []
    for i in range(n):
        m = mentions[i]
        eid = first_id + i
        domain, url = doc(article_of[i])
        mrows.append(f"{eid}\t{ts}\t{ts}\t1\t{domain}\t{url}\t{first_tails[i]}")
        if m > 1:
            articles = int(p.counts[m][variant[i]].rsplit("\t", 1)[1])
            picks = [rng.randrange(n_docs) for _ in range(max(0, articles - 1))]
            picks += rng.choices(picks or [article_of[i]], k=m - 1 - len(picks))
            for j in picks:
                mrows.append(_mention(eid, ts, ts, rng, doc(j), tails))
    first_mentions = len(mrows)

    n_re = min(3, n) if n < 20 else round(n * rng.uniform(0.45, 0.75))
    for _ in range(n_re):
        # Age of the mentioned event: mostly the last day, some the last week, a few up to two
        # years back (often before the generated range: readers must not expect to find them).
        bucket = rng.random()
        if bucket < 0.6:
            back = rng.randint(1, SLOTS_PER_DAY)
        elif bucket < 0.85:
            back = rng.randint(SLOTS_PER_DAY, 7 * SLOTS_PER_DAY)
        elif bucket < 0.95:
            back = rng.randint(7 * SLOTS_PER_DAY, 60 * SLOTS_PER_DAY)
        else:
            back = rng.randint(60 * SLOTS_PER_DAY, 730 * SLOTS_PER_DAY)
        old_first, old_count = _slot_events(seed, slot_no - back, scale)
        if not old_count:
            continue  # a gap or near-empty slot back then: nothing to re-mention
        old_ts = f"{_slot_time(slot_no - back):%Y%m%d%H%M%S}"
        mrows.append(_mention(old_first + rng.randrange(old_count), old_ts, ts, rng, doc(rng.randrange(n_docs)), tails))

    export_bad = _corrupt(rows, rng, EXPORT_FIELDS, EXPORT_FIELDS - 1)
    mention_bad = _corrupt(mrows, rng, MENTIONS_FIELDS, 5)
    return _SlotText(
        ts=ts,
        export=_FileText(_encode(rows), len(rows) - len(export_bad), export_bad),
        mentions=_FileText(_encode(mrows), len(mrows) - len(mention_bad), mention_bad),
        first_mentions=first_mentions,
        re_mentions=len(mrows) - first_mentions,
    )


@lru_cache(maxsize=256)
def _stories(seed: int, day: date, n: int) -> tuple[tuple[str, str, str], ...]:
    """The day's ``n`` top stories as (Actor1 fields, Actor2 fields, event fields): the even ones
    are the week's (same triple Monday to Sunday), the odd ones the day's own."""
    t = _tables()
    names = {code: name for code, name, _ in _parse_table(_COUNTRIES)}
    week = day - timedelta(days=day.weekday())
    stories = []
    for k in range(n):
        key = f"week/{week.isoformat()}" if k % 2 == 0 else f"day/{day.isoformat()}"
        rng = random.Random(f"mirai-mirror/story/{seed}/{key}/{k}")
        s, o = rng.sample(_STORY_COUNTRIES, 2)
        event = rng.choices(t.events[:-1], cum_weights=t.event_cum[:-1])[0]  # never the malformed triple
        stories.append((_actor_fields(s, names[s], s), _actor_fields(o, names[o], o), event))
    return tuple(stories)


def _tell_stories(
    seed: int,
    slot_no: int,
    opts: MirrorOptions,
    actor1: list[str],
    actor2: list[str],
    events: list[str],
    mentions: list[int],
    dates: list[str],
    same_day: str,
) -> None:
    """Turn some of a slot's events (in place) into reports of the day's stories, dated the day
    they are reported; the story is drawn from its own stream so the other fields stay put."""
    day = EPOCH + timedelta(days=slot_no // SLOTS_PER_DAY)
    stories = _stories(seed, day, opts.stories_per_day)
    share = min(0.5, len(stories) * STORY_EVENTS_PER_DAY / sum(_day_plan(seed, day, opts.event_scale).counts))
    weights = [STORY_WEIGHTS[k % len(STORY_WEIGHTS)] for k in range(len(stories))]
    rng = random.Random(f"mirai-mirror/stories/{seed}/{slot_no}")
    for i in range(len(events)):
        if rng.random() < share:
            actor1[i], actor2[i], events[i] = rng.choices(stories, weights=weights)[0]
            mentions[i] = min(400, mentions[i] + rng.randint(1, 4))
            dates[i] = same_day


def _mention(eid: int, event_ts: str, ts: str, rng: random.Random, document: tuple[str, str], tails: list[str]) -> str:
    tail = tails[rng.randrange(len(tails))]
    if rng.random() < 0.02:
        # CITATIONONLY: a monitoring service's citation instead of a web document.
        return f"{eid}\t{event_ts}\t{ts}\t2\t{_BBC}\t{_BBC}\t{tail}"
    return f"{eid}\t{event_ts}\t{ts}\t1\t{document[0]}\t{document[1]}\t{tail}"


# --- Files ---------------------------------------------------------------------------------------


def _zip_file(path: Path, member: str, data: bytes, when: datetime) -> dict:
    """Write a one-member zip atomically; its timestamp is the slot time so bytes never depend on
    when or where the generator ran."""
    info = zipfile.ZipInfo(member, date_time=when.timetuple()[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # fixed: the default depends on the OS we run on
    info.external_attr = 0o644 << 16
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(info, data, compresslevel=ZIP_LEVEL)
    blob = buf.getvalue()
    atomic_write_bytes(path, blob, sweep=False)  # generate_mirror swept the feed once
    return {"size": len(blob), "md5": hashlib.md5(blob).hexdigest()}


def _file_entry(name: str, text: _FileText | None, written: dict | None) -> dict:
    malformed = text.malformed if text else []
    return {
        "file": name,
        "listed": written is not None,
        "size": written["size"] if written else None,
        "md5": written["md5"] if written else None,
        "valid_rows": text.valid_rows if text else 0,
        "malformed_rows": len(malformed),
        "malformed": {
            "field_count": sum(1 for _, r in malformed if r == "field_count"),
            "invalid_utf8": sum(1 for _, r in malformed if r == "invalid_utf8"),
        },
        "malformed_lines": [{"line": line, "reason": reason} for line, reason in malformed],
    }


def generate_mirror(
    out: Path, start: date, end: date, seed: int = 0, slots: int | None = None, options: MirrorOptions = DEFAULT_OPTIONS
) -> dict:
    """Write a GDELT 2.0 mirror for the UTC days ``start``..``end`` (inclusive) under ``out``.

    ``slots`` limits the run to the first N 15-minute slot positions from ``start`` 00:00 (gaps
    count as positions), for fast tests; the files written are the same bytes a full run writes.
    ``options`` (MirrorOptions) scales the events down and adds stories, for the demo; the manifest
    then records them under ``options``.
    Zips of earlier runs that this run would not write are deleted, so ``out/gdeltv2`` always
    matches the manifest. Returns the manifest (also written to ``out/manifest.json``):

    - ``seed``, ``start``, ``end`` (ISO dates), ``slots_limit``, ``base_url`` (as in the index)
    - ``totals`` and ``days[<ISO date>]``: ``slots``, ``listed_slots``, ``gaps`` / ``near_empty``
      / ``bursts`` (lists of slot stamps), and per kind (``export``, ``mentions``): ``files``,
      ``bytes``, ``valid_rows``, ``malformed_rows``, ``malformed`` {field_count, invalid_utf8}
    - ``slots``: one entry per slot position, in time order: ``ts`` (YYYYMMDDHHMMSS), ``day``,
      ``kind`` (normal | gap | near_empty | burst), ``listed``, ``event_ids`` ([first, last]
      GLOBALEVENTID of the slot, malformed rows included; None when empty), ``first_mentions``,
      ``re_mentions``, and per kind: ``file``, ``listed``, ``size``, ``md5`` (None when not
      listed), ``valid_rows`` (rows a correct parser keeps), ``malformed_rows``, ``malformed``
      {field_count, invalid_utf8} and ``malformed_lines`` [{line (1-based), reason}].
    """
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    if start < EPOCH:
        raise ValueError(f"GDELT 2.0 starts on {EPOCH}; cannot generate {start}")
    n_slots = ((end - start).days + 1) * SLOTS_PER_DAY
    if slots is not None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        n_slots = min(n_slots, slots)
    feed = Path(out) / "gdeltv2"
    feed.mkdir(parents=True, exist_ok=True)
    remove_orphan_temps(feed)  # a killed run's temp files, in one listing of the flat feed
    first_slot = (start - EPOCH).days * SLOTS_PER_DAY

    slot_entries: list[dict] = []
    index_lines: list[list[str]] = []  # per listed slot: its index lines
    # Compression (zlib releases the GIL) runs in a second thread while the next slot's rows are
    # drawn; results are taken in slot order, so the output does not depend on thread timing.
    pending: list[tuple[_SlotText | None, int, Future | None]] = []
    with ThreadPoolExecutor(max_workers=2) as pool:

        def drain(limit: int) -> None:
            while len(pending) > limit:
                text, slot_no, fut = pending.pop(0)
                slot_entries.append(
                    _slot_entry(slot_no, text, fut.result() if fut else None, seed, options.event_scale)
                )

        for slot_no in range(first_slot, first_slot + n_slots):
            plan = _day_plan(seed, EPOCH + timedelta(days=slot_no // SLOTS_PER_DAY), options.event_scale)
            if slot_no % SLOTS_PER_DAY in plan.gaps:
                pending.append((None, slot_no, None))
            else:
                text = _make_slot(seed, slot_no, options)
                pending.append((text, slot_no, pool.submit(_write_slot, feed, text, _slot_time(slot_no))))
            drain(3)
        drain(0)

    written_names = set()
    for entry in slot_entries:
        lines = []
        for kind in ("export", "mentions"):
            f = entry[kind]
            if f["listed"]:
                written_names.add(f["file"])
                lines.append(f"{f['size']} {f['md5']} {GDELT_URL}{f['file']}")
        if lines:
            index_lines.append(lines)
    for stale in feed.iterdir():
        if _FILE_NAME.match(stale.name) and stale.name not in written_names:
            stale.unlink()
    atomic_write_bytes(
        feed / "masterfilelist.txt", "".join(line + "\n" for lines in index_lines for line in lines).encode()
    )
    atomic_write_bytes(
        feed / "lastupdate.txt", "".join(line + "\n" for line in index_lines[-1]).encode() if index_lines else b""
    )

    manifest = _manifest(start, end, seed, slots, slot_entries, options)
    atomic_write_bytes(Path(out) / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def _write_slot(feed: Path, text: _SlotText, when: datetime) -> dict:
    return {
        kind: _zip_file(feed / f"{text.ts}.{kind}.CSV.zip", f"{text.ts}.{kind}.CSV", getattr(text, kind).data, when)
        for kind in ("export", "mentions")
    }


def _slot_entry(slot_no: int, text: _SlotText | None, written: dict | None, seed: int, scale: float) -> dict:
    when = _slot_time(slot_no)
    ts = f"{when:%Y%m%d%H%M%S}"
    plan = _day_plan(seed, when.date(), scale)
    i = slot_no % SLOTS_PER_DAY
    first_id, count = _slot_events(seed, slot_no, scale)
    kind = (
        "gap" if i in plan.gaps else "near_empty" if i == plan.near_empty else "burst" if i == plan.burst else "normal"
    )
    return {
        "ts": ts,
        "day": when.date().isoformat(),
        "kind": kind,
        "listed": text is not None,
        "event_ids": [first_id, first_id + count - 1] if count else None,
        "first_mentions": text.first_mentions if text else 0,
        "re_mentions": text.re_mentions if text else 0,
        "export": _file_entry(f"{ts}.export.CSV.zip", text.export if text else None, written and written["export"]),
        "mentions": _file_entry(
            f"{ts}.mentions.CSV.zip", text.mentions if text else None, written and written["mentions"]
        ),
    }


def _totals(entries: list[dict]) -> dict:
    totals: dict = {
        "slots": len(entries),
        "listed_slots": sum(e["listed"] for e in entries),
        "gaps": [e["ts"] for e in entries if e["kind"] == "gap"],
        "near_empty": [e["ts"] for e in entries if e["kind"] == "near_empty"],
        "bursts": [e["ts"] for e in entries if e["kind"] == "burst"],
    }
    for kind in ("export", "mentions"):
        files = [e[kind] for e in entries if e[kind]["listed"]]
        totals[kind] = {
            "files": len(files),
            "bytes": sum(f["size"] for f in files),
            "valid_rows": sum(f["valid_rows"] for f in files),
            "malformed_rows": sum(f["malformed_rows"] for f in files),
            "malformed": {
                reason: sum(f["malformed"][reason] for f in files) for reason in ("field_count", "invalid_utf8")
            },
        }
    return totals


def _manifest(
    start: date, end: date, seed: int, slots: int | None, entries: list[dict], options: MirrorOptions
) -> dict:
    days: dict[str, list[dict]] = {}
    for e in entries:
        days.setdefault(e["day"], []).append(e)
    # Only a non-default mirror says how it differs, so a default manifest keeps its bytes.
    extra = {} if options == DEFAULT_OPTIONS else {"options": asdict(options)}
    return {
        "generator": "testbed.generate",
        "seed": seed,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "slots_limit": slots,
        "base_url": GDELT_URL,
        **extra,
        "totals": _totals(entries),
        "days": {day: _totals(day_entries) for day, day_entries in days.items()},
        "slots": entries,
    }
