"""Checkpoints an earlier gae wrote keep loading, and score and learn on as they did.

The fixtures in tests/data/checkpoints/ were written once by the commit named in each file
(``make_checkpoints.py`` there), on an x86-64 AMD EPYC: a memory in each mode learned a stream
with a label permutation, saved its ``state_dict``, scored a probe batch, then learned 100 more
decisions (the stream kept in tests/data/checkpoint_stream.pt) and undid the last 3. Loading the
state into today's memory (its layout migrated, see gae/judgment/state.py) must give

* the state the fixture recorded, bit for bit: it is data, loaded, not computed;
* scores within a float32 tolerance of the torch reference (``gae.judgment.rule.score``)
  computed here on the migrated state, and of the scores the fixture recorded, with the same
  actions. Not bit for bit: a float computed on one CPU is not a contract on another. The
  attention's ``exp`` is torch's vector kernel, whose last bits differ between AVX-512, AVX2,
  the default kernels and ARM, and the batched scoring kernel may reassociate its sums;
* the same state after the same further learning, bit for bit (see
  :func:`test_an_old_checkpoint_learns_on_as_it_did` for why that holds on any machine).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment import rule
from gae.types import MemoryOutput
from tests.data.checkpoints.make_checkpoints import stream

DATA = Path(__file__).resolve().parent / "data"
HERE = DATA / "checkpoints"
FIXTURES = sorted(path.stem for path in HERE.glob("*.pt"))
# Scores of one state on two machines, or by the batched kernel and by torch on one: logits of
# magnitude up to 22 differ here by 1.9e-6 at most (one float32 ulp at 16), 2.3e-7 relative;
# probabilities by 5e-7. rtol 1e-5 is some 40 times that, and far below the smallest margin
# between two actions' logits (0.013 in these fixtures), so it cannot hide a different decision.
SCORE_RTOL, SCORE_ATOL = 1e-5, 1e-6
LOGS = ("gate_log", "promotion_log", "recycle_log")


def loaded(name: str) -> tuple[JudgmentMemory, dict]:
    fixture = torch.load(HERE / f"{name}.pt", weights_only=True)
    memory = JudgmentMemory(["a", "b", "c", "d"], ["approve", "review", "reject"], 5, JudgmentConfig.seed(),
                            **fixture["options"])
    memory.load_state_dict(copy.deepcopy(fixture["state_dict"]))  # the fixture's own tensors stay as recorded
    return memory, fixture


def continued_stream() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 100 decisions each fixture learned after its save, as the writer drew them."""
    saved = torch.load(DATA / "checkpoint_stream.pt", weights_only=True)
    return saved["x"], saved["category"], saved["action"], saved["skip"]


def test_every_mode_has_a_fixture():
    # layout version 1 (no suffix) and version 2 (``_v2``: written by 1bf9be4, before learning='lvq')
    assert FIXTURES == ["adaptive", "adaptive_v2", "prototypes4", "prototypes4_v2", "seed", "seed_v2"]


def test_the_continued_stream_is_the_one_make_checkpoints_draws():
    # torch.randn's Box-Muller runs torch's vector log, sin and cos, whose last bits depend on the
    # CPU's kernels (up to 1.3e-6 apart on a N(0, 1) draw), hence the stream is kept as data; what
    # this machine draws is the same stream, the factors within 1e-6 (0.08 x that, 9e-8 here, 10x
    # margin), the rest exactly (randint and comparisons of uniform draws, which are exact)
    x, category, action, skip = continued_stream()
    drawn = stream(3, 100)
    for name, saved, here in zip(("category", "action", "skip"), (category, action, skip), drawn[1:], strict=True):
        assert torch.equal(saved, here), name
    torch.testing.assert_close(x, drawn[0], rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("name", FIXTURES)
def test_the_migrated_state_is_the_recorded_state(name):
    memory, fixture = loaded(name)
    recorded, state = fixture["state_dict"], memory.state_dict()
    for key, tensor in recorded.items():
        if key == "_extra_state":
            continue
        # version 1's one-prototype (C, A, ...) buffers gain their slot dimension, nothing else changes
        shapes = {tensor.shape, *((tensor.unsqueeze(2).shape,) if tensor.dim() >= 2 else ())}
        assert state[key].shape in shapes and torch.equal(state[key].reshape(tensor.shape), tensor), key
    for key in state.keys() - recorded.keys() - {"_extra_state"}:
        assert state[key].numel() == 0, key  # what the old layout lacked is a feature that is off here: empty
    old, new = recorded["_extra_state"], state["_extra_state"]
    for key in ("category_names", "action_names", "factor_names", "updates"):
        assert new[key] == old[key], key
    for log in LOGS:
        for field, tensor in old.get(log, {}).items():
            assert torch.equal(new[log][field], tensor), f"{log}.{field}"
    old_log, new_log = old["decision_log"], new["decision_log"]
    for field in ("call_sizes", "logits", "call_logits"):
        assert torch.equal(new_log[field], old_log[field]), field
    for field, tensor in old_log["columns"].items():
        assert torch.equal(new_log["columns"][field], tensor), field
    for key, tensor in old_log["base"].items():  # the state the log starts from, migrated alike
        assert torch.equal(new_log["base"][key].reshape(tensor.shape), tensor), f"base {key}"


@pytest.mark.parametrize("name", FIXTURES)
def test_an_old_checkpoint_scores_as_it_did(name):
    memory, fixture = loaded(name)
    x, category = fixture["probe"]["x"], fixture["probe"]["category"]
    with torch.no_grad():
        compiled = memory(x, category)
        reference = rule.score(x, category, memory.scoring_centroids(), memory.scoring_mask(), memory.metric(),
                               memory.config)[0]
    # forward's torch path (autograd) is the reference itself: exactly
    differentiable = memory(x.clone().requires_grad_(), category)
    assert all(torch.equal(got.detach(), want) for got, want in zip(differentiable, reference, strict=True))
    recorded = MemoryOutput(**fixture["expected"])
    for got, want in ((compiled, reference), (compiled, recorded), (reference, recorded)):
        assert torch.equal(got.action, want.action)
        for field in ("logits", "probs", "confidence"):
            torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=SCORE_RTOL, atol=SCORE_ATOL,
                                       msg=field)


