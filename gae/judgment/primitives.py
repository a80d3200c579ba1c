r"""What every rule of the judgment memory builds on, in plain torch: the weighted distance, the
data's units and the prototype slots.

:mod:`gae.judgment.rule` (scoring, the gated rule and the reference loop of every mode) and
:mod:`gae.judgment.lvq` (``learning='lvq'``) both import these, and ``rule`` imports ``lvq``:
the imports point one way. ``rule`` re-exports every name here, its public home. The compiled
mirror is :mod:`gae.judgment.kernels.scoring` (the units: ``relevance``, ``spread``,
``metric_row``) and :mod:`gae.judgment.kernels.slots` (the slot operations), function for
function.

Numbers (docs/inputs.md): a learned value lies in ``[-LEARN_LIMIT, LEARN_LIMIT]`` (1e15), so
every prototype, running mean, shadow and tracking prototype, each a weighted mean of learned
values, does too, and a push away from a decision (:func:`push_away`, the one update that is not
a mean) is held there. A running variance is then at most ``(2 LEARN_LIMIT)^2`` and at least 0,
a spread above :data:`VARIANCE_FLOOR` or inf (a criterion that has not varied weighs nothing), and
every weight of the metric at most ``K / 1e-30``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from gae.judgment.config import JudgmentConfig
from gae.judgment.float32 import VARIANCE_FLOOR as VARIANCE_FLOOR
from gae.judgment.float32 import _f32 as _f32
from gae.judgment.state import JudgmentState
from gae.validation import LEARN_LIMIT

# the largest |value| a prototype holds: LEARN_LIMIT as float32 (999999986991104, just below 1e15), the
# largest a learned float32 value can be
STATE_LIMIT = float(np.float32(LEARN_LIMIT))


# -- the distance and the data's units -----------------------------------------------------------
def weighted(sq_diff: Tensor, alpha: Tensor) -> Tensor:
    """``sum_k alpha_k sq_diff_k``: (B, ..., K) squared differences and (B, K) attention -> (B, ...)."""
    shape = (sq_diff.shape[0],) + (1,) * (sq_diff.dim() - 2) + (sq_diff.shape[-1],)
    return (sq_diff * alpha.reshape(shape)).sum(-1)




def relevances(relevance_logits: Tensor) -> Tensor:
    """``softmax(relevance_logits)`` over the last dim, each row summing to 1 (uniform at zero
    logits); written out like :func:`gae.judgment.rule.attention`."""
    weights = (relevance_logits - relevance_logits.amax(-1, keepdim=True)).exp()
    return weights / weights.sum(-1, keepdim=True)


def unit_variances(state: JudgmentState, config: JudgmentConfig) -> Tensor:
    """(C, K) the running variances each category's units are made of (:func:`spread`): its own
    (``input_variances``), or with ``units='memory'`` each criterion's over all the memory's
    decisions (``factor_variances``), the same for every category."""
    if config.lvq.units == "memory":
        return state.factor_variances.expand(state.input_variances.shape)
    return state.input_variances


def spread(variances: Tensor, config: JudgmentConfig) -> Tensor:
    """(..., K) what ``learning='lvq'`` divides each squared difference by, from (..., K) running
    ``variances`` (:func:`unit_variances`): with ``units='criterion'`` or ``'memory'`` its
    criterion's, with ``units='category'`` their mean over the criteria (one scale, the
    criteria's ratios kept);
    ``inf`` where that is at most :data:`VARIANCE_FLOOR` (a criterion that has not varied: its
    difference is the same to every prototype of the category, so it weighs nothing). With
    ``units='criterion'`` or ``'memory'`` a distance is then the same in any units: scaling a
    criterion by ``s`` scales its differences by ``s`` and its variance by ``s ** 2``."""
    if config.lvq.units == "category":
        variances = variances.mean(-1, keepdim=True).expand(variances.shape)
    return torch.where(variances > VARIANCE_FLOOR, variances, float("inf"))


def units(state: JudgmentState, c: int, config: JudgmentConfig) -> Tensor:
    """(K,) what ``learning='lvq'`` weighs category ``c``'s squared differences by before the
    attention does: its relevances over the spread (:func:`spread`)."""
    return relevances(state.relevance_logits[c]) / spread(unit_variances(state, config)[c], config)


def metric(alpha: Tensor, state: JudgmentState, config: JudgmentConfig) -> Tensor:
    r"""(C, K) the weights of the scoring distance: the attention :math:`\alpha` itself with the
    gated rule; with ``learning='lvq'``, :math:`w_c = \alpha_c \lambda_c / (v_c + \epsilon)`: the
    attention times the learned relevances (:func:`relevances`) over each category's running
    variance (:func:`spread`), so a distance is measured in the data's own units."""
    if config.learning != "lvq":
        return alpha
    return alpha * relevances(state.relevance_logits) / spread(unit_variances(state, config), config)


