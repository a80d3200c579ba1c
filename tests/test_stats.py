"""Bootstrap intervals against the exact bootstrap distribution, drift recovery on hand-made curves,
every error path, and the report figures rendered to PNG."""

from __future__ import annotations

import doctest
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training import stats as S
from training.report_plots import ablations_figure, rolling_accuracy_figure
from training.stats import Interval, bootstrap_ci, paired_difference, recovery_decisions


def exact_quantile(values: np.ndarray, statistic, p: float) -> float:
    """Inverse CDF at p of the exact bootstrap distribution: all n^n equally likely resamples."""
    n = len(values)
    thetas = np.sort([statistic(values[list(index)]) for index in itertools.product(range(n), repeat=n)])
    return float(thetas[max(math.ceil(p * len(thetas)) - 1, 0)])


@pytest.mark.parametrize("statistic", [np.mean, np.median])
@pytest.mark.parametrize(("values", "level"), [([0.0, 1.0, 5.0], 0.8), ([0.2, 0.9, 0.4, 0.7], 0.9),
                                               ([3.0, -1.0, 2.5, 10.0], 0.5)])
def test_matches_exact_bootstrap(values, level, statistic):
    values = np.array(values)
    interval = bootstrap_ci(values, resamples=20_000, level=level, seed=1, statistic=statistic)
    # 20,000 resamples put the empirical CDF within ~0.004 of the exact one (sd); 0.015 is ~4 sd
    for estimate, p in [(interval.low, (1 - level) / 2), (interval.high, (1 + level) / 2)]:
        assert exact_quantile(values, statistic, p - 0.015) <= estimate <= exact_quantile(values, statistic, p + 0.015)
    assert interval.mean == pytest.approx(statistic(values))
    assert (interval.resamples, interval.level) == (20_000, level)


def test_constant_values_give_zero_width():
    assert bootstrap_ci(np.full(7, 0.75), resamples=50) == Interval(0.75, 0.75, 0.75, 50, 0.95)
    # 0.73 has no exact binary form, so its mean rounds, but every resample rounds the same way
    interval = bootstrap_ci(np.full(7, 0.73), resamples=50)
    assert interval.low == interval.mean == interval.high == pytest.approx(0.73)


def test_identical_pairs_give_exact_zero():
    a = np.random.default_rng(0).random((6, 40))
    interval = paired_difference(a, a.copy())
    for field in interval[:3]:
        assert np.array_equal(field, np.zeros(40))


