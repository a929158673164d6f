"""Import MIRAI's published dataset into our database and split format (the layout itself:
pipeline/splits/mirai_files.py).

Import treats the files as untrusted: each file and each field is bounded, every row is checked,
a problem is one line naming the file and line, and the data directory appears whole or not at all.
"""

from __future__ import annotations

import csv
import json
import os
import re
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from pipeline.reference import country_names, iso3_codes, level2_codes, relation_table
from pipeline.splits.database import DATABASE_VERSION, EVENT_DB_SCHEMA, NEWS_DB_SCHEMA, month_days
from pipeline.splits.mirai_files import (
    FINAL_COLUMNS,
    FINAL_FILE,
    IMPORT_FORMAT,
    IMPORT_MANIFEST,
    KG_COLUMNS,
    KG_FILE,
    MAX_ANSWER_CHARS,
    MAX_DOCIDS,
    MAX_FIELD_CHARS,
    MAX_FILE_BYTES,
    MAX_QUERIES,
    NEWS_COLUMNS,
    NEWS_FILE,
    QUERY_COLUMNS,
    SUBSET_FILE,
    TEST_FILE,
    ExportError,
    MiraiFormatError,
    quad_code,
    query_code,
    restored_cell,
    sha256_hex,
)
from pipeline.splits.schema import QUERIES_SCHEMA, SPLIT_VERSION
from pipeline.storage import (
    DataLayout,
    atomic_write_bytes,
    atomic_write_parquet,
    outside_or_not_regular,
    staged_directory,
    write_sealed_parquet,
)

_MD5 = re.compile(r"[0-9a-f]{32}")
_DOCIDS = re.compile(r"\[(?:0|[1-9][0-9]{0,9})(?:, (?:0|[1-9][0-9]{0,9}))*\]")
_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_ANSWER_LIST = re.compile(r"\[(?:'[0-9]{3}'(?:, '[0-9]{3}')*)?\]")
_ANSWER_DICT = re.compile(r"\{(?:'[0-9]{2}': \[(?:'[0-9]{3}'(?:, '[0-9]{3}')*)\](?:, |(?=\})))*\}")


@dataclass(frozen=True)
class ImportResult:
    data_dir: Path
    month: str
    database_months: list[str]
    events: int
    news: int
    queries: int
    sample: int


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
    # quad -> [its rows, its distinct Docids (sorted, 8 bytes each), the line of its first row]. As
    # Python ints in sets the Docids took ~190 bytes each, 27 times their text: 150 rows of 100,000
    # Docids (103 MB, within the 8 GiB cap) took 3 GB, and the cap allowed 80 times more.
    quads: dict[tuple, list] = {}
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
        quad = quads.setdefault((day, s, rel, o), [0, array("q"), line])
        quad[0] += 1
        if not listed.issubset(quad[1]):
            merged = listed.union(quad[1])
            if len(merged) > MAX_DOCIDS:
                raise MiraiFormatError(f"{where}: the quad has more than {MAX_DOCIDS:,} articles")
            quad[1] = array("q", sorted(merged))
    # MIRAI's step 6 keeps one row per (quad, Docid) (drop_duplicates), and an export writes one
    # row per event and article: a quad never lists more articles than it has rows. Checked before
    # any article id is looked up, the step that costs ~50 bytes an article.
    for (day, s, rel, o), (count, ids, line) in quads.items():
        if len(ids) > count:
            raise MiraiFormatError(
                f"{_where(KG_FILE, line)}: the event {quad_code(day, s, rel, o)} lists {len(ids):,} articles in "
                f"its Docids but has {count:,} row(s); MIRAI's data_kg.csv has one row per event and article"
            )
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
        for (day, s, rel, o), (_, ids, _) in quads.items()
    ]
    return pl.DataFrame(rows, schema=EVENT_DB_SCHEMA, orient="row").sort("date", "s", "r", "o")


def _read_queries(path: Path, name: str) -> pl.DataFrame:
    required = ("QueryId", "DateStr", "Actor1CountryCode", "Actor2CountryCode", "QueryCode", "AnswerList", "AnswerDict")
    countries = iso3_codes()
    rows, seen_ids, seen_codes = [], set(), set()
    for line, r in _read_tsv(path, name, QUERY_COLUMNS, required):
        where = _where(name, line)
        if len(rows) >= MAX_QUERIES:
            raise MiraiFormatError(f"{where}: more than {MAX_QUERIES:,} queries, more than a split may hold; refused")
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


def _write_split(
    layout: DataLayout,
    month: date,
    queries: pl.DataFrame,
    sample: pl.DataFrame,
    database_events: int,
    distance_days: int,
) -> None:
    """The imported split's directory: its two query files and a manifest like build_split's
    (out of import_mirai to keep it under ~80 lines; called inside its staging directory)."""
    split_dir = layout.split_dir(month)
    split_dir.mkdir(parents=True)
    split_meta = {"split_version": SPLIT_VERSION, "month": f"{month:%Y-%m}"}
    atomic_write_parquet(queries, split_dir / "queries.parquet", metadata=split_meta)
    atomic_write_parquet(sample, split_dir / "queries_sample.parquet", metadata=split_meta)
    files = {
        name: {
            "sha256": sha256_hex((split_dir / name).read_bytes()),
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
        "counts": {"queries": queries.height, "sample": sample.height, "database_events": database_events},
        "deviations": [
            "Imported: queries, answers and the sample are MIRAI's files as given, not rebuilt here.",
        ],
        "files": files,
    }
    atomic_write_bytes(split_dir / "manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


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
        _write_split(layout, month, queries, sample, events.height, distance_days)
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
