"""The compiled engine against the plain torch reference, and prequential semantics."""

from __future__ import annotations

import pytest
import torch

from gae.models import knn_engine as engine
from tests.conftest import ENGINE_FACTORIES, clustered_stream, make_judgment, make_knn


def run(memory, stream, backend, confirmed=None):
    memory.backend = backend
    return memory.prequential_(stream.x, stream.category, stream.action, confirmed, stream.skip)


def assert_steps_equal(fast, slow):
    torch.testing.assert_close(fast.output.logits, slow.output.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.output.probs, slow.output.probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.output.confidence, slow.output.confidence, rtol=1e-5, atol=1e-6)
    assert torch.equal(fast.output.action, slow.output.action)
    for name in ("applied", "gated", "skipped", "initialized", "promoted", "prototype", "spawned", "recycled"):
        assert torch.equal(getattr(fast.events, name), getattr(slow.events, name)), name
    torch.testing.assert_close(fast.events.eta, slow.events.eta)
    torch.testing.assert_close(fast.events.displacement, slow.events.displacement, rtol=1e-5, atol=1e-6)
    if fast.sq_diff is not None:
        torch.testing.assert_close(fast.sq_diff, slow.sq_diff)
        assert torch.equal(fast.nearest, slow.nearest)
    assert (fast.retrieved is None) == (slow.retrieved is None)
    if fast.retrieved is not None:  # the traces that voted: the same ones, in the same order
        assert torch.equal(fast.retrieved.ids, slow.retrieved.ids)
        torch.testing.assert_close(fast.retrieved.scores, slow.retrieved.scores)


