"""The maths of the stream metrics as plain functions (see :mod:`training.metrics`).

An abstention (prediction ``-1``) is always wrong. Nothing here holds state; the checks at the
end are the metrics' boundary validation, shared by every metric class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def correctness(pred: Tensor, target: Tensor) -> Tensor:
    """(N,) bool: the prediction equals the target. An abstention (``pred == -1``) is wrong."""
    return (pred == target) & (pred >= 0)


def rolling_accuracy(correct: Tensor, window: int) -> Tensor:
    r"""(N,) accuracy over the last ``window`` decisions, at every decision of a stream.

    .. math:: r_i = \frac{1}{\min(i + 1, w)} \sum_{j = \max(0, i - w + 1)}^{i} \text{correct}_j

    Examples::

        >>> rolling_accuracy(torch.tensor([True, False, True, True]), window=2)
        tensor([1.0000, 0.5000, 0.5000, 1.0000])
    """
    _check_positive_int("window", window)
    if not isinstance(correct, Tensor) or correct.dim() != 1:
        got = tuple(correct.shape) if isinstance(correct, Tensor) else type(correct).__name__
        raise ValueError(f"correct must be a (N,) tensor, got {got}")
    hits = correct.to(torch.int64).cumsum(0)  # exact, unlike a float running sum
    lagged = torch.zeros_like(hits)
    lagged[window:] = hits[:-window]
    seen = torch.arange(1, correct.shape[0] + 1, device=correct.device).clamp(max=window)
    return (hits - lagged) / seen


def calibration_bins(confidence: Tensor, correct: Tensor, n_bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin ``(count int64, confidence sum float64, correct count int64)``, each ``(n_bins,)``.

    Bin ``i`` holds the confidences in ``[i / n_bins, (i + 1) / n_bins)``; the last bin is
    closed, so a confidence of exactly 1 falls in it.
    """
    inner_edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64, device=confidence.device)[1:-1]
    index = torch.bucketize(confidence.to(torch.float64), inner_edges, right=True)
    count = torch.bincount(index, minlength=n_bins)
    confidence_sum = torch.bincount(index, weights=confidence.to(torch.float64), minlength=n_bins)
    correct_sum = torch.bincount(index[correct], minlength=n_bins)
    return count, confidence_sum, correct_sum


def calibration_error(confidence: Tensor, correct: Tensor, n_bins: int = 15) -> Tensor:
    r"""Expected calibration error: :math:`\sum_b \frac{n_b}{N} |\bar c_b - \bar a_b|`, 0 when N = 0.

    :math:`\bar c_b` and :math:`\bar a_b` are the mean confidence and accuracy in bin ``b``
    (see :func:`calibration_bins`); the sum equals :math:`\frac{1}{N}\sum_b |C_b - A_b|` over
    the per-bin sums, which is how it is computed.

    Examples::

        >>> calibration_error(torch.tensor([0.9, 0.9, 0.2, 0.0]), torch.tensor([True, False, False, False]), 10)
        tensor(0.2500)
    """
    _check_positive_int("n_bins", n_bins)
    return _ece_from_bins(*calibration_bins(confidence, correct, n_bins))


def mean_distance(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """Mean L2 distance ``||a - b||`` over the last dimension, over the entries where ``mask``; 0 if none."""
    distance = torch.linalg.vector_norm((a - b).to(torch.float64), dim=-1)
    return (distance.where(mask, 0).sum() / mask.sum().clamp(min=1)).to(torch.get_default_dtype())


def _ece_from_bins(count: Tensor, confidence_sum: Tensor, correct_sum: Tensor) -> Tensor:
    total = count.sum().clamp(min=1)
    return ((confidence_sum - correct_sum).abs().sum() / total).to(torch.get_default_dtype())


def _rate(part: Tensor, whole: Tensor) -> Tensor:
    return part / whole.clamp(min=1)


# -- validation at the public boundary -------------------------------------------------------


def _check_vector(argument: str, value: Any, kind: str, length: int | None = None) -> None:
    """A non-empty 1-D tensor of ``kind`` ('integer', 'floating' or 'bool'), of ``length`` if given."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor of shape (B,), got {type(value).__name__}")
    dtype_ok = {"integer": not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool),
                "floating": value.is_floating_point(), "bool": value.dtype == torch.bool}[kind]
    if not dtype_ok:
        raise TypeError(f"{argument} must be a {kind} tensor, got dtype {value.dtype}")
    if value.dim() != 1:
        raise ValueError(f"{argument} must have shape (B,), got {tuple(value.shape)}")
    if value.shape[0] == 0:
        raise ValueError(f"{argument} is an empty batch (shape {tuple(value.shape)}); pass at least one decision")
    if length is not None and value.shape[0] != length:
        raise ValueError(f"{argument} must have shape ({length},) like the first argument, got {tuple(value.shape)}")


def _check_predictions(pred: Tensor, target: Tensor | None = None, confidence: Tensor | None = None) -> None:
    _check_vector("pred", pred, "integer")
    if bool((pred < -1).any()):
        raise ValueError(f"pred must hold action indices or -1 (abstain), got {int(pred.min())}")
    if target is not None:
        _check_vector("target", target, "integer", pred.shape[0])
        if bool((target < 0).any()):
            raise ValueError(f"target must hold action indices >= 0, got {int(target.min())}")
    if confidence is not None:
        _check_vector("confidence", confidence, "floating", pred.shape[0])
        outside = ~((confidence >= 0) & (confidence <= 1))  # NaN is outside too
        if bool(outside.any()):
            where = int(outside.nonzero()[0, 0])
            raise ValueError(f"confidence must be in [0, 1], got {float(confidence[where])} at [{where}]")


def _check_positive_int(argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{argument} must be >= 1, got {value}")
    return value
