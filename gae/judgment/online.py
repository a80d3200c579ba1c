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

:class:`~gae.JudgmentMemory`'s ``score_one``, ``assess_one`` and ``learn_one`` work on them
(and, for a memory with judges, on :class:`gae.judgment.judged.JudgeHost`'s views of the judges).

A run of ``learn_one`` calls therefore leaves the state, the logs and the outputs bit for bit
what one ``prequential_`` call over the same decisions leaves (tests/test_single_decision.py).
Anything unusual (another device or dtype, an input that needs converting or fails a check)
takes the checked batched path, which gives the full error messages.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch._C import TensorBase

from gae.compiled import ArrayTable, entry_point
from gae.judgment import judges, kernels, rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.float32 import VARIANCE_FLOOR
from gae.judgment.kernels.learning import learn_one_at
from gae.judgment.state import JudgmentState, layout
from gae.types import LearnEvents, MemoryOutput, PromotionLog, StreamStep

DTYPES = {name: dtype for name, (_, dtype) in  # every buffer's dtype, as the kernels read it
          layout(1, 1, 1, JudgmentConfig(drift_mode="adaptive", prototypes=2)).items()}
SCORED = ("centroids", "initialized", "wins", "tracking_centroids", "tracking_lead",  # what score_one_at reads
          "relevance_logits", "input_variances", "factor_variances")
INSPECTED = ("input_counts", "promotion_statistic", "trust_weights")  # and what inspect_one reads besides
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
    source_ids: Tensor | None  # (-1 where a row takes its default), None when every row does


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
        self.sources = np.full(rows, -1, dtype=np.int64)  # each row's source id (-1: its default), not the kernel's
        self.counted = (0, 0)  # rows whose source ids History.next_source has counted, and the next id after them
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
        self.__dict__.setdefault("counted", (0, 0))  # (pickled by a gae before it was kept)
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
        sources = self.sources[:n]
        source_ids = torch.from_numpy(sources.copy()) if (sources >= 0).any() else None
        rows = Rows(self.first, self.x[:n].clone(), category, action, used, given, step, promotions, self.logits,
                    source_ids)
        sources[:] = -1
        self.counted = (0, 0)
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
        self.inspected: tuple[Tensor, ...] = ()  # and those inspect_one reads besides (INSPECTED)
        self.inspected_pointers: tuple[int, ...] = (-1,)
        self.scored_pointers: tuple[int, ...] = (-1,)
        self.learn: Any = None  # the entry point of kernels.learning.learn_one for the bound arrays
        self.bound: tuple = ()  # learn_one_at's arguments fixed for a staged run
        self.table: ArrayTable | None = None  # the arrays they address, held while they are used
        self.bound_to: Staged | None = None  # the staged batch they were bound for (by its current run)
        self.score: Any = None  # the entry point of kernels.score_one_at for these arrays
        self.score_bound: tuple = ()  # its arguments fixed for the memory: options, the arrays' addresses
        self.score_unlimited: tuple = ()  # and those after no limit on a factor's size
        self.score_table: ArrayTable | None = None  # the arrays they address
        self.novelty_call: Any = None  # kernels.novelty's entry point for these arrays
        self.novelty_args: tuple = ()

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
        self.inspected = tuple(buffers[name] for name in INSPECTED if buffers[name].numel())
        arrays: Any = JudgmentState
        self.state = arrays(*(buffers[name].detach().numpy() for name in JudgmentState._fields))
        self.num_decisions = buffers["num_decisions"].detach().numpy()
        self.trust = buffers["trust_weights"].detach().numpy()
        self.logits = logits.detach().numpy()
        self.learn = self.score = self.bound_to = self.novelty_call = None
        self.pointers = tuple(map(TensorBase.data_ptr, self.touched))
        self.scored_pointers = tuple(map(TensorBase.data_ptr, self.scored))
        self.inspected_pointers = tuple(map(TensorBase.data_ptr, self.inspected))
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

    def novelty(self, row: np.ndarray, c: int) -> float:
        """:func:`gae.judgment.primitives.novelty` of a float64 row in category ``c`` (``kernels.novelty``)."""
        if self.novelty_call is None:
            state = self.state
            self.novelty_args = (state.centroids, state.initialized, state.input_variances, VARIANCE_FLOOR)
            self.novelty_call = entry_point(kernels.novelty, row, c, *self.novelty_args)
        return self.novelty_call(row, c, *self.novelty_args)

    def inspectable(self) -> bool:
        """Whether the views of what ``inspect_one`` reads besides the scored buffers (the spread's
        support, the change test, the trust) still view their tensors' data (see :meth:`get`)."""
        return tuple(map(TensorBase.data_ptr, self.inspected)) == self.inspected_pointers

    def trust_row(self, c: int) -> tuple[float, ...]:
        """Category ``c``'s trust weights, uniform before it learned (:func:`gae.judgment.trust.weights_of`)."""
        values = self.trust[c].tolist()
        return tuple(values) if any(values) else (1.0 / len(values),) * len(values)

    def score_row(self, row: np.ndarray, c: int, options: kernels.Options,
                  limit: float = math.inf) -> tuple[int, float]:
        """``kernels.score_one`` on this state (through ``score_one_at``): category ``c`` scores
        with its tracking prototypes while they lead (``drift_mode='adaptive'``); a factor past
        ``limit`` in size answers NOT_FINITE."""
        if self.score is None:  # the options are the memory's, fixed: bound once with the arrays
            state = self.state
            n_actions, n_factors = state.centroids.shape[1], state.centroids.shape[3]
            scratch = (np.zeros(n_factors, np.float32), np.zeros((1, n_factors), np.float32),
                       np.zeros(n_actions, np.float32))  # row, alpha, logits
            table = ArrayTable([state.centroids, state.initialized, state.wins, state.tracking_centroids,
                                state.tracking_lead, self.logits, *scratch, state.relevance_logits,
                                state.factor_variances if options.memory_units else state.input_variances,
                                np.zeros(n_actions, np.float32)])  # (+ probs)
            self.score_bound = (options.adaptive, options.tau, options.spawn_support, options.min_confidence,
                                options.pooled, table.addresses, table.shapes)
            self.score_table = table
            self.score_unlimited = (math.inf, *self.score_bound)  # score_one's: no limit on a factor's size
            self.score = entry_point(kernels.score_one_at, row, c, *self.score_unlimited)
        return self.score(row, c, limit, *self.score_bound)
