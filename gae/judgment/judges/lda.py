r"""The ``lda`` judge in plain torch: class means under one covariance shared by the actions of a
category, shrunk toward its diagonal (streaming linear discriminant analysis). Its compiled mirror
is :mod:`gae.judgment.kernels.judges.lda`, function for function.

Per category :math:`c` it keeps each action's weight :math:`n_{c,a}` and mean :math:`m_{c,a}`,
the category's weight :math:`N_c`, the pooled within-action covariance :math:`S_c` and the
precision :math:`P_c` scoring uses. Learning a verified decision ``x`` of action ``a``::

    decay                 every weight of c (and N_c) is multiplied by 1 - rate_floor
    N_c += 1,  n_{c,a} += 1
    d = x - m_{c,a}       (before the update: 0 on the action's first decision)
    S_c += (d d^T - S_c) / N_c,     m_{c,a} += d / n_{c,a}
    refresh               every ``refresh`` decisions of c (and its first ``refresh``):
                          T_c = diag(S_c) + B_c, B_c the variance of the actions' means (weighted)
                          Sigma = (1 - shrinkage) S_c + shrinkage diag(S_c) + RIDGE diag(T_c)
                          P_c = Sigma^-1        (Cholesky, in float64)

over the criteria that have varied in the category (``T_c[k]``, the within-action variance plus
the variance between the actions' means, above ``VARIANCE_FLOOR``); a criterion that has not has no
row or column in the precision (its difference is the same to every action's mean). A criterion
constant within each action but not across them (a perfect separator) keeps its row: its ridge is
its total variance's. Shrinkage and ridge are each criterion's own variances, so scaling a criterion
by ``s`` scales its row and column of ``P_c`` by ``1 / s``: the scores are the same in any units.

Scoring (the log-likelihood under the shared covariance, less what all actions share, plus the
log prior)::

    score_a = log(n_{c,a} / N_c) - (x - m_{c,a})^T P_c (x - m_{c,a}) / 2

The precision is a cache of ``S_c``, refreshed on a fixed schedule: between refreshes the means
move and the covariance is the one of the last refresh, which costs O(K^3) per ``refresh``
decisions rather than per decision. An action never taught in the category scores ``-inf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gae import validation as check
from gae.judgment.float32 import VARIANCE_FLOOR
from gae.judgment.judges.weights import count

BUFFERS = ("weights", "means", "total", "decisions", "covariance", "precision")
RIDGE = 1e-3  # of each criterion's total variance, added to the diagonal: collinear criteria stay invertible


@dataclass(frozen=True)
class Options:
    """The ``lda`` judge's options."""

    shrinkage: float = 0.2  # weight of the diagonal in the covariance (0: the pooled covariance, 1: its diagonal)
    rate_floor: float = 0.0  # 0: every decision counts alike; r: the statistics of about the last 1 / r decisions
    refresh: int = 8  # decisions of a category between two computations of its precision

    def __post_init__(self) -> None:
        object.__setattr__(self, "shrinkage", check.check_real("shrinkage", self.shrinkage, low=0.0, high=1.0))
        object.__setattr__(self, "rate_floor", check.check_real("rate_floor", self.rate_floor, low=0.0, high=1.0,
                                                                high_open=True))
        object.__setattr__(self, "refresh", check.check_int("refresh", self.refresh, low=1))

    def params(self) -> tuple[float, ...]:
        """The options as the kernel reads them."""
        return (self.shrinkage, self.rate_floor, float(self.refresh))


def buffers(n_categories: int, n_actions: int, n_factors: int, options: Options) -> dict[str, tuple]:
    """``name -> (shape, dtype)`` of the judge's state."""
    f32 = torch.float32
    return {"weights": ((n_categories, n_actions), f32), "means": ((n_categories, n_actions, n_factors), f32),
            "total": ((n_categories,), f32), "decisions": ((n_categories,), torch.int64),
            "covariance": ((n_categories, n_factors, n_factors), f32),
            "precision": ((n_categories, n_factors, n_factors), f32)}


