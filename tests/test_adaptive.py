"""drift_mode='adaptive': follows a constructed drift, ignores a constructed outlier burst, keeps its state.

The compiled kernel is held equal to the torch reference in test_engine.py (the adaptive
factories are part of ENGINE_FACTORIES), and the battery in test_battery.py runs on it too.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from tests.conftest import clustered_stream, make_judgment

LOW, HIGH = (0.2, 0.2), (0.8, 0.8)


def two_clusters(n: int, seed: int, swapped: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One category, two actions alternating; action 0 near LOW and 1 near HIGH (or the reverse)."""
    gen = torch.Generator().manual_seed(seed)
    action = torch.arange(n) % 2
    centre = torch.tensor([HIGH, LOW] if swapped else [LOW, HIGH])[action]
    return centre + 0.03 * torch.randn(n, 2, generator=gen), action


def learn(memory: JudgmentMemory, x: torch.Tensor, action: torch.Tensor):
    return memory.prequential_(x, torch.zeros(len(x), dtype=torch.int64), action)


def settled(drift_mode: str = "adaptive") -> JudgmentMemory:
    memory = JudgmentMemory(1, 2, 2, config=JudgmentConfig.seed(), drift_mode=drift_mode)
    learn(memory, *two_clusters(200, seed=0))
    return memory


def test_a_constructed_drift_is_detected_and_followed():
    adaptive, seed = settled(), settled("seed")
    before = len(adaptive.promotion_log.step)
    x, action = two_clusters(60, seed=1, swapped=True)
    step = learn(adaptive, x, action)
    seed_step = learn(seed, x, action)
    promotions = adaptive.promotion_log
    assert len(promotions.step) > before
    first = int(promotions.step[before]) - 200
    assert first < 12, "the change is detected within a few decisions of each action"
    assert int(promotions.shadow_right[before]) > int(promotions.main_right[before])
    assert (step.output.action[30:] == action[30:]).float().mean() == 1.0
    assert (seed_step.output.action[30:] == action[30:]).float().mean() == 0.0  # the seed rule is still lost
    records = [r for r in adaptive.gate_records() if r["event"] == "promoted"]
    assert records[-1]["category"] == "0" and records[-1]["statistic"] > adaptive.config.promotion_threshold
    assert adaptive.promotion_records() == records and adaptive.promotion_records(last=1) == records[-1:]
    assert adaptive.promotion_records(last=10 ** 6) == records


def test_a_burst_of_outliers_is_not_followed():
    memory = settled()
    centroids, promotions = memory.centroids.clone(), len(memory.promotion_log.step)
    gen = torch.Generator().manual_seed(2)
    corners = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # far from both prototypes
    outliers = corners[torch.randint(2, (20,), generator=gen)] + 0.05 * torch.rand(20, 2, generator=gen).abs()
    learn(memory, outliers.clamp(0, 1), torch.randint(2, (20,), generator=gen))
    x, action = two_clusters(40, seed=3)
    step = learn(memory, x, action)
    assert len(memory.promotion_log.step) == promotions
    assert not bool(memory.following.any())
    assert (step.output.action == action).all()
    assert (memory.centroids - centroids).norm(dim=-1).max() < 0.1  # the gate damped the burst


def test_adaptive_equals_the_seed_rule_until_its_first_promotion_or_lead():
    """The prototypes learn by the seed rule, and score, until a category promotes or its tracking
    prototypes take the lead; the adaptive mode adds state beside them, nothing else."""
    stream = clustered_stream(5, 600, drift_at=300)
    seed, adaptive = make_judgment(), make_judgment(drift_mode="adaptive")
    a = seed.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    steps, leads = [], []
    for i in range(len(stream.x)):  # one at a time, to see the lead each decision was scored under
        leads.append(float(adaptive.tracking_lead[int(stream.category[i])]))
        steps.append(adaptive.prequential_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1],
                                           skip=stream.skip[i:i + 1]))
    promoted = [bool(step.events.promoted[0]) for step in steps]
    first_lead = next(i for i, lead in enumerate(leads) if lead > 0)
    first = min(first_lead - 1, promoted.index(True))  # the last decision the seed rule alone scored and learned
    assert first >= 10
    b = torch.cat([step.output.action for step in steps])
    assert torch.equal(a.output.action[:first + 1], b[:first + 1])
    assert torch.equal(a.output.logits[:first + 1], torch.cat([step.output.logits for step in steps])[:first + 1])
    for name in ("applied", "gated", "eta", "displacement"):
        theirs = torch.cat([getattr(step.events, name) for step in steps])
        assert torch.equal(getattr(a.events, name)[:first + 1], theirs[:first + 1]), name
    assert not a.events.promoted.any()
    assert not torch.equal(a.output.action, b), "past that point the modes differ"


