"""learning='lvq': its rule step by step, units from the data, the learned relevances, its state.

The compiled kernel is held equal to the torch reference in tests/test_engine.py (``judgment_lvq``
factories), the single-decision path in tests/test_single_decision.py and every scoring path in
tests/test_scoring_paths.py; here, the rule's semantics against numbers worked out by hand and
against plain torch.
"""

from __future__ import annotations

import io

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment import lvq

LVQ = {"learning": "lvq", "relevance_rate": 0.0, "push_rate": 0.0, "units": "criterion"}


def memory(**options) -> JudgmentMemory:
    return JudgmentMemory(["c"], ["a", "b"], 2, **{"config": JudgmentConfig.seed(), **LVQ, **options})


def test_a_prototype_is_the_running_mean_of_its_decisions_until_the_floor():
    m = memory(rate_floor=0.25)
    rows = [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0], [3.0, 0.0], [4.0, 0.0]]
    etas = [m.learn_one(row, "a", "c")["eta"] for row in rows]
    # 1 (first touch), then 1/2, 1/3, then the floor 0.25 (1/4 = the floor), 0.25
    assert etas == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.25])
    running = torch.tensor(rows[:4]).mean(0)  # the mean of the first four decisions
    expected = running + 0.25 * (torch.tensor(rows[4]) - running)
    torch.testing.assert_close(m.centroids[0, 0, 0], expected)


def test_the_inputs_are_standardised_by_the_running_variance():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 2, generator=gen) * torch.tensor([1000.0, 0.01]) + torch.tensor([5.0, -3.0])
    m = memory()
    m.learn_(x, torch.zeros(300, dtype=torch.long), torch.zeros(300, dtype=torch.long))
    assert int(m.input_counts[0]) == 300
    torch.testing.assert_close(m.input_means[0], x.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m.input_variances[0], x.var(0, unbiased=False), rtol=1e-3, atol=0)
    # the metric: attention (1) x relevance (1/2) / variance (no floor: both criteria varied)
    expected = 0.5 / x.var(0, unbiased=False)
    torch.testing.assert_close(m.metric()[0], expected, rtol=1e-3, atol=0)


def two_clouds(seed: int, n: int, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    action = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, scale.numel(), generator=gen) + 3.0 * action[:, None].float()
    return x * scale, action


@pytest.mark.parametrize("n_factors", [2, 40])
@pytest.mark.parametrize("units", ["category", "criterion"])
def test_the_decisions_do_not_depend_on_the_units_of_the_data(n_factors, units):
    """One configuration for K = 2 and K = 40, in any units: ``units='category'`` (the recommended)
    measures distances in the category's mean running variance, so rescaling every criterion by
    1024 changes nothing it decides; ``units='criterion'`` in each criterion's own, so rescaling
    one criterion by 1024 and another by 1/32 changes nothing either (powers of two: float32 rounds
    the scaled numbers as it rounds the plain ones; nothing is added to a variance)."""
    config = JudgmentConfig.recommended().replace(units=units)
    plain, action = two_clouds(1, 600, torch.ones(n_factors))
    if units == "category":
        scale = torch.full((n_factors,), 1024.0)
    else:
        scale = torch.ones(n_factors)
        scale[0], scale[-1] = 1024.0, 1 / 32
    outputs = []
    for x in (plain, plain * scale):
        m = JudgmentMemory(1, 2, n_factors, config)
        outputs.append(m.prequential_(x, torch.zeros(600, dtype=torch.long), action))
    a, b = outputs
    assert (a.output.action == b.output.action).float().mean() >= 0.99
    assert (a.events.spawned != b.events.spawned).sum() <= 3
    assert (a.output.action == action).float()[100:].mean() > 0.9  # and it learned the task


