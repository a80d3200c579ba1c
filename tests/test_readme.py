"""The README's Python examples run as written, in order, as a reader runs them one after another
(a block may go on from the one before it, as the Decider's goes on from the memory's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    namespace: dict = {}
    for before in range(index):  # what the reader ran first
        exec(compile(BLOCKS[before], f"README.md block {before}", "exec"), namespace)
    namespace.pop("train_step", None)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), namespace)
    if "train_step" in namespace:
        import torch

        raw, category, action = torch.rand(16, 32), torch.randint(0, 2, (16,)), torch.randint(0, 3, (16,))
        namespace["memory"].learn_(namespace["encoder"](raw).detach(), category, action)
        namespace["train_step"](raw, category, action)
