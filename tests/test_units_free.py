"""The recommended judgment needs no scaler: its answers are the same in any units.

``units='memory'`` (and ``'criterion'``) measures every distance in units of each criterion's
running spread, and every judge keeps its statistics per criterion with floors relative to the
criterion's own spread (docs/inputs.md), so a per-criterion affine map of the inputs (scale
factors from 1e-3 to 1e3, shifts) changes nothing but float rounding. ``units='category'`` (one
scale per category) does not have the property, and is the contrast that shows the check can fail.
The benchmark measures the same property on the whole public suite at its full length
(``scripts/benchmark_streams.py``: ``jm_units``, ``jm_minmax``, ``jm_standard``); here every stream of
the suite runs at a shorter length.
"""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment.judges import bins

N = 1200  # decisions of each stream in the suite-wide checks
TOLERANCE_UNITS = 0.5  # pp: the bar for random units


def affine(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with each criterion scaled by 10 ** uniform(-3, 3) and shifted by normal(0, 100) times its scale."""
    rng = np.random.default_rng(seed)
    scale = torch.tensor(10.0 ** rng.uniform(-3, 3, x.shape[1]), dtype=torch.float64)
    shift = torch.tensor(rng.normal(0, 100, x.shape[1]), dtype=torch.float64) * scale
    return (x.double() * scale + shift).float()


def mixed_stream(seed: int, n: int = 1500) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two categories, four criteria: a band on one criterion, a linear boundary on two, one irrelevant."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=g)
    category = torch.randint(0, 2, (n,), generator=g)
    band = ((x[:, 0] > 0.3) & (x[:, 0] < 0.6)).long()
    linear = (x[:, 1] + 0.5 * x[:, 2] > 0.75).long()
    return x, category, torch.where(category == 0, band, linear)


@pytest.mark.parametrize("units", ["memory", "criterion"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_per_criterion_affine_map_changes_no_answer(units, seed):
    x, category, action = mixed_stream(seed)
    config = JudgmentConfig.recommended().replace(units=units)
    plain = JudgmentMemory(2, 2, 4, config).prequential_(x, category, action)
    moved = JudgmentMemory(2, 2, 4, config).prequential_(affine(x, seed), category, action)
    later = slice(50, None)  # after its first decisions, up to float rounding
    agree = float((plain.output.action[later] == moved.output.action[later]).float().mean())
    assert agree >= 0.995
    # float rounding in other units tips a value on a bin's edge or a distance at a threshold now and then, and
    # each tip moves later probabilities a little: a few hundredths on 1% of decisions, 1e-4 on the median one
    moves = (moved.output.probs[later] - plain.output.probs[later]).abs().max(-1).values
    assert float(moves.median()) < 1e-3 and float(moves.quantile(0.99)) < 0.03


def test_one_scale_per_category_is_not_units_free():
    """The contrast: units='category' weighs a criterion by the category's mean spread, so its answers move."""
    x, category, action = mixed_stream(0)
    config = JudgmentConfig.recommended().replace(units="category", judges=None)
    plain = JudgmentMemory(2, 2, 4, config).prequential_(x, category, action)
    moved = JudgmentMemory(2, 2, 4, config).prequential_(affine(x, 0), category, action)
    assert float((plain.output.action != moved.output.action).float().mean()) > 0.05


def test_the_bins_follow_each_criterion_in_its_own_units():
    options = bins.Options()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 3, generator=g)
    scale, shift = torch.tensor([1e-3, 1.0, 1e3]), torch.tensor([5.0, -2.0, 1e4])
    means, variances = x.mean(0), x.var(0, unbiased=False)
    here = bins.bin_of(x, means, variances, options)
    there = bins.bin_of(x * scale + shift, means * scale + shift, variances * scale ** 2, options)
    assert float((here == there).float().mean()) >= 0.99  # a value on an edge may round to either side
    low, high = bins.edges(here[:5], means, variances, options)
    inside = (x[:5].double() >= low) & (x[:5].double() < high)
    assert bool(inside.all())


