"""MIRAI's metrics on hand-computed cases (pipeline/evaluation/metrics.py).

Each expected value is worked out in the comments from eval.py's definitions: per query
P = tp/(tp+fp), R = tp/(tp+fn), F1 = 2PR/(P+R) in percent (0 on a zero denominator), averaged over
queries; KL = Σ gold·ln(gold/pred) over classes, with ε = 1e-10 added to every probability.
"""

from __future__ import annotations

import math

import polars as pl
import pytest

from pipeline.evaluation.metrics import (
    BINARY_CLASSES,
    EPSILON,
    QUAD_CLASSES,
    SET_METRICS,
    aggregate_answers,
    aggregate_rounds,
    best_round_answer,
    clean_prediction,
    hit_at_k,
    mrr,
    parse_answer,
    query_scores,
    reciprocal_rank,
    repeated_answer,
    score,
    to_answer_dict,
)
from pipeline.reference.tables import relation_table

E = EPSILON
# An empty prediction against a gold answer whose codes all fall in one class: that class has
# gold 1+ε and pred ε, every other class ε against ε (ln 1 = 0).
KL_EMPTY_ONE_CLASS = (1 + E) * math.log((1 + E) / E)  # ≈ 23.0259


def approx(value: float):
    return pytest.approx(value, rel=1e-12, abs=1e-12)


def test_perfect_prediction_scores_100_and_zero_kl():
    gold = {"01": ["010"], "19": ["190", "193"]}
    out = query_scores({"19": ["193", "190"], "01": ["010"]}, gold)
    assert all(
        out[f"{lvl}_{m}"] == 100.0
        for lvl in ("level1", "level2", "binary", "quad")
        for m in ("precision", "recall", "f1")
    )
    # Both sides: binary {mediation: 1/2, conflict: 1/2}, quad {verbal coop: 1/2, material conflict: 1/2}.
    assert out["binary_kl"] == 0.0 and out["quad_kl"] == 0.0


def test_empty_prediction_is_the_floor():
    out = query_scores({}, {"04": ["042"]})
    assert all(out[m] == 0.0 for m in SET_METRICS if not m.endswith("_kl"))
    # Gold: binary mediation 1+ε, conflict ε; pred ε, ε → (1+ε)·ln((1+ε)/ε) + ε·ln(ε/ε).
    assert out["binary_kl"] == approx(KL_EMPTY_ONE_CLASS)
    assert out["quad_kl"] == approx(KL_EMPTY_ONE_CLASS)
    assert 23.02 < out["binary_kl"] < 23.03  # MIRAI's "about 23"


def test_partial_overlap():
    gold = {"04": ["042", "043"], "19": ["190"]}
    pred = {"04": ["042", "040"], "05": ["051"]}
    out = query_scores(pred, gold)
    # level 1: pred {04, 05}, gold {04, 19}: tp 1, fp 1, fn 1 → P = R = F1 = 50.
    assert (out["level1_precision"], out["level1_recall"], out["level1_f1"]) == (50.0, 50.0, 50.0)
    # level 2: pred {040, 042, 051}, gold {042, 043, 190}: tp 1, fp 2, fn 2 → 1/3 each.
    assert out["level2_precision"] == approx(100 / 3)
    assert out["level2_recall"] == approx(100 / 3)
    assert out["level2_f1"] == approx(100 / 3)
    # binary sets: pred {mediation} (04, 05), gold {mediation, conflict}: tp 1, fp 0, fn 1
    # → P 100, R 50, F1 = 2·1·0.5/1.5 = 66.67.
    assert (out["binary_precision"], out["binary_recall"]) == (100.0, 50.0)
    assert out["binary_f1"] == approx(200 / 3)
    # quad sets: pred {verbal coop, material coop}, gold {verbal coop, material conflict} → 50s.
    assert (out["quad_precision"], out["quad_recall"], out["quad_f1"]) == (50.0, 50.0, 50.0)
    # binary KL: gold (½+ε, ½+ε), pred (1+ε, ε).
    half = 0.5 + E
    assert out["binary_kl"] == approx(half * math.log(half / (1 + E)) + half * math.log(half / E))  # ≈ 10.820
    # quad KL over (vcoop, mcoop, vconf, mconf): gold (½, 0, 0, ½), pred (½, ½, 0, 0), all +ε.
    expected_quad = (
        half * math.log(half / half) + E * math.log(E / half) + E * math.log(E / E) + half * math.log(half / E)
    )
    assert out["quad_kl"] == approx(expected_quad)  # ≈ 11.135
    assert out["quad_kl"] == pytest.approx(0.5 * math.log(5e9), rel=1e-9)


