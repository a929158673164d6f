"""``mirai score``: score a predictions file against a split, from a downloaded release alone.

A predictions file is untrusted (docs/evaluation.md, "Score your own predictions"): the split and
the file are read by pipeline/evaluation/score_inputs.py; this module checks each record against
the split's queries and scores them. Every problem is one line naming its line or record, at most
MAX_PROBLEMS_SHOWN of them shown.

Strict by default: any problem refuses the file (InvalidPredictions). Lenient scoring reads the
answers as MIRAI's agent_evaluation/eval.py does (metrics.clean_prediction: what is invalid
counts as empty) and lists the problems it forgave. A query with no prediction scores as an empty
answer in both modes, and is listed.

The per-query scores are metrics.query_scores, reciprocal_rank and hit (the numbers run.py
stores); each reported metric is their mean over queries with a percentile bootstrap interval
over queries, drawn from numpy's Generator with the given seed, so the same input and seed give
the same scorecard bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.evaluation.metrics import SET_METRICS, clean_ranking, hit, query_scores, reciprocal_rank, to_answer_dict
from pipeline.evaluation.mirai_predictions import count_rounds, is_query_id, listed_codes
from pipeline.evaluation.score_inputs import (
    MAX_RANKED,
    ScoringError,
    Split,
    Submitted,
    load_split,
    read_capped,
    read_submission,
    relation_query_file_ids,
)
from pipeline.evaluation.subsets import limit_ids, subset_record
from pipeline.reference.tables import level1_codes, level2_codes
from pipeline.release.layout import shown

SCORECARD_FORMAT = "mirai-scorecard-v1"
MAX_PROBLEMS_SHOWN = 50
DEFAULT_RESAMPLES = 1000
MAX_RESAMPLES = 100_000
BOOTSTRAP_CHUNK = 500  # resamples drawn at once: 500 × 2,000 queries of counts is 8 MB
HIT_K = 10  # as run.py (MIRAI Appendix D.8)
RANKED_METRICS = ("mrr", f"hit_at_{HIT_K}")
METRICS = (*SET_METRICS, *RANKED_METRICS)
# Shown in the Markdown table (the JSON scorecard has every metric).
TABLE_METRICS = (
    "level1_precision",
    "level1_recall",
    "level1_f1",
    "level2_precision",
    "level2_recall",
    "level2_f1",
    "binary_kl",
    "quad_kl",
    "mrr",
    f"hit_at_{HIT_K}",
)
_CODE = {1: re.compile(r"[0-9]{2}"), 2: re.compile(r"[0-9]{3}")}  # fullmatch: "$" also matches before a final newline


class InvalidPredictions(ScoringError):
    """Strict scoring refused the predictions: ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s); nothing was scored (--lenient scores as eval.py)")


# --- checking ---------------------------------------------------------------------------------------


def _code_problem(code: object, level: int) -> str | None:
    if not isinstance(code, str):
        return f"code {shown(code)} is {type(code).__name__}, not a string"
    if not _CODE[level].fullmatch(code):
        return f"code {shown(code)} is malformed (a level-{level} code is {level + 1} digits)"
    if code not in (level1_codes() if level == 1 else level2_codes()):
        return f"code {shown(code)} is not a CAMEO level-{level} code"
    return None


def _ranked_problems(ranked: object, field: str) -> list[str]:
    if not isinstance(ranked, list):
        return [f"{field} is {type(ranked).__name__}, not a list of codes"]
    if len(ranked) > MAX_RANKED:
        return [f"{field} holds more than {MAX_RANKED} codes"]
    return [f"{field}: {p}" for p in (_code_problem(c, 2) for c in ranked) if p]


def answer_problems(answer: object, ranked: object) -> list[str]:
    """What strict scoring refuses in one record's answer and ranked list (empty when valid)."""
    problems = []
    if answer is None and ranked is None:
        problems.append("no answer and no ranked list")
    elif isinstance(answer, list):
        problems += _ranked_problems(answer, "answer")
    elif isinstance(answer, dict):
        for key, codes in answer.items():
            problem = _code_problem(key, 1)
            if problem:
                problems.append(f"answer key: {problem}")
                continue
            if not isinstance(codes, list):
                problems.append(f"answer[{key!r}] is {type(codes).__name__}, not a list of codes")
                continue
            for code in codes:
                problem = _code_problem(code, 2)
                if problem:
                    problems.append(f"answer[{key!r}]: {problem}")
                elif code[:2] != key:
                    problems.append(f"answer[{key!r}]: code {code!r} belongs under {code[:2]!r}")
    elif answer is not None:
        problems.append(f"answer is {type(answer).__name__}, not an answer dict or a list of codes")
    if ranked is not None:
        problems += _ranked_problems(ranked, "ranked")
    return problems


