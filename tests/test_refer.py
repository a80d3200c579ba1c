"""The act-or-refer calibration (gae/decider/refer.py): its bound against the exact binomial bound, its
threshold, its guarantee on exchangeable streams, and its bad input refused with nothing changed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gae.decider.refer import CHANGE_LEVEL, GRID, Referral, ReferralCalibrator, kl_passes, kl_upper_bound


def clopper_pearson_upper(errors: int, n: int, delta: float) -> float:
    """The exact one-sided bound by bisection on the binomial CDF: the slow, obvious reference."""
    def cdf(p: float) -> float:
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(errors + 1))

    low, high = errors / n, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) > delta else (low, middle)
    return high


def test_the_bound_at_no_error_is_the_exact_one():
    n = np.array([10, 150, 1000])
    torch_free = kl_upper_bound(np.zeros(3), n, math.log(1 / 0.05))
    np.testing.assert_allclose(torch_free, 1 - 0.05 ** (1 / n), rtol=1e-9)


@pytest.mark.parametrize("errors, n", [(1, 50), (3, 200), (10, 400), (40, 100)])
def test_the_bound_is_valid_no_tighter_than_the_exact_one(errors, n):
    bound = float(kl_upper_bound(np.array([errors]), np.array([n]), math.log(1 / 0.05))[0])
    exact = clopper_pearson_upper(errors, n, 0.05)
    assert errors / n < exact <= bound + 1e-9  # Chernoff's bound is never below the exact one
    assert bound < exact + 0.05  # and not loose


def test_the_bound_holds_as_often_as_it_promises():
    rng = np.random.default_rng(0)
    p, n, budget = 0.05, 300, math.log(1 / 0.1)
    errors = rng.binomial(n, p, size=4000)
    misses = np.mean(kl_upper_bound(errors, np.full(4000, n), budget) < p)
    assert misses <= 0.1


def test_no_evidence_refers_everything_and_clean_evidence_lets_it_act():
    calibrator = ReferralCalibrator(0.02)
    assert calibrator.threshold == math.inf and len(calibrator) == 0
    for _ in range(100):
        calibrator.observe(0.99, True)
    assert calibrator.threshold == math.inf  # 100 right answers cannot show 2% at 95% with 27 levels tested
    for _ in range(300):
        calibrator.observe(0.99, True)
    assert calibrator.threshold == GRID[0]  # every level holds the same 400 right answers: the lowest passes
    for _ in range(400):
        calibrator.observe(0.6, False)  # wrong at 0.6: the levels up to 0.6 fail, the next one holds
    assert calibrator.threshold == 0.65


def test_wrong_answers_at_high_confidence_raise_the_threshold_to_refer_all():
    calibrator = ReferralCalibrator(0.02, window=500)
    for i in range(500):
        calibrator.observe(0.999, i % 10 != 0)  # 10% wrong however confident
    assert calibrator.threshold == math.inf


def test_the_window_is_bounded_and_forgets_the_oldest():
    calibrator = ReferralCalibrator(0.05, window=400)
    for _ in range(400):
        calibrator.observe(0.95, False)
    assert calibrator.threshold == math.inf
    for _ in range(400):
        calibrator.observe(0.95, True)  # a new regime replaces the window
    assert len(calibrator) == 400 and calibrator.threshold <= 0.95


@pytest.mark.parametrize("seed", range(6))
def test_on_an_exchangeable_stream_the_error_taken_alone_stays_under_the_target(seed):
    """A calibrated model (right with the probability it states) that is sure of most decisions:
    70% at a confidence in [0.95, 1], the rest in [0.5, 0.95]. Once the window is full, the
    decisions taken alone err at most the target, up to the binomial noise of their count."""
    rng = np.random.default_rng(seed)
    calibrator = ReferralCalibrator(0.05, window=1000)
    alone = wrong = 0
    for t in range(6000):
        confidence = float(rng.uniform(0.95, 1.0) if rng.random() < 0.7 else rng.uniform(0.5, 0.95))
        correct = bool(rng.random() < confidence)
        if t >= 1000 and confidence >= calibrator.threshold:
            alone += 1
            wrong += not correct
        calibrator.observe(confidence, correct)
    assert alone > 2000  # it does act: on most of the about 3,500 sure decisions
    rate = wrong / alone
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / alone)


def test_the_grid_is_fixed_increasing_and_in_the_unit_interval():
    assert list(GRID) == sorted(set(GRID)) and 0 < GRID[0] and GRID[-1] < 1


@pytest.mark.parametrize("call, error", [
    (lambda c: c.observe(float("nan"), True), ValueError), (lambda c: c.observe(1.5, True), ValueError),
    (lambda c: c.observe(0.9, 1), TypeError), (lambda c: c.observe("0.9", True), TypeError),
    (lambda c: c.load_state({"confidence": [0.5], "correct": []}), ValueError),
    (lambda c: c.load_state({"confidence": [2.0], "correct": [True]}), ValueError),
    (lambda c: c.load_state({"confidence": [0.5], "correct": [True], "change": -1.0}), ValueError),
    (lambda c: c.observe(0.9, True, alone=1), TypeError), (lambda c: c.observe(0.9, True, seq=-2), ValueError),
])
def test_bad_input_is_refused_and_changes_nothing(call, error):
    calibrator = ReferralCalibrator(0.05, window=10)
    calibrator.observe(0.9, True)
    before = calibrator.state()
    with pytest.raises(error):
        call(calibrator)
    assert calibrator.state() == before


@pytest.mark.parametrize("kwargs", [{"target_error": 0.0}, {"target_error": 1.0}, {"target_error": float("nan")},
                                    {"target_error": 0.1, "window": 0}, {"target_error": 0.1, "delta": 1.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises((ValueError, TypeError)):
        ReferralCalibrator(**kwargs)


def test_the_state_round_trips():
    calibrator = ReferralCalibrator(0.02, window=600)
    rng = np.random.default_rng(1)
    for i in range(600):
        calibrator.observe(float(rng.uniform(0.9, 1.0)), bool(rng.random() < 0.995), i, alone=bool(i % 2))
    again = ReferralCalibrator(0.02, window=600)
    again.load_state(calibrator.state())
    assert again.state() == calibrator.state() and again.threshold == calibrator.threshold


def test_errors_piling_up_among_decisions_taken_alone_empty_the_window():
    """Page's CUSUM on the decisions taken alone: at the target it seldom fires (with this seed,
    never in 5,000), below it the window proves a level; at ten times the target (a drift the
    window still hides) it fires within a few dozen, and the window restarts."""
    rng = np.random.default_rng(7)
    at_target = ReferralCalibrator(0.02)
    for i in range(5000):
        at_target.observe(0.99, bool(rng.random() >= 0.02), i, alone=True)
    assert at_target.restarts == 0
    calibrator = ReferralCalibrator(0.02)
    for i in range(5000):
        calibrator.observe(0.99, bool(rng.random() >= 0.005), i, alone=True)
    assert calibrator.restarts == 0 and len(calibrator) == 2000 and calibrator.threshold < 1.0
    for i in range(5000, 5200):
        calibrator.observe(0.99, bool(rng.random() >= 0.2), i, alone=True)
        if calibrator.restarts:
            break
    assert calibrator.restarts == 1 and i - 5000 < 100 and calibrator.threshold == math.inf
    referred = ReferralCalibrator(0.02)  # errors among referred decisions are no evidence of a change
    for i in range(300):
        referred.observe(0.99, False, i, alone=False)
    assert referred.restarts == 0 and len(referred) == 300
    assert CHANGE_LEVEL == pytest.approx(math.log(1000))


def test_unlearned_entries_go_and_the_later_ones_renumber():
    calibrator = ReferralCalibrator(0.1)
    for seq in range(10):
        calibrator.observe(0.5 + seq / 100, seq != 3, seq, alone=seq == 3)
    calibrator.unlearned([3, 7])
    state = calibrator.state()
    assert state["seq"] == [0, 1, 2, 3, 4, 5, 6, 7] and state["confidence"][3] == pytest.approx(0.54)
    assert state["change"] == 0.0  # the change statistic of what is left: the error taken alone went
    referral = Referral(0.1)
    for seq in range(5):
        referral.observe(0, 0.9, True, eligible=seq != 2, seq=seq, trust=[0.5, 0.5])
    referral.unlearned(np.array([0]))
    assert referral.state()["trust"]["seq"] == [0, 1, 2, 3] and referral.state()["calibration"]["seq"] == [0, 2, 3]


def test_the_closed_form_pass_test_is_the_bound_at_most_the_target():
    rng = np.random.default_rng(11)
    n = rng.integers(0, 3000, 4000)
    errors = np.minimum(rng.integers(0, 60, 4000), n)
    for target in (0.01, 0.02, 0.1):
        budget = math.log(len(GRID) / 0.05)
        bound = kl_upper_bound(errors, n, budget)
        clear = np.abs(bound - target) > 1e-9  # (bisection's precision at the edge)
        assert np.array_equal(kl_passes(errors, n, target, budget)[clear], (bound <= target)[clear])


def slow_threshold(entries: list[tuple[float, bool]], target: float, delta: float) -> float:
    """The threshold as the module states it: the lowest level whose decisions at least that
    confident have a bound at most the target, every decision counted one by one."""
    for level in GRID:
        chosen = [correct for confidence, correct in entries if confidence >= level]
        bound = kl_upper_bound(np.array([len(chosen) - sum(chosen)]), np.array([len(chosen)]),
                               math.log(len(GRID) / delta))[0]
        if chosen and bound <= target:
            return level
    return math.inf


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tallied_threshold_is_the_one_counted_over_the_window(seed):
    rng = np.random.default_rng(seed)
    calibrator = ReferralCalibrator(0.05, window=700)
    entries = []
    for i in range(1500):
        confidence = float(rng.choice([rng.uniform(0.3, 1.0), GRID[int(rng.integers(len(GRID)))]]))  # levels too
        correct = bool(rng.random() >= 0.2 * (1 - confidence))
        calibrator.observe(confidence, correct, i)
        entries = (entries + [(confidence, correct)])[-700:]
        if i % 97 == 0 or i > 1490:
            assert calibrator.threshold == slow_threshold(entries, 0.05, 0.05)
    calibrator.unlearned(list(range(1400, 1450)))
    kept = [e for e, seq in zip(entries, range(800, 1500), strict=True) if not 1400 <= seq < 1450]
    assert calibrator.threshold == slow_threshold(kept, 0.05, 0.05)


def test_the_running_tally_is_the_tally_counted_again():
    """Each observation updates the level buckets in place (the one leaving the window and the
    one coming): held equal to counting the window's entries from scratch."""
    calibrator = ReferralCalibrator(0.1, window=50)
    rng = np.random.default_rng(5)
    for seq in range(400):
        calibrator.observe(float(rng.random()), bool(rng.random() < 0.8), seq, alone=bool(rng.random() < 0.5))
        if seq % 37 == 0:
            running = (list(calibrator._decided), list(calibrator._wrong))
            calibrator._recount()
            assert (calibrator._decided, calibrator._wrong) == running
