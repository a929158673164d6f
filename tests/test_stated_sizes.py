"""Formats whose header states sizes, or that expand when decoded, read from outside under a bound
the bytes cannot lie about (the security issue's last acceptance point: "the same for any other
format whose header states sizes"). Parquet has its own tests (test_score.py,
test_evaluate_hostile.py); here are the rest, each attack done for real: GDELT's index and zips
through the HTTP mirror on 127.0.0.1 (testbed/serve.py) with every file relisted with its true
md5, a news site's robots.txt through the news server, a release store's pointers and manifests
in a local bucket, and a handed-over split with a MIRAI relation_query.csv.

Each refusal is one line naming the file and the cap, loses nothing (a cached index stays in use,
a quarantined slot leaves its day alone), and happens while streaming: the memory an attack costs
is measured (tracemalloc) and stays far below what the file claims or inflates to.
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from pipeline.gdelt import index as index_module
from pipeline.gdelt.index import GdeltIndex, IndexTooLarge
from pipeline.gdelt.ingest import ingest_day
from pipeline.http import make_session
from pipeline.storage import DataLayout, raw_file_name
from testbed.hostile import relist, zip_member

from .conftest import MIRROR_DAY
from .settings_builder import make_settings

SLOT = datetime(2024, 1, 1, 5, 30, tzinfo=UTC)
MIB = 2**20


@contextmanager
def peak_mib() -> Iterator[list[float]]:
    """The peak of Python allocations (MiB) over the block's start, appended to the list yielded."""
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    out: list[float] = []
    try:
        yield out
    finally:
        out.append((tracemalloc.get_traced_memory()[1] - start) / MIB)
        tracemalloc.stop()


def _row(ledger: pl.DataFrame, slot: datetime, kind: str = "export") -> dict:
    return ledger.filter(pl.col("slot") == slot, pl.col("kind") == kind).row(0, named=True)


def _fetches(mirror, name: str) -> int:
    return sum(1 for r in mirror.requests if r["path"].endswith("/" + name))


# --- GDELT's index: lastupdate.txt and masterfilelist.txt ----------------------------------------


def _index(data_dir: Path, mirror) -> GdeltIndex:
    settings = make_settings(data_dir=data_dir, gdelt_base_url=mirror.base_url, backoff_base_s=0.01, backoff_max_s=0.05)
    return GdeltIndex(
        DataLayout(settings.dataset.data_dir), settings.network, settings.gdelt, make_session(settings.network)
    )


def test_a_gzip_bomb_served_as_lastupdate_is_refused_at_its_cap_and_the_cached_index_stays(tmp_path, mirror):
    """lastupdate.txt is three lines; a server may still answer with Content-Encoding: gzip and
    64 MiB of zeros in 64 KB. It used to be read whole (``resp.content``)."""
    index = _index(tmp_path / "data", mirror)
    assert index.refresh().mode == "full"
    cached = index.master_path.read_bytes(), index.lastupdate_path.read_bytes()
    mirror.faults.add(match="lastupdate.txt", fault="gzip_bomb", inflated_bytes=64 * MIB)
    with peak_mib() as peak:
        result = index.refresh()
    assert result.mode == "cached"
    assert "lastupdate.txt" in result.error and f"{index_module.MAX_LAST_UPDATE_BYTES:,} bytes" in result.error
    assert "\n" not in result.error
    assert peak[0] < 4, f"refusing the bomb took {peak[0]:.1f} MiB"
    assert (index.master_path.read_bytes(), index.lastupdate_path.read_bytes()) == cached


