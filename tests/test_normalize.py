"""MIRAI's event rules, each with targeted rows; conformance on real GDELT files against an
independent plain-Python implementation; idempotence of the daily outputs."""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime, timedelta

import polars as pl
import pyarrow as pa
import pytest

from pipeline.config import Settings
from pipeline.events import code_tables, normalize
from pipeline.events.daily import build_daily_quads, build_events
from pipeline.events.normalize import (
    EXCLUSIONS,
    History,
    normalize_events,
    normalize_with_report,
    url_hash,
)
from pipeline.events.quads import daily_quads
from pipeline.gdelt import parse_export
from pipeline.gdelt.schema import EXPORT_SCHEMA
from pipeline.reference.tables import cameo_to_iso3, country_table, level2_codes
from pipeline.storage import DataLayout, atomic_write_parquet

from .conftest import shared_fixture
from .settings_builder import make_settings

UTC = UTC
DAY1 = date(2024, 3, 1)
_ids = iter(range(1_000_000, 2_000_000))


def event(
    day: date = DAY1,
    *,
    s: str | None = "USA",
    o: str | None = "CHN",
    code: str = "042",
    sqldate: date | None = None,
    url: str | None = "https://news.example/a",
    mentions: int = 10,
    event_id: int | None = None,
    minute: int = 0,
) -> dict:
    """One GDELT export row with every column of EXPORT_SCHEMA (unset ones null)."""
    row = dict.fromkeys(EXPORT_SCHEMA.names())
    row.update(
        GLOBALEVENTID=event_id if event_id is not None else next(_ids),
        SQLDATE=sqldate or day,
        Actor1CountryCode=s,
        Actor2CountryCode=o,
        EventCode=code,
        EventBaseCode=code[:3],
        EventRootCode=code[:2],
        QuadClass=1,
        GoldsteinScale=1.0,
        NumMentions=mentions,
        NumSources=1,
        NumArticles=mentions,
        AvgTone=0.5,
        DATEADDED=datetime(day.year, day.month, day.day, 0, minute, tzinfo=UTC),
        SOURCEURL=url,
    )
    return row


def frame(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=EXPORT_SCHEMA)


def reason_of(row: dict) -> str | None:
    result = normalize_with_report(frame(row))
    return next((r for r, n in result.exclusions.items() if n), None)


def test_alias_rom_is_kept_as_rou():
    events = normalize_events(frame(event(s="ROM", o="USA")))
    assert events.select("s", "o", "s_cameo").rows() == [("ROU", "USA", "ROM")]


def test_west_bank_and_gaza_both_map_to_pse_and_become_domestic():
    assert reason_of(event(s="WSB", o="GZS")) == "domestic"
    assert normalize_events(frame(event(s="WSB", o="ISR")))["s"].to_list() == ["PSE"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"s": "AFR"}, "actor_not_a_country"),
        ({"o": "ANT"}, "actor_not_a_country"),
        ({"s": None}, "actor_blank"),
        ({"o": "QQQ"}, "actor_unknown_code"),
        ({"s": "USA", "o": "USA"}, "domestic"),
        ({"code": "---"}, "invalid_relation"),
        ({"code": "999"}, "invalid_relation"),
        ({"sqldate": DAY1 - timedelta(days=365)}, "date_not_aligned"),
        ({"sqldate": DAY1 - timedelta(days=1)}, "date_not_aligned"),
    ],
)
def test_each_rule_excludes_and_counts(overrides, reason):
    assert reason_of(event(**overrides)) == reason


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("Actor2CountryCode", "QQ", "actor_unknown_code"),  # codes are looked up by their 3 bytes:
        ("Actor2CountryCode", "QQQQ", "actor_unknown_code"),  # other lengths are never a code
        ("Actor2CountryCode", "USAX", "actor_unknown_code"),
        ("Actor2CountryCode", "usa", "actor_unknown_code"),
        ("Actor2CountryCode", "ÜS", "actor_unknown_code"),  # 3 bytes in UTF-8
        ("Actor2CountryCode", "", "actor_unknown_code"),
        ("EventBaseCode", None, "invalid_relation"),  # a missing value fails its rule
        ("EventBaseCode", "04", "invalid_relation"),
        ("EventBaseCode", "0421", "invalid_relation"),
        ("SQLDATE", None, "date_not_aligned"),
    ],
)
def test_odd_values_fail_their_rule(column, value, reason):
    assert reason_of(dict(event(), **{column: value})) == reason


def test_unknown_codes_are_reported_not_fatal():
    result = normalize_with_report(frame(event(o="QQQ"), event(s="QQQ", o="ZZZ"), event()))
    assert result.events.height == 1
    assert dict(result.unmapped_codes.iter_rows()) == {"QQQ": 2, "ZZZ": 1}


