"""MIRAI's file layout: export a month's database and split as the files MIRAI's scripts read, and
import MIRAI's published dataset into our database and split format.

MIRAI (arXiv:2407.01231; code at github.com/yecchen/MIRAI) keeps its data as tab-separated files
written by pandas: ``data/MIRAI/data_kg.csv`` and ``data_news.csv`` (its
``dataset_construction/6_generate_final_data.py``), ``data/MIRAI/{test,test_subset}/relation_query.csv``
(step 9) and the ``data/info/`` dictionaries that ``APIs/api_implementation.py`` and
``agent_evaluation/eval.py`` load. docs/mirai.md ("MIRAI's files") lists every column and where a
value differs from MIRAI's.

This module owns the layout both directions share: the file names, their columns, the import's
bounds, the two errors and the cell and code spellings. The export is
pipeline/splits/mirai_export.py, the import pipeline/splits/mirai_import.py (one home each, so
neither module passes ~500 lines).
"""

from __future__ import annotations

import hashlib
import unicodedata
from datetime import date
from functools import cache

from pipeline.reference.tables import named_relations

EXPORT_FORMAT = "mirai-export-v1"
EXPORT_MANIFEST = "mirai-export.json"
IMPORT_FORMAT = "mirai-import-v1"
IMPORT_MANIFEST = "mirai-import.json"  # at the root of a data directory an import wrote

KG_FILE = "data/MIRAI/data_kg.csv"
NEWS_FILE = "data/MIRAI/data_news.csv"
# MIRAI's step 6 writes data_final.csv with every GDELT column; its step 7 reads only QuadEventCode
# and NumDailyMentions from it. Ours holds one row per quad with the quad's columns and those two.
FINAL_FILE = "data/MIRAI/data_final.csv"
TEST_FILE = "data/MIRAI/test/relation_query.csv"
SUBSET_FILE = "data/MIRAI/test_subset/relation_query.csv"
RELATIONS_FILE = "data/info/dict_code2relation.json"
COUNTRIES_FILE = "data/info/dict_iso2alternames_GeoNames.json"
COUNTRY_TXT_FILE = "data/info/ISO_country_GeoNames.txt"  # step 2's country table: ISO<TAB>name
RELATION_TXT_FILE = "data/info/CAMEO_relation.txt"  # step 2's relation table: code<TAB>name
# The same names, under MIRAI_BUNDLE_DIR, are what a release may hold of the bundle
# (pipeline/release/layout.py; tests/test_mirai_files.py checks the two lists agree).
BUNDLE_FILES = (
    KG_FILE,
    NEWS_FILE,
    FINAL_FILE,
    TEST_FILE,
    SUBSET_FILE,
    RELATIONS_FILE,
    COUNTRIES_FILE,
    COUNTRY_TXT_FILE,
    RELATION_TXT_FILE,
)
# The two embedding files MIRAI's API loads at import; made by its _encode_country_relation.py
# with OpenAI's paid embedding service, so never part of an export (docs/mirai.md, "Embeddings").
EMBEDDING_FILES = ("data/info/country_embeddings.npy", "data/info/relation_embeddings.npy")

KG_COLUMNS = (
    "DateStr",
    "Actor1CountryCode",
    "Actor2CountryCode",
    "EventBaseCode",
    "Actor1CountryName",
    "Actor2CountryName",
    "RelName",
    "QuadEventCode",
    "QuadEventName",
    "Docid",
    "Docids",
)
NEWS_COLUMNS = ("Docid", "MD5", "URL", "Date", "Title", "Text", "Abstract")
FINAL_COLUMNS = (
    "DateStr",
    "Actor1CountryCode",
    "Actor2CountryCode",
    "EventBaseCode",
    "QuadEventCode",
    "NumDailyMentions",
)
# The columns step 9 leaves in relation_query.csv (step 7's test_kg.csv columns, minus the ones it
# drops, plus QueryCode, AnswerList, AnswerDict, DateNLP and QueryId first).
QUERY_COLUMNS = (
    "QueryId",
    "DateStr",
    "Actor1CountryCode",
    "Actor2CountryCode",
    "EventBaseCode",
    "Actor1CountryName",
    "Actor2CountryName",
    "Actor1Region",
    "Actor1SubRegion",
    "Actor2Region",
    "Actor2SubRegion",
    "EventRootCode",
    "query",
    "NumDailyMentions",
    "news_count",
    "min_news_count",
    "QueryCode",
    "AnswerList",
    "AnswerDict",
    "DateNLP",
)
# strftime's %B follows the locale; MIRAI's DateNLP is English ("November 03, 2023").
MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

