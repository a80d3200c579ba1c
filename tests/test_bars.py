"""The head-to-head's bars read as their words say, on hand-made summaries (training/bars.py)."""

from __future__ import annotations

import pytest

from training import bars as B
from training import evaluation as E


def ci(mean: float, low: float, high: float) -> dict[str, float]:
    """An interval in fractions, as the summary keeps it (the bars speak in pp)."""
    return {"mean": mean / 100, "low": low / 100, "high": high / 100}


def summary(setting: str, differences: dict[str, dict[str, dict[str, float]]],
            ratios: dict[str, dict[str, float]] | None = None) -> dict:
    names = {name for pair in [*differences, *(ratios or {})] for name in pair.replace(" / ", " - ").split(" - ")}
    metrics = {name: {"recovery_decisions": {"mean": 100.0, "low": 90.0, "high": 110.0}} for name in names}
    return {"metrics": {setting: metrics}, "differences": {setting: differences},
            "recovery_ratios": {setting: ratios or {}}}


@pytest.mark.parametrize(("setting", "kind"), [
    ("permute", "permute"), ("moons_permute", "permute"), ("rotating_permute", "permute"),
    ("classification_1_permute", "permute"), ("shift", "shift"), ("gradual", "gradual"), ("outliers", "outliers"),
    ("rotating", "rotating"), ("none", "none"), ("multimodal", "none"), ("moons", "none"), ("circles", "none")])
def test_every_setting_has_the_bars_of_what_its_stream_does(setting, kind):
    assert B.drift_kind(setting) == kind


def test_every_setting_is_classified():
    assert {B.drift_kind(setting) for setting in E.SETTINGS} == {"permute", "shift", "gradual", "outliers",
                                                                "rotating", "none"}


@pytest.mark.parametrize(("interval", "met"), [
    ((15.0, 1.0, 29.0), True),  # ahead, and the mean past the margin
    ((13.0, 2.0, 24.0), False),  # ahead, but short of the margin
    ((20.0, -1.0, 41.0), False),  # the margin on average, but the CI reaches below zero
])
def test_ahead_by_a_margin_needs_the_ci_above_zero_and_the_mean_at_the_margin(interval, met):
    at = {"at_recovery_point": ci(*interval)}
    bars = B.drift_bars(summary("permute", {"jm_adaptive - knn_best": at, "jm_adaptive - knn_adwin": at}))
    verdicts = [bar["met"] for bar in bars if bar["comparison"] in ("jm_adaptive - knn_best",
                                                                      "jm_adaptive - knn_adwin")]
    assert verdicts == [met, met]


@pytest.mark.parametrize(("interval", "met"), [
    ((-0.5, -0.9, 0.1), True),  # a little worse, never by 1 pp
    ((5.0, -1.2, 11.0), False),  # better on average, but the CI allows 1.2 pp worse
    ((10.0, 5.0, 15.0), True),  # being better does not fail "no worse than"
])
def test_no_worse_than_is_non_inferiority(interval, met):
    bars = B.drift_bars(summary("none", {"jm_adaptive - jm": {"cumulative": ci(*interval)}}))
    (bar,) = [bar for bar in bars if bar["met"] is not None]
    assert bar["bar"].startswith("no worse than 1 pp below") and bar["met"] is met


def test_a_difference_stored_the_other_way_round_is_flipped():
    bars = B.drift_bars(summary("shift", {"knn_best - jm_adaptive": {"at_recovery_point": ci(-3.0, -5.0, -1.0)}}))
    (bar,) = [bar for bar in bars if bar["comparison"] == "jm_adaptive - knn_best"]
    assert bar["value_pp"] == pytest.approx({"mean": 3.0, "low": 1.0, "high": 5.0}) and bar["met"] is True


@pytest.mark.parametrize(("high", "met"), [(0.30, True), (1 / 3, True), (0.34, False)])
def test_the_recovery_bar_needs_the_whole_ci_of_the_ratio_at_most_a_third(high, met):
    ratio = {"mean": 0.2, "low": 0.1, "high": high}
    bars = B.drift_bars(summary("permute", {}, {"jm_adaptive / knn_best": ratio, "jm_adaptive / knn": ratio}))
    verdicts = {bar["comparison"]: bar["met"] for bar in bars}
    assert verdicts == {"jm_adaptive / knn_best": met, "jm_adaptive / knn": None}  # the original's: reported


def test_an_infinite_ratio_is_none_in_the_record_and_never_meets_the_bar():
    ratio = {"mean": None, "low": 0.2, "high": None}  # the k-NN never needed a decision on some resamples
    bars = B.drift_bars(summary("permute", {}, {"jm_adaptive / knn_best": ratio}))
    (bar,) = bars
    assert bar["met"] is False and "(ratio inf [0.20, inf])" in B.bars_table(bars)


def test_count_and_standing():
    differences = {"jm_adaptive - knn_best": {"cumulative": ci(-4.0, -6.0, -2.0)},
                   "jm - knn_best": {"cumulative": ci(1.0, -1.0, 3.0)},
                   "jm_prototypes - knn_best": {"cumulative": ci(2.0, 0.5, 3.5)},
                   "jm_adaptive - jm": {"cumulative": ci(0.0, -0.5, 0.5)}}
    result = summary("moons", differences)
    drift = B.drift_bars(result)
    assert B.count(drift) == {"tested": 1, "met": 1, "reported": 1}
    standing = B.standing(result)
    assert {name: entry["standing"] for name, entry in standing["settings"]["moons"].items()} == {
        "jm": "tied", "jm_adaptive": "behind", "jm_prototypes": "ahead"}
    assert "Behind knn_best in 1 of 3 comparisons." in B.standing_table(standing)


def test_the_recommended_configuration_has_the_drift_bars_and_the_multimodal_bar():
    at = {"at_recovery_point": ci(15.0, 1.0, 29.0)}
    ratio = {"mean": 0.5, "low": 0.4, "high": 0.6}
    permuted = B.recommended_bars(summary("permute", {"jm_recommended - knn_best": at,
                                                      "jm_recommended - knn_adwin": at},
                                          {"jm_recommended / knn_best": ratio}))
    assert [bar["met"] for bar in permuted if bar["met"] is not None] == [True, True, False]
    assert {bar["comparison"] for bar in permuted} == {"jm_recommended - knn_best", "jm_recommended - knn_adwin",
                                                       "jm_recommended / knn_best"}
    cumulative = {"cumulative": ci(-1.5, -1.9, -1.1)}
    multimodal = B.recommended_bars(summary("multimodal", {"jm_recommended - jm": cumulative,
                                                           "jm_recommended - knn_best": cumulative}))
    assert [(bar["bar"], bar["met"]) for bar in multimodal if bar["met"] is not None] == [
        ("no worse than 1 pp below the seed rule (cumulative)", False), ("no worse than 2 pp below knn_best", True)]
    # the outlier bars against the gate's ablations are the adaptive mode's own
    outliers = B.recommended_bars(summary("outliers", {"jm_recommended - jm_no_gate": cumulative,
                                                       "jm_recommended - jm_fast": cumulative}))
    assert outliers == []