def test_a_criterion_that_never_varied_weighs_nothing():
    """A constant criterion (variance 0) is left out of every distance and judge, so a new value of
    it moves every action's score alike, and the answer stays the other criteria's."""
    g = torch.Generator().manual_seed(4)
    x = torch.rand(300, 3, generator=g)
    x[:, 2] = 7.0  # never varies
    action = (x[:, 0] > 0.5).long()
    memory = JudgmentMemory(1, 2, 3, JudgmentConfig.recommended())
    memory.prequential_(x, torch.zeros(300, dtype=torch.long), action)
    assert float(memory.factor_variances[0, 2]) == 0.0
    queries = torch.tensor([[0.9, 0.5, 7.0], [0.9, 0.5, 1e6], [0.1, 0.5, -3.0]])
    out = memory(queries, torch.zeros(3, dtype=torch.long))
    assert out.action.tolist() == [1, 1, 0]
    assert bool(torch.isfinite(out.probs).all())
    why = memory.explain(queries[1], 0)
    assert float(why.weight[0, 2]) == 0.0 and why.spread[0, 2] == float("inf")
    assert all(t.factor != "2" for t in why.thresholds[0])  # nor does any judge vote by it
    # act or refer's novelty is the one place it counts: a value it never had is as novel as a case gets
    usual, unseen = memory.inspect_one([0.9, 0.5, 7.0], 0).novelty, memory.inspect_one([0.9, 0.5, 1e6], 0).novelty
    assert usual < 10 and unseen > 1e20


def test_the_bins_judge_leaves_out_a_criterion_that_never_varied():
    """Constant criteria (zero columns, one-hot padding) change no vote of the bins judge."""
    g = torch.Generator().manual_seed(8)
    x = torch.rand(400, 2, generator=g)
    action = (torch.rand(400, generator=g) < 0.2 + 0.6 * (x[:, 0] > 0.5)).long()  # a minority action
    padded = torch.cat([x, torch.zeros(400, 5)], 1)
    votes = []
    for rows in (x, padded):
        config = JudgmentConfig.recommended().replace(judges={"bins": {"rate_floor": 0.05}})
        memory = JudgmentMemory(1, 2, rows.shape[1], config)
        votes.append(memory.prequential_(rows, torch.zeros(400, dtype=torch.long), action).votes[:, 1])
    torch.testing.assert_close(votes[1], votes[0])


