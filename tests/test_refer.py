"""The act-or-refer calibration (gae/decider/refer.py): its bound against the exact binomial bound, its
threshold, its guarantee on exchangeable streams, and its bad input refused with nothing changed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gae.decider.refer import (
    CHAIN_STARTS,
    CHANGE_LEVEL,
    GRID,
    SHARES,
    Referral,
    ReferralCalibrator,
    binomial_cdf,
    needed,
    passes,
)


def cdf_reference(errors: int, n: int, p: float) -> float:
    """P(K <= errors) for K ~ Binomial(n, p) by the textbook sum: the slow, obvious reference."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(min(errors, n) + 1))


def fallback_reference(window: list[tuple[float, bool]], target: float, delta: float) -> float:
    """The fallback procedure written out from the decisions themselves: levels from the strictest
    down, each tested at its share plus the budget of the level before when that one passed."""
    threshold, carried = math.inf, 0.0
    for level in sorted(GRID, reverse=True):
        share = delta / len(CHAIN_STARTS) if level in CHAIN_STARTS else 0.0
        above = [correct for confidence, correct in window if confidence >= level]
        wrong = sum(not c for c in above)
        budget = carried + share
        if above and wrong < target * len(above) and cdf_reference(wrong, len(above), target) <= budget:
            threshold, carried = level, budget
        else:
            carried = 0.0
    return threshold


@pytest.mark.parametrize("errors, n, p", [(0, 10, 0.02), (0, 228, 0.02), (3, 200, 0.02), (10, 400, 0.05),
                                          (40, 100, 0.3), (5, 5, 0.5), (7, 3, 0.1), (25, 2000, 0.02)])
def test_the_binomial_tail_is_the_textbook_sum(errors, n, p):
    assert binomial_cdf(errors, n, p) == pytest.approx(cdf_reference(errors, n, p), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("n, target, level", [(400, 0.05, 0.1), (1000, 0.02, 0.01), (228, 0.02, 0.01)])
def test_the_test_passes_at_most_level_of_the_time_at_the_target(n, target, level):
    """At an error rate exactly the target, the chance a level passes, summed exactly over the
    binomial's outcomes, is at most ``level`` (and not far below it: the test is exact)."""
    chance = sum(math.comb(n, k) * target ** k * (1 - target) ** (n - k)
                 for k in range(n + 1) if passes(k, n, target, level))
    assert level / 4 < chance <= level


@pytest.mark.parametrize("errors, n", [(0, 0), (0, 100), (2, 150), (6, 900), (30, 1000)])
def test_needed_is_the_fewest_right_answers_that_pass(errors, n):
    target, level = 0.02, 0.01
    more = needed(errors, n, target, level)
    assert passes(errors, n + more, target, level)
    assert more == 0 or not passes(errors, n + more - 1, target, level)


def test_delta_is_shared_among_the_chain_starts_and_nowhere_else():
    assert sum(SHARES) == pytest.approx(1.0)
    assert [level for level, share in zip(GRID, SHARES, strict=True) if share] == sorted(CHAIN_STARTS)


@pytest.mark.parametrize("seed", range(8))
def test_the_threshold_is_the_fallback_procedure_written_out(seed):
    rng = np.random.default_rng(seed)
    calibrator = ReferralCalibrator(0.03, window=700, delta=0.1)
    window = []
    for _ in range(700 + 50 * seed):
        confidence = float(rng.choice([rng.uniform(0.3, 1.0), rng.choice(GRID), 1.0]))
        correct = bool(rng.random() < 0.9 + 0.1 * confidence ** 4)
        calibrator.observe(confidence, correct)
        window = (window + [(confidence, correct)])[-700:]
    assert calibrator.threshold == fallback_reference(window, 0.03, 0.1)


def test_the_fallback_needs_fewer_verifications_than_bonferroni():
    """Right answers only, at 0.99: the fallback passes its 0.99 chain start at delta / 5, where
    Bonferroni over the grid tests every level at delta / 27."""
    fallback = needed(0, 0, 0.02, 0.05 / len(CHAIN_STARTS))
    bonferroni = needed(0, 0, 0.02, 0.05 / len(GRID))
    assert fallback == 228 and bonferroni == 312
    calibrator = ReferralCalibrator(0.02)
    assert calibrator.needed == fallback
    for i in range(fallback):
        assert calibrator.threshold == math.inf and calibrator.needed == fallback - i
        calibrator.observe(0.99, True)
    assert calibrator.threshold == GRID[0] and calibrator.needed == 0


def test_no_evidence_refers_everything_and_clean_evidence_lets_it_act():
    calibrator = ReferralCalibrator(0.02)
    assert calibrator.threshold == math.inf and len(calibrator) == 0
    for _ in range(100):
        calibrator.observe(0.99, True)
    assert calibrator.threshold == math.inf  # 100 right answers cannot show 2% at 95% on a fifth of delta
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
            assert calibrator.threshold == fallback_reference(entries, 0.05, 0.05)
    calibrator.unlearned(list(range(1400, 1450)))
    kept = [e for e, seq in zip(entries, range(800, 1500), strict=True) if not 1400 <= seq < 1450]
    assert calibrator.threshold == fallback_reference(kept, 0.05, 0.05)


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
