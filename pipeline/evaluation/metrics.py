"""MIRAI's evaluation metrics, computed exactly as its ``agent_evaluation/eval.py``
(github.com/yecchen/MIRAI) computes them (MIRAI paper, arXiv:2407.01231, §2.3 "Evaluation
metrics"), plus the ranked metrics of its Appendix D.8.

An answer is a dict from first-level CAMEO codes to lists of second-level codes,
``{"01": ["010"], "19": ["190", "193"]}``. Gold answers come from a split's ``answer_dict``;
predictions are cleaned the way eval.py's ``load_predictions`` cleans them before scoring:

- first level: the keys that are valid 2-digit codes, deduplicated;
- second level: under each kept key, the listed valid 3-digit codes that start with that key,
  deduplicated (``{"04": ["190"]}`` scores the 04 but not the 190);
- anything eval.py's bare ``except`` would catch (not a dict, a value that is not iterable, a
  code that cannot be sliced) makes the whole prediction empty.

Reading an answer out of a model's text (``parse_answer``) is not eval.py's: it accepts JSON as
well as Python literals, where eval.py ``eval``s the text as Python, so a JSON ``null``, ``true``
or ``false`` anywhere voids the whole answer there. Exported MIRAI-layout predictions carry the
answer as scored here (pipeline/evaluation/mirai_predictions.py), so eval.py scores the same.

Every per-query number is averaged over queries ("macro", although eval.py's comments say micro);
P/R/F1 are percentages. Nothing here reads files or knows about Dagster.
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.reference.tables import level1_codes, level2_codes


def _codes(first: int, last: int) -> tuple[str, ...]:
    return tuple(f"{i:02d}" for i in range(first, last + 1))


# eval.py's dict_binary2first and dict_quad2first, in its order (the KL sums run over classes in
# this order). MIRAI's quad classes are not GDELT's QuadClass (01–05 / 06–08 / 09–13 / 14–20);
# relation_table().mirai_quad_class carries the same grouping as QUAD_CLASSES.
BINARY_CLASSES: dict[str, tuple[str, ...]] = {"mediation": _codes(1, 8), "conflict": _codes(9, 20)}
QUAD_CLASSES: dict[str, tuple[str, ...]] = {
    "verbal cooperation": _codes(1, 4),
    "material cooperation": _codes(5, 8),
    "verbal conflict": _codes(9, 16),
    "material conflict": _codes(17, 20),
}
_BINARY_OF = {code: label for label, codes in BINARY_CLASSES.items() for code in codes}
_QUAD_OF = {code: label for label, codes in QUAD_CLASSES.items() for code in codes}

# eval.py adds this to every probability, without renormalising, before taking the KL divergence.
EPSILON = 1e-10

SET_METRICS = (
    *tuple(
        f"{level}_{measure}"
        for level in ("level1", "level2", "binary", "quad")
        for measure in ("precision", "recall", "f1")
    ),
    "binary_kl",
    "quad_kl",
)
_SCORED = {
    "level1": "first-level CAMEO codes",
    "level2": "second-level CAMEO codes",
    "binary": "binary classes (cooperation, conflict)",
    "quad": "quad classes (verbal/material cooperation/conflict)",
}
# What each set metric measures, for the descriptions of the columns that hold one (board.py, run.py).
SET_METRIC_MEANINGS = {
    **{
        f"{level}_{measure}": f"{name} of the predicted {what}"
        for level, what in _SCORED.items()
        for measure, name in (("precision", "Precision"), ("recall", "Recall"), ("f1", "F1"))
    },
    "binary_kl": "KL(gold ‖ predicted) of the binary class distributions",
    "quad_kl": "KL(gold ‖ predicted) of the quad class distributions",
}


@dataclass(frozen=True)
class Relations:
    """An answer reduced to what is scored: distinct first- and second-level codes, sorted."""

    level1: tuple[str, ...]
    level2: tuple[str, ...]


EMPTY = Relations((), ())


def clean_prediction(answer: object) -> Relations:
    """A predicted answer dict as eval.py's ``load_predictions`` reads it (see the module doc)."""
    if not isinstance(answer, Mapping):
        return EMPTY
    try:
        level1 = {key for key in answer if key in level1_codes()}
        # `code[:2] == key` is tested first, as in eval.py, so a list inside a list is skipped
        # rather than hashed; a non-iterable value or an unsliceable code raises TypeError (a dict
        # code raises KeyError from Python 3.12 on, where slices became hashable).
        level2 = {code for key in level1 for code in answer[key] if code[:2] == key and code in level2_codes()}
    except (TypeError, KeyError):
        return EMPTY
    return Relations(tuple(sorted(level1)), tuple(sorted(level2)))


