"""The published leaderboard: evaluations/leaderboard.parquet (``run.leaderboard``) and
evaluations/leaderboard.png, a bar chart of the newest month's runs. The same stored runs give
byte-identical files."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.style
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.evaluation.run import RANK_METRIC, RANK_RULE, leaderboard
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet

BOARD_FILE = "leaderboard.parquet"
CHART_FILE = "leaderboard.png"
# What the Dagster UI shows of each run; the parquet file has every metric and its std.
SUMMARY_COLUMNS = (
    "rank",
    "month",
    "query_set",
    "distance",
    "agent",
    "kind",
    "contaminated",
    "n",
    "rounds",
    "level2_f1",
    "level1_f1",
    "level2_precision",
    "level2_recall",
    "quad_kl",
    "mrr",
    # The across-round aggregates (run.AGGREGATION_RULE), and what each row's columns are.
    "max_at_k_level2_f1",
    "repeated_level2_f1",
    "avg_steps",
    "aggregation",
)


def _label(row: dict) -> str:
    tail = " (contaminated)" if row["contaminated"] else ""
    return f"{row['agent']} · d={row['distance']} · {row['query_set']}{tail}"


def chart(board: pl.DataFrame) -> bytes:
    """PNG: second-level F1 (mean ± std over rounds) of every run of the newest month, in board
    order (RANK_RULE, printed under the chart); contaminated runs in grey; a run's Max@K and
    repeated second-level F1 as markers where it stored them."""
    with matplotlib.style.context("default"):
        # A bare Figure on an Agg canvas: no pyplot state in the Dagster process, no window.
        fig = Figure(figsize=(9, 1.2 + 0.35 * max(board.height, 1)), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if board.is_empty():
            ax.set_axis_off()
            fig.text(0.5, 0.5, "no evaluation runs yet", ha="center", va="center", fontsize=16, color="0.4")
        else:
            month = board.get_column("month").max()
            rows = board.filter(pl.col("month") == month).to_dicts()  # already in rank order
            y = list(range(len(rows)))[::-1]
            ax.barh(
                y,
                [r[RANK_METRIC] for r in rows],
                xerr=[r[f"{RANK_METRIC}_std"] for r in rows],
                color=["0.7" if r["contaminated"] else "tab:blue" for r in rows],
                capsize=3,
            )
            for column, marker, color, name in (
                (f"max_at_k_{RANK_METRIC}", "^", "black", "Max@K"),
                (f"repeated_{RANK_METRIC}", "D", "tab:orange", "repeated (≥ 2 of K)"),
            ):
                points = [(r[column], i) for i, r in zip(y, rows) if r.get(column) is not None]
                if points:
                    ax.scatter(*zip(*points), marker=marker, color=color, s=24, zorder=3, label=name)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="lower right", fontsize=8)
            ax.set_yticks(y, [_label(r) for r in rows], fontsize=9)
            ax.set_xlabel("second-level F1 (%), mean ± std over rounds")
            ax.set_xlim(0, 100)
            ax.set_title(f"Leaderboard {month}", fontsize=12)
            fig.text(0.01, 0.005, RANK_RULE, fontsize=7, color="0.35", wrap=True)
        buf = io.BytesIO()
        # No "Software" entry: a matplotlib upgrade alone must not change the bytes.
        fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def markdown_table(frame: pl.DataFrame) -> str:
    """A markdown table (floats to 2 decimals, booleans yes/no, nulls blank) for Dagster metadata."""

    def cell(value) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines)


def write_leaderboard(data_dir: Path | str) -> tuple[pl.DataFrame, Path, Path]:
    """Rebuild leaderboard.parquet and leaderboard.png from every stored run; return the board and
    the two paths."""
    directory = DataLayout(data_dir).root / "evaluations"
    board = leaderboard(data_dir)
    atomic_write_parquet(board, directory / BOARD_FILE)
    atomic_write_bytes(directory / CHART_FILE, chart(board))
    return board, directory / BOARD_FILE, directory / CHART_FILE


def summary(board: pl.DataFrame) -> pl.DataFrame:
    """The board's headline columns (those present: an empty board has no metric columns)."""
    return board.select([c for c in SUMMARY_COLUMNS if c in board.columns])