def test_kl_counts_distinct_level1_codes_per_class():
    # Gold {01, 02, 19}: binary labels (med, med, conf) → (2/3, 1/3); pred {01}: (1, 0).
    out = query_scores({"01": ["010"]}, {"01": ["010"], "02": ["020"], "19": ["190"]})
    g_med, g_conf = 2 / 3 + E, 1 / 3 + E
    assert out["binary_kl"] == approx(g_med * math.log(g_med / (1 + E)) + g_conf * math.log(g_conf / E))
    # The binary P/R/F1 use sets: pred {med}, gold {med, conf} → P 100, R 50.
    assert (out["binary_precision"], out["binary_recall"]) == (100.0, 50.0)


def test_duplicate_codes_are_counted_once():
    # pred {"04": [042, 042, 043]} dedups to {042, 043}: tp 1, fp 1 → P 50 (66.67 without dedup),
    # R 100, F1 = 2·0.5·1/1.5 = 66.67.
    out = query_scores({"04": ["042", "042", "043"]}, {"04": ["042"]})
    assert (out["level2_precision"], out["level2_recall"]) == (50.0, 100.0)
    assert out["level2_f1"] == approx(200 / 3)
    assert clean_prediction({"04": ["042", "042"]}).level2 == ("042",)


def test_malformed_codes_are_dropped():
    # Keys "4", "21", "xx" are not first-level codes; under "04", "42" and "04" are not 3 digits,
    # "0420" is too long, "999" is not a CAMEO code (nor under 04).
    pred = {"4": ["042"], "04": ["42", "0420", "999", "04"], "21": ["210"], "xx": []}
    cleaned = clean_prediction(pred)
    assert cleaned.level1 == ("04",) and cleaned.level2 == ()
    out = query_scores(pred, {"04": ["042"]})
    assert out["level1_f1"] == 100.0
    # Nothing predicted at level 2: P's denominator tp+fp is 0 → 0, and R = 0/1.
    assert (out["level2_precision"], out["level2_recall"], out["level2_f1"]) == (0.0, 0.0, 0.0)


def test_code_under_the_wrong_key_does_not_count():
    # 190 listed under 04 and 043 under 19 are dropped; only 042 (under 04) survives.
    pred = {"04": ["190", "042"], "19": ["043"]}
    assert clean_prediction(pred).level2 == ("042",)
    out = query_scores(pred, {"04": ["042"], "19": ["190"]})
    assert out["level1_f1"] == 100.0
    # level 2: tp 1, fp 0, fn 1 (190) → P 100, R 50, F1 66.67.
    assert (out["level2_precision"], out["level2_recall"]) == (100.0, 50.0)
    assert out["level2_f1"] == approx(200 / 3)


@pytest.mark.parametrize(
    "prediction",
    [
        None,
        "{'04': ['042']}",  # a string, not a dict: eval.py would have eval'd it, we parse first
        ["04"],
        {"04": 42},  # iterating an int raises in eval.py: the whole answer is lost
        {"04": ["042"], "19": None},
        {"04": [42]},  # slicing an int raises
        {"04": [{"042": 1}]},  # slicing a dict raises
    ],
)
def test_unparsable_prediction_is_empty(prediction):
    assert clean_prediction(prediction) == clean_prediction({})
    assert query_scores(prediction, {"04": ["042"]})["level1_f1"] == 0.0


def test_odd_but_iterable_values_follow_eval_py():
    # A string value iterates over its characters, none a 3-digit code; a nested list is skipped;
    # a dict value iterates over its keys (docs/evaluation.md says so).
    assert clean_prediction({"04": {"042": 1, "190": 2}}) == clean_prediction({"04": ["042"]})
    assert clean_prediction({"04": "042"}).level2 == ()
    assert clean_prediction({"04": "042"}).level1 == ("04",)
    assert clean_prediction({"04": [["042"], "043"]}).level2 == ("043",)


