"""The generated GDELT mirror (testbed.generate) and its HTTP server (testbed.serve).

The generator is the fixture source of every other test, so its promises are checked here against
the files themselves: determinism, a manifest that tells the truth, and GDELT-like content.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import time
import zipfile
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path

import polars as pl
import pytest
import requests

from pipeline.gdelt.schema import EXPORT_SCHEMA, MENTIONS_SCHEMA
from testbed.generate import generate_mirror
from testbed.serve import MirrorServer

DAY = date(2024, 1, 1)
INDEX_LINE = re.compile(
    r"^(\d+) ([0-9a-f]{32}) http://data\.gdeltproject\.org/gdeltv2/((\d{14})\.(export|mentions)\.CSV\.zip)$"
)


def member(path: Path) -> bytes:
    """The CSV inside a mirror zip, after checking the zip's shape (one member, named after the
    zip, deflated, stamped with the slot time)."""
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == [path.name.removesuffix(".zip")]
        assert infos[0].compress_type == zipfile.ZIP_DEFLATED
        assert datetime(*infos[0].date_time, tzinfo=UTC).strftime("%Y%m%d%H%M%S") == path.name[:14]
        return zf.read(infos[0])


def split_lines(data: bytes, n_fields: int) -> tuple[list[bytes], Counter]:
    """Valid lines, and malformed ones counted by reason, as a correct parser sees them."""
    assert data == b"" or data.endswith(b"\n")
    valid, bad = [], Counter()
    for line in data.split(b"\n")[:-1]:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad["invalid_utf8"] += 1
            continue
        if line.count(b"\t") != n_fields - 1:
            bad["field_count"] += 1
            continue
        valid.append(line)
    return valid, bad


def frame(lines: list[bytes], columns) -> pl.DataFrame:
    names = list(columns)
    if not lines:
        return pl.DataFrame(schema=dict.fromkeys(names, pl.String))
    return pl.read_csv(
        b"\n".join(lines) + b"\n",
        separator="\t",
        has_header=False,
        quote_char=None,
        new_columns=names,
        schema_overrides=dict.fromkeys(names, pl.String),
        infer_schema=False,
    )


# --- generator -----------------------------------------------------------------------------------


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_arguments_give_identical_bytes(tmp_path):
    a = generate_mirror(tmp_path / "a", DAY, DAY, seed=3, slots=5)
    b = generate_mirror(tmp_path / "b", DAY, DAY, seed=3, slots=5)
    assert a == b
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    other = generate_mirror(tmp_path / "c", DAY, DAY, seed=4, slots=5)
    assert other["slots"][0]["export"]["md5"] != a["slots"][0]["export"]["md5"]


def test_a_shorter_run_is_a_prefix_and_stale_files_go(tmp_path):
    """A slot's bytes do not depend on the range asked for, so a mirror can grow between runs."""
    long = generate_mirror(tmp_path / "long", DAY, DAY, seed=3, slots=5)
    out = tmp_path / "short"
    generate_mirror(out, DAY, DAY, seed=3, slots=5)
    short = generate_mirror(out, DAY, DAY, seed=3, slots=2)
    assert short["slots"] == long["slots"][:2]
    files = tree(out / "gdeltv2")
    long_files = tree(tmp_path / "long" / "gdeltv2")
    zips = sorted(n for n in files if n.endswith(".zip"))
    assert len(zips) == 4  # the 3 later slots of the first run were removed
    assert all(files[n] == long_files[n] for n in zips)
    assert long_files["masterfilelist.txt"].startswith(files["masterfilelist.txt"])


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError):
        generate_mirror(tmp_path, DAY, date(2023, 12, 31))
    with pytest.raises(ValueError):
        generate_mirror(tmp_path, date(2015, 1, 1), date(2015, 1, 1))
    with pytest.raises(ValueError):
        generate_mirror(tmp_path, DAY, DAY, slots=0)


@pytest.fixture(scope="module")
def day(generated_day: Path) -> tuple[Path, dict]:
    """conftest's full generated day (2024-01-01, seed 7) and its manifest."""
    return generated_day, json.loads((generated_day / "manifest.json").read_text())