def test_category_units_keep_the_criteria_in_proportion():
    """``units='category'`` divides every squared difference by one number, the category's mean
    running variance: a criterion that varies little (noise on a constant) keeps its small weight,
    where ``units='criterion'`` would blow it up to the others' size."""
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(400, 2, generator=gen) * torch.tensor([1.0, 0.01])
    weights = {}
    for units in ("category", "criterion"):
        m = memory(units=units)
        m.learn_(x, torch.zeros(400, dtype=torch.long), torch.zeros(400, dtype=torch.long))
        weights[units] = m.metric()[0]
    variance = x.var(0, unbiased=False)
    torch.testing.assert_close(weights["category"], 0.5 / variance.mean().expand(2), rtol=1e-3, atol=0)
    torch.testing.assert_close(weights["criterion"], 0.5 / variance, rtol=1e-3, atol=0)


def test_an_error_spawns_a_prototype_and_pushes_the_wrong_winner():
    m = memory(prototypes=2, push_rate=0.5, spawn_threshold=0.0, spawn_support=0.0)
    c = torch.zeros(1, dtype=torch.long)
    m.learn_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.zeros(2, dtype=torch.long), torch.tensor([0, 1]))
    assert m.initialized[0].tolist() == [[True, False], [True, False]]
    before_b = m.centroids[0, 1, 0].clone()
    # (0.9, 0.9) is nearest b's prototype at (1, 1), but the verifier says a: wrong, so a spawns there and b moves away
    step = m.prequential_(torch.tensor([[0.9, 0.9]]), c, torch.tensor([0]))
    assert int(step.output.action[0]) == 1 and bool(step.events.spawned[0]) and not bool(step.events.recycled[0])
    assert int(step.events.prototype[0]) == 1
    torch.testing.assert_close(m.centroids[0, 0, 1], torch.tensor([0.9, 0.9]))
    # b's prototype has 1 update: pushed at push_rate x max(1/2, floor) away from x
    pushed = before_b - 0.5 * 0.5 * (torch.tensor([0.9, 0.9]) - before_b)
    torch.testing.assert_close(m.centroids[0, 1, 0], pushed)
    # a right answer moves the nearest prototype of its action and spawns nothing
    step = m.prequential_(torch.tensor([[0.85, 0.85]]), c, torch.tensor([0]))
    assert int(step.output.action[0]) == 0 and not bool(step.events.spawned[0]) and int(step.events.prototype[0]) == 1
    # the confirmed flag is not the rule's: only whether the memory's own recommendation was the action
    flagged = m.prequential_(torch.tensor([[0.0, 0.1]]), c, torch.tensor([0]), confirmed=torch.tensor([False]))
    assert not bool(flagged.events.spawned[0])


def test_a_full_action_recycles_its_least_won_prototype():
    m = memory(prototypes=2, spawn_threshold=0.0, spawn_support=0.0)
    c = torch.zeros(1, dtype=torch.long)
    for row, label in (([0.0, 0.0], 0), ([5.0, 5.0], 1), ([4.8, 4.8], 0), ([0.1, 0.0], 0), ([0.0, 0.1], 0),
                       ([5.0, 5.0], 0)):
        step = m.prequential_(torch.tensor([row]), c, torch.tensor([label]))
    # a's slots: (0, 0) won three times, (4.8, 4.8) once; the last decision sits on b's prototype, an error that
    # recycles the latter
    assert bool(step.events.spawned[0]) and bool(step.events.recycled[0]) and int(step.events.prototype[0]) == 1


def test_the_relevances_learn_which_criterion_decides():
    gen = torch.Generator().manual_seed(3)
    n = 2000
    action = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 4, generator=gen)
    x[:, 0] += 2.5 * action.float()  # only criterion 0 tells the actions apart
    m = JudgmentMemory(1, 2, ["signal", "noise1", "noise2", "noise3"], config=JudgmentConfig.seed(), learning="lvq",
                       relevance_rate=0.05)
    m.learn_(x, torch.zeros(n, dtype=torch.long), action)
    relevance = m.relevances()[0]
    assert float(relevance.sum()) == pytest.approx(1.0)
    assert float(relevance[0]) > 0.5 and bool((relevance[1:] < 0.25).all())
    why = m.explain([2.0, 0.0, 0.0, 0.0], 0)
    torch.testing.assert_close(why.relevance[0], relevance)
    torch.testing.assert_close(why.contributions.sum(-1), why.distance)
    assert "relevance" in str(why) and not bool(why.gated.any()) and not bool(why.spawns.any())
    # relevance_rate=0 keeps them uniform
    still = JudgmentMemory(1, 2, 4, config=JudgmentConfig.seed(), learning="lvq")
    still.learn_(x, torch.zeros(n, dtype=torch.long), action)
    torch.testing.assert_close(still.relevances()[0], torch.full((4,), 0.25))


