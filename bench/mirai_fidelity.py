"""What an agent reads in mode mirai, against what MIRAI's own, unmodified code prints: random API
calls replayed through MIRAI's ``APIs/api_implementation.py`` (github.com/yecchen/MIRAI, fetched at
run time: it has no licence and is not in this repository) and through ours, reporting the share of
calls with the same answer (up to the order of ties MIRAI leaves to chance) and with the same text.
Not a test: CI never needs MIRAI's code. Run as

    python bench/mirai_fidelity.py --mirai-python /tmp/mirai-venv/bin/python [--mirai DIR]

``--mirai DIR``: a MIRAI checkout (work tree or git directory); without it the bench runs
``git clone https://github.com/yecchen/MIRAI`` into its work directory. ``--mirai-python``: a Python
with MIRAI's pinned pandas (1.5.1; any pandas < 3), numpy and rank_bm25.

Method (printed with the results):

- one generated database (testbed.database, three months, the last one split), written in MIRAI's
  files by ``mirai export mirai`` (pipeline/splits/mirai_export.py): MIRAI's module loads
  ``data/MIRAI/data_kg.csv`` and ``data_news.csv`` and ``data/info/*.json`` from it, ours reads the
  database the export came from;
- per seed, ``--calls`` random calls of each of the 14 functions, written as an agent writes a
  single-function action (``get_events(date_range=DateRange(start_date=Date('2024-01-02'), ...),
  head_entities=[ISOCode('USA')])``), each on one of ``--dates`` random query dates of the split
  month (the visible end is the day before: MIRAI gets it by ``set_default_end_date``). Filters
  are drawn from the data (date ranges, 1-3 countries, first- or second-level relations, keywords,
  three-word texts from titles, roles); a third of the country look-ups name the country by a name
  other than its first, and 10% of all of them change the name's case; 10% of ``browse_news_article`` calls ask for a
  title that does not exist and 10% change the title's case;
- MIRAI's side: ``eval`` of the action in the module's namespace, its observation as MIRAI's loop
  (agents/react_agents.py, ReactAgent.step) makes it: "Empty output from the function call." for
  an empty list or dict, else ``str()`` of the value; an exception makes the call one MIRAI does
  not answer. Its embedding client is a stub that refuses (``openai``), and the two embedding files
  it loads are zero arrays, so a name that is not an exact key is an error there. Its numpy runs
  with the AVX-512 features disabled (``NPY_DISABLE_CPU_FEATURES``), so that its sorts order ties
  as numpy does on a machine without AVX-512 (its SIMD sorts order equal numbers otherwise, and
  differently on every CPU generation; ``--mirai-simd`` keeps them);
- our side, ``environment``: the action through mode mirai's own path (pipeline/evaluation/
  mirai_mode.py: the expression parsed, run in the sandbox child of an Environment with MIRAI's
  counting and rendering), the observation it shows the model; ``module``: the drop-in module
  pipeline/agent_api/mirai_api.py, ``eval`` in its namespace as MIRAI's loop would;
- "same text": the two observations are equal strings. "Same answer up to ties": the values are
  equal once the order MIRAI leaves to chance is ignored (equal dates, counts or BM25 scores, and
  the order of ``get_events`` with a text, which MIRAI returns as a set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path

from common import call_pools, draw_api_calls, machine
from pipeline.agent_api.environment import API_FUNCTIONS

MIRAI_URL = "https://github.com/yecchen/MIRAI"

# Runs in MIRAI's interpreter, in its APIs/ directory: reads [{"cutoff", "action"}] on stdin and
# writes, per call, MIRAI's observation and a canonical form of the value (or the error).
DRIVER = r"""
import json, os, sys, types
os.environ.setdefault("OPENAI_API_KEY", "unused")
stub = types.ModuleType("openai")
class _Embedding:
    @staticmethod
    def create(*args, **kwargs):
        raise RuntimeError("no embedding service in this measurement")
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
        return [[k.code, int(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, api.Date):
        return value.date
    if hasattr(value, "item"):
        return value.item()
    return value

namespace = vars(api)
out = []
for call in json.load(sys.stdin):
    api.set_default_end_date(call["cutoff"])
    try:
        value = eval(call["action"], namespace)
    except Exception as exc:
        out.append({"error": type(exc).__name__ + ": " + str(exc)[:300]})
        continue
    empty = type(value) in (list, dict) and len(value) == 0
    out.append({"text": "Empty output from the function call." if empty else str(value), "value": canon(value)})
json.dump(out, sys.stdout)
"""


def canon(value):
    """Our value in the driver's canonical form."""
    from pipeline.agent_api import types

    if isinstance(value, types.Country):
        return ["Country", value.iso_code.code, value.name]
    if isinstance(value, types.Relation):
        return ["Relation", value.cameo_code.code, value.name, value.description]
    if isinstance(value, types.Event):
        return [value.date.date, value.head_entity.code, value.relation.code, value.tail_entity.code]
    if isinstance(value, dict):
        return [[k.code, v] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, types.Date):
        return value.date
    return value


# --- the calls ------------------------------------------------------------------------------------


def _lit(value) -> str:
    return repr(value)


def _date_range(bounds) -> str:
    start, end = bounds
    parts = [f"start_date=Date({_lit(start)})" if start else None, f"end_date=Date({_lit(end)})" if end else None]
    return f"DateRange({', '.join(p for p in parts if p)})"


def _action(fn: str, args: dict) -> str:
    shown = []
    for key, value in args.items():
        if value is None:
            continue
        if key == "date_range":
            text = _date_range(value)
        elif key in ("head_entities", "tail_entities", "interacted_entities"):
            text = "[" + ", ".join(f"ISOCode({_lit(v)})" for v in value) + "]"
        elif key in ("relations", "involved_relations"):
            text = "[" + ", ".join(f"CAMEOCode({_lit(v)})" for v in value) + "]"
        elif key == "iso_code":
            text = f"ISOCode({_lit(value)})"
        elif key == "cameo_code":
            text = f"CAMEOCode({_lit(value)})"
        elif key == "date":
            text = f"Date({_lit(value)})"
        else:
            text = _lit(value)
        shown.append(f"{key}={text}")
    return f"{fn}({', '.join(shown)})"


def _case_change(rng: random.Random, text: str) -> str:
    changed = rng.choice([text.lower(), text.upper(), text.swapcase()])
    return changed if changed != text else text.swapcase() + " "


def draw_calls(data_dir: Path, export: Path, month: date, n: int, dates: int, seed: int) -> list[dict]:
    """``n`` random calls of each function on ``dates`` random query dates of ``month``, each with
    its action."""
    rng = random.Random(seed)
    pools = call_pools(data_dir, seed)
    relations = json.loads((export / "data/info/dict_code2relation.json").read_text())
    alternames = json.loads((export / "data/info/dict_iso2alternames_GeoNames.json").read_text())
    others = [(iso, name) for iso, names in alternames.items() for name in names[1:]]
    days = (month.replace(day=28) - month).days + 1
    query_dates = sorted({month + timedelta(days=rng.randrange(days)) for _ in range(dates)})

    def country_name() -> str:
        name = rng.choice(others)[1] if rng.random() < 1 / 3 else alternames[rng.choice(pools.countries)][0]
        return _case_change(rng, name) if rng.random() < 0.1 else name

    def title(real: str) -> str:
        draw = rng.random()
        if draw < 0.1:
            return real + " (no such article)"
        return _case_change(rng, real) if draw < 0.2 else real

    calls = draw_api_calls(
        rng,
        pools,
        relations,
        n,
        query_date=lambda: rng.choice(query_dates),
        country_name=country_name,
        relation_description=lambda code: relations[code][rng.choice(["Name", "Description"])],
        title=title,
        ranges_without_start=True,
    )
    for call in calls:
        call["action"] = _action(call["fn"], call["args"])
    return calls


# --- the three sides ------------------------------------------------------------------------------


# numpy's AVX-512 sorts (numpy 1.26, MIRAI's pin) order equal numbers differently from its portable
# sort, which is what numpy uses on a machine without AVX-512; disabled unless --mirai-simd.
AVX512 = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"


def run_mirai(scratch: Path, python: str, calls: list[dict], simd: bool) -> list[dict]:
    env = dict(os.environ) if simd else {**os.environ, "NPY_DISABLE_CPU_FEATURES": AVX512}
    done = subprocess.run(
        [python, str(scratch / "driver.py")],
        input=json.dumps([{"cutoff": c["cutoff"], "action": c["action"]} for c in calls]),
        capture_output=True,
        text=True,
        cwd=scratch / "APIs",
        env=env,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"MIRAI's side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def run_environment(data_dir: Path, calls: list[dict], rendering: str) -> list[dict]:
    """Each action through mode mirai's path: its observation and our value (the same call in
    this process, for the answer comparison), with the candidate articles' BM25 scores of a news
    search with a text (so that lists differing only among equal scores count as ties)."""
    from pipeline.agent_api import EventDatabase
    from pipeline.agent_api.sandbox_child import agent_namespace
    from pipeline.evaluation.mirai_mode import _mirai_act, invalid_observation
    from pipeline.evaluation.trajectory import Step

    database = EventDatabase(data_dir)
    out: list[dict] = [{} for _ in calls]
    by_date: dict[str, list[int]] = defaultdict(list)
    for i, call in enumerate(calls):
        by_date[call["query_date"]].append(i)
    for query_date, indices in sorted(by_date.items()):
        env = database.environment(
            date.fromisoformat(query_date), 1, count_both_actors=rendering == "mirai", dialect=rendering
        )
        namespace = agent_namespace(env)
        try:
            for i in indices:
                call, step = calls[i], Step(index=0, kind="react", reply="")
                if _mirai_act(env, call["action"], "single_function", step):
                    result = {"text": step.observation}
                else:
                    result = {
                        "text": invalid_observation(step.error.removeprefix("invalid action: "), "single_function")
                    }
                try:
                    result["value"] = canon(eval(call["action"], namespace))
                except Exception as exc:
                    result["error"] = f"{type(exc).__name__}: {exc}"
                if call["fn"] == "get_news_articles" and call["args"].get("text_description"):
                    result["scores"] = candidate_scores(env, namespace, call)
                out[i] = result
        finally:
            env.close()
    return out


def run_module(data_dir: Path, calls: list[dict]) -> list[dict]:
    """Each action through the drop-in module, as MIRAI's loop would show it."""
    import pipeline.agent_api.mirai_api as api
    from pipeline.evaluation.mirai_mode import EMPTY_VALUE

    api.open_database(data_dir)
    namespace = vars(api)
    out = []
    for call in calls:
        api.set_default_end_date(call["cutoff"])
        try:
            value = eval(call["action"], namespace)
        except Exception as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}", "text": None})
            continue
        empty = type(value) in (list, dict) and len(value) == 0
        out.append({"text": EMPTY_VALUE if empty else str(value), "value": canon(value)})
    api.close_database()
    return out


def candidate_scores(env, namespace: dict, call: dict) -> dict[str, float]:
    """BM25 score of every article the search ranks, by "date|title" (our scores equal rank_bm25's
    bit for bit: tests/test_agent_api.py)."""
    import polars as pl

    from pipeline.agent_api.bm25 import mirai_tokens, okapi_scores

    args = eval(call["action"].replace("get_news_articles(", "dict(", 1), namespace)
    articles = env._matching_articles(
        *(args.get(key) for key in ("date_range", "head_entities", "tail_entities", "relations", "keywords"))
    )
    tokens = articles.select(mirai_tokens(pl.col("title"), pl.col("text"))).to_series()
    values = okapi_scores(tokens, args["text_description"].split(" "))
    return {f"{d}|{t}": float(v) for (d, t), v in zip(articles.select("date", "title").iter_rows(), values)}


# --- comparison -----------------------------------------------------------------------------------


def category(call: dict) -> str:
    fn, args = call["fn"], call["args"]
    if fn in ("get_events", "get_news_articles"):
        return f"{fn} ({'text' if args.get('text_description') else 'no text'})"
    if fn == "get_entity_distribution":
        return f"{fn} (role {'head/tail' if args.get('entity_role') in ('head', 'tail') else 'both/None'})"
    return fn


def same_up_to_ties(call: dict, a, b, scores: dict[str, float] | None) -> bool:
    """Equal but for what MIRAI leaves to chance: the order among equal dates (pandas' unstable
    sort), equal counts, equal BM25 scores (numpy's unstable argsort), and the order of get_events
    with a text (a set's)."""
    if a == b:
        return True
    if not (isinstance(a, list) and isinstance(b, list)):
        return False
    fn, text = call["fn"], call["args"].get("text_description")
    if fn in ("get_entity_distribution", "get_relation_distribution") or (fn == "get_events" and text):
        return sorted(map(tuple, a)) == sorted(map(tuple, b))
    if fn == "get_news_articles" and text:
        keys_a, keys_b = ([f"{d}|{t}" for d, t in x] for x in (a, b))
        if len(a) != len(b) or not set(keys_a) | set(keys_b) <= (scores or {}).keys():
            return False
        return [scores[k] for k in keys_a] == [scores[k] for k in keys_b]
    if fn in ("get_events", "get_news_articles"):
        cap = 30 if fn == "get_events" else 15
        if [x[0] for x in a] != [x[0] for x in b]:
            return False
        boundary = a[-1][0] if len(a) == cap else None
        return {tuple(x) for x in a if x[0] != boundary} == {tuple(x) for x in b if x[0] != boundary}
    return False


def compare(calls: list[dict], mirai: list[dict], ours: list[dict]) -> dict[str, list[int]]:
    """Per category: [calls, MIRAI answers, same answer, same up to ties, same text] (the last three
    over the calls MIRAI answers)."""
    stats: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for call, theirs, mine in zip(calls, mirai, ours):
        s = stats[category(call)]
        s[0] += 1
        if "error" in theirs:
            continue
        s[1] += 1
        if "value" in mine:
            s[2] += mine["value"] == theirs["value"]
            s[3] += same_up_to_ties(call, mine["value"], theirs["value"], mine.get("scores"))
        s[4] += mine.get("text") == theirs["text"]
    return stats


def report(title: str, stats: dict[str, list[int]]) -> tuple[int, int, int, int, int]:
    print(f"\n{title}")
    print(f"{'function':46} {'calls':>6} {'MIRAI answers':>13} {'same':>6} {'up to ties':>10} {'same text':>9}")
    total = [0] * 5
    for name in sorted(stats, key=lambda c: (API_FUNCTIONS.index(c.split(" ")[0]), c)):
        s = stats[name]
        total = [t + v for t, v in zip(total, s)]
        print(f"{name:46} {s[0]:6d} {s[1]:13d} {s[2]:6d} {s[3]:10d} {s[4]:9d}")
    n, answered = total[0], total[1]
    print(f"{'all':46} {n:6d} {answered:13d} {total[2]:6d} {total[3]:10d} {total[4]:9d}")
    print(
        f"over the {answered} calls MIRAI answers: same answer {100 * total[2] / answered:.1f}%, "
        f"up to ties {100 * total[3] / answered:.1f}%, same text {100 * total[4] / answered:.1f}%"
    )
    return tuple(total)


def mirai_source(args, work: Path) -> bytes:
    """MIRAI's APIs/api_implementation.py, byte for byte, from --mirai or a fresh clone."""
    repo = args.mirai
    if repo is None:
        repo = work / "MIRAI"
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", MIRAI_URL, str(repo)], check=True)
    tree_file = repo / "APIs" / "api_implementation.py"
    if tree_file.is_file():
        return tree_file.read_bytes()
    return subprocess.run(
        ["git", "-C", str(repo), "show", "HEAD:APIs/api_implementation.py"], capture_output=True, check=True
    ).stdout


def build_data(args, month: date, work: Path) -> Path:
    from datetime import UTC, datetime

    from pipeline.config import DatasetSettings, GdeltSettings
    from pipeline.splits.split import Override, build_split
    from testbed.database import generate_event_database

    data = work / "data"
    first = (month - timedelta(days=40)).replace(day=1)
    generate_event_database(data, first, 3, seed=21, quads_per_day=args.quads_per_day)
    now = datetime.now(UTC)
    build_split(
        month, DatasetSettings(data_dir=data), GdeltSettings(), now=now, override=Override("bench", "bench", now)
    )
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirai", type=Path, help=f"a checkout of {MIRAI_URL} (default: clone it)")
    parser.add_argument("--mirai-python", required=True, help="a Python with pandas<3, numpy and rank_bm25")
    parser.add_argument("--data", type=Path, help="a data directory with the month's split (default: generate one)")
    parser.add_argument("--month", default="2024-01")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--calls", type=int, default=200, help="random calls per function and seed")
    parser.add_argument("--dates", type=int, default=8, help="query dates per seed (one sandbox each)")
    parser.add_argument("--quads-per-day", type=int, default=60)
    parser.add_argument(
        "--rendering", choices=("mirai", "native"), default="mirai", help="the environment's text (native: before)"
    )
    parser.add_argument(
        "--mirai-simd", action="store_true", help="let MIRAI's numpy use its AVX-512 sorts (ties in another order)"
    )
    parser.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    args = parser.parse_args()

    import numpy as np

    from pipeline.splits.mirai_export import export_mirai

    month = date.fromisoformat(f"{args.month}-01")
    work = args.work or Path(tempfile.mkdtemp(prefix="mirai-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    data = args.data or build_data(args, month, work)
    export = work / "export"
    export_mirai(month, data, export)
    scratch = work / "scratch"
    (scratch / "APIs").mkdir(parents=True, exist_ok=True)
    (scratch / "APIs" / "api_implementation.py").write_bytes(mirai_source(args, work))
    (scratch / "driver.py").write_text(DRIVER)
    subprocess.run(["rm", "-rf", str(scratch / "data")], check=True)
    subprocess.run(["cp", "-r", str(export / "data"), str(scratch / "data")], check=True)
    info = scratch / "data" / "info"
    for name, key in (
        ("country_embeddings.npy", "dict_iso2alternames_GeoNames.json"),
        ("relation_embeddings.npy", "dict_code2relation.json"),
    ):
        np.save(info / name, np.zeros((len(json.loads((info / key).read_text())), 8)))
    version = subprocess.run(
        [args.mirai_python, "-c", "import pandas, numpy; print(pandas.__version__, numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()

    print(__doc__.split("Method (printed with the results):")[1].strip())
    print(f"\nmachine: {machine({'polars': __import__('polars').__version__})}")
    simd = "its AVX-512 sorts on" if args.mirai_simd else "NPY_DISABLE_CPU_FEATURES: its portable sorts"
    print(f"MIRAI's side: pandas {version[0]}, numpy {version[1]} ({simd}); our rendering: {args.rendering}")
    totals: dict[str, dict[str, list[int]]] = {
        "environment": defaultdict(lambda: [0] * 5),
        "module": defaultdict(lambda: [0] * 5),
    }
    differences: list[dict] = []
    for seed in args.seeds:
        started = time.perf_counter()
        calls = draw_calls(data, export, month, args.calls, args.dates, seed)
        mirai = run_mirai(scratch, args.mirai_python, calls, args.mirai_simd)
        environment = run_environment(data, calls, args.rendering)
        module = run_module(data, calls)
        for mine, scored in zip(module, environment):  # the same candidates' scores tell ties apart
            if "scores" in scored:
                mine["scores"] = scored["scores"]
        for side, ours in (("environment", environment), ("module", module)):
            stats = compare(calls, mirai, ours)
            summary = report(f"seed {seed}, ours = {side} ({time.perf_counter() - started:.0f} s)", stats)
            print(f"  seed {seed} {side}: {summary}")
            for name, s in stats.items():
                totals[side][name] = [t + v for t, v in zip(totals[side][name], s)]
            for call, theirs, mine in zip(calls, mirai, ours):
                if "error" not in theirs and mine.get("text") != theirs["text"] and len(differences) < 400:
                    differences.append(
                        {
                            "side": side,
                            "seed": seed,
                            "action": call["action"],
                            "cutoff": call["cutoff"],
                            "mirai": theirs["text"][:600],
                            "ours": (mine.get("text") or mine.get("error") or "")[:600],
                        }
                    )
    for side in ("environment", "module"):
        report(f"all seeds {args.seeds}, ours = {side}", totals[side])
    (work / "differences.json").write_text(json.dumps(differences, indent=1))
    print(f"\ndifferences in text (first 400): {work / 'differences.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
