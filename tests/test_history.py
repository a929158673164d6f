"""History blocks (pipeline/events/daily.py): the days before a day, read as merged blocks of key files
plus a few single days, must give exactly what reading every earlier key file gives, whatever the
order days were built or back-filled in."""

from __future__ import annotations

import io
import random
from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from pipeline.events.daily import (
    BLOCK_DAYS,
    KEYS_FORMAT,
    _history_parts,
    build_events,
    history_before,
    history_fingerprint,
    write_event_keys,
)
from pipeline.events.normalize import URL_HASH_SEED, normalize_with_report, url_hash
from pipeline.gdelt.schema import EXPORT_SCHEMA
from pipeline.storage import DataLayout, atomic_write_parquet, read_parquet_metadata

from .settings_builder import make_settings

UTC = UTC
START = date(2024, 1, 1)


def day_rows(day: date, n: int = 3, *, seed: int = 0, id_base: int | None = None) -> pl.DataFrame:
    """Parsed export rows of ``day``: ids that grow with the day, URLs shared across nearby days
    (so rule 6 has first days to find), one null URL and one id replayed from two days before."""
    rng = random.Random(f"{day}:{seed}")
    base = id_base if id_base is not None else (day - START).days * 1000 + 1_000_000
    rows = []
    for i in range(n):
        row = dict.fromkeys(EXPORT_SCHEMA.names())
        row.update(
            GLOBALEVENTID=base + i,
            SQLDATE=day,
            Actor1CountryCode="USA",
            Actor2CountryCode="CHN",
            EventCode="042",
            EventBaseCode="042",
            QuadClass=1,
            NumMentions=1,
            DATEADDED=datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(minutes=15 * i),
            SOURCEURL=None if i == 0 else f"https://news.example/{(day - START).days // 3 + rng.randint(0, 2)}",
        )
        rows.append(row)
    rows[-1]["GLOBALEVENTID"] = base - 2000 + 1  # a replay of an id of two days before
    return pl.DataFrame(rows, schema=EXPORT_SCHEMA)


def write_day(layout: DataLayout, day: date, rows: pl.DataFrame) -> None:
    slot = datetime(day.year, day.month, day.day, tzinfo=UTC)
    atomic_write_parquet(rows, layout.parsed_path("export", slot))


def history_frames(layout: DataLayout, day: date, keys: pl.DataFrame | None = None) -> tuple[list, list]:
    history, _ = history_before(layout, day, keys)
    ids, urls = pl.collect_all([history.event_ids, history.url_first_day])
    return sorted(ids.get_column("event_id").to_list()), sorted(urls.rows())


def every_key_file(layout: DataLayout, day: date, keys: pl.DataFrame | None = None) -> tuple[list, list]:
    """The history the slow way: every key file of an earlier day, read in full."""
    paths = sorted(
        p for p in layout.event_keys_dir().glob("date=*.parquet") if p.stem.removeprefix("date=") < day.isoformat()
    )
    if not paths:
        return [], []
    rows = pl.read_parquet(paths)
    if keys is not None:
        rows = rows.filter(
            pl.col("event_id").is_in(keys["event_id"].implode()) | pl.col("url_hash").is_in(keys["url_hash"].implode())
        )
    ids = rows.get_column("event_id").drop_nulls().unique()
    if keys is not None:
        ids = ids.filter(ids.is_in(keys["event_id"].implode()))
    urls = rows.filter("has_url").group_by("url_hash").agg(pl.col("day").min().alias("first_day"))
    if keys is not None:
        urls = urls.filter(pl.col("url_hash").is_in(keys["url_hash"].implode()))
    return sorted(ids.to_list()), sorted(urls.rows())


def block_files(layout: DataLayout) -> dict[str, int]:
    root = layout.root / "keys" / "history"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*.parquet")} if root.exists() else {}


def test_parts_cover_every_earlier_day_once_with_aligned_blocks_before_the_day():
    rng = random.Random(3)
    for _ in range(300):
        first = START - timedelta(days=rng.randint(0, 2000))
        days = sorted({first + timedelta(days=rng.randint(0, 1500)) for _ in range(rng.randint(0, 200))})
        day = first + timedelta(days=rng.randint(0, 1600))
        digests = {
            d: ("old" if rng.random() < 0.05 else f"g{d}") if rng.random() > 0.02 else None for d in days if d < day
        }
        blocks, singles = _history_parts(digests, day)
        covered = [d for _, _, members in blocks for d in members] + singles
        assert sorted(covered) == sorted(digests)  # every earlier day exactly once
        for first_day, size, members in blocks:
            assert size in BLOCK_DAYS and first_day.toordinal() % size == 0
            assert first_day.toordinal() + size <= day.toordinal()
            assert members and all(first_day <= d < first_day + timedelta(days=size) for d in members)
            assert all(digests[d] == g and g is not None for d, g in members.items())
        # only the days of the last, unfinished 8-day block (and unreadable key files) are single
        assert len([d for d in singles if digests[d] is not None]) <= BLOCK_DAYS[-1] - 1


