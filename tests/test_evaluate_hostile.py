"""`mirai evaluate` on a hostile release directory (docs/evaluate-your-agent.md, "3. Run an agent"):
a directory handed over by anyone, not fetched by `mirai download`. Each variant is the real
release of test_cli_evaluate.py, copied and altered; the command runs in-process through
``main`` against a real scripted endpoint on 127.0.0.1. A hostile input gets a one-line
`mirai evaluate: error: ...`, a non-zero exit, no request to the endpoint, and nothing written
outside --out and its run directory; the date gate holds whatever the database files say."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.agent_api import EventDatabase
from pipeline.cli import main
from testbed.chat import ChatServer
from tests.test_cli_evaluate import KEY, KEY_ENV, Recorder, _flags, release  # noqa: F401 (the fixture)
from tests.test_score import _varint

QUERIES = "queries_sample.parquet"
EVENTS = Path("database/events/month=2024-01.parquet")


@pytest.fixture
def hostile(release, tmp_path) -> Path:  # noqa: F811 (the imported fixture)
    """A copy of the downloaded release to alter, in its own directory beside the user's files."""
    copy = tmp_path / "handed" / "2024-02"
    shutil.copytree(release, copy)
    return copy


def _evaluate(directory: Path, out: Path, capsys, monkeypatch, *extra: str) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, requests the endpoint got) of `mirai evaluate` in-process."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with ChatServer(Recorder()) as server:
        status = main(["evaluate", str(directory), *_flags(server.base_url), "--out", str(out), *extra])
        requests = server.requests
    captured = capsys.readouterr()
    return status, captured.out, captured.err, requests


def _refused(result: tuple[int, str, str, int], *words: str) -> str:
    status, _, err, requests = result
    assert status != 0 and requests == 0, result
    assert len(err.splitlines()) == 1 and err.startswith("mirai evaluate: error: "), err
    assert "Traceback" not in err and "--debug shows the traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def _rewrite_queries(directory: Path, change) -> None:
    path = directory / QUERIES
    frame = change(pl.read_parquet(path))
    path.unlink()
    frame.write_parquet(path)


# --- 1. query ids and dates that would become paths ---------------------------------------------


@pytest.mark.parametrize("query_id", ["../../escape", "a/b", "a\x00b", "2024-02-00001\n", ".hidden", ""])
def test_a_query_id_that_is_no_file_name_is_refused_before_any_episode(
    hostile, tmp_path, capsys, monkeypatch, query_id
):
    frame = pl.read_parquet(hostile / QUERIES)
    ids = frame.get_column("query_id").to_list()
    ids[0] = query_id
    _rewrite_queries(hostile, lambda f: f.with_columns(pl.Series("query_id", ids)))
    out = tmp_path / "work" / "rounds"
    before = _files(tmp_path)
    _refused(_evaluate(hostile, out, capsys, monkeypatch, "--rounds", "2"), "query_id")
    assert _files(tmp_path) == before  # nothing written anywhere, inside --out or not


# --- 2. links out of the release -----------------------------------------------------------------


def test_a_queries_file_linking_out_of_the_release_is_refused(hostile, release, tmp_path, capsys, monkeypatch):  # noqa: F811
    # A real queries file elsewhere on the machine (here the genuine release's full split).
    (hostile / QUERIES).unlink()
    (hostile / QUERIES).symlink_to(release / "queries.parquet")
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES, "outside")


def test_a_database_month_linking_out_of_the_release_is_refused(hostile, tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "private" / "month=2024-01.parquet"
    elsewhere.parent.mkdir()
    shutil.move(hostile / EVENTS, elsewhere)
    (hostile / EVENTS).symlink_to(elsewhere)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-01.parquet", "outside")


def test_a_database_directory_linking_out_of_the_release_is_refused(hostile, tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "private" / "database"
    shutil.move(hostile / "database", elsewhere)
    (hostile / "database").symlink_to(elsewhere)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "outside")


def test_a_link_to_etc_passwd_is_refused(hostile, tmp_path, capsys, monkeypatch):
    (hostile / "database/news/month=2024-02.parquet").unlink()
    (hostile / "database/news/month=2024-02.parquet").symlink_to("/etc/passwd")
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "outside")


