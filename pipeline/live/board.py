"""The live leaderboard (docs/live.md, "Live leaderboard"): per round and cumulative, every accepted
submission scored against the answers resolved so far (pipeline/live/score.py), baselines
included, with 95% percentile-bootstrap intervals over questions, ranked by the live score with
the monthly board's ≈ leader mark (pipeline/evaluation/board.py rank), and a chart of each
model's cumulative score after each round it took part in.

A model is identified across rounds by its records' (model, contact) and the sha256 of the owner
key its submitter chose (the optional ``owner_key`` of submission.json): a later submission takes
a row's place, or adds a round to it, only if it carries the same key, so declaring someone else's
model and contact makes a row of its own. A submission with no owner key is a row of its own. A
baseline is identified by its method (``live-<D>-<method>``), one row across all rounds. The board
shows an id that reveals nothing of the identity: an HMAC of it under a secret kept in the data
directory (``live/board-id.key``), never the contact. Within a round, an identity's latest accepted
submission counts (a corrected file sent before the deadline replaces the first; nothing is
resolved before then). docs/live.md, "Who a row belongs to".

Written as <data_dir>/live/leaderboard.json and a self-contained leaderboard.html, free of the
time they were made (the same inputs give the same bytes, so publishing rewrites only changes).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import polars as pl
from markupsafe import Markup

from pipeline.config import DatasetSettings
from pipeline.evaluation.board import intervals_overlap
from pipeline.evaluation.board_charts import Key, Point, Series, trend_svg
from pipeline.evaluation.board_html import render
from pipeline.evaluation.scoring import DEFAULT_RESAMPLES
from pipeline.live.resolve import RoundNotPublished, read_round, resolved_answers
from pipeline.live.score import (
    BOOTSTRAP_SEED,
    LIVE_SCORE_RULE,
    RANK_METRIC,
    Accepted,
    LiveScoringError,
    accepted_submissions,
    score_accepted,
    summarize,
)
from pipeline.release.layout import LIVE_LEADERBOARD_KEYS, is_day
from pipeline.release.publish import POINTER_CACHE
from pipeline.release.store import ReleaseStore
from pipeline.storage import DataLayout, atomic_write_bytes

LEADERBOARD_FORMAT = "mirai-live-leaderboard-v1"
TIEBREAK_METRICS = ("level2_f1", "occurrence_accuracy")
RANK_RULE = (
    f"ranked by the live score ({LIVE_SCORE_RULE}), ties by level-2 F1, then event accuracy (rows equal on all "
    "three share a rank), listed by rank, then name. ≈ leader: a row whose 95% interval of the live score overlaps "
    "the leader's (the first row) is not separable from it on these questions; disjoint intervals mean a "
    "difference significant well beyond the 5% level (the mark errs on the side of 'not separable')"
)
INTERVAL_RULE = (
    f"intervals: 95% percentile bootstrap over resolved questions ({DEFAULT_RESAMPLES} resamples, seed "
    f"{BOOTSTRAP_SEED}); cumulative rows resample all resolved questions of every round the model took part in"
)
# The board's files are ours, but a hostile store may serve anything at their keys.
MAX_BOARD_BYTES = 64 * 2**20
BOARD_ID_KEY = "board-id.key"


class LiveBoardError(RuntimeError):
    """The live board cannot be built as it stands (its id key is damaged); one line."""


SHOWN_METRICS = (RANK_METRIC, "level2_f1", "level1_f1", "brier", "occurrence_accuracy")


def live_dir(dataset: DatasetSettings) -> Path:
    return DataLayout(dataset.data_dir).root / "live"


def identity(sub: Accepted, round_day: str) -> tuple[str, str, bool]:
    """(identity key, shown name, baseline) of an accepted submission."""
    record = sub.record
    if record.get("baseline") is True:
        method = sub.name.removeprefix(f"live-{round_day}-")
        return f"baseline:{method}", f"{method} baseline", True
    model = str(record.get("model") or "").strip() or sub.name
    contact = str(record.get("contact") or "").strip()
    owner = record.get("owner_sha256") or f"submission:{sub.name}"
    return "model:" + json.dumps([model, contact, owner]), model, False


def board_id_key(dataset: DatasetSettings) -> bytes:
    """The secret the board's ids are HMACs under: 32 random bytes made on first use (mode 0600),
    the same for every later board, so a row keeps its id."""
    path = live_dir(dataset) / BOARD_ID_KEY
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Written whole under a temporary name, then linked into place: a concurrent build or a
        # crash never leaves a partial key, and the first link wins (a later one finds it there).
        partial = path.with_name(f".{BOARD_ID_KEY}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, secrets.token_bytes(32))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
        finally:
            partial.unlink()
    key = path.read_bytes()
    if len(key) != 32:
        raise LiveBoardError(f"{path} is not a 32-byte key (remove it to make a new one; row ids change)")
    return key


def row_id(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:12]


@dataclass
class Entry:
    key: str
    name: str
    baseline: bool
    submission: str
    scores: pl.DataFrame


def round_entries(dataset: DatasetSettings, round_day: str) -> tuple[list[Entry], list[str]]:
    """The round's scored entries (one per identity: its latest accepted submission) and one line
    per submission that could not be scored."""
    answers = resolved_answers(dataset, date.fromisoformat(round_day))
    accepted, problems = accepted_submissions(dataset, date.fromisoformat(round_day))
    skipped = [f"{round_day}/{p}" for p in problems]
    if answers.is_empty():
        return [], skipped
    latest: dict[str, tuple[str, Accepted]] = {}
    for sub in accepted:
        key, _, _ = identity(sub, round_day)
        stamp = (str(sub.record.get("submitted_at") or ""), sub.name)
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, sub)
    entries = []
    for key, (_, sub) in sorted(latest.items()):
        try:
            scores = score_accepted(sub, answers)
        except (LiveScoringError, OSError, pl.exceptions.PolarsError) as exc:
            skipped.append(f"{round_day}/{sub.name}: {str(exc)[:300]}")
            continue
        _, name, baseline = identity(sub, round_day)
        entries.append(Entry(key, name, baseline, sub.name, scores.with_columns(pl.lit(round_day).alias("round"))))
    return entries, skipped


def _row(
    row_key: str, name: str, baseline: bool, submissions: list[str], rounds: list[str], scores: pl.DataFrame
) -> dict:
    card = summarize(scores)
    row = {
        "id": row_key,
        "name": name,
        "baseline": baseline,
        "submissions": submissions,
        "rounds": rounds,
        "questions": card["questions"],
        "answered": card["answered"],
        "occurrence_forecast": card["occurrence_forecast"],
    }
    for metric in SHOWN_METRICS:
        row[metric] = card["metrics"][metric]["value"]
        row[f"{metric}_ci95"] = card["metrics"][metric]["ci95"]
    return row


def _scores(row: dict) -> tuple[float, ...]:
    return tuple(-(row[m] or 0.0) for m in (RANK_METRIC, *TIEBREAK_METRICS))


def _order_key(row: dict) -> tuple:
    return (*_scores(row), row["name"], row["id"])


def rank(rows: list[dict]) -> list[dict]:
    """As pipeline/evaluation/board.py ranks a group, on the live score: in _order_key's order,
    ``rank`` is 1 + the rows with better scores (equal ones share it), and ``overlaps_leader``
    whether the row's 95% interval of the live score overlaps the first row's."""
    ordered = sorted(rows, key=_order_key)
    out: list[dict] = []
    for position, row in enumerate(ordered, 1):
        place = out[-1]["rank"] if out and _scores(out[-1]) == _scores(row) else position
        overlaps = intervals_overlap(row[f"{RANK_METRIC}_ci95"], ordered[0][f"{RANK_METRIC}_ci95"])
        out.append(row | {"rank": place, "overlaps_leader": overlaps})
    return out


def _history(entries: list[Entry]) -> list[dict]:
    """The model's cumulative live score after each round it took part in (oldest first), with its
    95% interval: every resolved question of its rounds up to that one, as the cumulative row."""
    out = []
    for k in range(1, len(entries) + 1):
        card = summarize(pl.concat([e.scores for e in entries[:k]]))
        out.append(
            {
                "round": entries[k - 1].scores.get_column("round")[0],
                RANK_METRIC: card["metrics"][RANK_METRIC]["value"],
                f"{RANK_METRIC}_ci95": card["metrics"][RANK_METRIC]["ci95"],
                "questions": card["questions"],
            }
        )
    return out


def published_rounds(dataset: DatasetSettings) -> list[str]:
    directory = live_dir(dataset)
    days = (
        sorted((p.name for p in directory.iterdir() if p.is_dir() and is_day(p.name)), reverse=True)
        if directory.is_dir()
        else []
    )
    out = []
    for day in days:
        try:
            read_round(dataset, date.fromisoformat(day))
        except RoundNotPublished:
            continue
        out.append(day)
    return out


def build_leaderboard(dataset: DatasetSettings) -> dict:
    """Every round's board (newest first) and the cumulative board, as one JSON-ready dict."""
    rounds, skipped = [], []
    by_identity: dict[str, list[Entry]] = {}
    days = published_rounds(dataset)
    secret = board_id_key(dataset) if days else b""
    for day in days:
        entries, problems = round_entries(dataset, day)
        skipped += problems
        answers = resolved_answers(dataset, date.fromisoformat(day))
        rows = [_row(row_id(secret, e.key), e.name, e.baseline, [e.submission], [day], e.scores) for e in entries]
        rounds.append(
            {
                "round": day,
                "resolved_questions": answers.height,
                "empty_answers": answers.filter(pl.col("answer_list").list.len() == 0).height,
                "rows": rank(rows),
            }
        )
        for entry in entries:
            by_identity.setdefault(entry.key, []).append(entry)
    cumulative = []
    for key, entries in sorted(by_identity.items()):
        entries = sorted(entries, key=lambda e: e.scores.get_column("round")[0])
        scores = pl.concat([e.scores for e in entries])
        row = _row(
            row_id(secret, key),
            entries[-1].name,
            entries[-1].baseline,
            [e.submission for e in entries],
            [e.scores.get_column("round")[0] for e in entries],
            scores,
        )
        cumulative.append(row | {"by_round": _history(entries)})
    return {
        "format": LEADERBOARD_FORMAT,
        "rank_rule": RANK_RULE,
        "interval_rule": INTERVAL_RULE,
        "cumulative": rank(cumulative),
        "rounds": rounds,
        "skipped": skipped,
    }