@pytest.mark.parametrize("cached", [False, True], ids=["first-download", "refresh-ignoring-range"])
def test_a_master_list_past_its_cap_is_refused_while_streaming(tmp_path, mirror, monkeypatch, cached):
    """The master list is ~115 MB and grows ~11 MB a year; a server that sends more (here a gzip
    bomb, inflating to 64 MiB past a cap lowered to 4 MiB for the test) is cut off at the cap,
    whether the list is downloaded whole or a Range request is answered with the whole body. It
    used to be streamed to disk without end (first download) or read whole (``resp.content``)."""
    monkeypatch.setattr(index_module, "MAX_MASTER_LIST_BYTES", 4 * MIB)
    index = _index(tmp_path / "data", mirror)
    if cached:
        assert index.refresh().mode == "full"
    before = index.master_path.read_bytes() if cached else None
    mirror.faults.add(match="masterfilelist.txt", fault="gzip_bomb", inflated_bytes=64 * MIB)
    with peak_mib() as peak:
        if cached:
            result = index.refresh()
            error = result.error
            assert result.mode == "cached"
        else:
            with pytest.raises(IndexTooLarge) as refused:
                index.refresh()
            error = str(refused.value)
    assert "masterfilelist.txt" in error and "more than 4,194,304 bytes" in error and "\n" not in error
    assert peak[0] < 12, f"refusing the bomb took {peak[0]:.1f} MiB"  # it inflates to 64 MiB
    if cached:
        assert index.master_path.read_bytes() == before
    else:
        assert not index.master_path.exists()
    assert sorted(p.name for p in index.dir.iterdir()) == (["lastupdate.txt", "masterfilelist.txt"] if cached else [])


def test_the_master_list_cap_leaves_room_for_decades_of_growth():
    # ~115 MB today (docs/data-layout.md), growing ~11 MB a year (3 files every 15 minutes).
    assert index_module.MAX_MASTER_LIST_BYTES >= 4 * 115 * 10**6


# --- GDELT's zips: the sizes the index lists and the sizes a zip's headers state ------------------


def test_a_zip_listed_larger_than_a_member_at_the_cap_can_make_is_quarantined_unread(settings, mirror, mirror_dir):
    """A zip whose central directory accounts for a few bytes, behind megabytes the index lists
    and md5s: zipfile opens it (it takes the bytes before the archive for a self-extractor's
    stub) and its member verifies, so it used to land, and parsing read the raw zip whole. A zip
    of one member at the cap cannot be that large, so the listed size alone refuses it."""
    settings = make_settings(settings, max_uncompressed_mb=1)
    name = raw_file_name(SLOT, "export")
    padded = b"PK\x03\x04" + b"\0" * (4 * MIB) + zip_member(name.removesuffix(".zip"), b"tiny\n")
    relist(mirror_dir, name, padded)
    row = _row(ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt).ledger, SLOT)
    assert row["status"] == "quarantined", row
    assert f"listed at {len(padded):,} bytes" in row["last_error"] and "1,048,576" in row["last_error"]
    assert _fetches(mirror, name) == 0  # refused on the index's word: nothing downloaded
    assert not DataLayout(settings.dataset.data_dir).raw_path(SLOT, "export").exists()
    again = ingest_day(
        MIRROR_DAY, settings.dataset, settings.network, settings.gdelt
    ).ledger  # the same listing is not tried again
    assert _row(again, SLOT)["status"] == "quarantined" and _fetches(mirror, name) == 0
    assert _row(again, SLOT, "mentions")["status"] == "landed"  # and the slot's other file is there


def test_a_zip_bomb_whose_headers_state_a_small_size_is_quarantined_after_that_size(settings, mirror, mirror_dir):
    """Local and central headers both say 1,000 bytes; the member inflates to 64 MiB. The md5 is
    right. Already bounded (the declared size is checked against the cap, then zipfile stops at
    the declared size and the CRC check fails, or the running count stops it at the cap): this
    proves it through the mirror, at the default cap."""
    name = raw_file_name(SLOT, "export")
    bomb = bytearray(zip_member(name.removesuffix(".zip"), b"\0" * (64 * MIB)))
    assert len(bomb) < 128 * 2**10
    bomb[22:26] = struct.pack("<I", 1000)  # the local header's uncompressed size
    central = bomb.index(b"PK\x01\x02")
    bomb[central + 24 : central + 28] = struct.pack("<I", 1000)  # the central directory's
    relist(mirror_dir, name, bytes(bomb))
    row = _row(ingest_day(MIRROR_DAY, settings.dataset, settings.network, settings.gdelt).ledger, SLOT)
    assert row["status"] == "quarantined" and "Bad CRC-32" in row["last_error"], row
    assert _fetches(mirror, name) == 1


# --- news sites: robots.txt -----------------------------------------------------------------------