def test_a_link_inside_the_release_is_read(hostile, tmp_path, capsys, monkeypatch):
    """A link that stays inside the release (a month shared by two copies, say) is not hostile."""
    moved = hostile / "database" / "shared.parquet"
    shutil.move(hostile / EVENTS, moved)
    (hostile / EVENTS).symlink_to(Path("..") / "shared.parquet")
    status, _, err, requests = _evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch)
    assert status == 0 and requests > 0, err


def test_a_fifo_as_a_database_month_is_refused_not_waited_on(hostile, tmp_path, capsys, monkeypatch):
    (hostile / "database/news/month=2024-02.parquet").unlink()
    os.mkfifo(hostile / "database/news/month=2024-02.parquet")
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-02.parquet", "regular file")


# --- 3. a queries file that is not a split's ------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda f: f.drop("answer_dict"), ["answer_dict"]),
        (lambda f: f.drop("date"), ["date"]),
        (lambda f: f.with_columns(pl.col("date").cast(pl.String)), ["date"]),
        (lambda f: f.with_columns(pl.col("query_id").str.len_chars().alias("query_id")), ["query_id"]),
        (lambda f: f.with_columns(pl.lit(None, pl.Date).alias("date")), ["date", "null"]),
        (lambda f: f.with_columns(pl.lit(None, pl.String).alias("s")), ["s", "null"]),
        (lambda f: f.with_columns(pl.col("query_id").first()), ["query_id", "twice"]),
        (lambda f: f.with_columns(pl.lit("XXX").alias("o")), ["'XXX'"]),
        (lambda f: f.with_columns(pl.lit('{"04": ["999"]}').alias("answer_dict")), ["answer_dict"]),
        (lambda f: f.with_columns(pl.lit("not json").alias("answer_dict")), ["answer_dict"]),
        (lambda f: f.with_columns(pl.lit("[1, 2]").alias("answer_dict")), ["answer_dict"]),
        (lambda f: f.head(0), ["no queries"]),
        # Outside the release's month: another month's, several months', a date no cutoff fits.
        (lambda f: f.with_columns(pl.col("date").dt.offset_by("-1mo")), ["2024-01", "2024-02"]),
        (lambda f: f.with_columns(pl.lit(date(1, 1, 1)).alias("date")), ["0001-01"]),
    ],
)
def test_a_queries_file_that_is_not_a_split_s_is_refused_in_one_line(
    hostile, tmp_path, capsys, monkeypatch, change, words
):
    _rewrite_queries(hostile, change)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES, *words)


def test_queries_spanning_two_months_are_refused(hostile, tmp_path, capsys, monkeypatch):
    frame = pl.read_parquet(hostile / QUERIES)
    dates = frame.get_column("date").to_list()
    dates[-1] = date(2024, 3, 1)
    _rewrite_queries(hostile, lambda f: f.with_columns(pl.Series("date", dates)))
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES, "month")


def test_ten_million_queries_are_refused_by_the_file_s_metadata(hostile, tmp_path, capsys, monkeypatch):
    """10 million rows of one repeated query: a small file on disk, GBs once read. The row count
    in the footer refuses it before a row is decoded."""
    path = hostile / QUERIES
    first = pl.read_parquet(path).head(1)
    path.unlink()
    pl.select(pl.repeat(first.item(0, "query_id"), 10_000_000).alias("query_id")).with_columns(
        pl.lit(first.item(0, "date")).alias("date")
    ).write_parquet(path)
    assert pq.read_metadata(path).num_rows == 10_000_000 and path.stat().st_size < 2**20
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES, "10,000,000")


