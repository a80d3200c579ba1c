"""The numbers every rule of the judgment memory computes in, and nothing else: a leaf module, so
that the judges (:mod:`gae.judgment.judges`), which the config validates, and the primitives,
which read the config, can share them without an import circle."""

from __future__ import annotations

import torch
from torch import Tensor

# A running variance at or below this is a criterion that has not varied, to float32's precision: it weighs
# nothing in a distance (its spread is inf) rather than a floor's worth. Nothing is added to a variance that is
# above it, so a distance in units of each criterion's spread is the same in any units (docs/inputs.md).
VARIANCE_FLOOR = 1e-30
# the smallest normal float32: a spread a judge divides by is held at least this, so no division is by 0
SPREAD_FLOOR = float(torch.finfo(torch.float32).tiny)


def _f32(value: float) -> Tensor:
    """``value`` as a float32 scalar tensor: the rules' arithmetic stays in float32."""
    return torch.tensor(value, dtype=torch.float32)