def test_a_huge_robots_txt_is_cut_at_its_cap_and_still_obeyed(tmp_path):
    """RFC 9309 §2.5: parse at least 500 KiB. A robots.txt of 8 MiB is read to 512 KiB and its
    rules still apply. Already bounded (read_capped with truncate); this proves it."""
    from pipeline.articles.checked_get import fetch_robots_txt
    from pipeline.articles.robots import ROBOTS_MAX_BYTES, RobotsCache
    from pipeline.articles.safety import make_safe_session
    from testbed.news import DEFAULT_ROBOTS, NewsServer, page_html

    settings = make_settings(data_dir=tmp_path / "data", fetch_allow_loopback=True, fetch_deadline_s=5.0)
    huge = DEFAULT_ROBOTS + "# " + "x" * (8 * MIB) + "\n"
    with NewsServer({"/a.html": page_html("a")}, robots_txt=huge) as news:
        session = make_safe_session(settings.network, settings.articles)
        fetched = fetch_robots_txt(session, news.url_for("/robots.txt"), settings.articles)
        assert fetched.status == 200 and len(fetched.text.encode()) == ROBOTS_MAX_BYTES
        robots = RobotsCache(settings.network, settings.articles, fetcher=fetch_robots_txt)
        assert robots.allowed(session, news.url_for("/a.html"))
        assert not robots.allowed(session, news.url_for("/private/x.html"))


# --- release stores: manifests and pointers read when publishing ----------------------------------


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that costs no disk (a hole): what a hostile bucket may hold."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_an_oversized_manifest_in_the_store_is_refused_by_build_index_without_being_read_whole(tmp_path):
    """build_index checks every manifest in the store before index.json points at it; a 64 MiB
    one used to be read whole (no limit, unlike mirai download's reads)."""
    from pipeline.release.layout import MAX_JSON_BYTES, UnsafeRelease
    from pipeline.release.publish import build_index
    from pipeline.release.store import LocalStore

    store = LocalStore(tmp_path / "bucket")
    _sparse(tmp_path / "bucket/releases/2024-01/manifest.json", 4 * MAX_JSON_BYTES)
    with peak_mib() as peak, pytest.raises(UnsafeRelease) as refused:
        build_index(store)
    assert f"releases/2024-01/manifest.json at {store.description} is over {MAX_JSON_BYTES:,} bytes" in str(
        refused.value
    )
    assert peak[0] < 2 * MAX_JSON_BYTES / MIB, f"refusing it took {peak[0]:.1f} MiB"


def test_oversized_pointers_and_leaderboard_files_are_overwritten_without_being_read_whole(tmp_path):
    """index.json, latest.json and the leaderboard files are pointers the publisher rewrites when
    they differ from its own; 64 MiB at each used to be read whole to find out that they do."""
    from pipeline.release.layout import INDEX_KEY, LEADERBOARD_KEYS
    from pipeline.release.publish import publish_leaderboard, update_pointers
    from pipeline.release.store import LocalStore

    bucket = tmp_path / "bucket"
    store = LocalStore(bucket)
    for key in (INDEX_KEY, *LEADERBOARD_KEYS.values()):
        _sparse(bucket / key, 64 * MIB)
    ours = []
    for name in ("board.parquet", "chart.png", "page.html"):
        ours.append(tmp_path / name)
        ours[-1].write_bytes(f"our {name}\n".encode())
    with peak_mib() as peak:
        assert update_pointers(store) == (True, False)
        assert publish_leaderboard(store, *ours) == list(LEADERBOARD_KEYS.values())
    assert peak[0] < 4, f"comparing took {peak[0]:.1f} MiB"
    assert (bucket / INDEX_KEY).read_bytes().startswith(b"{")
    assert [(bucket / key).read_bytes() for key in LEADERBOARD_KEYS.values()] == [p.read_bytes() for p in ours]
    with peak_mib() as peak:  # and once they hold ours, nothing is written again
        assert update_pointers(store) == (False, False) and publish_leaderboard(store, *ours) == []


# --- a handed-over split and a MIRAI relation_query.csv (mirai score --relation-query) ------------


