"""JudgmentMemory semantics on small hand-computed cases."""

from __future__ import annotations

import math
import re

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory

SEED = JudgmentConfig.seed()  # the original rule, which these tests pin (the default is recommended())


def one(values):
    return torch.tensor([values], dtype=torch.float32)


def idx(*values):
    return torch.tensor(values)


def test_fresh_memory_is_the_plain_euclidean_seed_design():
    memory = JudgmentMemory(2, 3, 4, config=SEED)
    assert torch.equal(memory.criterion_attention(), torch.ones(2, 4))
    assert not memory.initialized.any() and int(memory.num_decisions) == 0
    out = memory(torch.rand(5, 4), torch.zeros(5, dtype=torch.long))
    assert (out.action == -1).all() and (out.confidence == 0).all() and (out.probs == 0).all()
    assert torch.isinf(out.logits).all()


def test_first_touch_then_confirmed_and_override_steps():
    memory = JudgmentMemory(1, 2, 2, config=SEED)
    events = memory.learn_(one([0.2, 0.2]), idx(0), idx(0))
    assert bool(events.initialized[0]) and float(events.eta[0]) == 1.0
    assert torch.equal(memory.centroids[0, 0, 0], torch.tensor([0.2, 0.2]))
    # the only prototype recommends action 0: learning action 0 is a confirmation
    events = memory.learn_(one([0.4, 0.2]), idx(0), idx(0))
    assert float(events.eta[0]) == pytest.approx(0.05) and not bool(events.gated[0])
    assert memory.centroids[0, 0, 0].tolist() == pytest.approx([0.2 + 0.05 * 0.2, 0.2])
    # verified action 1 while the memory recommends 0: an override (first touch of action 1)
    memory.learn_(one([0.9, 0.9]), idx(0), idx(1))
    events = memory.learn_(one([0.8, 0.9]), idx(0), idx(0))  # recommends 1 here -> override
    assert bool(events.gated[0]) and float(events.eta[0]) == pytest.approx(0.01 * 0.5)  # override, gated
    assert memory.counts[..., 0].tolist() == [[3, 1]]  # (C, A, P): one prototype slot


def test_gate_damps_and_logs_with_the_displacement():
    memory = JudgmentMemory(["only"], ["a", "b"], 2, config=SEED, drift_threshold=0.4, gate_damping=0.5)
    memory.learn_(one([0.0, 0.0]), idx(0), idx(0))
    events = memory.learn_(one([0.6, 0.8]), idx(0), idx(0))  # displacement exactly 1.0
    assert bool(events.gated[0]) and float(events.displacement[0]) == pytest.approx(1.0)
    assert float(events.eta[0]) == pytest.approx(0.025)
    assert memory.centroids[0, 0, 0].tolist() == pytest.approx([0.015, 0.02])
    log = memory.gate_log
    assert log.step.tolist() == [1] and log.category.tolist() == [0] and log.action.tolist() == [0]
    assert memory.gate_records() == [{"step": 1, "event": "gated", "category": "only", "action": "a",
                                      "disp": pytest.approx(1.0), "eta": pytest.approx(0.025)}]


def test_skip_changes_no_state_but_counts_the_decision():
    memory = JudgmentMemory(1, 2, 2, config=SEED)
    memory.learn_(one([0.5, 0.5]), idx(0), idx(0))
    before = {k: v.clone() for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}
    events = memory.learn_(one([0.9, 0.1]), idx(0), idx(1), skip=torch.tensor([True]))
    assert bool(events.skipped[0]) and not bool(events.applied[0])
    for key in ("centroids", "initialized", "counts", "criterion_logits"):
        assert torch.equal(before[key], memory.state_dict()[key])
    assert int(memory.num_decisions) == 2  # sequence numbers stay aligned with the stream
    assert memory.learn_one([0.9, 0.1], 1, 0, outcome="__incorrect__") == {"skipped": True}


def test_probabilities_follow_the_softmax_of_negative_distances():
    memory = JudgmentMemory(1, 2, 2, config=SEED, tau=0.5)
    memory.learn_(torch.tensor([[0.0, 0.0], [1.0, 0.0]]), idx(0, 0), idx(0, 1))
    with torch.no_grad():
        out = memory(one([0.25, 0.0]), idx(0))
    d0, d1 = 0.25 ** 2, 0.75 ** 2
    expected = torch.softmax(torch.tensor([-d0 / 0.5, -d1 / 0.5]), 0)
    torch.testing.assert_close(out.probs[0], expected)
    assert int(out.action[0]) == 0 and float(out.confidence[0]) == pytest.approx(float(expected[0]))


