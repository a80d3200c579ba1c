r"""The ``bins`` judge in plain torch: per criterion and action, a histogram of the verified decisions
over bins of the criterion's own spread, the geometry of a non-parametric naive Bayes, which follows
rules on single criteria (a threshold, a band, a value of a nominal criterion) that class means and
prototypes blur. Its compiled mirror is :mod:`gae.judgment.kernels.judges.bins`, function for function.

Per category :math:`c` it keeps the weight :math:`N_c`, mean :math:`m_{c,k}` and variance
:math:`v_{c,k}` of all its decisions per criterion, and per action :math:`a` a weight
:math:`n_{c,a}` and a histogram :math:`h_{c,a,k,\cdot}` of ``bins`` bins per criterion. Criterion
``k``'s bins cut ``m ± reach sqrt(v)`` into ``bins`` equal parts, the end bins open::

    z        = (x_k - m_{c,k}) / sqrt(v_{c,k})        (the square root in float64, rounded to float32)
    bin_k    = clamp(floor((z + reach) bins / (2 reach)), 0, bins - 1)     (bins // 2 while v <= floor)

Learning a verified decision ``x`` of action ``a``::

    decay                 every weight and histogram of c (and N_c) is multiplied by 1 - rate_floor
    N_c += 1,  n_{c,a} += 1,  m, v take x (Welford, weighted)
    h_{c,a,k,bin_k} += 1  for every criterion, its bin under the updated m and v

Scoring (each criterion's bin probability, smoothed by ``prior`` pseudo-decisions per bin)::

    score_a = log(n_{c,a} / N_c)
              + sum_{k : v_{c,k} > VARIANCE_FLOOR} log((h_{c,a,k,bin_k} + prior) / (n_{c,a} + prior bins))

A criterion that has not varied in the category (``v`` at most the floor) is left out of the
scores, as every judge leaves it out: its decisions all sit in one bin, which would only add each
action's share of pseudo-decisions to its score.

The bins are in units of each criterion's spread, so the scores are the same in any units. While
the mean and variance settle, a decision's bin is the one of the statistics at the time: in a
stream whose criteria keep their distribution the early decisions' share fades, and a short memory
(``rate_floor``) forgets them. An action never taught in the category scores ``-inf``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from gae import validation as check
from gae.judgment.float32 import VARIANCE_FLOOR, _f32
from gae.judgment.judges.weights import count, welford

BUFFERS = ("weights", "total", "total_means", "total_variances", "counts")
MAX_BINS = 256  # a histogram per category, action and criterion: the state grows with the bins


@dataclass(frozen=True)
class Options:
    """The ``bins`` judge's options."""

    bins: int = 16  # bins per criterion over mean +- reach standard deviations (the end bins open)
    reach: float = 2.0  # standard deviations on each side of the mean the bins cover
    prior: float = 0.5  # pseudo-decisions per bin: the smoothing of each histogram
    rate_floor: float = 0.0  # 0: every decision counts alike; r: the histograms of about the last 1 / r decisions

    def __post_init__(self) -> None:
        object.__setattr__(self, "bins", check.check_int("bins", self.bins, low=2))
        if self.bins > MAX_BINS:
            raise ValueError(f"bins must be at most {MAX_BINS}, got {self.bins!r}")
        # bins / (2 reach) stays a finite float32, and prior x bins next to a count
        object.__setattr__(self, "reach", check.check_real("reach", self.reach, low=1e-3, high=1e3))
        object.__setattr__(self, "prior", check.check_real("prior", self.prior, low=1e-6, high=1e6))
        object.__setattr__(self, "rate_floor", check.check_real("rate_floor", self.rate_floor, low=0.0, high=1.0,
                                                                high_open=True))

    def params(self) -> tuple[float, ...]:
        """The options as the kernel reads them."""
        return (float(self.bins), self.reach, self.prior, self.rate_floor)


def buffers(n_categories: int, n_actions: int, n_factors: int, options: Options) -> dict[str, tuple]:
    """``name -> (shape, dtype)`` of the judge's state."""
    f32 = torch.float32
    return {"weights": ((n_categories, n_actions), f32), "total": ((n_categories,), f32),
            "total_means": ((n_categories, n_factors), f32), "total_variances": ((n_categories, n_factors), f32),
            "counts": ((n_categories, n_actions, n_factors, options.bins), f32)}