# Import bounds. MIRAI's published files are ~10^5-10^6 rows; a hostile file is refused at these.
MAX_FILE_BYTES = {
    KG_FILE: 8 * 2**30,
    NEWS_FILE: 32 * 2**30,
    FINAL_FILE: 8 * 2**30,
    TEST_FILE: 256 * 2**20,
    SUBSET_FILE: 256 * 2**20,
}
MAX_FIELD_CHARS = 8 * 2**20  # one article's text
# Queries of one relation_query.csv: as many as `mirai score` and `mirai evaluate` read of a split
# (pipeline/evaluation/score_inputs.py MAX_RECORDS; MIRAI's test month has 705). Each costs ~1.7 KB
# of Python objects while the file is read: 600,000 rows (45 MB, under the 256 MiB cap) took 1 GB.
MAX_QUERIES = 200_000
MAX_DOCIDS = 100_000  # articles of one quad
MAX_ANSWER_CHARS = 64 * 2**10


class MiraiFormatError(ValueError):
    """An imported file breaks MIRAI's layout; the message is one line naming the file and line."""


class ExportError(RuntimeError):
    """An export cannot be made as asked; the message says why."""


# --- shared pieces ------------------------------------------------------------------------------


def date_nlp(day: date) -> str:
    return f"{MONTH_NAMES[day.month - 1]} {day.day:02d}, {day.year}"


def quad_code(day: date, s: str, r: str, o: str) -> str:
    return f"{day.isoformat()}, {s}, {r}, {o}"


def query_code(day: date, s: str, o: str) -> str:
    return f"({day.isoformat()}, {s}, ?, {o})"


def answer_dict_repr(codes: list[str]) -> str:
    """The Python repr of MIRAI's AnswerDict: level-1 keys in order, each with its sorted codes."""
    grouped: dict[str, list[str]] = {}
    for code in sorted(codes):
        grouped.setdefault(code[:2], []).append(code)
    return repr(grouped)


@cache
def relation_dictionary() -> dict[str, dict[str, str]]:
    """dict_code2relation.json: every first- and second-level code, sorted, with the name and
    description our environment gives it (the same reference table as the agent API's)."""
    return {
        code: {"Name": name, "Description": description}
        for code, name, description in named_relations().select("code", "name", "description").iter_rows()
    }


# Spreadsheet formula injection (OWASP, "CSV Injection"; ASVS 5.0, 1.2.10): a spreadsheet opening
# data_news.csv runs a cell that starts with =, +, -, @ as a formula (=HYPERLINK(...) in a hostile
# news title), also behind leading spaces or invisible characters some trim on import, or in a form
# some fold to one of them (full-width ＝ ＋ － ＠: NFKC); a leading tab, CR, NUL or other control
# character is just as unsafe. Such a news cell is written with a leading apostrophe, as CSV
# exporters do; a cell that already starts with apostrophes before one of them gets one more, so the
# import (which removes one from exactly those cells) restores every cell exactly. pandas (MIRAI's
# scripts) reads the apostrophe as text. docs/mirai.md, "Files".
# = + - @ and every character NFKC folds to one of them (full-width, small, super- and subscript).
_FORMULA_STARTS = frozenset(
    "=+-@\u207a\u207c\u208a\u208c\u2a75\u2a76\ufb29\ufe62\ufe63\ufe66\ufe6b\uff0b\uff0d\uff1d\uff20"
)


def _formula_like(text: str) -> bool:
    """Whether ``text``, behind any leading apostrophes, starts as a spreadsheet may run it."""
    body = text.lstrip("'")
    if body[:1] and unicodedata.category(body[0]) == "Cc":
        return True
    for ch in body:
        if not (ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")):
            return ch in _FORMULA_STARTS
    return False


def inert_cell(text: str | None) -> str | None:
    """A news text cell as written to MIRAI's CSV files: a would-be formula behind an apostrophe."""
    return "'" + text if text and _formula_like(text) else text


def restored_cell(text: str | None) -> str | None:
    """``inert_cell`` undone: one leading apostrophe before a would-be formula removed (a cell
    inert_cell left alone never has one there, so the round trip is exact for every string)."""
    return text[1:] if text and text.startswith("'") and _formula_like(text) else text


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
