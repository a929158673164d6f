"""The GDELT 2.0 parser and zip opener, on real GDELT files and on bytes built to break them.

Real files come from ``../shared/fixtures/gdelt`` (provenance and counts in its SOURCES.md); the
tests that need them skip, saying so, when ``../shared`` is not next to the project. Every other
test builds its input here and runs anywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import struct
import subprocess
import sys
import zipfile
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest

from pipeline.gdelt import (
    CorruptArchiveError,
    GdeltFormatError,
    ParsedFile,
    open_gdelt_zip,
    parse_export,
    parse_mentions,
)
from pipeline.gdelt import convert as convert_module
from pipeline.gdelt import lines as lines_module
from pipeline.gdelt import parse as parse_module
from pipeline.gdelt import refusals as refusals_module
from pipeline.gdelt.archive import is_zip
from pipeline.gdelt.parse import parse_files
from pipeline.gdelt.schema import EXPORT_SCHEMA, MENTIONS_SCHEMA, REJECTS_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
GDELT_FIXTURES = ROOT.parent / "shared" / "fixtures" / "gdelt"


def fixture_bytes(relative: str) -> bytes:
    path = GDELT_FIXTURES / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: the real-file tests need ../shared next to the project root")
    return path.read_bytes()


def utc(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=UTC)


def ymd(stamp: str) -> date:
    return date.fromisoformat(stamp)


# --- Real files: Events 2.0 ------------------------------------------------------------------

# (path, rows, SQLDATE range, DATEADDED values with their row counts, GLOBALEVENTID range or None)
# copied from SOURCES.md.
EXPORT_FIXTURES = [
    (
        "epournaras-DIAS-GDELT/b61e972/20180326044500.export.CSV",
        1540,
        ("20170326", "20180326"),
        {"20180326044500": 1540},
        (741917022, 741918561),
    ),
    (
        "narayave-Insight-GDELT-Feed/b412634/20190121220000.export.CSV.zip",
        1629,
        ("20180121", "20190121"),
        {"20190121220000": 1629},
        (817930293, 817931921),
    ),
    (
        "narayave-Insight-GDELT-Feed/b412634/20190121220000.export.CSV",
        1629,
        ("20180121", "20190121"),
        {"20190121220000": 1629},
        (817930293, 817931921),
    ),
    (
        "narayave-Insight-GDELT-Feed/HEAD/events.csv",
        2116,
        ("20141027", "20151027"),
        {"20151027220000": 2116},
        (479491239, 479493354),
    ),
    (
        "aamend-spark-gdelt/events.csv",
        100,
        ("20140218", "20200318"),
        {"20150218230000": 50, "20200318104500": 50},
        None,
    ),
    (
        "aamend-spark-gdelt/eventsT.csv",
        100,
        ("20140218", "20200318"),
        {"20150218224500": 50, "20200318103000": 50},
        None,
    ),
    (
        "aamend-spark-gdelt-cae6b57/events.csv",
        100,
        ("20080325", "20180323"),
        {"20180323221500": 100},
        None,
    ),
]


@pytest.mark.parametrize(
    ("relative", "n_rows", "sqldates", "dateadded", "ids"),
    EXPORT_FIXTURES,
    ids=[f[0] for f in EXPORT_FIXTURES],
)
def test_real_export_files_parse_completely(relative, n_rows, sqldates, dateadded, ids):
    parsed = parse_export(fixture_bytes(relative), source=relative)

    assert parsed.kind == "export"
    assert parsed.source == relative
    assert parsed.rows.schema == EXPORT_SCHEMA
    assert parsed.rejects.schema == REJECTS_SCHEMA
    assert parsed.rejects.height == 0, parsed.rejects
    assert parsed.rows.height == parsed.total_lines == n_rows
    rows = parsed.rows
    assert (rows["SQLDATE"].min(), rows["SQLDATE"].max()) == (ymd(sqldates[0]), ymd(sqldates[1]))
    counts = dict(rows.group_by("DATEADDED").len().iter_rows())
    assert counts == {utc(stamp): n for stamp, n in dateadded.items()}
    if ids is not None:
        assert (rows["GLOBALEVENTID"].min(), rows["GLOBALEVENTID"].max()) == ids
        # SOURCES.md: "unique and consecutive" within each full file.
        assert rows["GLOBALEVENTID"].n_unique() == ids[1] - ids[0] + 1 == n_rows
    # CAMEO codes keep their leading zeros: root codes run "01".."20", never "1".."9".
    assert rows["EventRootCode"].str.len_bytes().eq(2).all()


def test_real_export_values_are_typed_as_in_the_file():
    """First two rows of 20180326044500.export.CSV, field by field where the type matters."""
    rows = parse_export(fixture_bytes("epournaras-DIAS-GDELT/b61e972/20180326044500.export.CSV")).rows
    first, second = rows.row(0, named=True), rows.row(1, named=True)

    assert first["GLOBALEVENTID"] == 741917022
    assert first["SQLDATE"] == date(2017, 3, 26)
    assert (first["MonthYear"], first["Year"], first["FractionDate"]) == (201703, 2017, 2017.2356)
    assert (first["Actor1Code"], first["Actor2Name"]) == ("BUS", "MICROSOFT")
    assert first["Actor1KnownGroupCode"] is None  # blank field: null, not ""
    assert (first["EventCode"], first["EventBaseCode"], first["EventRootCode"]) == ("071", "071", "07")
    assert (first["QuadClass"], first["GoldsteinScale"], first["NumMentions"]) == (2, 7.4, 5)
    assert first["AvgTone"] == pytest.approx(-0.66953610712577)
    assert (first["ActionGeo_Lat"], first["ActionGeo_Long"], first["ActionGeo_FeatureID"]) == (20.0, 77.0, "IN")
    assert first["DATEADDED"] == datetime(2018, 3, 26, 4, 45, tzinfo=UTC)
    assert first["SOURCEURL"] == "https://yourstory.com/2018/03/flipkart-fy2018-fiscal-fitness/"
    # Row 2 has no Actor2 and an unresolved Actor2 geo (type 0, blank coordinates).
    assert second["Actor2Code"] is None
    assert (second["Actor2Geo_Type"], second["Actor2Geo_Lat"]) == (0, None)
    assert rows.schema["DATEADDED"] == pl.Datetime("us", "UTC")


def test_real_zip_gives_the_same_rows_as_its_csv():
    folder = "narayave-Insight-GDELT-Feed/b412634/"
    archive = fixture_bytes(folder + "20190121220000.export.CSV.zip")
    csv = fixture_bytes(folder + "20190121220000.export.CSV")

    assert is_zip(archive) and not is_zip(csv)
    assert open_gdelt_zip(archive) == ("20190121220000.export.CSV", csv)
    from_zip, from_csv = parse_export(archive), parse_export(csv)
    assert from_zip.rows.height == 1629
    assert from_zip.rows.equals(from_csv.rows)


# --- Real files: mentions --------------------------------------------------------------------

MENTIONS_FIXTURES = [
    ("aamend-spark-gdelt/mentions.csv", ("20150218100000", "20200318104500"), {"20150218230000", "20200318104500"}),
    ("aamend-spark-gdelt/mentionsT.csv", ("20150119003000", "20200318103000"), {"20150218224500", "20200318103000"}),
    ("aamend-spark-gdelt-cae6b57/mentions.csv", ("20170324001500", "20180324180000"), {"20180324180000"}),
]


@pytest.mark.parametrize(
    ("relative", "event_times", "mention_times"), MENTIONS_FIXTURES, ids=[f[0] for f in MENTIONS_FIXTURES]
)
def test_real_mentions_files_parse_completely(relative, event_times, mention_times):
    parsed = parse_mentions(fixture_bytes(relative), source=relative)

    assert parsed.kind == "mentions"
    assert parsed.rows.schema == MENTIONS_SCHEMA
    assert parsed.rejects.height == 0, parsed.rejects
    assert parsed.rows.height == parsed.total_lines == 100
    rows = parsed.rows
    assert (rows["EventTimeDate"].min(), rows["EventTimeDate"].max()) == tuple(map(utc, event_times))
    assert set(rows["MentionTimeDate"].unique()) == {utc(s) for s in mention_times}


def test_real_mentions_values():
    rows = parse_mentions(fixture_bytes("aamend-spark-gdelt/mentions.csv")).rows
    assert rows["GLOBALEVENTID"].n_unique() == 87  # SOURCES.md
    first_mentions = parse_mentions(fixture_bytes("aamend-spark-gdelt-cae6b57/mentions.csv")).rows.filter(
        pl.col("EventTimeDate") == pl.col("MentionTimeDate")
    )
    assert first_mentions.height == 18  # SOURCES.md: "only 18 of the 100 rows are first mentions"

    translated = parse_mentions(fixture_bytes("aamend-spark-gdelt/mentionsT.csv")).rows.row(0, named=True)
    assert translated["GLOBALEVENTID"] == 410108590
    assert translated["EventTimeDate"] == datetime(2015, 2, 18, tzinfo=UTC)
    assert (translated["MentionType"], translated["SentenceID"], translated["ActionCharOffset"]) == (1, 4, 1440)
    assert translated["Actor2CharOffset"] == -1
    assert (translated["Confidence"], translated["MentionDocLen"]) == (100, 1653)
    assert translated["MentionDocTranslationInfo"] == "srclc:spa;eng:GT-SPA 1.0"
    assert translated["Extras"] is None


# --- Real files: the wrong kind of file is refused -------------------------------------------


@pytest.mark.parametrize(
    ("relative", "detected"),
    [
        ("aamend-spark-gdelt-de9c86c/events1.csv", 58),
        ("aamend-spark-gdelt/events1.csv", 58),  # 58 ×60, 57 ×40
        ("reed9999-gdelt-demo/events.csv", 58),  # 58 ×509, 57 ×201
    ],
)
def test_gdelt_1_files_are_refused_naming_gdelt_1(relative, detected):
    with pytest.raises(GdeltFormatError, match=r"GDELT 1\.0 daily events") as caught:
        parse_export(fixture_bytes(relative), source=relative)
    assert (caught.value.detected, caught.value.expected) == (detected, 61)
    assert relative in str(caught.value)


def test_only_57_column_lines_are_named_as_the_v1_backfile():
    v1 = fixture_bytes("aamend-spark-gdelt/events1.csv").splitlines(keepends=True)
    backfile = b"".join(line for line in v1 if line.count(b"\t") == 56)
    assert backfile.count(b"\n") == 40
    with pytest.raises(GdeltFormatError, match=r"GDELT 1\.0 historical backfile"):
        parse_export(backfile)


def test_mentions_given_to_parse_export_is_refused_naming_mentions():
    with pytest.raises(GdeltFormatError, match=r"this is GDELT 2\.0 mentions, not GDELT 2\.0 events export"):
        parse_export(fixture_bytes("aamend-spark-gdelt/mentions.csv"))


def test_export_given_to_parse_mentions_is_refused_naming_the_export():
    with pytest.raises(GdeltFormatError, match=r"this is GDELT 2\.0 events export, not GDELT 2\.0 mentions"):
        parse_mentions(fixture_bytes("aamend-spark-gdelt/events.csv"))


def test_the_text_file_saved_as_a_zip_is_a_corrupt_archive():
    name = "epournaras-DIAS-GDELT/b61e972/20180326191500.export.CSV.zip"
    fake = fixture_bytes(name)
    assert not is_zip(fake)
    with pytest.raises(CorruptArchiveError, match="not a zip archive"):
        open_gdelt_zip(fake)
    with pytest.raises(CorruptArchiveError, match="not a zip archive"):
        parse_export(fake, source=name)
    # Without a zip's name the bytes are taken as CSV: lastupdate lines, not events.
    with pytest.raises(GdeltFormatError, match="no known GDELT format"):
        parse_export(fake)


# --- Synthetic files -------------------------------------------------------------------------


def export_line(event_id: int, **values: str) -> bytes:
    """A made-up, well-formed 61-field export line; keyword arguments replace fields."""
    fields = dict.fromkeys(EXPORT_SCHEMA.names(), "")
    fields.update(
        GLOBALEVENTID=str(event_id),
        SQLDATE="20240101",
        MonthYear="202401",
        Year="2024",
        FractionDate="2024.0027",
        Actor1Code="UKR",
        Actor1Name="KYIV",
        Actor1CountryCode="UKR",
        IsRootEvent="1",
        EventCode="043",
        EventBaseCode="043",
        EventRootCode="04",
        QuadClass="1",
        GoldsteinScale="2.8",
        NumMentions="10",
        NumSources="2",
        NumArticles="10",
        AvgTone="-1.25",
        ActionGeo_Type="4",
        ActionGeo_FullName="Kyiv, Kyyiv, Misto, Ukraine",
        ActionGeo_CountryCode="UP",
        ActionGeo_ADM1Code="UP12",
        ActionGeo_Lat="50.4333",
        ActionGeo_Long="30.5167",
        ActionGeo_FeatureID="-1044367",
        DATEADDED="20240101000000",
        SOURCEURL=f"https://example.org/{event_id}",
    )
    fields.update(values)
    return "\t".join(fields.values()).encode("utf-8")


def mentions_line(event_id: int, **values: str) -> bytes:
    fields = dict.fromkeys(MENTIONS_SCHEMA.names(), "")
    fields.update(
        GLOBALEVENTID=str(event_id),
        EventTimeDate="20231231234500",
        MentionTimeDate="20240101000000",
        MentionType="1",
        MentionSourceName="example.org",
        MentionIdentifier=f"https://example.org/{event_id}",
        SentenceID="3",
        Actor1CharOffset="-1",
        Actor2CharOffset="120",
        ActionCharOffset="98",
        InRawText="1",
        Confidence="50",
        MentionDocLen="2400",
        MentionDocTone="-3.5",
    )
    fields.update(values)
    return "\t".join(fields.values()).encode("utf-8")


def csv(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def make_zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


FIRST_ID = 1_219_500_000


def clean_export(n: int = 10) -> list[bytes]:
    return [export_line(FIRST_ID + i) for i in range(n)]


def assert_one_reject(parsed: ParsedFile, line_number: int, reason: str, raw: bytes, n_lines: int) -> None:
    assert parsed.rejects.rows() == [("<bytes>", line_number, reason, raw, len(raw), hashlib.sha256(raw).hexdigest())]
    assert parsed.total_lines == n_lines
    assert parsed.rows.height == n_lines - 1
    # Every other line is kept, in order.
    expected_ids = [FIRST_ID + i for i in range(n_lines) if i != line_number - 1]
    assert parsed.rows["GLOBALEVENTID"].to_list() == expected_ids


def test_synthetic_clean_export_is_typed():
    parsed = parse_export(csv(clean_export()))
    assert parsed.rows.schema == EXPORT_SCHEMA
    assert parsed.rejects.is_empty() and parsed.total_lines == 10
    row = parsed.rows.row(0, named=True)
    assert (row["EventCode"], row["ActionGeo_FeatureID"], row["ActionGeo_Lat"]) == ("043", "-1044367", 50.4333)
    assert row["DATEADDED"] == datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda line: line[: line.rfind(b"\t")], "field_count:60"),  # last field dropped
        (lambda line: line + b"\tspare", "field_count:62"),
        (lambda line: line.split(b"\t", 5)[0], "field_count:1"),  # cut short after the id
        (lambda line: line.replace(b"KYIV", b"KY\xffIV"), "invalid_utf8"),
        (lambda line: line.replace(b"Kyiv,", b"Ky\xc3("), "invalid_utf8"),  # lead byte, no continuation
        (lambda line: line.replace(b"\t10\t2\t", b"\t1O\t2\t"), "bad_value:NumMentions"),  # letter O
        (lambda line: line.replace(b"\t20240101\t", b"\t20240230\t"), "bad_value:SQLDATE"),  # no Feb 30
        (lambda line: line.replace(b"\t20240101\t", b"\t2024011\t"), "bad_value:SQLDATE"),
        (lambda line: line.replace(b"20240101000000", b"20240101"), "bad_value:DATEADDED"),  # v1 style
        (lambda line: line.replace(b"20240101000000", b"20240101000060"), "bad_value:DATEADDED"),  # second 60
        (lambda line: line.replace(b"20240101000000", b"20240101240000"), "bad_value:DATEADDED"),  # hour 24
        (lambda line: line.replace(b"\t-1.25\t", b"\tminus\t"), "bad_value:AvgTone"),
        (lambda line: line.replace(b"\t4\tKyiv", b"\t400\tKyiv"), "bad_value:ActionGeo_Type"),  # Int8 overflow
        (lambda line: line.replace(b"\t20240101\t202401\t", b"\tyesterday\t2024-1\t"), "bad_value:SQLDATE,MonthYear"),
        (lambda line: line.replace(str(FIRST_ID + 4).encode(), b"", 1), "missing_value:GLOBALEVENTID"),
        (lambda line: line.replace(b"20240101000000", b""), "missing_value:DATEADDED"),
        (lambda line: b"", "empty_line"),
        (lambda line: b"\r", "empty_line"),
    ],
)
def test_one_bad_line_is_rejected_and_the_rest_kept(damage, reason):
    lines = clean_export()
    lines[4] = damage(lines[4])
    assert_one_reject(parse_export(csv(lines)), 5, reason, lines[4], 10)


def test_bad_lines_at_the_edges_of_the_file():
    lines = clean_export()
    lines[0] = lines[0] + b"\tspare"
    lines[9] = lines[9].replace(b"KYIV", b"\xe2\x82")  # truncated 3-byte sequence, last line
    for data in (csv(lines), csv(lines)[:-1]):  # with and without the final newline
        parsed = parse_export(data)
        assert parsed.rejects.select("line_number", "reason", "raw_line").rows() == [
            (1, "field_count:62", lines[0]),
            (10, "invalid_utf8", lines[9]),
        ]
        assert parsed.rows["GLOBALEVENTID"].to_list() == [FIRST_ID + i for i in range(1, 9)]


def test_a_short_and_a_long_line_that_balance_the_tab_total_are_both_rejected():
    # The clean fast path is proved by the TAB total; one missing and one extra field keep that
    # total right, so this is the case the proof must not be fooled by.
    lines = clean_export()
    lines[2] = lines[2][: lines[2].rfind(b"\t")]
    lines[6] = lines[6] + b"\t"
    parsed = parse_export(csv(lines))
    assert parsed.rejects.select("line_number", "reason").rows() == [(3, "field_count:60"), (7, "field_count:62")]
    assert parsed.rows.height == 8


def test_a_long_last_line_without_a_newline_is_caught_even_when_the_tabs_balance():
    # polars lets exactly this line through without raising: the last one, not ended by \n,
    # with one extra empty field. With a short line balancing the TAB total, the clean-file proof
    # would otherwise accept both lines.
    lines = clean_export(5)
    lines[1] = lines[1][: lines[1].rfind(b"\t")]
    data = csv(lines[:4]) + lines[4] + b"\t"
    assert data.count(b"\t") == 60 * 5
    parsed = parse_export(data)
    assert parsed.rejects.select("line_number", "reason").rows() == [(2, "field_count:60"), (5, "field_count:62")]
    assert parsed.rows["GLOBALEVENTID"].to_list() == [FIRST_ID, FIRST_ID + 2, FIRST_ID + 3]


def test_the_reader_gives_one_row_per_line_blank_lines_included():
    # The clean-file proof counts lines by the reader's rows (see lines.plan_read); a reader that
    # skipped blank lines would let one vanish from a file whose TABs otherwise add up.
    schema = {"a": pl.String, "b": pl.String}
    data = b"x\ty\n\n\r\n \nx\ty\n\n\r"
    frame = pl.read_csv(data, has_header=False, separator="\t", quote_char=None, schema=schema)
    assert frame.height == data.count(b"\n") + 1 == 7
    for blank in (b"\n", b"\r\n", b"\n\n"):
        lines = clean_export(3)
        parsed = parse_export(csv(lines) + blank)
        assert parsed.total_lines == 3 + blank.count(b"\n")
        assert set(parsed.rejects["reason"]) == {"empty_line"}


def test_a_damaged_last_line_without_a_newline_is_counted_like_the_others():
    # Damaged files are looked at line by line with TAB and \n positions found by polars; the
    # last line has no \n of its own there.
    lines = clean_export(6)
    lines[1] = lines[1][: lines[1].rfind(b"\t")]
    for last, reason in ((lines[5] + b"\tx\t", "field_count:63"), (lines[5][:30], "field_count:4")):
        parsed = parse_export(csv([*lines[:5], last])[:-1])
        assert parsed.rejects.select("line_number", "reason", "raw_line").rows() == [
            (2, "field_count:60", lines[1]),
            (6, reason, last),
        ]
        assert parsed.rows["GLOBALEVENTID"].to_list() == [FIRST_ID + i for i in (0, 2, 3, 4)]


def test_a_lone_cr_after_the_last_newline_is_an_empty_line():
    lines = clean_export(3)
    parsed = parse_export(csv(lines) + b"\r")
    assert parsed.total_lines == 4
    assert parsed.rejects.select("line_number", "reason", "raw_line").rows() == [(4, "empty_line", b"\r")]
    assert parsed.rows.equals(parse_export(csv(lines)).rows)


def test_a_mentions_line_short_of_its_empty_last_fields_is_rejected():
    # Mentions lines end in two usually empty fields: the read values of a line that lost them
    # look exactly like a full line's, so only its TABs tell.
    lines = [mentions_line(FIRST_ID + i) for i in range(5)]
    short_one, short_two = lines[1][: lines[1].rfind(b"\t")], lines[3][: lines[3].rfind(b"\t", 0, -1)]
    assert short_one.endswith(b"-3.5\t") and short_two.endswith(b"-3.5")
    parsed = parse_mentions(csv([lines[0], short_one, lines[2], short_two, lines[4] + b"\t"]))
    assert parsed.rejects.select("line_number", "reason").rows() == [
        (2, "field_count:15"),
        (4, "field_count:14"),
        (5, "field_count:17"),
    ]
    assert parsed.rows["GLOBALEVENTID"].to_list() == [FIRST_ID, FIRST_ID + 2]


@pytest.mark.parametrize("seed", range(3))
def test_line_positions_found_by_polars_match_a_plain_split(seed):
    # The damaged-file path counts TABs per line and finds line ends on a byte view of the file
    # instead of splitting it in Python; both must see the same lines.
    rng = random.Random(seed)
    for _ in range(300):
        data = bytes(rng.choice(b"ab\t\t\n\r") for _ in range(rng.randrange(40)))
        lines = data.split(b"\n") if data else []  # the empty string after a final \n is no line
        if data.endswith(b"\n"):
            lines.pop()
        view = lines_module._byte_view(data)
        ends = lines_module._line_ends(view, data)
        assert lines_module._line_tabs(view, data).to_list() == [line.count(b"\t") for line in lines]
        assert [data[lines_module._line_start(ends, i) : end] for i, end in enumerate(ends)] == lines
        assert lines_module._count_byte(data, b"\t") == data.count(b"\t")


def test_the_utf8_check_agrees_with_python():
    samples = [
        b"",
        b"plain",
        "Kyïv, Київ".encode(),
        b"\xef\xbb\xbfBOM",
        b"\xf0\x9f\x98\x80",  # valid
        b"\xff",
        b"\xc3(",
        b"\xe2\x82",
        b"\xc0\xaf",
        b"\xe0\x80\xaf",  # stray, cut, overlong
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80",
        b"\x80",  # surrogate, too big
    ]
    for sample in samples:
        for data in (sample, b"a\tb\n" + sample + b"\n", sample * 3):
            try:
                data.decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            assert lines_module.is_utf8(data) is valid, data


def test_several_kinds_of_rejects_in_one_file_keep_their_line_numbers():
    lines = clean_export(12)
    lines[1] = b""
    lines[3] = lines[3].replace(b"UKR", b"\xff")
    lines[5] = lines[5].replace(b"\t10\t2\t", b"\tten\t2\t")
    lines[8] = lines[8] + b"\tx\ty"
    parsed = parse_export(csv(lines))
    assert parsed.rejects.select("line_number", "reason").rows() == [
        (2, "empty_line"),
        (4, "invalid_utf8"),
        (6, "bad_value:NumMentions"),
        (9, "field_count:63"),
    ]
    assert parsed.rejects["raw_line"].to_list() == [lines[1], lines[3], lines[5], lines[8]]
    assert parsed.rows.height + parsed.rejects.height == parsed.total_lines == 12


def test_the_slow_path_reads_good_lines_exactly_as_the_fast_path_does():
    lines = clean_export(20)
    clean = parse_export(csv(lines))
    damaged = parse_export(csv([*lines, b"junk"]))
    assert damaged.rejects["reason"].to_list() == ["field_count:1"]
    assert damaged.rows.equals(clean.rows)


def test_a_few_lines_of_another_format_do_not_refuse_the_file():
    lines = clean_export(10)
    v1_like = b"\t".join([b"1"] * 58)
    parsed = parse_export(csv(lines[:5] + [v1_like] * 4 + lines[5:]))
    assert parsed.rejects["reason"].to_list() == ["field_count:58"] * 4
    assert parsed.rows.height == 10


def test_a_file_mostly_of_another_format_is_refused():
    v1_like = b"\t".join([b"1"] * 58)
    with pytest.raises(
        GdeltFormatError, match=r"GDELT 1\.0 daily events \(58 columns\), not GDELT 2\.0 events export \(61 columns\)"
    ):
        parse_export(csv(clean_export(5) + [v1_like] * 5))  # a tie is not a majority for 61


def test_final_newline_is_optional_and_a_trailing_blank_line_is_reported():
    lines = clean_export(3)
    with_newline = parse_export(csv(lines))
    without = parse_export(csv(lines)[:-1])
    assert without.rows.equals(with_newline.rows) and without.total_lines == 3
    blank_at_end = parse_export(csv(lines) + b"\n")
    assert blank_at_end.rejects.select("line_number", "reason").rows() == [(4, "empty_line")]
    assert blank_at_end.rows.equals(with_newline.rows)


def test_crlf_line_endings_are_tolerated_and_kept_in_raw_lines():
    lines = clean_export(4)
    lf = parse_export(csv(lines))
    crlf_lines = [line + b"\r" for line in lines]
    crlf = parse_export(csv(crlf_lines))
    assert crlf.rows.equals(lf.rows)
    assert crlf.rows["SOURCEURL"][0] == f"https://example.org/{FIRST_ID}"  # no "\r" glued on
    crlf_lines[1] = crlf_lines[1].replace(b"\t-1.25\t", b"\t?\t")
    damaged = parse_export(csv(crlf_lines))
    assert damaged.rejects.select("line_number", "reason", "raw_line").rows() == [
        (2, "bad_value:AvgTone", crlf_lines[1])
    ]


def test_quotes_are_data():
    line = export_line(FIRST_ID, Actor1Name='"KYIV', SOURCEURL='https://example.org/"quoted"')
    row = parse_export(csv([line])).rows.row(0, named=True)
    assert (row["Actor1Name"], row["SOURCEURL"]) == ('"KYIV', 'https://example.org/"quoted"')


def test_non_ascii_text_survives():
    line = export_line(FIRST_ID, ActionGeo_FullName="Kyïv, Київ", Actor1Name="SÃO PAULO")
    row = parse_export(csv([line])).rows.row(0, named=True)
    assert (row["ActionGeo_FullName"], row["Actor1Name"]) == ("Kyïv, Київ", "SÃO PAULO")


def test_empty_input_gives_an_empty_typed_result():
    for data in (b"", make_zip({"20240101000000.export.CSV": b""})):
        parsed = parse_export(data, source="empty")
        assert parsed.rows.schema == EXPORT_SCHEMA and parsed.rows.is_empty()
        assert parsed.rejects.schema == REJECTS_SCHEMA and parsed.rejects.is_empty()
        assert parsed.total_lines == 0
    assert parse_mentions(b"").rows.schema == MENTIONS_SCHEMA


def test_only_a_newline_is_one_empty_line():
    parsed = parse_export(b"\n")
    assert parsed.total_lines == 1
    assert parsed.rejects.select("line_number", "reason", "raw_line").rows() == [(1, "empty_line", b"")]


def test_rejects_name_the_source():
    lines = clean_export(3)
    lines[1] = b"bad"
    name = "gdeltv2/20240101000000.export.CSV.zip"
    parsed = parse_export(make_zip({"20240101000000.export.CSV": csv(lines)}), source=name)
    assert parsed.rejects.select("file", "line_number").rows() == [(name, 2)]


def test_synthetic_mentions_with_bad_lines():
    lines = [mentions_line(FIRST_ID + i) for i in range(6)]
    lines[1] = lines[1].replace(b"20231231234500", b"2023123123450")
    lines[2] = lines[2].replace(b"\t50\t", b"\t50%\t")
    lines[4] = lines[4] + b"\t"
    parsed = parse_mentions(csv(lines))
    assert parsed.rejects.select("line_number", "reason").rows() == [
        (2, "bad_value:EventTimeDate"),
        (3, "bad_value:Confidence"),
        (5, "field_count:17"),
    ]
    assert parsed.rows["GLOBALEVENTID"].to_list() == [FIRST_ID, FIRST_ID + 3, FIRST_ID + 5]
    row = parsed.rows.row(0, named=True)
    assert row["EventTimeDate"] == datetime(2023, 12, 31, 23, 45, tzinfo=UTC)
    assert (row["Actor1CharOffset"], row["MentionDocTranslationInfo"], row["Extras"]) == (-1, None, None)


def test_synthetic_zip_is_opened_before_parsing():
    lines = clean_export(5)
    lines[3] = b"x\ty"
    archive = make_zip({"20240101000000.export.CSV": csv(lines)})
    parsed = parse_export(archive)
    assert parsed.rows.height == 4
    assert parsed.rejects.select("line_number", "reason").rows() == [(4, "field_count:2")]


def test_parsed_file_refuses_counts_that_do_not_add_up():
    with pytest.raises(ValueError, match="1 lines"):
        ParsedFile("export", "x", pl.DataFrame(schema=EXPORT_SCHEMA), pl.DataFrame(schema=REJECTS_SCHEMA), 1)


def test_numbers_may_have_leading_spaces_and_read_the_same_on_every_path():
    # polars' CSV number reader skips leading spaces, and a field of spaces is empty; the text
    # path (taken when a number is refused) must agree, or a line's fate would depend on the
    # other lines of its file.
    spaced = export_line(
        FIRST_ID + 1, NumMentions=" 10", GoldsteinScale="  2.8", NumSources="   ", Actor1Geo_Lat=" -3.5"
    )
    clean = parse_export(csv([export_line(FIRST_ID), spaced]))
    assert clean.rejects.is_empty()
    row = clean.rows.row(1, named=True)
    assert (row["NumMentions"], row["GoldsteinScale"], row["NumSources"], row["Actor1Geo_Lat"]) == (10, 2.8, None, -3.5)

    bad_number = export_line(FIRST_ID + 2, NumArticles="ten")
    short = export_line(FIRST_ID + 3)[:40]
    for lines in ([export_line(FIRST_ID), spaced, bad_number], [export_line(FIRST_ID), spaced, short]):
        parsed = parse_export(csv(lines))
        assert parsed.rows.head(2).equals(clean.rows)
        assert parsed.rejects.height == 1

    # Trailing spaces are not skipped, and dates get no leeway at all.
    for damage, reason in (
        ({"NumMentions": "10 "}, "bad_value:NumMentions"),
        ({"SQLDATE": " 20240101"}, "bad_value:SQLDATE"),
        ({"GLOBALEVENTID": "  "}, "missing_value:GLOBALEVENTID"),
    ):
        lines = [export_line(FIRST_ID + i) for i in range(3)]
        lines[1] = export_line(FIRST_ID + 1, **damage)
        assert parse_export(csv(lines)).rejects.select("line_number", "reason").rows() == [(2, reason)]


def many_files() -> list[tuple[bytes, str]]:
    """Files that take every path through the parser, to be parsed together and alone."""
    lines = clean_export(6)
    bom = b"\xef\xbb\xbf"
    files = {
        "clean": csv(lines),
        "no final newline": csv(lines)[:-1],
        "crlf, no final newline": csv([line + b"\r" for line in lines])[:-1],
        "empty": b"",
        "byte order mark": bom + csv(lines),
        "two byte order marks": bom + bom + csv(lines),
        "short line": csv([*lines[:2], lines[2][:50], *lines[3:]]),
        "undecodable line": csv([*lines[:3], lines[3].replace(b"KYIV", b"K\xffIV"), *lines[4:]]),
        "undecodable first line": bom + csv([lines[0].replace(b"KYIV", b"K\xffIV"), *lines[1:]]),
        "long and short line": csv([lines[0] + b"\tx", lines[1][: lines[1].rfind(b"\t")], *lines[2:]]),
        "bad number": csv([*lines[:4], export_line(FIRST_ID + 4, NumSources="2x"), lines[5]]),
        "spaced number": csv([*lines[:4], export_line(FIRST_ID + 4, NumSources=" 2"), lines[5]]),
        "bad date": csv([lines[0], export_line(FIRST_ID + 1, SQLDATE="2024011"), *lines[2:]]),
        "near-miss timestamp": csv([*lines[:5], export_line(FIRST_ID + 5, DATEADDED="20240101000060")]),
        "missing key": csv([export_line(FIRST_ID, GLOBALEVENTID=""), *lines[1:]]),
        "blank lines": b"\n" + csv(lines[:3]) + b"\n" + csv(lines[3:]) + b"\r\n",
        "zip": make_zip({"20240101000000.export.CSV": csv(lines)}),
    }
    return [(data, name) for name, data in files.items()]


def outcome(parse) -> tuple:
    try:
        parsed = parse()
    except Exception as exc:
        return (type(exc), str(exc))
    return (parsed.source, parsed.rows.rows(), parsed.rejects.rows(), parsed.total_lines)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("batch_files", [1, 4, 5, 100])
def test_parse_files_gives_each_file_what_it_gets_alone(monkeypatch, workers, batch_files):
    monkeypatch.setattr("pipeline.gdelt.parse.BATCH_FILES", batch_files)
    items = many_files()
    alone = [outcome(lambda data=data, source=source: parse_export(data, source)) for data, source in items]
    together = list(parse_files(iter(items), "export", workers=workers))
    assert [outcome(lambda parsed=parsed: parsed) for parsed in together] == alone
    # The files were damaged as meant: the paths were all taken.
    rejects = {parsed.source: parsed.rejects["reason"].to_list() for parsed in together}
    assert rejects["byte order mark"] == [] and rejects["bad number"] == ["bad_value:NumSources"]
    assert rejects["long and short line"] == ["field_count:62", "field_count:60"]
    assert rejects["undecodable first line"] == ["invalid_utf8"]
    assert rejects["near-miss timestamp"] == ["bad_value:DATEADDED"]
    assert rejects["blank lines"] == ["empty_line"] * 3
    assert together[0].rows.equals(parse_export(csv(clean_export(6))).rows)


@pytest.mark.parametrize("workers", [1, 2])
def test_parse_files_raises_a_files_error_when_its_turn_comes(monkeypatch, workers):
    monkeypatch.setattr("pipeline.gdelt.parse.BATCH_FILES", 2)
    good = (csv(clean_export(3)), "good")
    v1 = (csv([b"\t".join([b"1"] * 58)] * 3), "v1")
    items = [good, good, good, (b"not a zip", "broken.zip"), good, v1, good]
    parsed = parse_files(iter(items), "export", workers=workers)
    assert [next(parsed).source for _ in range(3)] == ["good"] * 3
    with pytest.raises(CorruptArchiveError, match="not a zip archive"):
        next(parsed)
    after = parse_files(iter(items[4:]), "export", workers=workers)
    assert next(after).source == "good"
    with pytest.raises(GdeltFormatError, match=r"GDELT 1\.0 daily events"):
        next(after)


@pytest.mark.parametrize("workers", [1, 2])
def test_parse_files_yields_the_files_it_got_before_their_source_failed(monkeypatch, workers):
    monkeypatch.setattr("pipeline.gdelt.parse.BATCH_FILES", 4)

    def items():
        for name in ("a", "b", "c", "d", "e"):
            yield csv(clean_export(2)), name
        raise OSError("disk gone")

    parsed = parse_files(items(), "export", workers=workers)
    assert [next(parsed).source for _ in range(5)] == ["a", "b", "c", "d", "e"]
    with pytest.raises(OSError, match="disk gone"):
        next(parsed)


# --- Files parsed a chunk at a time ----------------------------------------------------------


def chunk_boundary_files() -> list[tuple[bytes, str]]:
    """Files whose line rules and whole-file checks a chunk could see otherwise than the file."""
    lines = clean_export(12)
    sixty = [line[: line.rfind(b"\t")] for line in lines]
    bom = b"\xef\xbb\xbf"
    files = {
        # A byte order mark inside a file is data (here a bad GLOBALEVENTID), where a chunk
        # starts too; the reader drops it only when it starts what the file gives the reader.
        "mark starting a later line": csv([*lines[:6], bom + lines[6], *lines[7:]]),
        "mark after rejected lines": csv([b"junk", b"", bom + lines[0], *lines[1:]]),
        "mark, crlf": bom + csv([line + b"\r" for line in lines]),
        # The format is the file's majority, whatever a chunk's is.
        "sixty columns at the end": csv([*lines[:7], *sixty[:5]]),
        "sixty columns in most lines": csv([*lines[:5], *sixty[:6]]),
        "blank and undecodable lines": csv(
            [lines[0], b"", b"\r", lines[1].replace(b"KYIV", b"K\xffIV"), *lines[2:], b"\r"]
        )[:-1],
        # The line count is the file's: dense at one end, plausible overall or not.
        "blank lines first, plausible": b"\n" * 980 + csv(lines),
        "blank lines last, too many": csv(lines) + b"\n" * 1100,
        "blank lines first, too many": b"\n" * 1100 + csv(lines),
    }
    items = list(many_files())
    for name, data in files.items():
        items += [(data, name), (make_zip({"x.export.CSV": data}), f"{name}.zip")]
    return items


@pytest.mark.parametrize(("chunk_bytes", "piece_bytes"), [(50, 7), (700, 5), (2000, 333)])
def test_a_file_parsed_in_chunks_gives_what_it_gives_whole(monkeypatch, chunk_bytes, piece_bytes):
    items = chunk_boundary_files()
    whole = [outcome(lambda data=data, source=source: parse_export(data, source)) for data, source in items]
    assert sum(isinstance(result[0], type) for result in whole) == 6  # the refusals are among them
    reads = []
    monkeypatch.setattr(
        convert_module, "_csv", lambda csv, schema, read=convert_module._csv: reads.append(1) or read(csv, schema)
    )
    monkeypatch.setattr(parse_module, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr("pipeline.gdelt.archive._CHUNK_BYTES", piece_bytes)
    chunked = [outcome(lambda data=data, source=source: parse_export(data, source)) for data, source in items]
    assert chunked == whole
    assert len(reads) > len(items)  # the files were read in pieces
    together = list(parse_files(iter(items), "export", workers=2, refused="yield"))
    assert [outcome(lambda parsed=parsed: _raise(parsed)) for parsed in together] == whole


def _raise(parsed):
    if isinstance(parsed, Exception):
        raise parsed
    return parsed


def test_a_file_of_many_chunks_gives_the_same_frames(monkeypatch):
    data = csv([export_line(FIRST_ID + i, NumSources="x" if i % 97 == 0 else "2") for i in range(3000)])
    whole = parse_export(data)
    monkeypatch.setattr(parse_module, "CHUNK_BYTES", 10_000)
    chunked = parse_export(data)
    # Values, order and types; the row groups a parquet writer makes may differ (they follow
    # the frame's chunks, as they followed pl.read_csv's for a whole file).
    assert chunked.rows.equals(whole.rows) and chunked.rejects.equals(whole.rejects)
    assert chunked.rows.schema == EXPORT_SCHEMA and chunked.rejects.height == 31


STREAM_IN_A_FRESH_PROCESS = """
import io, json, sys, zipfile
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]) / "bench"))
from common import own_peak_rss_mib
from pipeline.gdelt.parse import parse_files
row, long_line, repeats = sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])