def test_relevance_step_follows_its_formula():
    """One GRLVQ step against the derivative of the relative distance, taken by autograd."""
    m = memory(prototypes=1)
    m.learn_(torch.tensor([[0.0, 0.0], [1.0, 3.0], [0.5, 0.2], [0.2, 2.0]]), torch.zeros(4, dtype=torch.long),
             torch.tensor([0, 1, 0, 1]))
    state, alpha, config = m.state(), m.criterion_attention().detach(), m.config.replace(relevance_rate=0.1)
    x = torch.tensor([0.3, 1.5])
    logits = state.relevance_logits[0].clone().requires_grad_(True)
    lam = torch.softmax(logits, -1)
    scale = alpha[0] / state.input_variances[0]  # (units='category' of one category: its own variances)
    d_own = (lam * scale * (x - state.centroids[0, 0, 0]) ** 2).sum()
    d_rival = (lam * scale * (x - state.centroids[0, 1, 0]) ** 2).sum()
    ((d_own - d_rival) / (d_own + d_rival)).backward()
    expected = logits.detach() - 0.1 * logits.grad
    lvq.relevance_step(x, 0, 0, 0, 1, 0, alpha, state, config)
    torch.testing.assert_close(state.relevance_logits[0], expected)


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="learning must be 'gated' or 'lvq', got 'glvq'"):
        JudgmentConfig(learning="glvq")
    with pytest.raises(ValueError, match=r"rate_floor must be in \(0.0, 1.0\], got 0.0"):
        JudgmentConfig(learning="lvq", rate_floor=0.0)
    with pytest.raises(ValueError, match="relevance_rate must be in"):
        JudgmentConfig(learning="lvq", relevance_rate=-0.1)
    with pytest.raises(ValueError, match="does not combine with drift_mode='adaptive'"):
        JudgmentConfig(learning="lvq", drift_mode="adaptive")


def test_state_round_trips_and_the_mode_is_checked_on_load():
    x, action = two_clouds(4, 300, torch.ones(3))
    category = torch.zeros(300, dtype=torch.long)
    m = JudgmentMemory(1, 2, 3, JudgmentConfig.recommended())
    m.learn_(x, category, action)
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    restored = JudgmentMemory(1, 2, 3, JudgmentConfig.recommended())
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    probe, _ = two_clouds(5, 50, torch.ones(3))
    with torch.no_grad():
        assert torch.equal(m(probe, category[:50]).logits, restored(probe, category[:50]).logits)
    for name in ("input_counts", "input_means", "input_variances", "relevance_logits"):
        assert torch.equal(getattr(m, name), getattr(restored, name)), name
    with pytest.raises(ValueError, match="learning='lvq' but this memory has learning='gated'"):
        JudgmentMemory(1, 2, 3, config=JudgmentConfig.seed(),
                       prototypes=m.config.prototypes).load_state_dict(m.state_dict())


def test_undo_restores_the_running_statistics_and_relevances():
    x, action = two_clouds(6, 200, torch.ones(3))
    category = torch.zeros(200, dtype=torch.long)
    m = JudgmentMemory(1, 2, 3, JudgmentConfig.recommended())
    m.learn_(x[:150], category[:150], action[:150])
    saved = {name: tensor.clone() for name, tensor in m.state_dict().items() if isinstance(tensor, torch.Tensor)}
    m.learn_(x[150:], category[150:], action[150:])
    m.undo_(50)
    for name, tensor in saved.items():
        assert torch.equal(m.state_dict()[name], tensor), name


