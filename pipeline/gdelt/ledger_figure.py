"""The month's slot ledger as a picture: one row per day from the 1st up to a day, one column per
15-minute slot, each cell coloured by the worst status of the slot's two files (export and
mentions), so an operator sees gaps, failures and quarantined files at a glance instead of reading
the ``problems`` table day by day.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import polars as pl
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from pipeline.figures import OKABE_ITO, new_figure, rendered_png
from pipeline.gdelt.ledger import GREEN, read_ledger
from pipeline.storage import DataLayout

SLOTS_PER_DAY = 96
NO_LEDGER = "no ledger"  # a day no gdelt_files run has written a ledger for yet
# A slot's state, best first: the worst of its two files' statuses is the later one. Not due comes
# right after the green ones (the future is not a problem); then what later runs retry by
# themselves (pending, missing: GDELT's gap), then what points at our side (failed, corrupt), and
# last quarantined, which nothing retries until GDELT's index lists other bytes.
SLOT_STATES = ("landed", "late", "not_due", "pending", "missing", "failed", "corrupt", "quarantined", NO_LEDGER)
SLOT_STATE = pl.Enum(SLOT_STATES)
STATE_COLOURS = {
    "landed": OKABE_ITO["bluish_green"],
    "late": OKABE_ITO["sky_blue"],
    "not_due": "0.88",
    "pending": OKABE_ITO["yellow"],
    "missing": OKABE_ITO["orange"],
    "failed": OKABE_ITO["vermillion"],
    "corrupt": OKABE_ITO["reddish_purple"],
    "quarantined": OKABE_ITO["black"],
    NO_LEDGER: "0.6",
}


def month_days(day: date) -> list[date]:
    """The days of ``day``'s month up to and including ``day``."""
    return pl.date_range(day.replace(day=1), day, eager=True).to_list()


def read_month_ledgers(layout: DataLayout, day: date) -> pl.DataFrame:
    """The slot ledgers of ``day``'s month up to ``day``, in one frame (a day without a ledger adds no rows)."""
    return pl.concat([read_ledger(layout, d) for d in month_days(day)])


def month_slot_states(ledgers: pl.DataFrame, day: date) -> pl.DataFrame:
    """One row per (day, slot) of ``day``'s month up to ``day``: ``day``, ``slot`` (0-95, the
    15-minute slot of the UTC day) and ``state`` (SLOT_STATE): the worst status of the slot's files
    in ``ledgers``, ``no ledger`` where the ledgers hold none."""
    grid = pl.DataFrame({"day": month_days(day)}).join(
        pl.DataFrame({"slot": pl.int_range(SLOTS_PER_DAY, eager=True, dtype=pl.Int32)}), how="cross"
    )
    worst = ledgers.group_by(
        "day", (pl.col("slot").dt.hour().cast(pl.Int32) * 4 + pl.col("slot").dt.minute() // 15).alias("slot")
    ).agg(pl.col("status").cast(SLOT_STATE).max().alias("state"))
    return (
        grid.join(worst, on=["day", "slot"], how="left")
        .with_columns(pl.col("state").fill_null(NO_LEDGER))
        .sort("day", "slot")
    )


def state_counts(states: pl.DataFrame) -> dict[str, int]:
    """Slots per state, every state present (zeros included), in SLOT_STATES order."""
    counts = dict(states.group_by("state").len().iter_rows())
    return {state: int(counts.get(state, 0)) for state in SLOT_STATES}


def month_heatmap_png(states: pl.DataFrame) -> bytes:
    """The PNG (1200 × 700 pixels) of a month_slot_states frame."""
    return rendered_png(lambda: _heatmap(states))


def _heatmap(states: pl.DataFrame) -> Figure:
    days = states["day"].unique().sort()
    counts = state_counts(states)
    green = sum(counts[s] for s in GREEN)
    fig = new_figure(12, 7)
    ax = fig.subplots()
    codes = states["state"].to_physical().to_numpy().reshape(days.len(), SLOTS_PER_DAY)
    cmap = ListedColormap([STATE_COLOURS[s] for s in SLOT_STATES])
    ax.imshow(codes, cmap=cmap, vmin=0, vmax=len(SLOT_STATES) - 1, aspect="auto", interpolation="nearest")
    # Hours at the slot boundaries they start on; thin white lines between hours and between days.
    hours = np.arange(0, SLOTS_PER_DAY, 4) - 0.5
    ax.set_xticks(hours, [f"{h:02d}" for h in range(24)], fontsize=8)
    ax.set_yticks(range(days.len()), [str(d.day) for d in days], fontsize=8)
    ax.vlines(hours[1:], -0.5, days.len() - 0.5, colors="white", linewidth=0.6)
    ax.hlines(np.arange(1, days.len()) - 0.5, -0.5, SLOTS_PER_DAY - 0.5, colors="white", linewidth=0.6)
    ax.set_xlabel("hour of the day (UTC), four 15-minute slots each")
    ax.set_ylabel("day of the month")
    last = days[-1]
    ax.set_title(
        f"GDELT slots of {last:%Y-%m} up to day {last.day}: {green:,} of {states.height:,} green "
        "(export and mentions both landed or late)",
        fontsize=12,
    )
    handles = [Patch(color=STATE_COLOURS[s], label=f"{s.replace('_', ' ')} ({n:,})") for s, n in counts.items()]
    fig.legend(
        handles=handles,
        title="worst status of the slot's two files (slots)",
        loc="outside lower center",
        ncols=5,
        fontsize=9,
    )
    return fig