def _queries_bomb(path: Path, dictionary: bool) -> None:
    """The queries file rewritten with every answer_dict 1 MiB long: zstd, plain-encoded with the
    footer's row-group size rewritten to understate it (test_score.zstd_bomb's edit), or as one
    dictionary value all rows share. A few KB on disk either way."""
    frame = pl.read_parquet(path)
    rows = 600
    big = '{"04": ["' + "0" * 2**20 + '"]}'
    columns = {c: pa.array(frame.get_column(c).to_list() * (rows // frame.height + 1))[:rows] for c in frame.columns}
    columns["answer_dict"] = (
        pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([big]))
        if dictionary
        else pa.array([big] * rows)
    )
    table = pa.table(columns)
    pq.write_table(table, path, store_schema=False, compression="zstd", use_dictionary=dictionary)
    if not dictionary:
        data = path.read_bytes()
        stated = pq.read_metadata(path).row_group(0).total_byte_size
        true = _varint(stated << 1)
        lie = _varint(2**22 << 1, len(true))  # 4 MiB, in as many bytes as the true size took
        assert len(true) == len(lie) and true in data
        path.write_bytes(data.replace(true, lie))
        assert pq.read_metadata(path).row_group(0).total_byte_size == 2**22
    assert path.stat().st_size < 64 * 2**10


@pytest.mark.parametrize("dictionary", [False, True], ids=["zstd-understated", "one-dictionary-value"])
def test_a_queries_file_that_decodes_to_600_mib_is_refused_in_one_line(
    hostile, tmp_path, capsys, monkeypatch, dictionary
):
    """Issue 30: the queries file's footer is its own word. A plain bomb is decoded in a child
    process with a memory bound; a dictionary one is measured on its column before any row."""
    _queries_bomb(hostile / QUERIES, dictionary)
    words = ("a text cell longer than",) if dictionary else ("decoding it needs more than",)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES, *words)


@pytest.mark.parametrize("content", [b"not parquet at all\n", None])
def test_a_queries_file_that_is_not_parquet_or_truncated_is_refused(hostile, tmp_path, capsys, monkeypatch, content):
    path = hostile / QUERIES
    data = path.read_bytes()
    path.write_bytes(content if content is not None else data[: len(data) // 2])
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), QUERIES)


# --- 4. database months that are not the release's -------------------------------------------------


@pytest.mark.parametrize("dictionary", [False, True], ids=["zstd", "one-dictionary-value"])
def test_a_database_month_that_decodes_past_its_bound_is_refused_in_one_line(
    hostile, tmp_path, capsys, monkeypatch, dictionary
):
    """Issue 30: a handed-over release's news month whose article texts are 1 MiB each of one
    character (zstd: ~60 bytes apiece; or one dictionary value all rows share), under a bound of
    128 MiB for the test (4 GiB in use): decoded in the capped child, or measured on the column,
    and refused in one line before any request."""
    from pipeline.agent_api import event_database

    monkeypatch.setattr(event_database, "MAX_UNTRUSTED_MONTH_BYTES", 128 * 2**20, raising=False)
    path = hostile / "database/news/month=2024-01.parquet"
    frame = pl.read_parquet(path)
    rows = 300
    big = "0" * 2**20
    columns = {c: pa.array(frame.get_column(c).to_list() * (rows // frame.height + 1))[:rows] for c in frame.columns}
    columns["text"] = (
        pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([big]))
        if dictionary
        else pa.array([big] * rows)
    )
    pq.write_table(pa.table(columns), path, store_schema=False, compression="zstd", use_dictionary=dictionary)
    assert path.stat().st_size < 256 * 2**10
    words = ("bytes of text",) if dictionary else ("decoding it needs more than 128 MiB",)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-01.parquet", *words)


@pytest.mark.parametrize("content", [b"PAR1 not parquet", None])
def test_a_database_month_that_is_not_parquet_or_truncated_is_refused(hostile, tmp_path, capsys, monkeypatch, content):
    path = hostile / EVENTS
    data = path.read_bytes()
    path.write_bytes(content if content is not None else data[: len(data) // 2])
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-01.parquet")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda f: f.drop("article_ids"), ["article_ids"]),
        (lambda f: f.with_columns(pl.col("date").cast(pl.String)), ["date"]),
        (lambda f: f.with_columns(pl.lit("999").alias("r")), ["999"]),
    ],
)
def test_a_database_month_with_other_columns_is_refused(hostile, tmp_path, capsys, monkeypatch, change, words):
    path = hostile / EVENTS
    frame = change(pl.read_parquet(path))
    path.unlink()
    frame.write_parquet(path)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-01.parquet", *words)


def test_extra_database_columns_are_ignored(hostile, tmp_path, capsys, monkeypatch):
    path = hostile / EVENTS
    frame = pl.read_parquet(path).with_columns(pl.lit("x").alias("extra"))
    path.unlink()
    frame.write_parquet(path)
    status, _, err, requests = _evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch)
    assert status == 0 and requests > 0, err


@pytest.mark.parametrize(
    ("table", "day", "word"),
    [
        ("events", date(2024, 2, 28), "2024-02-28"),
        ("news", date(2024, 2, 28), "2024-02-28"),
        ("events", None, "1 undated"),
    ],
)
def test_rows_dated_after_their_month_never_pass_the_gate(hostile, tmp_path, capsys, monkeypatch, table, day, word):
    """January's file holding rows dated in late February (or undated): the gate hands January
    whole to every February query, so those rows would reach the agent; the file is refused."""
    path = hostile / f"database/{table}/month=2024-01.parquet"
    frame = pl.read_parquet(path)
    future = frame.head(1).with_columns(pl.lit(day, pl.Date).alias("date"))
    if table == "news":
        future = future.with_columns(pl.lit("FUTURE NEWS").alias("title"))
    path.unlink()
    pl.concat([frame, future]).write_parquet(path)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), f"{table}/month=2024-01.parquet", word)
    # The library refuses it too, not only the command: no environment gets those rows.
    database = EventDatabase(hostile)
    with pytest.raises(ValueError, match=word):
        database.environment(date(2024, 2, 10), 1)