def _split_with_a_shared_huge_actor(directory: Path, rows: int) -> None:
    """A queries.parquet whose ``s`` column is one 1 MiB value every row shares (a dictionary
    page): a few KB on disk and little memory decoded, ``rows`` MiB once each row is a Python
    string. ``answer_dict`` is a sound gold answer, so load_split (which reads query_id and
    answer_dict only) accepts the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    shared = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["A" * MIB]))
    table = pa.table(
        {
            "query_id": [f"2024-01-{i:05d}" for i in range(rows)],
            "date": pa.array([date(2024, 1, 2)] * rows),
            "s": shared,
            "o": ["FRA"] * rows,
            "answer_dict": ['{"04": ["042"]}'] * rows,
        }
    )
    pq.write_table(table, directory / "queries.parquet", compression="zstd")
    assert (directory / "queries.parquet").stat().st_size < 64 * 2**10


def test_a_split_column_only_relation_query_reads_is_measured_before_its_rows_are_read(tmp_path):
    """load_split decodes query_id and answer_dict in the capped child; --relation-query then read
    query_id, date, s and o of the same handed-over file in this process with a plain
    pl.read_parquet (its footer believed) and made every row Python strings: 200 MiB here."""
    from pipeline.evaluation import score_inputs

    split = tmp_path / "split"
    _split_with_a_shared_huge_actor(split, rows=200)
    relation_query = tmp_path / "relation_query.csv"
    relation_query.write_text("QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\n1\t2024-01-02\tDEU\tFRA\n")
    score_inputs.load_split(split)  # the columns it reads are sound
    with peak_mib() as peak, pytest.raises(score_inputs.ScoringError) as refused:
        score_inputs.relation_query_file_ids(split, False, relation_query)
    assert "queries.parquet" in str(refused.value) and "s values longer than" in str(refused.value)
    assert peak[0] < 16, f"refusing it took {peak[0]:.1f} MiB"


def test_a_relation_query_csv_past_its_cap_is_refused_unread(tmp_path):
    """A MIRAI relation_query.csv is a few hundred KB (705 queries in MIRAI's test set); one past
    the import's cap for the same file used to go to pl.read_csv whole."""
    from pipeline.evaluation.mirai_predictions import mirai_query_ids
    from pipeline.splits.mirai_files import MAX_FILE_BYTES, TEST_FILE

    cap = MAX_FILE_BYTES[TEST_FILE]
    path = tmp_path / "relation_query.csv"
    _sparse(path, cap + 1)
    queries = pl.DataFrame({"query_id": ["q"], "date": [date(2024, 1, 2)], "s": ["DEU"], "o": ["FRA"]})
    with peak_mib() as peak, pytest.raises(ValueError) as refused:
        mirai_query_ids(queries, path)
    assert f"{cap + 1:,} bytes, more than the {cap:,} allowed" in str(refused.value)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    assert peak[0] < 1, f"refusing it took {peak[0]:.1f} MiB"
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)  # nothing would ever end its read
    with pytest.raises(ValueError, match="not a regular file"):
        mirai_query_ids(queries, fifo)