def test_state_round_trips_mid_drift():
    stream = clustered_stream(6, 800, drift_at=300)
    whole, first_half = make_judgment(drift_mode="adaptive"), make_judgment(drift_mode="adaptive")
    whole_step = whole.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    cut = int(whole_step.events.promoted.nonzero()[-1, 0]) + 3  # in the middle of following a change
    first_half.prequential_(stream.x[:cut], stream.category[:cut], stream.action[:cut], skip=stream.skip[:cut])
    assert bool(first_half.following.any()), "the cut must fall while a category follows a change"
    buffer = io.BytesIO()
    torch.save(first_half.state_dict(), buffer)
    buffer.seek(0)
    resumed = make_judgment(drift_mode="adaptive")
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    rest = resumed.prequential_(stream.x[cut:], stream.category[cut:], stream.action[cut:], skip=stream.skip[cut:])
    assert torch.equal(rest.output.action, whole_step.output.action[cut:])
    for (key, mine), theirs in zip(resumed.state_dict().items(), whole.state_dict().values(), strict=True):
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs), key
    assert resumed.gate_records() == whole.gate_records()
    for field, mine, theirs in zip(whole.promotion_log._fields, resumed.promotion_log, whole.promotion_log,
                                   strict=True):
        assert torch.equal(mine, theirs), field


def test_the_modes_do_not_load_each_others_state():
    with pytest.raises(ValueError, match="drift_mode='adaptive' but this memory has drift_mode='seed'"):
        make_judgment().load_state_dict(make_judgment(drift_mode="adaptive").state_dict())
    with pytest.raises(ValueError, match="drift_mode='seed' but this memory has drift_mode='adaptive'"):
        make_judgment(drift_mode="adaptive").load_state_dict(make_judgment().state_dict())


def test_seed_mode_has_no_adaptive_state():
    seed, adaptive = make_judgment(), make_judgment(drift_mode="adaptive")
    assert seed.config.drift_mode == "seed"
    extra = {"shadow_centroids", "promotion_statistic", "promotion_evidence", "following", "follow_weight",
             "run_centroids", "run_counts", "tracking_centroids", "tracking_lead"}
    # one layout in every mode: the seed memory has the same buffers, those of the adaptive state empty
    assert set(adaptive.state_dict()) == set(seed.state_dict())
    assert {name for name, tensor in seed.state_dict().items()
            if isinstance(tensor, torch.Tensor) and tensor.numel() != adaptive.state_dict()[name].numel()} == extra
    assert all(seed.state_dict()[name].numel() == 0 for name in extra)
    inventory, base = adaptive.parameter_inventory(), seed.parameter_inventory()
    c, a, p, k = seed.centroids.shape
    assert p == 1
    assert inventory["shadow_centroids"] == inventory["run_centroids"] == inventory["tracking_centroids"] == c * a * k
    assert inventory["following"] == inventory["follow_weight"] == inventory["run_counts"] == c * a
    assert inventory["total"] == base["total"] + 3 * c * a * k + 3 * c * a + c + 2 * c + c
    # the config's repr names the options that differ from the seed rule's: shadow_eta is its default, 0.5
    assert "drift_mode='adaptive'" in repr(adaptive) and adaptive.config.shadow_eta == 0.5