def member(repeats):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.export.CSV", "w") as member:  # written a piece at a time
            for _ in range(repeats):
                member.write(row + b"\\n" + row + b"\\n" + b"A" * long_line + b"\\n")
    return buffer.getvalue(), archive.infolist()[0].file_size

data, size = member(repeats)
parse = lambda data: parse_files([(data, "x.export.CSV.zip")], "export", workers=1, max_member_bytes=2 * size)
list(parse(member(1)[0]))  # what a first parse sets up (polars' thread pool and so on) is not the member's
before = own_peak_rss_mib()
[parsed] = parse(data)
print(json.dumps({"before": before, "after": own_peak_rss_mib(), "size": size, "rows": parsed.rows.height,
                  "rejects": parsed.rejects.height, "lengths": parsed.rejects["raw_length"].unique().to_list()}))
"""


def test_a_member_is_parsed_in_memory_well_below_its_size():
    from pipeline.gdelt.parse import CHUNK_BYTES

    # A 128 MiB member of 1 MiB lines (rejected, stored truncated) between real rows: 32 chunks,
    # and little to keep of them.
    long_line, repeats = 2**20, 128
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            STREAM_IN_A_FRESH_PROCESS,
            str(ROOT),
            export_line(FIRST_ID).decode(),
            str(long_line),
            str(repeats),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["size"] > 30 * CHUNK_BYTES
    assert (report["rows"], report["rejects"], report["lengths"]) == (2 * repeats, repeats, [long_line])
    extra = report["after"] - report["before"]
    # Held whole, the member alone would add its 128 MiB (the whole-buffer parse added ~400 MiB).
    assert extra < report["size"] / 2**20 / 4, f"parsing a {report['size']:,}-byte member added {extra:.0f} MiB"


# --- Zip archives ----------------------------------------------------------------------------


def test_is_zip_checks_the_signature():
    assert is_zip(make_zip({"a": b"1"}))
    assert is_zip(make_zip({}))  # an empty archive starts with its end record
    assert not is_zip(b"")
    assert not is_zip(b"PK")
    assert not is_zip(csv(clean_export(1)))


def test_a_single_member_zip_opens():
    assert open_gdelt_zip(make_zip({"x.export.CSV": b"abc\n"})) == ("x.export.CSV", b"abc\n")
    assert open_gdelt_zip(make_zip({"x.export.CSV": b"abc\n"}, zipfile.ZIP_STORED)) == ("x.export.CSV", b"abc\n")


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({}, "holds exactly one member, this one holds 0"),
        ({"a.CSV": b"1", "b.CSV": b"2"}, r"holds exactly one member, this one holds 2: \['a.CSV', 'b.CSV'\]"),
        ({"folder/": b""}, "is a directory"),
    ],
)
def test_zips_without_exactly_one_file_are_refused(members, message):
    with pytest.raises(CorruptArchiveError, match=message):
        open_gdelt_zip(make_zip(members))


def test_truncated_zip_is_refused():
    archive = make_zip({"a.CSV": csv(clean_export(50))})
    for cut in (len(archive) // 2, len(archive) - 10, 30):
        with pytest.raises(CorruptArchiveError, match="truncated or damaged zip archive"):
            open_gdelt_zip(archive[:cut])


def test_crc_mismatch_is_refused():
    archive = bytearray(make_zip({"a.CSV": b"hello gdelt\n" * 10}, zipfile.ZIP_STORED))
    at = archive.index(b"hello")
    archive[at] = ord("j")
    with pytest.raises(CorruptArchiveError, match="Bad CRC-32"):
        open_gdelt_zip(bytes(archive))


def test_damaged_deflate_data_is_refused():
    archive = bytearray(make_zip({"a.CSV": csv(clean_export(50))}))
    data_start = archive.index(b"a.CSV") + len(b"a.CSV")
    for offset in range(10, 40):
        archive[data_start + offset] ^= 0xFF
    with pytest.raises(CorruptArchiveError, match=r"member 'a.CSV'"):
        open_gdelt_zip(bytes(archive))


def test_declared_size_above_the_cap_is_refused_before_inflating():
    bomb = make_zip({"bomb.CSV": b"\0" * (4 * 2**20)})
    assert len(bomb) < 10_000  # highly compressible: the shape of a zip bomb
    with pytest.raises(CorruptArchiveError, match=r"declares 4,194,304 bytes uncompressed, above the cap of 1,048,576"):
        open_gdelt_zip(bomb, max_uncompressed_bytes=2**20)
    assert open_gdelt_zip(bomb, max_uncompressed_bytes=4 * 2**20)[1] == b"\0" * (4 * 2**20)


def test_understated_size_does_not_get_past_the_checks():
    # A bomb that lies about its size in the central directory: it must still be refused.
    bomb = bytearray(make_zip({"bomb.CSV": b"\0" * (3 * 2**20)}))
    central = bomb.index(b"PK\x01\x02")
    bomb[central + 24 : central + 28] = struct.pack("<I", 1000)  # uncompressed size field
    with pytest.raises(CorruptArchiveError, match=r"bomb.CSV"):
        open_gdelt_zip(bytes(bomb), max_uncompressed_bytes=2**20)


def test_inflating_past_the_cap_is_stopped_whatever_the_header_says(monkeypatch):
    # zipfile itself stops at the declared size today; this stands in for a reader that does not,
    # to show the running count alone keeps the cap.
    archive = make_zip({"a.CSV": b"small\n"})
    reads: list[int] = []

    class Oversized(io.BytesIO):
        def read(self, size: int = -1) -> bytes:
            reads.append(size)
            return super().read(size)

    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, member, *a, **k: Oversized(b"x" * (3 * 2**20)))
    with pytest.raises(CorruptArchiveError, match="inflates past the cap of 2,097,152 bytes"):
        open_gdelt_zip(archive, max_uncompressed_bytes=2 * 2**20)
    # Bounded reads, and it stopped at the first one that crossed the cap.
    assert all(0 < size <= 2**20 for size in reads)
    assert sum(reads) - reads[-1] <= 2 * 2**20 < sum(reads)


def test_text_saved_as_a_zip_is_refused_without_a_fixture():
    lastupdate = b"180505 3a478f464cb1e80db45270c6fe1787e2 http://data.gdeltproject.org/gdeltv2/x.export.CSV.zip\n"
    with pytest.raises(CorruptArchiveError, match=r"not a zip archive \(94 bytes starting b'180505 "):
        open_gdelt_zip(lastupdate)


def test_a_long_rejected_line_is_stored_as_4_kib_its_length_and_its_sha256():
    lines = clean_export(5)
    lines[2] = b"\xff" * 10_000 + b"\t" * 60  # undecodable, 61 fields
    lines[3] = b"B" * 20_000  # one field
    parsed = parse_export(csv(lines))
    assert parsed.rows.height == 3
    assert parsed.rejects.rows() == [
        ("<bytes>", 3, "invalid_utf8", lines[2][:4096], len(lines[2]), hashlib.sha256(lines[2]).hexdigest()),
        ("<bytes>", 4, "field_count:1", lines[3][:4096], 20_000, hashlib.sha256(lines[3]).hexdigest()),
    ]


def test_a_file_of_far_more_lines_than_rows_could_make_is_refused_as_a_whole():
    # 2,000 blank lines and one row: 2,001 lines in ~2.2 KB, under 2 bytes a line.
    with pytest.raises(refusals_module.ImplausibleLinesError, match=r"2,001 lines in .* at least 76 bytes"):
        parse_export(csv(clean_export(1) + [b""] * 2000))
    # Up to a thousand lines are never refused for their count: blank lines stay rejects.
    parsed = parse_export(csv(clean_export(1) + [b""] * 998))
    assert (parsed.rows.height, parsed.rejects.height) == (1, 998)
    # A mentions row can be shorter: its own bound applies.
    with pytest.raises(refusals_module.ImplausibleLinesError, match="at least 45 bytes"):
        parse_mentions(b"\n" * 1001)


def test_parse_files_can_yield_a_refused_file_in_its_place_and_go_on():
    good, sixty = csv(clean_export(3)), csv([line.rsplit(b"\t", 1)[0] for line in clean_export(3)])
    items = [(good, "a"), (sixty, "b"), (make_zip({"c.CSV": good}), "c.zip")]
    with pytest.raises(GdeltFormatError):
        list(parse_files(items, "export", workers=1))
    out = list(parse_files(items, "export", workers=2, refused="yield", max_member_bytes=2**20))
    assert [type(o).__name__ for o in out] == ["ParsedFile", "GdeltFormatError", "ParsedFile"]
    big = make_zip({"d.CSV": good * 200})
    [refused] = parse_files([(big, "d.zip")], "export", refused="yield", max_member_bytes=len(good) * 100)
    assert isinstance(refused, CorruptArchiveError) and "above the cap" in str(refused)


def test_a_zip_is_verified_from_disk_one_chunk_at_a_time(tmp_path):
    import tracemalloc

    from pipeline.gdelt.archive import verify_gdelt_zip

    member = b"x" * (24 * 2**20)
    path = tmp_path / "a.export.CSV.zip"
    path.write_bytes(make_zip({"a.export.CSV": member}))
    tracemalloc.start()
    try:
        assert verify_gdelt_zip(path, max_uncompressed_bytes=len(member)) == len(member)
        _, verify_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        assert open_gdelt_zip(path.read_bytes(), max_uncompressed_bytes=len(member))[1] == member
        _, open_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert verify_peak < 6 * 2**20  # a few 1 MiB chunks, not the 24 MiB member
    assert open_peak < 1.5 * len(member)  # one buffer of the member (plus its growth slack), not two
    with pytest.raises(CorruptArchiveError, match="above the cap"):
        verify_gdelt_zip(path, max_uncompressed_bytes=len(member) - 1)
    path.write_bytes(b"180505 3a478f464cb1e80db45270c6fe1787e2 http://x/x.export.CSV.zip\n")
    with pytest.raises(CorruptArchiveError, match="not a zip archive"):
        verify_gdelt_zip(path)
