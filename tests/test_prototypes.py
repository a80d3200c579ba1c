"""JudgmentMemory(prototypes=P): spawning, support, recycling and nearest-prototype scoring on constructed cases."""

from __future__ import annotations

import math

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from tests.conftest import clustered_stream, make_judgment


def tiny(**options) -> JudgmentMemory:
    """One category, two actions, two factors: distances can be read off the numbers."""
    return JudgmentMemory(1, 2, 2, **{"config": JudgmentConfig.seed(), "prototypes": 3, "spawn_threshold": 0.5,
                                      **options})


def learn(memory: JudgmentMemory, points: list[list[float]], action: int | list[int]):
    x = torch.tensor(points)
    actions = torch.tensor(action if isinstance(action, list) else [action] * len(points))
    return memory.prequential_(x, torch.zeros(len(points), dtype=torch.int64), actions)


def test_one_prototype_is_the_original_design():
    stream = clustered_stream(0, 400, drift_at=200)
    plain, single = make_judgment(), make_judgment(prototypes=1)
    a = plain.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    b = single.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    assert torch.equal(a.output.logits, b.output.logits) and torch.equal(a.sq_diff, b.sq_diff)
    assert {k: v.shape for k, v in plain.state_dict().items() if isinstance(v, torch.Tensor)} == \
           {k: v.shape for k, v in single.state_dict().items() if isinstance(v, torch.Tensor)}
    # one layout in every mode: a slot dimension of 1, and no wins kept (an empty buffer)
    assert single.wins.shape == (0, 0, 0) and single.centroids.shape == (4, 4, 1, 8)
    assert torch.equal(b.events.prototype, torch.where(b.events.applied, 0, -1))
    assert not b.events.spawned.any() and not b.events.recycled.any()


def test_buffers_and_inventory():
    memory = make_judgment(prototypes=4)
    assert memory.centroids.shape == (4, 4, 4, 8) and memory.initialized.shape == (4, 4, 4)
    assert memory.counts.shape == (4, 4, 4) and memory.wins.shape == (4, 4, 4)
    inventory = memory.parameter_inventory()
    assert inventory["centroids"] == 4 * 4 * 4 * 8 and inventory["wins"] == 4 * 4 * 4
    assert "prototypes=4" in repr(memory)


def test_spawn_threshold_is_strict_and_unweighted():
    memory = tiny()
    learn(memory, [[0.0, 0.0]], 0)
    step = learn(memory, [[0.3, 0.4]], 0)  # exactly 0.5 away: moves the prototype, no spawn
    assert not step.events.spawned.any() and int(step.events.prototype[0]) == 0
    assert math.isclose(float(step.events.displacement[0]), 0.5, rel_tol=1e-6)
    assert memory.initialized[0, 0].tolist() == [True, False, False]
    step = learn(memory, [[1.0, 1.0]], 0)  # far from every prototype of the action: a new one, set to x
    assert bool(step.events.spawned[0]) and not bool(step.events.recycled[0])
    assert int(step.events.prototype[0]) == 1 and float(step.events.eta[0]) == 1.0
    assert memory.initialized[0, 0].tolist() == [True, True, False]
    assert torch.equal(memory.centroids[0, 0, 1], torch.tensor([1.0, 1.0]))
    # attention does not change which prototype learns: the gate's distance is unweighted
    weighted = tiny()
    with torch.no_grad():
        weighted.criterion_logits[0] = torch.tensor([4.0, -4.0])
    learn(weighted, [[0.0, 0.0], [0.3, 0.4], [1.0, 1.0]], 0)
    assert torch.equal(weighted.centroids, memory.centroids)


def test_a_new_prototype_scores_once_it_has_support():
    memory = tiny()
    learn(memory, [[0.0, 0.0], [0.05, 0.0], [0.0, 0.05]], 0)  # slot 0: three wins
    learn(memory, [[0.0, 1.0]], 1)  # action 1's only prototype scores at once
    learn(memory, [[1.0, 1.0]], 0)  # a spawn with one win: not yet trusted
    probe = torch.tensor([[0.95, 0.95]]), torch.tensor([0])
    assert memory.nearest_prototype(*probe).tolist() == [[0, 0]]
    assert int(memory(*probe).action[0]) == 1  # (0, 1) is nearer than (0, 0)
    learn(memory, [[0.9, 1.0]], 0)  # second win close after: 1 * 0.95 + 1 >= 1.5
    assert memory.wins[0, 0, 1] >= memory.config.spawn_support
    assert memory.nearest_prototype(*probe).tolist() == [[1, 0]]
    assert int(memory(*probe).action[0]) == 0
    torch.testing.assert_close(memory.wins[0, 0, 1], torch.tensor(0.95 + 1.0))


