r"""Trust: the memory's answer as the mixture of its judges' votes, each weighted by how well it
has judged lately in the category (fixed share over the prequential log-loss). Plain torch, the
reference of :mod:`gae.judgment.kernels.trust`, function for function.

Judge :math:`j`'s vote :math:`p_j` is the softmax of its scores over the actions it scores
(:func:`votes`; the prototypes' vote is their probabilities), all zero while it has no opinion in
the category. With trust weights :math:`w_{c,j}` (uniform before the category's first decision)::

    mixture     p = sum_j w_j p_j / sum_j w_j      over the judges with an opinion
    learning    loss_j = -log max(p_j(a), trust_floor)          (a judge without an opinion: 1 / A)
                w_j   <- w_j exp(-trust_rate (loss_j - min_j loss_j)),  normalised
                w_j   <- (1 - trust_share) w_j + trust_share / J         (fixed share)

The exponential weights are Bayes' rule over the judges at learning rate ``trust_rate``; the
share keeps every weight at least ``trust_share / J``, so a judge that fell behind comes back
within a few dozen decisions once it judges better (after a drift), Herbster and Warmuth's
fixed share. ``trust_floor`` caps the loss of one confident mistake at ``-log trust_floor``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gae.judgment.float32 import _f32
from gae.types import MemoryOutput


def votes(scores: Tensor) -> Tensor:
    """(..., A) probabilities: the softmax of (..., A) scores over their finite entries, all zero
    where none is finite (no opinion)."""
    finite = torch.isfinite(scores)
    known = finite.any(-1, keepdim=True)
    safe = torch.where(finite, scores, scores.new_tensor(-torch.inf)).masked_fill(~known, 0.0)
    top = safe.amax(-1, keepdim=True)
    weights = torch.where(finite, (safe - top).exp(), 0.0)
    return torch.where(known, weights / weights.sum(-1, keepdim=True).clamp(min=1e-38), 0.0)


def weights_of(trust: Tensor) -> Tensor:
    """(..., J) the trust weights in force: a row that never learned (all zero) is uniform."""
    untouched = (trust == 0).all(-1, keepdim=True)
    return torch.where(untouched, _f32(1.0) / trust.shape[-1], trust)


def mixture(vote: Tensor, weights: Tensor) -> Tensor:
    """(B, A) the mixture of (B, J, A) votes under (B, J) weights (:func:`weights_of`), over the
    judges with an opinion; all zero where none has one."""
    opinion = vote.sum(-1) > 0  # (B, J)
    w = torch.where(opinion, weights, 0.0)
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, (w[..., None] * vote).sum(-2) / total.clamp(min=1e-38), 0.0)


def output(probs: Tensor, min_confidence: float) -> MemoryOutput:
    """The :class:`MemoryOutput` of (B, A) mixture probabilities: logits ``log p`` (``-inf``
    where p = 0), the first most probable action, abstaining (-1, confidence 0) where no judge
    has an opinion or the best probability is below ``min_confidence``."""
    known = (probs > 0).any(-1)
    action = probs.argmax(-1)  # the first maximum
    confidence = probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    abstain = ~known | (confidence.detach().double() < min_confidence)
    logits = torch.where(probs > 0, probs.clamp(min=1e-38).log(), float("-inf"))
    return MemoryOutput(logits, probs, action.masked_fill(abstain, -1), confidence.masked_fill(abstain, 0.0))


def trust_step(vote: Tensor, c: int, a: int, trust: Tensor, rate: float, share: float, floor: float) -> None:
    """One fixed-share step of category ``c``'s (J,) trust row after a decision verified as ``a``,
    from the judges' (J, A) votes before learning it, in place (the module docstring's rule).
    Nothing changes while no judge has an opinion."""
    opinion = vote.sum(-1) > 0
    if not bool(opinion.any()):
        return
    n_judges, n_actions = vote.shape
    probability = torch.where(opinion, vote[:, a], _f32(1.0) / n_actions)
    loss = -torch.log(torch.maximum(probability, _f32(floor)))
    w = weights_of(trust[c]) * torch.exp(-_f32(rate) * (loss - loss.min()))
    w = w / w.sum()
    trust[c] = (_f32(1.0) - _f32(share)) * w + _f32(share) / n_judges
