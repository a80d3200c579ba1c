r"""The ``gauss`` judge in plain torch: class means with a running variance per action and
criterion, the geometry of Gaussian naive Bayes, with calibrated probabilities. Its compiled
mirror is :mod:`gae.judgment.kernels.judges.gauss`, function for function.

Per category :math:`c` and action :math:`a` it keeps a weight :math:`n_{c,a}`, a mean
:math:`m_{c,a}` and a variance :math:`v_{c,a}` per criterion; per category, the weight
:math:`N_c`, mean and variance :math:`g_c` of all its decisions. Learning a verified decision
``x`` of action ``a``::

    decay                 every weight of c (and N_c) is multiplied by 1 - rate_floor
    N_c += 1,  n_{c,a} += 1
    mean and variance     m += (x - m) / n,   v += ((x - m_old)(x - m) - v) / n   (Welford, weighted)

so with ``rate_floor = 0`` every statistic is the running one, and with ``rate_floor = r`` one of
about the last ``1 / r`` decisions (a short memory for fast drift). Scoring (the log-likelihood
of x under each action, plus its log prior)::

    s_{c,a,k} = max((n_{c,a} v_{c,a,k} + prior g_{c,k}) / (n_{c,a} + prior), SPREAD_FLOOR)
    score_a   = log(n_{c,a} / N_c) - K log(2 pi) / 2
                - sum_{k : g_{c,k} > VARIANCE_FLOOR} [ log(s_{c,a,k}) / 2 + (x_k - m_{c,a,k})^2 / (2 s_{c,a,k}) ]

The variances are shrunk toward the category's own (``prior`` pseudo-decisions of it), so an
action seen once is a spread-out cloud at its one decision, not a point. A criterion that has not
varied in the category (``g`` at most the floor) is left out: every action's mean is its one value,
so it would add the same to every score. Nothing is added to a variance, so the probabilities are
the same in any units: scaling a criterion by ``s`` adds ``log |s|`` to every action's score alike.
An action never taught in the category scores ``-inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gae import validation as check
from gae.judgment.float32 import SPREAD_FLOOR, VARIANCE_FLOOR, _f32
from gae.judgment.judges.weights import count, welford

BUFFERS = ("weights", "means", "variances", "total", "total_means", "total_variances")
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Options:
    """The ``gauss`` judge's options."""

    rate_floor: float = 0.0  # 0: every decision counts alike; r: the statistics of about the last 1 / r decisions
    prior: float = 1.0  # pseudo-decisions of the category's own variance in each action's (shrinkage)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_floor", check.check_real("rate_floor", self.rate_floor, low=0.0, high=1.0,
                                                                high_open=True))
        object.__setattr__(self, "prior", check.check_real("prior", self.prior, low=0.0, low_open=True))

    def params(self) -> tuple[float, ...]:
        """The options as the kernel reads them."""
        return (self.rate_floor, self.prior)


def buffers(n_categories: int, n_actions: int, n_factors: int, options: Options) -> dict[str, tuple]:
    """``name -> (shape, dtype)`` of the judge's state."""
    f32 = torch.float32
    return {"weights": ((n_categories, n_actions), f32), "means": ((n_categories, n_actions, n_factors), f32),
            "variances": ((n_categories, n_actions, n_factors), f32), "total": ((n_categories,), f32),
            "total_means": ((n_categories, n_factors), f32), "total_variances": ((n_categories, n_factors), f32)}


def log_scores(x: Tensor, category: Tensor, state: dict[str, Tensor], options: Options) -> Tensor:
    """(B, A) each action's score for (B, K) ``x`` in (B,) ``category`` (the module docstring's
    formula), ``-inf`` where the action was never taught; differentiable in ``x``."""
    weights = state["weights"][category]  # (B, A)
    total = state["total"][category]  # (B,)
    prior = _f32(options.prior)
    varied = (state["total_variances"][category] > VARIANCE_FLOOR)[:, None, :]  # (B, 1, K)
    spread = ((weights[..., None] * state["variances"][category] + prior * state["total_variances"][category][:, None])
              / (weights[..., None] + prior))  # (B, A, K)
    # a criterion left out: 1, so that no term (nor gradient) is NaN; and no spread is 0 (a tiny prior's underflow)
    spread = torch.where(varied, spread.clamp(min=SPREAD_FLOOR), 1.0)
    diff = x.to(torch.float32)[:, None, :] - state["means"][category]
    log_det = torch.where(varied, 0.5 * torch.log(spread), 0.0).sum(-1)
    quadratic = torch.where(varied, diff * diff / (2.0 * spread), 0.0).sum(-1)
    likelihood = -(_f32(HALF_LOG_2PI) * spread.shape[-1] + log_det + quadratic)
    taught = weights > 0
    log_prior = torch.log(torch.where(taught, weights, 1.0)) - torch.log(total.clamp(min=1e-30))[:, None]
    return torch.where(taught, likelihood + log_prior, float("-inf"))


def learn(x: Tensor, c: int, a: int, state: dict[str, Tensor], options: Options) -> None:
    """Learn one verified decision ``x`` of action ``a`` in category ``c``, in place (the module
    docstring's rule)."""
    weights, total = state["weights"], state["total"]
    fresh = count(weights, total, c, a, options.rate_floor)
    welford(total[c], state["total_means"][c], state["total_variances"][c], x)
    if fresh:  # a first decision (or one after its weight decayed to nothing): the mean is x
        state["means"][c, a] = x
        state["variances"][c, a] = 0.0
        return
    welford(weights[c, a], state["means"][c, a], state["variances"][c, a], x)