def test_recycling_takes_the_slot_with_the_fewest_recent_wins():
    memory = tiny(prototypes=2)
    learn(memory, [[0.0, 0.0], [0.0, 0.1], [0.1, 0.0]], 0)  # slot 0: three wins
    learn(memory, [[1.0, 1.0]], 0)  # slot 1: one win
    before = memory.centroids[0, 0].clone()
    step = learn(memory, [[0.0, 1.0]], 0)  # far from both, no free slot: slot 1 is recycled
    assert bool(step.events.recycled[0]) and bool(step.events.spawned[0]) and int(step.events.prototype[0]) == 1
    assert torch.equal(memory.centroids[0, 0, 1], torch.tensor([0.0, 1.0]))
    assert memory.counts[0, 0].tolist() == [3, 1]  # the recycled slot counts from its new start
    torch.testing.assert_close(memory.wins[0, 0, 1], torch.tensor(1.0))
    records = [r for r in memory.gate_records() if r["event"] == "recycled"]
    assert records == [{"step": 4, "event": "recycled", "category": "0", "action": "0", "prototype": 1,
                        "disp": pytest.approx(float((before - torch.tensor([0.0, 1.0])).norm(dim=-1).min()))}]


def test_wins_decay_per_decision_of_the_action():
    memory = tiny()
    learn(memory, [[0.0, 0.0]] * 3, 0)
    learn(memory, [[1.0, 1.0]] * 2, 1)  # another action's decisions do not decay action 0's wins
    expected = (1 * 0.95 + 1) * 0.95 + 1
    torch.testing.assert_close(memory.wins[0, 0, 0], torch.tensor(expected))
    torch.testing.assert_close(memory.wins[0, 1, 0], torch.tensor(0.95 + 1.0))


def test_scoring_uses_each_actions_nearest_scoring_prototype():
    stream = clustered_stream(2, 600)
    memory = make_judgment(prototypes=4, spawn_threshold=0.3)
    memory.learn_(stream.x[:500], stream.category[:500], stream.action[:500])
    assert memory.initialized.sum() > 32  # several actions hold several prototypes
    x, category = stream.x[500:], stream.category[500:]
    alpha = memory.criterion_attention()
    mask = memory.scoring_mask()
    expected = torch.full((100, 4), float("-inf"))
    for b in range(100):  # the slow, obvious version
        c = int(category[b])
        for a in range(4):
            for p in range(4):
                if mask[c, a, p]:
                    d = float((alpha[c] * (x[b] - memory.centroids[c, a, p]) ** 2).sum())
                    expected[b, a] = max(float(expected[b, a]), -d / memory.config.tau)
    with torch.no_grad():
        compiled = memory(x, category)
    autograd = memory(x.clone().requires_grad_(), category)
    torch.testing.assert_close(compiled.logits, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(autograd.logits.detach(), expected, rtol=1e-4, atol=1e-4)
    nearest = memory.nearest_prototype(x, category)
    assert torch.equal(nearest, torch.where(torch.isfinite(expected), nearest, -1))
    for b in range(20):
        name, confidence = memory.score_one(x[b].tolist(), int(category[b]))
        assert name == memory.action_names[int(compiled.action[b])]
        assert math.isclose(confidence, float(compiled.confidence[b]), rel_tol=1e-5)


def test_attention_learns_through_the_nearest_prototype():
    stream = clustered_stream(3, 300)
    memory = make_judgment(prototypes=3)
    step = memory.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    assert torch.equal(step.nearest >= 0, torch.isfinite(step.output.logits))
    loss = memory.attention_loss(step, stream.category, stream.action, stream.skip)
    loss.backward()
    assert memory.criterion_logits.grad is not None and memory.criterion_logits.grad.abs().sum() > 0


def test_adaptive_mode_runs_with_several_prototypes():
    stream = clustered_stream(4, 800, drift_at=400)
    memory = make_judgment(prototypes=3, drift_mode="adaptive", promotion_threshold=1.0)
    memory.learn_(stream.x, stream.category, stream.action, skip=stream.skip)
    assert memory.shadow_centroids.shape == memory.centroids.shape
    assert memory.promotion_log.step.numel() > 0
    # a promoted category's prototypes in use are its shadows
    c = int(memory.promotion_log.category[-1])
    assert memory.initialized[c].any()


@pytest.mark.parametrize(("option", "value"), [("prototypes", 0), ("prototypes", 1.5), ("spawn_threshold", -0.1),
                                               ("spawn_threshold", float("nan")), ("spawn_support", -1.0)])
def test_bad_options_name_the_argument(option, value):
    with pytest.raises((ValueError, TypeError), match=option):
        make_judgment(**{option: value})


def test_state_round_trips_and_refuses_another_p(tmp_path):
    stream = clustered_stream(5, 300)
    memory = make_judgment(prototypes=3)
    memory.learn_(stream.x, stream.category, stream.action)
    path = tmp_path / "memory.pt"
    torch.save(memory.state_dict(), path)
    state = torch.load(path, weights_only=True)
    copy = make_judgment(prototypes=3)
    copy.load_state_dict(state)
    for key, value in memory.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, copy.state_dict()[key]), key
    assert copy.gate_records() == memory.gate_records()
    for other in (1, 4):
        with pytest.raises(ValueError, match="prototypes=3"):
            make_judgment(prototypes=other).load_state_dict(state)