def log_scores(x: Tensor, category: Tensor, state: dict[str, Tensor], options: Options) -> Tensor:
    """(B, A) each action's score for (B, K) ``x`` in (B,) ``category`` (the module docstring's
    formula), ``-inf`` where the action was never taught; differentiable in ``x``."""
    weights, total = state["weights"][category], state["total"][category]  # (B, A), (B,)
    diff = x.to(torch.float32)[:, None, :] - state["means"][category]  # (B, A, K)
    quadratic = ((diff @ state["precision"][category]) * diff).sum(-1)  # (B, A)
    taught = weights > 0
    log_prior = torch.log(torch.where(taught, weights, 1.0)) - torch.log(total.clamp(min=1e-30))[:, None]
    return torch.where(taught, log_prior - 0.5 * quadratic, float("-inf"))


def between(means: Tensor, weights: Tensor) -> Tensor:
    """(K,) float64 the weighted variance of one category's (A, K) action means (weights (A,); the
    actions never taught left out), summed action by action in the kernel's order."""
    total = 0.0
    centre = torch.zeros(means.shape[1], dtype=torch.float64)
    for a in range(means.shape[0]):
        if float(weights[a]) > 0:
            total += float(weights[a])
            centre += float(weights[a]) * means[a].double()
    if total <= 0:
        return centre
    centre = centre / total
    spread = torch.zeros_like(centre)
    for a in range(means.shape[0]):
        if float(weights[a]) > 0:
            spread += float(weights[a]) * (means[a].double() - centre) ** 2
    return spread / total


def precision(covariance: Tensor, means: Tensor, weights: Tensor, options: Options) -> Tensor:
    """(K, K) the precision of one category's (K, K) pooled covariance, its actions' (A, K) means and
    (A,) weights (the module docstring's refresh), in float64, rounded to float32."""
    s = covariance.to(torch.float64)
    diagonal = torch.diagonal(s)
    total = diagonal + between(means, weights)
    varied = total > VARIANCE_FLOOR
    both = varied[:, None] & varied[None, :]
    sigma = torch.where(both, (1.0 - options.shrinkage) * s, 0.0)
    sigma = sigma + torch.diag(torch.where(varied, options.shrinkage * diagonal + RIDGE * total, 1.0))
    return torch.where(both, cholesky_inverse(sigma), 0.0).to(torch.float32)


def cholesky_inverse(sigma: Tensor) -> Tensor:
    r"""The inverse of a symmetric positive definite (K, K) float64 matrix through its Cholesky
    factor :math:`\Sigma = L L^T`: :math:`\Sigma^{-1} = L^{-T} L^{-1}`, written out in the order
    the kernel computes it."""
    n = sigma.shape[0]
    lower = torch.zeros_like(sigma)
    for i in range(n):
        for j in range(i + 1):
            total = sigma[i, j] - (lower[i, :j] * lower[j, :j]).sum()
            lower[i, j] = torch.sqrt(total) if i == j else total / lower[j, j]
    inverse_lower = torch.zeros_like(sigma)  # L^-1, lower triangular
    for i in range(n):
        inverse_lower[i, i] = 1.0 / lower[i, i]
        for j in range(i):
            inverse_lower[i, j] = -(lower[i, j:i] * inverse_lower[j:i, j]).sum() / lower[i, i]
    return inverse_lower.T @ inverse_lower


def learn(x: Tensor, c: int, a: int, state: dict[str, Tensor], options: Options) -> None:
    """Learn one verified decision ``x`` of action ``a`` in category ``c``, in place (the module
    docstring's rule)."""
    weights, total = state["weights"], state["total"]
    fresh = count(weights, total, c, a, options.rate_floor)
    state["decisions"][c] += 1
    if fresh:
        state["means"][c, a] = x
    delta = x - state["means"][c, a]
    state["covariance"][c] += (delta[:, None] * delta[None, :] - state["covariance"][c]) / total[c]
    state["means"][c, a] += delta / weights[c, a]
    seen = int(state["decisions"][c])
    if seen <= options.refresh or seen % options.refresh == 0:
        state["precision"][c] = precision(state["covariance"][c], state["means"][c], weights[c], options)