def test_every_row_is_kept_or_counted_once():
    rows = frame(event(), event(s="AFR"), event(code="--"), event(s="CHN", o="CHN"), event(o=None))
    result = normalize_with_report(rows)
    assert result.events.height + sum(result.exclusions.values()) == result.input_rows == 5
    assert list(result.exclusions) == list(EXCLUSIONS)


def test_replayed_rows_add_nothing():
    a = event(event_id=42)
    replay = dict(a, DATEADDED=a["DATEADDED"] + timedelta(minutes=15))
    result = normalize_with_report(frame(a, replay))
    assert result.events["event_id"].to_list() == [42]
    assert result.exclusions["duplicate_event_id"] == 1
    seen = History(pl.LazyFrame({"event_id": [42]}), History.empty().url_first_day)
    assert normalize_events(frame(a), seen).height == 0


def test_url_first_day_wins_within_one_input():
    day2 = DAY1 + timedelta(days=1)
    rows = frame(event(DAY1, url="u1"), event(day2, url="u1", o="RUS"), event(day2, url="u2", o="RUS"))
    result = normalize_with_report(rows)
    assert sorted(result.events.select("date", "url").rows()) == [(DAY1, "u1"), (day2, "u2")]
    assert result.exclusions["url_reported_earlier"] == 1