def test_blocks_give_what_every_key_file_gives_in_any_build_order(tmp_path):
    layout = DataLayout(tmp_path)
    days = [START + timedelta(days=i) for i in range(75)]  # 8-day and 64-day blocks
    order = days[:]
    random.Random(5).shuffle(order)
    for n, day in enumerate(order):
        keys = write_event_keys(layout, day, day_rows(day, 3 + n % 4).lazy())
        if n % 9 == 0 or n == len(order) - 1:
            for probe in (day, days[-1] + timedelta(days=1), days[len(days) // 2]):
                assert history_frames(layout, probe) == every_key_file(layout, probe)
            assert history_frames(layout, day, keys) == every_key_file(layout, day, keys)
    assert any("64d" in name for name in block_files(layout))
    for probe in days:
        assert history_frames(layout, probe) == every_key_file(layout, probe)


def test_a_day_back_filled_inside_a_built_block_is_seen(tmp_path):
    layout = DataLayout(tmp_path)
    late = START + timedelta(days=10)
    for i in range(40):
        day = START + timedelta(days=i)
        if day != late:
            write_event_keys(layout, day, day_rows(day).lazy())
    probe = START + timedelta(days=40)
    history_frames(layout, probe)
    before = block_files(layout)
    write_event_keys(layout, late, day_rows(late, 5).lazy())  # the missing day arrives last
    assert history_frames(layout, probe) == every_key_file(layout, probe)
    rebuilt = {name for name, mtime in block_files(layout).items() if before.get(name) != mtime}
    block = date.fromordinal(late.toordinal() // 8 * 8)
    assert rebuilt == {f"{kind}/8d/from={block}.parquet" for kind in ("ids", "urls")}  # only the block it falls in


def test_a_day_that_changed_inside_a_block_rebuilds_that_block(tmp_path):
    layout = DataLayout(tmp_path)
    for i in range(20):
        day = START + timedelta(days=i)
        write_event_keys(layout, day, day_rows(day).lazy())
    probe = START + timedelta(days=20)
    history_frames(layout, probe)
    changed = START + timedelta(days=3)
    write_event_keys(
        layout, changed, pl.concat([day_rows(changed), day_rows(changed, 2, seed=1, id_base=9_000_000)]).lazy()
    )
    assert history_frames(layout, probe) == every_key_file(layout, probe)
    assert 9_000_000 in history_frames(layout, probe)[0]


def test_a_half_written_block_is_rebuilt(tmp_path):
    """Each block is two files; a crash between them leaves their day lists different."""
    layout = DataLayout(tmp_path)
    for i in range(16):
        day = START + timedelta(days=i)
        write_event_keys(layout, day, day_rows(day).lazy())
    probe = START + timedelta(days=16)
    expected = history_frames(layout, probe)
    urls = next((layout.root / "keys" / "history" / "urls").rglob("*.parquet"))
    atomic_write_parquet(pl.read_parquet(urls).head(1), urls, metadata={"keys_format": KEYS_FORMAT, "days": "{}"})
    assert history_frames(layout, probe) == expected == every_key_file(layout, probe)


def test_rerunning_rewrites_nothing_and_an_unreadable_old_key_file_is_read_alone(tmp_path):
    settings = make_settings(data_dir=tmp_path)
    layout = DataLayout(tmp_path)
    days = [START + timedelta(days=i) for i in range(12)]
    for day in days:
        write_day(layout, day, day_rows(day))
    for day in days:
        build_events(day, settings.dataset)
    files = {**block_files(layout), **{p.name: p.stat().st_mtime_ns for p in layout.event_keys_dir().iterdir()}}
    events = [layout.events_path(d).read_bytes() for d in days]
    for day in days:
        build_events(day, settings.dataset)
    assert {**block_files(layout), **{p.name: p.stat().st_mtime_ns for p in layout.event_keys_dir().iterdir()}} == files
    assert [layout.events_path(d).read_bytes() for d in days] == events
    # A key file in another format is rebuilt from the parsed rows; without them it is kept and read
    # on its own, outside any block.
    old = START - timedelta(days=1)
    atomic_write_parquet(
        pl.read_parquet(layout.event_keys_path(days[0])).head(1),
        layout.event_keys_path(old),
        metadata={"keys_format": "keys-v1/polars-0.0"},
    )
    probe = days[-1] + timedelta(days=1)
    assert history_frames(layout, probe) == every_key_file(layout, probe)
    assert read_parquet_metadata(layout.event_keys_path(old))["keys_format"] == "keys-v1/polars-0.0"


def test_keys_of_the_polars_bound_hash_migrate_once_and_the_events_stay_the_same(tmp_path, monkeypatch):
    """Key files and blocks written before the stable hash (polars' ``Expr.hash``, tagged with the
    polars version) are rewritten by the first run after the change, and never again."""
    import pipeline.events.daily as events_module
    import pipeline.events.normalize as normalize_module

    settings, layout = make_settings(data_dir=tmp_path), DataLayout(tmp_path)
    days = [START + timedelta(days=i) for i in range(12)]
    for day in days:
        write_day(layout, day, day_rows(day, 6))
    old_format = f"keys-v2/polars-{pl.__version__}"
    with monkeypatch.context() as patch:  # the previous release's writer: the same code with its hash

        def old_hash(column: str = "url") -> pl.Expr:
            return pl.col(column).hash(seed=URL_HASH_SEED)

        patch.setattr(events_module, "KEYS_FORMAT", old_format)
        patch.setattr(events_module, "url_hash", old_hash)
        patch.setattr(normalize_module, "url_hash", old_hash)
        for day in days:
            build_events(day, settings.dataset)
    key_paths = [layout.event_keys_path(d) for d in days]
    assert {read_parquet_metadata(p)["keys_format"] for p in key_paths} == {old_format}
    assert block_files(layout)
    old_hashes = pl.read_parquet(key_paths).get_column("url_hash")
    events = [layout.events_path(d).read_bytes() for d in days]

    build_events(days[-1], settings.dataset)  # the first run after the change
    migrated = {**block_files(layout), **{p.name: p.stat().st_mtime_ns for p in layout.event_keys_dir().iterdir()}}
    block_paths = [layout.root / "keys" / "history" / name for name in block_files(layout)]
    assert {read_parquet_metadata(p)["keys_format"] for p in key_paths + block_paths} == {KEYS_FORMAT}
    parsed = pl.concat([pl.read_parquet(layout.parsed_dir("export", d) / "*.parquet") for d in days])
    expected = parsed.select(url_hash("SOURCEURL")).to_series()
    assert pl.read_parquet(key_paths).get_column("url_hash").equals(expected, check_names=False)
    assert not old_hashes.equals(expected, check_names=False)
    assert history_frames(layout, days[-1] + timedelta(days=1)) == every_key_file(layout, days[-1] + timedelta(days=1))

    for day in days:  # later runs rewrite no key file and no block, and the events are unchanged
        build_events(day, settings.dataset)
    assert {
        **block_files(layout),
        **{p.name: p.stat().st_mtime_ns for p in layout.event_keys_dir().iterdir()},
    } == migrated
    assert [layout.events_path(d).read_bytes() for d in days] == events


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_events_are_the_same_whatever_order_days_are_built_in(tmp_path, order):
    """Build 20 days in some order, then rebuild the days events_history_current flags: the events
    are those of all 20 days normalised as one input, and byte-identical to a forward build."""
    days = [START + timedelta(days=i) for i in range(20)]

    def build(root, sequence):
        settings, layout = make_settings(data_dir=root), DataLayout(root)
        for day in days:
            write_day(layout, day, day_rows(day, 6))
        for day in sequence:
            build_events(day, settings.dataset)
        for day in days:
            if read_parquet_metadata(layout.events_path(day))["history_fingerprint"] != history_fingerprint(
                layout, day
            ):
                build_events(day, settings.dataset)
        return [layout.events_path(d).read_bytes() for d in days]

    sequence = {"forward": days, "reverse": days[::-1], "shuffled": random.Random(2).sample(days, len(days))}[order]
    built = build(tmp_path / "a", sequence)
    assert built == build(tmp_path / "b", days)
    together = normalize_with_report(pl.concat([day_rows(day, 6) for day in days]))
    assert together.exclusions["url_reported_earlier"] and together.exclusions["duplicate_event_id"]
    assert pl.concat([pl.read_parquet(io.BytesIO(b)) for b in built]).equals(together.events)