def test_score_averages_over_queries():
    answers = [{"04": ["042"]}, {"19": ["190"]}]
    out = score([{"04": ["042"]}, {}], answers)
    assert out["n"] == 2
    # (100 + 0) / 2 for every P/R/F1; KL (0 + 23.03) / 2.
    assert out["level2_f1"] == 50.0 and out["level1_precision"] == 50.0
    assert out["binary_kl"] == approx(KL_EMPTY_ONE_CLASS / 2)
    assert set(out) == {*SET_METRICS, "n"}


def test_score_rejects_bad_inputs():
    with pytest.raises(ValueError, match="no queries"):
        score([], [])
    with pytest.raises(ValueError, match="1 predictions for 2 answers"):
        score([{}], [{"01": ["010"]}, {"01": ["010"]}])
    with pytest.raises(ValueError, match="outside the CAMEO tables"):
        score([{}], [{"01": ["099"]}])


def test_class_maps_are_mirais_not_gdelts():
    quad_index = {label: i + 1 for i, label in enumerate(QUAD_CLASSES)}
    of_code = {code: quad_index[label] for label, codes in QUAD_CLASSES.items() for code in codes}
    table = relation_table()
    assert table.select((pl.col("level1").replace_strict(of_code) == pl.col("mirai_quad_class")).all()).item()
    # 09–16 is verbal conflict for MIRAI; GDELT's QuadClass puts 14–16 in material conflict.
    assert "14" in QUAD_CLASSES["verbal conflict"] and "05" in QUAD_CLASSES["material cooperation"]
    assert BINARY_CLASSES["mediation"] == tuple(f"{i:02d}" for i in range(1, 9))
    assert sorted(BINARY_CLASSES["mediation"] + BINARY_CLASSES["conflict"]) == sorted(of_code)


def test_to_answer_dict_groups_and_sorts():
    assert to_answer_dict(["190", "042", "040", "042"]) == {"04": ["040", "042"], "19": ["190"]}
    assert to_answer_dict([]) == {}


# --- ranked metrics ---------------------------------------------------------------------------


def test_mrr_and_hit_at_k():
    rankings = [["043", "042"], ["190"], [], ["010", "011", "012"]]
    answers = [{"04": ["042"]}, {"19": ["190"]}, {"01": ["010"]}, {"01": ["012", "011"]}]
    # Reciprocal ranks: 1/2 (042 second), 1, 0 (nothing ranked), 1/2 (first correct is 011 at 2).
    assert [reciprocal_rank(r, a) for r, a in zip(rankings, answers)] == [0.5, 1.0, 0.0, 0.5]
    assert mrr(rankings, answers) == approx(100 * (0.5 + 1 + 0 + 0.5) / 4)  # 50
    # Hit@1: only query 2; Hit@2 and Hit@10: queries 1, 2 and 4.
    assert hit_at_k(rankings, answers, k=1) == 25.0
    assert hit_at_k(rankings, answers, k=2) == 75.0
    assert hit_at_k(rankings, answers) == 75.0
    with pytest.raises(ValueError):
        hit_at_k(rankings, answers, k=0)


def test_ranking_drops_junk_and_repeats_before_ranking():
    # ["043", "043", "xx", 42, "042"] ranks as ["043", "042"]: 042 is second, not fifth.
    assert reciprocal_rank(["043", "043", "xx", 42, "042"], {"04": ["042"]}) == 0.5
    assert hit_at_k([["043", "043", "042"]], [{"04": ["042"]}], k=2) == 100.0


# --- rounds -----------------------------------------------------------------------------------


def test_aggregate_rounds_mean_and_sample_std():
    rounds = [{"level2_f1": 10.0, "quad_kl": 2.0, "n": 100}, {"level2_f1": 20.0, "quad_kl": 2.0, "n": 100}]
    out = aggregate_rounds(rounds)
    assert (out["rounds"], out["n"]) == (2, 100)
    assert out["mean"] == {"level2_f1": 15.0, "quad_kl": 2.0}
    # Sample std of (10, 20): sqrt(((−5)² + 5²) / (2 − 1)) = sqrt(50) ≈ 7.071.
    assert out["std"]["level2_f1"] == approx(math.sqrt(50))
    assert out["std"]["quad_kl"] == 0.0
    assert aggregate_rounds(rounds[:1])["std"] == {"level2_f1": 0.0, "quad_kl": 0.0}


