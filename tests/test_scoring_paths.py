"""One scoring formula, every path that scores held equal to it, in every mode.

``gae.judgment.rule.distances`` is the formula; the paths are the batched compiled kernel
(``forward`` under ``no_grad``), ``forward`` with autograd (torch), ``score_one`` (the
single-decision kernel), ``explain``, ``nearest_prototype``, ``attention_logits`` and the
online engine's pre-learning outputs (compiled and reference). Each memory has learned a
seeded stream with a drift (so adaptive memories have promoted; half their categories are then
set to score with their tracking prototypes) and has non-uniform attention.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment import rule
from gae.judgment.kernels.scoring import output
from gae.types import MemoryOutput
from tests.conftest import MEMORY_FACTORIES, clustered_stream

# the prototypes' formula (the judges' mixture has its own references, tests/test_judges.py)
JUDGMENT = sorted(name for name in MEMORY_FACTORIES if name.startswith("judgment") and "judges" not in name
                  and name != "judgment_recommended")


def trained(name: str, seed: int):
    memory = MEMORY_FACTORIES[name]()
    with torch.no_grad():
        memory.criterion_logits.copy_(0.5 * torch.randn(memory.criterion_logits.shape,
                                                        generator=torch.Generator().manual_seed(seed)))
    stream = clustered_stream(seed, 900, drift_at=450)
    memory.learn_(stream.x, stream.category, stream.action, skip=stream.skip)
    if memory.config.adaptive:  # half the categories score with their tracking prototypes, as after a mild change
        with torch.no_grad():
            memory.tracking_lead.copy_(torch.tensor([0.3, -0.2, 0.1, -0.4]))
    return memory


def slow_logits(memory, x, category):
    """The formula written out for one decision at a time: (B, A) logits, -inf where none scores."""
    config, state = memory.config, memory.state()
    estimates = rule.scoring_estimates(state, config)
    scoring = rule.scoring_mask(state.initialized, state.wins, config.slots.spawn_support)
    alpha = rule.attention(memory.criterion_logits.detach())
    if config.learning == "lvq":  # the metric, written out: attention x relevance / running variance
        relevance = torch.softmax(state.relevance_logits.double(), -1)
        variance = state.input_variances.double()
        if config.lvq.units == "memory":  # each criterion's over all the memory's decisions, every category alike
            variance = state.factor_variances.double().expand(variance.shape)
        if config.lvq.units == "category":  # one spread per category: its criteria's mean running variance
            variance = variance.mean(-1, keepdim=True)
        weight = alpha.double() * relevance / variance
        alpha = torch.where(variance > 1e-30, weight, 0.0)  # a criterion that has not varied weighs nothing
    out = torch.full((x.shape[0], len(memory.action_names)), float("-inf"))
    for b in range(x.shape[0]):
        c = int(category[b])
        for a in range(len(memory.action_names)):
            for p in range(config.slots.prototypes):
                if scoring[c, a, p]:
                    d = sum(float(alpha[c, k]) * (float(x[b, k]) - float(estimates[c, a, p, k])) ** 2
                            for k in range(x.shape[1]))
                    out[b, a] = max(float(out[b, a]), -d / config.rule.tau)
    return out


@pytest.mark.parametrize("name", JUDGMENT)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_scoring_path_agrees(name, seed):
    memory = trained(name, seed)
    if memory.config.adaptive:  # the streams are built to exercise the tracking prototypes too
        assert memory.promotion_log.step.numel() > 0
    probe = clustered_stream(seed + 10, 64)
    x, category = probe.x, probe.category
    expected = slow_logits(memory, x, category)
    with torch.no_grad():
        compiled = memory(x, category)
    torch.testing.assert_close(compiled.logits, expected, rtol=1e-4, atol=1e-4)
    logits = memory.criterion_logits
    differentiable = memory(x.clone().requires_grad_(), category)  # the torch path
    assert logits.requires_grad and differentiable.logits.requires_grad
    torch.testing.assert_close(differentiable.logits.detach(), expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(differentiable.action, compiled.action)
    for b in range(0, 64, 7):
        name_, confidence = memory.score_one(x[b].tolist(), int(category[b]))
        action = int(compiled.action[b])
        assert name_ == (None if action < 0 else memory.action_names[action])
        assert confidence == pytest.approx(float(compiled.confidence[b]), rel=1e-5, abs=1e-6)
    why = memory.explain(x, category)
    torch.testing.assert_close(-why.distance / memory.config.rule.tau, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(why.contributions.sum(-1).nan_to_num(float("inf")), why.distance, rtol=1e-5,
                               atol=1e-6)
    assert torch.equal(why.action, compiled.action)
    assert torch.equal(memory.nearest_prototype(x, category), why.nearest)


@pytest.mark.parametrize("name", JUDGMENT)
@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_the_engine_scores_with_the_same_formula(name, backend):
    memory = trained(name, 3)
    memory.backend = backend
    probe = clustered_stream(13, 40)
    expected = slow_logits(memory, probe.x[:1], probe.category[:1])
    step = memory.prequential_(probe.x[:1], probe.category[:1], probe.action[:1])  # scored before it learns
    torch.testing.assert_close(step.output.logits, expected, rtol=1e-4, atol=1e-4)
    attention = memory.attention_logits(step, probe.category[:1])  # from the step's squared differences
    torch.testing.assert_close(attention.detach(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tau", [10.0, 0.1, 0.003])
@pytest.mark.parametrize("options", [{}, {"prototypes": 3, "spawn_threshold": 0.2}, {"min_confidence": 0.6}])
def test_the_batched_softmax_is_the_online_loops_bit_for_bit(tau, options):
    """The batched kernel writes its softmax (and exp) out for speed; the online loop's
    ``output`` calls libm's. Given the batched logits, both give the same bits."""
    generator = torch.Generator().manual_seed(7)
    memory = JudgmentMemory(4, 5, 6, JudgmentConfig.seed(), tau=tau, **options)
    memory.learn_(torch.rand(300, 6, generator=generator), torch.randint(0, 4, (300,), generator=generator),
                  torch.randint(0, 5, (300,), generator=generator))
    x = torch.rand(2000, 6, generator=generator) * 3 - 1  # far from the prototypes too: weights underflow
    category = torch.randint(0, 4, (2000,), generator=generator)
    with torch.no_grad():
        batched = memory(x, category)
    logits = batched.logits.numpy()
    probs, action, confidence = np.empty_like(logits), np.empty(2000, np.int64), np.empty(2000, np.float32)
    for b in range(2000):
        finite = np.isfinite(logits[b])
        best = int(np.argmax(np.where(finite, logits[b], -np.inf))) if finite.any() else -1
        output(b, best, logits[b, best] if best >= 0 else np.float32(-np.inf), logits, probs, action, confidence,
               memory.config.rule.min_confidence)
    assert np.array_equal(batched.probs.numpy(), probs)
    assert np.array_equal(batched.action.numpy(), action) and np.array_equal(batched.confidence.numpy(), confidence)
    if tau < 0.01:  # logits hundreds apart: weights that underflow, and subnormal ones, were met
        assert (probs == 0).any() and ((probs > 0) & (probs < 1e-30)).any()


