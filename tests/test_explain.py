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


@pytest.mark.parametrize("options", [{}, {"learning": "lvq", "relevance_rate": 0.1, "prototypes": 3},
                                     {"learning": "lvq", "relevance_rate": 0.1, "units": "criterion"}])
def test_each_criterion_has_one_weight_and_its_parts_are_named(options):
    """The weight each criterion has in the distance is the memory's metric; with lvq it is the product
    of three parts, attention x relevance / spread, each a field and a row of the table."""
    stream = clustered_stream(8, 500)
    memory = make_judgment(**options)
    with torch.no_grad():
        memory.criterion_logits.normal_(generator=torch.Generator().manual_seed(2))
    memory.learn_(stream.x[:400], stream.category[:400], stream.action[:400], skip=stream.skip[:400])
    x, category = stream.x[400:], stream.category[400:]
    why = memory.explain(x, category)
    torch.testing.assert_close(why.weight, memory.metric()[category].detach())
    lvq = memory.config.learning == "lvq"
    parts = why.attention * why.relevance / why.spread if lvq else why.attention
    torch.testing.assert_close(why.weight, parts)
    assert torch.equal(why.spread, torch.ones_like(why.spread)) != lvq
    table = str(memory.explain(x[:1], category[:1])).splitlines()
    labels = [line.split("  ")[0].strip() for line in table[2:]][:4 if lvq else 1]
    assert labels == (["weight", "= attention", "x relevance", "/ spread"] if lvq else ["weight (attention)"])
    weights = table[2].split()[-memory.n_factors:]
    assert weights == [f"{float(w):.4g}" if lvq else f"{float(w):.3f}" for w in why.weight[0]]


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
