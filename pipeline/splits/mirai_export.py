"""Export a month's database and split as the files MIRAI's scripts read (the layout itself:
pipeline/splits/mirai_files.py).

Export writes a directory that holds ``data/`` (copy it into a MIRAI checkout) plus
``mirai-export.json``; it is built in a temp directory beside the target and swapped in whole.
build_split calls write_bundle so that every split directory, and so every release, carries them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import polars as pl

from pipeline.reference.tables import COUNTRY_NAME_SOURCES, COUNTRY_NAMES_VERSION, country_alternate_names
from pipeline.splits.mirai_files import (
    BUNDLE_FILES,
    COUNTRIES_FILE,
    COUNTRY_TXT_FILE,
    EMBEDDING_FILES,
    EXPORT_FORMAT,
    EXPORT_MANIFEST,
    FINAL_COLUMNS,
    FINAL_FILE,
    KG_COLUMNS,
    KG_FILE,
    NEWS_COLUMNS,
    NEWS_FILE,
    QUERY_COLUMNS,
    RELATION_TXT_FILE,
    RELATIONS_FILE,
    SUBSET_FILE,
    TEST_FILE,
    ExportError,
    answer_dict_repr,
    date_nlp,
    inert_cell,
    quad_code,
    relation_dictionary,
    sha256_hex,
)
from pipeline.storage import DataLayout, atomic_write_bytes, staged_directory, verified


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    month: str
    database_months: list[str]
    files: dict[str, dict]


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
        if sha256_hex(data) != manifest["files"][name]["sha256"]:
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
    relations, countries = relation_dictionary(), country_alternate_names()
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
            # dict_iso2alternames_GeoNames.json's table and the sources it was built from (docs/mirai.md).
            "country_names": COUNTRY_NAMES_VERSION,
            "country_name_sources": COUNTRY_NAME_SOURCES,
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