@given(st.lists(st.floats(-10, 10), min_size=2, max_size=12), st.floats(-100, 100), st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_shift_moves_interval(values, shift, seed):
    base = bootstrap_ci(values, resamples=64, seed=seed)
    shifted = bootstrap_ci(np.array(values) + shift, resamples=64, seed=seed)
    for before, after in zip(base[:3], shifted[:3], strict=True):
        assert after == pytest.approx(before + shift, abs=1e-9)
    assert base.low <= base.mean + 1e-12 and base.mean <= base.high + 1e-12


def test_paired_difference_is_interval_of_difference():
    rng = np.random.default_rng(3)
    a, b = rng.random(9), rng.random(9)
    assert paired_difference(a, b, resamples=300, seed=4) == bootstrap_ci(a - b, resamples=300, seed=4)


@pytest.mark.parametrize("statistic", [np.mean, np.median])
def test_columns_equal_one_dimensional(statistic, monkeypatch):
    curves = np.random.default_rng(5).random((8, 13))
    monkeypatch.setattr(S, "_CHUNK_ELEMENTS", 50)  # several chunks of resamples must not change a thing
    batch = bootstrap_ci(curves, resamples=200, seed=2, statistic=statistic)
    assert batch.mean.shape == batch.low.shape == batch.high.shape == (13,)
    for column in range(13):
        single = bootstrap_ci(curves[:, column], resamples=200, seed=2, statistic=statistic)
        assert (batch.mean[column], batch.low[column], batch.high[column]) == pytest.approx(single[:3], abs=1e-12)


def test_same_seed_same_interval_other_seed_other():
    values = np.random.default_rng(6).random(10)
    assert bootstrap_ci(values, seed=11) == bootstrap_ci(values, seed=11)
    assert bootstrap_ci(values, seed=11) != bootstrap_ci(values, seed=12)


def test_inputs_untouched():
    a, b = np.random.default_rng(7).random((2, 5, 4))
    a_before, b_before = a.copy(), b.copy()
    paired_difference(a, b)
    recovery_decisions(a, drift_at=2, baseline_window=2)
    assert np.array_equal(a, a_before) and np.array_equal(b, b_before)


def test_docstring_examples():
    result = doctest.testmod(S, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# recovery: decisions from index 4 are after the drift; the pre-drift level over 4 decisions is
# 0.5, so fraction 0.75 puts the target at 0.375 (all exact in binary, so the boundary is exact)
PRE = [0.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize(("after", "expected"), [
    ([0.5, 0.45, 0.6, 0.5], 0.0),  # never below the target: nothing to recover
    ([0.375, 0.375, 0.375], 0.0),  # exactly at the target is not below it
    ([0.25, 0.375, 0.1], 2.0),  # fastest possible recovery: below at the first, back at the second
    ([0.5, 0.3, 0.2, 0.4, 0.1], 4.0),  # the dip may start later; the first return counts
    ([0.25, 0.3, 0.35, 0.37], math.nan),  # never back
])
def test_recovery_on_hand_made_curves(after, expected):
    got = recovery_decisions(PRE + after, drift_at=4, fraction=0.75, baseline_window=4)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, nan_ok=True)


def test_recovery_baseline_uses_only_the_window():
    curve = [0.0, 0.0, 1.0, 1.0, 0.85, 0.95]  # the early zeros lie outside a window of 2
    assert recovery_decisions(curve, drift_at=4, baseline_window=2) == 2.0
    assert recovery_decisions(curve, drift_at=4, baseline_window=4) == 0.0


def test_recovery_batch_equals_rows():
    rng = np.random.default_rng(8)
    curves = np.clip(np.cumsum(rng.normal(0, 0.05, (30, 60)), axis=1) + 0.7, 0, 1)
    batch = recovery_decisions(curves, drift_at=20, baseline_window=10, fraction=0.95)
    assert batch.shape == (30,) and batch.dtype == np.float64
    rows = [recovery_decisions(row, drift_at=20, baseline_window=10, fraction=0.95) for row in curves]
    np.testing.assert_array_equal(batch, rows)
    assert np.isnan(batch).any() and (batch == 0).any() and (batch > 0).any()  # every case is exercised


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"values": [0.5]}, "at least 2 seeds"),
    ({"values": []}, "at least 2 seeds"),
    ({"values": np.zeros((2, 0))}, "T >= 1"),
    ({"values": np.zeros((2, 2, 2))}, r"got shape \(2, 2, 2\)"),
    ({"values": [0.1, float("nan"), 0.3]}, r"values must be finite, got nan at index \(1,\)"),
    ({"values": [0.1, float("inf")]}, "values must be finite"),
    ({"values": ["a", "b"]}, "values must be a numeric array"),
    ({"resamples": 0}, "resamples must be an int >= 1, got 0"),
    ({"resamples": 10.0}, "resamples must be an int"),
    ({"level": 1.0}, r"level must be a number in \(0, 1\), got 1.0"),
    ({"level": 0}, "level must be a number"),
    ({"level": True}, "level must be a number"),
    ({"seed": -1}, "seed must be an int >= 0, got -1"),
    ({"statistic": "mean"}, "statistic must be callable"),
    ({"statistic": lambda v: v.mean()}, "statistic must take an axis= keyword"),
    ({"statistic": lambda v, axis: v}, "statistic.*must have shape"),
])
def test_bootstrap_errors(kwargs, match):
    arguments = {"values": [0.1, 0.2, 0.3]} | kwargs
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(arguments.pop("values"), **arguments)