# -- the prototype slots ---------------------------------------------------------------------------
def clipped(row: Tensor, config: JudgmentConfig) -> Tensor:
    """``row`` clamped to ``config.rule.clip`` when it is set."""
    return row.clamp(*config.rule.clip) if config.rule.clip is not None else row


def taught_slot(x: Tensor, c: int, a: int, state: JudgmentState) -> tuple[int, Tensor]:
    """The prototype a verified decision teaches: (slot, ``||x - mu_{c,a,p}||_2``) of the nearest
    in use by the unweighted distance (the gate's), ``(-1, 0)`` when none is."""
    in_use = state.initialized[c, a].nonzero().squeeze(-1)
    if not in_use.numel():
        return -1, _f32(0.0)
    lengths = ((x - state.centroids[c, a, in_use]) ** 2).sum(-1).sqrt()
    j = int(lengths.argmin())
    return int(in_use[j]), lengths[j]


def spawn_slot(c: int, a: int, state: JudgmentState) -> tuple[int, bool]:
    """Where a decision farther than ``spawn_threshold`` from every prototype of its action starts
    a new one: ``(slot, recycled)``, the first free slot, else the one with the fewest recent wins
    (the lowest on a tie), recycled."""
    free = (~state.initialized[c, a]).nonzero().squeeze(-1)
    if free.numel():
        return int(free[0]), False
    return int(state.wins[c, a].argmin()), True


def take_slot(c: int, a: int, state: JudgmentState) -> tuple[int, bool]:
    """:func:`spawn_slot`, with the slot's count and wins reset: ``(slot, recycled)``."""
    target, recycled = spawn_slot(c, a, state)
    state.counts[c, a, target], state.wins[c, a, target] = 0, 0.0
    return target, recycled


def start_prototype(x: Tensor, c: int, a: int, p: int, state: JudgmentState, config: JudgmentConfig) -> None:
    """Slot ``p`` of (c, a) set to ``x`` (clipped) and in use: a first touch or a spawn."""
    state.centroids[c, a, p] = clipped(x.clone(), config)
    state.initialized[c, a, p] = True


def step_toward(x: Tensor, c: int, a: int, p: int, eta: Tensor, state: JudgmentState, config: JudgmentConfig) -> None:
    """``mu_{c,a,p} <- mu + eta (x - mu)``, clipped, in place: the update every rule makes toward a
    decision (:func:`push_away` moves one away)."""
    row = state.centroids[c, a, p]
    state.centroids[c, a, p] = clipped(row + eta * (x - row), config)


def credit(c: int, a: int, p: int, state: JudgmentState, config: JudgmentConfig) -> None:
    """Slot ``p`` taught, in place: one more update, and with several slots the action's wins
    decay by ``win_decay`` and ``p`` wins one."""
    state.counts[c, a, p] += 1
    if state.centroids.shape[2] > 1:
        state.wins[c, a] *= _f32(1.0) - _f32(config.slots.win_decay)
        state.wins[c, a, p] += 1.0



def push_away(x: Tensor, c: int, a: int, p: int, rate: Tensor, state: JudgmentState, config: JudgmentConfig) -> None:
    """``mu_{c,a,p} <- mu - rate (x - mu)``, clipped, in place: the wrongly recommended prototype
    moved away from ``x`` (``push_rate``), and held within ``[-STATE_LIMIT, STATE_LIMIT]``: unlike
    a step toward a decision, a push is no mean of learned values, and pushes in a row would grow a
    prototype without bound."""
    row = state.centroids[c, a, p]
    state.centroids[c, a, p] = clipped(row - rate * (x - row), config).clamp(-STATE_LIMIT, STATE_LIMIT)


def novelty(x: Tensor, centroids: Tensor, initialized: Tensor, variances: Tensor) -> Tensor:
    r"""How far a case lies from what its category has seen: its squared distance to the nearest
    prototype, each criterion in units of the category's running variance,

    .. math::
        \nu = \min_{a, p \,:\, \mathrm{initialized}} \sum_k \frac{(x_k - \mu_{a,p,k})^2}{\max(v_k, \epsilon)}

    in float64 (``inf`` when no prototype exists). Unlike the distance (:func:`spread`), a criterion
    that has not varied counts here, over the floor: a value it never had is as novel as a case gets.
    ``x``: (K,); ``centroids``: (A, P, K), ``initialized``: (A, P) and ``variances``: (K,) of the
    case's category."""
    used = initialized.reshape(-1)
    if not bool(used.any()):
        return x.new_tensor(float("inf"), dtype=torch.float64)
    spread = variances.double().clamp(min=VARIANCE_FLOOR)
    cents = centroids.reshape(-1, centroids.shape[-1])[used].double()
    return (((x.double() - cents) ** 2) / spread).sum(-1).min()
