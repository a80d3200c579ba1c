"""Write the checkpoint fixtures of tests/test_checkpoint_migration.py.

Run once by the gae that wrote them (the commit named in each file's ``written_by``), never
again: the point of the fixtures is that a later gae keeps loading what an earlier one saved.

    python tests/data/checkpoints/make_checkpoints.py COMMIT

The fixtures were written on an x86-64 AMD EPYC. ``stream`` draws its factors with
``torch.randn``, whose last bits depend on the CPU's vector kernels (AVX2 and AVX-512 draw the
writer's bits, the default kernels and ARM others), so the 100 decisions learned after the save
are kept as data in tests/data/checkpoint_stream.pt, and the test reads them from there.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from gae import JudgmentConfig, JudgmentMemory  # noqa: E402

MODES = {"seed": {}, "adaptive": {"drift_mode": "adaptive"}, "prototypes4": {"prototypes": 4}}


def stream(seed: int, n: int):
    """Four categories, three actions, five factors; a label permutation half-way (promotions,
    gate events, spawns and recycles all happen)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.rand(4, 3, 5, generator=gen)
    category = torch.randint(0, 4, (n,), generator=gen)
    action = torch.randint(0, 3, (n,), generator=gen)
    drifted = torch.where(torch.arange(n) >= n // 2, (action + 1) % 3, action)
    x = (centres[category, drifted] + 0.08 * torch.randn(n, 5, generator=gen)).clamp(0, 1)
    skip = torch.rand(n, generator=gen) < 0.05
    return x, category, action, skip


def main(commit: str) -> None:
    x, category, action, skip = stream(0, 600)
    probe_x, probe_category, _, _ = stream(1, 64)
    for name, options in MODES.items():
        memory = JudgmentMemory(["a", "b", "c", "d"], ["approve", "review", "reject"], 5, JudgmentConfig.seed(), **options)
        with torch.no_grad():
            memory.criterion_logits.copy_(0.3 * torch.randn(4, 5, generator=torch.Generator().manual_seed(2)))
        for start in range(0, 600, 50):
            memory.learn_(x[start:start + 50], category[start:start + 50], action[start:start + 50],
                          skip=skip[start:start + 50])
        state = copy.deepcopy(memory.state_dict())  # state_dict holds the live tensors
        with torch.no_grad():
            out = memory(probe_x, probe_category)
        more = stream(3, 100)
        step = memory.prequential_(more[0], more[1], more[2], skip=more[3])  # learning goes on from the state
        memory.undo_(3)
        torch.save({"written_by": commit, "options": options, "state_dict": state,
                    "probe": {"x": probe_x, "category": probe_category}, "expected": out._asdict(),
                    "continued": {"action": step.output.action, "centroids": memory.centroids.clone(),
                                  "counts": memory.counts.clone()}}, HERE / f"{name}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