def test_manifest_tells_the_truth(day):
    root, manifest = day
    feed = root / "gdeltv2"
    slots = manifest["slots"]
    assert len(slots) == 96 and [s["ts"] for s in slots] == sorted(s["ts"] for s in slots)
    expected_index = []
    for s in slots:
        for kind in ("export", "mentions"):
            f = s[kind]
            path = feed / f["file"]
            assert f["file"] == f"{s['ts']}.{kind}.CSV.zip"
            assert f["listed"] == s["listed"] == path.exists()
            if f["listed"]:
                blob = path.read_bytes()
                assert (len(blob), hashlib.md5(blob).hexdigest()) == (f["size"], f["md5"])
                expected_index.append(f"{f['size']} {f['md5']} http://data.gdeltproject.org/gdeltv2/{f['file']}")
    master = (feed / "masterfilelist.txt").read_text().splitlines()
    assert all(INDEX_LINE.match(line) for line in master)
    assert master == expected_index  # time order, export before mentions
    newest = [s for s in slots if s["listed"]][-1]["ts"]
    assert (feed / "lastupdate.txt").read_text().splitlines() == master[-2:]
    assert all(newest in line for line in master[-2:])

    totals = manifest["totals"]
    for kind in ("export", "mentions"):
        listed = [s[kind] for s in slots if s["listed"]]
        assert totals[kind]["valid_rows"] == sum(f["valid_rows"] for f in listed)
        assert totals[kind]["malformed_rows"] == sum(f["malformed_rows"] for f in listed) > 0
        assert totals[kind]["bytes"] == sum(f["size"] for f in listed)
    assert manifest["days"][DAY.isoformat()] == totals
    assert manifest["start"] == manifest["end"] == DAY.isoformat()