def p_event_problem(value: object) -> str | None:
    """Why a record's p_event is not absent or a probability (a finite number from 0 to 1)."""
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 1:
        return f"p_event {shown(value)} is not a probability from 0 to 1"
    return None


def _as_scored(record: Submitted) -> tuple[object, list]:
    """(answer, ranking) as scored: a list answer is its codes grouped by level-1 code and also the
    ranking; a record with only ``ranked`` answers its codes; else the ranking is ``ranked`` or the
    answer's codes in the order written (as run.py and mirai_predictions.score_round)."""
    answer, ranked = record.answer, record.ranked
    if isinstance(answer, list) or (answer is None and isinstance(ranked, list)):
        codes = answer if isinstance(answer, list) else ranked
        answer = to_answer_dict(clean_ranking(codes[:MAX_RANKED]))
        ranked = ranked if isinstance(ranked, list) else codes
    if not isinstance(ranked, list):
        ranked = listed_codes(answer)
    return answer, ranked[:MAX_RANKED]


def match_queries(
    rounds: Sequence[Sequence[Submitted]],
    gold: Mapping[str, object],
    left_out: Collection[str] = (),
    known_as: str = "the split",
) -> tuple[list[dict[str, tuple[object, list]]], list[str], list[str]]:
    """Per round, query_id → (answer, ranking) as scored; the problems, each naming its record
    (malformed, unknown or duplicate query ids; invalid answers, a duplicate's too); and the
    queries with no prediction in some round. Of duplicates the first record is scored.
    ``left_out``: the split's queries that a --limit subset leaves out (said so when answered);
    ``known_as``: what an unknown query id is not in, as the refusal names it."""
    matched, problems, missing = [], [], set()
    for records in rounds:
        found: dict[str, tuple[object, list]] = {}
        for record in records:
            query_id = record.query_id
            if not is_query_id(query_id):
                problems.append(f"{record.where}: query_id {shown(query_id)} is not a query id")
                continue
            if query_id not in gold:
                where = "the --limit subset" if query_id in left_out else known_as
                problems.append(f"{record.where}: unknown query_id {query_id!r} (not in {where})")
                continue
            problems += [f"{record.where}: {p}" for p in answer_problems(record.answer, record.ranked)]
            problem = p_event_problem(record.p_event)
            if problem:
                problems.append(f"{record.where}: {problem}")
            if query_id in found:
                problems.append(f"{record.where}: duplicate query_id {query_id!r} (the first is scored)")
                continue
            found[query_id] = _as_scored(record)
        missing |= set(gold) - set(found)
        matched.append(found)
    return matched, problems, [q for q in gold if q in missing]


# --- scoring ------------------------------------------------------------------------------------------


def per_query_scores(matched: Sequence[Mapping[str, tuple[object, list]]], gold: Mapping[str, dict]) -> np.ndarray:
    """queries × METRICS: each query's scores (metrics.query_scores, reciprocal_rank, hit at
    HIT_K, in percent as metrics.mrr and hit_at_k), averaged over rounds; a missing query is an
    empty answer."""
    out = np.zeros((len(gold), len(METRICS)))
    for found in matched:
        for i, (query_id, answer) in enumerate(gold.items()):
            prediction, ranking = found.get(query_id, ({}, []))
            row = query_scores(prediction, answer)
            row["mrr"] = 100 * reciprocal_rank(ranking, answer)
            row[f"hit_at_{HIT_K}"] = 100 * hit(ranking, answer, HIT_K)
            out[i] += [row[m] for m in METRICS]
    return out / len(matched)