@pytest.mark.parametrize(("a", "b", "kwargs", "match"), [
    ([0.1, 0.2], [0.1, 0.2, 0.3], {}, r"same shape .* got \(2,\) and \(3,\)"),
    (np.zeros((3, 4)), np.zeros((3, 5)), {}, "same shape"),
    ([0.1, float("nan")], [0.1, 0.2], {}, "a must be finite"),
    ([0.1, 0.2], [0.1, float("nan")], {}, "b must be finite"),
    ([0.1, 0.2], [0.1, 0.2], {"level": 2.0}, "level must be"),
])
def test_paired_difference_errors(a, b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_difference(a, b, **kwargs)


@pytest.mark.parametrize(("rolling", "kwargs", "match"), [
    ([], {}, "T >= 1"),
    (np.zeros((2, 2, 8)), {}, "rolling must be"),
    ([0.5, float("nan"), 0.5, 0.5], {}, "rolling must be finite"),
    (np.ones(8), {"drift_at": 1}, "drift_at must be an int >= 2, got 1"),
    (np.ones(8), {"drift_at": 8}, r"before the end of the stream \(T=8\), got 8"),
    (np.ones(8), {"drift_at": 4.0}, "drift_at must be an int"),
    (np.ones(8), {"baseline_window": 0}, "baseline_window must be an int >= 1"),
    (np.ones(8), {"fraction": 0.0}, r"fraction must be a number in \(0, 1\]"),
    (np.ones(8), {"fraction": 1.5}, "fraction must be"),
])
def test_recovery_errors(rolling, kwargs, match):
    arguments = {"drift_at": 4, "baseline_window": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        recovery_decisions(rolling, **arguments)


def test_figures_render_with_nan(tmp_path):
    curves = np.random.default_rng(9).random((5, 120))
    band = bootstrap_ci(curves)
    gappy = tuple(np.where(np.arange(120) < 10, np.nan, part) for part in band[:3])
    figure = rolling_accuracy_figure({"judgment": band, "k-NN": gappy}, drift_at=[40, 80], mark_at=5)
    figure.savefig(tmp_path / "rolling.png", dpi=50)
    differences = {"no attention": Interval(0.09, 0.07, 0.11, 500, 0.95), "no undo": (0.0, -0.02, float("nan"))}
    figure = ablations_figure(differences, reference={"no attention": (0.092, 0.072, 0.113)})
    figure.savefig(tmp_path / "ablations.png", dpi=50)
    for name in ("rolling.png", "ablations.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("call", "match"), [
    (lambda: rolling_accuracy_figure({}), "at least one contestant"),
    (lambda: rolling_accuracy_figure({"x": (np.zeros(3), np.zeros(4), np.zeros(3))}), r"curves\['x'\]"),
    (lambda: rolling_accuracy_figure({"x": ("a", "b", "c")}), "numeric arrays"),
    (lambda: rolling_accuracy_figure({"x": (np.zeros(3),) * 3}, mark_at=4), r"mark_at must be a decision in \[1, 3\]"),
    (lambda: rolling_accuracy_figure({"x": (np.zeros(3),) * 3}, drift_at=[1, -2]), "drift_at must be"),
    (lambda: ablations_figure({}), "at least one ablation"),
    (lambda: ablations_figure({"a": (1, 0, 2)}, reference={"b": (1, 0, 2)}), r"unknown \['b'\]"),
    (lambda: ablations_figure({"a": (np.zeros(2), 0, 2)}), "'a' must be an Interval"),
])
def test_figure_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the ratio of means (the recovery bar) -----------------------------------------------------
def test_ratio_of_means_matches_the_exact_paired_bootstrap():
    a, b = np.array([60.0, 90.0, 75.0]), np.array([200.0, 240.0, 400.0])
    interval = S.ratio_of_means(a, b, resamples=20_000, level=0.8, seed=3)
    thetas = np.sort([a[list(i)].mean() / b[list(i)].mean() for i in itertools.product(range(3), repeat=3)])

    def exact(p: float) -> float:
        return float(thetas[max(math.ceil(p * len(thetas)) - 1, 0)])

    for estimate, p in [(interval.low, 0.1), (interval.high, 0.9)]:
        assert exact(p - 0.015) <= estimate <= exact(p + 0.015)  # the same seeds drawn for a and b
    assert interval.mean == pytest.approx(a.mean() / b.mean())


def test_a_resample_where_b_never_needed_a_decision_counts_as_infinite_not_dropped():
    a, b = np.full(5, 30.0), np.array([0.0, 0.0, 0.0, 0.0, 400.0])
    interval = S.ratio_of_means(a, b, resamples=2000)
    # a resample misses seed 4 with probability (4/5)^5 = 0.33 > 0.025: the high end is infinite
    assert interval.high == np.inf and np.isfinite(interval.low)
    assert S.ratio_of_means(np.zeros(3), np.zeros(3)).mean == 1.0  # neither needed a decision


def test_ratio_of_means_pairs_the_seeds():
    b = np.array([100.0, 300.0, 500.0, 700.0])
    interval = S.ratio_of_means(b / 4, b)  # a quarter of b on every seed: every resample says exactly 1/4
    assert (interval.low, interval.mean, interval.high) == pytest.approx((0.25, 0.25, 0.25))


@pytest.mark.parametrize(("a", "b", "match"), [
    ([1.0, 2.0], [1.0, 2.0, 3.0], "both be \\(S,\\)"),
    ([1.0, 2.0], [-1.0, 3.0], "b must be non-negative"),
    ([-1.0, 2.0], [1.0, 3.0], "a must be non-negative"),
    ([1.0, float("nan")], [1.0, 2.0], "a must be finite"),
])
def test_ratio_of_means_errors(a, b, match):
    with pytest.raises(ValueError, match=match):
        S.ratio_of_means(a, b)