def gold_relations(answer: Mapping[str, Sequence[str]]) -> Relations:
    """A gold answer dict (a split's ``answer_dict``): keys are the first level, the listed codes
    the second (eval.py takes both as given). A code outside the CAMEO tables is a broken split,
    not a bad forecast, so it raises."""
    level1 = tuple(answer)
    level2 = tuple(code for codes in answer.values() for code in codes)
    unknown = [c for c in level1 if c not in level1_codes()] + [c for c in level2 if c not in level2_codes()]
    if unknown:
        raise ValueError(f"gold answer {dict(answer)!r} holds codes outside the CAMEO tables: {unknown}")
    return Relations(level1, level2)


def to_answer_dict(codes: Iterable[str]) -> dict[str, list[str]]:
    """Second-level codes grouped under their first-level code, keys and lists sorted (the
    split's answer_dict layout)."""
    grouped: dict[str, list[str]] = {}
    for code in sorted(set(codes)):
        grouped.setdefault(code[:2], []).append(code)
    return grouped


def precision_recall_f1(pred: Sequence[str], gold: Sequence[str]) -> tuple[float, float, float]:
    """eval.py's per-query step of ``calculate_macro_metrics``, in percent: tp counts predicted
    items found in gold, fn gold items not predicted; a zero denominator gives 0."""
    tp = sum(p in gold for p in pred)
    fp = len(pred) - tp
    fn = sum(g not in pred for g in gold)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return 100 * precision, 100 * recall, 100 * f1


def kl_divergence(pred_labels: Sequence[str], gold_labels: Sequence[str], classes: Iterable[str]) -> float:
    """eval.py's ``calculate_kl_divergence`` for one query: each side's distribution is the share
    of its labels per class (0 for every class when it has no labels), EPSILON is added to every
    probability with no renormalisation, and KL = Σ gold·ln(gold/pred). An empty prediction
    against one gold class scores (1+ε)·ln((1+ε)/ε) ≈ 23.03."""

    def distribution(labels: Sequence[str]) -> dict[str, float]:
        return {c: (labels.count(c) / len(labels) if labels else 0.0) + EPSILON for c in classes}

    gold, pred = distribution(gold_labels), distribution(pred_labels)
    return sum(gold[c] * math.log(gold[c] / pred[c]) for c in gold)


def query_scores(
    prediction: object, answer: Mapping[str, Sequence[str]], *, gold_class_repeats: bool = False
) -> dict[str, float]:
    """Every set metric of one query (the keys of SET_METRICS). ``gold_class_repeats`` scores the
    binary/quad P/R/F1 against the gold class labels with repeats kept (one per first-level code),
    as eval.py does for its "repeated" aggregate only (see ``aggregate_answers``)."""
    pred, gold = clean_prediction(prediction), gold_relations(answer)
    # Class labels, one per distinct first-level code: with repeats for KL, as sets for P/R/F1.
    pred_binary, gold_binary = [_BINARY_OF[c] for c in pred.level1], [_BINARY_OF[c] for c in gold.level1]
    pred_quad, gold_quad = [_QUAD_OF[c] for c in pred.level1], [_QUAD_OF[c] for c in gold.level1]
    gold_binary_set, gold_quad_set = (
        (gold_binary, gold_quad) if gold_class_repeats else (sorted(set(gold_binary)), sorted(set(gold_quad)))
    )
    out: dict[str, float] = {}
    for level, p, g in (
        ("level1", pred.level1, gold.level1),
        ("level2", pred.level2, gold.level2),
        ("binary", sorted(set(pred_binary)), gold_binary_set),
        ("quad", sorted(set(pred_quad)), gold_quad_set),
    ):
        out[f"{level}_precision"], out[f"{level}_recall"], out[f"{level}_f1"] = precision_recall_f1(p, g)
    out["binary_kl"] = kl_divergence(pred_binary, gold_binary, BINARY_CLASSES)
    out["quad_kl"] = kl_divergence(pred_quad, gold_quad, QUAD_CLASSES)
    return out


def _check_lengths(predictions: Sequence, answers: Sequence) -> None:
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    if not answers:
        raise ValueError("no queries to score")


