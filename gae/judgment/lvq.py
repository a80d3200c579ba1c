r"""``learning='lvq'`` in plain torch: the reference the compiled kernel
(:mod:`gae.judgment.kernels.lvq`) is held equal to, function for function.

``learning='lvq'`` (:func:`lvq_step`) replaces the gated rule by learning vector quantization in
the data's own units: the distance weighs each criterion by the attention, a learned relevance
and the inverse of the category's running spread (:func:`gae.judgment.primitives.metric`, also
:func:`gae.judgment.rule.metric`)::

    w_c       = alpha_c * softmax(relevance_logits_c) / variance_c      (0 where variance_c <= VARIANCE_FLOOR)
    observe                 category c's running mean and variance take x (Welford), and the memory's
                            over all categories (units='memory' measures in these)
    e_c      += error_decay (wrong - e_c)        the category's recent error rate (recent_errors)
    floor     = max(rate_floor, rate_per_error e_c)
    p, d      = the nearest prototype in use of (c, a) under w_c
    relevance_step          GRLVQ: the relevances move to separate p from the best rival action's slot
    miss                    the prototypes of other actions nearer than p lose miss_penalty of their wins
    wrong and d > spawn_threshold -> spawn_slot; mu = x                                    (P > 1)
    else      mu_{c,a,p} += max(1 / (counts + 1), floor) (x - mu_{c,a,p})
    wrong     -> the recommended action's slot q: mu_q -= push_rate max(1 / (counts_q + 1), floor) (x - mu_q)

where *wrong* means the memory's own recommendation was not the verified action.

It builds on :mod:`gae.judgment.primitives` (the distance, the units, the slot operations) and
:mod:`gae.judgment.rule`'s loop calls :func:`lvq_step`: the imports point one way.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gae.judgment.config import JudgmentConfig
from gae.judgment.primitives import (
    _f32,
    credit,
    metric,
    push_away,
    relevances,
    spread,
    start_prototype,
    step_toward,
    take_slot,
    unit_variances,
    weighted,
)
from gae.judgment.state import JudgmentState

# the smallest normal float32: below it a square of distances has lost its precision (or is 0)
TINY = float(torch.finfo(torch.float32).tiny)


def observe(x: Tensor, c: int, counts: Tensor, means: Tensor, variances: Tensor) -> None:
    r"""Row ``c``'s running mean and (population) variance take ``x``, in place (Welford):
    :math:`n \leftarrow n + 1`, :math:`\delta = x - m`, :math:`m \leftarrow m + \delta / n`,
    :math:`v \leftarrow v + (\delta (x - m) - v) / n`: category ``c``'s (``input_*``), and row 0 of
    the memory's over all categories (``factor_*``)."""
    counts[c] += 1
    n = counts[c].to(torch.float32)
    delta = x - means[c]
    means[c] += delta / n
    variances[c] += (delta * (x - means[c]) - variances[c]) / n


def miss(x: Tensor, c: int, a: int, weights: Tensor, state: JudgmentState, config: JudgmentConfig) -> None:
    """The support of category ``c``'s prototypes, in place: every prototype in use of another
    action that lies nearer to ``x`` under the metric than the verified action ``a``'s nearest
    (scoring or not) loses ``miss_penalty`` of its wins (GLVQ's misclassification condition,
    prototype by prototype). A prototype spawned by a noisy label inside another action's region,
    or left where the labels changed, so loses its support. Nothing happens before ``a`` has a
    prototype."""
    own_slots = state.initialized[c, a]
    if not bool(own_slots.any()):
        return
    lengths = weighted((x - state.centroids[c]) ** 2, weights[None].expand(state.centroids.shape[1], -1))
    own = lengths[a][own_slots].min()
    nearer = state.initialized[c] & (lengths < own)
    nearer[a] = False
    state.wins[c][nearer] *= _f32(1.0) - _f32(config.lvq.miss_penalty)


def lvq_rate(count: Tensor, floor: Tensor) -> Tensor:
    """The step size of a prototype with ``count`` updates: ``max(1 / (count + 1), floor)``,
    the running mean of its decisions until the rate reaches the floor, then tracking."""
    return torch.maximum(_f32(1.0) / (count.to(torch.float32) + _f32(1.0)), floor)


def rate_floor(c: int, wrong: bool, state: JudgmentState, config: JudgmentConfig) -> Tensor:
    """Category ``c``'s recent error rate takes one decision, in place (``e += error_decay (wrong -
    e)``, ``wrong`` whether the prototypes' own recommendation missed), and the floor of its
    prototypes' step sizes: ``max(rate_floor, rate_per_error e)``, so a category that keeps erring
    forgets faster, down to ``rate_floor`` again once it judges well."""
    errors = state.recent_errors
    errors[c] += _f32(config.lvq.error_decay) * (_f32(float(wrong)) - errors[c])
    return torch.maximum(_f32(config.lvq.rate_floor), _f32(config.lvq.rate_per_error) * errors[c])


