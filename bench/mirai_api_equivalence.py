"""MIRAI's own, unmodified API implementation over `mirai export mirai` output, against our
environment (pipeline.agent_api) over the database it was exported from: the share of random calls
of each function that give the same answer. Not a test: it needs MIRAI's code
(github.com/yecchen/MIRAI, which has no licence and is not in this repository) and a Python with
pandas<3, numpy and rank_bm25 for it. Run as

    python bench/mirai_api_equivalence.py --mirai-repo PATH_TO_MIRAI_GIT --mirai-python /tmp/mirai-venv/bin/python

MIRAI's ``APIs/api_implementation.py`` is copied byte for byte into a scratch directory next to the
export's ``data/`` (it opens ``./../data/...`` relative to its working directory). Only its
embedding client is stubbed: ``openai`` is a module that refuses to be called, and the two
embedding files it loads at import are zero arrays in the scratch directory only, so a call that
would need an embedding (a name that is not an exact key) is not drawn. Method and results:
docs/mirai.md, "Checking the export against MIRAI's code".
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path

from common import call_pools, draw_api_calls
from pipeline.agent_api.environment import API_FUNCTIONS

# The MIRAI side: runs in MIRAI's interpreter, reads calls on stdin, prints answers as JSON.
DRIVER = r"""
import json, os, sys, types
os.environ.setdefault("OPENAI_API_KEY", "unused")
stub = types.ModuleType("openai")
class _Embedding:
    @staticmethod
    def create(*args, **kwargs):
        raise RuntimeError("embedding service not available in this measurement")
stub.Embedding = _Embedding
sys.modules["openai"] = stub
sys.path.insert(0, os.getcwd())
import api_implementation as api

def canon(value):
    if isinstance(value, api.Country):
        return ["Country", value.iso_code.code, value.name]
    if isinstance(value, api.Relation):
        return ["Relation", value.cameo_code.code, value.name, value.description]
    if isinstance(value, api.Event):
        return [value.date.date, value.head_entity.code, value.relation.code, value.tail_entity.code]
    if isinstance(value, dict):
        return [[k.code, v] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, api.Date):
        return value.date
    if hasattr(value, "item"):
        return value.item()
    return value

def build(args):
    out = {}
    for key, value in args.items():
        if value is None:
            continue
        if key == "date_range":
            start, end = value
            out[key] = api.DateRange(api.Date(start) if start else None, api.Date(end) if end else None)
        elif key in ("head_entities", "tail_entities", "interacted_entities"):
            out[key] = [api.ISOCode(v) for v in value]
        elif key in ("relations", "involved_relations"):
            out[key] = [api.CAMEOCode(v) for v in value]
        elif key in ("iso_code",):
            out[key] = api.ISOCode(value)
        elif key in ("cameo_code",):
            out[key] = api.CAMEOCode(value)
        elif key == "date":
            out[key] = api.Date(value)
        else:
            out[key] = value
    return out

results = []
for call in json.load(sys.stdin):
    api.set_default_end_date(call["cutoff"])
    try:
        results.append(canon(getattr(api, call["fn"])(**build(call["args"]))))
    except Exception as exc:
        results.append(["error", type(exc).__name__])
