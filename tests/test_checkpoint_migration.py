"""Checkpoints an earlier gae wrote keep loading, and score and learn on as they did.

The fixtures in tests/data/checkpoints/ were written once by the commit named in each file
(``make_checkpoints.py`` there): a memory in each mode learned a stream with a label
permutation, saved its ``state_dict``, scored a probe batch, then learned 100 more decisions and
undid the last 3. Loading the state into today's memory (its layout migrated, see
gae/judgment/state.py) must give the same scores, and the same state after the same further
learning, bit for bit.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from gae import JudgmentMemory
from tests.data.checkpoints.make_checkpoints import stream

HERE = Path(__file__).resolve().parent / "data" / "checkpoints"
FIXTURES = sorted(path.stem for path in HERE.glob("*.pt"))


def loaded(name: str) -> tuple[JudgmentMemory, dict]:
    fixture = torch.load(HERE / f"{name}.pt", weights_only=True)
    memory = JudgmentMemory(["a", "b", "c", "d"], ["approve", "review", "reject"], 5, **fixture["options"])
    memory.load_state_dict(fixture["state_dict"])
    return memory, fixture


def test_every_mode_has_a_fixture():
    # layout version 1 (no suffix) and version 2 (``_v2``: written by 1bf9be4, before learning='lvq')
    assert FIXTURES == ["adaptive", "adaptive_v2", "prototypes4", "prototypes4_v2", "seed", "seed_v2"]


@pytest.mark.parametrize("name", FIXTURES)
def test_an_old_checkpoint_scores_as_it_did(name):
    memory, fixture = loaded(name)
    with torch.no_grad():
        out = memory(fixture["probe"]["x"], fixture["probe"]["category"])
    for field, expected in fixture["expected"].items():
        assert torch.equal(getattr(out, field), expected), field


@pytest.mark.parametrize("name", FIXTURES)
def test_an_old_checkpoint_learns_on_as_it_did(name):
    memory, fixture = loaded(name)
    x, category, action, skip = stream(3, 100)
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
    memory = JudgmentMemory(["a", "b", "c", "d"], ["approve", "review", "reject"], 5, drift_mode="adaptive")
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
