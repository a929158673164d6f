"""MIRAI's file layout (pipeline/splits/mirai_files.py): the export holds MIRAI's files and columns, export →
import is a round trip, and hostile imported files are refused in one line with nothing written."""

from __future__ import annotations

import ast
import csv
import json
import random
import shutil
import unicodedata
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from pipeline.agent_api.lookup import map_cameo_to_relation, map_iso_to_country_name
from pipeline.reference import COUNTRY_NAME_SOURCES, COUNTRY_NAMES_VERSION, level1_codes, level2_codes
from pipeline.release.download import download_release
from pipeline.release.layout import MIRAI_BUNDLE_DIR, MIRAI_BUNDLE_FILES, name_problem
from pipeline.release.publish import publish_release
from pipeline.release.store_uri import open_store
from pipeline.splits import mirai_files
from pipeline.splits.mirai_export import export_mirai
from pipeline.splits.mirai_files import (
    BUNDLE_FILES,
    EXPORT_MANIFEST,
    KG_COLUMNS,
    NEWS_COLUMNS,
    QUERY_COLUMNS,
    ExportError,
    MiraiFormatError,
)
from pipeline.splits.mirai_import import import_mirai
from pipeline.splits.split import Override, build_split
from pipeline.storage import DataLayout, write_sealed_parquet
from testbed.database import generate_event_database

from .settings_builder import make_settings
from .test_cli import run

