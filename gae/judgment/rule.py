r"""The judgment memory's rule, in plain torch: the reference every fast path is held equal to.

One small function per sub-rule, each with its maths; :mod:`gae.judgment.kernels` mirrors them
function for function (same names) and the tests compare the two on seeded random streams in
every mode. Notation: category :math:`c`, action :math:`a`, prototype slot :math:`p`, factors
:math:`x \in \mathbb{R}^K`, prototypes :math:`\mu_{c,a,p}`, attention :math:`\alpha_c`.

Scoring (:func:`attention`, :func:`distances`, :func:`scoring_mask`, :func:`output`)::

    alpha_c   = K softmax(criterion_logits_c)
    d_{a,p}   = sum_k alpha_{c,k} (x_k - mu_{c,a,p,k})^2
    logit_a   = max_p -d_{a,p} / tau     over the slots that score (-inf if none)
    probs     = softmax(logit)           action = argmax (-1 when no action scores, or p < min_confidence)

Learning one verified decision (:func:`prequential`, in stream order)::

    skip                    -> nothing changes
    eta = eta_confirmed if confirmed else eta_override     (confirmed: given, or recommendation == a)
    p, disp = taught_slot   nearest prototype in use of (c, a), unweighted L2
    none in use             -> first touch: mu_{c,a,0} = x
    disp > spawn_threshold  -> spawn_slot: a free slot, else recycle the least-won; mu = x   (P > 1)
    following               -> follow_step: running mean since the change point
    disp > drift_threshold  -> eta *= gate_damping                                       (the gate)
    mu_{c,a,p} += eta (x - mu_{c,a,p});  counts += 1;  wins decay by win_decay, +1 for p  (P > 1)
    overridden, push_rate   -> push_away: the wrongly recommended prototype moves away from x
    adaptive                -> weigh_evidence (before), track and shadow_and_promotion (after)

``learning='lvq'`` replaces the gated rule by learning vector quantization in the data's own
units (:mod:`gae.judgment.lvq`); its metric, :func:`metric`, is the scoring formula's weights.
The distance, the units and the slot operations both rules build on are in
:mod:`gae.judgment.primitives` (re-exported here): this module imports ``lvq``, ``lvq`` imports
``primitives``, never the other way.

Every quantity stays finite for every value ``learn_one`` / ``prequential_`` accept (|x| <= 1e15,
docs/inputs.md): prototypes are means of learned values or held within the limit
(:func:`push_away`), a change test whose two distances both overflow float32 sees no gap
(:func:`logit_gap`), and the relevance step is rescaled where its formula would leave float32
(:func:`gae.judgment.lvq.relevance_step`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gae.judgment import lvq
from gae.judgment.config import JudgmentConfig
from gae.judgment.primitives import STATE_LIMIT as STATE_LIMIT
from gae.judgment.primitives import VARIANCE_FLOOR as VARIANCE_FLOOR
from gae.judgment.primitives import _f32
from gae.judgment.primitives import clipped as clipped
from gae.judgment.primitives import credit as credit
from gae.judgment.primitives import metric as metric
from gae.judgment.primitives import push_away as push_away
from gae.judgment.primitives import relevances as relevances
from gae.judgment.primitives import spawn_slot as spawn_slot
from gae.judgment.primitives import spread as spread
from gae.judgment.primitives import start_prototype as start_prototype
from gae.judgment.primitives import step_toward as step_toward
from gae.judgment.primitives import take_slot as take_slot
from gae.judgment.primitives import taught_slot as taught_slot
from gae.judgment.primitives import unit_variances as unit_variances
from gae.judgment.primitives import units as units
from gae.judgment.primitives import weighted as weighted
from gae.judgment.state import JudgmentState
from gae.types import LearnEvents, MemoryOutput, PromotionLog, StreamStep


# -- scoring ------------------------------------------------------------------------------------
def attention(criterion_logits: Tensor) -> Tensor:
    """``alpha = K softmax(criterion_logits)`` over the last dim: all ones at zero logits.

    Shape: (..., K) -> (..., K), each row summing to K. Written out (``exp`` of the logits less
    their maximum, over the sum) rather than with ``torch.softmax``: on logits that require
    grad, torch 2.x runs even a (C, K) softmax through a parallel region, and on a busy machine
    the thread hand-off costs milliseconds per call, a thousand times the arithmetic.
    """
    weights = (criterion_logits - criterion_logits.detach().amax(-1, keepdim=True)).exp()
    return criterion_logits.shape[-1] * (weights / weights.sum(-1, keepdim=True))


def distances(x: Tensor, estimates: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
    r"""The scoring formula, the one place it is written:
    :math:`d = \sum_k \alpha_k (x_k - \mu_k)^2`.

    Args:
        x: (B, K) factors.
        estimates: (B, ..., K) the prototypes each decision is scored against (e.g. (B, A, P, K)).
        alpha: (B, K) attention of each decision's category.

    Returns:
        ``(sq_diff, distance)``: (B, ..., K) squared differences and (B, ...) weighted distances.
    """
    shape = (x.shape[0],) + (1,) * (estimates.dim() - 2) + (x.shape[1],)
    sq_diff = (x.to(estimates.dtype).reshape(shape) - estimates) ** 2
    return sq_diff, weighted(sq_diff, alpha)


def scoring_mask(initialized: Tensor, wins: Tensor, support: float) -> Tensor:
    """(..., P) bool: the prototypes that take part in scoring: in use, and either proven
    (``wins >= support``) or the most-won of their action (ties: the lowest slot). With one slot
    (``wins`` may then be empty), the occupancy mask itself."""
    if initialized.shape[-1] == 1:
        return initialized
    ranked = torch.where(initialized, wins, float("-inf"))
    top = torch.zeros_like(initialized).scatter_(-1, ranked.argmax(-1, keepdim=True), True)  # first maximum
    return initialized & ((wins >= support) | top)


def scoring_estimates(state: JudgmentState, config: JudgmentConfig) -> Tensor:
    """(C, A, P, K) what each category scores with: its prototypes, or, in ``drift_mode='adaptive'``,
    its tracking prototypes while they lead (``tracking_lead > 0``)."""
    if not config.adaptive:
        return state.centroids
    leading = (state.tracking_lead > 0)[:, None, None, None]
    return torch.where(leading, state.tracking_centroids, state.centroids)


def slot_logits(distance: Tensor, scoring: Tensor, tau: float) -> Tensor:
    """(..., P) logits ``-distance / tau`` of every slot, ``-inf`` where a slot does not score."""
    return (-distance / tau).masked_fill(~scoring, float("-inf"))


def output(logits: Tensor, min_confidence: float = 0.0) -> MemoryOutput:
    """Turn (B, A) logits with ``-inf`` for absent actions into a :class:`MemoryOutput`.

    A row with no finite logit abstains (action -1, confidence 0, probabilities all zero), and
    so does a row whose best probability is below ``min_confidence``. Ties go to the lowest
    action index. Gradients flow through ``logits`` and ``probs``.
    """
    known = torch.isfinite(logits).any(-1, keepdim=True)  # (B, 1)
    safe = logits.masked_fill(~known, 0.0)
    probs = torch.softmax(safe, dim=-1) * known
    action = safe.argmax(-1)
    confidence = probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    # the threshold is compared in float64, exactly as the compiled kernels compare it
    abstain = ~known.squeeze(-1) | (confidence.detach().double() < min_confidence)
    return MemoryOutput(logits, probs, action.masked_fill(abstain, -1), confidence.masked_fill(abstain, 0.0))


def score(x: Tensor, category: Tensor, estimates: Tensor, scoring: Tensor, alpha: Tensor,
          config: JudgmentConfig) -> tuple[MemoryOutput, Tensor, Tensor]:
    """Score a batch: each action by its nearest scoring prototype.

    Args:
        x: (B, K); category: (B,); estimates: (C, A, P, K) what scores (the prototypes, or
            in ``drift_mode='adaptive'`` the tracking prototypes where they lead); scoring:
            (C, A, P) :func:`scoring_mask`; alpha: (C, K) attention.

    Returns:
        the :class:`MemoryOutput`, the (B, A, P, K) squared differences and the (B, A, P)
        slot logits (``-inf`` where a slot does not score).
    """
    sq_diff, distance = distances(x, estimates[category], alpha[category])
    logits = slot_logits(distance, scoring[category], config.rule.tau)
    return output(logits.amax(-1), config.rule.min_confidence), sq_diff, logits


def score_decision(x: Tensor, c: int, estimates: Tensor, scoring: Tensor, alpha: Tensor,
                   config: JudgmentConfig) -> tuple[MemoryOutput, Tensor, Tensor]:
    """One decision of :func:`prequential`: its output, the (A,) slot that scored each action (-1:
    none) and the (A, K) squared differences of that slot."""
    out, sq_diff, logits = score(x[None], torch.tensor([c]), estimates, scoring, alpha, config)
    near = logits[0].max(-1).indices  # the first maximum: the lowest slot on a tie
    nearest = torch.where(scoring[c].any(-1), near, -1)
    n_actions = estimates.shape[1]
    return out, nearest, sq_diff[0, torch.arange(n_actions), nearest.clamp(min=0)]


def logit_gap(logit: Tensor, proto_logit: Tensor) -> Tensor:
    """``logit - proto_logit``, how much better a shadow or tracking prototype scores a decision than
    the prototype itself; 0 where both logits are ``-inf`` (a tiny ``tau`` can take both distances
    beyond float32: neither prototype scores better), where the difference would be NaN."""
    gap = logit - proto_logit
    return gap if bool(gap == gap) else _f32(0.0)


def weigh_evidence(x: Tensor, c: int, a: int, p: int, proto_logit: Tensor, alpha: Tensor, state: JudgmentState,
                   config: JudgmentConfig) -> None:
    r"""One step of category ``c``'s change test (a one-sided CUSUM), in place:

    .. math::
        g = \mathrm{logit}(\text{shadow}_{c,a,p}) - \mathrm{logit}(\mu_{c,a,p}), \qquad
        S_c \leftarrow \max(0,\; S_c + \mathrm{clip}(g, \pm e_{clip}) - e_{allow})

    ``promotion_evidence[c]`` counts the run's decisions with ``g > 0`` and the others; when
    ``S_c`` returns to 0 a new run starts: its evidence and run means are reset.
    """
    gap = logit_gap(-distances(x[None], state.shadow_centroids[c, a, p][None], alpha[c][None])[1][0]
                    / _f32(config.rule.tau), proto_logit)
    step = gap.clamp(-config.drift.evidence_clip, config.drift.evidence_clip) - _f32(config.drift.evidence_allowance)
    statistic = state.promotion_statistic
    statistic[c] = torch.clamp(statistic[c] + step, min=0.0)
    if statistic[c] == 0:
        state.promotion_evidence[c] = 0
        state.run_counts[c] = 0
    else:
        state.promotion_evidence[c, 0 if gap > 0 else 1] += 1


def lead_step(x: Tensor, c: int, a: int, p: int, proto_logit: Tensor, alpha: Tensor, state: JudgmentState,
              config: JudgmentConfig) -> None:
    r"""The tracking lead, in place: :math:`L_c \leftarrow L_c + r\,(\mathrm{clip}(\mathrm{logit}
    (\text{tracking}_{c,a,p}) - \mathrm{logit}(\mu_{c,a,p}), \pm e_{clip}) - L_c)`; while
    :math:`L_c > 0` the category scores with its tracking prototypes."""
    gap = logit_gap(-distances(x[None], state.tracking_centroids[c, a, p][None], alpha[c][None])[1][0]
                    / _f32(config.rule.tau), proto_logit)
    clipped_gap = gap.clamp(-config.drift.evidence_clip, config.drift.evidence_clip)
    state.tracking_lead[c] += _f32(config.drift.lead_rate) * (clipped_gap - state.tracking_lead[c])


def follow_step(c: int, a: int, p: int, disp: Tensor, state: JudgmentState,
                config: JudgmentConfig) -> tuple[Tensor, bool]:
    r"""A prototype following a change learns as the running mean of its decisions since the
    change point: weight :math:`w = 1`, or ``gate_damping`` past ``drift_threshold`` once it has a
    weight to protect; :math:`W \leftarrow W + w`, :math:`\eta = w / W`; it hands over to the seed
    rule when :math:`\eta_{confirmed} (W + 1) \ge 1`. Returns ``(eta, gated)``."""
    weight, gated = _f32(1.0), False
    if float(disp) > config.rule.drift_threshold and state.follow_weight[c, a, p] > 0:  # a restart: nothing to damp
        weight, gated = _f32(config.rule.gate_damping), True
    state.follow_weight[c, a, p] += weight
    eta = weight / state.follow_weight[c, a, p]
    if _f32(config.rule.eta_confirmed) * (state.follow_weight[c, a, p] + _f32(1.0)) >= 1.0:
        state.following[c, a, p] = False
    return eta, gated


def track(x: Tensor, c: int, a: int, p: int, fresh: bool, state: JudgmentState, config: JudgmentConfig) -> None:
    r"""The tracking prototype of a taught prototype, in place: set to ``x`` when the prototype is
    new, else :math:`t \leftarrow t + \eta_t (x - t)` with :math:`\eta_t` = ``tracking_eta``, times
    ``gate_damping`` when :math:`\lVert x - t \rVert_2 >` ``drift_threshold``."""
    tracking = state.tracking_centroids
    if fresh:
        tracking[c, a, p] = clipped(x.clone(), config)
        return
    eta = _f32(config.drift.tracking_eta)
    if float((x - tracking[c, a, p]).pow(2).sum().sqrt()) > config.rule.drift_threshold:
        eta = eta * _f32(config.rule.gate_damping)
    tracking[c, a, p] = clipped(tracking[c, a, p] + eta * (x - tracking[c, a, p]), config)


def shadow_and_promotion(x: Tensor, c: int, a: int, p: int, fresh: bool, state: JudgmentState,
                         config: JudgmentConfig) -> tuple[Tensor, Tensor, Tensor] | None:
    r"""After learning, in place: the shadow moves undamped (:math:`s \leftarrow s + \eta_s (x - s)`,
    ``x`` when new); a decision of the test's current run (:math:`S_c > 0`) joins its prototype's run
    mean; and when :math:`S_c >` ``promotion_threshold`` the category is *promoted*: each prototype in
    use becomes its run mean (or its shadow, with no weight, when the run has none of its
    decisions) and follows from there (:func:`follow_step`); the test and the lead restart.
    Returns ``(statistic, evidence, mean shift)`` of a promotion, None otherwise."""
    shadow, run_mean, run_count = state.shadow_centroids, state.run_centroids, state.run_counts
    if fresh:  # a new prototype: nothing it saw before belongs to it
        shadow[c, a, p] = clipped(x.clone(), config)
        state.following[c, a, p], state.follow_weight[c, a, p], run_count[c, a, p] = False, 0.0, 0
    else:
        shadow[c, a, p] = clipped(shadow[c, a, p] + _f32(config.drift.shadow_eta) * (x - shadow[c, a, p]), config)
    if state.promotion_statistic[c] > 0:
        run_count[c, a, p] += 1
        if run_count[c, a, p] == 1:
            run_mean[c, a, p] = x
        else:
            run_mean[c, a, p] += _f32(1.0) / run_count[c, a, p].to(torch.float32) * (x - run_mean[c, a, p])
    if float(state.promotion_statistic[c]) <= config.drift.promotion_threshold:
        return None
    live, from_run = state.initialized[c], run_count[c] > 0
    promoted = clipped(torch.where(from_run[..., None], run_mean[c], shadow[c]), config)
    shift = (promoted[live] - state.centroids[c][live]).pow(2).sum(-1).sqrt().mean()
    evidence = (state.promotion_statistic[c].clone(), state.promotion_evidence[c].clone(), shift)
    state.centroids[c][live] = promoted[live]
    weight = torch.where(from_run, run_count[c].to(torch.float32), 0.0)  # a shadow: restarts, no weight
    state.follow_weight[c][live] = weight[live]
    state.following[c][live] = (_f32(config.rule.eta_confirmed) * (weight + _f32(1.0)) < 1.0)[live]
    run_count[c][live] = 0
    state.promotion_statistic[c], state.promotion_evidence[c], state.tracking_lead[c] = 0.0, 0, 0.0
    return evidence


def promotions_of(events: LearnEvents, category: Tensor, statistic: Tensor, evidence: Tensor,
                  shift: Tensor) -> PromotionLog:
    """The rows of the per-decision promotion outputs where a promotion happened (step = batch position)."""
    where = events.promoted.nonzero().squeeze(-1)
    return PromotionLog(where, category[where], statistic[where], evidence[where, 0], evidence[where, 1],
                        shift[where])


def prequential(state: JudgmentState, config: JudgmentConfig, alpha: Tensor, x: Tensor, category: Tensor,
                action: Tensor, confirmed: Tensor, given: Tensor, skip: Tensor) -> tuple[StreamStep, PromotionLog]:
    """Score-before-learn over a batch, one decision at a time, updating ``state`` in place.

    Args:
        state: CPU tensors, (C, A, P, ...) per prototype; alpha: (C, K) attention; x: (B, K)
            float32; category, action: (B,) int64; confirmed, given, skip: (B,) bool (``confirmed[b]``
            counts where ``given[b]``, else the memory's own recommendation decides).

    Returns:
        the :class:`StreamStep` (pre-learning outputs, learn events, the squared differences and
        slot of each action that scored, each taught prototype's row before its update) and the
        promotions it made (``step`` = position in the batch).
    """
    n, n_factors = x.shape
    n_actions = state.centroids.shape[1]
    logits, probs = torch.empty(n, n_actions), torch.empty(n, n_actions)
    out_action, confidence = torch.empty(n, dtype=torch.int64), torch.empty(n)
    sq_diff, nearest = torch.empty(n, n_actions, n_factors), torch.empty(n, n_actions, dtype=torch.int64)
    before, events = torch.zeros(n, n_factors), LearnEvents.empty(n)
    promo_statistic, promo_evidence, promo_shift = torch.zeros(n), torch.zeros(n, 2, dtype=torch.int64), torch.zeros(n)
    tau = _f32(config.rule.tau)
    multi = state.centroids.shape[2] > 1
    for b in range(n):
        c, a = int(category[b]), int(action[b])
        tracked = config.adaptive and bool(state.tracking_lead[c] > 0)
        estimates = state.tracking_centroids if tracked else state.centroids
        scoring = scoring_mask(state.initialized, state.wins, config.slots.spawn_support)
        out, nearest[b], sq_diff[b] = score_decision(x[b], c, estimates, scoring, metric(alpha, state, config),
                                                     config)
        if config.learning == "lvq":  # in the metric's units, so that the attention's gradient sees what scored
            sq_diff[b] *= units(state, c, config)
        logits[b], probs[b], out_action[b], confidence[b] = (t[0] for t in out)
        recommended = int(out_action[b])
        if skip[b]:
            events.skipped[b] = True
            continue
        if config.learning == "lvq":
            target, eta, disp, fresh, spawned, recycled, before[b] = lvq.lvq_step(
                x[b], c, int(action[b]), recommended, nearest[b], logits[b], alpha, state, config)
            events.initialized[b] = fresh and not spawned
            events.spawned[b], events.recycled[b] = spawned, recycled
            events.displacement[b] = disp
            events.applied[b], events.eta[b], events.prototype[b] = True, eta, target
            continue
        is_confirmed = bool(confirmed[b]) if given[b] else recommended == a
        eta = _f32(config.rule.eta_confirmed if is_confirmed else config.rule.eta_override)
        target, disp = taught_slot(x[b], c, a, state)
        spawn = target >= 0 and multi and float(disp) > config.slots.spawn_threshold
        follow = False
        if config.adaptive and target >= 0 and not spawn:
            proto_logit = -distances(x[b][None], state.centroids[c, a, target][None], alpha[c][None])[1][0] / tau
            weigh_evidence(x[b], c, a, target, proto_logit, alpha, state, config)
            lead_step(x[b], c, a, target, proto_logit, alpha, state, config)
            follow = bool(state.following[c, a, target])
        fresh = target < 0 or spawn
        if target < 0:
            target = 0
            events.initialized[b] = True
        elif spawn:
            events.displacement[b], events.spawned[b] = disp, True
            target, events.recycled[b] = take_slot(c, a, state)
        before[b] = state.centroids[c, a, target]
        if fresh:  # a first touch or a new prototype
            start_prototype(x[b], c, a, target, state, config)
            eta = torch.tensor(1.0)
        else:
            events.displacement[b] = disp
            if follow:
                eta, events.gated[b] = follow_step(c, a, target, disp, state, config)
            elif float(disp) > config.rule.drift_threshold:  # the gate: float32 displacement, float64 threshold
                eta, events.gated[b] = eta * _f32(config.rule.gate_damping), True
            step_toward(x[b], c, a, target, eta, state, config)
        credit(c, a, target, state, config)
        events.applied[b], events.eta[b], events.prototype[b] = True, eta, target
        if config.rule.push_rate > 0 and not is_confirmed and recommended >= 0 and recommended != a:
            push_away(x[b], c, recommended, int(nearest[b, recommended]), _f32(config.rule.push_rate), state, config)
        if config.adaptive:
            track(x[b], c, a, target, fresh, state, config)
            promotion = shadow_and_promotion(x[b], c, a, target, fresh, state, config)
            if promotion is not None:
                events.promoted[b] = True
                promo_statistic[b], promo_evidence[b], promo_shift[b] = promotion
    step = StreamStep(MemoryOutput(logits, probs, out_action, confidence), events, sq_diff, nearest, before)
    return step, promotions_of(events, category, promo_statistic, promo_evidence, promo_shift)