@pytest.mark.parametrize("name", ["judgment", "judgment_prototypes", "judgment_adaptive"])
def test_forward_into_out_writes_what_it_returns_otherwise(name):
    stream = clustered_stream(21, 600, drift_at=300)
    memory = MEMORY_FACTORIES[name]()
    memory.learn_(stream.x[:400], stream.category[:400], stream.action[:400])
    x, category = stream.x[400:], stream.category[400:]
    out = MemoryOutput(torch.empty(200, 4), torch.empty(200, 4), torch.empty(200, dtype=torch.int64),
                       torch.empty(200))
    with torch.no_grad():
        expected = memory(x, category)
        returned = memory(x, category, out=out)
    assert returned is out
    for a, b in zip(out, expected, strict=True):
        assert torch.equal(a, b)
    memory.double()  # the torch path writes into out too
    out64 = MemoryOutput(*(t.double() if t.is_floating_point() else t for t in out))
    with torch.no_grad():
        expected = memory(x, category)
        memory(x, category, out=out64)
    for a, b in zip(out64, expected, strict=True):
        assert torch.equal(a, b)


def test_forward_refuses_an_out_that_does_not_fit():
    memory = MEMORY_FACTORIES["judgment"]()
    x, category = torch.rand(5, 8), torch.zeros(5, dtype=torch.int64)
    good = MemoryOutput(torch.empty(5, 4), torch.empty(5, 4), torch.empty(5, dtype=torch.int64), torch.empty(5))
    with torch.no_grad():
        with pytest.raises(TypeError, match="out must be a MemoryOutput"):
            memory(x, category, out=(1, 2, 3, 4))
        with pytest.raises(ValueError, match=r"out.logits must be a torch.float32 tensor of shape \(5, 4\)"):
            memory(x, category, out=good._replace(logits=torch.empty(4, 4)))
        with pytest.raises(ValueError, match="out.action"):
            memory(x, category, out=good._replace(action=torch.empty(5)))
        with pytest.raises(ValueError, match="contiguous"):
            memory(x, category, out=good._replace(probs=torch.empty(4, 5).t()))
        with pytest.raises(ValueError, match="out.(probs|logits) overlaps out.(logits|probs)"):
            memory(x, category, out=good._replace(probs=good.logits))
        with pytest.raises(ValueError, match="out.confidence overlaps x"):
            shared = torch.rand(5, 8)
            memory(shared, category, out=good._replace(confidence=shared[0, :5]))
    with pytest.raises(ValueError, match="gradient"):  # the attention is a parameter: it needs one here
        memory(x, category, out=good)
