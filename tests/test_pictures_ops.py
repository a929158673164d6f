"""The operator's two pictures: the month's slot ledger as a heat map (gdelt_files) and the day's
OBELICS funnel (articles): their frames on small hand-built ledgers and article tables, and their
PNGs (decodable, the expected size, more than one colour, the same bytes for the same input)."""

from __future__ import annotations

import base64
import io
import re
from datetime import date

import numpy as np
import polars as pl
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from pipeline.articles.day import ARTICLES_SCHEMA
from pipeline.articles.funnel import funnel_frame, funnel_png
from pipeline.gdelt.ledger import LEDGER_SCHEMA, STATUSES, write_ledger
from pipeline.gdelt.ledger_figure import (
    SLOT_STATES,
    STATE_COLOURS,
    month_heatmap_png,
    month_slot_states,
    read_month_ledgers,
    state_counts,
)
from pipeline.storage import DataLayout

DAY = date(2025, 10, 3)  # the partition: its month so far is Oct 1-3


def decoded(png: bytes) -> np.ndarray:
    """The PNG's pixels, height × width × RGBA floats."""
    return imread(io.BytesIO(png), format="png")


def metadata_png(markdown: str) -> np.ndarray:
    """The pixels of the PNG a png_bytes_metadata value embeds."""
    [encoded] = re.fullmatch(r"!\[\w+\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown).groups()
    return decoded(base64.b64decode(encoded))


def has_colour(pixels: np.ndarray, colour: str) -> bool:
    return bool(np.isclose(pixels[..., :3], to_rgb(colour), atol=1 / 255).all(axis=-1).any())


# --- The month's slot ledger -------------------------------------------------------------------


def ledger(day: date, statuses: dict[tuple[int, str], str], default: str = "landed") -> pl.DataFrame:
    """A day's 192-row slot ledger: every file ``default`` except ``statuses[(slot index, kind)]``."""
    changed = pl.DataFrame(
        [(i, kind, status) for (i, kind), status in statuses.items()],
        schema={"i": pl.Int64, "kind": pl.String, "changed": pl.String},
        orient="row",
    )
    return (
        pl.DataFrame({"i": range(96)})
        .join(pl.DataFrame({"kind": ["export", "mentions"]}), how="cross")
        .join(changed, on=["i", "kind"], how="left")
        .select(
            pl.lit(day).alias("day"),
            pl.lit(day).cast(pl.Datetime("us", "UTC")).dt.offset_by(pl.format("{}m", pl.col("i") * 15)).alias("slot"),
            "kind",
            pl.col("changed").fill_null(default).alias("status"),
        )
        .match_to_schema(LEDGER_SCHEMA, missing_columns="insert")
    )


def month_ledgers() -> pl.DataFrame:
    """Oct 1: a GDELT gap at slot 5 (export missing), slot 6 quarantined (mentions; its export
    late), slot 7 late; Oct 2: no ledger; Oct 3: slot 10 failed (its export pending), slots from
    12:00 not due."""
    first = ledger(
        date(2025, 10, 1),
        {(5, "export"): "missing", (6, "export"): "late", (6, "mentions"): "quarantined"}
        | {(7, kind): "late" for kind in ("export", "mentions")},
    )
    third = ledger(
        DAY,
        {(10, "export"): "pending", (10, "mentions"): "failed"}
        | {(i, kind): "not_due" for i in range(48, 96) for kind in ("export", "mentions")},
    )
    return pl.concat([first, third])


def test_a_slot_is_its_worst_file_and_a_day_without_ledger_says_so():
    states = month_slot_states(month_ledgers(), DAY)
    assert states.height == 3 * 96 and states.columns == ["day", "slot", "state"]
    state = {(d.day, slot): s for d, slot, s in states.iter_rows()}
    assert (state[1, 4], state[1, 5], state[1, 6], state[1, 7]) == ("landed", "missing", "quarantined", "late")
    assert {state[2, i] for i in range(96)} == {"no ledger"}
    assert (state[3, 10], state[3, 47], state[3, 48], state[3, 95]) == ("failed", "landed", "not_due", "not_due")
    assert state_counts(states) == {
        "landed": (96 - 3) + (48 - 1),
        "late": 1,
        "not_due": 48,
        "pending": 0,
        "missing": 1,
        "failed": 1,
        "corrupt": 0,
        "quarantined": 1,
        "no ledger": 96,
    }


def test_every_ledger_status_has_a_slot_state_and_a_colour():
    assert set(SLOT_STATES) - set(STATUSES) == {"no ledger"} and set(STATUSES) <= set(SLOT_STATES)
    assert set(STATE_COLOURS) == set(SLOT_STATES) and len(set(STATE_COLOURS.values())) == len(SLOT_STATES)


def test_the_month_is_read_from_the_stored_ledgers_without_writing_anything(tmp_path):
    layout = DataLayout(tmp_path)
    ledgers = month_ledgers()
    for (day,), rows in ledgers.group_by("day"):
        write_ledger(layout, day, rows)
    stored = sorted(tmp_path.rglob("*"))
    read = read_month_ledgers(layout, DAY)
    assert sorted(tmp_path.rglob("*")) == stored
    assert month_slot_states(read, DAY).equals(month_slot_states(ledgers, DAY))


def test_the_heat_map_png_decodes_at_its_size_in_the_state_colours_and_repeats_byte_for_byte():
    states = month_slot_states(month_ledgers(), DAY)
    png = month_heatmap_png(states)
    pixels = decoded(png)
    assert pixels.shape == (700, 1200, 4)
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 1
    assert all(has_colour(pixels, STATE_COLOURS[s]) for s in ("landed", "quarantined", "not_due", "no ledger"))
    assert month_heatmap_png(month_slot_states(month_ledgers(), DAY)) == png


def test_a_damaged_ledger_of_another_day_leaves_the_picture_out_not_the_ingestion(tmp_path):
    """gdelt_files draws the month best-effort: another day's ledger overwritten with junk bytes
    costs the picture (a warning), never the day's run."""
    import dagster as dg

    from assets.ingest import _ledger_month

    layout = DataLayout(tmp_path)
    for (day,), rows in month_ledgers().group_by("day"):
        write_ledger(layout, day, rows)
    context = dg.build_asset_context()
    assert metadata_png(_ledger_month(context, str(tmp_path), DAY)["ledger_month"].value).shape == (700, 1200, 4)
    layout.slot_ledger_path(date(2025, 10, 1)).write_bytes(b"not a parquet file")
    assert _ledger_month(context, str(tmp_path), DAY) == {}


def test_the_first_of_the_month_is_a_month_of_one_day():
    states = month_slot_states(ledger(date(2025, 11, 1), {}), date(2025, 11, 1))
    assert states["day"].unique().to_list() == [date(2025, 11, 1)] and set(states["state"]) == {"landed"}
    assert decoded(month_heatmap_png(states)).shape == (700, 1200, 4)


# --- The OBELICS funnel -------------------------------------------------------------------------


def articles_table(outcomes: list[tuple[str | None, int]]) -> pl.DataFrame:
    """Stored pages, ``n`` per (failing_filter, n); None is kept, "extraction:<error>" failed extraction."""
    failing = [name for name, n in outcomes for _ in range(n)]
    return (
        pl.DataFrame({"failing_filter": failing}, schema={"failing_filter": pl.String})
        .with_columns(
            pl.when(pl.col("failing_filter").str.starts_with("extraction:"))
            .then(pl.col("failing_filter").str.strip_prefix("extraction:"))
            .alias("extraction_error"),
            pl.col("failing_filter").is_null().alias("kept"),
        )
        .match_to_schema(ARTICLES_SCHEMA, missing_columns="insert")
    )


# 12 selected, 10 stored, 2 failed extraction, then the filters drop 2 + 1 (+ 1 by domain dedup).
OUTCOMES = [
    ("extraction:too_short", 1),
    ("extraction:timeout", 1),
    ("words", 2),
    ("language_id", 1),
    ("domain_dedup", 1),
    (None, 4),
]


def test_the_obelics_funnel_drops_each_document_at_its_first_failing_filter():
    funnel = funnel_frame(12, articles_table(OUTCOMES), "obelics")
    assert funnel.rows() == [
        ("selected", 12, None),
        ("stored", 10, 2),
        ("extracted", 8, 2),
        ("words", 6, 2),
        ("character_repetition", 6, 0),
        ("word_repetition", 6, 0),
        ("special_characters", 6, 0),
        ("stopwords", 6, 0),
        ("flagged_words", 6, 0),
        ("punctuation", 6, 0),
        ("language_id", 5, 1),
        ("domain_dedup", 4, 1),
        ("kept", 4, 0),
    ]


def test_the_mirai_funnel_has_its_own_filters_and_no_domain_dedup():
    outcomes = [(name, n) for name, n in OUTCOMES if name != "domain_dedup"]
    funnel = funnel_frame(12, articles_table(outcomes), "mirai")
    assert funnel["stage"].to_list() == [
        "selected",
        "stored",
        "extracted",
        "words",
        "character_repetition",
        "word_repetition",
        "special_characters",
        "flagged_words",
        "language_id",
        "kept",
    ]
    assert funnel["documents"].to_list() == [12, 9, 7, 5, 5, 5, 5, 5, 4, 4]
    assert funnel["documents"].diff().drop_nulls().le(0).all()


def test_a_day_without_stored_pages_is_a_funnel_of_zeros():
    funnel = funnel_frame(3, ARTICLES_SCHEMA.to_frame(), "mirai")
    assert funnel["documents"].to_list() == [3, *[0] * 9]


@pytest.mark.parametrize("profile", ["mirai", "obelics"])
def test_the_funnel_png_decodes_at_its_size_and_repeats_byte_for_byte(profile):
    outcomes = OUTCOMES if profile == "obelics" else OUTCOMES[:4] + OUTCOMES[5:]
    funnel = funnel_frame(12, articles_table(outcomes), profile)
    png = funnel_png(funnel, profile)
    pixels = decoded(png)
    assert pixels.shape == (round(100 * (1.4 + 0.4 * funnel.height)), 1000, 4)
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 1
    assert funnel_png(funnel_frame(12, articles_table(outcomes), profile), profile) == png