def bin_of(x: Tensor, means: Tensor, variances: Tensor, options: Options) -> Tensor:
    """(..., K) int64 the bin of each criterion of ``x`` under its category's (..., K) running
    ``means`` and ``variances`` (the module docstring's formula), in float32."""
    x = x.to(torch.float32)
    varied = variances > VARIANCE_FLOOR
    z = (x - means) / torch.sqrt(torch.where(varied, variances, 1.0).double()).float()
    position = torch.floor((z + _f32(options.reach)) * _f32(options.bins / (2.0 * options.reach)))
    position = torch.where(position >= 0, position, 0.0).clamp(max=options.bins - 1)  # (NaN: the first bin)
    return torch.where(varied, position, float(options.bins // 2)).to(torch.int64)


def edges(b: Tensor, means: Tensor, variances: Tensor, options: Options) -> tuple[Tensor, Tensor]:
    """The ``(low, high)`` values in the user's units of bins ``b`` (..., K) under ``means`` and
    ``variances`` (..., K): ``-inf`` and ``inf`` for the open end bins (float64)."""
    std = torch.sqrt(variances.double())
    width = 2.0 * options.reach / options.bins
    low = means.double() + (b.double() * width - options.reach) * std
    high = low + width * std
    low = torch.where(b == 0, float("-inf"), low)
    high = torch.where(b == options.bins - 1, float("inf"), high)
    return low, high


def log_likelihoods(x: Tensor, category: Tensor, state: dict[str, Tensor], options: Options) -> Tensor:
    """(B, A, K) each criterion's smoothed log-probability of ``x``'s bin under each action; 0 for a
    criterion that has not varied in the category (left out)."""
    weights = state["weights"][category]  # (B, A)
    b = bin_of(x, state["total_means"][category], state["total_variances"][category], options)  # (B, K)
    counts = state["counts"][category]  # (B, A, K, bins)
    index = b[:, None, :, None].expand(-1, counts.shape[1], -1, 1)
    hits = counts.gather(-1, index).squeeze(-1)  # (B, A, K)
    prior = _f32(options.prior)
    varied = (state["total_variances"][category] > VARIANCE_FLOOR)[:, None, :]  # (B, 1, K)
    ll = torch.log(hits + prior) - torch.log(weights + prior * _f32(float(options.bins)))[..., None]
    return torch.where(varied, ll, 0.0)


def log_scores(x: Tensor, category: Tensor, state: dict[str, Tensor], options: Options) -> Tensor:
    """(B, A) each action's score for (B, K) ``x`` in (B,) ``category`` (the module docstring's
    formula), ``-inf`` where the action was never taught. Piecewise constant in ``x``: no gradient."""
    weights, total = state["weights"][category], state["total"][category]  # (B, A), (B,)
    likelihood = log_likelihoods(x.detach(), category, state, options).sum(-1)
    taught = weights > 0
    log_prior = torch.log(torch.where(taught, weights, 1.0)) - torch.log(total.clamp(min=1e-30))[:, None]
    return torch.where(taught, likelihood + log_prior, float("-inf"))


def learn(x: Tensor, c: int, a: int, state: dict[str, Tensor], options: Options) -> None:
    """Learn one verified decision ``x`` of action ``a`` in category ``c``, in place (the module
    docstring's rule)."""
    weights, total, counts = state["weights"], state["total"], state["counts"]
    count(weights, total, c, a, options.rate_floor)
    if options.rate_floor > 0:
        counts[c] *= _f32(1.0) - _f32(options.rate_floor)
    x = x.to(torch.float32)
    welford(total[c], state["total_means"][c], state["total_variances"][c], x)
    b = bin_of(x, state["total_means"][c], state["total_variances"][c], options)  # (K,)
    counts[c, a, torch.arange(x.shape[0]), b] += 1.0


class Evidence(NamedTuple):
    """One criterion's part in a ``bins`` judge's answer: ``x``'s value of ``factor`` (an index)
    lies in the bin ``[low, high)`` (in the user's units; ``-inf`` / ``inf`` for the open end
    bins), whose histograms favour ``action`` over ``rival`` (indices) by ``nats`` (the difference
    of their log-probabilities of that bin)."""

    factor: int
    low: float
    high: float
    action: int
    rival: int
    nats: float


def evidence(x: Tensor, category: Tensor, state: dict[str, Tensor], options: Options,
             top: int = 3) -> list[list[Evidence]]:
    """Per decision of (B, K) ``x`` in (B,) ``category``: the (at most ``top``) criteria whose bins
    favour the judge's own answer most over its runner-up, most first (none where the judge has
    fewer than two actions to compare): the thresholds that decided."""
    scores = log_scores(x, category, state, options)  # (B, A)
    ll = log_likelihoods(x.detach(), category, state, options)  # (B, A, K)
    b = bin_of(x.detach(), state["total_means"][category], state["total_variances"][category], options)
    low, high = edges(b, state["total_means"][category], state["total_variances"][category], options)
    out: list[list[Evidence]] = []
    for i in range(x.shape[0]):
        finite = torch.isfinite(scores[i])
        if int(finite.sum()) < 2:
            out.append([])
            continue
        ranked = scores[i].masked_fill(~finite, float("-inf")).argsort(descending=True, stable=True)
        a, r = int(ranked[0]), int(ranked[1])
        nats = ll[i, a] - ll[i, r]
        order = nats.argsort(descending=True, stable=True)[:top]
        out.append([Evidence(int(k), float(low[i, k]), float(high[i, k]), a, r, float(nats[k]))
                    for k in order if float(nats[k]) > 0])
    return out
