"""JudgmentMemory: one learned prototype per (category, action) and learned criterion attention."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor, nn

from gae import _kernels, audit, engine
from gae import _validation as check
from gae import functional as F
from gae._base import DecisionMemory
from gae._validation import Names
from gae.types import GateLog, LearnEvents, MemoryOutput, PromotionLog, RecycleLog, StreamStep

DriftMode = Literal["seed", "adaptive"]
# the layout of drift_mode='adaptive' buffers: 2 added the run means, per-prototype following and tracking
ADAPTIVE_FORMAT = 2


class JudgmentMemory(DecisionMemory):
    r"""Centroid judgment over verified decisions, scoring in O(A K) with no retrieval.

    A decision is a factor vector :math:`x \in \mathbb{R}^K` in a category :math:`c`. The
    memory keeps one prototype :math:`\mu_{c,a}` per category and action and scores

    .. math::
        \alpha_c = K\,\mathrm{softmax}(\ell_c), \qquad
        d_a = \sum_k \alpha_{c,k}\,(x_k - \mu_{c,a,k})^2, \qquad
        p = \mathrm{softmax}(-d / \tau)

    over the actions that have a prototype. A category without any prototype abstains
    (action -1, confidence 0, probabilities all zero). Learning a verified action :math:`a`
    (in stream order, outside autograd) is the gated rule of the original design:

    .. math::
        \eta = \begin{cases} \eta_{confirmed} & \text{recommendation was } a \\
                              \eta_{override} & \text{otherwise} \end{cases},\quad
        \eta \leftarrow \eta \cdot \gamma \text{ if } \lVert x - \mu_{c,a} \rVert_2 > \theta,\quad
        \mu_{c,a} \leftarrow \mu_{c,a} + \eta\,(x - \mu_{c,a})

    The first verified decision of a cell initialises its prototype to :math:`x`; uncertain
    outcomes (``skip``) change nothing; every gated step is appended to :attr:`gate_log`.

    ``drift_mode='adaptive'`` adds a change test that tells a sustained drift from outliers
    (``docs/drift.md``). Each prototype has a *shadow* that follows its verified decisions
    undamped (rate ``shadow_eta``, no gate). Each category runs a one-sided CUSUM test on
    whether its verified decisions lie closer to the shadow of their action than to the
    prototype (the logit gap, clipped to 1 nat, less an allowance of 0.25 nat per decision).
    The test's current run (since its statistic last stood at 0) is its estimate of when the
    change began. When the statistic passes ``promotion_threshold``, each prototype of the
    category is replaced by the mean of the decisions it learned during the run (by its shadow
    if there were none): a *promotion*, logged in :attr:`promotion_log` with its evidence. Each
    then *follows* the change as a running mean of its decisions since the change point (the
    gate halves a far decision's weight), until that mean's rate is down to ``eta_confirmed``
    and the seed rule takes over. A change too small for the test, such as a mild shift, is
    followed by *tracking* prototypes: moving averages at ``tracking_eta`` (halved past the
    gate's threshold) that score in a category while they have predicted its verified actions
    better than the prototypes over its last 10 or so decisions. A drift moves every later decision
    of an action the same way, so the shadow ends up closer and the test fires; outliers are
    far and scattered, they drag a shadow away from the next decisions, and the test falls.
    The default ``'seed'`` is the original rule, bit for bit.

    ``prototypes=P`` keeps up to P prototypes per category and action, for actions whose
    decisions form several clouds (``docs/prototypes.md``). An action scores with its nearest
    prototype (the minimum distance: probabilities stay a softmax over actions). A verified
    decision teaches the nearest prototype of its action (unweighted L2, the gate's distance)
    with the gated rule, or, when it lies farther than ``spawn_threshold`` from all of them,
    starts a new one: in a free slot, or in the slot of the prototype with the fewest recent
    wins (decisions taught, decayed by 5% per decision of the action), logged as *recycled*.
    A new prototype scores once it has ``spawn_support`` recent wins, so one mislabelled
    decision cannot plant a prototype in another action's cloud; the action's most-won
    prototype always scores. ``prototypes=1`` is the original design, bit for bit, with the
    original (C, A, K) buffers.
    The attention logits :math:`\ell` are the only parameters; they are trained by gradient
    (see :meth:`attention_logits`), while the prototypes are buffers and get no gradient.

    Args:
        categories: number of categories, or their names.
        actions: number of actions, or their names.
        factors: number of criteria (factors), or their names.
        tau: softmax temperature. Default: 0.1.
        eta_confirmed: step size when the memory's recommendation was confirmed. Default: 0.05.
        eta_override: step size when the verifier overrode it. Default: 0.01.
        drift_threshold: displacement (unweighted L2) above which the step is damped. Default: 0.4.
        gate_damping: factor applied to a gated step. Default: 0.5.
        clip: ``(low, high)`` to clamp prototypes to after every update, or None. Default: None.
        push_rate: on an override, move the wrongly recommended prototype away from ``x`` by
            this rate. Default: 0 (off).
        min_confidence: abstain (action -1) when the best probability is below this.
            Default: 0 (off).
        drift_mode: ``'seed'`` (the original rule) or ``'adaptive'`` (a per-category change
            test, run means and tracking prototypes). Default: ``'seed'``.
        shadow_eta: step size of the shadow prototypes (``'adaptive'`` only). Default: 0.5.
        tracking_eta: step size of the tracking prototypes, halved past ``drift_threshold``
            (``'adaptive'`` only). Default: 0.2, a memory of about the last 5 decisions of an action.
        promotion_threshold: CUSUM threshold of the change test, in nats (``'adaptive'``
            only). Default: ``log(20)``, about 3.0: at least 4 consecutive decisions clearly
            closer to the shadows.
        prototypes: prototype slots per category and action, P >= 1. Default: 1.
        spawn_threshold: unweighted L2 distance from every prototype of its action beyond
            which a verified decision starts a new prototype (P > 1 only). Default: 0.5.
        max_log_events: decisions the decision log keeps for ``trace``, ``undo_`` and
            ``forget_`` (:class:`~gae.audit.DecisionLog`, ``52 + 8 K`` bytes each); past it the
            oldest are folded into the log's base state, down to half. The gate, promotion and
            recycle logs, the audit trail, keep every event (32 to 40 bytes each). 0 keeps no
            log (no trace, undo or forget). Default: None (all).
        spawn_support: recent wins a prototype needs before it scores (P > 1 only). Default: 1.5,
            two wins close together (a win decays by 5% per decision of its action).

    Shape:
        - x: (B, K) float factors; category, action: (B,) integer indices.
        - Output: :class:`~gae.types.MemoryOutput` with (B, A) logits and probs, (B,) action
          and confidence.

    Attributes:
        criterion_logits: Parameter (C, K), attention logits, zero at initialisation.
        centroids: buffer (C, A, K) float32, the prototypes; (C, A, P, K) when P > 1.
        initialized: buffer (C, A) bool, the prototype exists; (C, A, P) when P > 1 (the
            occupancy mask: the slot is in use).
        counts: buffer (C, A) int64, updates applied to each prototype; (C, A, P) when P > 1
            (since the slot was last filled).
        wins: buffer (C, A, P) float32, each prototype's recent wins (P > 1 only).
        num_decisions: buffer () int64, decisions seen (the sequence number of the next one).
        shadow_centroids: buffer shaped like ``centroids``, the shadow prototypes (``'adaptive'`` only).
        promotion_statistic: buffer (C,) float32, each category's CUSUM statistic (``'adaptive'`` only).
        promotion_evidence: buffer (C, 2) int64, verified decisions closer to the shadow of
            their action than to its prototype, and the others, in the current run of the test
            (since its statistic last stood at 0; ``'adaptive'`` only).
        following: buffer shaped like ``counts``, bool: the prototype follows a change, as a
            running mean of its decisions since the change point (``'adaptive'`` only).
        follow_weight: buffer shaped like ``counts``, float32: the weight of that running mean
            so far (``'adaptive'`` only).
        run_centroids: buffer shaped like ``centroids``: each prototype's mean of the decisions
            it learned in the test's current run, the candidate for a promotion (``'adaptive'`` only).
        run_counts: buffer shaped like ``counts``, int64: how many decisions that mean holds (0:
            none, and ``run_centroids`` is stale; ``'adaptive'`` only).
        tracking_centroids: buffer shaped like ``centroids``, the tracking prototypes
            (``'adaptive'`` only).
        tracking_lead: buffer (C,) float32, how much better (in nats, clipped to 1 a decision,
            moving average over about 10 decisions) the tracking prototypes have predicted the
            category's verified actions than the prototypes; above 0 they score (``'adaptive'`` only).

    Examples::

        >>> memory = JudgmentMemory(["invoice", "refund"], ["approve", "reject"], 3)
        >>> memory.learn_one([0.9, 0.1, 0.5], "approve", "invoice")["initialized"]
        True
        >>> memory.learn_one([0.1, 0.9, 0.5], "reject", "invoice")["initialized"]
        True
        >>> memory.score_one([0.8, 0.2, 0.5], "invoice")[0]
        'approve'
        >>> memory.score_one([0.8, 0.2, 0.5], "refund")
        (None, 0.0)
    """

    _version = 1
    category_names: tuple[str, ...]
    criterion_logits: nn.Parameter
    centroids: Tensor
    initialized: Tensor
    counts: Tensor
    wins: Tensor
    num_decisions: Tensor
    shadow_centroids: Tensor
    promotion_statistic: Tensor
    promotion_evidence: Tensor
    following: Tensor
    follow_weight: Tensor
    run_centroids: Tensor
    run_counts: Tensor
    tracking_centroids: Tensor
    tracking_lead: Tensor

    def __init__(self, categories: Names, actions: Names, factors: Names, *, tau: float = 0.1,
                 eta_confirmed: float = 0.05, eta_override: float = 0.01, drift_threshold: float = 0.4,
                 gate_damping: float = 0.5, clip: tuple[float, float] | None = None, push_rate: float = 0.0,
                 min_confidence: float = 0.0, drift_mode: DriftMode = "seed", shadow_eta: float = 0.5,
                 promotion_threshold: float = math.log(20.0), tracking_eta: float = 0.2, prototypes: int = 1,
                 spawn_threshold: float = 0.5,
                 spawn_support: float = 1.5, max_log_events: int | None = None) -> None:
        super().__init__()
        self.category_names = check.resolve_names("categories", categories)
        self.action_names = check.resolve_names("actions", actions)
        self.factor_names = check.resolve_names("factors", factors)
        self.n_factors = len(self.factor_names)
        self.tau = check.check_real("tau", tau, low=0.0, low_open=True)
        self.eta_confirmed = check.check_real("eta_confirmed", eta_confirmed, low=0.0, high=1.0, low_open=True)
        self.eta_override = check.check_real("eta_override", eta_override, low=0.0, high=1.0, low_open=True)
        self.drift_threshold = check.check_real("drift_threshold", drift_threshold, low=0.0)
        self.gate_damping = check.check_real("gate_damping", gate_damping, low=0.0, high=1.0, low_open=True)
        self.push_rate = check.check_real("push_rate", push_rate, low=0.0, high=1.0)
        self.min_confidence = check.check_real("min_confidence", min_confidence, low=0.0, high=1.0)
        self.clip = self._check_clip(clip)
        if drift_mode not in ("seed", "adaptive"):
            raise ValueError(f"drift_mode must be 'seed' or 'adaptive', got {drift_mode!r}")
        self.drift_mode = drift_mode
        self.shadow_eta = check.check_real("shadow_eta", shadow_eta, low=0.0, high=1.0, low_open=True)
        self.promotion_threshold = check.check_real("promotion_threshold", promotion_threshold, low=0.0,
                                                    low_open=True)
        self.tracking_eta = check.check_real("tracking_eta", tracking_eta, low=0.0, high=1.0, low_open=True)
        self.prototypes = check.check_int("prototypes", prototypes, low=1)
        self.spawn_threshold = check.check_real("spawn_threshold", spawn_threshold, low=0.0)
        self.spawn_support = check.check_real("spawn_support", spawn_support, low=0.0)
        n_categories, n_actions = len(self.category_names), len(self.action_names)
        cells = (n_categories, n_actions) if self.prototypes == 1 else (n_categories, n_actions, self.prototypes)
        self.criterion_logits = nn.Parameter(torch.zeros(n_categories, self.n_factors))
        self.register_buffer("centroids", torch.zeros(*cells, self.n_factors))
        self.register_buffer("initialized", torch.zeros(cells, dtype=torch.bool))
        self.register_buffer("counts", torch.zeros(cells, dtype=torch.int64))
        if self.prototypes > 1:
            self.register_buffer("wins", torch.zeros(cells))
        self.register_buffer("num_decisions", torch.zeros((), dtype=torch.int64))
        if drift_mode == "adaptive":
            self.register_buffer("shadow_centroids", torch.zeros(*cells, self.n_factors))
            self.register_buffer("promotion_statistic", torch.zeros(n_categories))
            self.register_buffer("promotion_evidence", torch.zeros(n_categories, 2, dtype=torch.int64))
            self.register_buffer("following", torch.zeros(cells, dtype=torch.bool))
            self.register_buffer("follow_weight", torch.zeros(cells))
            self.register_buffer("run_centroids", torch.zeros(*cells, self.n_factors))
            self.register_buffer("run_counts", torch.zeros(cells, dtype=torch.int64))
            self.register_buffer("tracking_centroids", torch.zeros(*cells, self.n_factors))
            self.register_buffer("tracking_lead", torch.zeros(n_categories))
        self._gate_chunks: list[GateLog] = []
        self._promotion_chunks: list[PromotionLog] = []
        self._recycle_chunks: list[RecycleLog] = []
        if max_log_events is not None:
            check.check_int("max_log_events", max_log_events, low=0)
        self._log = audit.DecisionLog(max_log_events)
        self._log.base = self._buffer_state()
        self._replaying = False
        self._updates = 0  # the version counter: see ``version``
        self._replay_logits: Tensor | None = None  # the attention logits of the call being replayed
        self._category_positions = {name: i for i, name in enumerate(self.category_names)}
        self._score_cache: tuple | None = None

    @staticmethod
    def _check_clip(clip: tuple[float, float] | None) -> tuple[float, float] | None:
        if clip is None:
            return None
        if not isinstance(clip, Sequence) or len(clip) != 2:
            raise TypeError(f"clip must be None or a (low, high) pair, got {clip!r}")
        low = check.check_real("clip[0]", clip[0], low=-np.inf)
        high = check.check_real("clip[1]", clip[1], low=-np.inf)
        if not low < high:
            raise ValueError(f"clip must have low < high, got {clip!r}")
        return (low, high)

    @property
    def rule(self) -> engine.JudgmentRule:
        """The learning rule's hyperparameters, as passed to the engine."""
        return engine.JudgmentRule(self.tau, self.eta_confirmed, self.eta_override, self.drift_threshold,
                                   self.gate_damping, self.clip, self.push_rate, self.min_confidence,
                                   self.shadow_eta, self.promotion_threshold, tracking_eta=self.tracking_eta,
                                   spawn_threshold=self.spawn_threshold, spawn_support=self.spawn_support)

    def _slots(self, tensor: Tensor) -> Tensor:
        """A per-prototype buffer with its slot dimension: a (C, A, 1, ...) view when P = 1."""
        return tensor.unsqueeze(2) if self.prototypes == 1 else tensor

    def _wins(self) -> Tensor:
        """(C, A, P) recent wins; with one prototype (no ``wins`` buffer) zeros that nothing reads."""
        if self.prototypes == 1:
            return torch.zeros(self.initialized.shape + (1,), device=self.initialized.device)
        return self.wins

    def scoring_mask(self) -> Tensor:
        """(C, A, P) bool: the prototypes that take part in scoring (in use, and either proven by
        ``spawn_support`` recent wins or their action's most-won prototype). P = 1: ``initialized``."""
        return engine.scoring_mask(self._slots(self.initialized), self._wins(), self.spawn_support)

    def criterion_attention(self) -> Tensor:
        """(C, K) attention weights ``K * softmax(criterion_logits)``; all ones at initialisation."""
        return F.criterion_attention(self.criterion_logits)

    # -- scoring ----------------------------------------------------------------------
    def forward(self, x: Tensor, category: Tensor) -> MemoryOutput:
        """Score a batch against the current prototypes. No side effects.

        Differentiable in ``x`` and ``criterion_logits``. When no gradient is needed
        (``torch.no_grad()`` or frozen attention) on CPU, a compiled kernel computes the
        same numbers without building the (B, A, K) intermediate.
        """
        if not torch.compiler.is_compiling():
            x, category = self._check_query(x, category)
        alpha = self.criterion_attention()  # (C, K)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.criterion_logits.requires_grad)
        if (x.device.type == "cpu" and self.centroids.dtype == torch.float32 and not needs_grad
                and not torch.compiler.is_compiling()):
            return self._score_compiled(x, category, alpha)
        if self.prototypes == 1:
            scored = self.scoring_centroids()[category].squeeze(2)  # (B, A, K)
            sq_diff = F.squared_differences(x.to(self.centroids.dtype), scored)
            logits = F.prototype_logits(sq_diff, alpha[category], self.initialized[category], self.tau)
        else:
            logits = self._prototype_logits(x, category, alpha).amax(-1)  # the nearest prototype of each action
        return F.memory_output(logits, self.min_confidence)

    def scoring_centroids(self) -> Tensor:
        """(C, A, P, K) the estimates each category scores with: its prototypes, or, in
        ``drift_mode='adaptive'``, its tracking prototypes while they lead (``tracking_lead > 0``)."""
        centroids = self._slots(self.centroids)
        if self.drift_mode != "adaptive":
            return centroids
        leading = (self.tracking_lead > 0)[:, None, None, None]
        return torch.where(leading, self._slots(self.tracking_centroids), centroids)

    def _slot_distances(self, x: Tensor, category: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
        """(B, A, P, K) squared differences to every prototype slot and (B, A, P) weighted
        distances, ``inf`` where a slot does not score; ``alpha`` is (B, K), each decision's."""
        sq_diff = (x.to(self.centroids.dtype)[:, None, None, :] - self.scoring_centroids()[category]) ** 2
        distance = (sq_diff * alpha[:, None, None, :]).sum(-1)
        return sq_diff, distance.masked_fill(~self.scoring_mask()[category], float("inf"))

    def _prototype_logits(self, x: Tensor, category: Tensor, alpha: Tensor) -> Tensor:
        """(B, A, P) logits of every prototype slot, ``-inf`` where a slot does not score."""
        return -self._slot_distances(x, category, alpha[category])[1] / self.tau

    def explain(self, factors: Tensor | Sequence[float] | np.ndarray,
                category: Tensor | str | int = "general") -> audit.Explanation:
        """Every number behind the memory's recommendation for a batch of decisions, or one.

        Args:
            factors: (B, K) tensor with ``category`` a (B,) tensor of indices, or one decision's
                K factors with ``category`` a name or index.
            category: see ``factors``.

        Returns:
            an :class:`~gae.audit.Explanation`: probabilities, the distance to each action's
            nearest prototype and each criterion's contribution to it, the attention, the
            margin, and whether learning the decision would be gated (or start a prototype).
            ``print()`` it for a table with the memory's names. Nothing is learned.

        Examples::

            >>> memory = JudgmentMemory(["invoice"], ["approve", "reject"], ["amount", "age"])
            >>> _ = memory.learn_one([0.9, 0.1], "approve", "invoice")
            >>> _ = memory.learn_one([0.1, 0.9], "reject", "invoice")
            >>> why = memory.explain([0.8, 0.2], "invoice")
            >>> why.action_names[int(why.action[0])], round(float(why.distance[0, 0]), 3)
            ('approve', 0.02)
            >>> bool(torch.allclose(why.contributions.sum(-1), why.distance))
            True
        """
        if isinstance(factors, Tensor) and factors.dim() == 2:
            if not isinstance(category, Tensor):
                raise TypeError(f"category must be a (B,) tensor of indices with (B, K) factors, got {category!r}")
            x, category_t = self._check_query(factors, category, name="factors")
        else:
            x = self._one_factor_row(factors)
            if isinstance(category, Tensor):
                raise TypeError("category must be a name or an index with one decision's factors, got a tensor")
            category_t = torch.tensor([self._category_index(category)], device=x.device)
        with torch.no_grad():
            alpha = self.criterion_attention()[category_t]  # (B, K)
            sq_diff, slot_distance = self._slot_distances(x, category_t, alpha)
            distance, nearest = slot_distance.min(-1)  # (B, A)
            present = torch.isfinite(distance)
            nearest = torch.where(present, nearest, -1)
            rows = torch.arange(x.shape[0], device=x.device)[:, None]
            picked = nearest.clamp(min=0)
            contributions = sq_diff[rows, torch.arange(len(self.action_names), device=x.device), picked] \
                * alpha[:, None, :]
            contributions = contributions.masked_fill(~present[..., None], float("nan"))
            out = F.memory_output((-distance / self.tau).masked_fill(~present, float("-inf")), self.min_confidence)
            # the gate's view: learning the recommendation would move its nearest prototype in use (the
            # prototypes themselves, also while tracking prototypes score in drift_mode='adaptive')
            in_use = self._slots(self.initialized)[category_t]  # (B, A, P)
            gate_sq = sq_diff if self.drift_mode != "adaptive" else \
                (x.to(self.centroids.dtype)[:, None, None, :] - self._slots(self.centroids)[category_t]) ** 2
            plain = gate_sq.sum(-1).sqrt().masked_fill(~in_use, float("inf"))
            recommended = out.action.clamp(min=0)
            displacement, taught = plain[rows.squeeze(1), recommended].min(-1)
            displacement = torch.where(out.action >= 0, displacement, float("nan"))
            spawns = (displacement > self.spawn_threshold) if self.prototypes > 1 else torch.zeros_like(out.action,
                                                                                                    dtype=torch.bool)
            gated = (displacement > self.drift_threshold) & ~spawns
            if self.drift_mode == "adaptive":  # a promoted prototype restarting (no weight yet) is not gated
                cell = (category_t, recommended, taught)
                gated &= ~(self._slots(self.following)[cell] & (self._slots(self.follow_weight)[cell] == 0))
        return audit.Explanation(out.action, out.confidence, out.probs, distance, contributions, alpha, nearest,
                                 audit.margins(distance), displacement, gated, spawns, category_t,
                                 self.category_names, self.action_names, self.factor_names)

    def nearest_prototype(self, x: Tensor, category: Tensor) -> Tensor:
        """(B, A) int64: the prototype slot each action scores ``x`` with (its nearest scoring
        prototype), -1 where the action has none. Always 0 or -1 when P = 1."""
        x, category = self._check_query(x, category)
        with torch.no_grad():
            logits = self._prototype_logits(x, category, self.criterion_attention())
        return torch.where(torch.isfinite(logits).any(-1), logits.argmax(-1), -1)

    def _score_compiled(self, x: Tensor, category: Tensor, alpha: Tensor) -> MemoryOutput:
        n, n_actions = x.shape[0], len(self.action_names)
        logits, probs = torch.empty(n, n_actions), torch.empty(n, n_actions)
        action, confidence = torch.empty(n, dtype=torch.int64), torch.empty(n)
        _kernels.judgment_score(
            x.detach().float().contiguous().numpy(), category.contiguous().numpy(),
            self.scoring_centroids().contiguous().numpy(), self._slots(self.initialized).contiguous().numpy(),
            self._wins().numpy(), self.spawn_support, alpha.detach().float().contiguous().numpy(), self.tau,
            logits.numpy(), probs.numpy(), action.numpy(), confidence.numpy(), self.min_confidence)
        return MemoryOutput(logits, probs, action, confidence)

    def score_one(self, factors, category: str | int = "general") -> tuple[str | None, float]:
        """Score one decision: ``(action name or None when abstaining, confidence)``.

        On a CPU module this takes a compiled path of a few microseconds with no tensor made;
        anything unusual (bad input, another device or dtype) goes through :meth:`forward`.
        """
        views = self._score_views()
        index = None
        if type(category) is int and 0 <= category < len(self.category_names):
            index = category
        elif isinstance(category, str):
            index = self._category_positions.get(category)
        if views is None or index is None:
            return super().score_one(factors, category)
        try:
            raw = np.asarray(factors)
        except (TypeError, ValueError, RuntimeError):
            return super().score_one(factors, category)  # raises the full error message
        if raw.shape != (self.n_factors,) or raw.dtype.kind not in "fiu":  # complex, object, bool: the checks
            return super().score_one(factors, category)
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused by the checked path
            row = raw.astype(np.float32)
        centroids, initialized, wins, logits, tracking, lead = views
        if lead is not None and lead[index] > 0:  # drift_mode='adaptive': the tracking prototypes lead
            centroids = tracking
        action, confidence = _kernels.judgment_score_one(row, index, centroids, initialized, wins, self.spawn_support,
                                                         logits, self.tau, self.min_confidence)
        if action == _kernels.NOT_FINITE:
            return super().score_one(factors, category)
        return self._action_name(action), confidence

    def _score_views(self) -> tuple[Any, ...] | None:
        """NumPy views of the CPU state for :meth:`score_one`. Views follow in-place writes;
        they are rebuilt when a tensor or its storage is replaced (``.to()``, assignment)."""
        # the module's dicts directly: nn.Module.__getattr__ would cost a microsecond per name
        centroids = cast(Tensor, self._buffers["centroids"])
        initialized = cast(Tensor, self._buffers["initialized"])
        logits = cast(Tensor, self._parameters["criterion_logits"])
        wins = self._buffers.get("wins")
        tracking, lead = self._buffers.get("tracking_centroids"), self._buffers.get("tracking_lead")
        key = (centroids.data_ptr(), initialized.data_ptr(), logits.data_ptr(),
               None if wins is None else wins.data_ptr(), None if tracking is None else tracking.data_ptr(),
               None if lead is None else lead.data_ptr())
        cache = self._score_cache
        if (cache is not None and cache[0] is centroids and cache[1] is initialized and cache[2] is logits
                and cache[3] == key and cache[4] is wins):
            return cache[5]
        extra = tuple(t for t in (wins, tracking, lead) if t is not None)
        if any(t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous()
               for t in (centroids, logits, *extra)):
            return None
        slots = self._slots
        wins_view = np.zeros((1, 1, 1), np.float32) if wins is None else wins.numpy()  # unread when P = 1
        views = (slots(centroids).numpy(), slots(initialized).numpy(), wins_view, logits.detach().numpy(),
                 None if tracking is None else slots(tracking).numpy(), None if lead is None else lead.numpy())
        self._score_cache = (centroids, initialized, logits, key, wins, views)
        return views

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_score_cache"] = None  # views of this instance's tensors; a copy must build its own
        return state

    def attention_logits(self, step: StreamStep, category: Tensor) -> Tensor:
        """Differentiable (B, A) logits of a prequential step under the current attention.

        Uses the squared differences recorded at scoring time, so no decision is scored with
        knowledge of itself; the cross-entropy of these logits trains ``criterion_logits``.
        Actions that had no prototype at scoring time stay ``-inf``.
        """
        if step.sq_diff is None:
            raise ValueError("step has no sq_diff: it was not made by a JudgmentMemory")
        category = check.check_index(category, "category", len(self.category_names), step.sq_diff.shape[0],
                                     step.sq_diff.device, self.category_names)
        available = torch.isfinite(step.output.logits)
        return F.prototype_logits(step.sq_diff, self.criterion_attention()[category], available, self.tau)

    def attention_loss(self, step: StreamStep, category: Tensor, action: Tensor,
                       skip: Tensor | None = None) -> Tensor | None:
        """Cross-entropy of :meth:`attention_logits` against the verified actions.

        Only decisions whose verified action had a prototype at scoring time, and that are not
        skipped, count. Returns None when no decision counts (nothing to learn from yet).
        The gradient reaches ``criterion_logits`` only: prototypes are buffers.
        """
        logits = self.attention_logits(step, category)  # (B, A)
        action = check.check_index(action, "action", len(self.action_names), logits.shape[0], logits.device,
                                   self.action_names)
        skip = check.check_flags(skip, "skip", logits.shape[0], logits.device)
        usable = torch.isfinite(logits.gather(1, action.unsqueeze(1))).squeeze(1)
        if skip is not None:
            usable &= ~skip
        if not bool(usable.any()):
            return None
        return nnf.cross_entropy(logits[usable], action[usable])

    # -- learning ---------------------------------------------------------------------
    def _prequential(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                     skip: Tensor, source_ids: Tensor | None = None, alpha: Tensor | None = None) -> StreamStep:
        if self.centroids.dtype != torch.float32:
            raise TypeError(f"JudgmentMemory learns in float32 (the engine's precision), but its centroids are "
                            f"{self.centroids.dtype}; keep the memory in float32 (scoring works in any dtype)")
        device = self.centroids.device
        # the kernel works on private CPU copies: a failure can never leave a half-updated memory
        slots = self._slots
        centroids = slots(self.centroids.detach().to("cpu", torch.float32, copy=True))
        initialized = slots(self.initialized.to("cpu", copy=True))
        counts = slots(self.counts.to("cpu", copy=True))
        wins = self._wins().to("cpu", copy=True)
        if alpha is None:  # a replay passes the attention that was in force when the decisions were learned
            alpha = self.criterion_attention().detach()
        alpha = alpha.to("cpu", torch.float32).contiguous()
        category, action, skip = (t.to("cpu").contiguous() for t in (category, action, skip))
        confirmed = None if confirmed is None else confirmed.to("cpu").contiguous()
        adaptive = None
        if self.drift_mode == "adaptive":
            buffers = [t.to("cpu", copy=True) for t in self._adaptive_buffers()]
            shadow, statistic, evidence, following, weight, run_mean, run_count, tracking, lead = buffers
            adaptive = engine.AdaptiveState(slots(shadow), statistic, evidence, slots(following), slots(weight),
                                            slots(run_mean), slots(run_count), slots(tracking), lead)
        step, promotions = engine.judgment_prequential(centroids, initialized, counts, wins, alpha,
                                                       x.detach().to("cpu", torch.float32).contiguous(), category,
                                                       action, confirmed, skip, self.rule, self.backend, adaptive)
        # the whole batch lands at once, after the loop: a failure above leaves the memory as it was
        self.centroids.copy_(centroids.view_as(self.centroids))
        self.initialized.copy_(initialized.view_as(self.initialized))
        self.counts.copy_(counts.view_as(self.counts))
        if self.prototypes > 1:
            self.wins.copy_(wins)
        if adaptive is not None:
            for mine, learned in zip(self._adaptive_buffers(), adaptive, strict=True):
                mine.copy_(learned.view_as(mine))
        first = int(self.num_decisions)
        self.num_decisions += x.shape[0]
        if not self._replaying:  # a replay is one mutation, counted by undo_ / forget_
            self._updates += x.shape[0]
        self._record_gate_events(first, category, action, step.events)
        if promotions.step.numel():
            self._promotion_chunks.append(promotions._replace(step=promotions.step + first))
        self._log_decisions(first, x, category, action, confirmed, step, source_ids)
        return step if device.type == "cpu" else step.to(device)

    # -- the decision log: trace, undo, forget ------------------------------------------------
    def _buffer_state(self) -> dict[str, Tensor]:
        return {name: buffer.detach().to("cpu", copy=True) for name, buffer in self.named_buffers()}

    def _log_decisions(self, first: int, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                       step: StreamStep, source_ids: Tensor | None) -> None:
        if self._log.max_events == 0:  # the log is off
            return
        n, events = x.shape[0], step.events
        seq = torch.arange(first, first + n)
        used = (step.output.action == action) if confirmed is None else confirmed  # the flag the rule used
        assert step.before is not None
        if source_ids is None:  # never reused, even after a forget_ shifts the sequence numbers
            source_ids = torch.arange(self._log.next_source, self._log.next_source + n)
        source_ids = source_ids.to("cpu").long()
        if not self._replaying:  # a replay learns logged ids again: nothing new to count
            self._log.next_source = max(self._log.next_source, int(source_ids.max()) + 1)
        logits = self._replay_logits if self._replay_logits is not None else self.criterion_logits
        self._log.append({  # copies: the caller may change the step's tensors in place
            "seq": seq, "source_id": source_ids.clone(), "category": category.clone(), "action": action.clone(),
            "confirmed": used.clone(), "skipped": events.skipped.clone(), "eta": events.eta.clone(),
            "displacement": events.displacement.clone(), "gated": events.gated.clone(),
            "initialized": events.initialized.clone(), "prototype": events.prototype.clone(),
            "x": x.detach().to("cpu", torch.float32, copy=True), "before": step.before.clone(),
            "logits": logits.detach().to("cpu", copy=True)})
        limit = self._log.max_events
        if limit is not None and len(self._log) > limit and not self._replaying:
            self._fold(len(self._log) - limit // 2)

    @property
    def version(self) -> int:
        """The update counter: +1 for every decision passed to ``prequential_`` / ``learn_``
        (learned or skipped) and +1 for every ``undo_`` / ``forget_``: it only grows as the
        memory learns and forgets, and with :func:`gae.trace.state_hash` (the content of the
        buffers and the attention) it names the state an answer was computed on. It travels
        in the ``state_dict``: loading a state brings back the counter that state had."""
        return self._updates

    @property
    def decision_log(self) -> audit.DecisionLog:
        """The :class:`~gae.audit.DecisionLog`: every decision learned since its base state."""
        return self._log

    _EVENT_LOGS = {"gate": GateLog, "promotion": PromotionLog, "recycle": RecycleLog}

    def _logs_state(self) -> dict[str, list[dict[str, Tensor]]]:
        """The gate, promotion and recycle logs as plain dicts of tensors (``weights_only`` loads them)."""
        return {name: [dict(chunk._asdict()) for chunk in getattr(self, f"_{name}_chunks")]
                for name in self._EVENT_LOGS}

    def _set_logs(self, logs: dict[str, list[dict[str, Tensor]]]) -> None:
        for name, log_type in self._EVENT_LOGS.items():
            setattr(self, f"_{name}_chunks", [log_type(**chunk) for chunk in logs.get(name, [])])

    def _replay(self, keep: Tensor | None = None, stop: int | None = None) -> None:
        """Rebuild the state from the log's base by re-learning its decisions (the first ``stop``,
        those in ``keep``) with the fast engine, call by call, each with the attention and the
        confirmed flags it had. All of it or nothing: a failure restores the state as it was."""
        learned = int(self._log.base.get("num_decisions", torch.zeros(()))) + len(self._log)
        if learned != int(self.num_decisions):
            raise ValueError(f"the decision log does not cover this memory's state: its base and log account for "
                             f"{learned} decisions but the memory has learned {int(self.num_decisions)} (a state "
                             "loaded without its log, or learned with max_log_events=0); it cannot undo or forget")
        saved = (self._buffer_state(), self._logs_state(), list(self._log.chunks))
        chunks, self._log.chunks = self._log.chunks, []
        self._replaying = True  # the replayed calls are logged again, but never folded while replaying
        try:
            for name, buffer in self.named_buffers():
                buffer.copy_(self._log.base[name].to(buffer.device))
            self._set_logs(self._log.base_logs)
            position = 0
            batch: list[dict[str, Tensor]] = []  # consecutive calls with the same attention: one engine call
            for chunk in chunks:
                n = int(chunk["seq"].shape[0])
                rows = torch.arange(position, position + n)
                chosen = torch.ones(n, dtype=torch.bool) if stop is None else rows < stop
                if keep is not None:
                    chosen &= keep[position:position + n]
                position += n
                if not bool(chosen.any()):
                    continue
                if batch and not torch.equal(batch[-1]["logits"], chunk["logits"]):
                    self._relearn(batch)
                    batch = []
                batch.append({**{name: chunk[name][chosen] for name in ("x", "category", "action", "confirmed",
                                                                          "skipped", "source_id")},
                              "logits": chunk["logits"]})
            if batch:
                self._relearn(batch)
        except BaseException:
            buffers, logs, self._log.chunks = saved
            for name, buffer in self.named_buffers():
                buffer.copy_(buffers[name].to(buffer.device))
            self._set_logs(logs)
            raise
        finally:
            self._replaying = False

    def _relearn(self, calls: list[dict[str, Tensor]]) -> None:
        """Learn logged decisions again, in one engine call, with the attention they had."""
        device = self.centroids.device
        columns = {name: torch.cat([call[name] for call in calls]).to(device)
                   for name in ("x", "category", "action", "confirmed", "skipped", "source_id")}
        logits = calls[0]["logits"]
        self._replay_logits = logits
        try:
            self._prequential(columns["x"], columns["category"], columns["action"], columns["confirmed"],
                              columns["skipped"], columns["source_id"], F.criterion_attention(logits))
        finally:
            self._replay_logits = None

    def _fold(self, count: int) -> None:
        """Fold the oldest whole calls holding at least ``count`` decisions into the base."""
        sizes = [int(chunk["seq"].shape[0]) for chunk in self._log.chunks]
        folded, calls = 0, 0
        while calls < len(sizes) and folded < count:
            folded += sizes[calls]
            calls += 1
        current = (self._buffer_state(), self._logs_state(), list(self._log.chunks))
        self._replay(stop=folded)  # the state right after the folded decisions
        self._log.base, self._log.base_logs = self._buffer_state(), self._logs_state()
        buffers, logs, chunks = current
        for name, buffer in self.named_buffers():
            buffer.copy_(buffers[name].to(buffer.device))
        self._set_logs(logs)
        self._log.chunks = chunks[calls:]

    def undo_(self, n: int = 1) -> None:
        """Revert the last ``n`` applied decisions exactly: the buffers, the event logs and the
        attention logits are bit for bit what they were before them (skipped decisions among
        them go too; an optimizer's own state, such as Adam's moments, is the caller's to
        restore). Raises ValueError, changing nothing, when the log holds fewer
        (``max_log_events`` folds older decisions into its base)."""
        n = check.check_int("n", n, low=1)
        applied = (~self._log.events()["skipped"]).nonzero().squeeze(-1)
        if n > applied.numel():
            folded = " (older decisions were folded into the log's base by max_log_events)" \
                if self._log.max_events is not None else ""
            raise ValueError(f"undo_({n}) reaches before the start of the decision log: it holds "
                             f"{applied.numel()} applied decisions{folded}")
        stop = int(applied[-n])
        sizes = torch.tensor([int(chunk["seq"].shape[0]) for chunk in self._log.chunks])
        call = int(torch.searchsorted(torch.cumsum(sizes, 0), stop, right=True))
        logits = self._log.chunks[call]["logits"]  # the attention in force when the first undone decision came
        self._replay(stop=stop)
        with torch.no_grad():
            self.criterion_logits.copy_(logits.to(self.criterion_logits.device))
        self._updates += 1

    def forget_(self, source_ids: Sequence[int] | Tensor) -> int:
        """Remove every decision with these source ids, as if they had never been learned.

        The state is rebuilt from the log's base by re-learning the other decisions in order
        with the fast engine: gating, first touches, spawns and promotions are recomputed;
        the recorded confirmed/override flags are facts and are kept. The result equals a
        fresh memory fed the stream without them (to float rounding; the attention, a
        parameter trained outside the memory, is not unlearned). Sequence numbers after the
        first forgotten decision shift down. Returns how many decisions were removed.

        Raises:
            ValueError: an id is not in the log (never learned, or folded into its base by
                ``max_log_events``), or ``source_ids`` is not a list of integers.
        """
        try:
            wanted = torch.as_tensor(source_ids).reshape(-1).cpu()
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"source_ids must be a non-empty list of integers, got {source_ids!r}") from None
        if wanted.numel() == 0 or wanted.is_floating_point() or wanted.dtype == torch.bool or wanted.is_complex():
            raise ValueError(f"source_ids must be a non-empty list of integers, got {source_ids!r}")
        logged = self._log.events()["source_id"]
        missing = wanted[~torch.isin(wanted, logged)]
        if missing.numel():
            raise ValueError(f"source_ids not in the decision log: {missing.tolist()[:10]}"
                             + (" (older decisions may have been folded into its base by max_log_events)"
                                if self._log.max_events is not None else ""))
        keep = ~torch.isin(logged, wanted)
        self._replay(keep=keep)
        self._updates += 1
        return int((~keep).sum())

    def trace(self, category: str | int, action: str | int, top: int = 10, prototype: int = 0) -> audit.Trace:
        """The decisions that moved prototype ``prototype`` of (``category``, ``action``) most,
        with their current weight in it (heaviest first, at most ``top``).

        A decision's weight is the eta of its update times ``1 - eta`` of every later update of
        the same prototype; the weights of all its decisions sum to 1 once it exists. Only the
        prototype's own updates count: a promotion (``drift_mode='adaptive'``) or a push
        (``push_rate``) moves it without being one of them.
        """
        c = self._category_index(category)
        a = check.lookup("action", action, self.action_names)
        top = check.check_int("top", top, low=1)
        prototype = check.check_int("prototype", prototype, low=0)
        if prototype >= self.prototypes:
            raise ValueError(f"prototype must be in [0, {self.prototypes}), got {prototype}")
        events = self._log.events()
        mine = ((events["category"] == c) & (events["action"] == a) & ~events["skipped"]
                & (events["prototype"] == prototype)).nonzero().squeeze(-1)
        eta = events["eta"][mine].double()
        # weight_i = eta_i * prod_{j > i} (1 - eta_j): a reversed cumulative product
        keep_after = torch.cat([torch.flip(torch.cumprod(torch.flip(1.0 - eta, [0]), 0), [0])[1:],
                                torch.ones(min(1, eta.numel()), dtype=torch.float64)])
        weights = eta * keep_after
        order = torch.argsort(weights, descending=True, stable=True)[:top]
        return audit.Trace(events["source_id"][mine][order], weights[order].float(), events["seq"][mine][order])

    def _adaptive_buffers(self) -> tuple[Tensor, ...]:
        """The buffers of ``drift_mode='adaptive'``, in the order of :class:`gae.engine.AdaptiveState`."""
        return (self.shadow_centroids, self.promotion_statistic, self.promotion_evidence, self.following,
                self.follow_weight, self.run_centroids, self.run_counts, self.tracking_centroids, self.tracking_lead)

    def _record_gate_events(self, first: int, category: Tensor, action: Tensor, events: LearnEvents) -> None:
        where = events.gated.nonzero().squeeze(-1)
        if where.numel():
            self._gate_chunks.append(GateLog(where + first, category[where], action[where],
                                             events.displacement[where], events.eta[where]))
        where = events.recycled.nonzero().squeeze(-1)
        if where.numel():
            self._recycle_chunks.append(RecycleLog(where + first, category[where], action[where],
                                                   events.prototype[where], events.displacement[where]))
        for name, log_type in self._EVENT_LOGS.items():  # a few small tensors a call add up: join them
            chunks = getattr(self, f"_{name}_chunks")
            if len(chunks) >= audit.JOIN_CALLS:
                self._joined(chunks, log_type, ())

    @staticmethod
    def _joined(chunks: list, log_type: Any, floats: tuple[str, ...]) -> Any:
        """One log from the chunks appended batch by batch (joined once, in place); empty when none."""
        if not chunks:
            return log_type(*(torch.zeros(0) if name in floats else torch.zeros(0, dtype=torch.int64)
                              for name in log_type._fields))
        if len(chunks) > 1:
            chunks[:] = [log_type(*(torch.cat(parts) for parts in zip(*chunks, strict=True)))]
        return chunks[0]

    @property
    def gate_log(self) -> GateLog:
        """Every drift-gate event so far, in stream order (1-D CPU tensors)."""
        return self._joined(self._gate_chunks, GateLog, ("displacement", "eta"))

    @property
    def promotion_log(self) -> PromotionLog:
        """Every promotion of the change test so far (``drift_mode='adaptive'``), in stream order."""
        return self._joined(self._promotion_chunks, PromotionLog, ("statistic", "shift"))

    @property
    def recycle_log(self) -> RecycleLog:
        """Every recycled prototype so far (``prototypes > 1``), in stream order."""
        return self._joined(self._recycle_chunks, RecycleLog, ("displacement",))

    def gate_records(self) -> list[dict[str, Any]]:
        """Every learning event, in stream order, as dicts with names: the drift gate's damped steps
        (``event='gated'``: ``action``, ``disp``, ``eta``), in ``drift_mode='adaptive'`` the
        promotions with their evidence (``event='promoted'``: ``statistic``, ``shadow_right``,
        ``main_right``, ``shift``), and with ``prototypes > 1`` the recycled prototypes
        (``event='recycled'``: ``action``, ``prototype``, ``disp``)."""
        log = self.gate_log
        records = [{"step": int(s), "event": "gated", "category": self.category_names[int(c)],
                    "action": self.action_names[int(a)], "disp": float(d), "eta": float(e)}
                   for s, c, a, d, e in zip(log.step, log.category, log.action, log.displacement, log.eta,
                                            strict=True)]
        records += self.promotion_records()
        recycled = self.recycle_log
        records += [{"step": int(s), "event": "recycled", "category": self.category_names[int(c)],
                     "action": self.action_names[int(a)], "prototype": int(p), "disp": float(d)}
                    for s, c, a, p, d in zip(*recycled, strict=True)]
        return sorted(records, key=lambda record: (record["step"], record["event"]))

    def promotion_records(self, last: int | None = None) -> list[dict[str, Any]]:
        """The promotions of :meth:`gate_records` alone (the ``last`` ones, or all), without
        building the records of every gate event."""
        promotions = self.promotion_log
        if last is not None:
            promotions = type(promotions)(*(field[len(field) - min(last, len(field)):] for field in promotions))
        return [{"step": int(s), "event": "promoted", "category": self.category_names[int(c)],
                 "statistic": float(t), "shadow_right": int(w), "main_right": int(m), "shift": float(d)}
                for s, c, t, w, m, d in zip(*promotions, strict=True)]

    # -- inspection and state -----------------------------------------------------------
    def extra_repr(self) -> str:
        return (f"categories={len(self.category_names)}, actions={len(self.action_names)}, "
                f"factors={self.n_factors}, tau={self.tau}, eta_confirmed={self.eta_confirmed}, "
                f"eta_override={self.eta_override}, drift_threshold={self.drift_threshold}, "
                f"gate_damping={self.gate_damping}, clip={self.clip}, push_rate={self.push_rate}, "
                f"min_confidence={self.min_confidence}, drift_mode={self.drift_mode!r}"
                + (f", prototypes={self.prototypes}, spawn_threshold={self.spawn_threshold}, "
                   f"spawn_support={self.spawn_support}" if self.prototypes > 1 else "")
                + (f", shadow_eta={self.shadow_eta}, promotion_threshold={self.promotion_threshold:.4g}, "
                   f"tracking_eta={self.tracking_eta}" if self.drift_mode == "adaptive" else ""))

    def get_extra_state(self) -> dict[str, Any]:
        state = self._names_state()
        state["drift_mode"] = self.drift_mode
        if self.drift_mode == "adaptive":
            state["adaptive_format"] = ADAPTIVE_FORMAT
        state["prototypes"] = self.prototypes
        state["updates"] = self._updates
        state["decision_log"] = self._log.state()
        state["gate_log"] = dict(self.gate_log._asdict())
        if self.drift_mode == "adaptive":
            state["promotion_log"] = dict(self.promotion_log._asdict())
        if self.prototypes > 1:
            state["recycle_log"] = dict(self.recycle_log._asdict())
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        log = state.get("gate_log")
        self._gate_chunks = [GateLog(**{k: v.cpu() for k, v in log.items()})] if log else []
        promotions = state.get("promotion_log")
        self._promotion_chunks = [PromotionLog(**{k: v.cpu() for k, v in promotions.items()})] if promotions else []
        recycled = state.get("recycle_log")
        self._recycle_chunks = [RecycleLog(**{k: v.cpu() for k, v in recycled.items()})] if recycled else []
        # a state saved before the counter existed: every decision it learned was one update
        self._updates = int(state.get("updates", int(self.num_decisions)))
        max_events = self._log.max_events  # this memory's setting, not the saved one
        if "decision_log" in state and max_events != 0:
            self._log = audit.DecisionLog.from_state(state["decision_log"])
        else:  # a state saved before the log existed: the log starts from the loaded state
            self._log = audit.DecisionLog(max_events)
            self._log.base = self._buffer_state()
        self._log.max_events = max_events

    def _check_names_state(self, state: dict[str, Any]) -> None:
        super()._check_names_state(state)
        saved = state.get("drift_mode", "seed")
        if saved != self.drift_mode:
            raise ValueError(f"state_dict was saved with drift_mode={saved!r} but this memory has "
                             f"drift_mode={self.drift_mode!r}; build the memory with drift_mode={saved!r} to load it")
        if saved == "adaptive" and state.get("adaptive_format", 1) != ADAPTIVE_FORMAT:
            raise ValueError(f"state_dict was saved by an earlier drift_mode='adaptive' (format "
                             f"{state.get('adaptive_format', 1)}, this memory has {ADAPTIVE_FORMAT}: the following "
                             f"state, the run means and the tracking prototypes changed); it cannot be loaded, "
                             f"retrain the memory from its decision stream")
        saved = state.get("prototypes", 1)
        if saved != self.prototypes:
            raise ValueError(f"state_dict was saved with prototypes={saved} but this memory has "
                             f"prototypes={self.prototypes}; build the memory with prototypes={saved} to load it")