def _cell(row: dict, metric: str) -> Markup | str:
    value, (low, high) = row[metric], row[f"{metric}_ci95"]
    if value is None:
        return ""
    digits = 4 if metric in ("brier", "occurrence_accuracy") else 2
    if low is None:
        return f"{value:.{digits}f}"
    # Markup.format escapes what it fills in: here numbers only.
    return Markup('{0:.{3}f} <span class="ci">[{1:.{3}f}, {2:.{3}f}]</span>').format(value, low, high, digits)


# A record's texts (model and submission names come from submitters) are cells of text: the
# template escapes them and shows their hidden characters (bidi controls and zero-width characters).
_COLUMNS = (
    ("rank", lambda r: str(r["rank"])),
    ("≈ leader", lambda r: "leader" if r["rank"] == 1 else "≈" if r["overlaps_leader"] else ""),
    ("model", lambda r: r["name"]),
    ("id", lambda r: r["id"]),
    ("baseline", lambda r: "yes" if r["baseline"] else ""),
    ("live score [95% CI]", lambda r: _cell(r, RANK_METRIC)),
    ("L2 F1 [95% CI]", lambda r: _cell(r, "level2_f1")),
    ("L1 F1", lambda r: _cell(r, "level1_f1")),
    ("Brier [95% CI]", lambda r: _cell(r, "brier")),
    ("event accuracy", lambda r: _cell(r, "occurrence_accuracy")),
    ("event forecast", lambda r: r["occurrence_forecast"]),
    ("questions (answered)", lambda r: f"{r['questions']} ({r['answered']})"),
    ("rounds", lambda r: str(len(r["rounds"]))),
    ("submissions", lambda r: ", ".join(r["submissions"])),
)