def bootstrap_means(scores: np.ndarray, seed: int, resamples: int = DEFAULT_RESAMPLES) -> np.ndarray:
    """resamples × metrics: the metric means of each of ``resamples`` resamples of the queries with
    replacement, drawn by numpy's Generator from ``seed``. A resample is a row of counts (how often
    each query is drawn), so all the means are one matrix product per BOOTSTRAP_CHUNK resamples
    (which bounds the memory), not a loop per resample."""
    n = scores.shape[0]
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        size = min(BOOTSTRAP_CHUNK, resamples - start)
        draws = rng.integers(0, n, size=(size, n))
        counts = np.bincount((draws + n * np.arange(size)[:, None]).ravel(), minlength=size * n)
        means.append(counts.reshape(size, n).astype(float) @ scores / n)
    return np.concatenate(means)


def bootstrap_intervals(scores: np.ndarray, seed: int, resamples: int = DEFAULT_RESAMPLES) -> np.ndarray:
    """The 2.5th and 97.5th percentiles (2 × metrics) of the metric means over the resamples of
    ``bootstrap_means``."""
    return np.percentile(bootstrap_means(scores, seed, resamples), [2.5, 97.5], axis=0)


def _round(value: float) -> float:
    return round(float(value), 4)


def scorecard(
    split: Split,
    predictions_sha256: str,
    rounds: int,
    scores: np.ndarray,
    *,
    seed: int,
    resamples: int,
    distance: int,
    lenient: bool,
    missing: Sequence[str],
    forgiven: Sequence[str],
    subset: dict | None = None,
) -> dict:
    """The JSON scorecard: every metric's mean and 95% interval, the per-level-1 breakdown (the
    queries whose gold answer holds that level-1 code: means, no intervals) and what was missing
    or forgiven (at most MAX_PROBLEMS_SHOWN lines of each); ``subset``: the --limit subset scored
    (subsets.subset_record), None for the whole query set."""
    low, high = bootstrap_intervals(scores, seed, resamples)
    means = scores.mean(axis=0)
    metrics = {m: {"value": _round(means[i]), "ci95": [_round(low[i]), _round(high[i])]} for i, m in enumerate(METRICS)}
    by_level1 = {}
    for code in sorted(level1_codes()):
        rows = [i for i, answer in enumerate(split.gold.values()) if code in answer]
        if rows:
            group = scores[rows].mean(axis=0)
            by_level1[code] = {"queries": len(rows)} | {m: _round(group[i]) for i, m in enumerate(METRICS)}
    return {
        "format": SCORECARD_FORMAT,
        "split": {
            "month": split.month,
            "query_set": split.query_set,
            "queries_sha256": split.queries_sha256,
            "manifest_checked": split.manifest_checked,
        },
        "predictions_sha256": predictions_sha256,
        "distance_days": distance,
        "rounds": rounds,
        "queries": len(split.gold),
        **({"subset": subset} if subset else {}),  # a whole query set's card is as it always was
        "mode": "lenient" if lenient else "strict",
        "bootstrap": {"seed": seed, "resamples": resamples, "interval": "percentile, 95%", "unit": "query"},
        "metrics": metrics,
        "by_level1": by_level1,
        "missing": {"count": len(missing), "shown": list(missing[:MAX_PROBLEMS_SHOWN])},
        "forgiven": {"count": len(forgiven), "shown": list(forgiven[:MAX_PROBLEMS_SHOWN])},
    }


def scope(card: Mapping) -> str:
    """What the scorecard scored, in one sentence: queries, rounds, mode, missing, the bootstrap."""
    subset = card.get("subset")
    queries = f"{card['queries']} queries"
    if subset:
        queries = f"a subset: {subset['limit']} of {subset['of']} queries (--limit {subset['limit']}: {subset['rule']})"
    return (
        f"{queries}, {card['rounds']} round(s), {card['mode']} mode; "
        f"{card['missing']['count']} missing (scored as empty), {card['forgiven']['count']} problems forgiven. "
        f"95% percentile bootstrap over queries, {card['bootstrap']['resamples']} resamples, seed {card['bootstrap']['seed']}."
    )


