"""The judgment memory's single-decision path: ``score_one`` and ``learn_one`` in microseconds.

Learned alone through the batched engine, a decision costs far more than its kernel: CPU
copies of the state, tensors for every input and output, a log chunk. Instead the memory keeps

- :class:`HostState`: NumPy views of its own buffers and attention, kept between calls and
  rebuilt when a tensor is replaced, with the compiled kernels' entry points for them
  (:func:`gae.compiled.entry_point`);
- :class:`Staged`: a preallocated batch of up to ``capacity`` rows. ``learn_one`` writes its
  decision into the next row and runs the online kernel on that row alone
  (:func:`gae.judgment.kernels.learning.learn_one`), in place on the memory's buffers, so its
  outputs and events land where one ``prequential_`` call over the staged decisions would
  have put them. The history takes the staged rows into its logs as one learning call
  (:meth:`gae.judgment.history.History.flush`) whenever anything reads the logs, before a
  batched call, when the attention changes and when the batch is full.

:class:`SingleDecisionMixin` is the memory's ``score_one`` / ``learn_one`` on them.

A run of ``learn_one`` calls therefore leaves the state, the logs and the outputs bit for bit
what one ``prequential_`` call over the same decisions leaves (tests/test_single_decision.py).
Anything unusual (another device or dtype, an input that needs converting or fails a check)
takes the checked batched path, which gives the full error messages.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor
from torch._C import TensorBase

from gae import validation as check
from gae._base import INCORRECT
from gae.compiled import ArrayTable, entry_point
from gae.judgment import judges, kernels, rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.kernels.learning import learn_one_at
from gae.judgment.online_judges import JudgedOneMixin
from gae.judgment.state import JudgmentState, layout
from gae.types import LearnEvents, MemoryOutput, PromotionLog, StreamStep

DTYPES = {name: dtype for name, (_, dtype) in  # every buffer's dtype, as the kernels read it
          layout(1, 1, 1, JudgmentConfig(drift_mode="adaptive", prototypes=2)).items()}
SCORED = ("centroids", "initialized", "wins", "tracking_centroids", "tracking_lead",  # what score_one_at reads
          "relevance_logits", "input_variances")
JUDGED = (judges.PREFIX, "trust_weights")  # the judges' buffers and the trust (judges.layout): JudgeHost checks them
STAGED_BYTES = 1 << 20  # the staged batch's arrays take at most about this much (and at least 16 rows)
MAX_STAGED = 1024  # rows staged before they go to the logs


def capacity(n_actions: int, n_factors: int, max_log_events: int | None) -> int:
    """Rows to stage: at most :data:`MAX_STAGED`, about :data:`STAGED_BYTES`, and a quarter of
    ``max_log_events`` (the log never holds much more than it allows)."""
    row_bytes = 4 * n_actions * (n_factors + 3) + 8 * n_factors + 64
    rows = max(16, min(MAX_STAGED, STAGED_BYTES // row_bytes))
    if max_log_events:
        rows = min(rows, max(1, max_log_events // 4))
    return rows


class Rows(NamedTuple):
    """The staged decisions as a learning call for :meth:`History.record` (CPU tensors, copies)."""

    first: int
    x: Tensor
    category: Tensor
    action: Tensor
    confirmed: Tensor  # the flag the rule used
    given: Tensor
    step: StreamStep
    promotions: PromotionLog
    logits: Tensor


class Staged:
    """Up to ``capacity`` decisions learned one at a time since the logs last took them.

    Its tensors are the batched engine's (``x``, the inputs, a :class:`~gae.types.MemoryOutput`,
    ``sq_diff``, ``nearest``, ``before``, the :class:`~gae.types.LearnEvents` and the
    promotions), the per-decision ones kept as the rows of four packed tensors (``ints``,
    ``flags``, ``reals``, ``scores``): the kernel then takes nine arrays where it would take
    thirty, and each array costs its call some 40 ns to receive. ``arrays`` holds the NumPy
    views in :func:`~gae.judgment.kernels.learning.learn_one`'s argument order.
    """

    @torch.inference_mode(False)  # written in place later, in or out of inference mode
    def __init__(self, n_actions: int, n_factors: int, capacity: int) -> None:
        rows = capacity
        self.capacity = capacity
        self.shape = (n_actions, n_factors)
        f32: Any = {"dtype": torch.float32, "device": "cpu"}  # whatever torch's defaults are
        self.x = torch.zeros(rows, n_factors, **f32)
        self.ints = torch.zeros(4, rows, dtype=torch.int64)  # category, action, output action, prototype
        self.flags = torch.zeros(10, rows, dtype=torch.bool)  # confirmed, given, skip, then the event flags
        self.reals = torch.zeros(5, rows, **f32)  # confidence, eta, displacement, promotion statistic and shift
        self.evidence = torch.zeros(rows, 2, dtype=torch.int64)  # the promotions' evidence
        self.scores = torch.zeros(2, rows, n_actions, **f32)  # logits, probs
        self.sq_diff = torch.zeros(rows, n_actions, n_factors, **f32)
        self.nearest = torch.zeros(rows, n_actions, dtype=torch.int64)
        self.before = torch.zeros(rows, n_factors, **f32)
        self._carve()
        self._reset(rows)
        self.n = 0  # rows in use
        self.first = 0  # the sequence number of row 0
        self.logits: Tensor | None = None  # the attention logits of the run (C, K)
        self.logits_array: np.ndarray | None = None  # their NumPy view
        self.alpha: np.ndarray | None = None  # rule.attention(logits), as the batched engine computes it
        self._views()

    def _carve(self) -> None:
        """The batched engine's tensors as rows of the packed ones (the layout of
        :func:`~gae.judgment.kernels.learning.learn_one`)."""
        ints, flags, reals = self.ints, self.flags, self.reals
        self.inputs = (ints[0], ints[1], flags[0], flags[1], flags[2])  # category, action, confirmed, given, skip
        self.output = MemoryOutput(self.scores[0], self.scores[1], ints[2], reals[0])
        self.events = LearnEvents(flags[3], flags[4], flags[5], flags[6], reals[1], reals[2], flags[7], ints[3],
                                  flags[8], flags[9])
        self.promotions = (reals[3], self.evidence, reals[4])

    def _views(self) -> None:
        self.arrays = tuple(t.numpy() for t in (self.x, self.ints, self.flags, self.reals, self.evidence, self.scores,
                                                self.sq_diff, self.nearest, self.before))

    @torch.inference_mode(False)
    def _reset(self, n: int) -> None:
        """Rows ``0..n-1`` as :meth:`LearnEvents.empty` and zero promotions make them: the kernel
        writes only what happened."""
        for mine, empty in zip(self.events, LearnEvents.empty(n), strict=True):
            mine[:n] = empty
        for tensor in (*self.promotions, self.before):
            tensor[:n] = 0

    def __getstate__(self) -> dict[str, Any]:
        # views travel as what they view: pickle (unlike deepcopy) would copy each view's data apart
        state = dict(self.__dict__)
        for name in ("arrays", "logits_array", "inputs", "output", "events", "promotions"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.logits_array = None if self.logits is None else self.logits.numpy()
        self._carve()
        self._views()

    def start(self, first: int, logits: Tensor) -> None:
        """Begin a run at sequence number ``first`` under the attention ``logits``."""
        self.first = first
        self.logits = logits.detach().to("cpu", torch.float32, copy=True)
        self.logits_array = self.logits.numpy()
        self.alpha = rule.attention(logits.detach()).to("cpu", torch.float32).contiguous().numpy()

    def take(self) -> Rows:
        """The staged rows as one learning call (copies), and an empty batch again."""
        n = self.n
        assert self.logits is not None
        category, action, confirmed, given, skip = (t[:n].clone() for t in self.inputs)
        output = MemoryOutput(*(t[:n].clone() for t in self.output))
        events = LearnEvents(*(t[:n].clone() for t in self.events))
        step = StreamStep(output, events, self.sq_diff[:n].clone(), self.nearest[:n].clone(), self.before[:n].clone())
        promotions = rule.promotions_of(events, category, *(t[:n] for t in self.promotions))
        used = torch.where(given, confirmed, output.action == action)  # the flag the rule used
        rows = Rows(self.first, self.x[:n].clone(), category, action, used, given, step, promotions, self.logits)
        self._reset(n)
        self.n, self.logits, self.logits_array, self.alpha = 0, None, None, None
        return rows

    def discard(self) -> None:
        """Forget the staged rows (the memory's state is being replaced)."""
        if self.n:
            self.take()


class HostState:
    """NumPy views of a CPU memory's state for the single-decision kernels, kept between calls.

    :meth:`get` returns itself while the memory's tensors are the ones it viewed, rebuilds the
    views when a tensor was replaced (``.to()``, assignment, a growth) and returns None when a
    tensor is not a contiguous CPU tensor of the engine's dtypes (the caller then takes the
    checked path).
    """

    def __init__(self) -> None:
        self.touched: tuple[Tensor, ...] = ()  # the buffers with data (not the judges') and the attention logits
        self.pointers: tuple[int, ...] = (-1,)  # where their data was (never a match before a build)
        self.scored: tuple[Tensor, ...] = ()  # those score_one reads
        self.scored_pointers: tuple[int, ...] = (-1,)
        self.learn: Any = None  # the entry point of kernels.learning.learn_one for the bound arrays
        self.bound: tuple = ()  # learn_one_at's arguments fixed for a staged run
        self.table: ArrayTable | None = None  # the arrays they address, held while they are used
        self.bound_to: Staged | None = None  # the staged batch they were bound for (by its current run)
        self.score: Any = None  # the entry point of kernels.score_one_at for these arrays
        self.score_bound: tuple = ()  # its arguments fixed for the memory: options, the arrays' addresses
        self.score_table: ArrayTable | None = None  # the arrays they address

    def get(self, buffers: dict[str, Any], parameters: dict[str, Any], scoring: bool = False) -> HostState | None:
        """Itself while its views are valid (``scoring``: those ``score_one`` reads), else the
        views built again; None when a tensor is not as the kernels need it (see the class)."""
        # a replaced tensor drops the whole HostState (DecisionMemory._drop_views); what is left to see is data
        # that moved under the same tensors (Tensor.share_memory_, alone or through torch.multiprocessing, moves
        # it and frees the old block without replacing the tensor; so do ``.data =`` and ``set_``)
        # (the attention logits are the last of each tuple: one map over them costs less than a call apart; the
        # identity test sees a parameter swapped in the dict itself, as torch.func.functional_call swaps it)
        logits = parameters["criterion_logits"]
        tensors, pointers = (self.scored, self.scored_pointers) if scoring else (self.touched, self.pointers)
        if tensors and tensors[-1] is logits and tuple(map(TensorBase.data_ptr, tensors)) == pointers:
            return self
        return self._build(buffers, logits)

    def _build(self, buffers: dict[str, Any], logits: Tensor) -> HostState | None:
        self.pointers = self.scored_pointers = (-1,)
        for name, dtype in DTYPES.items():  # the kernels read each buffer as its layout's dtype, by address
            tensor = buffers[name]
            if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.dtype != dtype:
                return None
        if logits.device.type != "cpu" or not logits.is_contiguous() or logits.dtype != torch.float32:
            return None
        # the buffers that hold data (a feature that is off keeps empty ones), and where it is; not the judges'
        self.touched = (*(t for name, t in buffers.items() if t.numel() and not name.startswith(JUDGED)), logits)
        self.scored = (*(buffers[name] for name in SCORED if buffers[name].numel()), logits)
        arrays: Any = JudgmentState
        self.state = arrays(*(buffers[name].detach().numpy() for name in JudgmentState._fields))
        self.num_decisions = buffers["num_decisions"].detach().numpy()
        self.logits = logits.detach().numpy()
        self.learn = self.score = self.bound_to = None
        self.pointers = tuple(map(TensorBase.data_ptr, self.touched))
        self.scored_pointers = tuple(map(TensorBase.data_ptr, self.scored))
        return self

    def bind(self, staged: Staged, options: kernels.Options, limit: float) -> None:
        """Fix ``learn``'s arguments for the current run of ``staged``: ``learn(row, c, a,
        confirmed, given, skip, staged.n, *bound)`` then learns one decision as row ``staged.n``
        and counts it, returning ``(0, skipped, gated, eta, displacement, initialized)`` or a code
        first (:func:`~gae.judgment.kernels.learning.learn_one_at`)."""
        assert staged.alpha is not None and staged.logits_array is not None, "a run starts with its attention"
        table = ArrayTable([*self.state, self.num_decisions, staged.alpha, self.logits, staged.logits_array,
                            *staged.arrays])
        self.bound = (limit, options, table.addresses, table.shapes)
        self.table, self.bound_to = table, staged
        if self.learn is None:  # the argument types are the same for every run: resolve them once
            self.learn = entry_point(learn_one_at, np.zeros(1), 0, 0, False, False, False, 0, *self.bound)

    def score_row(self, row: np.ndarray, c: int, options: kernels.Options) -> tuple[int, float]:
        """``kernels.score_one`` on this state (through ``score_one_at``): category ``c`` scores
        with its tracking prototypes while they lead (``drift_mode='adaptive'``)."""
        if self.score is None:  # the options are the memory's, fixed: bound once with the arrays
            state = self.state
            n_actions, n_factors = state.centroids.shape[1], state.centroids.shape[3]
            scratch = (np.zeros(n_factors, np.float32), np.zeros((1, n_factors), np.float32),
                       np.zeros(n_actions, np.float32))  # row, alpha, logits
            table = ArrayTable([state.centroids, state.initialized, state.wins, state.tracking_centroids,
                                state.tracking_lead, self.logits, *scratch, state.relevance_logits,
                                state.input_variances])
            self.score_bound = (options.adaptive, options.tau, options.spawn_support, options.min_confidence,
                                options.pooled, table.addresses, table.shapes)
            self.score_table = table
            self.score = entry_point(kernels.score_one_at, row, c, *self.score_bound)
        return self.score(row, c, *self.score_bound)


class SingleDecisionMixin(JudgedOneMixin):
    """The judgment memory's ``score_one``, ``learn_one`` and ``prequential_`` of one decision
    on this module's path (its public face, as :class:`~gae.judgment.history_api.HistoryMixin` is the
    history's). Mixed into :class:`~gae.JudgmentMemory`, which provides the attributes below and,
    after it in the method order, :class:`~gae.DecisionMemory`'s checked single-decision API
    (``super()``), which anything unusual takes."""

    _host: HostState
    _lock: Any
    history: Any
    backend: str
    grow: bool
    n_factors: int
    action_names: tuple[str, ...]
    _action_names: tuple[str, ...]  # the same, without the property's call (on every decision)
    category_names: tuple[str, ...]
    criterion_logits: Tensor
    _buffers: dict[str, Any]
    _parameters: dict[str, Any]
    _config: JudgmentConfig
    _options: kernels.Options
    _category_positions: dict[str, int]
    _action_positions: dict[str, int]
    _relearn: Any
    _category_position: Any
    _position: Any
    _fast_row: Any

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
                return cast(Any, super()).score_one(factors, category)
            row = self._fast_row(factors)
            if row is None:
                return cast(Any, super()).score_one(factors, category)  # the checks, with the full error message
            if self._config.judges:
                decided = self._judged_one(host, row, index)
                if decided is None:
                    return cast(Any, super()).score_one(factors, category)
                return None if decided[0] < 0 else self._action_names[decided[0]], decided[1]
            score = host.score  # bound on the first score: then called here, a Python call less
            action, confidence = (host.score_row(row, index, self._options) if score is None
                                  else score(row, index, *host.score_bound))
            if action == kernels.NOT_FINITE:
                return cast(Any, super()).score_one(factors, category)
            return None if action < 0 else self._action_names[action], confidence
        finally:
            lock.release()

    def _scores_one(self, row: np.ndarray | Tensor, category: str | int) -> tuple[int, float, list[float]]:
        """``decide``'s scores on this path (see :meth:`LifecycleMixin._scores_one`): ``score_one``'s
        kernel, whose logits give every action's probability (their softmax, in float64, rounded to
        float32; the recommended action's is the kernel's confidence). The kernel's logits agree
        with the batched forward's to float32 rounding, relative to their size."""
        host = self._host.get(self._buffers, self._parameters, scoring=True)
        index = (self._category_positions.get(category) if category.__class__ is str
                 else self._category_position(category))
        if host is None or index is None or not isinstance(row, np.ndarray):
            return cast(Any, super())._scores_one(row, category)
        if self._config.judges:
            decided = self._judged_one(host, row, index)
            if decided is None:
                return cast(Any, super())._scores_one(row, category)
            return decided[0], decided[1], decided[2].tolist()
        action, confidence = host.score_row(row, index, self._options)
        if action == kernels.NOT_FINITE:
            return cast(Any, super())._scores_one(row, category)
        assert host.score_table is not None  # bound by the score just taken
        logits = host.score_table.arrays[8].tolist()  # score_one_at's scratch: this row's logits (a few: in Python)
        top = max(logits)
        if top == -math.inf:  # nothing learned in this category yet
            return action, confidence, [0.0] * len(logits)
        exps = [math.exp(logit - top) for logit in logits]
        total = sum(exps)
        probs = array("f", [e / total for e in exps]).tolist()  # in the memory's precision
        if action >= 0:
            probs[action] = confidence  # the kernel's own, exactly: the Decision's confidence is its probability
        return action, confidence, probs

    def learn_one(self, factors, action: str | int, category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None) -> dict[str, Any]:
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
                        learned = (self._stage(host, row, c, a, confirmed, outcome == INCORRECT, flush_full=True)
                                   if not self._config.judges else
                                   self._stage_judged(host, row, c, a, confirmed, outcome == INCORRECT))
                        if learned is not None:
                            _, skipped, gated, eta, disp, initialized = learned
                            return {"skipped": True} if skipped else {"skipped": False, "gated": gated, "eta": eta,
                                                                      "disp": disp, "initialized": initialized}
            return cast(Any, super()).learn_one(factors, action, category, confirmed, outcome)
        finally:
            lock.release()

    def _stage(self, host: HostState, row: np.ndarray, c: int, a: int, confirmed: bool | None,
               skip: bool, flush_full: bool = False) -> tuple | None:
        """Learn one decision on the single-decision path as the staged batch's next row: the
        kernel's ``(0, skipped, gated, eta, displacement, initialized)``, or None when it must
        take the checked path. A full batch goes to the logs here with ``flush_full``; else the
        caller reads the row first, then sends it."""
        history = self.history
        staged = history.staged
        if staged is None or staged.shape[0] != len(self._action_names):  # the factors never change
            history.flush()
            shape = (len(self.action_names), self.n_factors)
            staged = history.staged = Staged(*shape, capacity(*shape, self._config.max_log_events))
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
        staged.n += 1
        self.__dict__["_updates"] += 1  # a plain int: nn.Module.__setattr__ would cost more than the kernel
        if flush_full and staged.n == staged.capacity:
            history.flush(self, self._relearn)
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
