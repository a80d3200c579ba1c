"""JudgmentMemory: learned prototypes per (category, action) and learned criterion attention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor, nn

from gae import durable
from gae import validation as check
from gae._base import DecisionMemory
from gae.judgment import engine, kernels, online, online_judges, rule
from gae.judgment import state as layout
from gae.judgment.config import JudgmentConfig
from gae.judgment.explain import Explanation
from gae.judgment.explain import explain as explain_batch
from gae.judgment.history import RELEARNED, History, buffer_state
from gae.judgment.history_api import HistoryMixin, ledger_defaults
from gae.judgment.judges_api import JudgesMixin
from gae.judgment.referring import ReferringMixin
from gae.lifecycle import MAX_PENDING
from gae.types import MemoryOutput, StreamStep
from gae.validation import Names


class JudgmentMemory(online.SingleDecisionMixin, HistoryMixin, JudgesMixin, ReferringMixin, DecisionMemory):
    r"""Centroid judgment over verified decisions, scoring in O(A K) with no retrieval.

    A decision is a factor vector :math:`x \in \mathbb{R}^K` in a category :math:`c`. The
    memory keeps prototypes :math:`\mu_{c,a}` per category and action and scores

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
    outcomes (``skip``) change nothing; every gated step is appended to :attr:`gate_log`. The
    whole rule, every mode, as maths and as the torch reference, is :mod:`gae.judgment.rule`.

    ``drift_mode='adaptive'`` adds a per-category change test that tells a sustained drift from
    outliers, promotes the prototypes to the means since the change point and follows them as
    running means, and scores with tracking prototypes while they predict better
    (``docs/drift.md``). ``prototypes=P`` keeps up to P prototypes per category and action,
    spawned where a decision lies farther than ``spawn_threshold`` from all of them and recycled
    by fewest recent wins (``docs/prototypes.md``). The default, :meth:`JudgmentConfig.seed`, is
    the original rule, bit for bit. The attention logits :math:`\ell` are the only parameters;
    they are trained by gradient (:meth:`attention_loss`), while the prototypes are buffers.

    The audit trail (:attr:`decision_log`, the gate, promotion and recycle logs behind ``trace``,
    ``undo_`` and ``forget_``) is kept whole by default, about ``53 + 8 K`` bytes a decision. On
    an endless stream bound it with ``max_log_events=N``: every log then covers the last N to N/2
    decisions, and the state stays flat (the river and scikit-learn estimators bound it by default).

    Thread safety: one memory may be shared by many threads (:class:`~gae.DecisionMemory` says
    how). Not covered: a ``forward`` traced by ``torch.compile``, pickling while another thread
    learns, and an optimizer stepping ``criterion_logits`` while other threads learn.

    Args:
        categories: number of categories, or their names.
        actions: number of actions, or their names.
        factors: number of criteria (factors), or their names.
        config: the :class:`~gae.JudgmentConfig` (every option, documented there). Default:
            :meth:`JudgmentConfig.seed`, the original design.
        grow: ``learn_one`` adds an action or category name it has not met
            (:meth:`add_actions_`, :meth:`add_categories_`). Default: False.
        store, ledger, snapshot_every, durable_decisions: a durable ledger (named ``ledger``) in a
            :class:`~gae.episodic.store.SQLiteStore` or ``PostgresStore``: every decision and
            verification committed before its call returns, one memory for every process that
            opens it (:mod:`gae.durable`, ``docs/ledger.md``). Default: none, the memory is in RAM.
        **overrides: options to change from ``config`` (``drift_mode='adaptive'``, ``tau=0.2``, ...).

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
        >>> memory.learn_one([0.9, 0.1, 0.5], "approve", "invoice")["initialized"]
        True
        >>> memory.learn_one([0.1, 0.9, 0.5], "reject", "invoice")["initialized"]
        True
        >>> memory.score_one([0.8, 0.2, 0.5], "invoice")[0]
        'approve'
        >>> memory.score_one([0.8, 0.2, 0.5], "refund")
        (None, 0.0)
        >>> JudgmentMemory(2, 2, 3, drift_mode="adaptive").config.drift_mode
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
                 *, grow: bool = False, max_pending: int = MAX_PENDING, pending_ttl: float | None = None,
                 store: Any = None, ledger: str = "judgment", snapshot_every: int = durable.SNAPSHOT_EVERY,
                 durable_decisions: bool = True, **overrides: Any) -> None:
        super().__init__(max_pending=max_pending, pending_ttl=pending_ttl)
        if config is not None and not isinstance(config, JudgmentConfig):
            raise TypeError(f"config must be a JudgmentConfig or None, got {type(config).__name__}")
        config = JudgmentConfig.seed() if config is None else config
        self._config = config.replace(**overrides) if overrides else config
        self.referral = self._fresh_referral()
        self.grow = bool(grow)
        given = {"categories": check.resolve_names("categories", categories),
                 "actions": check.resolve_names("actions", actions), "factors": check.resolve_names("factors", factors)}
        opened, names = (None, given) if store is None else durable.prepare(  # a ledger's own names (gae/durable.py)
            store, ledger, type(self).__name__, given, self._ledger_settings(), self.grow, ledger_defaults())
        self._set_category_names(names["categories"])
        self._set_action_names(cast(tuple, names["actions"]))
        self.factor_names = cast(tuple, names["factors"])
        self.n_factors = len(self.factor_names)
        self._options = kernels.Options.of(self._config)
        self.criterion_logits = nn.Parameter(torch.zeros(len(self.category_names), self.n_factors))
        layout.register(self, len(self.category_names), len(self.action_names), self.n_factors, self._config)
        self.history = History(self._config.max_log_events, buffer_state(self))
        self._updates = 0  # the version counter: see ``version``
        self._host = online.HostState()  # the views score_one and learn_one work on (gae/judgment/online.py)
        self._judge_host = online_judges.JudgeHost(self._config)  # and those of the judges
        if opened is not None:
            self._attach(opened, snapshot_every, durable_decisions, given)

    def _fresh_referral(self) -> Any:
        return self._config.referral()

    @property
    def config(self) -> JudgmentConfig:
        """The :class:`~gae.JudgmentConfig` in force (immutable; build a new memory to change it)."""
        return self._config

    def state(self) -> layout.JudgmentState:
        """The learned buffers as a :class:`~gae.judgment.state.JudgmentState` (the tensors themselves)."""
        return layout.JudgmentState(*(cast(Tensor, self._buffers[name]) for name in layout.JudgmentState._fields))

    def scoring_mask(self) -> Tensor:
        """(C, A, P) bool: the prototypes that take part in scoring (:func:`gae.judgment.rule.scoring_mask`)."""
        return rule.scoring_mask(self.initialized, self.wins, self._config.spawn_support)

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
        if not self._config.lvq:
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

            >>> memory = JudgmentMemory(["invoice"], ["approve", "reject"], ["amount", "age"])
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
            return self._explain_judged(explained, x, category_t)

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
        return rule.slot_logits(distance, torch.isfinite(step.prototypes_output.logits), self._config.tau)

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
        if self.centroids.dtype != torch.float32:
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
        step, judge_buffers = self._learn_judges(x, category, action, skip, step)  # their mixture answers
        engine.write_back(self.state(), learned)  # the whole batch lands at once
        self._write_judges(judge_buffers)
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

    # -- state ------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return (f"categories={len(self.category_names)}, actions={len(self.action_names)}, "
                f"factors={self.n_factors}, config={self._config!r}")

    def get_extra_state(self) -> dict[str, Any]:
        self.history.flush(self, self._relearn)  # staged decisions join the logs, which then keep their bound
        return {**self._names_state(), "config": self._config.to_dict(), "updates": self._updates,
                **self.history.state(), **self._pending_state(), "referral": self.referral.state()}

    def set_extra_state(self, extra: dict[str, Any]) -> None:
        self.referral.load_state(extra.get("referral"))  # checked whole first: a bad one raises before the rest
        # a state saved before the counter existed: every decision it learned was one update
        self._updates = int(extra.get("updates", int(self.num_decisions)))
        self.history.load_state(self, extra)
        self._load_pending_state(extra)

    def _check_names_state(self, extra: dict[str, Any]) -> None:
        super()._check_names_state(extra)
        saved = extra.get("config", extra)  # a state saved before the config kept the mode at the top level
        for option, default in (("drift_mode", "seed"), ("prototypes", 1), ("learning", "gated")):
            value, mine = saved.get(option, default), getattr(self._config, option)
            if value != mine:
                raise ValueError(f"state_dict was saved with {option}={value!r} but this memory has "
                                 f"{option}={mine!r}; build the memory with {option}={value!r} to load it")
        self._check_judges_state(saved)

    def _upgrade_state(self, state_dict: dict[str, Any], prefix: str, version: int | None) -> None:
        """In place: a state an earlier gae saved (``version`` < 2, or unrecorded and of an older
        layout), in this version's layout (see gae/judgment/state.py)."""
        layout.upgrade_state_dict(state_dict, prefix, self._config, version)