def wide_parquet(path: Path) -> Path:
    """A valid parquet file of 12,000 one-byte columns: a 1.8 MB footer, which pyarrow parses into
    objects hundreds of times its size (a re-attack of issue 30 took 2.9 GB with a 12 MB footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({f"c{i}": pa.array([1], pa.int8()) for i in range(12_000)})
    pq.write_table(table, path, compression="none", write_statistics=False)
    return path


def test_a_footer_longer_than_any_of_ours_is_refused_before_anything_parses_it(tmp_path):
    from pipeline.agent_api.event_database import DatabaseFileError, _read_month
    from pipeline.evaluation.queries import InvalidQueries, read_queries
    from pipeline.evaluation.score_inputs import ScoringError, read_parquet
    from pipeline.untrusted_parquet import MAX_FOOTER_BYTES

    path = wide_parquet(tmp_path / "queries.parquet")
    assert int.from_bytes(path.read_bytes()[-8:-4], "little") > MAX_FOOTER_BYTES
    # Each refusal names the footer's length: it came from the last 8 bytes, before any parse.
    for read, error in ((read_parquet, ScoringError), (read_queries, InvalidQueries)):
        with pytest.raises(error, match="footer is 1,8"):
            read(path)
    with pytest.raises(DatabaseFileError, match="footer is 1,8"):
        _read_month(path, "events", untrusted=True)


def _rows_understated(table, claimed: int) -> bytes:
    """``table`` as one parquet row group whose footer's FileMetaData.num_rows says ``claimed``
    (the row group keeps the real count: readers decode what is there)."""
    import io

    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=table.num_rows, compression="zstd")
    data = out.getvalue()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]

    def field_i64(n: int) -> bytes:  # thrift compact: field 3 (num_rows, i64) right after field 2
        zigzag, out = (n << 1) ^ (n >> 63), bytearray(b"\x16")
        while True:
            byte, zigzag = zigzag & 0x7F, zigzag >> 7
            out.append(byte | (0x80 if zigzag else 0))
            if not zigzag:
                return bytes(out)

    assert footer.count(field_i64(table.num_rows)) >= 1
    forged = footer.replace(field_i64(table.num_rows), field_i64(claimed), 1)
    return data[: -8 - length] + forged + len(forged).to_bytes(4, "little") + b"PAR1"


def test_a_row_count_the_footer_understates_is_counted_on_what_is_decoded(tmp_path, monkeypatch):
    """A re-attack of issue 30: predictions whose footer says 10 rows while its row group holds
    MAX_RECORDS + 1 were all decoded and scored (2.5 times the cap at 500,000). The cap is lowered
    here, so that the decoded rows, not the decoder's memory bound, are what refuses the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.evaluation import score_inputs
    from pipeline.evaluation.score_inputs import ScoringError, read_parquet

    monkeypatch.setattr(score_inputs, "MAX_RECORDS", 1000)
    MAX_RECORDS = score_inputs.MAX_RECORDS
    rows = MAX_RECORDS + 1
    table = pa.table({"query_id": pa.array(["q"] * rows), "answer": pa.array([None] * rows, pa.string())})
    path = tmp_path / "predictions.parquet"
    path.write_bytes(_rows_understated(table, 10))
    assert pq.ParquetFile(path).metadata.num_rows == 10
    with pytest.raises(ScoringError, match=f"more than {MAX_RECORDS} records"):
        read_parquet(path)


def test_a_queries_file_whose_footer_understates_its_rows_is_refused(tmp_path, monkeypatch):
    import pyarrow as pa

    from pipeline.evaluation import queries
    from pipeline.evaluation.queries import InvalidQueries, read_queries

    monkeypatch.setattr(queries, "MAX_QUERIES", 1000)  # the rows, not the decoder's memory bound, refuse it
    MAX_QUERIES = queries.MAX_QUERIES
    rows = MAX_QUERIES + 1
    frame = pl.DataFrame(
        {"query_id": ["q"] * rows, "date": [date(2024, 1, 1)] * rows, "s": ["USA"] * rows, "o": ["CHN"] * rows}
    ).with_columns(answer_dict=pl.lit("{}"))
    path = tmp_path / "queries.parquet"
    path.write_bytes(_rows_understated(pa.table(frame.to_arrow()), 10))
    with pytest.raises(InvalidQueries, match=f"{rows:,} rows, more than the {MAX_QUERIES:,}"):
        read_queries(path)