@pytest.mark.parametrize("name", sorted(ENGINE_FACTORIES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_equals_reference(name, seed):
    # the adaptive modes follow a change for ~20 decisions of each action: a longer stream sees them hand over
    stream = clustered_stream(seed, 1200 if "adaptive" in name else 400, drift_at=200)
    fast, slow = ENGINE_FACTORIES[name](), ENGINE_FACTORIES[name]()
    assert_steps_equal(run(fast, stream, "compiled"), run(slow, stream, "reference"))
    for (key, a), b in zip(fast.state_dict().items(), slow.state_dict().values(), strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    if name.startswith("judgment_prototypes"):  # the stream exercised spawning and recycling
        events = fast.prequential_(stream.x, stream.category, stream.action, skip=stream.skip).events
        assert events.spawned.any() and events.recycled.any() and (events.prototype > 0).any()
        assert (events.gated & (events.prototype > 0)).any()  # the gate acts on spawned prototypes too
    if "adaptive" in name:  # promotions happened, and both logged the same ones
        assert fast.promotion_log.step.numel() > 0
        for field, a, b in zip(fast.promotion_log._fields, fast.promotion_log, slow.promotion_log, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=field)


def test_reference_covers_every_event_kind():
    """The comparison above is only meaningful if the stream exercises every branch."""
    stream = clustered_stream(0, 400, drift_at=200)
    step = run(make_judgment(), stream, "reference")
    assert step.events.gated.any() and (~step.events.gated & step.events.applied).any()
    assert step.events.skipped.any() and step.events.initialized.sum() == 16
    etas = {round(value, 6) for value in step.events.eta.tolist()}
    assert {0.05, 0.01, 0.025, 0.005, 1.0} <= etas  # confirmed, override, both gated, first touch
    assert (step.output.action == -1).any() and (step.output.action >= 0).any()


def test_reference_covers_the_adaptive_branches():
    """The adaptive comparison above is only meaningful if its stream exercises promotions from
    run means, following (gated and not) and the hand-over back to the seed rule."""
    stream = clustered_stream(0, 1200, drift_at=200)
    memory = make_judgment(drift_mode="adaptive")
    step = run(memory, stream, "reference")
    promoted = step.events.promoted.nonzero().squeeze(-1)
    assert promoted.numel() >= 2
    seed_rates = torch.isclose(step.events.eta[:, None], torch.tensor([0.05, 0.01, 0.025, 0.005])).any(-1)
    following = step.events.applied & ~seed_rates & ~step.events.initialized
    assert following.any() and (following & step.events.gated).any()
    # every prototype of the category follows after its first promotion, at a rate >= 0.5 / 19.5:
    # a later override rate (0.01, 0.005) in that category means the seed rule took over again
    first = int(promoted[0])
    override_rates = torch.isclose(step.events.eta[:, None], torch.tensor([0.01, 0.005])).any(-1)
    later = (torch.arange(len(stream.x)) > first) & (stream.category == stream.category[first])
    assert (later & override_rates & step.events.applied).any()


def test_explicit_confirmed_and_options_match_reference():
    stream = clustered_stream(3, 300)
    confirmed = torch.rand(300, generator=torch.Generator().manual_seed(9)) < 0.5
    options = {"clip": (0.1, 0.9), "push_rate": 0.05, "min_confidence": 0.4, "tau": 0.3}
    fast, slow = make_judgment(**options), make_judgment(**options)
    assert_steps_equal(run(fast, stream, "compiled", confirmed), run(slow, stream, "reference", confirmed))
    torch.testing.assert_close(fast.centroids, slow.centroids)


def test_prequential_equals_single_decision_loop(memory_factory, stream):
    batched, single = memory_factory(), memory_factory()
    step = batched.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    for i in range(len(stream.x)):
        one = single.prequential_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1],
                                  skip=stream.skip[i:i + 1])
        assert int(one.output.action[0]) == int(step.output.action[i])
        torch.testing.assert_close(one.output.probs[0], step.output.probs[i])
    for a, b in zip(batched.state_dict().values(), single.state_dict().values(), strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_scores_are_made_before_learning(memory_factory):
    """A decision never sees itself: scoring the first decision of a fresh memory abstains."""
    stream = clustered_stream(4, 10)
    step = memory_factory().prequential_(stream.x, stream.category, stream.action)
    assert int(step.output.action[0]) == -1


def test_forward_matches_prequential_scores(memory_factory, stream):
    memory = memory_factory()
    memory.learn_(stream.x[:200], stream.category[:200], stream.action[:200], skip=stream.skip[:200])
    probe = stream.x[200:201], stream.category[200:201], stream.action[200:201]
    with torch.no_grad():
        out = memory(*probe[:2])
    step = memory.prequential_(*probe)
    assert torch.equal(out.action, step.output.action)
    torch.testing.assert_close(out.probs, step.output.probs, rtol=1e-5, atol=1e-6)


def test_compiled_forward_equals_torch_forward():
    stream = clustered_stream(5, 2000)
    memory = make_judgment(min_confidence=0.3)
    memory.learn_(stream.x[:1000], stream.category[:1000], stream.action[:1000])
    with torch.no_grad():
        fast = memory(stream.x[1000:], stream.category[1000:])
    slow = memory(stream.x[1000:].clone().requires_grad_(), stream.category[1000:])
    assert torch.equal(fast.action, slow.action)
    torch.testing.assert_close(fast.probs, slow.probs.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast.logits, slow.logits.detach(), rtol=1e-4, atol=1e-5)


def test_knn_forward_equals_loop_scores():
    stream = clustered_stream(6, 300)
    for memory in (make_knn(), make_knn(scoped=True)):
        memory.learn_(stream.x[:200], stream.category[:200], stream.action[:200])
        with torch.no_grad():
            out = memory(stream.x[200:], stream.category[200:])
        state = engine.KNNState(memory.store_factors.clone(), memory.store_actions.clone(),
                                memory.store_categories.clone(), memory.store_steps.clone(), memory.ring.clone())
        for i in range(200, 300):
            probe = engine.KNNState(*(t.clone() for t in state))
            ref, _, _ = engine.knn_prequential_reference(probe, stream.x[i:i + 1], stream.category[i:i + 1],
                                                      stream.action[i:i + 1], torch.zeros(1, dtype=torch.bool),
                                                      0, memory.k, memory.scoped, False, 4)
            assert int(ref.action[0]) == int(out.action[i - 200])
            torch.testing.assert_close(ref.probs[0], out.probs[i - 200])


def test_knn_ring_buffer_is_fifo():
    memory = make_knn(capacity=5, k=1)
    x = torch.arange(8, dtype=torch.float32).unsqueeze(1).repeat(1, 8) / 10
    memory.learn_(x, torch.zeros(8, dtype=torch.long), torch.arange(8) % 4)
    kept = memory.store_steps[memory._age_order()]
    assert kept.tolist() == [3, 4, 5, 6, 7] and len(memory) == 5