def test_memory_units_are_each_criterions_spread_over_every_category():
    x, category, action = mixed_stream(5, 400)
    memory = JudgmentMemory(2, 2, 4, JudgmentConfig.recommended())
    memory.prequential_(x, category, action)
    assert int(memory.factor_counts[0]) == 400
    torch.testing.assert_close(memory.factor_means[0], x.mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(memory.factor_variances[0], x.var(0, unbiased=False), rtol=1e-3, atol=1e-6)
    weight = memory.explain(x[:1], category[:1]).spread[0]
    torch.testing.assert_close(weight, memory.factor_variances[0])


def test_a_layout_4_state_gains_the_pooled_statistics_it_lacked():
    """A state saved before ``recent_errors`` and the memory-wide statistics (layout 4) loads with
    no recent error and the statistics pooled from its categories' own (the law of total variance)."""
    x, category, action = mixed_stream(6, 500)
    config = JudgmentConfig.recommended()
    memory = JudgmentMemory(2, 2, 4, config)
    memory.prequential_(x, category, action)
    saved = memory.state_dict()
    old = copy.deepcopy(saved)
    for name in ("recent_errors", "factor_counts", "factor_means", "factor_variances"):
        del old[name]
    old._metadata[""]["version"] = 4  # type: ignore[attr-defined]
    loaded = JudgmentMemory(2, 2, 4, config)
    loaded.load_state_dict(old)
    assert torch.equal(loaded.recent_errors, torch.zeros(2))
    assert torch.equal(loaded.factor_counts, saved["factor_counts"])
    torch.testing.assert_close(loaded.factor_means, saved["factor_means"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loaded.factor_variances, saved["factor_variances"], rtol=1e-3, atol=1e-6)
    assert torch.equal(loaded(x[:20], category[:20]).action, memory(x[:20], category[:20]).action)


def test_the_step_size_floor_rises_with_the_recent_errors():
    """rate_per_error: after the actions swap, the prototypes err, the category's recent error rate
    climbs and their steps grow past rate_floor; a memory without it keeps rate_floor."""
    x, _, action = mixed_stream(7, 1200)
    swapped = torch.where(torch.arange(1200) < 600, action, 1 - action)
    zeros = torch.zeros(1200, dtype=torch.long)
    steps = {}
    for gain in (0.0, 1.0):
        memory = JudgmentMemory(1, 2, 4, JudgmentConfig.recommended().replace(judges=None, rate_per_error=gain))
        step = memory.prequential_(x, zeros, swapped)
        steps[gain] = step.events.eta[600:700]
        if gain:
            assert 0.0 < float(memory.recent_errors[0]) < 0.5
    moved = {gain: steps[gain][steps[gain] < 1] for gain in steps}  # the steps of prototypes not just started
    floor = JudgmentConfig.recommended().lvq.rate_floor
    assert float(moved[1.0].median()) > floor + 0.05
    assert float(moved[1.0].median()) > float(moved[0.0].median()) + 0.05


def _suite_accuracy(front: str | None, stream: str) -> float:
    """The benchmark's run of the recommended judgment (``training.river_suite``) on the first :data:`N`
    samples of ``stream`` (seed 200), behind ``front`` (None: nothing, as the suite runs it)."""
    from river import evaluate, metrics

    from training import river_suite as suite

    spec = suite.MODELS["jm_recommended"]._replace(scaler=front)
    data = suite.samples(stream, 200, N, spec.family)
    return 100 * evaluate.progressive_val_score(data, suite.build(spec, 200, stream), metrics.Accuracy()).get()


SUITE = list(__import__("training.river_suite", fromlist=["STREAMS"]).STREAMS) \
    if importlib.util.find_spec("river") else []


@pytest.mark.parametrize("stream", SUITE)
def test_every_stream_of_the_public_suite_in_random_units(stream):
    """The issue's property on every stream of the public suite: random per-criterion scales and
    shifts (the benchmark's RandomUnits) give the same accuracy within 0.5 pp."""
    torch.set_num_threads(1)
    assert abs(_suite_accuracy("units", stream) - _suite_accuracy(None, stream)) <= TOLERANCE_UNITS


def test_a_memory_pickled_before_layout_5_scores_and_learns():
    """A memory pickled by an earlier gae (layout 4: no recent_errors, no factor_* buffers) gains them on
    unpickling, as a state_dict load adds them (pooled from its categories' statistics)."""
    import pickle

    x, category, action = mixed_stream(9, 300)
    memory = JudgmentMemory(2, 2, 4, JudgmentConfig.recommended())
    memory.prequential_(x, category, action)
    expected = {name: memory.get_buffer(name).clone() for name in ("factor_counts", "factor_means", "factor_variances")}
    for name in ("recent_errors", "factor_counts", "factor_means", "factor_variances"):
        del memory._buffers[name]  # as the earlier layout pickled it
    loaded = pickle.loads(pickle.dumps(memory))
    assert torch.equal(loaded.recent_errors, torch.zeros(2)) and torch.equal(loaded.factor_counts,
                                                                             expected["factor_counts"])
    torch.testing.assert_close(loaded.factor_variances, expected["factor_variances"], rtol=1e-3, atol=1e-6)
    assert loaded.score_one([0.5, 0.5, 0.5, 0.5], 0)[0] is not None
    loaded.learn_one([0.5, 0.5, 0.5, 0.5], 1, 0)