@pytest.mark.parametrize("kwargs, message", [
    ({"drift_mode": "fast"}, "drift_mode must be 'seed' or 'adaptive', got 'fast'"),
    ({"drift_mode": "adaptive", "shadow_eta": 0.0}, "shadow_eta"),
    ({"drift_mode": "adaptive", "shadow_eta": 1.5}, "shadow_eta"),
    ({"drift_mode": "adaptive", "promotion_threshold": -1.0}, "promotion_threshold"),
    ({"drift_mode": "adaptive", "promotion_threshold": math.nan}, "promotion_threshold"),
    ({"drift_mode": "adaptive", "tracking_eta": 0.0}, "tracking_eta"),
    ({"drift_mode": "adaptive", "tracking_eta": 1.5}, "tracking_eta"),
])
def test_bad_hyperparameters_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_judgment(**kwargs)


def test_a_rejected_batch_leaves_the_adaptive_state_alone():
    memory = make_judgment(drift_mode="adaptive")
    stream = clustered_stream(7, 300, drift_at=150)
    memory.prequential_(stream.x, stream.category, stream.action)
    before = {k: v.clone() for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}
    bad = stream.x[:10].clone()
    bad[4, 2] = math.inf
    with pytest.raises(ValueError):
        memory.prequential_(bad, stream.category[:10], stream.action[:10])
    for key, value in memory.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key]), key


def test_a_promotion_takes_the_run_means_then_follows_as_a_running_mean():
    """Brute force, one decision at a time: the run is every decision since the statistic last
    stood at 0; a promotion sets each prototype to the mean of its action's decisions in the run,
    which then continues as a running mean (eta = 1 / count) until its rate is down to
    eta_confirmed, where the seed rule takes over."""
    memory = JudgmentMemory(1, 2, 2, config=JudgmentConfig.seed(), drift_mode="adaptive")
    settle, settle_action = two_clusters(200, seed=0)
    swapped, swapped_action = two_clusters(160, seed=1, swapped=True)
    x, action = torch.cat([settle, swapped]), torch.cat([settle_action, swapped_action])
    statistic, eta, promoted, gated = [], [], [], []
    for i in range(len(x)):
        step = learn(memory, x[i:i + 1], action[i:i + 1])
        statistic.append(float(memory.promotion_statistic[0]))
        eta.append(float(step.events.eta[0]))
        gated.append(bool(step.events.gated[0]))
        promoted.append(bool(step.events.promoted[0]))
        if promoted[-1] and promoted.count(True) == 1:
            centroids = memory.centroids[0, :, 0].clone()  # (A, K): the one prototype slot
    after = [i for i in range(200, len(x)) if promoted[i]]
    assert len(after) == 1, "one promotion follows the swap"
    at = after[0]
    start = max(i for i in range(at) if statistic[i] == 0) + 1
    counts = []
    for a in range(2):
        run = [i for i in range(start, at + 1) if int(action[i]) == a]
        assert run, "both actions have decisions in the run"
        torch.testing.assert_close(centroids[a], x[run].mean(0), rtol=0, atol=1e-6)
        counts.append(len(run))
        later = [i for i in range(at + 1, len(x)) if int(action[i]) == a]
        assert not any(gated[i] for i in later[:25]), "the construction keeps the gate out of it"
        following = [1.0 / (counts[a] + j) for j in range(1, 20 - counts[a])]  # weights up to 1 / 0.05 - 1 = 19
        assert [eta[i] for i in later[:len(following)]] == pytest.approx(following)
        assert eta[later[len(following)]] in (pytest.approx(0.05), pytest.approx(0.01))  # the seed rule again
    assert not bool(memory.following.any())