def test_a_miss_costs_every_nearer_prototype_of_another_action_a_share_of_its_wins():
    m = memory(prototypes=3, miss_penalty=0.5, spawn_threshold=100.0, spawn_support=0.0)
    c = torch.zeros(3, dtype=torch.long)
    # a at (0, 0); b at (1, 1) and (0.6, 0.6) (spawned by an error: far from b's first prototype? no: threshold 100)
    m.learn_(torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.9, 0.9]]), c, torch.tensor([0, 1, 1]))
    with torch.no_grad():  # place the prototypes by hand: a at (0, 0), b at (1, 1) and (0.5, 0.5)
        m.centroids[0, 1, 1] = torch.tensor([0.5, 0.5])
        m.initialized[0, 1, 1] = True
        m.wins[0].copy_(torch.tensor([[4.0, 0.0, 0.0], [8.0, 2.0, 0.0]]))
    # x = (0.4, 0.4) labelled a: b's (0.5, 0.5) is nearer than a's (0, 0), b's (1, 1) is not
    m.prequential_(torch.tensor([[0.4, 0.4]]), c[:1], torch.tensor([0]))
    keep = 1.0 - m.config.win_decay
    torch.testing.assert_close(m.wins[0, 1], torch.tensor([8.0, 1.0, 0.0]))  # only the nearer one, halved
    torch.testing.assert_close(m.wins[0, 0], torch.tensor([4.0 * keep + 1.0, 0.0, 0.0]))  # a's: a win, no miss
    # the reference rule does the same
    slow = memory(prototypes=3, miss_penalty=0.5, spawn_threshold=100.0, spawn_support=0.0)
    slow.backend = "reference"
    slow.load_state_dict(m.state_dict())
    for memory_ in (m, slow):
        memory_.prequential_(torch.tensor([[0.45, 0.45]]), c[:1], torch.tensor([0]))
    torch.testing.assert_close(m.wins, slow.wins)


@pytest.mark.parametrize("name", ["judgment_lvq", "judgment_lvq_options"])
def test_the_engine_comparison_streams_exercise_every_lvq_branch(name):
    """tests/test_engine.py holds the kernel equal to the reference on these streams: the comparison
    means something only if they spawn, recycle, push, cost support and move the relevances."""
    from tests.conftest import MEMORY_FACTORIES, clustered_stream

    stream = clustered_stream(0, 400, drift_at=200)
    m = MEMORY_FACTORIES[name]()
    m.backend = "reference"
    wins = []
    original = lvq.miss

    def counting(x, c, a, weights, state, config):
        before = state.wins.clone()
        original(x, c, a, weights, state, config)
        wins.append(bool((state.wins < before).any()))

    pushed = []
    original_step = lvq.lvq_step

    def watching(x, c, a, recommended, nearest, logits, alpha, state, config):
        before = state.centroids.clone()
        result = original_step(x, c, a, recommended, nearest, logits, alpha, state, config)
        if recommended >= 0 and recommended != a:
            pushed.append(not torch.equal(before[c, recommended], state.centroids[c, recommended]))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lvq, "miss", counting)
        patch.setattr(lvq, "lvq_step", watching)
        step = m.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    events = step.events
    assert events.spawned.any() and events.recycled.any() and events.initialized.any() and events.skipped.any()
    assert any(wins) and any(pushed)
    assert not torch.equal(m.relevance_logits, torch.zeros_like(m.relevance_logits))


def test_the_tuning_neighbourhood_moves_one_constant_or_one_judge_at_a_time():
    from training import lvq_tuning

    chosen = JudgmentConfig.recommended()
    judges = chosen.to_dict()["judges"]
    candidates = lvq_tuning.neighbourhood()
    assert candidates["chosen"] == {} and candidates["judges=none"] == {"judges": {}}
    for name, options in candidates.items():
        config = chosen.replace(**options)  # every candidate is a valid configuration
        moved = {option for option in JudgmentConfig.options() if getattr(config, option) != getattr(chosen, option)}
        assert len(moved) == (0 if name == "chosen" else 1), name
        if name.startswith("without "):
            assert list(config.to_dict()["judges"]) == [j for j in judges if j != name.removeprefix("without ")]
        elif "." in name.split("=")[0]:  # one judge's option: that judge alone differs, in that option alone
            judge, option = name.split("=")[0].split(".")
            given = config.to_dict()["judges"]
            assert [j for j in judges if given[j] != judges[j]] == [judge]
            assert {k for k in judges[judge] if given[judge][k] != judges[judge][k]} == {option}