def test_attention_weighs_the_distance():
    memory = JudgmentMemory(1, 2, 2, config=SEED)
    memory.learn_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), idx(0, 0), idx(0, 1))
    x = one([0.8, 0.0])  # closer to action 1 on criterion 0, to action 0 on criterion 1
    with torch.no_grad():
        memory.criterion_logits[0] = torch.tensor([0.0, 3.0])  # criterion 1 dominates
    assert int(memory(x, idx(0)).action[0]) == 0
    with torch.no_grad():
        memory.criterion_logits[0] = torch.tensor([3.0, 0.0])
    assert int(memory(x, idx(0)).action[0]) == 1


def test_clip_keeps_prototypes_in_range():
    memory = JudgmentMemory(1, 1, 2, config=SEED, clip=(0.0, 1.0), eta_confirmed=1.0)
    memory.learn_(one([1.5, -0.5]), idx(0), idx(0))
    assert memory.centroids[0, 0, 0].tolist() == [1.0, 0.0]
    memory.learn_(one([3.0, -2.0]), idx(0), idx(0), confirmed=torch.tensor([True]))
    assert memory.centroids[0, 0, 0].tolist() == [1.0, 0.0]
    unclipped = JudgmentMemory(1, 1, 2, config=SEED)
    unclipped.learn_(one([1.5, -0.5]), idx(0), idx(0))
    assert unclipped.centroids[0, 0, 0].tolist() == [1.5, -0.5]


def test_push_rate_moves_the_wrong_prototype_away_on_override():
    pushed, plain = JudgmentMemory(1, 2, 1, config=SEED, push_rate=0.1), JudgmentMemory(1, 2, 1, config=SEED)
    for memory in (pushed, plain):
        memory.learn_(one([0.4]), idx(0), idx(0))
        memory.learn_(one([1.0]), idx(0), idx(1))  # recommends 0 (the only prototype), verifier says 1
        memory.learn_(one([0.5]), idx(0), idx(1))  # recommends 0 (closer), verifier says 1
    assert plain.centroids[0, 0, 0].item() == pytest.approx(0.4)
    first_push = 0.4 - 0.1 * (1.0 - 0.4)
    assert pushed.centroids[0, 0, 0].item() == pytest.approx(first_push - 0.1 * (0.5 - first_push))
    torch.testing.assert_close(pushed.centroids[0, 1, 0], plain.centroids[0, 1, 0])
    confirmed = JudgmentMemory(1, 2, 1, config=SEED, push_rate=0.1)
    confirmed.learn_(torch.tensor([[0.4], [1.0]]), idx(0, 0), idx(0, 1), confirmed=torch.tensor([True, True]))
    assert confirmed.centroids[0, 0, 0].item() == pytest.approx(0.4)  # no override, no push


def test_min_confidence_abstains_below_the_threshold():
    memory = JudgmentMemory(1, 2, 1, config=SEED, min_confidence=0.9)
    memory.learn_(torch.tensor([[0.0], [1.0]]), idx(0, 0), idx(0, 1))
    with torch.no_grad():
        out = memory(torch.tensor([[0.5], [0.0]]), idx(0, 0))
    assert out.action.tolist() == [-1, 0]  # a tie is not confident enough; a clear case is
    assert float(out.confidence[0]) == 0.0 and out.probs[0].tolist() == pytest.approx([0.5, 0.5])
    assert memory.score_one([0.5], 0) == (None, 0.0)


def test_single_decision_api_uses_names():
    memory = JudgmentMemory(["invoice", "general"], ["approve", "reject"], ["amount", "risk"], config=SEED)
    result = memory.learn_one([0.1, 0.9], "reject")  # category defaults to 'general', as in the original
    assert result == {"skipped": False, "gated": False, "eta": 1.0, "disp": 0.0, "initialized": True}
    assert memory.score_one([0.2, 0.8]) == ("reject", 1.0)
    assert memory.score_one([0.2, 0.8], "invoice") == (None, 0.0)
    action, confidence = memory.score_one(torch.tensor([0.2, 0.8]), 1)
    assert action == "reject" and math.isclose(confidence, 1.0)