MONTH = date(2024, 1, 1)
NOW = datetime(2024, 3, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Three generated database months and January's split (forced: no slot ledgers here)."""
    root = tmp_path_factory.mktemp("mirai-files") / "data"
    generate_event_database(root, date(2023, 11, 1), 3, seed=5, quads_per_day=10)
    settings = make_settings(data_dir=root, split_sample_size=20)
    build_split(MONTH, settings.dataset, settings.gdelt, now=NOW, override=Override("t", "test", NOW))
    return root


@pytest.fixture(scope="module")
def exported(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "mirai"
    export_mirai(MONTH, data_dir, out)
    return out


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def test_the_export_holds_miraiS_files_columns_and_id_scheme(exported, data_dir):
    assert sorted(str(p.relative_to(exported)) for p in exported.rglob("*") if p.is_file()) == sorted(
        [*BUNDLE_FILES, EXPORT_MANIFEST]
    )
    kg, news = _rows(exported / "data/MIRAI/data_kg.csv"), _rows(exported / "data/MIRAI/data_news.csv")
    assert tuple(kg[0]) == KG_COLUMNS and tuple(news[0]) == NEWS_COLUMNS
    assert [int(n["Docid"]) for n in news] == list(range(len(news)))
    events = pl.concat([pl.read_parquet(p) for p in sorted((data_dir / "database/events").glob("*.parquet"))])
    assert len(kg) == events.get_column("n_articles").sum()  # one row per (event, article), as MIRAI's step 6
    by_docid = {n["Docid"]: n for n in news}
    for row in kg[:200]:
        docids = ast.literal_eval(row["Docids"])
        assert int(row["Docid"]) in docids and docids == sorted(docids)
        assert row["QuadEventCode"] == ", ".join(
            [row["DateStr"], row["Actor1CountryCode"], row["EventBaseCode"], row["Actor2CountryCode"]]
        )
        assert row["QuadEventName"] == ", ".join(
            [row["DateStr"], row["Actor1CountryName"], row["RelName"], row["Actor2CountryName"]]
        )
        assert by_docid[row["Docid"]]["Date"] <= row["DateStr"]
    queries = pl.read_parquet(data_dir / "splits/2024-01/queries.parquet")
    for name, expected in (
        ("test", queries),
        ("test_subset", pl.read_parquet(data_dir / "splits/2024-01/queries_sample.parquet")),
    ):
        rows = _rows(exported / f"data/MIRAI/{name}/relation_query.csv")
        assert tuple(rows[0]) == QUERY_COLUMNS and [r["QueryId"] for r in rows] == [
            str(i) for i in range(1, len(rows) + 1)
        ]
        assert [r["QueryCode"] for r in rows] == expected.get_column("query_code").to_list()
        for row, q in zip(rows, expected.iter_rows(named=True)):
            assert ast.literal_eval(row["AnswerList"]) == list(q["answer_list"])
            assert ast.literal_eval(row["AnswerDict"]) == json.loads(q["answer_dict"])
            assert row["DateNLP"] == q["date"].strftime("%B %d, %Y")  # "January 03, 2024", as MIRAI's step 9
    relations = json.loads((exported / "data/info/dict_code2relation.json").read_text())
    assert list(relations) == sorted(level1_codes() | level2_codes())
    for code, info in relations.items():  # the environment's own names and descriptions, not copies
        relation = map_cameo_to_relation(code)
        assert info == {"Name": relation.name, "Description": relation.description}
    countries = json.loads((exported / "data/info/dict_iso2alternames_GeoNames.json").read_text())
    assert len(countries) == 250 and all(names[0] == map_iso_to_country_name(iso) for iso, names in countries.items())
    owners = [name for names in countries.values() for name in names]
    assert len(owners) == len(set(owners))  # MIRAI's name→code map keeps one code per name
    # The display name stays first; CLDR's English name (through babel) follows it.
    assert countries["RUS"][0] == "Russian Federation" and "Russia" in countries["RUS"]
    assert "Vatican City" in countries["VAT"] and "Myanmar (Burma)" in countries["MMR"]
    assert (
        "Turkey" in countries["TUR"] and "Ivory Coast" in countries["CIV"] and "UK" in countries["GBR"]
    )  # countryinfo
    metadata = json.loads((exported / EXPORT_MANIFEST).read_text())
    assert metadata["country_names"] == COUNTRY_NAMES_VERSION
    assert metadata["country_name_sources"] == COUNTRY_NAME_SOURCES
    assert set(metadata["country_name_sources"]) == {"pycountry", "babel", "cldr", "countryinfo"}


def test_export_then_import_is_a_round_trip(exported, data_dir, tmp_path):
    result = import_mirai(exported, tmp_path / "imported")
    assert result.database_months == ["2023-11", "2023-12", "2024-01"]
    for table, key in (("events", ["date", "s", "r", "o"]), ("news", ["date", "article_id"])):
        for month in result.database_months:
            name = f"database/{table}/month={month}.parquet"
            original, back = pl.read_parquet(data_dir / name), pl.read_parquet(tmp_path / "imported" / name)
            assert back.equals(original.sort(key)), name
    for name in ("queries.parquet", "queries_sample.parquet"):
        original = pl.read_parquet(data_dir / "splits/2024-01" / name)
        assert pl.read_parquet(tmp_path / "imported/splits/2024-01" / name).equals(original), name
    # The imported directory is one our environment opens.
    from pipeline.agent_api import EventDatabase

    with EventDatabase(tmp_path / "imported").environment(date(2024, 1, 10)) as env:
        assert env.count_events() > 0


def test_export_is_idempotent_and_never_replaces_a_directory_it_did_not_write(exported, data_dir, tmp_path):
    before = {p: p.read_bytes() for p in exported.rglob("*") if p.is_file()}
    export_mirai(MONTH, data_dir, exported)
    assert {p: p.read_bytes() for p in exported.rglob("*") if p.is_file()} == before
    checkout = tmp_path / "MIRAI"
    (checkout / "APIs").mkdir(parents=True)
    (checkout / "APIs" / "api_implementation.py").write_text("# the user's own file\n")
    with pytest.raises(ExportError, match="not an earlier export"):
        export_mirai(MONTH, data_dir, checkout)
    assert (checkout / "APIs" / "api_implementation.py").read_text() == "# the user's own file\n"
    assert [p.name for p in tmp_path.iterdir()] == ["MIRAI"]  # no staging directory left behind


def _hostile(exported: Path, tmp_path: Path, name: str, edit) -> Path:
    source = tmp_path / "hostile"
    shutil.copytree(exported, source)
    path = source / name
    path.write_bytes(edit(path.read_bytes()))
    return source


def _replace_field(column: str, value: str, line: int = 2):
    def edit(data: bytes) -> bytes:
        rows = data.decode().split("\n")
        header = rows[0].split("\t")
        fields = rows[line - 1].split("\t")
        fields[header.index(column)] = value
        rows[line - 1] = "\t".join(fields)
        return "\n".join(rows).encode()

    return edit


ATTACKS = [
    ("data/MIRAI/data_kg.csv", _replace_field("Docids", "__import__('os').system('touch /tmp/pwned')"), "Docids"),
    ("data/MIRAI/data_kg.csv", _replace_field("Actor1CountryCode", "ZZZ"), "Actor1CountryCode 'ZZZ'"),
    ("data/MIRAI/data_kg.csv", _replace_field("QuadEventCode", "2024-01-01, USA, 010, CHN"), "QuadEventCode"),
    ("data/MIRAI/data_kg.csv", _replace_field("Docids", "[99999999]"), "Docid"),
    ("data/MIRAI/data_kg.csv", lambda d: d.replace(b"\t", b'\t"', 1), "data_kg.csv line"),
    ("data/MIRAI/data_news.csv", _replace_field("MD5", "../../etc/passwd"), "MD5"),
    ("data/MIRAI/data_news.csv", lambda d: d + b"\xff\xfe\n", "not UTF-8"),
    ("data/MIRAI/data_news.csv", _replace_field("Text", "x" * (mirai_files.MAX_FIELD_CHARS + 1)), "data_news.csv line"),
    (
        "data/MIRAI/test/relation_query.csv",
        _replace_field("AnswerDict", "{'04': [__import__('os').getcwd()]}"),
        "AnswerDict",
    ),
    ("data/MIRAI/test/relation_query.csv", _replace_field("AnswerList", "['999']"), "AnswerList"),
    ("data/MIRAI/test/relation_query.csv", _replace_field("QueryCode", "(2024-01-01, USA, ?, CHN)"), "QueryCode"),
    ("data/MIRAI/test/relation_query.csv", lambda d: d.replace(b"QueryId", b"Qid", 1), "no column 'QueryId'"),
    ("data/MIRAI/test_subset/relation_query.csv", _replace_field("DateStr", "2024-02-30"), "DateStr"),
]


@pytest.fixture(scope="module")
def good_import(exported, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("good") / "imported"
    import_mirai(exported, target)
    return target


@pytest.mark.parametrize(
    ("name", "edit", "message"), ATTACKS, ids=[f"{a[0].rsplit('/', 2)[-2]}:{a[2]}" for a in ATTACKS]
)
def test_a_hostile_file_is_refused_in_one_line_and_nothing_is_written(
    exported, good_import, tmp_path, name, edit, message
):
    previous = tmp_path / "imported"
    shutil.copytree(good_import, previous)  # an earlier, good import stays as it was
    snapshot = {p: p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    source = _hostile(exported, tmp_path, name, edit)
    with pytest.raises(MiraiFormatError) as refused:
        import_mirai(source, previous)
    text = str(refused.value)
    assert message in text and name.rsplit("/", 1)[-1] in text and "\n" not in text
    assert {p: p.read_bytes() for p in previous.rglob("*") if p.is_file()} == snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile", "imported"]
    assert not Path("/tmp/pwned").exists()


def test_an_oversized_file_is_refused_before_it_is_read(exported, tmp_path, monkeypatch):
    monkeypatch.setitem(mirai_files.MAX_FILE_BYTES, mirai_files.KG_FILE, 1000)
    with pytest.raises(MiraiFormatError, match=r"data_kg.csv: [0-9,]+ bytes, more than the 1,000 allowed"):
        import_mirai(exported, tmp_path / "imported")
    assert not (tmp_path / "imported").exists()


def test_import_refuses_a_data_directory_it_did_not_write(exported, tmp_path):
    ours = tmp_path / "data"
    (ours / "database").mkdir(parents=True)
    with pytest.raises(ExportError, match=r"holds no mirai-import\.json"):
        import_mirai(exported, ours)
    assert [p.name for p in ours.iterdir()] == ["database"]


def test_the_commands_export_and_import(data_dir, tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.setenv("MIRAI_DATA_DIR", str(data_dir))
    assert main(["export", "mirai", "--month", "2024-01", "--out", str(tmp_path / "bundle")]) == 0
    assert "copy its data/ into a MIRAI checkout" in capsys.readouterr().out
    assert main(["import", "mirai", str(tmp_path / "bundle"), "--data", str(tmp_path / "imported")]) == 0
    assert f"MIRAI_DATA_DIR={tmp_path / 'imported'}" in capsys.readouterr().out
    assert main(["export", "mirai", "--month", "2023-12", "--out", str(tmp_path / "x")]) == 1
    assert "mirai export mirai: error: 2023-12: no test split" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    # As a user runs it: a bad file is one line on stderr, and the default target is not created.
    (tmp_path / "bundle/data/MIRAI/data_kg.csv").write_text("DateStr\n2024-01-01\n")
    bad = run("import", "mirai", str(tmp_path / "bundle"), env={"MIRAI_DATA_DIR": str(tmp_path / "d")})
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "mirai import mirai: error: data/MIRAI/data_kg.csv line 1: no column" in bad.stderr
    assert not (tmp_path / "d").exists()


def test_the_bundle_names_are_the_release_layout_s(data_dir):
    assert {f"{MIRAI_BUNDLE_DIR}/{name}" for name in BUNDLE_FILES} == MIRAI_BUNDLE_FILES
    for name in MIRAI_BUNDLE_FILES:
        assert name_problem("2024-01", name) is None
    for name in ("mirai/data/MIRAI/evil.csv", "mirai/data/info/country_embeddings.npy", "mirai/../README.md"):
        assert name_problem("2024-01", name) is not None


def test_a_release_carries_the_bundle_and_mirai_download_accepts_it(data_dir, exported, tmp_path):
    """build_split stores MIRAI's files in the split directory; the release publishes them with the
    rest and `mirai download` verifies and writes them (also alone, with --only mirai)."""
    split = data_dir / "splits/2024-01"
    for name in BUNDLE_FILES:  # the same bytes as `mirai export mirai` writes
        assert (split / MIRAI_BUNDLE_DIR / name).read_bytes() == (exported / name).read_bytes(), name
    settings = make_settings(data_dir=data_dir, release_uri=str(tmp_path / "bucket"))
    publish_release(
        MONTH, settings.dataset, settings.release, open_store(settings.dataset, settings.network, settings.release)
    )
    manifest = json.loads((tmp_path / "bucket/releases/2024-01/manifest.json").read_text())
    assert MIRAI_BUNDLE_FILES <= set(manifest["files"])
    result = download_release(
        open_store(settings.dataset, settings.network, settings.release),
        "2024-01",
        tmp_path / "dl",
        only="mirai",
        bar=False,
    )
    assert set(result.downloaded) == MIRAI_BUNDLE_FILES
    for name in BUNDLE_FILES:
        assert (tmp_path / "dl/2024-01/mirai" / name).read_bytes() == (exported / name).read_bytes(), name
    # What a user does next: import the downloaded files into a data directory of ours.
    back = import_mirai(tmp_path / "dl/2024-01/mirai", tmp_path / "imported")
    assert (back.queries, back.sample) == (
        pl.read_parquet(split / "queries.parquet").height,
        pl.read_parquet(split / "queries_sample.parquet").height,
    )


def test_miraiS_own_quirks_are_read_a_repeated_docid_and_no_data_final(exported, tmp_path):
    """MIRAI's published files differ from an export in two ways the import accepts: its Docids
    lists may repeat an article (step 6 appends one per GDELT event), and data_final.csv (the only
    file with daily mentions) need not be there."""
    source = tmp_path / "mirai"
    shutil.copytree(exported, source)
    (source / "data/MIRAI/data_final.csv").unlink()
    kg = source / "data/MIRAI/data_kg.csv"
    rows = kg.read_text().split("\n")
    header, first = rows[0].split("\t"), rows[1].split("\t")
    docid = first[header.index("Docid")]
    first[header.index("Docids")] = (
        f"[{docid}, {docid}]"
        if first[header.index("Docids")] == f"[{docid}]"
        else first[header.index("Docids")].replace("]", f", {docid}]")
    )
    rows[1] = "\t".join(first)
    kg.write_text("\n".join(rows))
    result = import_mirai(source, tmp_path / "imported")
    events = pl.read_parquet(tmp_path / "imported/database/events/*.parquet")
    assert events.height == result.events and events.get_column("daily_mentions").null_count() == events.height
    assert events.get_column("n_articles").to_list() == events.get_column("article_ids").list.len().to_list()
    assert json.loads((tmp_path / "imported/mirai-import.json").read_text())["daily_mentions"] == "absent"


@pytest.mark.parametrize(
    "link", ["data/MIRAI/data_news.csv", "data/MIRAI/test/relation_query.csv", "data/MIRAI/data_final.csv", "data"]
)
def test_a_link_out_of_the_handed_over_directory_is_refused_without_reading_it(exported, tmp_path, link):
    """Issue 30: `mirai import mirai` followed a link out of its directory and quoted the target's
    first line in its refusal. A file (or a folder on the way to one) that resolves outside the
    directory is refused before anything is opened, and nothing of the target is shown."""
    secret = tmp_path / "elsewhere"
    shutil.copytree(exported / "data", secret / "data")
    (secret / "data" / "MIRAI" / "data_news.csv").write_text("SECRET-FIRST-LINE\tx\n")
    source = tmp_path / "handed-over"
    shutil.copytree(exported, source)
    path = source / link
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(secret / link)
    with pytest.raises(MiraiFormatError, match=r"leads outside .*; refused") as refused:
        import_mirai(source, tmp_path / "imported")
    assert "SECRET" not in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "imported").exists()


HOSTILE_CELLS = [
    '=HYPERLINK("http://127.0.0.1:9/?"&A1,"click")',
    "+cmd|' /C calc'!A0",
    "@SUM(1+1)",
    "-2+3",
    "'=x",
    "\tx",
    ' =HYPERLINK("http://127.0.0.1:9/","x")',  # a spreadsheet may trim the space
    "\u200b\u202e=1+1",  # or invisible characters
    '＝HYPERLINK("http://127.0.0.1:9/")',  # or fold the full-width form
    "' ＠SUM(1)",
    "\x00=1+1",  # a NUL first (ASVS 5.0, 1.2.10)
]


def runs_as_formula(cell: str) -> bool:
    """Whether a lenient spreadsheet may run ``cell`` (OWASP, "CSV Injection"; ASVS 5.0, 1.2.10): a
    leading apostrophe makes it text; a leading control character (tab, CR, NUL) is unsafe; else
    leading spaces and invisible characters are trimmed and compatibility forms folded (NFKC, so
    ＝ is =) before =, +, -, @ is looked for."""
    if cell.startswith("'"):
        return False
    if cell[:1] and unicodedata.category(cell[0]) == "Cc":
        return True
    for ch in unicodedata.normalize("NFKC", cell):
        if not (ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")):
            return ch in "=+-@"
    return False


_APOSTROPHES = ("", "'", "''")
_LEADS = ("", " ", "  ", "\u00a0", "\u3000", "\t", "\r", "\n", "\x00", "\x01", "\x1b", "\x7f", "\x85")
_LEADS += ("\u200b", "\u200d", "\u202e", "\u2066", "\u061c", "\ufeff", "\u00ad", " \u200b\t ", " '")
_TRIGGERS = ("=", "+", "-", "@", "＝", "＋", "－", "＠", "﹦", "﹫", "⁼", "₊", "'", "a", "1", "中", "ت", "")
_TAILS = ("", 'HYPERLINK("http://127.0.0.1:9/?"&A1,"x")', "cmd|' /C calc'!A0", " ")


def formula_attacks() -> list[str]:
    """Every apostrophe prefix × leading junk × first character × rest, then random strings over
    the same pieces (seeded): the attacks of the re-attack and the harmless look-alikes."""
    cells = [a + lead + t + tail for a in _APOSTROPHES for lead in _LEADS for t in _TRIGGERS for tail in _TAILS]
    pieces = [*_APOSTROPHES, *_LEADS, *_TRIGGERS, *_TAILS, "x", "="]
    rng = random.Random(30)
    cells += ["".join(rng.choices(pieces, k=rng.randint(1, 6))) for _ in range(5000)]
    return cells


def test_inert_cell_leaves_no_cell_a_spreadsheet_may_run_and_touches_only_those():
    """Re-attack of issue 30: " =HYPERLINK(...)", "＝..." and "\\x00=..." were written as they are.
    Every cell a lenient spreadsheet may run now starts with an apostrophe; any other cell is
    written as it is unless it starts with apostrophes (then only ones before a would-be formula)."""
    for cell in formula_attacks():
        written = mirai_files.inert_cell(cell)
        assert not runs_as_formula(written), repr(cell)
        assert written == cell or runs_as_formula(cell) or cell.startswith("'"), repr(cell)
        assert written in (cell, "'" + cell), repr(cell)


def test_restored_cell_undoes_inert_cell_exactly_for_every_string():
    """The import's reverse: exact for every cell, apostrophes of its own included; a cell of
    MIRAI's own files that starts with an apostrophe before a would-be formula loses one."""
    for cell in [*formula_attacks(), None, "", "'", "''", "'x", "' =x", "'\x00"]:
        assert mirai_files.restored_cell(mirai_files.inert_cell(cell)) == cell, repr(cell)
    assert mirai_files.restored_cell("' =HYPERLINK(1)") == " =HYPERLINK(1)"
    assert mirai_files.restored_cell("'＝1") == "＝1"
    assert mirai_files.restored_cell("'it's") == "'it's"


def test_formula_cells_from_news_are_inert_in_the_export_and_exact_after_import(data_dir, tmp_path):
    """Issue 30: a news title such as =HYPERLINK(...) was written as it is, a formula in any
    spreadsheet that opens data_news.csv. Such cells now start with an apostrophe (CSV injection,
    OWASP); the import removes it, so the round trip stays exact."""
    hostile = tmp_path / "data"
    shutil.copytree(data_dir, hostile)
    month = hostile / "database/news/month=2024-01.parquet"
    news = pl.read_parquet(month)
    cells = HOSTILE_CELLS * (news.height // len(HOSTILE_CELLS) + 1)
    news = news.with_columns(
        pl.Series("title", cells[: news.height], pl.String),
        pl.Series("abstract", cells[1 : news.height + 1], pl.String),
    )
    write_sealed_parquet(DataLayout(hostile), news, month, pl.read_parquet_metadata(month))  # as the database does
    export_mirai(MONTH, hostile, tmp_path / "bundle")
    with open(tmp_path / "bundle" / mirai_files.NEWS_FILE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    titles = {r["Title"] for r in rows} | {r["Abstract"] for r in rows}
    assert {t for t in titles if runs_as_formula(t)} == set()
    assert '\'=HYPERLINK("http://127.0.0.1:9/?"&A1,"click")' in titles and "''=x" in titles
    assert '\'＝HYPERLINK("http://127.0.0.1:9/")' in titles and "'' ＠SUM(1)" in titles
    import_mirai(tmp_path / "bundle", tmp_path / "imported")
    back = pl.read_parquet(tmp_path / "imported/database/news/month=2024-01.parquet")
    assert back.equals(news.sort("date", "article_id"))


def test_events_listing_more_articles_than_their_rows_are_refused_in_bounded_memory(exported, tmp_path):
    """MIRAI's step 6 writes one data_kg.csv row per (event, article), each carrying the event's
    whole Docids list. Fifty new events of one row each listing 20,000 new articles (a 6 MB file)
    were imported as a million event-article links held as Python ints in sets, ~190 bytes a link:
    at the file's 8 GiB cap that is hundreds of GB (a 103 MB file took 3 GB of RSS). Refused, with
    the links held as 8-byte arrays while the file is read."""
    import hashlib
    import tracemalloc

    from pipeline.reference import iso3_codes

    source = tmp_path / "mirai"
    shutil.copytree(exported, source)
    news = source / "data/MIRAI/data_news.csv"
    first_new = max(int(row["Docid"]) for row in csv.DictReader(news.open(newline=""), delimiter="\t")) + 1
    added = range(first_new, first_new + 20_000)
    with news.open("a", newline="") as fh:
        fh.writelines(f"{d}\t{hashlib.md5(str(d).encode()).hexdigest()}\t\t2024-01-05\tt\tx\t\n" for d in added)
    kg = source / "data/MIRAI/data_kg.csv"
    docids = "[" + ", ".join(map(str, added)) + "]"
    countries = sorted(iso3_codes())
    with kg.open("a", newline="") as fh:
        for s in countries[:50]:
            code = f"2024-01-05, {s}, 010, {countries[-1]}"
            fh.write(f"2024-01-05\t{s}\t{countries[-1]}\t010\t\t\t\t{code}\t\t{first_new}\t{docids}\n")
    tracemalloc.start()
    try:
        with pytest.raises(MiraiFormatError) as refused:
            import_mirai(source, tmp_path / "imported")
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert "lists 20,000 articles in its Docids but has 1 row(s)" in str(refused.value), refused.value
    assert "data/MIRAI/data_kg.csv line " in str(refused.value) and "\n" not in str(refused.value)
    assert peak < 48, f"refusing it took {peak:.0f} MiB"
    assert not (tmp_path / "imported").exists()


def test_a_relation_query_csv_with_more_queries_than_a_split_may_hold_is_refused(exported, tmp_path, monkeypatch):
    """Each query row costs ~1.7 KB of Python objects while the file is read: 600,000 rows (45 MB,
    under the file's 256 MiB cap) took 1 GB and made a split that `mirai score` and `mirai evaluate`
    then refuse (more than score_inputs.MAX_RECORDS queries). Refused at the row past the bound
    (lowered here to the export's own count, so the test needs no 200,000-row file)."""
    from pipeline.evaluation.score_inputs import MAX_RECORDS
    from pipeline.splits import mirai_import

    assert mirai_files.MAX_QUERIES == MAX_RECORDS
    test = exported / "data/MIRAI/test/relation_query.csv"
    count = len(test.read_text().splitlines()) - 1
    monkeypatch.setattr(mirai_import, "MAX_QUERIES", count - 1)
    with pytest.raises(MiraiFormatError) as refused:
        import_mirai(exported, tmp_path / "imported")
    assert f"relation_query.csv line {count + 1}: more than {count - 1:,} queries" in str(refused.value)
    assert not (tmp_path / "imported").exists()
    monkeypatch.setattr(mirai_import, "MAX_QUERIES", count)
    assert import_mirai(exported, tmp_path / "imported").queries == count