def relevance_step(x: Tensor, c: int, a: int, p: int, r: int, q: int, alpha: Tensor, state: JudgmentState,
                   config: JudgmentConfig) -> None:
    r"""One GRLVQ step of category ``c``'s relevance logits, in place, separating the verified
    action's prototype :math:`\mu_J = \mu_{c,a,p}` from the rival's :math:`\mu_K = \mu_{c,r,q}`.

    With :math:`g_k = \alpha_k (x_k - \mu_k)^2 / (v_k + \epsilon)`, :math:`d = \sum_k \lambda_k g_k`
    and the relative distance :math:`\rho = (d_J - d_K) / (d_J + d_K)`:

    .. math::
        \partial\rho / \partial\lambda_k = 2\,(d_K g_{J,k} - d_J g_{K,k}) / (d_J + d_K)^2, \qquad
        \ell_k \leftarrow \ell_k - \epsilon_\lambda\,\lambda_k\,\partial\rho / \partial\lambda_k

    (the chain rule through the softmax, whose other term vanishes since
    :math:`\sum_k \lambda_k \partial\rho / \partial\lambda_k = 0`). Nothing moves when both
    distances are 0, or when their sum is beyond float32.

    Each step :math:`\lambda_k \partial\rho / \partial\lambda_k` lies in :math:`[-2, 2]`, since
    :math:`\lambda_k g_{J,k} \le d_J`; but in float32 the formula's :math:`(d_J + d_K)^2`
    underflows to 0 for distances below about 1e-19 (a category whose spread one huge value made
    vast) and overflows past 1e19, and :math:`d_K g_{J,k}` may overflow. Where the square is not a
    normal float32 (:data:`TINY`) or the gradient not finite, the same step is taken rescaled, every
    factor in :math:`[0, 1]`: :math:`2\,((d_K / s)(\lambda_k g_{J,k} / s) - (d_J / s)(\lambda_k
    g_{K,k} / s))` with :math:`s = d_J + d_K`. Elsewhere (every ordinary decision) it is the
    formula above, bit for bit as before."""
    lam = relevances(state.relevance_logits[c])
    scale = alpha[c] / spread(unit_variances(state, config)[c], config)
    g_own = scale * (x - state.centroids[c, a, p]) ** 2
    g_rival = scale * (x - state.centroids[c, r, q]) ** 2
    d_own, d_rival = (lam * g_own).sum(), (lam * g_rival).sum()
    total = d_own + d_rival
    if not 0.0 < float(total) < math.inf:  # (NaN fails too)
        return
    square = total * total
    gradient = _f32(2.0) * (d_rival * g_own - d_own * g_rival) / square
    if TINY <= float(square) < math.inf and bool(torch.isfinite(gradient).all()):
        step = lam * gradient
    else:
        step = _f32(2.0) * ((d_rival / total) * (lam * g_own / total) - (d_own / total) * (lam * g_rival / total))
    state.relevance_logits[c] -= _f32(config.lvq.relevance_rate) * step


def rival_action(logits: Tensor, a: int) -> int:
    """The best-scoring action other than ``a`` (its first maximum), -1 when no other action scored."""
    others = logits.clone()
    others[a] = float("-inf")
    return int(others.argmax()) if bool(torch.isfinite(others).any()) else -1


def lvq_step(x: Tensor, c: int, a: int, recommended: int, nearest: Tensor, logits: Tensor, alpha: Tensor,
             state: JudgmentState, config: JudgmentConfig) -> tuple[int, Tensor, Tensor, bool, bool, bool, Tensor]:
    """Learn one verified decision with ``learning='lvq'`` (the module docstring has the rule), in
    place. ``recommended`` is the memory's own pre-learning action, ``nearest`` (A,) the slot
    that scored each action and ``logits`` (A,) their logits.

    Returns ``(slot, eta, distance, fresh, spawned, recycled, before)``: the taught slot, its step
    size (1 for a new prototype), the metric distance to it before learning (0 on a first
    touch), whether it was set to ``x``, spawned or recycled, and its row before the update."""
    observe(x, c, state.input_counts, state.input_means, state.input_variances)
    observe(x, 0, state.factor_counts, state.factor_means, state.factor_variances)
    wrong = recommended != a
    floor = rate_floor(c, wrong, state, config)
    weights = metric(alpha, state, config)[c]
    if state.centroids.shape[2] > 1 and config.lvq.miss_penalty > 0:
        miss(x, c, a, weights, state, config)
    in_use = state.initialized[c, a].nonzero().squeeze(-1)
    spawned = recycled = False
    if not in_use.numel():  # a first touch
        target, distance, fresh = 0, _f32(0.0), True
    else:
        lengths = weighted((x - state.centroids[c, a, in_use]) ** 2, weights[None].expand(in_use.numel(), -1))
        j = int(lengths.argmin())
        target, distance = int(in_use[j]), lengths[j]
        rival = rival_action(logits, a)
        if config.lvq.relevance_rate > 0 and rival >= 0:
            relevance_step(x, c, a, target, rival, int(nearest[rival]), alpha, state, config)
        spawned = state.centroids.shape[2] > 1 and wrong and float(distance) > config.slots.spawn_threshold
        fresh = spawned
        if spawned:
            target, recycled = take_slot(c, a, state)
    before = state.centroids[c, a, target].clone()
    if fresh:
        start_prototype(x, c, a, target, state, config)
        eta = torch.tensor(1.0)
    else:
        eta = lvq_rate(state.counts[c, a, target], floor)
        step_toward(x, c, a, target, eta, state, config)
    credit(c, a, target, state, config)
    if wrong and recommended >= 0 and config.rule.push_rate > 0:  # away from x: a negative step
        q = int(nearest[recommended])
        rate = _f32(config.rule.push_rate) * lvq_rate(state.counts[c, recommended, q], floor)
        push_away(x, c, recommended, q, rate, state, config)
    return target, eta, distance, fresh, spawned, recycled, before
