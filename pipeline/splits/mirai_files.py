"""MIRAI's file layout: export a month's database and split as the files MIRAI's scripts read, and
import MIRAI's published dataset into our database and split format.

MIRAI (arXiv:2407.01231; code at github.com/yecchen/MIRAI) keeps its data as tab-separated files
written by pandas: ``data/MIRAI/data_kg.csv`` and ``data_news.csv`` (its
``dataset_construction/6_generate_final_data.py``), ``data/MIRAI/{test,test_subset}/relation_query.csv``
(step 9) and the ``data/info/`` dictionaries that ``APIs/api_implementation.py`` and
``agent_evaluation/eval.py`` load. docs/mirai.md ("MIRAI's files") lists every column and where a
value differs from MIRAI's.

Export writes a directory that holds ``data/`` (copy it into a MIRAI checkout) plus
``mirai-export.json``; it is built in a temp directory beside the target and swapped in whole.
Import treats the files as untrusted: each file and each field is bounded, every row is checked,
a problem is one line naming the file and line, and the data directory appears whole or not at all.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from functools import cache
from pathlib import Path

import polars as pl
import pycountry

from pipeline.reference import country_names, country_table, iso3_codes, level2_codes, relation_table
from pipeline.reference.tables import named_relations
from pipeline.splits.database import DATABASE_VERSION, EVENT_DB_SCHEMA, NEWS_DB_SCHEMA, month_days
from pipeline.splits.schema import QUERIES_SCHEMA, SPLIT_VERSION
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    outside_or_not_regular,
    staged_directory,
    verified,
    write_sealed_parquet,
)

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
MAX_DOCIDS = 100_000  # articles of one quad
MAX_ANSWER_CHARS = 64 * 2**10

_MD5 = re.compile(r"[0-9a-f]{32}")
_DOCIDS = re.compile(r"\[(?:0|[1-9][0-9]{0,9})(?:, (?:0|[1-9][0-9]{0,9}))*\]")
_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_ANSWER_LIST = re.compile(r"\[(?:'[0-9]{3}'(?:, '[0-9]{3}')*)?\]")
_ANSWER_DICT = re.compile(r"\{(?:'[0-9]{2}': \[(?:'[0-9]{3}'(?:, '[0-9]{3}')*)\](?:, |(?=\})))*\}")


class MiraiFormatError(ValueError):
    """An imported file breaks MIRAI's layout; the message is one line naming the file and line."""