def score(
    predictions: Sequence[object], answers: Sequence[Mapping[str, Sequence[str]]], *, gold_class_repeats: bool = False
) -> dict[str, float]:
    """The SET_METRICS averaged over queries (MIRAI's macro scheme), plus ``n`` (queries)."""
    _check_lengths(predictions, answers)
    rows = [query_scores(p, a, gold_class_repeats=gold_class_repeats) for p, a in zip(predictions, answers)]
    out: dict[str, float] = {m: statistics.fmean(r[m] for r in rows) for m in SET_METRICS}
    out["n"] = len(rows)
    return out


# --- ranked metrics (Appendix D.8.3) --------------------------------------------------------------


def clean_ranking(ranked: Iterable[object]) -> list[str]:
    """A ranked list of second-level codes with invalid entries dropped and repeats kept at their
    first (best) rank, so junk never pushes a correct code down."""
    seen: dict[str, None] = {}
    for code in ranked:
        if isinstance(code, str) and code in level2_codes():
            seen.setdefault(code)
    return list(seen)


def reciprocal_rank(ranked: Iterable[object], answer: Mapping[str, Sequence[str]]) -> float:
    """1/rank (1-based) of the first correct second-level code, 0 when none is correct. Time-aware
    filtering (D.8.2, which removes the query's other correct answers from the ranking) cannot
    move the first correct code, since nothing ranked above it is correct."""
    gold = set(gold_relations(answer).level2)
    return next((1 / rank for rank, code in enumerate(clean_ranking(ranked), 1) if code in gold), 0.0)


def hit(ranked: Iterable[object], answer: Mapping[str, Sequence[str]], k: int) -> float:
    """1 when a correct second-level code is among the first k, else 0."""
    gold = set(gold_relations(answer).level2)
    return float(any(code in gold for code in clean_ranking(ranked)[:k]))


def mrr(rankings: Sequence[Iterable[object]], answers: Sequence[Mapping[str, Sequence[str]]]) -> float:
    """Mean reciprocal rank in percent (D.8.3: "average reciprocal of the first correct relation's
    rank"), averaged over queries like the set metrics."""
    _check_lengths(rankings, answers)
    return 100 * statistics.fmean(reciprocal_rank(r, a) for r, a in zip(rankings, answers))


