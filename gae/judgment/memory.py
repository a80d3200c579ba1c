"""JudgmentMemory: learned prototypes per (category, action) and learned criterion attention."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor, nn

from gae import validation as check
from gae.judgment import engine, judged, judges, kernels, online, primitives, rule
from gae.judgment import state as layout
from gae.judgment import trust as trust_rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.decision_log import DecisionLog, Trace
from gae.judgment.explain import Explanation
from gae.judgment.explain import explain as explain_batch
from gae.judgment.history import RELEARNED, History, buffer_state
from gae.models.base import INCORRECT, DecisionMemory
from gae.moved import refuse_serving
from gae.types import Assessment, CaseState, GateLog, LearnEvents, MemoryOutput, PromotionLog, RecycleLog, StreamStep
from gae.validation import Names


class JudgmentMemory(DecisionMemory):
    r"""Centroid judgment over verified decisions, scoring in O(A K) with no retrieval.

    A decision is a factor vector :math:`x \in \mathbb{R}^K` in a category :math:`c`. The
    memory keeps prototypes :math:`\mu_{c,a}` per category and action and scores

    .. math::
        \alpha_c = K\,\mathrm{softmax}(\ell_c), \qquad
        d_a = \sum_k \alpha_{c,k}\,(x_k - \mu_{c,a,k})^2, \qquad
        p = \mathrm{softmax}(-d / \tau)

    over the actions that have a prototype. A category without any prototype abstains
    (action -1, confidence 0, probabilities all zero). Without a ``config`` the memory is
    :meth:`JudgmentConfig.recommended` (learning vector quantization, several prototypes, judges:
    ``docs/lvq.md``, ``docs/judges.md``); ``config=JudgmentConfig.seed()`` is the original
    design, whose learning of a verified action :math:`a` (in stream order, outside autograd) is
    the gated rule:

    .. math::
        \eta = \begin{cases} \eta_{confirmed} & \text{recommendation was } a \\
                              \eta_{override} & \text{otherwise} \end{cases},\quad
        \eta \leftarrow \eta \cdot \gamma \text{ if } \lVert x - \mu_{c,a} \rVert_2 > \theta,\quad
        \mu_{c,a} \leftarrow \mu_{c,a} + \eta\,(x - \mu_{c,a})

    The first verified decision of a cell initialises its prototype to :math:`x`; uncertain
    outcomes (``skip``) change nothing; every gated step is appended to :attr:`gate_log`. The
    whole rule, every mode, as maths and as the torch reference, is :mod:`gae.judgment.rule`.

    ``drift_mode='adaptive'`` adds a per-category change test that tells a sustained drift from
    outliers, promotes the prototypes to the means since the change point and follows them as
    running means, and scores with tracking prototypes while they predict better
    (``docs/drift.md``). ``prototypes=P`` keeps up to P prototypes per category and action,
    spawned where a decision lies farther than ``spawn_threshold`` from all of them and recycled
    by fewest recent wins (``docs/prototypes.md``). :meth:`JudgmentConfig.seed` is the original
    rule, bit for bit. The attention logits :math:`\ell` are the only parameters;
    they are trained by gradient (:meth:`attention_loss`), while the prototypes are buffers.

    The audit trail (:attr:`decision_log`, the gate, promotion and recycle logs behind ``trace``,
    ``undo_`` and ``forget_``) is kept whole by default, about ``53 + 8 K`` bytes a decision. On
    an endless stream bound it with ``max_log_events=N``: every log then covers the last N to N/2
    decisions, and the state stays flat (the river and scikit-learn estimators bound it by default).

    What the memory holds besides its buffers is in members: its :class:`~gae.judgment.history.History`
    (``history``: the decision log and the event logs behind ``trace``, ``undo_`` and ``forget_``),
    the judges' single-decision views and the prototypes' (:mod:`gae.judgment.online`). Serving it
    to agents (decide / verify, act or refer, a durable ledger) is :class:`~gae.Decider`'s.

    Thread safety: one memory may be shared by many threads (:class:`~gae.DecisionMemory` says
    how). Not covered: a ``forward`` traced by ``torch.compile``, pickling while another thread
    learns, and an optimizer stepping ``criterion_logits`` while other threads learn.

    Args:
        categories: number of categories, or their names.
        actions: number of actions, or their names.
        factors: number of criteria (factors), or their names.
        config: the :class:`~gae.JudgmentConfig` (every option, documented there). Default:
            :meth:`JudgmentConfig.recommended`, the best configuration measured;
            ``config=JudgmentConfig.seed()`` is the original design.
        grow: ``learn_one`` adds an action or category name it has not met
            (:meth:`add_actions_`, :meth:`add_categories_`). Default: False.
        **overrides: options to change from ``config`` (from the recommended one when ``config``
            is not given): ``tau=0.2``, ``prototypes=8``, ...; the seed rule's
            ``drift_mode='adaptive'`` goes with ``config=JudgmentConfig.seed()``.

    Shape:
        - x: (B, K) float factors; category, action: (B,) integer indices.
        - Output: :class:`~gae.types.MemoryOutput` with (B, A) logits and probs, (B,) action
          and confidence.

    Attributes:
        config: the :class:`~gae.JudgmentConfig` in force.
        criterion_logits: Parameter (C, K), attention logits, zero at initialisation.
        centroids: buffer (C, A, P, K) float32, the prototypes (P = ``config.prototypes``).
        initialized: buffer (C, A, P) bool, the slot holds a prototype.
        counts: buffer (C, A, P) int64, updates applied to each prototype since its slot was filled.
        wins: buffer (C, A, P) float32, each prototype's recent wins (empty when P = 1).
        num_decisions: buffer () int64, decisions seen (the sequence number of the next one).
        adaptive state: ``shadow_centroids``, ``promotion_statistic``, ``promotion_evidence``, ``following``,
            ``follow_weight``, ``run_centroids``, ``run_counts``, ``tracking_centroids``, ``tracking_lead``:
            the buffers of ``drift_mode='adaptive'`` (empty otherwise); :mod:`gae.judgment.state` has the layout.

    Examples::

        >>> memory = JudgmentMemory(["invoice", "refund"], ["approve", "reject"], 3)
        >>> memory.config == JudgmentConfig.recommended()
        True
        >>> memory.learn_one([0.9, 0.1, 0.5], "approve", "invoice")["initialized"]
        True
        >>> memory.learn_one([0.1, 0.9, 0.5], "reject", "invoice")["initialized"]
        True
        >>> memory.score_one([0.8, 0.2, 0.5], "invoice")[0]
        'approve'
        >>> memory.score_one([0.8, 0.2, 0.5], "refund")
        (None, 0.0)
        >>> JudgmentMemory(2, 2, 3, tau=0.2).config.tau  # the recommended config, tau changed
        0.2
        >>> JudgmentMemory(2, 2, 3, config=JudgmentConfig.seed(), drift_mode="adaptive").config.drift_mode
        'adaptive'
    """

    _version = layout.VERSION
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
    input_counts: Tensor
    input_means: Tensor
    input_variances: Tensor
    relevance_logits: Tensor
    trust_weights: Tensor

    def __init__(self, categories: Names, actions: Names, factors: Names, config: JudgmentConfig | None = None,
                 *, grow: bool = False, **overrides: Any) -> None:
        refuse_serving(type(self).__name__, overrides)
        super().__init__()
        if config is not None and not isinstance(config, JudgmentConfig):
            raise TypeError(f"config must be a JudgmentConfig or None, got {type(config).__name__}")
        default = config is None
        config = JudgmentConfig.recommended() if config is None else config
        try:
            self._config = config.replace(**overrides) if overrides else config
        except ValueError as error:
            if not default:
                raise
            raise ValueError(f"{error} (without config=, the options change JudgmentConfig.recommended(); "
                             "config=JudgmentConfig.seed() starts from the seed rule)") from None
        self._inspects = _inspects(self._config)  # (fixed for the memory's life, read per decide)
        self.grow = bool(grow)
        self._set_category_names(check.resolve_names("categories", categories))
        self._set_action_names(check.resolve_names("actions", actions))
        self.factor_names = check.resolve_names("factors", factors)
        self.n_factors = len(self.factor_names)
        self._options = kernels.Options.of(self._config)
        self.criterion_logits = nn.Parameter(torch.zeros(len(self.category_names), self.n_factors))
        layout.register(self, len(self.category_names), len(self.action_names), self.n_factors, self._config)
        self.history = History(self._config.log.max_events, buffer_state(self))
        self._updates = 0  # the version counter: see ``version``
        self._host = online.HostState()  # the views score_one and learn_one work on (gae/judgment/online.py)
        self._judge_host = judged.JudgeHost(self._config)  # and those of the judges (gae/judgment/judged.py)

    @property
    def config(self) -> JudgmentConfig:
        """The :class:`~gae.JudgmentConfig` in force (immutable; build a new memory to change it)."""
        return self._config

    def state(self) -> layout.JudgmentState:
        """The learned buffers as a :class:`~gae.judgment.state.JudgmentState` (the tensors themselves)."""
        return layout.JudgmentState(*(cast(Tensor, self._buffers[name]) for name in layout.JudgmentState._fields))

    def scoring_mask(self) -> Tensor:
        """(C, A, P) bool: the prototypes that take part in scoring (:func:`gae.judgment.rule.scoring_mask`)."""
        return rule.scoring_mask(self.initialized, self.wins, self._config.slots.spawn_support)

    def scoring_centroids(self) -> Tensor:
        """(C, A, P, K) what each category scores with: its prototypes, or, in ``drift_mode='adaptive'``,
        its tracking prototypes while they lead (``tracking_lead > 0``)."""
        return rule.scoring_estimates(self.state(), self._config)

    def criterion_attention(self) -> Tensor:
        """(C, K) attention weights ``K * softmax(criterion_logits)``; all ones at initialisation."""
        return rule.attention(self.criterion_logits)

    def relevances(self) -> Tensor:
        """(C, K) the criterion relevances ``learning='lvq'`` learns online (GRLVQ), each row summing
        to 1 (uniform until learned); with the gated rule, uniform (the rule has none)."""
        if self._config.learning != "lvq":
            return self.criterion_logits.detach().new_full(self.criterion_logits.shape, 1.0 / self.n_factors)
        return rule.relevances(self.relevance_logits)

    def metric(self) -> Tensor:
        """(C, K) the weights of the scoring distance (:func:`gae.judgment.rule.metric`): the
        attention with the gated rule; with ``learning='lvq'`` the attention times the relevances
        over each category's running variance. Differentiable in ``criterion_logits``."""
        return rule.metric(self.criterion_attention(), self.state(), self._config)

    # -- scoring ----------------------------------------------------------------------
    def forward(self, x: Tensor, category: Tensor, *, out: MemoryOutput | None = None) -> MemoryOutput:
        """Score a batch against the current prototypes. No side effects, but on ``out``.

        Differentiable in ``x`` and ``criterion_logits``. When no gradient is needed
        (``torch.no_grad()`` or frozen attention) on CPU, a compiled kernel computes the
        same numbers without building the (B, A, P, K) intermediate.

        ``out``: a :class:`~gae.types.MemoryOutput` to write the result into and return, of
        contiguous (B, A) logits and probs, (B,) int64 action and (B,) confidence in the memory's
        dtype and on its device, not overlapping ``x``; only where no gradient is needed. Scoring
        batch after batch into the same ``out`` saves the first touch of new memory, a large part
        of a call at B = 1M when the allocator hands out new pages (docs/scoring_speed.md).
        """
        if torch.compiler.is_compiling():  # a traced graph reads the state it was traced on
            return self._forward(x, category, out)
        with self._lock:  # the state of one learning call or the next, never half of one
            x, category = self._check_query(x, category)
            return self._forward(x, category, out)

    def _forward(self, x: Tensor, category: Tensor, out: MemoryOutput | None) -> MemoryOutput:
        alpha = self.metric()  # (C, K)
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.criterion_logits.requires_grad)
        if out is not None:
            check.check_out(out, x, needs_grad, len(self.action_names), self._float_dtype, self._device)
        compiled = (x.device.type == "cpu" and self.centroids.dtype == torch.float32 and not needs_grad
                    and not torch.compiler.is_compiling())
        if self._config.judges:
            result = self._score_judged(x, category, alpha, compiled)[0]
        elif compiled:
            return self._score_compiled(x, category, alpha, out)
        else:
            result = rule.score(x, category, self.scoring_centroids(), self.scoring_mask(), alpha, self._config)[0]
        if out is None:
            return result
        for target, value in zip(out, result, strict=True):
            target.copy_(value)
        return out

    def _score_compiled(self, x: Tensor, category: Tensor, alpha: Tensor,
                        out: MemoryOutput | None = None) -> MemoryOutput:
        n, n_actions = x.shape[0], len(self.action_names)
        if out is None:
            out = MemoryOutput(torch.empty(n, n_actions), torch.empty(n, n_actions),
                               torch.empty(n, dtype=torch.int64), torch.empty(n))
        kernels.score(x.detach().float().contiguous().numpy(), category.contiguous().numpy(),
                      self.scoring_centroids().contiguous().numpy(), self.initialized.numpy(), self.wins.numpy(),
                      alpha.detach().float().contiguous().numpy(), self._options, tuple(t.numpy() for t in out))
        return out

    def _score_judged(self, x: Tensor, category: Tensor, alpha: Tensor, compiled: bool) -> tuple[MemoryOutput, Tensor]:
        """The judges' mixture (:mod:`gae.judgment.judged`) and the (B, J, A) votes, the prototypes'
        own probabilities the first judge's."""
        own = (self._score_compiled(x, category, alpha) if compiled else
               rule.score(x, category, self.scoring_centroids(), self.scoring_mask(), alpha, self._config)[0])
        buffers = cast(dict, self._buffers)
        if compiled:
            result, vote = judged.score(buffers, self._config, x.detach().cpu(), category.cpu(), own.probs, True)
            return MemoryOutput(*(t.to(x.device) for t in result)), vote.to(x.device)
        return judged.score(buffers, self._config, x, category, own.probs, False)

    def nearest_prototype(self, x: Tensor, category: Tensor) -> Tensor:
        """(B, A) int64: the prototype slot each action scores ``x`` with (its nearest scoring
        prototype), -1 where the action has none. Always 0 or -1 when P = 1."""
        with self._lock, torch.no_grad():
            x, category = self._check_query(x, category)
            logits = rule.score(x, category, self.scoring_centroids(), self.scoring_mask(), self.metric(),
                                self._config)[2]
        return torch.where(torch.isfinite(logits).any(-1), logits.argmax(-1), -1)

    def explain(self, factors: Tensor | Sequence[float] | np.ndarray,
                category: Tensor | str | int = "general") -> Explanation:
        """Every number behind the memory's recommendation for a batch of decisions, or one.

        Args:
            factors: (B, K) tensor with ``category`` a (B,) tensor of indices, or one decision's
                K factors with ``category`` a name or index.
            category: see ``factors``.

        Returns:
            an :class:`~gae.judgment.explain.Explanation`: probabilities, the distance to each
            action's nearest prototype and each criterion's contribution to it, the attention,
            the margin, and whether learning the decision would be gated (or start a
            prototype). ``print()`` it for a table with the memory's names. Nothing is learned.

        Examples::

            >>> memory = JudgmentMemory(["invoice"], ["approve", "reject"], ["amount", "age"],
            ...                         config=JudgmentConfig.seed())  # distances in the factors' own units
            >>> _ = memory.learn_one([0.9, 0.1], "approve", "invoice")
            >>> _ = memory.learn_one([0.1, 0.9], "reject", "invoice")
            >>> why = memory.explain([0.8, 0.2], "invoice")
            >>> why.action_names[int(why.action[0])], round(float(why.distance[0, 0]), 3)
            ('approve', 0.02)
            >>> bool(torch.allclose(why.contributions.sum(-1), why.distance))
            True
        """
        with self._lock:
            return self._explain(factors, category)

    def _explain(self, factors: Any, category: Any) -> Explanation:
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
            explained = explain_batch(self.state(), self._config, self.criterion_attention(), x, category_t,
                                      (self.category_names, self.action_names, self.factor_names))
            if not self._config.judges:
                return explained
            # the mixture as the recommendation, each judge's vote and the category's trust in it
            mixed, vote = judged.score(cast(dict, self._buffers), self._config, x, category_t, explained.probs, False)
            return dataclasses.replace(explained, action=mixed.action, confidence=mixed.confidence,
                                       probs=mixed.probs, judge_names=self.judge_names(), votes=vote,
                                       trust=trust_rule.weights_of(self.trust_weights)[category_t],
                                       thresholds=judged.thresholds(cast(dict, self._buffers), self._config, x,
                                                                    category_t, self.action_names,
                                                                    self.factor_names))

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
        distance = rule.weighted(step.sq_diff, self.criterion_attention()[category])
        return rule.slot_logits(distance, torch.isfinite(step.prototypes_output.logits), self._config.rule.tau)

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
    def _check_learnable(self) -> None:
        if cast(Tensor, self._buffers["centroids"]).dtype != torch.float32:  # (per decide: no __getattr__)
            raise TypeError(f"JudgmentMemory learns in float32 (the engine's precision), but its centroids are "
                            f"{self.centroids.dtype}; keep the memory in float32 (scoring works in any dtype)")

    def _prequential(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                     skip: Tensor, source_ids: Tensor | None = None, given: Tensor | None = None,
                     alpha: Tensor | None = None) -> StreamStep:
        self._check_learnable()
        if (x.shape[0] == 1 and source_ids is None and given is None and alpha is None and x.device.type == "cpu"
                and not self._config.judges):
            step = self._prequential_one(x, category, action, confirmed, skip)  # the single-decision path
            if step is not None:
                return step
        device = self.centroids.device
        if alpha is None:  # a replay passes the attention that was in force when the decisions were learned
            alpha = self.criterion_attention().detach()
        learned = engine.private_copy(self.state())  # a failure in the loop leaves the memory as it was
        category, action, skip = (t.to("cpu") for t in (category, action, skip))
        x = x.detach().to("cpu", torch.float32)
        if confirmed is not None:  # the flags the caller gave: all of them, or (a replay) those it records
            confirmed = confirmed.to("cpu")
            given = torch.ones_like(confirmed) if given is None else given.to("cpu")
        step, promotions = engine.prequential(learned, self._config, alpha.to(torch.float32), x, category, action,
                                              confirmed, skip, given=given, backend=self.backend)
        own_action = step.output.action
        judge_copies: dict[str, Tensor] = {}
        if self._config.judges:  # the judges and the trust, on private copies: their mixture answers
            judge_copies = judged.private_copy(self._buffers, self._config)
            mixed, vote = judged.prequential(judge_copies, self._config, x, category, action, skip,
                                             step.output.probs, self.backend)
            step = step._replace(output=mixed, votes=vote, own=step.output)
        engine.write_back(self.state(), learned)  # the whole batch lands at once
        for name, tensor in judge_copies.items():
            cast(Tensor, self._buffers[name]).copy_(tensor)
        first = int(self.num_decisions)
        self.num_decisions += x.shape[0]
        if not self.history.replaying:  # a replay is one mutation, counted by undo_ / forget_
            self._updates += x.shape[0]
        derived = own_action == action  # the prototypes' own recommendation was the verified action
        if confirmed is None or given is None:
            used, given = derived, torch.zeros_like(derived)
        else:
            used = torch.where(given, confirmed, derived)  # the flag the rule used
        self.history.record(self, self._relearn, first, x, category, action, used, given, step, promotions,
                            source_ids, self.criterion_logits)
        return step if device.type == "cpu" else step.to(device)

    def _relearn(self, columns: dict[str, Tensor], logits: Tensor) -> None:
        """Learn logged decisions again (a replay), with the attention logits they had; a derived
        confirmed flag is derived again from the replayed state's recommendation."""
        device = self.centroids.device
        x, category, action, confirmed, given, skipped, source_id = (columns[name].to(device) for name in RELEARNED)
        self._prequential(x, category, action, confirmed, skipped, source_id, given=given,
                          alpha=rule.attention(logits))

    # -- growing vocabularies -----------------------------------------------------------
    def _grow_state(self, new_categories: int, new_actions: int) -> None:
        """Every buffer, the attention and the decision log's base grown with zero-filled cells
        (nothing learned, uniform attention): the state a memory built with the grown names
        would have after the same decisions. +1 to :attr:`version`."""
        sizes = (len(self.category_names) + new_categories, len(self.action_names) + new_actions, self.n_factors)
        grown = layout.grown({name: cast(Tensor, tensor) for name, tensor in self._buffers.items()}, *sizes,
                             self._config)
        self.history.grow(*sizes, self._config)
        self._buffers.update(grown)
        self._drop_views()
        logits = self.criterion_logits
        if new_categories:  # the same Parameter object: build optimizers again (their state has the old shape)
            with torch.no_grad():
                logits.set_(cast(Any, torch.cat([logits, logits.new_zeros(new_categories, self.n_factors)])))
            if logits.grad is not None:
                logits.grad = torch.cat([logits.grad, logits.grad.new_zeros(new_categories, self.n_factors)])
        self._updates += 1

    # -- one decision at a time (gae/judgment/online.py) ----------------------------------
    def score_one(self, factors, category: str | int = "general") -> tuple[str | None, float]:
        """Score one decision: ``(action name or None when abstaining, confidence)``.

        On a CPU module this is one compiled call of a few microseconds on views of the
        memory's own buffers (:mod:`gae.judgment.online`); anything unusual (bad input, another
        device or dtype) goes through :meth:`forward`. With ``grow=True``, a category not met
        yet abstains. Holds the memory's lock: a score never sees half of a learning call.
        """
        lock = self._lock  # acquire() and release() cost half a `with` block, on every call
        lock.acquire()
        try:
            host = self._host.get(self._buffers, self._parameters, scoring=True)
            index = (self._category_positions.get(category) if category.__class__ is str
                     else self._category_position(category))
            if host is None or index is None:
                return super().score_one(factors, category)
            row = self._fast_row(factors)
            if row is None:
                return super().score_one(factors, category)  # the checks, with the full error message
            if self._config.judges:
                decided = self._judged_one(host, row, index)
                if decided is None:
                    return super().score_one(factors, category)
                return None if decided[0] < 0 else self._action_names[decided[0]], decided[1]
            score = host.score  # bound on the first score: then called here, a Python call less
            action, confidence = (host.score_row(row, index, self._options) if score is None
                                  else score(row, index, *host.score_unlimited))
            if action == kernels.NOT_FINITE:
                return super().score_one(factors, category)
            return None if action < 0 else self._action_names[action], confidence
        finally:
            lock.release()

    def assess_one(self, factors, category: str | int = "general", inspect: bool = False) -> Assessment:
        """One decision's :class:`~gae.types.Assessment` (see :meth:`DecisionMemory.assess_one`). On
        the single-decision path: ``score_one``'s kernel, which writes every action's probability
        (the recommended action's is its confidence, exactly; they agree with the batched
        forward's to float32 rounding), and with ``inspect`` :meth:`inspect_one` on the same views."""
        lock = self._lock
        lock.acquire()
        try:  # (views exist only of float32 buffers on the CPU: the memory can learn as it is)
            host = self._host.get(self._buffers, self._parameters, scoring=True)
            index = (self._category_positions.get(category) if category.__class__ is str
                     else self._category_position(category))
            row = None if host is None or index is None else self._fast_row(factors)
            if host is None or index is None or row is None:
                return super().assess_one(factors, category, inspect)
            if factors.__class__ is not list:
                row = row.copy()  # (the caller's own array, or a view of its tensor: what is kept must not change)
            if self._config.judges:  # the kernel refuses a factor past the learning limit (NOT_FINITE), as learn_one
                decided = self._judged_one(host, row, index, check.LEARN_LIMIT)
                if decided is None:
                    return super().assess_one(factors, category, inspect)
                action, confidence, probs = decided[0], decided[1], decided[2].tolist()
            else:
                action, confidence = host.score_row(row, index, self._options, check.LEARN_LIMIT)
                if action == kernels.NOT_FINITE:
                    return super().assess_one(factors, category, inspect)
                assert host.score_table is not None  # bound by the score just taken
                probs = host.score_table.arrays[11].tolist()  # score_one_at's scratch: this row's probabilities
            if not (inspect and self.inspects):
                return Assessment(action, confidence, probs, row)
            state = self._inspected(host, row, index)
            return Assessment(action, confidence, probs, row,
                              self._inspect_checked(row, index) if state is None else state)
        finally:
            lock.release()

    def learn_one(self, factors, action: str | int, category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None, *, source_id: int | None = None) -> dict[str, Any]:
        """Learn one verified decision (see :meth:`DecisionMemory.learn_one`).

        On a CPU module this is one compiled call on views of the memory's own buffers: the
        decision is learned in place as the next row of a staged batch that goes to the logs
        as one call (:mod:`gae.judgment.online`), so a run of ``learn_one`` calls ends exactly
        where one :meth:`prequential_` over the same decisions ends, logs included. Anything
        unusual takes the checked batched path. Holds the memory's lock from its checks to its
        last write: calls from several threads learn one after another.
        """
        lock = self._lock  # acquire() and release() cost half a `with` block, on every call
        lock.acquire()
        try:
            if ((outcome is None or outcome.__class__ is str) and (confirmed is None or confirmed.__class__ is bool)
                    and (source_id is None or (source_id.__class__ is int and 0 <= source_id < 2**63))
                    and self.backend == "compiled" and not self.history.replaying):
                host = self._host.get(self._buffers, self._parameters)
                # names, the common case, looked up here: a call costs a tenth of a microsecond
                c = (self._category_positions.get(category) if category.__class__ is str
                     else self._category_position(category))
                a = (self._action_positions.get(action) if action.__class__ is str
                     else self._position(action, self._action_positions, len(self._action_names)))
                if host is not None and c is not None and a is not None:
                    row = self._fast_row(factors)
                    if row is not None:
                        source = -1 if source_id is None else source_id
                        learned = (self._stage(host, row, c, a, confirmed, outcome == INCORRECT, source,
                                               flush_full=True)
                                   if not self._config.judges else
                                   self._stage_judged(host, row, c, a, confirmed, outcome == INCORRECT, source))
                        if learned is not None:
                            _, skipped, gated, eta, disp, initialized = learned
                            return {"skipped": True} if skipped else {"skipped": False, "gated": gated, "eta": eta,
                                                                      "disp": disp, "initialized": initialized}
            return super().learn_one(factors, action, category, confirmed, outcome, source_id=source_id)
        finally:
            lock.release()

    def _stage(self, host: online.HostState, row: np.ndarray, c: int, a: int, confirmed: bool | None,
               skip: bool, source: int = -1, flush_full: bool = False) -> tuple | None:
        """Learn one decision on the single-decision path as the staged batch's next row: the
        kernel's ``(0, skipped, gated, eta, displacement, initialized)``, or None when it must
        take the checked path. A full batch goes to the logs here with ``flush_full``; else the
        caller reads the row first, then sends it. ``source``: the row's source id (-1: its default)."""
        history = self.history
        staged = history.staged
        if staged is None or staged.shape[0] != len(self._action_names):  # the factors never change
            history.flush()
            shape = (len(self.action_names), self.n_factors)
            staged = history.staged = online.Staged(*shape, online.capacity(*shape, self._config.log.max_events))
        if staged.n == 0 or host.bound_to is not staged:  # a run starts, or the views were built again
            if staged.n == 0:
                staged.start(int(host.num_decisions), self.criterion_logits)
            host.bind(staged, self._options, check.LEARN_LIMIT)
        learned = host.learn(row, c, a, bool(confirmed), confirmed is not None, skip, staged.n, *host.bound)
        if learned[0] == kernels.STALE:  # the attention changed: the staged run ends here
            history.flush(self, self._relearn)
            staged.start(int(host.num_decisions), self.criterion_logits)
            host.bind(staged, self._options, check.LEARN_LIMIT)
            learned = host.learn(row, c, a, bool(confirmed), confirmed is not None, skip, staged.n, *host.bound)
        if learned[0] != 0:
            return None
        if source >= 0:  # (every row's is -1, its default, until a flush uses them)
            staged.sources[staged.n] = source
        staged.n += 1
        self.__dict__["_updates"] += 1  # a plain int: nn.Module.__setattr__ would cost more than the kernel
        if flush_full and staged.n == staged.capacity:
            history.flush(self, self._relearn)
        return learned

    def _judged_one(self, host: online.HostState, row: np.ndarray, c: int,
                    limit: float = math.inf) -> tuple[int, float, np.ndarray] | None:
        """The judges' mixture for one decision, after the prototypes scored it: ``(action,
        confidence, probs)``, or None for the checked path (a factor not finite or past ``limit``;
        ``probs`` is the judges' host's scratch, valid until its next decision)."""
        judge_host = self._judge_host.get(self._buffers)
        if judge_host is None:
            return None
        action, _ = host.score_row(row, c, self._options, limit)
        if action == kernels.NOT_FINITE:
            return None
        assert host.score_table is not None  # bound by the score just taken
        # score_one_at's scratch: this row's logits, the prototypes' vote's
        action, confidence = judge_host.decide(row, c, host.score_table.arrays[8], True)
        return action, confidence, judge_host.probs

    def _stage_judged(self, host: online.HostState, row: np.ndarray, c: int, a: int, confirmed: bool | None,
                      skip: bool, source: int = -1) -> tuple | None:
        """:meth:`_stage` for a memory with judges: the prototypes learn the staged row, then the
        judges and the trust learn the decision from the prototypes' vote on that row."""
        judge_host = self._judge_host.get(self._buffers)
        if judge_host is None:
            return None
        learned = self._stage(host, row, c, a, confirmed, skip, source)
        if learned is None:
            return None
        staged = self.history.staged
        assert staged is not None
        if not learned[1]:  # not skipped
            judge_host.decide(row, c, staged.arrays[5][1, staged.n - 1], False, a)  # the row's probs
        if staged.n == staged.capacity:
            self.history.flush(self, self._relearn)
        return learned

    def _prequential_one(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                         skip: Tensor) -> StreamStep | None:
        """A checked batch of one decision on the single-decision path (:meth:`_stage`)."""
        host = self._host.get(self._buffers, self._parameters)
        if host is None or self.history.replaying or self.backend != "compiled":
            return None
        flag = None if confirmed is None else bool(confirmed[0])
        if self._stage(host, x[0].numpy().astype(np.float64), int(category[0]), int(action[0]), flag,
                       bool(skip[0])) is None:
            return None
        staged = self.history.staged
        assert staged is not None
        row = slice(staged.n - 1, staged.n)
        step = StreamStep(MemoryOutput(*(t[row].clone() for t in staged.output)),
                          LearnEvents(*(t[row].clone() for t in staged.events)), staged.sq_diff[row].clone(),
                          staged.nearest[row].clone(), staged.before[row].clone())
        if staged.n == staged.capacity:  # full: to the logs (its last row has been read)
            self.history.flush(self, self._relearn)
        return step

    @property
    def inspects(self) -> bool:
        """True with ``learning='lvq'``, ``drift_mode='adaptive'`` or judges (see :meth:`inspect_one`)."""
        return self._inspects

    def inspect_one(self, factors, category: str | int = "general") -> CaseState:
        """What the memory's state says about one case (:class:`~gae.types.CaseState`): its
        novelty (:func:`gae.judgment.primitives.novelty`, with ``learning='lvq'``, which keeps each
        category's running variance) and the decisions that spread rests on; the category's change
        test as a share of ``promotion_threshold`` (``drift_mode='adaptive'``); its trust in each
        judge. One compiled call on the single-decision path's views; the torch reference otherwise."""
        with self._lock:
            c = self.category_index(category)
            host = self._host.get(self._buffers, self._parameters, scoring=True)  # (with inspect_one's views)
            row = None if host is None else self._fast_row(factors)
            state = None if host is None or row is None else self._inspected(host, row, c)
            return self._inspect_checked(factors, c) if state is None else state

    def _inspected(self, host: online.HostState, row: np.ndarray, c: int) -> CaseState | None:
        """:meth:`inspect_one` on the single-decision path's views (None for the checked path: a NaN or
        an Inf, or views that no longer view their tensors)."""
        config = self._config
        if not host.inspectable():
            return None
        novelty, support, change, trust = math.nan, 0, 0.0, None
        state = host.state
        if config.learning == "lvq":
            novelty = host.novelty(row, c)
            if novelty < 0:
                return None
            support = int(state.input_counts[c])
        elif not math.isfinite(row.sum()):
            return None
        if config.adaptive:
            change = float(state.promotion_statistic[c]) / config.drift.promotion_threshold
        if config.judges:
            trust = host.trust_row(c)
        return CaseState(novelty, support, change, trust)

    def _inspect_checked(self, factors: Any, c: int) -> CaseState:
        """:meth:`inspect_one` in torch, on the buffers wherever they are."""
        config = self._config
        x = self._one_factor_row(factors)[0]
        novelty, support, change = math.nan, 0, 0.0
        if config.learning == "lvq":
            support = int(self.input_counts[c])
            novelty = float(primitives.novelty(x, self.centroids[c], self.initialized[c], self.input_variances[c]))
        if config.adaptive:
            change = float(self.promotion_statistic[c]) / config.drift.promotion_threshold
        return CaseState(novelty, support, change, self.trust_one(c) if config.judges else None)

    def trust_one(self, category: str | int = "general") -> tuple[float, ...] | None:
        """Category ``category``'s trust in each judge (:meth:`judge_names` order), uniform before
        it learned (:func:`gae.judgment.trust.weights_of`); None without judges."""
        if not self._config.judges:
            return None
        c = self.category_index(category)
        with self._lock:
            host = self._host  # its trust view is sound while it still views the trust's data (a replaced
            if host.inspectable():  # tensor drops the views whole): no need to check every scored view
                return host.trust_row(c)
            built = self._host.get(self._buffers, self._parameters, scoring=True)  # (with inspect_one's views)
            if built is not None and built.inspectable():
                return built.trust_row(c)
            values = self.trust_weights[c].tolist()
        return tuple(values) if any(values) else (1.0 / len(values),) * len(values)

    # -- the judges (gae/judgment/judged.py) -----------------------------------------------
    def judge_names(self) -> tuple[str, ...]:
        """The names of the memory's judges, in vote order: ``'prototypes'``, then ``config.judges``."""
        return (judges.PROTOTYPES, *(judge.name for judge in self._config.judged()))

    def trust(self) -> Tensor:
        """(C, J) each category's trust in each judge (:meth:`judge_names` order), rows summing
        to 1; a memory without judges trusts its prototypes alone (all ones, J = 1)."""
        if not self._config.judges:
            return self.centroids.new_ones(len(self.category_names), 1)
        return trust_rule.weights_of(self.trust_weights).clone()

    # -- the history: undo, forget, trace and the logs (gae/judgment/history.py) -------------
    def _flushed(self) -> History:
        """The history with the staged decisions in its logs, folded if that puts the decision
        log over ``max_log_events`` (a reader must not keep the bound from holding)."""
        self.history.flush(self, self._relearn)
        return self.history

    def undo_(self, n: int = 1) -> None:
        """Revert the last ``n`` applied decisions exactly: the buffers, the event logs and the
        attention logits are bit for bit what they were before them (skipped decisions among
        them go too; an optimizer's own state, such as Adam's moments, is the caller's to
        restore). Raises ValueError, changing nothing, when the log holds fewer
        (``max_log_events`` folds older decisions into its base)."""
        n = check.check_int("n", n, low=1)
        with self._lock:
            logits = self.history.undo(self, self._relearn, n)
            with torch.no_grad():
                self.criterion_logits.copy_(logits.to(self.criterion_logits.device))
            self._updates += 1

    def forget_(self, source_ids: Sequence[int] | Tensor | np.ndarray) -> int:
        """Remove every decision with these source ids, as if they had never been learned.

        The state is rebuilt from the log's base by re-learning the other decisions in order
        with the fast engine: gating, first touches, spawns and promotions are recomputed, and
        so are the confirmed flags the memory derived from its own recommendation (a flag the
        caller gave is a fact and is kept). The result equals a fresh memory fed the stream
        without them (the attention, a parameter trained outside the memory, is not unlearned).
        Sequence numbers after the first forgotten decision shift down. Returns how many
        decisions were removed.

        What remains: the forgotten decisions' rows leave the decision log and its event logs,
        and the state no longer holds their influence; checkpoints and traces written before
        the call still hold them, and are the caller's to delete.

        Raises:
            ValueError: an id is not in the log (never learned, or folded into its base by
                ``max_log_events``), or ``source_ids`` is not a list of integers.
        """
        wanted = check.source_ids(source_ids)
        with self._lock:
            self._flushed()
            removed = self.history.forget(self, self._relearn, wanted)
            self._updates += 1
        return removed

    def trace(self, category: str | int, action: str | int, top: int = 10, prototype: int = 0) -> Trace:
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
        if prototype >= self.config.slots.prototypes:
            raise ValueError(f"prototype must be in [0, {self.config.slots.prototypes}), got {prototype}")
        with self._lock:
            return self.history.trace(c, a, prototype, top)

    @property
    def version(self) -> int:
        """The update counter: +1 for every decision passed to ``prequential_`` / ``learn_``
        (learned or skipped), +1 for every ``undo_`` / ``forget_`` and every growth: it only grows
        as the memory learns and forgets, and with :func:`gae.traces.writer.state_hash` (the
        content of the buffers and the attention) it names the state an answer was computed on. It
        travels in the ``state_dict``: loading a state brings back the counter that state had."""
        return self._updates

    def note_rebuilt_(self, version: int) -> None:
        self._updates = max(self._updates, int(version)) + 1  # the version only grows, as forget_ in RAM moves it

    def _migrated(self) -> None:
        if "_inspects" not in self.__dict__:  # pickled by a gae before it was kept
            self._inspects = _inspects(self._config)
        missing = [name for name in layout.BUFFERS if name not in self._buffers]
        if missing:  # pickled by a gae of an earlier layout: the buffers it lacks, as a state_dict load adds them
            upgraded = layout.upgrade({name: t for name, t in self._buffers.items() if t is not None}, self._config)
            for name in missing:
                self.register_buffer(name, upgraded[name])

    def note_sources_(self, following: int) -> None:
        """After a Decider rebuilt this memory from its ledger: the next default source id is at
        least ``following`` (one past every id given before the rebuild, and every id in the
        ledger): an id once given is never given again, as in a memory that never stopped."""
        with self._lock:
            log = self.history.log
            log.next_source = max(log.next_source, int(following))

    def next_source_id(self) -> int | None:
        """The source id the next decision learned without one gets (one past the largest given so
        far, never reused; the staged decisions counted row by row, as the log will take them);
        None when the log is off."""
        with self._lock:
            return None if self._config.log.max_events == 0 else self.history.next_source()

    @property
    def decision_log(self) -> DecisionLog:
        """The :class:`~gae.judgment.decision_log.DecisionLog`: every decision learned since its base state."""
        with self._lock:
            return self._flushed().log

    @property
    def gate_log(self) -> GateLog:
        """Every drift-gate event so far, in stream order (1-D CPU tensors)."""
        with self._lock:
            return self._flushed().joined("gate")

    @property
    def promotion_log(self) -> PromotionLog:
        """Every promotion of the change test so far (``drift_mode='adaptive'``), in stream order."""
        with self._lock:
            return self._flushed().joined("promotion")

    @property
    def recycle_log(self) -> RecycleLog:
        """Every recycled prototype so far (``prototypes > 1``), in stream order."""
        with self._lock:
            return self._flushed().joined("recycle")

    def gate_records(self) -> list[dict[str, Any]]:
        """Every learning event, in stream order, as dicts with names: the drift gate's damped steps
        (``event='gated'``: ``action``, ``disp``, ``eta``), in ``drift_mode='adaptive'`` the
        promotions with their evidence (``event='promoted'``: ``statistic``, ``shadow_right``,
        ``main_right``, ``shift``), and with ``prototypes > 1`` the recycled prototypes
        (``event='recycled'``: ``action``, ``prototype``, ``disp``)."""
        with self._lock:
            return self._flushed().records(self.category_names, self.action_names)

    def promotion_records(self, last: int | None = None) -> list[dict[str, Any]]:
        """The promotions of :meth:`gate_records` alone (the ``last`` ones, or all), without
        building the records of every gate event."""
        with self._lock:
            return self._flushed().promotion_records(self.category_names, last)

    # -- what a Decider builds on --------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Every option of the config (:meth:`JudgmentConfig.to_dict`): what a ledger records."""
        return self._config.to_dict()

    @classmethod
    def default_settings(cls) -> dict[str, Any]:
        """Each option's default, as a ledger written before the option existed is read."""
        return cast(dict, JudgmentConfig.seed().to_dict())

    def empty_like(self, categories: Sequence[str] | None = None,
                   actions: Sequence[str] | None = None) -> JudgmentMemory:
        blank = type(self)(self.category_names if categories is None else categories,
                           self.action_names if actions is None else actions, self.factor_names, self._config,
                           grow=self.grow)
        blank.backend = self.backend
        return blank

    # -- state ------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return (f"categories={len(self.category_names)}, actions={len(self.action_names)}, "
                f"factors={self.n_factors}, config={self._config!r}")

    def get_extra_state(self) -> dict[str, Any]:
        self.history.flush(self, self._relearn)  # staged decisions join the logs, which then keep their bound
        return {**self._names_state(), "config": self._config.to_dict(), "updates": self._updates,
                **self.history.state()}

    def set_extra_state(self, extra: dict[str, Any]) -> None:
        # a state saved before the counter existed: every decision it learned was one update
        self._updates = int(extra.get("updates", int(self.num_decisions)))
        self.history.load_state(self, extra)

    def _check_names_state(self, extra: dict[str, Any]) -> None:
        super()._check_names_state(extra)
        saved = extra.get("config", extra)  # a state saved before the config kept the mode at the top level
        options = (("drift_mode", "seed"), ("prototypes", 1), ("learning", "gated"))
        differs = [(option, saved.get(option, default), self._config.option(option)) for option, default in options
                   if saved.get(option, default) != self._config.option(option)]
        if differs:
            theirs = ", ".join(f"{option}={value!r}" for option, value, _ in differs)
            mine = ", ".join(f"{option}={value!r}" for option, _, value in differs)
            how = theirs
            if self._config.learning == "lvq" and saved.get("learning", "gated") == "gated":
                # the seed rule's state (what a memory built without config= was before it became recommended()'s)
                seed = JudgmentConfig.seed()
                how = ", ".join(["config=JudgmentConfig.seed()", *(f"{option}={saved.get(option, default)!r}"
                                 for option, default in options if saved.get(option, default) != seed.option(option))])
            raise ValueError(f"state_dict was saved with {theirs} but this memory has {mine}; build the memory "
                             f"with {how} to load it")
        judged.check_state(saved, self._config)

    def _upgrade_state(self, state_dict: dict[str, Any], prefix: str, version: int | None) -> None:
        """In place: a state an earlier gae saved (``version`` < 2, or unrecorded and of an older
        layout), in this version's layout (see gae/judgment/state.py)."""
        layout.upgrade_state_dict(state_dict, prefix, self._config, version)


def _inspects(config: JudgmentConfig) -> bool:
    """Whether a memory of ``config`` has anything for :meth:`JudgmentMemory.inspect_one` to say."""
    return config.learning == "lvq" or config.adaptive or bool(config.judges)