def _table_rows(rows: list[dict]) -> list[dict]:
    """A board's rows as the template's table shows them: the row's class, then its cells."""
    return [
        {"classes": "baseline" if row["baseline"] else "submission", "cells": [cell(row) for _, cell in _COLUMNS]}
        for row in rows
    ]


def round_series(board: dict) -> tuple[list[Series], list[str]]:
    """The cumulative rows as lines over the rounds (oldest first): each model's cumulative live
    score after each round it took part in, with its interval; baselines dashed; in rank order."""
    days = sorted({entry["round"] for row in board["cumulative"] for entry in row.get("by_round", [])})
    series = [
        Series(
            row["name"],
            [Point(days.index(e["round"]), e[RANK_METRIC], *e[f"{RANK_METRIC}_ci95"]) for e in row["by_round"]],
            dashed=row["baseline"],
        )
        for row in board["cumulative"]
    ]
    return series, days


def _chart(board: dict) -> Markup | None:
    series, days = round_series(board)
    if not days:
        return None
    svg = trend_svg(
        series,
        days,
        ylabel="cumulative live score (%)",
        key=Key(solid="submitted model", dashed="baseline"),
        salt="live-cumulative",
    )
    # matplotlib's SVG writer escapes what it writes, and every text in it is a path (board_charts'
    # module doc): no model name reaches the markup.
    return Markup(svg)


