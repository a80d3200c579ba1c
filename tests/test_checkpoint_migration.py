"""Checkpoints an earlier gae wrote keep loading, and score and learn on as they did.

The fixtures in tests/data/checkpoints/ were written once by the commit named in each file
(``make_checkpoints.py`` there): a memory in each mode learned a stream with a label
permutation, saved its ``state_dict``, scored a probe batch, then learned 100 more decisions and
undid the last 3. Loading the state into today's memory (its layout migrated, see
gae/judgment/state.py) must give the same scores, and the same state after the same further
learning, bit for bit.
"""

from __future__ import annotations

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
    assert FIXTURES == ["adaptive", "prototypes4", "seed"]


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
