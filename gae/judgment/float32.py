"""The numbers every rule of the judgment memory computes in, and nothing else: a leaf module, so
that the judges (:mod:`gae.judgment.judges`), which the config validates, and the primitives,
which read the config, can share them without an import circle."""

from __future__ import annotations

import torch
from torch import Tensor

VARIANCE_FLOOR = 1e-6  # added to every running variance: a criterion that never varied weighs 1e6 / K, not inf


def _f32(value: float) -> Tensor:
    """``value`` as a float32 scalar tensor: the rules' arithmetic stays in float32."""
    return torch.tensor(value, dtype=torch.float32)
