"""Normalisation benchmark: a generated month of GDELT exports through the event rules, ours
against pandas and against the time it takes merely to read the same files.

    .venv/bin/python bench/normalize.py [--work DIR] [--start 2024-01-01] [--end 2024-01-30]
                                        [--rounds N] [--no-daily | --daily-only]

Input. The UTC days ``--start``..``--end`` are generated with ``testbed.generate``
(seed 0), one day at a time, and every landed export zip is parsed once with ``parse_export`` into
``parsed/export/date=<day>/<ts>.parquet``: the layout ``parse_day`` writes, one parquet per slot.
The zips are deleted once their day is parsed. Everything lives under ``--work`` (default
``/tmp/mirai-bench-normalize``); a re-run finds the parsed days there and skips generating them.
Delete that directory to start over (for instance after a change to the parser).

What is timed, in this one process, in alternating rounds (median and best are reported):

* project: ``normalize_with_report(pl.scan_parquet(<every export parquet>), History.empty())``,
  the whole month as one input (rules 1 and 6 then apply within the input). It returns the
  kept events, the exclusion counts and the unmapped-codes report.
* project, files in reverse order: the same call on the files listed last day first. Parsed
  files come in DATEADDED order with ascending event ids, which lets rule 1 and the final sort
  take a shortcut; reversed, they take the general path (the results must be identical).
* project, day by day: ``pipeline.events.daily.build_events(day)`` for each day in order, each against
  the history of the days before it, as the daily assets run: a backfill of the range. Each round
  starts from no key files and no history blocks (``keys/`` is deleted first), so every round
  writes every day's key file, the history blocks, the events and the report files
  (``--no-daily`` skips this line; ``--daily-only`` times only it, and then once more as a re-run
  over the files the last round left, which rewrites no key file and no block).
* read floor: ``pl.scan_parquet(<same files>).select(INPUT_COLUMNS).collect()``, the columns the
  rules consume. ``ratio_vs_read`` is computed against this floor. Reading all 61 columns is
  printed as well, for scale.
* pandas: the same rules written with pandas in this file (:func:`run_pandas`), reading the same
  files with ``pd.read_parquet(columns=INPUT_COLUMNS)``. Its kept events (ids, s, o, r, url,
  in order), exclusion counts and unmapped codes must equal ours, or the bench fails.

Peak RSS: each side then runs once alone in a fresh subprocess (``--worker``) that reads
``VmHWM`` (Linux carries ``ru_maxrss`` across fork and exec, so a child would report its
parent's peak). The peak after imports is printed next to the peak after the run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

from common import machine as machine_summary
from common import own_peak_rss_mib
from pipeline.events.normalize import EXCLUSIONS, INPUT_COLUMNS, History, normalize_with_report
from pipeline.storage import DataLayout, atomic_write_bytes, atomic_write_parquet

SEED = 0
DEFAULT_WORK = Path("/tmp/mirai-bench-normalize")
DEFAULT_START = date(2024, 1, 1)
DEFAULT_END = date(2024, 1, 30)
MIN_ROWS = 5_000_000
GOALS = {"ratio_vs_pandas": 10.0, "ratio_vs_read": 1.5, "peak_rss_mib": 2048}


# --- input --------------------------------------------------------------------------------------


def days_of(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


def marker_path(work: Path, day: date) -> Path:
    return work / "prepared" / f"{day.isoformat()}.json"


def prepare(work: Path, start: date, end: date, log: Callable[[str], None] = print) -> dict:
    """Generate and parse every day not prepared yet; return totals over the range."""
    from pipeline.gdelt.parse import parse_files
    from testbed.generate import generate_mirror

    layout = DataLayout(work / "data")
    mirror = work / "mirror"
    totals = {"files": 0, "rows": 0, "rejects": 0}
    for day in days_of(start, end):
        marker = marker_path(work, day)
        if not marker.exists():
            t0 = time.perf_counter()
            shutil.rmtree(layout.parsed_dir("export", day), ignore_errors=True)
            generate_mirror(mirror, day, day, seed=SEED)
            t1 = time.perf_counter()
            zips = sorted((mirror / "gdeltv2").glob("*.export.CSV.zip"))
            stats = {"files": 0, "rows": 0, "rejects": 0}
            items = ((path.read_bytes(), path.name) for path in zips)
            for path, parsed in zip(zips, parse_files(items, "export")):
                slot = datetime.strptime(path.name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
                target = layout.parsed_path("export", slot)
                atomic_write_parquet(parsed.rows, target, metadata={"source_path": path.name})
                stats["files"] += 1
                stats["rows"] += parsed.rows.height
                stats["rejects"] += parsed.rejects.height
            shutil.rmtree(mirror)
            atomic_write_bytes(marker, json.dumps(stats).encode())
            log(
                f"  prepared {day}: {stats['files']} export files, {stats['rows']:,} rows "
                f"(generate {t1 - t0:.1f} s, parse + write {time.perf_counter() - t1:.1f} s)"
            )
        stats = json.loads(marker.read_text())
        for key in totals:
            totals[key] += stats[key]
    return totals


def export_files(work: Path, start: date, end: date) -> list[Path]:
    layout = DataLayout(work / "data")
    files = [f for day in days_of(start, end) for f in sorted(layout.parsed_dir("export", day).glob("*.parquet"))]
    if not files:
        raise SystemExit(f"no parsed export files under {work}")
    return files


# --- the sides ----------------------------------------------------------------------------------


def run_project(files: list[Path], **_) -> dict:
    result = normalize_with_report(pl.scan_parquet(files), History.empty())
    return {
        "rows": result.input_rows,
        "events": result.events,
        "exclusions": result.exclusions,
        "unmapped": dict(result.unmapped_codes.iter_rows()),
    }


def run_project_reversed(files: list[Path], **_) -> dict:
    return run_project(files[::-1])


def run_daily(files: list[Path], work: Path, start: date, end: date, **_) -> dict:
    from pipeline.config import DatasetSettings, Settings

    settings = Settings(dataset=DatasetSettings(data_dir=work / "data"))
    shutil.rmtree(DataLayout(settings.dataset.data_dir).event_keys_dir().parent, ignore_errors=True)  # a fresh backfill
    return build_days(settings, start, end)


def build_days(settings, start: date, end: date) -> dict:
    from pipeline.events.daily import build_events

    rows, kept, seconds = 0, 0, []
    exclusions = dict.fromkeys(EXCLUSIONS, 0)
    for day in days_of(start, end):
        t0 = time.perf_counter()
        out = build_events(day, settings.dataset).normalized
        seconds.append(time.perf_counter() - t0)
        rows += out.input_rows
        kept += out.events.height
        for reason, n in out.exclusions.items():
            exclusions[reason] += n
    return {"rows": rows, "kept": kept, "exclusions": exclusions, "day_seconds": seconds}


def run_read(files: list[Path], **_) -> dict:
    return {"rows": pl.scan_parquet(files).select(INPUT_COLUMNS).collect().height}


def run_read_all(files: list[Path], **_) -> dict:
    return {"rows": pl.scan_parquet(files).collect().height}


def run_pandas(files: list[Path], **_) -> dict:
    """The six rules written plainly with pandas, from the same parquet files."""
    import numpy as np
    import pandas as pd

    from pipeline.reference.tables import cameo_to_iso3, country_table, level2_codes

    t0 = time.perf_counter()
    df = pd.concat([pd.read_parquet(f, columns=list(INPUT_COLUMNS)) for f in files], ignore_index=True)
    read_seconds = time.perf_counter() - t0
    n_rows = len(df)
    pub_day = df["DATEADDED"].dt.floor("D")
    sql_day = pd.to_datetime(df["SQLDATE"]).dt.tz_localize("UTC")
    url = df["SOURCEURL"]

    # Rule 6, computed first and over every row: a URL's day is the earliest day carrying it.
    first_day = pub_day.groupby(url, sort=False).transform("min")  # NaT where the URL is null
    url_late = url.notna() & (pub_day > first_day)
    # Rule 1: the earliest DATEADDED copy of an id wins; ties go to the earlier input row.
    order = np.argsort(df["DATEADDED"].to_numpy(), kind="stable")
    dup_sorted = df["GLOBALEVENTID"].to_numpy()[order]
    duplicate = np.empty(n_rows, dtype=bool)
    duplicate[order] = pd.Series(dup_sorted).duplicated(keep="first").to_numpy()
    # Rule 2.
    misaligned = (sql_day != pub_day).to_numpy()
    # Rule 3.
    iso = dict(cameo_to_iso3().iter_rows())
    status = dict(country_table().select("cameo_code", "status").iter_rows())
    a1, a2 = df["Actor1CountryCode"], df["Actor2CountryCode"]
    s, o = a1.map(iso), a2.map(iso)
    s_status, o_status = a1.map(status), a2.map(status)
    blank = a1.isna() | a2.isna()
    not_country = (s_status == "excluded") | (o_status == "excluded")
    unknown = s_status.isna() | o_status.isna()
    # Rule 4.
    domestic = s == o
    # Rule 5.
    invalid = ~df["EventBaseCode"].isin(level2_codes())

    conditions = [
        duplicate,
        url_late.to_numpy(),
        misaligned,
        blank.to_numpy(),
        not_country.to_numpy(),
        unknown.to_numpy(),
        domestic.to_numpy(),
        invalid.to_numpy(),
    ]
    reason = np.select(conditions, np.arange(len(EXCLUSIONS)), default=-1)
    counts = np.bincount(reason + 1, minlength=len(EXCLUSIONS) + 1)
    keep = reason == -1

    kept = df[keep]
    events = pd.DataFrame(
        {
            "event_id": kept["GLOBALEVENTID"],
            "date": pub_day[keep],
            "s": s[keep],
            "r": kept["EventBaseCode"],
            "o": o[keep],
            "r1": kept["EventBaseCode"].str.slice(0, 2),
            "s_cameo": kept["Actor1CountryCode"],
            "o_cameo": kept["Actor2CountryCode"],
            "event_code": kept["EventCode"],
            "quad_class": kept["QuadClass"],
            "goldstein": kept["GoldsteinScale"],
            "num_mentions": kept["NumMentions"],
            "num_sources": kept["NumSources"],
            "num_articles": kept["NumArticles"],
            "avg_tone": kept["AvgTone"],
            "date_added": kept["DATEADDED"],
            "url": kept["SOURCEURL"],
        }
    ).sort_values(["date_added", "event_id"], ignore_index=True)

    codes = pd.concat([a1, a2], ignore_index=True).dropna()
    unmapped = codes[~codes.isin(set(status))].value_counts()
    return {
        "rows": n_rows,
        "events": events,
        "exclusions": {r: int(n) for r, n in zip(EXCLUSIONS, counts[1:])},
        "unmapped": {str(code): int(n) for code, n in unmapped.items()},
        "read_seconds": read_seconds,
    }


SIDES: dict[str, Callable[..., dict]] = {
    "project": run_project,
    "reversed": run_project_reversed,
    "daily": run_daily,
    "read": run_read,
    "read_all": run_read_all,
    "pandas": run_pandas,
}
LABELS = {
    "project": "project: normalize_with_report(all)",
    "reversed": "project, files in reverse order",
    "daily": "project: build_events day by day",
    "read": "read floor: INPUT_COLUMNS (14)",
    "read_all": "read: all 61 columns",
    "pandas": "pandas, same rules",
}


def check_same(ours: dict, theirs: dict) -> str:
    """Fail unless pandas kept exactly our events and counted the same exclusions."""
    problems = []
    if ours["rows"] != theirs["rows"]:
        problems.append(f"input rows: ours {ours['rows']:,}, pandas {theirs['rows']:,}")
    if ours["exclusions"] != theirs["exclusions"]:
        problems.append(f"exclusions differ:\n  ours   {ours['exclusions']}\n  pandas {theirs['exclusions']}")
    if ours["unmapped"] != theirs["unmapped"]:
        problems.append(f"unmapped codes differ: ours {ours['unmapped']}, pandas {theirs['unmapped']}")
    ev, pd_ev = ours["events"], theirs["events"]
    if ev.height != len(pd_ev):
        problems.append(f"kept events: ours {ev.height:,}, pandas {len(pd_ev):,}")
    else:
        for col in ("event_id", "s", "o", "r", "url"):
            a = ev.get_column(col).to_list()
            b = pd_ev[col].astype(object).where(pd_ev[col].notna(), None).tolist()
            if a != b:
                first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                problems.append(f"events.{col} differs first at row {first}: ours {a[first]!r}, pandas {b[first]!r}")
    if problems:
        raise SystemExit("pandas and the project disagree:\n" + "\n".join(problems))
    return f"pandas kept the same {ev.height:,} events (ids, s, o, r, url, in order) and counted the same exclusions"


# --- measurement --------------------------------------------------------------------------------


def worker(side: str, args: argparse.Namespace) -> None:
    files = export_files(args.work, args.start, args.end)
    if side == "pandas":
        import pandas  # noqa: F401  (imports count in the "before" figure, not in the run)
    if side == "daily":
        import pipeline.events.daily  # noqa: F401
    before = own_peak_rss_mib()
    t0 = time.perf_counter()
    result = SIDES[side](files, work=args.work, start=args.start, end=args.end)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rows": result["rows"],
                "peak_before_mib": before,
                "peak_after_mib": own_peak_rss_mib(),
            }
        )
    )


def in_subprocess(side: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        side,
        "--work",
        str(args.work),
        "--start",
        args.start.isoformat(),
        "--end",
        args.end.isoformat(),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def machine() -> str:
    import pandas as pd

    return machine_summary({"polars": pl.__version__, "pandas": pd.__version__})


def daily_only(args: argparse.Namespace) -> None:
    """The day-by-day line alone: ``--rounds`` fresh backfills of the range, then one re-run."""
    from pipeline.config import DatasetSettings, Settings

    files = export_files(args.work, args.start, args.end)
    seconds, per_day = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        result = run_daily(files, args.work, args.start, args.end)
        seconds.append(time.perf_counter() - t0)
        per_day.append(result["day_seconds"])
    t0 = time.perf_counter()
    build_days(Settings(dataset=DatasetSettings(data_dir=args.work / "data")), args.start, args.end)
    rerun = time.perf_counter() - t0
    days = len(per_day[0])
    # Each day's median over the rounds: a history read that grows with the days before shows
    # as a last third slower than the first.
    day_median = [statistics.median(r[i] for r in per_day) for i in range(days)]
    third = max(1, days // 3)
    print(
        f"day by day, {days} days, {result['rows']:,} rows, {result['kept']:,} kept: backfill median "
        f"{statistics.median(seconds):.2f} s, best {min(seconds):.2f} s ({args.rounds} rounds: "
        + ", ".join(f"{x:.2f}" for x in seconds)
        + f"); re-run over its files {rerun:.2f} s"
    )
    print(
        f"  per day (median over rounds): first {third} days {statistics.mean(day_median[:third]) * 1000:.0f} ms, "
        f"last {third} days {statistics.mean(day_median[-third:]) * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"cache directory (default {DEFAULT_WORK})")
    parser.add_argument("--start", type=date.fromisoformat, default=DEFAULT_START)
    parser.add_argument("--end", type=date.fromisoformat, default=DEFAULT_END)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-daily", action="store_true", help="skip the day-by-day line")
    parser.add_argument("--daily-only", action="store_true", help="time only the day-by-day backfill (and a re-run)")
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return

    started = time.perf_counter()
    print(f"machine: {machine()}")
    print(f"input: {args.start}..{args.end}, seed {SEED}, cached under {args.work}")
    totals = prepare(args.work, args.start, args.end, log=print)
    files = export_files(args.work, args.start, args.end)
    size_mib = sum(f.stat().st_size for f in files) / 2**20
    print(
        f"data: {len(files):,} export parquet files ({size_mib:,.0f} MiB zstd), {totals['rows']:,} rows "
        f"({totals['rejects']:,} malformed lines rejected by the parser)"
    )
    if totals["rows"] < MIN_ROWS:
        print(f"WARNING: fewer than {MIN_ROWS:,} rows: widen --start/--end for a month-scale run")

    if args.daily_only:
        daily_only(args)
        return
    sides = [s for s in SIDES if not (args.no_daily and s == "daily")]
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    pandas_read: list[float] = []
    rows: dict[str, int] = {}
    kw = {"work": args.work, "start": args.start, "end": args.end}
    checked = ""
    for round_no in range(args.rounds):
        results = {}
        for side in sides:
            t0 = time.perf_counter()
            results[side] = SIDES[side](files, **kw)
            seconds[side].append(time.perf_counter() - t0)
            rows[side] = results[side]["rows"]
        pandas_read.append(results["pandas"]["read_seconds"])
        if round_no == 0:
            checked = check_same(results["project"], results["pandas"])
            project = results["project"]
            print(
                f"kept events: {project['events'].height:,} of {project['rows']:,} rows; exclusions: "
                + ", ".join(f"{r} {n:,}" for r, n in project["exclusions"].items())
            )
            rev = results["reversed"]
            if not (
                rev["events"].equals(project["events"])
                and rev["exclusions"] == project["exclusions"]
                and rev["unmapped"] == project["unmapped"]
            ):
                raise SystemExit("the project gave different results for the same files in reverse order")
            print("files in reverse order: the same events, exclusions and unmapped codes")
            if "daily" in results:
                daily = results["daily"]
                same = daily["kept"] == project["events"].height and daily["exclusions"] == project["exclusions"]
                print(
                    f"day by day: {daily['kept']:,} kept, exclusions "
                    + ("identical to the month run" if same else f"DIFFER: {daily['exclusions']}")
                )
            print(checked)
        del results

    med = {side: statistics.median(v) for side, v in seconds.items()}
    best = {side: min(v) for side, v in seconds.items()}
    print("\nfresh subprocess per side, one run each, for peak RSS (VmHWM after imports -> after the run):")
    fresh = {}
    for side in sides:
        fresh[side] = in_subprocess(side, args)
        print(
            f"  {LABELS[side]:40s} {fresh[side]['seconds']:7.2f} s   {fresh[side]['peak_before_mib']:6.0f} -> "
            f"{fresh[side]['peak_after_mib']:6.0f} MiB"
        )

    ratio_vs_pandas = med["pandas"] / med["project"]
    ratio_vs_read = med["project"] / med["read"]
    peak = fresh["project"]["peak_after_mib"]
    print(
        f"\nresults: {rows['project']:,} input rows; seconds: {args.rounds} alternating rounds in one process; "
        "peak RSS: the fresh subprocess"
    )
    head = (
        f"  {'side':40s} {'rows':>10s} {'median s':>9s} {'best s':>7s} {'rows/s':>11s} "
        f"{'÷ read floor':>13s} {'peak RSS':>9s}"
    )
    print(head)
    print("  " + "-" * (len(head) - 2))
    for side in sides:
        print(
            f"  {LABELS[side]:40s} {rows[side]:10,} {med[side]:9.2f} {best[side]:7.2f} "
            f"{rows[side] / med[side]:11,.0f} {med[side] / med['read']:12.2f}x "
            f"{fresh[side]['peak_after_mib']:5.0f} MiB"
        )
    print(f"  (pandas spent {statistics.median(pandas_read):.2f} s of its median reading the files)\n")

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    print(
        f"  ratio_vs_pandas = {ratio_vs_pandas:5.2f}  pandas ÷ project, medians "
        f"(best ÷ best {best['pandas'] / best['project']:.2f})"
        f"  goal >= {GOALS['ratio_vs_pandas']:.0f}: {verdict(ratio_vs_pandas >= GOALS['ratio_vs_pandas'])}"
    )
    print(
        f"  ratio_vs_read   = {ratio_vs_read:5.2f}  project ÷ read of INPUT_COLUMNS, medians "
        f"(best ÷ best {best['project'] / best['read']:.2f}; ÷ read of all 61 columns "
        f"{med['project'] / med['read_all']:.2f})  goal <= {GOALS['ratio_vs_read']}: "
        f"{verdict(ratio_vs_read <= GOALS['ratio_vs_read'])}"
    )
    print(
        f"  peak RSS        = {peak:5.0f} MiB of the project (the INPUT_COLUMNS read alone: "
        f"{fresh['read']['peak_after_mib']:.0f} MiB)  goal <= {GOALS['peak_rss_mib']} MiB: "
        f"{verdict(peak <= GOALS['peak_rss_mib'])}"
    )
    print(f"bench wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