class ExportError(RuntimeError):
    """An export cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    month: str
    database_months: list[str]
    files: dict[str, dict]


@dataclass(frozen=True)
class ImportResult:
    data_dir: Path
    month: str
    database_months: list[str]
    events: int
    news: int
    queries: int
    sample: int


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


@cache
def country_dictionary() -> dict[str, list[str]]:
    """dict_iso2alternames_GeoNames.json: each ISO code with its display name first (MIRAI's API
    checks a Country's name against the first entry), then the other names we know for it
    (pycountry's name, official and common names, CAMEO's spelling of an alias). A name two codes
    share is left out of both lists, since MIRAI's name→code map would keep only the last."""
    primary = dict(country_names().iter_rows())
    names: dict[str, list[str]] = {iso: [primary[iso]] for iso in sorted(primary)}
    for cameo_name, iso in country_table().filter(pl.col("iso3").is_not_null()).select("name", "iso3").iter_rows():
        names[iso].append(cameo_name)
    for entry in pycountry.countries:
        if entry.alpha_3 in names:
            names[entry.alpha_3] += [
                v for a in ("name", "official_name", "common_name") if (v := getattr(entry, a, None))
            ]
    owners: dict[str, set[str]] = {}
    for iso, known in names.items():
        for name in known:
            owners.setdefault(name, set()).add(iso)
    out = {}
    for iso, known in names.items():
        rest = [
            n for n in dict.fromkeys(known[1:]) if n != known[0] and len(owners[n]) == 1 and n not in primary.values()
        ]
        out[iso] = [known[0], *rest]
    return out


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


def _write_csv(path: Path, header: tuple[str, ...], rows) -> dict:
    """Tab-separated text as pandas' ``to_csv(sep='\\t', index=False)`` writes it (pandas writes
    through the csv module: minimal quoting with '"', doubled quotes, '\\n' line ends; a null is
    an empty field), streamed to ``path``; returns its sha256 and size."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter="\t", quotechar='"', quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(("" if v is None else v for v in row) for row in rows)
        fh.flush()
        os.fsync(fh.fileno())
    return _file_entry(path)


def _write_text(path: Path, text: str) -> dict:
    atomic_write_bytes(path, text.encode(), sweep=False)
    return _file_entry(path)


def _file_entry(path: Path) -> dict:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(2**20):
            digest.update(chunk)
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


def _database_months(layout: DataLayout, month: date) -> list[date]:
    events_dir = layout.database_dir() / "events"
    found = sorted(events_dir.glob("month=*.parquet")) if events_dir.is_dir() else []
    months = []
    for path in found:
        label = path.stem.removeprefix("month=")
        try:
            first = date.fromisoformat(f"{label}-01")
        except ValueError:
            continue
        if first <= month:
            months.append(first)
    return months


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- export -------------------------------------------------------------------------------------


def read_split(layout: DataLayout, month: date) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """The month's queries and sample, once their bytes match the split's manifest."""
    split_dir = layout.split_dir(month)
    manifest_path = split_dir / "manifest.json"
    if not manifest_path.exists():
        raise ExportError(f"{month:%Y-%m}: no test split at {split_dir}; build it first (mirai split)")
    manifest = json.loads(manifest_path.read_text())
    frames = []
    for name in ("queries.parquet", "queries_sample.parquet"):
        data = (split_dir / name).read_bytes()
        if _sha256(data) != manifest["files"][name]["sha256"]:
            raise ExportError(f"{split_dir / name} no longer matches its split manifest; rebuild the split")
        frames.append(pl.read_parquet(split_dir / name))
    return frames[0], frames[1], manifest


def write_bundle(
    layout: DataLayout, month: date, queries: pl.DataFrame, sample: pl.DataFrame, directory: Path
) -> tuple[dict[str, dict], list[str]]:
    """Write MIRAI's files for a split (``queries``, ``sample``) and every database month up to
    ``month`` under ``directory`` (a staging directory: its caller swaps it in whole); return each
    file's sha256 and size by relative name, and the database months they hold. build_split
    stores them in the split directory, so a release carries them."""
    month = month.replace(day=1)
    months = _database_months(layout, month)
    if month not in months:
        raise ExportError(f"{month:%Y-%m}: no event database at {layout.database_path('events', month)}")
    paths = [layout.database_path(t, m) for m in months for t in ("events", "news")]
    verified(layout, *paths)
    events = pl.concat([pl.read_parquet(layout.database_path("events", m)) for m in months])
    # Docids number the articles month by month (an article keeps its Docid in every later month's
    # export), within a month in the order our environment holds them (date, then article id
    # descending: pipeline/agent_api/environment.py), so where MIRAI's code takes the first of equal
    # rows (browse_news_article on a repeated title, ties in its sorts) it meets the row ours takes.
    news = pl.concat(
        [
            pl.read_parquet(layout.database_path("news", m)).sort(["date", "article_id"], descending=[False, True])
            for m in months
        ]
    ).with_row_index("Docid")
    if news.get_column("article_id").n_unique() != news.height:
        raise ExportError("the news tables hold an article id twice; the database is damaged")
    docid = dict(zip(news.get_column("article_id"), news.get_column("Docid")))
    ordered = events.sort("date", "s", "r", "o")
    for row in ordered.select("date", "s", "r", "o", "article_ids").iter_rows(named=True):
        ids = row["article_ids"] or []
        missing = [a for a in ids if a not in docid]
        if missing or not ids:
            raise ExportError(
                f"event {quad_code(row['date'], row['s'], row['r'], row['o'])} has "
                + (f"article {missing[0]} missing from the news tables" if missing else "no article")
                + "; MIRAI's data_kg.csv holds one row per (event, article)"
            )

    def kg_rows():
        for row in ordered.iter_rows(named=True):
            docids = sorted(docid[a] for a in row["article_ids"])
            day = row["date"].isoformat()
            code = quad_code(row["date"], row["s"], row["r"], row["o"])
            name = f"{day}, {row['s_name']}, {row['r_name']}, {row['o_name']}"
            head = (day, row["s"], row["o"], row["r"], row["s_name"], row["o_name"], row["r_name"], code, name)
            for d in docids:
                yield (*head, d, str(docids))

    final_rows = (
        (day.isoformat(), s, o, r, quad_code(day, s, r, o), mentions)
        for day, s, r, o, mentions in ordered.select("date", "s", "r", "o", "daily_mentions").iter_rows()
    )
    news_rows = (
        (d, a, inert_cell(u), day.isoformat(), inert_cell(t), inert_cell(x), inert_cell(ab))
        for d, a, u, day, t, x, ab in news.select(
            "Docid", "article_id", "url", "date", "title", "text", "abstract"
        ).iter_rows()
    )
    for name in BUNDLE_FILES:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
    files = {
        KG_FILE: _write_csv(directory / KG_FILE, KG_COLUMNS, kg_rows()),
        NEWS_FILE: _write_csv(directory / NEWS_FILE, NEWS_COLUMNS, news_rows),
        FINAL_FILE: _write_csv(directory / FINAL_FILE, FINAL_COLUMNS, final_rows),
        TEST_FILE: _write_csv(directory / TEST_FILE, QUERY_COLUMNS, _query_rows(queries)),
        SUBSET_FILE: _write_csv(directory / SUBSET_FILE, QUERY_COLUMNS, _query_rows(sample)),
    }
    relations, countries = relation_dictionary(), country_dictionary()
    texts = {
        RELATIONS_FILE: json.dumps(relations, indent=4, ensure_ascii=False) + "\n",
        COUNTRIES_FILE: json.dumps(countries, indent=4, ensure_ascii=False) + "\n",
        COUNTRY_TXT_FILE: "".join(f"{iso}\t{names[0]}\n" for iso, names in countries.items()),
        RELATION_TXT_FILE: "".join(f"{code}\t{info['Name']}\n" for code, info in relations.items()),
    }
    files.update({name: _write_text(directory / name, text) for name, text in texts.items()})
    return dict(sorted(files.items())), [f"{m:%Y-%m}" for m in months]


def _query_rows(queries: pl.DataFrame) -> Iterator[tuple]:
    """relation_query.csv rows, QueryId 1..n in our query order (date, s, o). EventBaseCode and
    EventRootCode are the query's first answer (MIRAI kept whichever quad row came first);
    NumDailyMentions and news_count are the query's (MIRAI: that row's quad's); no sub-regions."""
    for n, q in enumerate(queries.sort("query_id").iter_rows(named=True), start=1):
        answers = list(q["answer_list"])
        yield (
            n,
            q["date"].isoformat(),
            q["s"],
            q["o"],
            answers[0],
            q["s_name"],
            q["o_name"],
            q["s_region"],
            None,
            q["o_region"],
            None,
            answers[0][:2],
            f"{q['date'].isoformat()} {q['s']} {q['o']}",
            q["daily_mentions"],
            q["n_articles"],
            q["min_articles"],
            q["query_code"],
            repr(sorted(answers)),
            answer_dict_repr(answers),
            date_nlp(q["date"]),
        )


def _is_export(directory: Path) -> bool:
    manifest = directory / EXPORT_MANIFEST
    try:
        return json.loads(manifest.read_text()).get("format") == EXPORT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def export_mirai(month: date, data_dir: Path, out: Path) -> ExportResult:
    """Write the bundle for ``month`` to ``out`` (built beside it, swapped in whole). ``out`` must
    be absent, empty, or an earlier export: it is replaced as a whole, so it is never a MIRAI
    checkout or any other directory of the user's."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or _is_export(out))):
        raise ExportError(
            f"{out} exists and is not an earlier export (no {EXPORT_MANIFEST}); the export replaces its target "
            "as a whole, so give a new or empty directory and copy its data/ into your MIRAI checkout"
        )
    layout = DataLayout(data_dir)
    month = month.replace(day=1)
    queries, sample, _ = read_split(layout, month)
    with staged_directory(out) as staging:
        files, months = write_bundle(layout, month, queries, sample, staging)
        manifest = {
            "format": EXPORT_FORMAT,
            "month": f"{month:%Y-%m}",
            "database_months": months,
            "files": files,
            "not_included": dict.fromkeys(
                EMBEDDING_FILES,
                "made by MIRAI's dataset_construction/_encode_country_relation.py with a paid OpenAI key "
                "(docs/mirai.md, 'Embeddings')",
            ),
        }
        atomic_write_bytes(staging / EXPORT_MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode(), sweep=False)
        if out.exists() and _is_export(out) and _same_files(out, staging):
            shutil.rmtree(staging)  # a re-run with the same content changes nothing
        elif out.exists() and not any(out.iterdir()):
            out.rmdir()
    return ExportResult(out, f"{month:%Y-%m}", months, manifest["files"])


def _same_files(a: Path, b: Path) -> bool:
    return (a / EXPORT_MANIFEST).read_bytes() == (b / EXPORT_MANIFEST).read_bytes()


# --- import -------------------------------------------------------------------------------------


@contextmanager
def _field_limit(limit: int) -> Iterator[None]:
    # The csv module's field limit is process-wide; set it for the read and put it back.
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _read_tsv(path: Path, name: str, columns: tuple[str, ...], required: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line, {column: text}) for each row of a tab-separated file written the way pandas writes,
    refusing anything else with MiraiFormatError naming the file and line."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES[name]:
        raise MiraiFormatError(f"{name}: {size:,} bytes, more than the {MAX_FILE_BYTES[name]:,} allowed; refused")
    with path.open(newline="", encoding="utf-8", errors="strict") as fh, _field_limit(MAX_FIELD_CHARS):
        reader = csv.reader(fh, delimiter="\t", quotechar='"', strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise MiraiFormatError(f"{name}: empty file (no header line)")
            missing = [c for c in required if c not in header]
            if missing:
                raise MiraiFormatError(f"{name} line 1: no column {missing[0]!r} (header: {header[:12]})")
            if len(set(header)) != len(header):
                raise MiraiFormatError(f"{name} line 1: a column name appears twice")
            index = {c: header.index(c) for c in columns if c in header}
            for row in reader:
                if len(row) != len(header):
                    raise MiraiFormatError(
                        f"{name} line {reader.line_num}: {len(row)} fields, the header has {len(header)}"
                    )
                yield reader.line_num, {c: row[i] for c, i in index.items()}
        except csv.Error as exc:
            raise MiraiFormatError(f"{name} line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise MiraiFormatError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block)") from None


def _where(name: str, line: int) -> str:
    return f"{name} line {line}"


def _day(text: str, where: str, column: str) -> date:
    try:
        if len(text) != 10:
            raise ValueError
        return date.fromisoformat(text)
    except ValueError:
        raise MiraiFormatError(f"{where}: {column} {text[:40]!r} is not a date YYYY-MM-DD") from None


def _int(text: str, where: str, column: str) -> int:
    if not _INT.fullmatch(text):
        raise MiraiFormatError(f"{where}: {column} {text[:40]!r} is not a whole number")
    return int(text)


def _code(text: str, known: frozenset[str], where: str, column: str, what: str) -> str:
    if text not in known:
        raise MiraiFormatError(f"{where}: {column} {text[:40]!r} is not a {what} our reference tables know")
    return text


def _mirai_dir(source: Path) -> Path:
    for candidate in (source / "data" / "MIRAI", source):
        if (candidate / "data_kg.csv").is_file():
            return candidate
    raise MiraiFormatError(f"{source}: neither {source}/data/MIRAI/data_kg.csv nor {source}/data_kg.csv exists")


def _inside(source: Path, base: Path) -> None:
    """Every file read below is a regular file inside ``source`` once links are followed: the
    directory is handed over by anyone, and a link out of it would have the import read (and its
    refusal quote) a file from elsewhere on the machine. Refused before any file is opened."""
    for relative in (
        "data_kg.csv",
        "data_news.csv",
        "data_final.csv",
        "test/relation_query.csv",
        "test_subset/relation_query.csv",
    ):
        path = base / relative
        if relative == "data_final.csv" and not os.path.lexists(path):
            continue  # optional (MIRAI's step 6 output)
        problem = outside_or_not_regular(source, path)
        if problem is not None:
            raise MiraiFormatError(f"{problem}; refused")


def read_mirai(source: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(events, news, queries, sample) in our schemas from MIRAI's files under ``source`` (a
    directory holding data/MIRAI/, or data/MIRAI itself)."""
    base = _mirai_dir(Path(source))
    _inside(Path(source), base)
    for name in (NEWS_FILE, TEST_FILE, SUBSET_FILE):
        if not (base / name.removeprefix("data/MIRAI/")).is_file():
            raise MiraiFormatError(f"{name}: missing under {base}")
    news = _read_news(base / "data_news.csv")
    mentions = _read_mentions(base / "data_final.csv") if (base / "data_final.csv").is_file() else {}
    events = _read_kg(base / "data_kg.csv", news, mentions)
    queries = _read_queries(base / "test" / "relation_query.csv", TEST_FILE)
    sample = _read_queries(base / "test_subset" / "relation_query.csv", SUBSET_FILE)
    months = {q.replace(day=1) for q in queries.get_column("date")}
    if len(months) != 1:
        raise MiraiFormatError(f"{TEST_FILE}: queries span {len(months)} months; a split is one month")
    # The subset's QueryIds number its own rows (MIRAI step 9); in our split a sampled query keeps
    # the id it has in the full test, so it is found by its QueryCode there.
    ids = dict(zip(queries.get_column("query_code"), queries.get_column("query_id")))
    codes = sample.get_column("query_code").to_list()
    strangers = [c for c in codes if c not in ids]
    if strangers:
        raise MiraiFormatError(f"{SUBSET_FILE}: the query {strangers[0]} is not in {TEST_FILE}")
    # A sampled query must equal its row in the full test.
    full = queries.drop("query_id").join(sample.select("query_code"), on="query_code", how="semi")
    if full.sort("query_code").to_dicts() != sample.drop("query_id").sort("query_code").to_dicts():
        raise MiraiFormatError(f"{SUBSET_FILE}: a query's answers or counts differ from its row in {TEST_FILE}")
    sample = sample.with_columns(pl.col("query_code").replace_strict(ids, return_dtype=pl.String).alias("query_id"))
    return events, news, queries, sample.sort("query_id")


def _read_news(path: Path) -> pl.DataFrame:
    rows: dict[int, tuple] = {}
    seen_md5: set[str] = set()
    for line, r in _read_tsv(path, NEWS_FILE, NEWS_COLUMNS, ("Docid", "MD5", "Date", "Title", "Text")):
        where = _where(NEWS_FILE, line)
        docid = _int(r["Docid"], where, "Docid")
        if docid in rows:
            raise MiraiFormatError(f"{where}: Docid {docid} appears twice")
        md5 = r["MD5"]
        if not _MD5.fullmatch(md5):
            raise MiraiFormatError(f"{where}: MD5 {md5[:40]!r} is not 32 lowercase hex digits")
        if md5 in seen_md5:
            raise MiraiFormatError(f"{where}: MD5 {md5} appears twice")
        seen_md5.add(md5)
        day = _day(r["Date"], where, "Date")
        rows[docid] = (
            md5,
            day,
            restored_cell(r.get("URL") or None),
            restored_cell(r["Title"]),
            restored_cell(r["Text"]),
            restored_cell(r.get("Abstract") or None),
        )
    return pl.DataFrame(
        [(d, *v) for d, v in rows.items()],
        schema={"Docid": pl.Int64, **{k: NEWS_DB_SCHEMA[k] for k in NEWS_DB_SCHEMA.names()}},
        orient="row",
    )


def _read_mentions(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line, r in _read_tsv(path, FINAL_FILE, FINAL_COLUMNS, ("QuadEventCode", "NumDailyMentions")):
        if r["NumDailyMentions"] == "":
            continue
        value = _int(r["NumDailyMentions"], _where(FINAL_FILE, line), "NumDailyMentions")
        # MIRAI's data_final.csv has a row per GDELT event; every row of a quad carries its sum.
        out.setdefault(r["QuadEventCode"], value)
    return out


def _read_kg(path: Path, news: pl.DataFrame, mentions: dict[str, int]) -> pl.DataFrame:
    md5_of = dict(zip(news.get_column("Docid"), news.get_column("article_id")))
    countries, relations = iso3_codes(), level2_codes()
    quads: dict[tuple, set[int]] = {}
    for line, r in _read_tsv(path, KG_FILE, KG_COLUMNS, (*KG_COLUMNS[:4], "QuadEventCode", "Docid", "Docids")):
        where = _where(KG_FILE, line)
        day = _day(r["DateStr"], where, "DateStr")
        s = _code(r["Actor1CountryCode"], countries, where, "Actor1CountryCode", "country code")
        o = _code(r["Actor2CountryCode"], countries, where, "Actor2CountryCode", "country code")
        rel = _code(r["EventBaseCode"], relations, where, "EventBaseCode", "second-level CAMEO code")
        if r["QuadEventCode"] != quad_code(day, s, rel, o):
            raise MiraiFormatError(f"{where}: QuadEventCode {r['QuadEventCode'][:60]!r} does not match the row's quad")
        docid = _int(r["Docid"], where, "Docid")
        docids = r["Docids"]
        if len(docids) > 12 * MAX_DOCIDS or not _DOCIDS.fullmatch(docids):
            raise MiraiFormatError(f"{where}: Docids {docids[:40]!r} is not a list of whole numbers like [3, 17]")
        listed = {int(d) for d in docids[1:-1].split(", ")}
        if docid not in listed:
            raise MiraiFormatError(f"{where}: Docid {docid} is not in its Docids {docids[:40]}")
        for d in listed | {docid}:
            if d not in md5_of:
                raise MiraiFormatError(f"{where}: Docid {d} is not in {NEWS_FILE}")
        quad = quads.setdefault((day, s, rel, o), set())
        quad.update(listed)
        if len(quad) > MAX_DOCIDS:
            raise MiraiFormatError(f"{where}: the quad has more than {MAX_DOCIDS:,} articles")
    names = dict(country_names().iter_rows())
    rel_names = dict(relation_table().select("code", "name").iter_rows())
    rows = [
        (
            day,
            s,
            rel,
            o,
            rel[:2],
            names[s],
            names[o],
            rel_names[rel],
            mentions.get(quad_code(day, s, rel, o)),
            len(ids),
            sorted({md5_of[d] for d in ids}),
        )
        for (day, s, rel, o), ids in quads.items()
    ]
    return pl.DataFrame(rows, schema=EVENT_DB_SCHEMA, orient="row").sort("date", "s", "r", "o")


def _read_queries(path: Path, name: str) -> pl.DataFrame:
    required = ("QueryId", "DateStr", "Actor1CountryCode", "Actor2CountryCode", "QueryCode", "AnswerList", "AnswerDict")
    countries = iso3_codes()
    rows, seen_ids, seen_codes = [], set(), set()
    for line, r in _read_tsv(path, name, QUERY_COLUMNS, required):
        where = _where(name, line)
        qid = _int(r["QueryId"], where, "QueryId")
        if qid in seen_ids:
            raise MiraiFormatError(f"{where}: QueryId {qid} appears twice")
        seen_ids.add(qid)
        day = _day(r["DateStr"], where, "DateStr")
        s = _code(r["Actor1CountryCode"], countries, where, "Actor1CountryCode", "country code")
        o = _code(r["Actor2CountryCode"], countries, where, "Actor2CountryCode", "country code")
        code = query_code(day, s, o)
        if r["QueryCode"] != code:
            raise MiraiFormatError(f"{where}: QueryCode {r['QueryCode'][:60]!r} is not {code}")
        if code in seen_codes:
            raise MiraiFormatError(f"{where}: the query {code} appears twice")
        seen_codes.add(code)
        answers = _answers(r["AnswerList"], r["AnswerDict"], where)
        counts = [
            _int(r[c], where, c) if r.get(c) else None for c in ("NumDailyMentions", "news_count", "min_news_count")
        ]
        rows.append(
            {
                "query_id": qid,
                "date": day,
                "s": s,
                "o": o,
                "s_name": r.get("Actor1CountryName") or None,
                "o_name": r.get("Actor2CountryName") or None,
                "s_region": r.get("Actor1Region") or None,
                "o_region": r.get("Actor2Region") or None,
                "query_code": code,
                "answer_list": answers,
                "answer_level1": sorted({a[:2] for a in answers}),
                "answer_dict": json.dumps(
                    {k: [a for a in answers if a[:2] == k] for k in sorted({a[:2] for a in answers})}, sort_keys=True
                ),
                "daily_mentions": counts[0],
                "n_articles": counts[1],
                "min_articles": counts[2],
            }
        )
    if not rows:
        raise MiraiFormatError(f"{name}: no queries")
    frame = pl.DataFrame(rows, schema={**QUERIES_SCHEMA, "query_id": pl.Int64}).sort("query_id")
    month = frame.get_column("date").min()
    return frame.with_columns(
        pl.format("{}-{}", pl.lit(f"{month:%Y-%m}"), pl.col("query_id").cast(pl.String).str.zfill(5)).alias("query_id")
    ).match_to_schema(QUERIES_SCHEMA)


def _answers(answer_list: str, answer_dict: str, where: str) -> list[str]:
    """The answer codes, once AnswerList and AnswerDict are the Python literals MIRAI writes and
    agree (parsed by pattern, never evaluated: the files are untrusted)."""
    if len(answer_list) > MAX_ANSWER_CHARS or not _ANSWER_LIST.fullmatch(answer_list):
        raise MiraiFormatError(f"{where}: AnswerList {answer_list[:40]!r} is not a list like ['042', '043']")
    if len(answer_dict) > MAX_ANSWER_CHARS or not _ANSWER_DICT.fullmatch(answer_dict):
        raise MiraiFormatError(f"{where}: AnswerDict {answer_dict[:40]!r} is not a dict like {{'04': ['042']}}")
    listed = re.findall(r"'([0-9]{3})'", answer_list)
    grouped: dict[str, list[str]] = {}
    for key, values in re.findall(r"'([0-9]{2})': \[([^\]]*)\]", answer_dict):
        if key in grouped:
            raise MiraiFormatError(f"{where}: AnswerDict has the key {key!r} twice")
        grouped[key] = re.findall(r"'([0-9]{3})'", values)
    in_dict = [code for codes in grouped.values() for code in codes]
    if not listed:
        raise MiraiFormatError(f"{where}: AnswerList is empty")
    if sorted(set(listed)) != sorted(in_dict) or len(set(listed)) != len(listed):
        raise MiraiFormatError(f"{where}: AnswerList {answer_list[:60]} and AnswerDict {answer_dict[:60]} disagree")
    unknown = [c for c in listed if c not in level2_codes()]
    if unknown:
        raise MiraiFormatError(f"{where}: answer {unknown[0]!r} is not a second-level CAMEO code we know")
    if any(code[:2] != key for key, codes in grouped.items() for code in codes):
        raise MiraiFormatError(f"{where}: AnswerDict files a code under another first-level key")
    return sorted(listed)


def _months(first: date, last: date) -> list[date]:
    out, m = [], first.replace(day=1)
    while m <= last:
        out.append(m)
        m = (m + timedelta(days=32)).replace(day=1)
    return out


def import_mirai(source: Path, data_dir: Path, *, distance_days: int = 1) -> ImportResult:
    """Read MIRAI's files under ``source`` and write them as a data directory of ours at
    ``data_dir``: the database months from the first event to the split month, and the split.
    Everything is read and checked first; the directory is then built beside the target and
    swapped in whole. ``data_dir`` must be absent, empty, or an earlier import."""
    data_dir = Path(data_dir)
    marker = data_dir / IMPORT_MANIFEST
    if data_dir.exists() and any(data_dir.iterdir()) and not marker.is_file():
        raise ExportError(
            f"{data_dir} is not empty and holds no {IMPORT_MANIFEST}: an import gets a data directory of its own "
            "(it replaces that directory as a whole)"
        )
    events, news, queries, sample = read_mirai(Path(source))
    month = queries.get_column("date").min().replace(day=1)
    dates = [d for d in (events.get_column("date").min(), news.get_column("date").min()) if d is not None]
    first = min([*dates, month])
    end = month + timedelta(days=len(month_days(month)))
    for name, frame in ((KG_FILE, events), (NEWS_FILE, news)):
        if frame.filter(pl.col("date") >= end).height:
            raise MiraiFormatError(f"{name}: rows dated after the split month {month:%Y-%m}; refused")
    months = _months(first, month)
    with staged_directory(data_dir) as staging:
        layout = DataLayout(staging)
        meta = {"database_version": DATABASE_VERSION, "source": "mirai-import"}
        for m in months:
            end = m + timedelta(days=len(month_days(m)))
            in_month = (pl.col("date") >= m) & (pl.col("date") < end)
            month_news = news.filter(in_month).drop("Docid").sort("date", "article_id")
            write_sealed_parquet(
                layout, events.filter(in_month), layout.database_path("events", m), {**meta, "month": f"{m:%Y-%m}"}
            )
            write_sealed_parquet(layout, month_news, layout.database_path("news", m), {**meta, "month": f"{m:%Y-%m}"})
        split_dir = layout.split_dir(month)
        split_dir.mkdir(parents=True)
        split_meta = {"split_version": SPLIT_VERSION, "month": f"{month:%Y-%m}"}
        atomic_write_parquet(queries, split_dir / "queries.parquet", metadata=split_meta)
        atomic_write_parquet(sample, split_dir / "queries_sample.parquet", metadata=split_meta)
        files = {
            name: {
                "sha256": _sha256((split_dir / name).read_bytes()),
                "bytes": (split_dir / name).stat().st_size,
                "rows": rows,
            }
            for name, rows in (("queries.parquet", queries.height), ("queries_sample.parquet", sample.height))
        }
        manifest = {
            "month": f"{month:%Y-%m}",
            "dataset_version": f"{month:%Y-%m}",
            "source": "imported from MIRAI's file layout (mirai import mirai)",
            "split_version": SPLIT_VERSION,
            "history_cutoff": (month - timedelta(days=1)).isoformat(),
            "distance_days": distance_days,
            "counts": {"queries": queries.height, "sample": sample.height, "database_events": events.height},
            "deviations": [
                "Imported: queries, answers and the sample are MIRAI's files as given, not rebuilt here.",
            ],
            "files": files,
        }
        atomic_write_bytes(
            split_dir / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        )
        record = {
            "format": IMPORT_FORMAT,
            "month": f"{month:%Y-%m}",
            "database_months": [f"{m:%Y-%m}" for m in months],
            "counts": {
                "events": events.height,
                "news": news.height,
                "queries": queries.height,
                "sample": sample.height,
            },
            "daily_mentions": "from data_final.csv"
            if events.get_column("daily_mentions").null_count() == 0
            else "absent",
        }
        atomic_write_bytes(staging / IMPORT_MANIFEST, (json.dumps(record, indent=2) + "\n").encode())
        if data_dir.exists() and not any(data_dir.iterdir()):
            data_dir.rmdir()
    return ImportResult(
        data_dir, f"{month:%Y-%m}", record["database_months"], events.height, news.height, queries.height, sample.height
    )