def test_aggregate_rounds_rejects_mismatched_rounds():
    with pytest.raises(ValueError):
        aggregate_rounds([])
    with pytest.raises(ValueError, match="query count"):
        aggregate_rounds([{"level2_f1": 1.0, "n": 100}, {"level2_f1": 1.0, "n": 99}])
    with pytest.raises(ValueError):
        aggregate_rounds([{"level2_f1": 1.0, "n": 100}, {"mrr": 1.0, "n": 100}])


# --- parse_answer -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('Final Answer: {"01": ["010", "011"], "02": ["020"]}', {"01": ["010", "011"], "02": ["020"]}),
        ('<answer>{"04": ["042"]}</answer>', {"04": ["042"]}),
        ('Here it is:\n```json\n{\n  "19": ["190"]\n}\n```\nDone.', {"19": ["190"]}),
        ("It's likely {'04': ['042', '043',],}", {"04": ["042", "043"]}),  # single quotes, trailing commas
        ('{"04": ["042"],\n "19": ["190",],\n}', {"04": ["042"], "19": ["190"]}),
        ('First guess {"01": ["010"]}; revised: {"04": ["042"]}', {"04": ["042"]}),  # the last one wins
        ('{"01": ["010"]} then a broken {"04": ["04', {"01": ["010"]}),  # unclosed: skipped
        ('{"01": ["010"]} and {not a dict at all}', {"01": ["010"]}),  # unparsable: skipped
        ("I cannot forecast this.", {}),
        ("", {}),
        ("[1, 2, 3]", {}),
    ],
)
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


def test_parse_answer_never_evaluates_code():
    assert parse_answer('{"04": __import__("os").getcwd()}') == {}


# --- across-round aggregates: Max@K and "repeated" (eval.py's "max" and "repeated") -------------


def test_max_at_k_picks_the_round_with_the_best_second_level_f1():
    gold = {"04": ["042", "043"]}
    rounds = [{"04": ["042"]}, {"04": ["042", "043"]}, {"04": ["043"], "01": ["010"]}]  # L2 F1 66.7, 100, 50
    assert best_round_answer(rounds, gold) == rounds[1]


def test_max_at_k_ties_go_to_the_latest_round_whatever_its_other_metrics():
    gold = {"19": ["190"], "04": ["042"]}
    # Both score L2 F1 2·1·0.5/1.5 = 66.7; the later one also names a wrong first-level code (01),
    # so its L1 F1 is 50 against the earlier one's 66.7, and it is still the one kept.
    assert best_round_answer([{"19": ["190"]}, {"04": ["042"], "01": []}], gold) == {"04": ["042"], "01": []}
    # Every round scores 0 at level 2: the last round is kept, even an unreadable one, although
    # the first got the first-level code right.
    assert best_round_answer([{"10": ["101"]}, {}, "garbage"], {"10": ["100"]}) == "garbage"


def test_repeated_keeps_codes_predicted_in_at_least_two_rounds():
    rounds = [
        {"04": ["042", "043"]},
        {"04": ["042"], "01": ["010"]},
        {"04": ["042", "042"], "01": [], "99": ["042"]},  # a repeat within a round counts once
    ]
    # L1: 04 ×3, 01 ×2 (a bare key counts at level 1); L2: 042 ×3, 043 ×1, 010 ×1.
    assert repeated_answer(rounds) == {"01": [], "04": ["042"]}
    assert repeated_answer([{}, "not a dict", {"19": ["190"]}]) == {}
    assert repeated_answer([{"19": ["190"]}]) == {}  # one round: nothing is in two


