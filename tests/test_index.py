"""GDELT's index files: parsing real ones, gap reports, and the incremental master-list refresh."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from pipeline.gdelt.index import GdeltIndex, day_region, parse_index, slot_gaps
from pipeline.http import make_session
from pipeline.storage import DataLayout

from .conftest import shared_fixture
from .settings_builder import make_settings

UTC = UTC


def test_real_master_list_parses_and_reports_its_gaps():
    table = parse_index(shared_fixture("gdelt/linwoodc3-gdeltPyR-4f45d44/masterfilelist.first1000.txt").read_bytes())
    assert table.entries.height == 1000 and table.bad_lines.height == 0
    first = table.entries.row(0, named=True)
    assert (first["size"], first["kind"], first["name"]) == (150383, "export", "20150218230000.export.CSV.zip")
    assert first["md5"].startswith("297a16b4")
    gaps = slot_gaps(table.entries, datetime(2015, 2, 18, 23, tzinfo=UTC), datetime(2015, 2, 22, 12, tzinfo=UTC))
    expected = ["07:00", "07:30", "08:15", "08:30", "08:45", "09:00", "09:15", "10:00"]
    assert [f"{s:%H:%M}" for s in gaps["slot"]] == expected
    assert all(s.date() == date(2015, 2, 19) for s in gaps["slot"])
    # The near-empty file around the outage is listed, not a gap.
    tiny = table.entries.filter(table.entries["name"] == "20150219071500.export.CSV.zip")
    assert tiny["size"].to_list() == [401]


def test_real_lastupdate_parses():
    table = parse_index(shared_fixture("gdelt/epournaras-DIAS-GDELT/HEAD/lastupdate.txt").read_bytes())
    assert table.entries["kind"].to_list() == ["export", "mentions", "gkg"]
    assert set(table.entries["slot"].to_list()) == {datetime(2018, 3, 28, 5, 0, tzinfo=UTC)}


def test_malformed_lines_are_reported_not_dropped():
    data = (
        b"12 0123456789abcdef0123456789abcdef http://x/gdeltv2/20150101000000.export.CSV.zip\n"
        b"garbage line\n"
        b"12 0123456789abcdef0123456789abcdef http://x/gdeltv2/20151301000000.export.CSV.zip\n"
        b"\n"
    )
    table = parse_index(data)
    assert table.entries.height == 1
    assert table.bad_lines["line_number"].to_list() == [2, 3]


def test_day_region_finds_every_line_of_a_day():
    data = shared_fixture("gdelt/linwoodc3-gdeltPyR-4f45d44/masterfilelist.first1000.txt").read_bytes()
    region, first_line = day_region(data, date(2015, 2, 20))
    entries = parse_index(region, first_line).entries
    full = parse_index(data).entries
    assert entries.height == full.filter(full["slot"].dt.date() == date(2015, 2, 20)).height
    assert first_line > 1
    assert day_region(data, date(2016, 1, 1)) == (b"", 1)


def _index(tmp_path: Path, base_url: str) -> GdeltIndex:
    settings = make_settings(
        data_dir=tmp_path / "data", gdelt_base_url=base_url, backoff_base_s=0.01, backoff_max_s=0.05
    )
    return GdeltIndex(
        DataLayout(settings.dataset.data_dir), settings.network, settings.gdelt, make_session(settings.network)
    )


def _line(i: int) -> str:
    return f"{1000 + i} {i:032x} http://data.gdeltproject.org/gdeltv2/2024010{1 + i // 96}{(i % 96) // 4:02d}{(i % 4) * 15:02d}00.export.CSV.zip\n"


@pytest.fixture
def index_server(tmp_path):
    from testbed.serve import MirrorServer

    root = tmp_path / "srv"
    (root / "gdeltv2").mkdir(parents=True)
    (root / "gdeltv2" / "lastupdate.txt").write_text(_line(0))
    with MirrorServer(root) as server:
        yield server, root / "gdeltv2" / "masterfilelist.txt"


def test_master_list_refresh_is_incremental(tmp_path, index_server):
    server, served = index_server
    served.write_text("".join(_line(i) for i in range(200)))
    index = _index(tmp_path, server.base_url)
    assert index.refresh().mode == "full"
    served.write_text("".join(_line(i) for i in range(205)))
    result = index.refresh()
    assert result.mode == "range"
    assert result.bytes_transferred < 4096 + 5 * len(_line(0)) + 1  # overlap + the 5 new lines
    assert index.master_path.read_bytes() == served.read_bytes()
    assert index.refresh().mode == "unchanged"


def test_master_list_refresh_recovers_from_rewrite_and_torn_line(tmp_path, index_server):
    server, served = index_server
    served.write_text("".join(_line(i) for i in range(200)))
    index = _index(tmp_path, server.base_url)
    index.refresh()
    # A crash mid-append leaves half a line: it is cut and fetched again.
    with open(index.master_path, "ab") as fh:
        fh.write(b"1234 abc")
    served.write_text("".join(_line(i) for i in range(201)))
    assert index.refresh().mode == "range"
    assert index.master_path.read_bytes() == served.read_bytes()
    # The server's list changed under us (not an append): download it whole.
    served.write_text("".join(_line(i) for i in range(1, 150)))
    assert index.refresh().mode == "full"
    assert index.master_path.read_bytes() == served.read_bytes()


def test_unreachable_index_falls_back_to_cache(tmp_path, index_server):
    server, served = index_server
    served.write_text("".join(_line(i) for i in range(200)))
    index = _index(tmp_path, server.base_url)
    index.refresh()
    server.faults.add(match="masterfilelist", fault="503")
    result = index.refresh()
    assert result.mode == "cached" and "503" in result.error
    fresh = _index(tmp_path / "other", server.base_url)
    with pytest.raises(Exception, match="503"):
        fresh.refresh()  # no copy to fall back on: a clear error, not an empty day
