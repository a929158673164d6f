"""Articles benchmark: fetch throughput against a slow news server, extraction and filtering
speed on real news pages, and the peak RSS of each.

    .venv/bin/python bench/articles.py [--pages N] [--concurrency C] [--latency S] [--rounds R]
                                       [--html DIR] [--server process|inline] [--fetch-pages real,generated]

1. **Fetch.** ``fetch_many`` (``pipeline/articles/fetch.py``, exactly as a day's articles run
   calls it: robots.txt on, HTML gzipped into ``raw_html/`` of a temporary data dir) gets
   ``--pages`` distinct URLs (default 640) from a local ``NewsServer`` that waits ``--latency``
   (default 0.2 s) before every response, with ``fetch_concurrency = fetch_per_host =
   --concurrency`` (default 32) and ``fetch_allow_loopback``. All URLs are on one host, so the
   per-host limit is the global one. *Ideal throughput* is C / latency (= N / (N/C × latency)):
   every worker always waiting on a response and no time spent anywhere else. The ratio printed is
   achieved ÷ ideal (goal ≥ 0.8); the ideal ignores the one robots.txt round trip that must
   precede the first page (a ceiling of N/C / (N/C + 1), 0.95 at the defaults), which is printed
   too. ``max_in_flight`` is counted by the server: the most requests it was handling at once.

   Two page sets: ``real``, the 15 fixture pages of ``../shared/fixtures/html`` cycled (36 KB to
   1.4 MB, mean ~300 KiB: what news sites send), and ``generated``, ``page_html`` pages of ~1 KB
   (the fetcher's own overhead without the bytes). By default the server runs in a child process
   (a news site is not in our process; on 2 cores the two then share the CPUs as the OS sees fit);
   ``--server inline`` puts its threads in the fetching process, as the tests do.

2. **Extract + filter.** The fixture pages (or, without them, 15 ``page_html`` pages) are
   extracted with ``extract`` and the usable texts filtered with ``filter_document`` (profile
   ``mirai``, the default; ``obelics`` is timed separately), ``--rounds`` times (default 10) after
   one untimed warm-up round, in one process pinned to one CPU. docs/s per core = documents ÷
   (extract + mirai filter seconds). The filter share is filter seconds ÷ extract seconds (goal ≤
   25 %). ``extract`` includes our own work after trafilatura (language ID and the OBELICS word
   count of the text); that part is timed separately on the extracted texts and printed.

3. **Peak RSS.** Each part runs in a fresh subprocess (``--worker``) that reports ``VmHWM`` from
   ``/proc/self/status`` after its imports and setup, and after the run (``ru_maxrss`` is carried
   across fork and exec, so a child would report its parent's peak).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import machine as machine_summary
from common import own_peak_rss_mib

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HTML = ROOT.parent / "shared" / "fixtures" / "html"
NOW = datetime(2024, 1, 2, tzinfo=UTC)
GOALS = {"fetch_ratio": 0.8, "filter_share": 0.25}
PROFILE = "mirai"  # Settings.article_profile's default
OTHER_PROFILE = "obelics"


# --- measurement ----------------------------------------------------------------------------------


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fixture_pages(html_dir: Path) -> list[tuple[str, bytes]]:
    """``(name, html)`` of the real pages, or 15 generated ones when the directory is absent."""
    files = sorted(html_dir.glob("*.html")) if html_dir.is_dir() else []
    if files:
        return [(f.name, f.read_bytes()) for f in files]
    from testbed.news import page_html

    return [
        (f"generated-{i:02d}.html", page_html(f"Generated story {i} about talks between two governments", 8 + 4 * i))
        for i in range(15)
    ]


# --- 1. fetch ---------------------------------------------------------------------------------------


def fetch_site(page_set: str, html_dir: Path, n: int) -> dict[str, bytes]:
    """N distinct paths, cycling through the page set."""
    if page_set == "real":
        pages = fixture_pages(html_dir)
    else:
        from testbed.news import page_html

        pages = [(f"generated-{i:02d}.html", page_html(f"Generated story {i}", 5)) for i in range(16)]
    return {f"/news/{i:04d}/{pages[i % len(pages)][0]}": pages[i % len(pages)][1] for i in range(n)}


def _serve(conn, page_set: str, html_dir: str, n: int, latency_s: float) -> None:
    """Server child: serve the site, send its URL, and its counters when told to stop."""
    from testbed.news import NewsServer

    with NewsServer(fetch_site(page_set, Path(html_dir), n), latency_s=latency_s) as server:
        conn.send(server.url)
        conn.recv()
        log = server.requests
        conn.send(
            {
                "max_in_flight": server.max_in_flight,
                "requests": len(log),
                "robots_requests": sum(1 for e in log if e["path"] == "/robots.txt"),
                "bytes_sent": sum(e["bytes"] for e in log),
                "server_cpu_s": cpu_seconds(),
            }
        )


class _InlineServer:
    def __init__(self, page_set: str, html_dir: Path, n: int, latency_s: float):
        from testbed.news import NewsServer

        self.server = NewsServer(fetch_site(page_set, html_dir, n), latency_s=latency_s).start()
        self.url = self.server.url

    def stop(self) -> dict:
        log = self.server.requests
        self.server.stop()
        return {
            "max_in_flight": self.server.max_in_flight,
            "requests": len(log),
            "robots_requests": sum(1 for e in log if e["path"] == "/robots.txt"),
            "bytes_sent": sum(e["bytes"] for e in log),
            "server_cpu_s": None,
        }


class _ChildServer:
    def __init__(self, page_set: str, html_dir: Path, n: int, latency_s: float):
        ctx = multiprocessing.get_context("fork")  # before any thread of this process starts
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(theirs, page_set, str(html_dir), n, latency_s), daemon=True)
        self.process.start()
        theirs.close()
        self.url = self.conn.recv()

    def stop(self) -> dict:
        self.conn.send("stop")
        stats = self.conn.recv()
        self.process.join(timeout=10)
        return stats


def run_fetch(args: argparse.Namespace) -> dict:
    from pipeline.articles.fetch import fetch_many
    from pipeline.config import ArticleSettings, DatasetSettings, Settings

    n, c, latency = args.pages, args.concurrency, args.latency
    server = (_InlineServer if args.server == "inline" else _ChildServer)(args.page_set, args.html, n, latency)
    paths = list(fetch_site(args.page_set, args.html, n))
    urls = [server.url + p for p in paths]
    try:
        with tempfile.TemporaryDirectory(prefix="mirai-bench-articles-") as data_dir:
            settings = Settings(
                dataset=DatasetSettings(data_dir=Path(data_dir)),
                articles=ArticleSettings(
                    fetch_concurrency=c, fetch_per_host=c, fetch_allow_loopback=True, fetch_respect_robots=True
                ),
            )
            before, cpu0 = own_peak_rss_mib(), cpu_seconds()
            batch = fetch_many(urls, settings.dataset, settings.network, settings.articles, now=NOW)
            cpu = cpu_seconds() - cpu0
            after = own_peak_rss_mib()
            stored = sum(f.stat().st_size for f in Path(data_dir, "raw_html").rglob("*.gz"))
    finally:
        server_stats = server.stop()
    counts = {k: v for k, v in batch.counts().items() if v}
    fetched = counts.get("fetched", 0)
    per_url = sorted(o.elapsed_s for o in batch.outcomes)
    achieved = fetched / batch.elapsed_s
    ideal = c / latency  # = n / (n / c * latency)
    return {
        "page_set": args.page_set,
        "server": args.server,
        "pages": n,
        "concurrency": c,
        "latency_s": latency,
        "counts": counts,
        "elapsed_s": batch.elapsed_s,
        "achieved_per_s": achieved,
        "ideal_per_s": ideal,
        "ratio": achieved / ideal,
        "ceiling_with_robots": (n / c) / (n / c + 1),
        "per_url_median_s": statistics.median(per_url),
        "per_url_p95_s": per_url[int(0.95 * (len(per_url) - 1))],
        "per_url_max_s": per_url[-1],
        "bytes": sum(o.bytes for o in batch.outcomes),
        "stored_gz_bytes": stored,
        "client_cpu_s": cpu,
        "robots_requests_client": batch.robots_requests,
        "peak_before_mib": before,
        "peak_after_mib": after,
        **server_stats,
    }


# --- 2. extract + filter --------------------------------------------------------------------------


def pin_to_one_cpu() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def run_extract(args: argparse.Namespace) -> dict:
    from pipeline.articles.extract import extract
    from pipeline.articles.langid import identify
    from pipeline.articles.obelics import filter_document, words

    cpu = pin_to_one_cpu()
    pages = [(name, html, f"https://bench.example/{name}") for name, html in fixture_pages(args.html)]
    before = own_peak_rss_mib()

    def one_round() -> list[dict]:
        out = []
        for name, html, url in pages:
            t0 = time.perf_counter()
            extracted = extract(html, url)
            t1 = time.perf_counter()
            decision = filter_document(extracted.text, PROFILE) if extracted.error is None else None
            t2 = time.perf_counter()
            other = filter_document(extracted.text, OTHER_PROFILE) if extracted.error is None else None
            t3 = time.perf_counter()
            out.append(
                {
                    "name": name,
                    "extract_s": t1 - t0,
                    "filter_s": t2 - t1,
                    "filter_other_s": t3 - t2,
                    "error": extracted.error,
                    "n_words": extracted.n_words,
                    "text": extracted.text,
                    "decision": (
                        ("kept" if decision.kept else decision.failing_filter)
                        if decision
                        else f"extraction:{extracted.error}"
                    ),
                    "decision_other": (("kept" if other.kept else other.failing_filter) if other else "-"),
                }
            )
        return out

    one_round()  # warm-up: trafilatura's first-call setup, the language model, the word lists
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    rounds = [one_round() for _ in range(args.rounds)]
    wall, cpu_s = time.perf_counter() - wall0, cpu_seconds() - cpu0

    # Our part inside ``extract``: language ID and the word count of the extracted text.
    texts = [r["text"] for r in rounds[0] if r["error"] is None]
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for text in texts:
            identify(text)
            len(words(text))
    ours_in_extract = time.perf_counter() - t0
    after = own_peak_rss_mib()

    extract_s = sum(r["extract_s"] for rnd in rounds for r in rnd)
    filter_s = sum(r["filter_s"] for rnd in rounds for r in rnd)
    filter_other_s = sum(r["filter_other_s"] for rnd in rounds for r in rnd)
    docs = len(pages) * args.rounds
    per_page = []
    for i, (name, html, _) in enumerate(pages):
        runs = [rnd[i] for rnd in rounds]
        per_page.append(
            {
                "name": name,
                "kib": len(html) / 1024,
                "words": runs[0]["n_words"],
                "extract_ms": 1000 * statistics.median(r["extract_s"] for r in runs),
                "filter_ms": 1000 * statistics.median(r["filter_s"] for r in runs),
                "filter_other_ms": 1000 * statistics.median(r["filter_other_s"] for r in runs),
                "decision": runs[0]["decision"],
                "decision_other": runs[0]["decision_other"],
            }
        )
    return {
        "cpu": cpu,
        "pages": len(pages),
        "rounds": args.rounds,
        "docs": docs,
        "filtered_docs": len(texts) * args.rounds,
        "extract_s": extract_s,
        "filter_s": filter_s,
        "filter_other_s": filter_other_s,
        "ours_in_extract_s": ours_in_extract,
        "wall_s": wall,
        "process_cpu_s": cpu_s,
        "docs_per_s": docs / (extract_s + filter_s),
        "filter_share": filter_s / extract_s,
        "filter_other_share": filter_other_s / extract_s,
        "peak_before_mib": before,
        "peak_after_mib": after,
        "per_page": per_page,
    }


# --- driver -----------------------------------------------------------------------------------------


def in_subprocess(worker: str, args: argparse.Namespace, **extra: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        worker,
        "--pages",
        str(args.pages),
        "--concurrency",
        str(args.concurrency),
        "--latency",
        str(args.latency),
        "--rounds",
        str(args.rounds),
        "--html",
        str(args.html),
        "--server",
        args.server,
    ]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> str:
    import lxml.etree
    import trafilatura

    return machine_summary(
        {"trafilatura": trafilatura.__version__, "lxml": ".".join(map(str, lxml.etree.LXML_VERSION[:3]))}
    )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=640, help="URLs to fetch (default 640)")
    parser.add_argument("--concurrency", type=int, default=32, help="fetch_concurrency = fetch_per_host (default 32)")
    parser.add_argument("--latency", type=float, default=0.2, help="server latency per response, s (default 0.2)")
    parser.add_argument("--rounds", type=int, default=10, help="extraction rounds over the pages (default 10)")
    parser.add_argument("--html", type=Path, default=DEFAULT_HTML, help=f"real pages (default {DEFAULT_HTML})")
    parser.add_argument(
        "--server",
        choices=("process", "inline"),
        default="process",
        help="news server in a child process (default) or in the fetching process",
    )
    parser.add_argument("--fetch-pages", default="real,generated", help="page sets to fetch: real, generated or both")
    parser.add_argument("--skip-extract", action="store_true")
    parser.add_argument("--worker", choices=("fetch", "extract"), help=argparse.SUPPRESS)
    parser.add_argument("--page-set", choices=("real", "generated"), default="real", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "fetch":
        print(json.dumps(run_fetch(args)))
        return
    if args.worker == "extract":
        print(json.dumps(run_extract(args)))
        return

    print(f"machine: {machine()}")
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (VM clock); {load()}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    real = args.html.is_dir() and any(args.html.glob("*.html"))
    print(f"pages: {args.html if real else 'generated (page_html): ' + str(args.html) + ' is absent'}\n")

    fetch_results = []
    for page_set in [p.strip() for p in args.fetch_pages.split(",") if p.strip()]:
        r = in_subprocess("fetch", args, page_set=page_set)
        fetch_results.append(r)
        mib = r["bytes"] / 2**20
        print(
            f"1. fetch, {page_set} pages ({r['pages']} URLs, {mib:,.1f} MiB, mean {r['bytes'] / max(1, r['pages']) / 1024:,.1f} "
            f"KiB; server {r['server']}; concurrency {r['concurrency']}, latency {r['latency_s'] * 1000:.0f} ms, robots on)"
        )
        print(f"   outcomes {r['counts']}; {r['elapsed_s']:.2f} s wall")
        print(
            f"   achieved {r['achieved_per_s']:.1f} pages/s, ideal {r['ideal_per_s']:.1f} pages/s: "
            f"ratio {r['ratio']:.3f}  (ceiling with the robots.txt round trip {r['ceiling_with_robots']:.3f})"
        )
        print(
            f"   server max_in_flight {r['max_in_flight']}; {r['requests']} requests "
            f"({r['robots_requests']} robots.txt); per URL median {r['per_url_median_s']:.3f} s, "
            f"p95 {r['per_url_p95_s']:.3f} s, max {r['per_url_max_s']:.3f} s"
        )
        server_cpu = f", server {r['server_cpu_s']:.2f} s" if r.get("server_cpu_s") is not None else ""
        print(
            f"   CPU: client {r['client_cpu_s']:.2f} s{server_cpu}; stored {r['stored_gz_bytes'] / 2**20:,.1f} MiB gzip"
        )
        print(
            f"   peak RSS (VmHWM, fresh process): {r['peak_before_mib']:.0f} MiB after imports -> "
            f"{r['peak_after_mib']:.0f} MiB after the fetch\n"
        )

    ext = None
    if not args.skip_extract:
        ext = in_subprocess("extract", args)
        print(
            f"2. extract + filter: {ext['pages']} pages x {ext['rounds']} rounds = {ext['docs']} documents "
            f"({ext['filtered_docs']} filtered), one process pinned to CPU {ext['cpu']}"
        )
        print(
            f"   {'page':36s} {'KiB':>6s} {'words':>6s} {'extract ms':>10s} {'filter ms':>9s} {'share':>6s} "
            f"{PROFILE + ' decision':24s} {OTHER_PROFILE + ' ms':>10s} {OTHER_PROFILE}"
        )
        for p in ext["per_page"]:
            share = p["filter_ms"] / p["extract_ms"] if p["extract_ms"] else 0.0
            print(
                f"   {p['name']:36s} {p['kib']:6.0f} {p['words']:6d} {p['extract_ms']:10.1f} {p['filter_ms']:9.2f} "
                f"{share:6.1%} {p['decision']:24s} {p['filter_other_ms']:10.2f} {p['decision_other']}"
            )
        print(
            f"   totals: extract {ext['extract_s']:.2f} s (of which language ID + word count of the text "
            f"{ext['ours_in_extract_s']:.2f} s), filter_document[{PROFILE}] {ext['filter_s']:.2f} s, "
            f"[{OTHER_PROFILE}] {ext['filter_other_s']:.2f} s; process CPU {ext['process_cpu_s']:.2f} s "
            f"over {ext['wall_s']:.2f} s wall"
        )
        print(f"   docs/s per core: {ext['docs_per_s']:.1f}  (documents / (extract + {PROFILE} filter seconds))")
        print(
            f"   filter share: {ext['filter_share']:.1%} of extraction time ({OTHER_PROFILE}: "
            f"{ext['filter_other_share']:.1%})"
        )
        print(
            f"   peak RSS (VmHWM, fresh process): {ext['peak_before_mib']:.0f} MiB after imports and pages -> "
            f"{ext['peak_after_mib']:.0f} MiB after the rounds\n"
        )

    print(f"goals ({load()}):")
    for r in fetch_results:
        print(
            f"  fetch throughput ({r['page_set']} pages) = {r['ratio']:.3f} of ideal, max in flight "
            f"{r['max_in_flight']}  goal >= {GOALS['fetch_ratio']}: {verdict(r['ratio'] >= GOALS['fetch_ratio'])}"
        )
    if ext:
        print(
            f"  filter share = {ext['filter_share']:.1%} of extraction ({ext['docs_per_s']:.1f} docs/s/core)  "
            f"goal <= {GOALS['filter_share']:.0%}: {verdict(ext['filter_share'] <= GOALS['filter_share'])}"
        )
    peaks = {f"fetch {r['page_set']}": r["peak_after_mib"] for r in fetch_results}
    if ext:
        peaks["extract + filter"] = ext["peak_after_mib"]
    print("  peak RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in peaks.items()))


if __name__ == "__main__":
    main()