@pytest.mark.parametrize("name", FIXTURES)
def test_an_old_checkpoint_learns_on_as_it_did(name):
    # Bit for bit on any machine: the online kernel is compiled without fast-math, so each step of
    # a prototype is one float32 subtract, multiply and add per factor of the stored stream and
    # state (exact IEEE operations, no fused multiply-add), and the gate compares the sqrt of a sum
    # taken in a fixed order. The CPU-dependent bits (the attention's exp) reach the state only
    # through comparisons (which action is recommended, whether the change test passes its
    # threshold), at least 0.006 from a tie on this stream: a flip would change a decision, not a
    # last bit. (Checked: equal under ATEN_CPU_CAPABILITY=default and =avx2, NUMBA_CPU_NAME=generic.)
    memory, fixture = loaded(name)
    x, category, action, skip = continued_stream()
    step = memory.prequential_(x, category, action, skip=skip)
    memory.undo_(3)  # the decision log travelled with the checkpoint
    continued = fixture["continued"]
    assert torch.equal(step.output.action, continued["action"])
    # the fixtures keep the layout they were written in: one prototype's buffers had no slot dimension
    assert torch.equal(memory.centroids.reshape(continued["centroids"].shape), continued["centroids"])
    assert torch.equal(memory.counts.reshape(continued["counts"].shape), continued["counts"])


def old_adaptive_state(layout: str) -> dict:
    """The adaptive fixture's state as an earlier design saved it: 'first' (034746f: shadows and
    the change test only) or 'accuracy' (f4d9d81..2e861dc: a per-category following flag and
    accuracies instead of the run means, following weights and tracking prototypes)."""
    state = copy.deepcopy(torch.load(HERE / "adaptive.pt", weights_only=True)["state_dict"])
    for name in ("following", "follow_weight", "run_centroids", "run_counts", "tracking_centroids", "tracking_lead"):
        del state[name]
    if layout == "accuracy":
        state["following"] = torch.tensor([True, False, False, True])
        state["category_accuracy"] = torch.full((4, 2), 0.5)
    return state


@pytest.mark.parametrize("layout", ["first", "accuracy"])
def test_the_earlier_adaptive_designs_migrate(layout):
    state = old_adaptive_state(layout)
    memory = JudgmentMemory(["a", "b", "c", "d"], ["approve", "review", "reject"], 5, config=JudgmentConfig.seed(),
                            drift_mode="adaptive")
    memory.load_state_dict(state)
    assert torch.equal(memory.centroids.squeeze(2), state["centroids"])
    assert torch.equal(memory.shadow_centroids.squeeze(2), state["shadow_centroids"])
    assert torch.equal(memory.promotion_statistic, state["promotion_statistic"])  # the change test carries on
    assert torch.equal(memory.tracking_centroids, memory.centroids) and not bool(memory.tracking_lead.any())
    assert not bool(memory.following.any()) and not bool(memory.run_counts.any())  # a follow-up in progress ends
    x, category, action, skip = stream(3, 100)
    memory.prequential_(x, category, action, skip=skip)  # and it learns on
    memory.undo_(3)


def test_a_partial_load_of_a_current_state_keeps_what_it_does_not_name():
    memory, _ = loaded("seed")
    counts, decisions = memory.counts.clone(), int(memory.num_decisions)
    fresh = torch.rand_like(memory.centroids)
    result = memory.load_state_dict({"centroids": fresh}, strict=False)
    assert torch.equal(memory.centroids, fresh)
    assert torch.equal(memory.counts, counts) and int(memory.num_decisions) == decisions
    assert "counts" in result.missing_keys and "num_decisions" in result.missing_keys
    memory.undo_(1)  # the log still covers the state