def test_a_mild_shift_is_followed_by_the_tracking_prototypes():
    """A shift too small for the change test: the tracking prototypes follow it, take the lead and
    score, while the prototypes still lag behind."""
    memory = settled()
    promotions = len(memory.promotion_log.step)
    gen = torch.Generator().manual_seed(4)
    action = torch.arange(20) % 2
    shifted = torch.tensor([[0.32, 0.2], [0.92, 0.8]])  # both clusters move by 0.12
    x = shifted[action] + 0.03 * torch.randn(20, 2, generator=gen)
    learn(memory, x, action)
    assert len(memory.promotion_log.step) == promotions and float(memory.tracking_lead[0]) > 0
    scoring, prototypes = memory.scoring_centroids()[0, :, 0], memory.centroids[0, :, 0]
    assert torch.equal(scoring, memory.tracking_centroids[0, :, 0])
    assert (scoring - shifted).norm(dim=-1).max() < 0.04 < 0.06 < (prototypes - shifted).norm(dim=-1).min()
    output = memory(x[-10:], torch.zeros(10, dtype=torch.int64))
    logits = -((x[-10:, None, :] - scoring) ** 2).sum(-1) / memory.config.tau  # scored against the tracking prototypes
    torch.testing.assert_close(output.logits, logits)
    assert memory.score_one(x[-1].tolist(), 0)[0] == memory.action_names[int(output.action[-1])]
    explained = memory.explain(x[-1].tolist(), 0)
    torch.testing.assert_close(explained.distance, -logits[-1:] * memory.config.tau)
    torch.testing.assert_close(explained.displacement,  # the gate still measures against the prototype
                               (x[-1] - prototypes[int(output.action[-1])]).norm().view(1))


def test_an_adaptive_state_of_the_earlier_format_is_migrated():
    """A state of the first adaptive format (gae before the tracking prototypes: no
    ``adaptive_format``, one prototype's buffers without a slot dimension, no ``wins``) loads, its
    tracking prototypes starting at the prototypes with no lead."""
    memory = settled()
    assert not torch.equal(memory.tracking_centroids, memory.centroids)  # so the migration has something to set
    tracking = ("tracking_centroids", "tracking_lead")

    def earlier(buffers):
        return {name: tensor.squeeze(2) if isinstance(tensor, torch.Tensor) and tensor.dim() >= 3 else tensor
                for name, tensor in buffers.items() if name not in (*tracking, "wins")}

    state = earlier(memory.state_dict())
    extra = {key: value for key, value in memory.state_dict()["_extra_state"].items() if key != "config"}
    extra.update(drift_mode="adaptive", prototypes=1)
    extra["decision_log"] = {**extra["decision_log"], "base": earlier(extra["decision_log"]["base"])}
    state["_extra_state"] = extra
    assert "adaptive_format" not in extra and state["centroids"].dim() == 3
    migrated = JudgmentMemory(1, 2, 2, config=JudgmentConfig.seed(), drift_mode="adaptive")
    migrated.load_state_dict(state)
    assert torch.equal(migrated.tracking_centroids, migrated.centroids)
    assert torch.equal(migrated.tracking_lead, torch.zeros(1))
    for name, tensor in memory.state_dict().items():
        if isinstance(tensor, torch.Tensor) and name not in tracking:
            assert torch.equal(migrated.state_dict()[name], tensor), name


@pytest.mark.parametrize("weight, gated", [(0.0, False), (3.0, True)])
def test_explain_and_the_engine_agree_on_a_restart_and_on_a_following_step(weight, gated):
    """A promoted prototype with no weight yet (its run had none of its decisions) restarts: its
    next decision replaces it and the gate has nothing to damp; one with weight is gated."""
    memory = settled()
    memory.following[0, 0, 0], memory.follow_weight[0, 0, 0] = True, weight
    far = [0.2, 0.75]  # recommended 0 (nearer to its prototype at LOW), but beyond the gate's threshold of it
    explained = memory.explain(far, 0)
    assert int(explained.action[0]) == 0 and float(explained.displacement[0]) > memory.config.drift_threshold
    assert bool(explained.gated[0]) is gated
    step = learn(memory, torch.tensor([far]), torch.tensor([0]))
    assert bool(step.events.gated[0]) is gated
    assert float(step.events.eta[0]) == pytest.approx(1.0 if weight == 0 else 0.5 / (weight + 0.5))