def test_default_category_name_must_exist():
    memory = JudgmentMemory(2, 2, 2, config=SEED)
    with pytest.raises(ValueError, match="unknown category 'general'; known: \\['0', '1'\\]"):
        memory.score_one([0.1, 0.2])


def test_parameter_inventory_counts_every_number():
    inventory = JudgmentMemory(4, 4, 8, config=SEED).parameter_inventory()
    adaptive = ("shadow_centroids", "promotion_statistic", "promotion_evidence", "following", "follow_weight",
                "run_centroids", "run_counts", "tracking_centroids", "tracking_lead")
    lvq = ("input_counts", "input_means", "input_variances", "relevance_logits", "recent_errors", "factor_counts",
           "factor_means", "factor_variances")
    # the buffers of the options that are off (wins with one prototype, the adaptive and lvq state) are empty
    assert inventory == {"criterion_logits": 32, "centroids": 128, "initialized": 16, "counts": 16, "wins": 0,
                         "num_decisions": 1, **dict.fromkeys(adaptive, 0), **dict.fromkeys(lvq, 0), "trust_weights": 0,
                         "total": 193}
    # learning='lvq' adds each category's running mean and variance, its count, its relevance logits and its
    # recent error rate, and the memory's running count, mean and variance of each criterion
    inventory = JudgmentMemory(4, 4, 8, config=SEED, learning="lvq", prototypes=3).parameter_inventory()
    assert inventory == {"criterion_logits": 32, "centroids": 384, "initialized": 48, "counts": 48, "wins": 48,
                         "num_decisions": 1, **dict.fromkeys(adaptive, 0), "input_counts": 4, "input_means": 32,
                         "input_variances": 32, "relevance_logits": 32, "recent_errors": 4, "factor_counts": 1,
                         "factor_means": 8, "factor_variances": 8, "trust_weights": 0, "total": 682}
    # judges add their own buffers and the trust, one weight per category and judge
    inventory = JudgmentMemory(4, 4, 8, config=SEED, learning="lvq", judges={"gauss": {}}).parameter_inventory()
    assert inventory["trust_weights"] == 8 and inventory["judge_gauss_means"] == 4 * 4 * 8
    assert inventory["judge_gauss_weights"] == 16 and inventory["judge_gauss_total"] == 4


def test_extra_repr_names_the_hyperparameters():
    # the config's repr names the options that differ from the seed rule's (the others are its defaults)
    text = repr(JudgmentMemory(4, 4, 8, config=SEED, clip=(0.0, 1.0)))
    assert "config=JudgmentConfig(clip=(0.0, 1.0))" in text
    text = repr(JudgmentMemory(4, 4, 8, config=SEED, tau=0.2, eta_override=0.02, clip=(0.0, 1.0)))
    assert "tau=0.2" in text and "eta_override=0.02" in text and "clip=(0.0, 1.0)" in text


@pytest.mark.parametrize("name, how", [("seed", "config=JudgmentConfig.seed()"),
                                       ("adaptive", "config=JudgmentConfig.seed(), drift_mode='adaptive'"),
                                       ("prototypes4", "config=JudgmentConfig.seed(), prototypes=4")])
def test_a_state_the_seed_rule_saved_names_the_config_that_loads_it(name, how):
    """JudgmentMemory() was the seed rule; it is recommended() now. A state saved by the old default
    does not fit the new one, and the refusal names the memory that loads it (not one option at a
    time, each of which would be refused in turn)."""
    import copy
    from pathlib import Path

    fixture = torch.load(Path(__file__).parent / "data" / "checkpoints" / f"{name}.pt", weights_only=True)
    names = (["a", "b", "c", "d"], ["approve", "review", "reject"], 5)
    with pytest.raises(ValueError, match=f"build the memory with {re.escape(how)} to load it"):
        JudgmentMemory(*names).load_state_dict(copy.deepcopy(fixture["state_dict"]))
    memory = eval(f"JudgmentMemory(*names, {how})", {"JudgmentMemory": JudgmentMemory,
                                                     "JudgmentConfig": JudgmentConfig, "names": names})
    memory.load_state_dict(copy.deepcopy(fixture["state_dict"]))
    assert memory.config == JudgmentConfig.seed().replace(**fixture["options"])