def test_outage_shape(day):
    _, manifest = day
    slots = manifest["slots"]
    kinds = [s["kind"] for s in slots]
    assert 1 <= kinds.count("gap") <= 3
    assert not any(s["listed"] for s in slots if s["kind"] == "gap")
    near, burst = kinds.index("near_empty"), kinds.index("burst")
    assert kinds[near + 1] == "gap" and kinds[burst - 1] == "gap"  # near-empty, outage, catch-up
    rows = [s["export"]["valid_rows"] + s["export"]["malformed_rows"] for s in slots]
    assert rows[near] <= 3
    normal = sorted(r for r, k in zip(rows, kinds) if k == "normal")
    assert 1500 <= normal[0] and normal[-1] <= 2100
    assert 6 * normal[len(normal) // 2] <= rows[burst] <= 8 * normal[len(normal) // 2]


@pytest.fixture(scope="module")
def parsed(day) -> dict:
    """Every file of the day read the way a correct reader would, with its manifest entry."""
    root, manifest = day
    export, mentions = [], []
    for s in manifest["slots"]:
        if not s["listed"]:
            continue
        for kind, n_fields, columns, out in (
            ("export", 61, EXPORT_SCHEMA, export),
            ("mentions", 16, MENTIONS_SCHEMA, mentions),
        ):
            f = s[kind]
            data = member(root / "gdeltv2" / f["file"])
            assert b'"' not in data and b"\r" not in data
            valid, bad = split_lines(data, n_fields)
            assert len(valid) == f["valid_rows"]
            assert dict(bad) == {k: v for k, v in f["malformed"].items() if v}
            assert f["malformed_rows"] == len(f["malformed_lines"]) == sum(bad.values())
            lines = data.split(b"\n")
            for bad_line in f["malformed_lines"]:
                assert lines[bad_line["line"] - 1] not in valid
            df = frame(valid, columns)
            assert df.height == f["valid_rows"]
            out.append(df.with_columns(pl.lit(s["ts"]).alias("slot")))
    return {"export": pl.concat(export), "mentions": pl.concat(mentions)}


def test_export_rows_are_gdelt_like(parsed):
    e = parsed["export"]
    assert e.height > 150_000
    ids = e["GLOBALEVENTID"].cast(pl.Int64)
    assert ids.is_unique().all() and ids.diff().drop_nulls().min() > 0  # increasing across slots
    assert (e["DATEADDED"] == e["slot"]).all()

    sql = e["SQLDATE"].str.to_date("%Y%m%d")
    offsets = (e["DATEADDED"].str.slice(0, 8).str.to_date("%Y%m%d") - sql).dt.total_days()
    shares = offsets.value_counts(normalize=True).sort("DATEADDED")
    assert set(offsets.unique()) == {0, 1, 7, 30, 365}
    assert 0.93 <= (offsets == 0).mean() <= 0.97, shares
    assert (e["MonthYear"] == e["SQLDATE"].str.slice(0, 6)).all()
    assert (e["Year"] == e["SQLDATE"].str.slice(0, 4)).all()
    month, day_of_month = sql.dt.month().cast(pl.Int32), sql.dt.day().cast(pl.Int32)  # Int8 would overflow
    fraction = sql.dt.year() + ((month - 1) * 30 + day_of_month) / 365
    assert ((e["FractionDate"].cast(pl.Float64) - fraction).abs() <= 0.0000501).all()  # 4 decimals

    # CAMEO codes: strings with leading zeros, consistent levels, quad class and Goldstein.
    assert (e["EventBaseCode"] == e["EventCode"].str.slice(0, 3)).all()
    assert (e["EventRootCode"] == e["EventCode"].str.slice(0, 2)).all()
    assert e["EventCode"].str.len_chars().is_between(3, 4).all()
    assert (e["EventCode"] == "043").any() and (e["EventCode"] == "0211").any()
    assert 0 < (e["EventCode"] == "---").sum() < e.height / 1000  # rare malformed codes
    coded = e.filter(pl.col("EventRootCode") != "--")
    root = coded["EventRootCode"].cast(pl.Int32)
    quad = pl.Series([1 if r <= 5 else 2 if r <= 9 else 3 if r <= 14 else 4 for r in root])
    assert (coded["QuadClass"].cast(pl.Int32) == quad).all()
    goldstein = e.group_by("EventCode").agg(
        pl.col("GoldsteinScale").n_unique().alias("n"), pl.col("GoldsteinScale").first()
    )
    assert (goldstein["n"] == 1).all()
    assert goldstein["GoldsteinScale"].cast(pl.Float64).is_between(-10, 10).all()

    # Actors: ISO-3 mostly, CAMEO aliases, regions and outdated codes, blanks at GDELT's rates.
    countries = set(e["Actor1CountryCode"].drop_nulls()) | set(e["Actor2CountryCode"].drop_nulls())
    assert {"USA", "CHN", "RUS", "UKR", "ISR", "GBR", "FRA", "DEU", "IND", "IRN"} <= countries
    assert {
        "ROM",
        "TMP",
        "IMY",
        "MTN",
        "WSB",
        "GZS",
        "BAG",
        "AFR",
        "EUR",
        "WST",
        "MEA",
        "SAS",
        "ASA",
        "ANT",
        "SSD",
    } <= countries
    assert e["Actor1CountryCode"].value_counts(sort=True)["Actor1CountryCode"].drop_nulls()[0] == "USA"
    assert 0.06 <= e["Actor1Code"].is_null().mean() <= 0.11
    assert 0.25 <= e["Actor2Code"].is_null().mean() <= 0.31
    typed = e.filter(pl.col("Actor1CountryCode").is_not_null() & pl.col("Actor1Type1Code").is_not_null())
    assert (typed["Actor1Code"] == typed["Actor1CountryCode"] + typed["Actor1Type1Code"]).all()
    assert (typed["Actor1Code"] == "USAGOV").any()
    names = e["Actor1Name"].drop_nulls()
    assert (names == names.str.to_uppercase()).all()

    # Geography: FIPS codes, Type 0 means every other geo field is blank.
    for prefix in ("Actor1Geo", "Actor2Geo", "ActionGeo"):
        assert set(e[f"{prefix}_Type"].unique()) <= {"0", "1", "2", "3", "4", "5"}
        blank = e.filter(pl.col(f"{prefix}_Type") == "0")
        assert blank.select(pl.col(f"^{prefix}_(FullName|Lat|Long|FeatureID)$").is_null().all()).row(0) == (True,) * 4
    assert 0.02 <= (e["ActionGeo_Type"] == "0").mean() <= 0.03
    assert {"US", "UK", "IS", "CH", "RS", "UP", "GM", "AS", "SZ"} <= set(e["ActionGeo_CountryCode"].drop_nulls())
    assert (e.filter(pl.col("ActionGeo_Type") != "0")["ActionGeo_Lat"].cast(pl.Float64).abs() <= 90).all()

    # Counts: most events small, a heavy tail, and busy (day, source, target, code) groups.
    mentions = e["NumMentions"].cast(pl.Int32)
    assert mentions.median() <= 2 and mentions.max() >= 100
    assert (e["NumArticles"].cast(pl.Int32) <= mentions).all()
    assert (e["NumSources"].cast(pl.Int32) <= e["NumArticles"].cast(pl.Int32)).all()
    groups = (
        e.drop_nulls(["Actor1CountryCode", "Actor2CountryCode"])
        .group_by(pl.col("DATEADDED").str.slice(0, 8), "Actor1CountryCode", "Actor2CountryCode", "EventBaseCode")
        .agg(pl.col("NumMentions").cast(pl.Int32).sum().alias("m"))
    )
    assert (groups["m"] > 50).sum() > 10 and (groups["m"] > 100).sum() > 3
    assert e["AvgTone"].cast(pl.Float64).is_between(-100, 100).all()

    # URLs: a pool of news sites; some first seen 1-3 days before (reported again).
    url = e["SOURCEURL"]
    assert url.str.contains(r"^https://www\.[a-z-]+\.example/[a-z]+/\d{4}/\d{2}/\d{2}/\S+$").all()
    published = url.str.extract(r"/(\d{4}/\d{2}/\d{2})/").str.to_date("%Y/%m/%d")
    age = (DAY - published).dt.total_days()
    assert set(age.unique()) == {0, 1, 2, 3} and 0.005 < (age > 0).mean() < 0.05
    non_ascii = e.select(
        pl.concat_str(pl.all().fill_null(""), separator="\t").str.contains(r"[^\x00-\x7F]")
    ).to_series()
    assert 0.016 <= non_ascii.mean() <= 0.049


def test_mention_rows_are_gdelt_like(parsed):
    e, m = parsed["export"], parsed["mentions"]
    assert 2.0 <= m.height / e.height <= 3.0
    assert (m["MentionTimeDate"] == m["slot"]).all()
    assert (m["EventTimeDate"] <= m["MentionTimeDate"]).all()
    first = m.filter(pl.col("EventTimeDate") == pl.col("MentionTimeDate"))
    again = m.filter(pl.col("EventTimeDate") < pl.col("MentionTimeDate"))
    assert again.height > 0.15 * m.height
    assert (again["EventTimeDate"].str.slice(0, 8) < DAY.strftime("%Y%m%d")).any()  # from before the range
    # A first mention's event is in the same slot's export, and NumMentions counts them (up to
    # the few rows the malformed lines took away).
    counts = first.group_by("GLOBALEVENTID", "slot").len()
    joined = counts.join(e.select("GLOBALEVENTID", "slot", "NumMentions"), on=["GLOBALEVENTID", "slot"], how="left")
    assert joined["NumMentions"].null_count() < 100
    assert (joined["len"] == joined["NumMentions"].cast(pl.UInt32)).mean() > 0.999
    assert set(m["MentionType"].unique()) == {"1", "2"}
    citations = m.filter(pl.col("MentionType") == "2")
    assert (citations["MentionSourceName"] == "BBC Monitoring").all()
    assert 0.005 < citations.height / m.height < 0.05
    web = m.filter(pl.col("MentionType") == "1")
    assert (web["MentionIdentifier"].str.replace(r"^https://www\.([^/]+)/.*$", "$1") == web["MentionSourceName"]).all()
    assert m["Confidence"].cast(pl.Int32).is_between(10, 100).all()
    assert m["MentionDocTranslationInfo"].is_null().all() and m["Extras"].is_null().all()


# --- server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_mirror(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small-mirror")
    generate_mirror(out, DAY, DAY, seed=1, slots=2)
    return out


@pytest.fixture
def srv(small_mirror):
    with MirrorServer(small_mirror) as server:
        yield server


def index_entries(root: Path) -> list[tuple[int, str, str]]:
    lines = (root / "gdeltv2" / "masterfilelist.txt").read_text().splitlines()
    return [(int(m[1]), m[2], m[3]) for m in map(INDEX_LINE.match, lines)]


def test_get_head_and_ranges(srv, small_mirror):
    data = (small_mirror / "gdeltv2" / "masterfilelist.txt").read_bytes()
    url = f"{srv.base_url}/masterfilelist.txt"
    r = requests.get(url)
    assert r.status_code == 200 and r.content == data and r.headers["Content-Length"] == str(len(data))
    h = requests.head(url)
    assert h.status_code == 200 and h.headers["Content-Length"] == str(len(data)) and h.content == b""
    r = requests.get(url, headers={"Range": "bytes=10-"})
    assert r.status_code == 206 and r.content == data[10:]
    assert r.headers["Content-Range"] == f"bytes 10-{len(data) - 1}/{len(data)}"
    r = requests.get(url, headers={"Range": "bytes=10-19"})
    assert (
        r.status_code == 206 and r.content == data[10:20] and r.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    )
    r = requests.get(url, headers={"Range": f"bytes={len(data)}-"})
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"
    size, md5, name = index_entries(small_mirror)[0]
    blob = requests.get(f"{srv.base_url}/{name}").content
    assert len(blob) == size and hashlib.md5(blob).hexdigest() == md5
    assert requests.get(f"{srv.base_url}/20240101000000.gkg.csv.zip").status_code == 404
    assert requests.get(f"{srv.base_url}/").status_code == 404


def test_files_are_read_at_request_time(tmp_path):
    (tmp_path / "gdeltv2").mkdir()
    index = tmp_path / "gdeltv2" / "masterfilelist.txt"
    index.write_text("one\n")
    with MirrorServer(tmp_path) as srv:
        assert requests.get(f"{srv.base_url}/masterfilelist.txt").text == "one\n"
        index.write_text("one\ntwo\n")
        assert requests.get(f"{srv.base_url}/masterfilelist.txt", headers={"Range": "bytes=4-"}).text == "two\n"


@pytest.mark.parametrize(
    "path", ["/gdeltv2/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/gdeltv2/..%2f..%2fmanifest.json"]
)
def test_path_traversal_is_refused(srv, path):
    # http.client sends the path as written; requests would normalise the dots away.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", path)
    assert conn.getresponse().status == 403
    conn.close()


@pytest.mark.parametrize("fault", ["404", "500", "503", "429"])
def test_status_faults(srv, fault):
    srv.faults.add("lastupdate", fault, times=1)
    r = requests.get(f"{srv.base_url}/lastupdate.txt")
    assert r.status_code == int(fault)
    assert r.headers.get("Retry-After") == ("1" if fault == "429" else None)
    assert requests.get(f"{srv.base_url}/lastupdate.txt").status_code == 200
    assert [(e["status"], e["fault"]) for e in srv.requests] == [(int(fault), fault), (200, None)]


def test_retry_after_param(srv):
    srv.faults.add("lastupdate", "503", retry_after=30)
    srv.faults.add("masterfile", 429, retry_after=2)
    assert requests.get(f"{srv.base_url}/lastupdate.txt").headers["Retry-After"] == "30"
    assert requests.get(f"{srv.base_url}/masterfilelist.txt").headers["Retry-After"] == "2"


def test_reset_drops_the_connection(srv):
    srv.faults.add("lastupdate", "reset", times=1)
    with requests.Session() as session:
        with pytest.raises(requests.ConnectionError):
            session.get(f"{srv.base_url}/lastupdate.txt")
        assert session.get(f"{srv.base_url}/lastupdate.txt").status_code == 200
    assert [(e["status"], e["fault"]) for e in srv.requests] == [(None, "reset"), (200, None)]


def test_reset_mid_body_gives_a_short_read(srv, small_mirror):
    size, _, name = index_entries(small_mirror)[0]
    srv.faults.add(name, "reset_mid_body", times=1)
    with pytest.raises((requests.exceptions.ChunkedEncodingError, requests.ConnectionError)):
        requests.get(f"{srv.base_url}/{name}")
    assert srv.requests[0]["bytes"] == size // 2


def test_slow_streams_the_whole_body_late(srv, small_mirror):
    size, md5, name = index_entries(small_mirror)[0]
    srv.faults.add(name, "slow", times=1, delay_s=0.05, chunk_size=size // 5 + 1)
    started = time.monotonic()
    blob = requests.get(f"{srv.base_url}/{name}").content
    assert time.monotonic() - started >= 0.25
    assert hashlib.md5(blob).hexdigest() == md5


def test_stall_causes_a_read_timeout(srv):
    srv.faults.add("lastupdate", "stall", times=1, delay_s=5)
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(f"{srv.base_url}/lastupdate.txt", timeout=(2, 0.3))
    assert time.monotonic() - started < 2
    assert requests.get(f"{srv.base_url}/lastupdate.txt", timeout=2).status_code == 200


def test_body_faults(srv, small_mirror):
    size, md5, name = index_entries(small_mirror)[0]
    url = f"{srv.base_url}/{name}"
    srv.faults.add(name, "wrong_bytes", times=1)
    srv.faults.add(name, "truncate", times=1)
    srv.faults.add(name, "empty", times=1)
    wrong = requests.get(url)
    assert wrong.status_code == 200 and len(wrong.content) == size and hashlib.md5(wrong.content).hexdigest() != md5
    truncated = requests.get(url)
    assert truncated.status_code == 200 and len(truncated.content) == size // 2
    assert truncated.headers["Content-Length"] == str(size // 2)
    empty = requests.get(url)
    assert empty.status_code == 200 and empty.content == b""
    assert hashlib.md5(requests.get(url).content).hexdigest() == md5
    assert [e["fault"] for e in srv.requests] == ["wrong_bytes", "truncate", "empty", None]


def test_times_and_matching(srv):
    srv.faults.add("lastupdate", "503", times=2)
    srv.faults.add(".zip", "404")  # times=None: every request
    statuses = [requests.get(f"{srv.base_url}/lastupdate.txt").status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert all(requests.get(f"{srv.base_url}/{n}").status_code == 404 for _, _, n in index_entries(srv.root)[:3])
    assert requests.get(f"{srv.base_url}/masterfilelist.txt").status_code == 200
    srv.faults.clear()
    assert requests.get(f"{srv.base_url}/{index_entries(srv.root)[0][2]}").status_code == 200


def test_bad_fault_specs_are_refused(srv):
    with pytest.raises(ValueError):
        srv.faults.add("x", "teapot")
    with pytest.raises(ValueError):
        srv.faults.add("x", "stall", delay=1)  # the parameter is delay_s
    with pytest.raises(ValueError):
        srv.faults.add("x", "500", times=0)


def test_http_control_endpoints(srv):
    control = f"{srv.url}/_mirror"
    r = requests.post(f"{control}/faults", json=[{"match": "lastupdate", "fault": "429", "times": 1, "retry_after": 9}])
    assert r.status_code == 200 and r.json()[0]["params"] == {"retry_after": 9}
    assert requests.get(f"{control}/faults").json()[0]["times"] == 1
    r = requests.get(f"{srv.base_url}/lastupdate.txt")
    assert (r.status_code, r.headers["Retry-After"]) == (429, "9")
    rejected = [{"match": "masterfile", "fault": "500"}, {"match": "x", "fault": "nope"}]
    assert requests.post(f"{control}/faults", json=rejected).status_code == 400
    assert len(requests.get(f"{control}/faults").json()) == 1  # nothing of the rejected list
    assert requests.post(f"{control}/faults", data=b"not json").status_code == 400
    requests.post(f"{control}/faults", json=[{"match": "lastupdate", "fault": "500"}])
    assert requests.delete(f"{control}/faults").json() == []
    assert requests.get(f"{srv.base_url}/lastupdate.txt").status_code == 200
    log = requests.get(f"{control}/requests").json()
    assert [(e["path"], e["status"], e["fault"]) for e in log] == [
        ("/gdeltv2/lastupdate.txt", 429, "429"),
        ("/gdeltv2/lastupdate.txt", 200, None),
    ]  # control requests are not logged
    assert requests.delete(f"{control}/requests").json() == [] and srv.requests == []
    assert requests.get(f"{control}/nothing").status_code == 404


def test_faults_file_and_latency(small_mirror, tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"match": "lastupdate", "fault": "500", "times": 1}]))
    with MirrorServer(small_mirror, latency_s=0.2, faults_file=faults) as srv:
        started = time.monotonic()
        assert requests.get(f"{srv.base_url}/lastupdate.txt").status_code == 500
        assert requests.get(f"{srv.base_url}/lastupdate.txt").status_code == 200
        assert time.monotonic() - started >= 0.4
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/gdeltv2"