def test_aggregate_answers_hand_computed():
    gold = {
        "q1": {"04": ["042", "043"]},
        "q2": {"19": ["190"], "04": ["042"]},
        "q3": {"10": ["100"]},
    }
    rounds = [
        {"q1": {"04": ["042"]}, "q2": {"19": ["190"]}, "q3": {"10": ["100"]}},
        {"q1": {"04": ["042", "043"]}, "q2": {"19": ["190"]}, "q3": {}},
        # q3 is missing from the last round: it counts as the empty answer {}
        {"q1": {"04": ["043"], "01": ["010"]}, "q2": {"04": ["042"], "01": []}},
    ]
    out = aggregate_answers(rounds, gold)
    assert (out["k"], out["n"]) == (3, 3)
    best = out["max_at_k"]
    # Picks: q1 round 1 (L2 F1 100); q2 round 2 (tie at 66.7 with rounds 0 and 1, latest wins:
    # L2 {042}: P 100 R 50; L1 {01, 04}: P 50 R 50 F1 50); q3 round 0 (F1 100 beats the two
    # empty answers).
    assert best["level2_f1"] == approx((100 + 200 / 3 + 100) / 3)
    assert best["level2_precision"] == approx(100) and best["level2_recall"] == approx((100 + 50 + 100) / 3)
    assert best["level1_f1"] == approx((100 + 50 + 100) / 3)
    assert best["level1_precision"] == approx((100 + 50 + 100) / 3)
    # binary KL: q1 and q3 match their gold's class mix (0); q2's pick {01, 04} is all mediation
    # against gold {19, 04}, half conflict: ½ ln(½ / (1+ε)) + ½ ln(½ / ε), with every ε kept.
    q2_kl = (0.5 + E) * math.log((0.5 + E) / (1 + E)) + (0.5 + E) * math.log((0.5 + E) / E)
    assert best["binary_kl"] == approx(q2_kl / 3)
    assert set(best) == set(SET_METRICS)
    rep = out["repeated"]
    # Repeated answers: q1 {04: [042, 043]} (04 ×3, 042 ×2, 043 ×2; 01 and 010 once): L2 100;
    # q2 {19: [190]} (19 and 190 ×2; 04, 01, 042 once): L2 P 100 R 50 F1 66.7, L1 the same;
    # q3 {} (100 and 10 in one round only): 0 everywhere, KL ≈ 23 at both class levels.
    assert rep["level2_f1"] == approx((100 + 200 / 3 + 0) / 3)
    assert rep["level2_recall"] == approx((100 + 50 + 0) / 3)
    assert rep["level1_f1"] == approx((100 + 200 / 3 + 0) / 3)
    # binary KL: q1 0; q2 pred all conflict against gold half each: the same value as above by
    # symmetry; q3 an empty prediction against one class.
    assert rep["binary_kl"] == approx((0 + q2_kl + KL_EMPTY_ONE_CLASS) / 3)


def test_repeated_scores_classes_against_gold_labels_with_repeats_like_eval_py():
    """eval.py scores its "repeated" binary/quad P/R/F1 against the gold class list with one
    label per first-level code (not deduplicated, unlike its mean and max): a missed class counts
    once per gold code in it. The same answer under Max@K is scored on distinct classes."""
    gold = {"q": {"04": ["042"], "05": ["051"], "19": ["190"]}}  # binary: mediation ×2, conflict
    out = aggregate_answers([{"q": {"19": ["190"]}}, {"q": {"19": ["190"]}}], gold)
    # Repeated answer {19: [190]}: binary pred {conflict}; tp 1, fp 0, fn 2 (mediation twice).
    assert out["repeated"]["binary_precision"] == approx(100)
    assert out["repeated"]["binary_recall"] == approx(100 / 3)
    assert out["repeated"]["binary_f1"] == approx(50)
    # Max@2 (the same answer): gold classes {conflict, mediation}, fn 1.
    assert out["max_at_k"]["binary_recall"] == approx(50) and out["max_at_k"]["binary_f1"] == approx(200 / 3)
    # Quad classes of the gold are distinct (verbal coop, material coop, material conflict): equal.
    assert out["repeated"]["quad_recall"] == out["max_at_k"]["quad_recall"] == approx(100 / 3)


def test_one_round_max_at_k_is_that_round_and_repeated_is_not_computed():
    gold = {"q1": {"04": ["042", "043"]}, "q2": {"19": ["190"]}}
    round_ = {"q1": {"04": ["042"], "01": ["010"]}, "q2": "junk"}
    out = aggregate_answers([round_], gold)
    expected = score([round_["q1"], round_["q2"]], list(gold.values()))
    del expected["n"]
    assert out["max_at_k"] == expected and out["repeated"] is None and out["k"] == 1


def test_aggregate_answers_rejects_bad_inputs():
    gold = {"q1": {"04": ["042"]}}
    with pytest.raises(ValueError, match="no rounds"):
        aggregate_answers([], gold)
    with pytest.raises(ValueError, match="no queries"):
        aggregate_answers([{}], {})
    with pytest.raises(ValueError, match="no gold answer: \\['q9'\\]"):
        aggregate_answers([{"q1": {}}, {"q9": {}}], gold)