json.dump(results, sys.stdout)
"""


def ours(data_dir: Path, calls: list[dict], mode: str) -> tuple[list, list]:
    """Our answers to ``calls``, and for each news search with a text the BM25 score of every
    candidate article by "date|title" (None for other calls): MIRAI's scores are the same numbers
    (tests/test_agent_api.py checks ours against rank_bm25), so two lists that differ only among
    equal scores can be told apart from a different ranking."""
    from pipeline.agent_api import CAMEOCode, Country, Date, DateRange, Event, EventDatabase, ISOCode, Relation

    def canon(value):
        if isinstance(value, Country):
            return ["Country", value.iso_code.code, value.name]
        if isinstance(value, Relation):
            return ["Relation", value.cameo_code.code, value.name, value.description]
        if isinstance(value, Event):
            return [value.date.date, value.head_entity.code, value.relation.code, value.tail_entity.code]
        if isinstance(value, dict):
            return [[k.code, v] for k, v in value.items()]
        if isinstance(value, (list, tuple)):
            return [canon(v) for v in value]
        if isinstance(value, Date):
            return value.date
        return value

    def build(args):
        out = {}
        for key, value in args.items():
            if value is None:
                continue
            if key == "date_range":
                out[key] = DateRange(Date(value[0]) if value[0] else None, Date(value[1]) if value[1] else None)
            elif key in ("head_entities", "tail_entities", "interacted_entities"):
                out[key] = [ISOCode(v) for v in value]
            elif key in ("relations", "involved_relations"):
                out[key] = [CAMEOCode(v) for v in value]
            elif key == "iso_code":
                out[key] = ISOCode(value)
            elif key == "cameo_code":
                out[key] = CAMEOCode(value)
            elif key == "date":
                out[key] = Date(value)
            else:
                out[key] = value
        return out

    def candidate_scores(env, args: dict) -> dict[str, float]:
        # The articles the search ranks, scored as MIRAI scores them (our own module's helpers).
        import polars as pl

        from pipeline.agent_api.bm25 import mirai_tokens, okapi_scores

        articles = env._matching_articles(
            *(args.get(key) for key in ("date_range", "head_entities", "tail_entities", "relations", "keywords"))
        )
        tokens = articles.select(mirai_tokens(pl.col("title"), pl.col("text"))).to_series()
        values = okapi_scores(tokens, args["text_description"].split(" "))
        return {f"{d}|{t}": float(v) for (d, t), v in zip(articles.select("date", "title").iter_rows(), values)}

    database = EventDatabase(data_dir)
    results, scores = [], []
    for call in calls:
        # Mode mirai counts entities as MIRAI's code does (docs/mirai.md, "The `mirai` mode").
        env = database.environment(
            date.fromisoformat(call["query_date"]), 1, count_both_actors=mode == "mirai", dialect=mode
        )
        function = getattr(env, call["fn"])
        try:
            results.append(canon(function(**build(call["args"]))))
        except Exception as exc:
            results.append(["error", type(exc).__name__])
        text_search = call["fn"] == "get_news_articles" and call["args"].get("text_description")
        scores.append(candidate_scores(env, build(call["args"])) if text_search else None)
        env.close()
    return results, scores


def draw_calls(data_dir: Path, month: date, n: int, seed: int) -> list[dict]:
    """``n`` random calls of each function, each for a random query date of ``month``; the
    countries asked for by their first names, the relations by theirs."""
    from pipeline.reference.tables import country_alternate_names
    from pipeline.splits.mirai_files import relation_dictionary

    rng = random.Random(seed)
    pools = call_pools(data_dir, seed)
    relations = relation_dictionary()
    names = [v[0] for v in country_alternate_names().values()]
    days = (month.replace(day=28) - month).days + 1
    return draw_api_calls(
        rng,
        pools,
        relations,
        n,
        query_date=lambda: month + timedelta(days=rng.randrange(days)),
        country_name=lambda: rng.choice(names),
        relation_description=lambda code: relations[code]["Name"],
    )


def category(call: dict) -> str:
    """The function, split where its two implementations follow different rules (docs/mirai.md)."""
    fn, args = call["fn"], call["args"]
    if fn in ("get_events", "get_news_articles"):
        return f"{fn} ({'text' if args.get('text_description') else 'no text'})"
    if fn == "get_entity_distribution":
        return f"{fn} (role {'head/tail' if args.get('entity_role') in ('head', 'tail') else 'both/None'})"
    return fn


def tie_free_equal(call: dict, a, b, scores: dict[str, float] | None) -> bool:
    """Equal up to what MIRAI leaves unordered: ties in date (its sort is pandas' unstable
    quicksort), in counts, in BM25 score (its ``np.argsort`` is not stable: the order among equal
    scores depends on numpy's build and the CPU), and the order of get_events with a text (MIRAI
    returns a set's list); and up to the "Date('…')" MIRAI's browse_news_article prints where its
    docstring shows the day."""
    if a == b:
        return True
    if call["fn"] == "browse_news_article" and isinstance(a, str) and isinstance(b, str):
        day = call["args"]["date"]
        return b.startswith(f"Date('{day}'):\n") and b.removeprefix(f"Date('{day}')") == a.removeprefix(day)
    if not (isinstance(a, list) and isinstance(b, list)) or (a and a[0] == "error") or (b and b[0] == "error"):
        return False
    fn, args = call["fn"], call["args"]
    if fn in ("get_entity_distribution", "get_relation_distribution"):
        return sorted(map(tuple, a)) == sorted(map(tuple, b))
    if fn == "get_events" and args.get("text_description"):
        return sorted(map(tuple, a)) == sorted(map(tuple, b))
    if fn == "get_news_articles" and args.get("text_description"):
        keys_a, keys_b = ([f"{d}|{t}" for d, t in x] for x in (a, b))
        if len(a) != len(b) or not set(keys_b) <= scores.keys():
            return False
        return [scores[k] for k in keys_a] == [scores[k] for k in keys_b]
    if fn in ("get_events", "get_news_articles") and not args.get("text_description"):
        cap = 30 if fn == "get_events" else 15
        dates_a, dates_b = [x[0] for x in a], [x[0] for x in b]
        if dates_a != dates_b:
            return False
        boundary = dates_a[-1] if len(a) == cap else None
        return {tuple(x) for x in a if x[0] != boundary} == {tuple(x) for x in b if x[0] != boundary}
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirai-repo", type=Path, required=True, help="a git directory of github.com/yecchen/MIRAI")
    parser.add_argument("--mirai-python", required=True, help="a Python with pandas<3, numpy, rank_bm25")
    parser.add_argument("--data", type=Path, help="a data directory with a split (default: generate one)")
    parser.add_argument("--month", default="2024-01")
    parser.add_argument("--calls", type=int, default=120, help="random calls per function")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mode", choices=("mirai", "native"), default="mirai", help="our environment as mode mirai or native sets it"
    )
    args = parser.parse_args()

    import numpy as np

    from pipeline.splits.mirai_export import export_mirai

    month = date.fromisoformat(f"{args.month}-01")
    work = Path(tempfile.mkdtemp(prefix="mirai-equivalence-"))
    data = args.data
    if data is None:
        from datetime import UTC, datetime

        from pipeline.config import DatasetSettings, GdeltSettings
        from pipeline.splits.split import Override, build_split
        from testbed.database import generate_event_database

        data = work / "data"
        first = (month - timedelta(days=40)).replace(day=1)  # two months before, then the month
        generate_event_database(data, first, 3, seed=args.seed + 21, quads_per_day=60)
        now = datetime.now(UTC)
        build_split(
            month,
            DatasetSettings(data_dir=data),
            GdeltSettings(),
            now=now,
            override=Override("bench", "measurement", now),
        )
    export_mirai(month, data, work / "export")
    scratch = work / "mirai"
    (scratch / "APIs").mkdir(parents=True)
    source = subprocess.run(
        ["git", "-C", str(args.mirai_repo), "show", "HEAD:APIs/api_implementation.py"],
        capture_output=True,
        check=True,
    ).stdout
    (scratch / "APIs" / "api_implementation.py").write_bytes(source)
    (scratch / "driver.py").write_text(DRIVER)
    subprocess.run(["cp", "-r", str(work / "export" / "data"), str(scratch / "data")], check=True)
    info = scratch / "data" / "info"
    for name, key in (
        ("country_embeddings.npy", "dict_iso2alternames_GeoNames.json"),
        ("relation_embeddings.npy", "dict_code2relation.json"),
    ):
        np.save(info / name, np.zeros((len(json.loads((info / key).read_text())), 8)))

    calls = draw_calls(data, month, args.calls, args.seed)
    mine, mine_scores = ours(data, calls, args.mode)
    done = subprocess.run(
        [args.mirai_python, str(scratch / "driver.py")],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        cwd=scratch / "APIs",
        check=False,
    )
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    theirs = json.loads(done.stdout)
    stats: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    examples: dict[str, list] = defaultdict(list)
    for call, a, b, scores in zip(calls, mine, theirs, mine_scores):
        s = stats[category(call)]
        s[0] += 1
        s[1] += a == b
        same = tie_free_equal(call, a, b, scores)
        s[2] += same
        if not same and len(examples[category(call)]) < 3:
            examples[category(call)].append({"call": call, "ours": str(a)[:300], "mirai": str(b)[:300]})
    crashed = sum(1 for b in theirs if b == ["error", "ZeroDivisionError"])
    print(f"{'function':46} {'calls':>5} {'equal':>6} {'equal up to ties':>17}")
    total = [0, 0, 0]
    for name in sorted(stats, key=lambda c: (API_FUNCTIONS.index(c.split(" ")[0]), c)):
        n, strict, loose = stats[name]
        total = [total[0] + n, total[1] + strict, total[2] + loose]
        print(f"{name:46} {n:5d} {strict:6d} {loose:17d}")
    print(
        f"{'all':46} {total[0]:5d} {total[1]:6d} {total[2]:17d}  "
        f"({100 * total[1] / total[0]:.1f}% / {100 * total[2] / total[0]:.1f}%)"
    )
    print(f"MIRAI raised ZeroDivisionError (BM25 over no articles) on {crashed} calls; ours returned []")
    answered = total[0] - crashed
    print(
        f"over the {answered} calls MIRAI answers: {100 * total[1] / answered:.1f}% equal, "
        f"{100 * total[2] / answered:.1f}% up to ties"
    )
    (work / "differences.json").write_text(json.dumps(examples, indent=1))
    print(f"examples of differences: {work / 'differences.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