def test_a_database_month_larger_than_its_bound_is_refused_before_it_is_read(hostile, tmp_path, capsys, monkeypatch):
    """A handed-over month is read whole to go to the capped decoder: its size on disk is the
    first bound (a sparse 1 GiB file here, with a real footer's schema)."""
    from pipeline.agent_api import event_database

    monkeypatch.setattr(event_database, "MAX_UNTRUSTED_MONTH_BYTES", 64 * 2**20)
    path = hostile / "database/news/month=2024-01.parquet"
    data = path.read_bytes()
    with open(path, "r+b") as f:  # the footer kept at the end, a hole before it
        f.truncate(0)
        f.seek(2**30)
        f.write(data)
    _refused(_evaluate(hostile, tmp_path / "p.jsonl", capsys, monkeypatch), "month=2024-01.parquet", "larger than")


def deeply_nested_parquet(depth: int, column: str = "date") -> bytes:
    """A parquet file (no rows) whose column ``column`` is ``depth`` nested optional groups around
    an INT32: a footer of ~8 bytes a level, written as Thrift's compact protocol by hand (pyarrow
    and polars take minutes to build such a type)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def element(name: str, children: int | None, leaf: bool = False) -> bytes:
        out = b"\x15\x02" if leaf else b""  # field 1 (type, i32): INT32 (zigzag 2)
        out += (b"\x25" if leaf else b"\x35") + b"\x02"  # field 3 (repetition, i32): OPTIONAL
        out += b"\x18" + varint(len(name)) + name.encode()  # field 4 (name, binary)
        if children is not None:
            out += b"\x15" + varint(children << 1)  # field 5 (num_children, i32)
        return out + b"\x00"

    schema = [b"\x48" + b"\x06schema" + b"\x15\x02\x00"]  # the root: name, one child
    schema += [element(column if i == 0 else "a", 1) for i in range(depth)] + [element("x", None, leaf=True)]
    count = len(schema)
    footer = b"\x15\x02" + b"\x19\xfc" + varint(count) + b"".join(schema)  # version 1; schema list
    footer += b"\x16\x00" + b"\x19\x0c" + b"\x00"  # num_rows 0; no row groups; stop
    return b"PAR1" + footer + len(footer).to_bytes(4, "little") + b"PAR1"


def test_a_database_month_nested_thousands_deep_is_refused_not_a_crash(hostile, tmp_path):
    """A 24 KB month file whose schema nests 3,000 groups: polars' pl.read_parquet_schema, which
    EventDatabase ran in the command's own process, overflowed its stack (SIGSEGV, exit -11). Run
    as the installed command, in a process of its own, so that a crash is a result, not the end of
    the test run."""
    (hostile / EVENTS).write_bytes(deeply_nested_parquet(3000))
    with ChatServer(Recorder()) as server:
        argv = ["evaluate", str(hostile), *_flags(server.base_url), "--out", str(tmp_path / "p.jsonl")]
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ | {KEY_ENV: KEY, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
        requests = server.requests
    assert done.returncode == 1 and requests == 0, (done.returncode, done.stderr[-1000:])
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mirai evaluate: error: "), err
    assert "month=2024-01.parquet" in err and "nested" in err, err
