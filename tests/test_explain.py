"""JudgmentMemory.explain: every number behind a recommendation, held to the scoring and learning paths."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import clustered_stream, make_judgment


@pytest.mark.parametrize("options", [{}, {"prototypes": 3, "spawn_threshold": 0.5}, {"min_confidence": 0.5}])
def test_explanation_agrees_with_scoring_and_learning(options):
    stream = clustered_stream(7, 700)
    memory = make_judgment(**options)
    with torch.no_grad():
        memory.criterion_logits.normal_(generator=torch.Generator().manual_seed(1))
    memory.learn_(stream.x[:600], stream.category[:600], stream.action[:600], skip=stream.skip[:600])
    x, category = stream.x[600:], stream.category[600:]
    why = memory.explain(x, category)
    with torch.no_grad():
        out = memory(x, category)
    assert torch.equal(why.action, out.action)
    torch.testing.assert_close(why.probs, out.probs, rtol=1e-4, atol=1e-6)
    present = torch.isfinite(why.distance)
    torch.testing.assert_close(why.contributions.sum(-1)[present], why.distance[present], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(-why.distance[present] / memory.config.tau, out.logits[present], rtol=1e-4, atol=1e-4)
    assert torch.equal(why.nearest, memory.nearest_prototype(x, category))
    torch.testing.assert_close(why.attention, memory.criterion_attention()[category].detach())
    finite = torch.isfinite(why.margin)
    two = why.distance.sort(-1).values
    torch.testing.assert_close(why.margin[finite], (two[:, 1] - two[:, 0])[finite])
    # learning each decision as its recommendation does what the explanation says it would
    for b in range(len(x)):
        if int(why.action[b]) < 0:
            continue
        probe = copy.deepcopy(memory)
        events = probe.learn_(x[b:b + 1], category[b:b + 1], why.action[b:b + 1], torch.tensor([True]))
        assert bool(events.gated[0]) == bool(why.gated[b]) and bool(events.spawned[0]) == bool(why.spawns[b]), b
        torch.testing.assert_close(events.displacement[0], why.displacement[b])
    if memory.config.prototypes > 1:
        assert why.spawns.any() and why.gated.any()


def test_one_decision_and_the_printed_table():
    memory = make_judgment(prototypes=2)
    memory.learn_one([0.1] * 8, 0, 1)
    memory.learn_one([0.9] * 8, 2, 1)
    why = memory.explain([0.2] * 8, 1)
    assert why.action.tolist() == [0] and why.nearest[0].tolist() == [0, -1, 0, -1]
    text = str(why)
    assert text.startswith("decision 0 (1): recommends 0") and "would not be gated" in text
    assert "attention" in text and "0 *" in text and text.count("\n") == 1 + 1 + 4
    assert "abstains" in str(make_judgment().explain([0.5] * 8, 0))
    many = memory.explain(torch.rand(12, 8), torch.ones(12, dtype=torch.int64))
    assert str(many).endswith("... 4 more decisions not shown")


def test_bad_input_is_refused_and_changes_nothing():
    memory = make_judgment()
    memory.learn_one([0.1] * 8, 0, 1)
    before = {k: v.clone() for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="factors"):
        memory.explain([0.1] * 7, 1)
    with pytest.raises(ValueError):
        memory.explain([float("nan")] * 8, 1)
    with pytest.raises((ValueError, KeyError), match="category"):
        memory.explain([0.1] * 8, "nowhere")
    with pytest.raises(TypeError, match="category"):
        memory.explain(torch.rand(2, 8), 1)
    with pytest.raises(TypeError, match="category"):
        memory.explain([0.1] * 8, torch.tensor([1]))
    for key, value in memory.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key]), key


def test_explain_names_its_factors_argument():
    memory = make_judgment()
    with pytest.raises(ValueError, match="factors"):
        memory.explain(torch.full((2, 8), float("nan")), torch.zeros(2, dtype=torch.long))