# A re-attack of issue 30: answers within every byte cap whose parsed JSON is 10-25 times their text.
LINE_CAP = 4 * 64 * 1024  # score_inputs.MAX_LINE_CHARS
EMPTY_DICTS = "[" + ",".join(["{}"] * ((LINE_CAP - 2) // 3)) + "]"  # 87,000 values in 256 KiB


def test_answers_that_parse_into_gigabytes_are_refused_before_they_are_parsed(tmp_path):
    """A 9 KB parquet file (one 256 KiB answer of empty dicts, dictionary-encoded, in 250 rows)
    passed every byte cap and took 1.7 GB to read; the same answers as JSONL too. Both are refused
    by their count of JSON values, with the parse's memory far below what it would have cost."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.evaluation.score_inputs import ScoringError, read_jsonl, read_parquet

    rows = 250
    table = pa.table({"query_id": [f"q{i}" for i in range(rows)], "answer": [EMPTY_DICTS] * rows})
    parquet = tmp_path / "predictions.parquet"
    pq.write_table(table, parquet, compression="zstd", use_dictionary=True)
    assert parquet.stat().st_size < 64 * 1024
    jsonl = tmp_path / "predictions.jsonl"
    jsonl.write_text("".join(f'{{"query_id": "q{i}", "answer": {EMPTY_DICTS}}}\n' for i in range(rows)))
    for read, path in ((read_parquet, parquet), (read_jsonl, jsonl)):
        with peak_mib() as peak, pytest.raises(ScoringError, match="JSON values in its answers"):
            read(path)
        assert peak[0] < 400, (path, peak)  # the text itself (64 MiB) and one decoded column, no parse


def test_gold_answers_that_parse_into_gigabytes_or_nest_too_deeply_are_refused(tmp_path):
    """A 2 KB queries.parquet in a handed-over --split directory (900 answers of 256 KiB of
    "010"s) made `mirai score` take 3 GB; an answer nested 100,000 deep raised RecursionError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.evaluation.score_inputs import ScoringError, load_split

    big = '{"01": [' + ",".join(['"010"'] * ((LINE_CAP - 20) // 6)) + "]}"
    deep = '{"01": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for name, answers in (("big", [big] * 900), ("deep", [deep])):
        directory = tmp_path / name
        directory.mkdir()
        ids = [f"2024-01-{i:05d}" for i in range(len(answers))]
        pq.write_table(pa.table({"query_id": ids, "answer_dict": answers}), directory / "queries.parquet")
        match = "more JSON values" if name == "big" else "nested too deeply"
        with peak_mib() as peak, pytest.raises(ScoringError, match=match):
            load_split(directory)
        assert peak[0] < 600, (name, peak)


RELATION_QUERY_IN_A_CAPPED_PROCESS = """
import resource, sys
from datetime import date
import polars as pl
from pipeline.evaluation.mirai_predictions import mirai_query_ids
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
queries = pl.DataFrame({"query_id": ["q"], "date": [date(2024, 1, 2)], "s": ["DEU"], "o": ["FRA"]})
try:
    mirai_query_ids(queries, sys.argv[1])
except ValueError as exc:
    print(f"refused: {exc}")
"""


def test_a_relation_query_csv_with_millions_of_columns_is_refused_on_its_text(tmp_path):
    """A 17 MB header of two million column names, well under the file's 256 MiB cap: polars'
    reader took 1.25 GB for it (74 times the file) and, with 2 GiB of address space, aborted the
    whole process (SIGABRT, a failed Rust allocation). Its columns are counted on its TABs."""
    import subprocess
    import sys

    path = tmp_path / "relation_query.csv"
    names = "\t".join(f"c{i}" for i in range(2_000_000))
    path.write_text(f"QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\t{names}\n1\t2024-01-02\tDEU\tFRA\n")
    done = subprocess.run(
        [sys.executable, "-c", RELATION_QUERY_IN_A_CAPPED_PROCESS, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.startswith(f"refused: {path} line 1: more than the 256 columns"), done.stdout
    assert len(done.stdout.splitlines()) == 1


def test_a_relation_query_csv_is_read_as_before(tmp_path):
    """The four columns of a MIRAI relation_query.csv, whatever else it holds (quoted fields too)."""
    from pipeline.evaluation.mirai_predictions import mirai_query_ids

    path = tmp_path / "relation_query.csv"
    path.write_text(
        'QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\tquery\n7\t2024-01-02\tDEU\tFRA\t"a\tb ""c"""\n'
    )
    queries = pl.DataFrame({"query_id": ["q"], "date": [date(2024, 1, 2)], "s": ["DEU"], "o": ["FRA"]})
    assert mirai_query_ids(queries, path) == {"q": "7"}
    path.write_text("QueryId\tDateStr\tActor1CountryCode\tActor2CountryCode\n7\t2024-01-02\tDEU\n")
    with pytest.raises(ValueError, match="line 2: 3 fields, the header has 4"):
        mirai_query_ids(queries, path)