def page(board: dict) -> bytes:
    """leaderboard.html (pipeline/evaluation/templates/live_leaderboard.html): the cumulative board,
    then each round's, the rules stated. Self-contained (inline style; the CSP forbids any request)
    and free of the time it was made. Every text from a record (model names, submission names) is
    escaped: submitters write them."""
    return render(
        "live_leaderboard.html",
        rank_rule=RANK_RULE,
        interval_rule=INTERVAL_RULE,
        columns=[header for header, _ in _COLUMNS],
        chart=_chart(board),
        cumulative=_table_rows(board["cumulative"]),
        rounds=[
            {
                "day": entry["round"],
                "resolved_questions": entry["resolved_questions"],
                "empty_answers": entry["empty_answers"],
                "rows": _table_rows(entry["rows"]),
            }
            for entry in board["rounds"]
        ],
    )


@dataclass(frozen=True)
class Written:
    board: dict
    json_path: Path
    html_path: Path


def write_live_leaderboard(dataset: DatasetSettings) -> Written:
    board = build_leaderboard(dataset)
    directory = live_dir(dataset)
    json_path, html_path = directory / "leaderboard.json", directory / "leaderboard.html"
    atomic_write_bytes(json_path, (json.dumps(board, indent=2, sort_keys=True) + "\n").encode())
    atomic_write_bytes(html_path, page(board))
    return Written(board, json_path, html_path)


def publish_live_leaderboard(store: ReleaseStore, written: Written) -> list[str]:
    """Put leaderboard.json and .html under live/ (revalidated pointers, like the monthly board);
    only what changed is written. Returns the keys written."""
    keys = []
    for key, path in (
        (LIVE_LEADERBOARD_KEYS["json"], written.json_path),
        (LIVE_LEADERBOARD_KEYS["html"], written.html_path),
    ):
        data = path.read_bytes()
        if store.get_bytes(key, limit=MAX_BOARD_BYTES) != data:
            store.put_bytes(key, data, cache_control=POINTER_CACHE, if_absent=False)
            keys.append(key)
    return keys