def markdown(card: Mapping) -> str:
    """The scorecard as Markdown: a metric table with intervals, then the per-level-1 table."""
    split = card["split"]
    lines = [
        f"# Scorecard: {split['month']} {split['query_set']}, distance {card['distance_days']}",
        "",
        scope(card),
        "",
        "| metric | value | 95% interval |",
        "|---|---:|---|",
    ]
    for m in TABLE_METRICS:
        entry = card["metrics"][m]
        lines.append(f"| {m} | {entry['value']:.2f} | {entry['ci95'][0]:.2f} – {entry['ci95'][1]:.2f} |")
    lines += ["", "| level-1 code | queries | level1_f1 | level2_f1 | mrr |", "|---|---:|---:|---:|---:|"]
    for code, row in card["by_level1"].items():
        lines.append(
            f"| {code} | {row['queries']} | {row['level1_f1']:.2f} | {row['level2_f1']:.2f} | {row['mrr']:.2f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ScoreResult:
    card: dict
    missing: list[str]
    forgiven: list[str]
    queries: list[str]  # the query ids scored, in the split's order

    def json_bytes(self) -> bytes:
        return (json.dumps(self.card, indent=2, sort_keys=False) + "\n").encode()

    def markdown(self) -> str:
        return markdown(self.card)


def score_predictions(
    predictions: Path,
    split_dir: Path,
    *,
    sample: bool = False,
    distance: int = 1,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    lenient: bool = False,
    relation_query: Path | None = None,
    limit: int | None = None,
) -> ScoreResult:
    """Score ``predictions`` against the split in ``split_dir``; InvalidPredictions (strict) or
    ScoringError when they cannot be scored. ``relation_query``: a round directory's files are
    named by that MIRAI relation_query.csv's QueryIds (relation_query_file_ids). ``limit``: only
    the queries of `mirai evaluate --limit` (subsets.SUBSET_RULE), the split file unchanged."""
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ScoringError(f"resamples must be from 1 to {MAX_RESAMPLES}, got {resamples}")
    split = load_split(split_dir, sample)
    whole = list(split.gold)
    subset = subset_record(limit, len(whole))
    if subset:
        split = replace(split, gold={query_id: split.gold[query_id] for query_id in limit_ids(whole, limit)})
    file_ids = None if relation_query is None else relation_query_file_ids(split_dir, sample, relation_query)
    rounds, problems = read_submission(predictions, list(split.gold), file_ids)
    matched, found_problems, missing = match_queries(rounds, split.gold, set(whole) - set(split.gold))
    problems = sorted(problems + found_problems, key=_position)
    if problems and not lenient:
        raise InvalidPredictions(str(predictions), problems)
    scores = per_query_scores(matched, split.gold)
    card = scorecard(
        split,
        _digest(Path(predictions)),
        len(rounds),
        scores,
        seed=seed,
        resamples=resamples,
        distance=distance,
        lenient=lenient,
        missing=missing,
        forgiven=problems,
        subset=subset,
    )
    return ScoreResult(card, missing, problems, list(split.gold))


_RECORD_PREFIX = re.compile(r"^(?:line|row|record) ([0-9]+):")
_FILE_PREFIX = re.compile(r"^round([0-9]+)/")


def _position(problem: str) -> tuple[int, int, str]:
    """Sort key putting problems in file order: by line/row/record number, or by round and name."""
    record = _RECORD_PREFIX.match(problem)
    if record:
        return 0, int(record[1]), ""
    file = _FILE_PREFIX.match(problem)
    return (int(file[1]), 0, problem) if file else (0, 0, problem)


def _digest(path: Path) -> str:
    """sha256 of a predictions file, or of a round directory's files (names and contents, sorted)."""
    digest = hashlib.sha256()
    if path.is_dir():
        for n in range(1, count_rounds(path) + 1):
            with os.scandir(path / f"round{n}") as entries:
                files = sorted(e.name for e in entries if e.name.endswith(".json") and e.is_file(follow_symlinks=False))
            for name in files:
                # fsencode: a name that is not UTF-8 comes back as the bytes it is on disk
                digest.update(os.fsencode(f"round{n}/{name}") + b"\0" + read_capped(path / f"round{n}" / name))
    else:
        digest.update(read_capped(path))
    return digest.hexdigest()


def bounded(problems: Sequence[str], limit: int = MAX_PROBLEMS_SHOWN) -> list[str]:
    """At most ``limit`` problem lines (each cut to 300 characters), then how many were left out."""
    shown_lines = [p if len(p) <= 300 else p[:300] + "…" for p in problems[:limit]]
    if len(problems) > limit:
        shown_lines.append(f"… and {len(problems) - limit} more")
    return shown_lines