def hit_at_k(
    rankings: Sequence[Iterable[object]], answers: Sequence[Mapping[str, Sequence[str]]], k: int = 10
) -> float:
    """Hit@k in percent (D.8.3: "proportion of queries where at least one correct relation appears
    in top-10 predictions")."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    _check_lengths(rankings, answers)
    return 100 * statistics.fmean(hit(r, a, k) for r, a in zip(rankings, answers))


# --- rounds -----------------------------------------------------------------------------------


def aggregate_rounds(rounds: Sequence[Mapping[str, float]]) -> dict:
    """Mean and standard deviation of every metric over repeated rounds of one setting (MIRAI
    §3.1 runs 5 rounds and reports mean ± std): ``{"rounds", "n", "mean": {...}, "std": {...}}``.

    eval.py averages rounds but never computes the std; the paper does not say which estimator it
    used, so this is the sample std (n − 1), and 0 for a single round. Every round must score the
    same queries and carry the same metrics."""
    if not rounds:
        raise ValueError("no rounds to aggregate")
    sizes = {r["n"] for r in rounds}
    keys = {frozenset(r) for r in rounds}
    if len(sizes) != 1 or len(keys) != 1:
        raise ValueError(f"rounds differ in query count {sorted(sizes)} or metrics")
    metrics = sorted(k for k in rounds[0] if k != "n")
    return {
        "rounds": len(rounds),
        "n": sizes.pop(),
        "mean": {m: statistics.fmean(r[m] for r in rounds) for m in metrics},
        "std": {m: statistics.stdev([r[m] for r in rounds]) if len(rounds) > 1 else 0.0 for m in metrics},
    }


# MIRAI's "repeated" aggregate keeps a code predicted in at least this many rounds (eval.py; the
# paper's §3.2 calls it a variant of self-consistency).
REPEATED_MIN_ROUNDS = 2


def _answers_by_query(
    rounds: Sequence[Mapping[str, object]], answers: Mapping[str, Mapping[str, Sequence[str]]]
) -> list[list[object]]:
    """Per gold query, in the gold order, its answer in each round; a round without the query
    counts as having answered ``{}`` (no answer, like one eval.py cannot read)."""
    if not rounds:
        raise ValueError("no rounds to aggregate")
    if not answers:
        raise ValueError("no queries to score")
    unknown = sorted({q for r in rounds for q in r if q not in answers})
    if unknown:
        raise ValueError(f"predictions for queries that have no gold answer: {unknown[:5]}")
    return [[r.get(query_id, {}) for r in rounds] for query_id in answers]


def best_round_answer(round_answers: Sequence[object], answer: Mapping[str, Sequence[str]]) -> object:
    """Max@K's pick for one query: the answer of the round with the highest second-level F1,
    the latest such round on a tie (eval.py compares with ``>=`` from 0, so when every round
    scores 0 the last round's answer is kept, whatever its first-level codes)."""
    f1s = [query_scores(a, answer)["level2_f1"] for a in round_answers]
    return round_answers[max(range(len(f1s)), key=lambda i: (f1s[i], i))]


def repeated_answer(round_answers: Sequence[object], min_rounds: int = REPEATED_MIN_ROUNDS) -> dict[str, list[str]]:
    """The "repeated" answer for one query: the first-level codes and, separately, the
    second-level codes that at least ``min_rounds`` rounds predicted (each round's cleaned answer
    counts a code once), as one answer dict. A second-level code kept implies its first-level
    code kept (every round that predicted it also predicted its key)."""
    cleaned = [clean_prediction(a) for a in round_answers]
    level1 = Counter(code for r in cleaned for code in r.level1)
    level2 = Counter(code for r in cleaned for code in r.level2)
    kept2 = sorted(code for code, n in level2.items() if n >= min_rounds)
    return {key: [c for c in kept2 if c[:2] == key] for key in sorted(c for c, n in level1.items() if n >= min_rounds)}


def aggregate_answers(
    rounds: Sequence[Mapping[str, object]], answers: Mapping[str, Mapping[str, Sequence[str]]]
) -> dict:
    """MIRAI's two answer-level aggregates over K rounds of one setting (eval.py's "max" and
    "repeated"; paper §3.2, Figure 4a), from each round's predicted answers (query id → answer
    dict) and the gold answers (query id → answer dict):

    - ``max_at_k``: every SET_METRIC of the answers picked by ``best_round_answer`` (per query the
      round with the best second-level F1), averaged over queries. The pick is made on
      second-level F1 only; the other metrics are those of the picked answer, not their own maxima.
    - ``repeated``: every SET_METRIC of the ``repeated_answer`` of each query, or None for K < 2
      (eval.py computes it only from 2 rounds on). Its binary/quad P/R/F1 are scored against the
      gold class labels with repeats kept, as eval.py does there.

    Returns ``{"k", "n", "max_at_k", "repeated"}``."""
    by_query = _answers_by_query(rounds, answers)
    gold = list(answers.values())
    best = [best_round_answer(r, g) for r, g in zip(by_query, gold)]
    repeated = None
    if len(rounds) >= REPEATED_MIN_ROUNDS:
        repeated = score([repeated_answer(r) for r in by_query], gold, gold_class_repeats=True)
        del repeated["n"]
    max_at_k = score(best, gold)
    del max_at_k["n"]
    return {"k": len(rounds), "n": len(gold), "max_at_k": max_at_k, "repeated": repeated}


# --- reading an answer out of free text -----------------------------------------------------------

_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _brace_spans(text: str) -> list[str]:
    """Every outermost {...} of the text, in order. Quotes are not tracked: an apostrophe in prose
    ("it's") would otherwise swallow the rest of the text, and CAMEO answers hold no braces."""
    spans, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def _literal(span: str) -> object:
    """JSON, else a Python literal (single quotes, trailing commas, tuples), else JSON after
    swapping single for double quotes and dropping trailing commas; None when nothing parses.
    ast.literal_eval evaluates literals only, never code."""
    try:
        return json.loads(span)
    except ValueError:
        pass
    try:
        return ast.literal_eval(span)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(_TRAILING_COMMA.sub(r"\1", span.replace("'", '"')))
    except ValueError:
        return None


def parse_answer(text: str) -> dict:
    """The last dict written anywhere in a model's free text (after "Final Answer:", inside
    ``<answer>`` tags or a ```json fence, or bare), {} when there is none. The dict is returned as
    parsed; ``score`` applies MIRAI's cleaning. MIRAI itself asked gpt-3.5-turbo to rewrite the
    answer as ``<answer>{json}</answer>`` (paper Appendix H) and then ``eval``'d it."""
    for span in reversed(_brace_spans(text)):
        parsed = _literal(span)
        if isinstance(parsed, dict):
            return parsed
    return {}