def test_url_rule_comes_before_other_rules():
    """The URL's first day counts rows that other rules drop: a URL first seen on day 1 in a
    misaligned row still owns no events on day 2."""
    day2 = DAY1 + timedelta(days=1)
    rows = frame(event(DAY1, url="u1", sqldate=DAY1 - timedelta(days=7)), event(day2, url="u1"))
    result = normalize_with_report(rows)
    assert result.events.height == 0
    assert result.exclusions["url_reported_earlier"] == 1 and result.exclusions["date_not_aligned"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_url_rule_matches_plain_python_on_random_rows(seed):
    """Rule 6 against a plain-Python first-day table: URLs repeated within and across days, in
    any order, null URLs, rows without DATEADDED, and a history that saw some URLs earlier."""
    import random

    rng = random.Random(seed)
    days = [DAY1 + timedelta(days=i) for i in range(5)]
    pool = [f"https://news.example/{i}" for i in range(40)] + [None]
    rows = []
    for _ in range(400):
        day = rng.choice(days)
        row = event(day, url=rng.choice(pool), minute=rng.randrange(60))
        if rng.random() < 0.03:
            row["DATEADDED"] = None
        # Runs: an article's events often follow each other with the same URL.
        rows.extend([row] + [dict(row, GLOBALEVENTID=next(_ids)) for _ in range(rng.randrange(3))])
    # URLs seen once in these rows: only the history can make them late.
    singles = [f"https://news.example/single/{i}" for i in range(10)]
    rows.extend(event(rng.choice(days[1:]), url=url) for url in singles)
    if seed % 2:
        rng.shuffle(rows)
    history = {
        url: rng.choice(days) - timedelta(days=rng.randrange(0, 3)) for url in rng.sample(pool[:-1], 8) + singles[:5]
    }
    url_hashes = pl.DataFrame({"url": list(history)}).select(url_hash("url")).to_series()
    hist = History(
        pl.LazyFrame(schema={"event_id": pl.Int64}),
        pl.LazyFrame({"url_hash": url_hashes, "first_day": list(history.values())}),
    )
    first_day = dict(history)
    for r in rows:
        if r["SOURCEURL"] is not None and r["DATEADDED"] is not None:
            d = r["DATEADDED"].date()
            first_day[r["SOURCEURL"]] = min(first_day.get(r["SOURCEURL"], d), d)
    late = [
        r["SOURCEURL"] is not None and r["DATEADDED"] is not None and first_day[r["SOURCEURL"]] < r["DATEADDED"].date()
        for r in rows
    ]
    result = normalize_with_report(frame(*rows), hist)
    assert result.exclusions["url_reported_earlier"] == sum(late)
    # A row without DATEADDED has no publication day: never late, and not aligned (rule 2).
    kept = {r["GLOBALEVENTID"] for r, is_late in zip(rows, late) if not is_late and r["DATEADDED"] is not None}
    assert set(result.events["event_id"]) == kept
    assert sum(late) > 0 and result.events.height > 0


def test_url_hashes_are_pinned_so_a_library_change_cannot_silently_orphan_the_history():
    """Stored key files hold these values (docs/data-layout.md): if polars-hash ever computes
    others, this fails, and KEYS_FORMAT must change so that the stored keys are rebuilt."""
    import polars_hash as plh

    # XXH3-64 of the empty input with seed 0 is xxHash's own test vector
    # (https://github.com/Cyan4973/xxHash/blob/v0.8.3/cli/xsum_sanity_check.c): the plugin computes
    # the published algorithm, which any other implementation reproduces.
    assert pl.DataFrame({"x": [""]}).select(plh.col("x").nchash.xxh3_64()).item() == 0x2D06800538D394C2
    urls = [
        "https://www.reuters.com/world/europe/ukraine-talks-2024-01-15/",
        "https://news.example/a",
        "http://xn--80ak6aa92e.com/путь?q=1",
        "",
        None,
    ]
    hashes = pl.DataFrame({"url": urls}, schema={"url": pl.String}).select(url_hash("url")).to_series()
    assert hashes.dtype == pl.UInt64 and hashes.null_count() == 0  # rule 6 sorts them as numpy u64
    assert hashes.to_list() == [
        11282965737587454845,
        2100281069559639947,
        13304644214176492521,
        11562568711957783906,
        0,
    ]


def _write_parsed(settings: Settings, day: date, rows: pl.DataFrame) -> None:
    layout = DataLayout(settings.dataset.data_dir)
    slot = datetime(day.year, day.month, day.day, tzinfo=UTC)
    atomic_write_parquet(rows, layout.parsed_path("export", slot))


def test_url_across_two_daily_partitions_keeps_day_one(tmp_path):
    settings = make_settings(data_dir=tmp_path)
    day2 = DAY1 + timedelta(days=1)
    _write_parsed(settings, DAY1, frame(event(DAY1, url="shared", o="RUS"), event(DAY1, url="only1")))
    _write_parsed(
        settings,
        day2,
        frame(event(day2, url="shared", o="IND"), event(day2, url="only2"), event(day2, url="x", event_id=None)),
    )
    first = build_events(DAY1, settings.dataset)
    second = build_events(day2, settings.dataset)
    assert first.history_days == 0 and second.history_days == 1
    assert sorted(first.normalized.events["url"]) == ["only1", "shared"]
    assert sorted(second.normalized.events["url"]) == ["only2", "x"]
    assert second.normalized.exclusions["url_reported_earlier"] == 1


def test_out_of_order_backfill_is_detected_and_a_rebuild_fixes_it(tmp_path):
    from pipeline.events.daily import history_fingerprint
    from pipeline.storage import read_parquet_metadata

    settings = make_settings(data_dir=tmp_path)
    layout = DataLayout(tmp_path)
    day2 = DAY1 + timedelta(days=1)
    _write_parsed(settings, DAY1, frame(event(DAY1, url="shared", o="RUS")))
    _write_parsed(settings, day2, frame(event(day2, url="shared", o="IND")))
    early = build_events(day2, settings.dataset)  # day 2 first: it cannot know day 1 yet
    assert early.normalized.events.height == 1
    built = read_parquet_metadata(layout.events_path(day2))["history_fingerprint"]
    assert built == history_fingerprint(layout, day2)
    build_events(DAY1, settings.dataset)
    assert history_fingerprint(layout, day2) != built  # what events_history_current reports
    assert build_events(day2, settings.dataset).normalized.events.height == 0


def test_event_replayed_on_a_later_day_adds_nothing(tmp_path):
    settings = make_settings(data_dir=tmp_path)
    day2 = DAY1 + timedelta(days=1)
    original = event(DAY1, event_id=7, url="a")
    _write_parsed(settings, DAY1, frame(original))
    _write_parsed(
        settings, day2, frame(dict(original, DATEADDED=original["DATEADDED"] + timedelta(days=1), SQLDATE=day2))
    )
    build_events(DAY1, settings.dataset)
    assert build_events(day2, settings.dataset).normalized.exclusions["duplicate_event_id"] == 1


def test_daily_outputs_are_byte_identical_on_rerun(tmp_path):
    settings = make_settings(data_dir=tmp_path)
    _write_parsed(
        settings, DAY1, frame(*(event(o=o, url=f"u{i}", mentions=60) for i, o in enumerate(["CHN", "RUS", "CHN"])))
    )
    layout = DataLayout(tmp_path)

    def digest() -> tuple[str, str]:
        build_events(DAY1, settings.dataset)
        build_daily_quads(DAY1, settings.dataset)
        return tuple(
            hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (layout.events_path(DAY1), layout.daily_quads_path(DAY1))
        )

    assert digest() == digest()


def test_daily_quads_sum_mentions_and_count_first_day_web_mentions():
    rows = frame(
        event(o="CHN", url="a", mentions=30, event_id=1),
        event(o="CHN", url="b", mentions=25, event_id=2),
        event(o="RUS", url="c", mentions=5, event_id=3),
    )
    events = normalize_events(rows)
    day_start = datetime(2024, 3, 1, tzinfo=UTC)
    mentions = pl.DataFrame(
        {
            "GLOBALEVENTID": [1, 1, 2, 2, 1],
            "MentionType": [1, 1, 1, 2, 1],
            "MentionTimeDate": [day_start, day_start, day_start, day_start, day_start + timedelta(days=1)],
            "MentionIdentifier": ["m1", "m2", "m1", "BBC Monitoring", "late"],
        },
        schema={
            "GLOBALEVENTID": pl.Int64,
            "MentionType": pl.Int8,
            "MentionTimeDate": pl.Datetime("us", "UTC"),
            "MentionIdentifier": pl.String,
        },
    )
    quads = daily_quads(events, mentions)
    china = quads.filter(pl.col("o") == "CHN").row(0, named=True)
    assert (china["daily_mentions"], china["n_events"], china["urls"], china["web_mention_urls"]) == (
        55,
        2,
        ["a", "b"],
        2,
    )
    russia = quads.filter(pl.col("o") == "RUS").row(0, named=True)
    assert (russia["daily_mentions"], russia["web_mention_urls"]) == (5, 0)
    assert quads.select(pl.struct("date", "s", "r", "o").is_unique().all()).item()


REAL_EXPORTS = [
    "narayave-Insight-GDELT-Feed/b412634/20190121220000.export.CSV",
    "narayave-Insight-GDELT-Feed/HEAD/events.csv",
    "epournaras-DIAS-GDELT/b61e972/20180326044500.export.CSV",
    "aamend-spark-gdelt-cae6b57/events.csv",
    "aamend-spark-gdelt/events.csv",
]


def reference_rules(rows: list[dict]) -> list[tuple]:
    """The same rules in plain Python, written independently of pipeline.events.normalize."""
    iso = dict(cameo_to_iso3().iter_rows())
    relations = level2_codes()
    first_day: dict[str, date] = {}
    for r in rows:
        day = r["DATEADDED"].date()
        if r["SOURCEURL"] is not None:
            first_day[r["SOURCEURL"]] = min(first_day.get(r["SOURCEURL"], day), day)
    seen: set[int] = set()
    kept = []
    for r in sorted(rows, key=lambda r: r["DATEADDED"]):
        eid, day = r["GLOBALEVENTID"], r["DATEADDED"].date()
        if eid in seen:
            continue
        seen.add(eid)
        if r["SOURCEURL"] is not None and first_day[r["SOURCEURL"]] < day:
            continue
        if r["SQLDATE"] != day:
            continue
        s, o = iso.get(r["Actor1CountryCode"]), iso.get(r["Actor2CountryCode"])
        if s is None or o is None or s == o:
            continue
        if r["EventBaseCode"] not in relations:
            continue
        kept.append((eid, day, s, r["EventBaseCode"], o))
    return sorted(kept)


@pytest.mark.parametrize("relative", REAL_EXPORTS)
def test_conformance_on_real_gdelt_files(relative):
    rows = parse_export(shared_fixture(f"gdelt/{relative}").read_bytes(), source=relative).rows
    result = normalize_with_report(rows)
    events = result.events
    # invariants
    assert set(events["s"]) | set(events["o"]) <= set(cameo_to_iso3()["iso3"])
    assert set(events["r"]) <= level2_codes()
    assert events.filter(pl.col("s") == pl.col("o")).height == 0
    assert events.filter(pl.col("date") != pl.col("date_added").dt.date()).height == 0
    assert (events["r1"] == events["r"].str.slice(0, 2)).all()
    # the same counts as an independent implementation
    expected = reference_rules(rows.to_dicts())
    assert sorted(events.select("event_id", "date", "s", "r", "o").rows()) == expected
    assert events.height + sum(result.exclusions.values()) == rows.height
    quads = daily_quads(events)
    assert quads["n_events"].sum() == events.height
    assert quads["daily_mentions"].sum() == events["num_mentions"].sum()


def test_country_table_knows_every_code_in_real_files():
    """Real data's actor codes are all in the table (mapped or excluded on purpose)."""
    known = set(country_table()["cameo_code"])
    codes: set[str] = set()
    for relative in REAL_EXPORTS:
        rows = parse_export(shared_fixture(f"gdelt/{relative}").read_bytes(), source=relative).rows
        codes |= set(rows["Actor1CountryCode"].drop_nulls()) | set(rows["Actor2CountryCode"].drop_nulls())
    assert codes - known == set()


# --- The fast paths and their public fallbacks -----------------------------------------------------


def test_code_lookups_read_arrow_string_views_with_these_versions():
    """The code lookups read Arrow string views (code_tables._code_keys). If this fails, polars or
    pyarrow changed what they export: normalisation still gives the same results through the
    public Enum-cast path (slower at the lookups); adapt _code_keys or drop it."""
    assert code_tables._string_views_readable(), (
        f"code_tables._code_keys cannot read string views with polars {pl.__version__}, pyarrow {pa.__version__}"
    )


def test_both_code_lookup_paths_agree(monkeypatch):
    odd = ["QQ", "QQQ", "USAX", "usa", "ÜS", "", "0\x00A", "a value longer than twelve bytes"]
    values = pl.concat(
        [pl.Series([None, *odd]), pl.Series([*country_table()["cameo_code"], *sorted(level2_codes()), None])],
        rechunk=False,
    ).slice(1)  # an offset and two chunks, as batches can come
    lookups = code_tables.code_lookups()
    fast = [lookups.country.lookup(values), lookups.relation.lookup(values)]
    monkeypatch.setattr(code_tables, "_string_views_readable", lambda: False)
    public = [lookups.country.lookup(values), lookups.relation.lookup(values)]
    known = values.is_not_null().to_numpy()  # a null's entry is never read (rules 3 and 5 test nulls)
    for a, b in zip(fast, public):
        assert a.dtype == b.dtype and (a[known] == b[known]).all()
    assert set(public[0][: len(odd)]) == {code_tables.UNKNOWN} and not public[1][: len(odd)].any()
    assert public[1].sum() == len(level2_codes())


def _mixed_rows(n: int = 800, seed: int = 3) -> pl.DataFrame:
    """Rows over three days with every country and relation code, odd values, nulls and repeats."""
    import random

    rng = random.Random(seed)
    actors = [*country_table()["cameo_code"], "QQ", "QQQ", "USAX", "ÜS", "", None]
    bases = [*sorted(level2_codes()), "04", "0421", "999", None]
    rows = []
    for i in range(n):
        day = DAY1 + timedelta(days=rng.randrange(3))
        s = rng.choice(actors)
        row = event(
            day,
            s=s,
            o=s if i % 9 == 0 else rng.choice(actors),
            sqldate=day - timedelta(days=i % 13 == 0),
            url=rng.choice([f"https://news.example/{rng.randrange(200)}", None]),
            minute=rng.randrange(60),
        )
        row["EventBaseCode"] = rng.choice(bases)
        if i % 10 == 9:
            row["GLOBALEVENTID"] = rows[-3]["GLOBALEVENTID"]
        rows.append(row)
    return frame(*rows)


def test_public_fallbacks_give_identical_results(monkeypatch):
    """The Enum-cast lookups and the collect()-and-slice read give exactly the results of the
    string-view lookups and collect_batches, batch boundaries included."""
    rows = _mixed_rows()
    reference = normalize_with_report(rows)
    monkeypatch.setattr(normalize, "BATCH_ROWS", 64)
    streamed = normalize_with_report(rows)
    monkeypatch.setattr(code_tables, "_string_views_readable", lambda: False)
    monkeypatch.delattr(pl.LazyFrame, "collect_batches")
    public = normalize_with_report(rows)
    for result in (streamed, public):
        assert result.events.equals(reference.events)
        assert result.exclusions == reference.exclusions
        assert result.unmapped_codes.equals(reference.unmapped_codes)
    assert reference.events.height > 0 and all(reference.exclusions.values())  # every rule was exercised


def test_read_falls_back_when_collect_batches_is_gone_or_changed(monkeypatch):
    """collect_batches is unstable in polars 2.1: without it, or with a signature that refuses our
    arguments, the rows come from one collect() cut into slices, in the same order."""
    rows = pl.LazyFrame({"a": range(10)})
    monkeypatch.setattr(normalize, "BATCH_ROWS", 4)
    streamed = pl.concat(normalize._batches(rows))

    def changed(self, *, batch_size=None):  # as if the argument had been renamed
        raise AssertionError("not reached: the call itself fails on chunk_size")

    monkeypatch.setattr(pl.LazyFrame, "collect_batches", changed)
    assert [b.height for b in normalize._batches(rows)] == [4, 4, 2]
    monkeypatch.delattr(pl.LazyFrame, "collect_batches")
    sliced = list(normalize._batches(rows))
    assert [b.height for b in sliced] == [4, 4, 2]
    assert pl.concat(sliced).equals(streamed) and streamed["a"].to_list() == list(range(10))
