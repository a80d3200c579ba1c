"""DecisionMemory: what every decision memory shares, the one base of the models.

A decision memory is an :class:`torch.nn.Module` that scores, learns, explains and forgets:
:class:`~gae.JudgmentMemory`, :class:`~gae.KNNMemory` and :class:`~gae.RetrievalMemory`. This
base holds what every harness uses of them: their names, the boundary checks, the batched
``prequential_`` / ``learn_``, the single-decision ``score_one`` / ``learn_one`` and what a
:class:`~gae.Decider` builds on (``assess_one``, ``factor_row``, ``category_index``,
``settings``, ``empty_like``), growing vocabularies, an all-or-nothing ``load_state_dict``, and
the copies and single-decision views each change of its tensors drops. It imports no storage:
serving a memory to agents (pending decisions, act or refer, a durable ledger) is the Decider's.
"""

from __future__ import annotations

import math
import numbers
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from gae import validation as check
from gae.moved import SERVED
from gae.state_dicts import check_state_dict, load_all_or_nothing, locked_deepcopy
from gae.types import Assessment, CaseState, LearnEvents, StreamStep

INCORRECT = "__incorrect__"  # the original API's outcome marker for an uncertain decision
FLOAT64 = np.dtype(np.float64)  # the single-decision rows' dtype (NumPy keeps one object per builtin dtype)
VIEWS = ("_host", "_judge_host")  # the attributes that hold single-decision views
# the extra state a memory saved before the Decider held its decisions and referral (read by Decider.load_state_dict)
DECIDER_STATE = ("pending", "expired_decisions", "referral")


class DecisionMemory(nn.Module):
    """Base of :class:`~gae.JudgmentMemory`, :class:`~gae.KNNMemory` and :class:`~gae.RetrievalMemory`.

    Subclasses set ``category_names`` (or None when categories are ignored),
    ``action_names`` and ``n_factors``, and implement ``forward``, ``_prequential``,
    ``explain``, ``settings`` and ``empty_like`` on inputs that have already been validated.

    Thread safety: every memory holds one re-entrant lock (``_lock``, a
    :class:`threading.RLock`) that each public call holds from its checks to its last write,
    so learning is serialized (calls apply one after another, in the order the lock was
    taken), a score taken while another thread learns sees the state before or after that
    whole call, never half of it, and the logs stay consistent. A subclass takes the same lock
    in every public method it overrides. ``state_dict()`` and ``copy.deepcopy`` are taken whole
    under it; pickle (and ``torch.save`` of a whole module) keeps torch's own path and is not
    locked: pickle a memory while no other thread learns it. A copy gets a lock of its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["_lock"] = threading.RLock()  # outside nn.Module's attribute machinery

    n_factors: int
    _lock: threading.RLock  # see the class docstring; outside nn.Module's attributes, so not a buffer or module
    backend: str = "compiled"
    grow: bool = False  # learn_one adds an action or category it has not met (see add_actions_)

    @property
    def lock(self) -> threading.RLock:
        """The memory's re-entrant lock (see the class docstring): hold it to make several calls one
        step that no other thread's call interleaves with (a :class:`~gae.Decider` holds it around
        each of its calls)."""
        return self._lock

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in SERVED:
                raise AttributeError(f"{type(self).__name__}.{name} moved to gae.Decider, which serves a memory to "
                                     f"agents: {SERVED[name]}") from None
            raise

    # -- names (each with a dict of positions: the single-decision paths look names up per call)
    @property
    def action_names(self) -> tuple[str, ...]:
        """The actions' names, in index order."""
        return self._action_names

    def _set_action_names(self, names: tuple[str, ...]) -> None:
        """The names, with their positions (the buffers are sized by the caller: names never change alone)."""
        self._action_names = tuple(names)
        self._action_positions = {name: i for i, name in enumerate(self._action_names)}

    @property
    def category_names(self) -> tuple[str, ...] | None:
        """The categories' names, in index order; None for a memory that ignores categories."""
        return self._category_names

    def _set_category_names(self, names: tuple[str, ...] | None) -> None:
        self._category_names = None if names is None else tuple(names)
        self._category_positions = {} if names is None else {name: i for i, name in enumerate(names)}

    def _init_neighbours(self, factors: Any, actions: Any, categories: Any, k: int, capacity: int,
                         scoped: bool) -> None:
        """Names and the k / capacity / scope settings shared by the memories that vote with neighbours."""
        self.factor_names = check.resolve_names("factors", factors)
        self._set_action_names(check.resolve_names("actions", actions))
        self._set_category_names(None if categories is None else check.resolve_names("categories", categories))
        self.n_factors = len(self.factor_names)
        self.k = check.check_int("k", k, low=1)
        capacity = check.check_int("capacity", capacity, low=1)
        if self.k > capacity:
            raise ValueError(f"k must be <= capacity ({capacity}), got {k}: the memory could never score")
        if scoped and categories is None:
            raise ValueError("scoped=True needs categories (an int or a list of names), got categories=None")
        self.scoped = bool(scoped)

    # -- the batched API -------------------------------------------------------------
    def _prequential(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None,
                     skip: Tensor, source_ids: Tensor | None = None) -> StreamStep:
        raise NotImplementedError

    @torch.no_grad()
    def prequential_(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None = None,
                     skip: Tensor | None = None, source_ids: Tensor | None = None) -> StreamStep:
        """Score every decision with the state left by the ones before it, then learn it.

        The result equals a Python loop of single decisions. The whole batch is validated
        before any state changes, so a rejected batch leaves the memory untouched.

        Args:
            x: (B, K) float factors.
            category: (B,) integer category indices.
            action: (B,) integer verified actions.
            confirmed: (B,) bool, or None for "the memory's own pre-learning recommendation
                equals ``action``".
            skip: (B,) bool, True for uncertain outcomes that must not be learned. Default none.
            source_ids: (B,) int64, where each decision came from (a user's episode, a ticket),
                kept by :class:`~gae.JudgmentMemory`'s decision log for ``trace`` and
                ``forget_``. Default: one past the largest id given so far, never reused (the
                sequence numbers, while no id is given and nothing forgotten; a Decider on a
                ledger records the id each decision got, :meth:`next_source_id`). Memories
                without a log validate and ignore them.

        Returns:
            :class:`~gae.types.StreamStep` with the pre-learning outputs and the learn events.
        """
        with self._lock:
            x, category, action, confirmed, skip = self._check_stream(x, category, action, confirmed, skip)
            if source_ids is not None:
                source_ids = check.check_index(source_ids, "source_ids", None, x.shape[0], x.device)
            return self._prequential(x, category, action, confirmed, skip, source_ids)

    @torch.no_grad()
    def learn_(self, x: Tensor, category: Tensor, action: Tensor, confirmed: Tensor | None = None,
               skip: Tensor | None = None, source_ids: Tensor | None = None) -> LearnEvents:
        """Learn a batch of verified decisions in stream order; see :meth:`prequential_`."""
        return self.prequential_(x, category, action, confirmed, skip, source_ids).events

    # -- the single-decision API of the original implementation ------------------------
    def score_one(self, factors: Sequence[float] | Tensor | np.ndarray,
                  category: str | int = "general") -> tuple[str | None, float]:
        """Score one decision: ``(action name or None when abstaining, confidence)``; a memory
        built with ``grow=True`` abstains in a category it has not met (after checking ``factors``)."""
        with self._lock:
            x = self._one_factor_row(factors)
            if self._unseen(category):
                return None, 0.0
            index = self._category_index(category)
            with torch.no_grad():
                out = self(x, torch.tensor([index], device=x.device))
            return self._action_name(int(out.action[0])), float(out.confidence[0])

    def learn_one(self, factors: Sequence[float] | Tensor | np.ndarray, action: str | int,
                  category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None, *, source_id: int | None = None) -> dict[str, Any]:
        """Learn one verified decision; ``outcome='__incorrect__'`` marks it uncertain (skipped).

        Returns a dict like the original: ``{'skipped': True}`` or the gate's verdict with
        ``gated``, ``eta``, ``disp`` and ``initialized``. A memory built with ``grow=True``
        adds an action or category name it has not met (:meth:`add_actions_`). ``source_id``:
        where the decision came from (``forget_`` removes by it; default as ``source_ids`` of
        :meth:`prequential_`).
        """
        return self._learn_checked(factors, action, category, confirmed, outcome, source_id)

    def _learn_checked(self, factors: Any, action: str | int, category: str | int, confirmed: bool | None,
                       outcome: str | None, source_id: int | None) -> dict[str, Any]:
        """``learn_one`` on the checked path, the decision's ``source_id`` given (else its sequence number)."""
        if outcome is not None and not isinstance(outcome, str):
            raise TypeError(f"outcome must be None or a string, got {outcome!r}")
        if confirmed is not None and not isinstance(confirmed, (bool, np.bool_)):
            raise TypeError(f"confirmed must be a bool or None, got {confirmed!r}")
        with self._lock:
            x = self._one_factor_row(factors, check.LEARN_LIMIT)
            self._meet(action, category)  # after the checks: a rejected call adds no name
            device = x.device
            category_index = torch.tensor([self._category_index(category)], device=device)
            action_index = torch.tensor([check.lookup("action", action, self.action_names)], device=device)
            confirmed_t = None if confirmed is None else torch.tensor([bool(confirmed)], device=device)
            skip = torch.tensor([outcome == INCORRECT], device=device)
            sources = None if source_id is None else torch.tensor([check.source_id(source_id)], device=device)
            events = self.learn_(x, category_index, action_index, confirmed_t, skip, sources)
        if bool(events.skipped[0]):
            return {"skipped": True}
        return {"skipped": False, "gated": bool(events.gated[0]), "eta": float(events.eta[0]),
                "disp": float(events.displacement[0]), "initialized": bool(events.initialized[0])}

    # -- growing vocabularies -----------------------------------------------------------
    def add_actions_(self, names: str | Sequence[str]) -> None:
        """Add actions at the end of :attr:`action_names`, keeping everything learned.

        The new actions have nothing learned yet (a judgment memory gives them empty
        prototypes; a neighbour memory has no traces of them). Existing indices keep their
        meaning, so earlier outputs, logs and traces stay valid. To load the state of a grown
        memory, build one with the grown names.

        Raises:
            ValueError / TypeError: an empty, duplicate or existing name; nothing changes.
        """
        with self._lock:
            new = check.new_names("actions", names, self.action_names)
            self._grow_state(0, len(new))
            self._set_action_names((*self.action_names, *new))

    def add_categories_(self, names: str | Sequence[str]) -> None:
        """Add categories at the end of :attr:`category_names`, keeping everything learned (see
        :meth:`add_actions_`). A judgment memory gives them uniform attention: its attention
        parameter is the same object with more rows, so an optimizer built on it before must be
        built again (its state has the old shape). ValueError for a memory that ignores
        categories (``categories=None``)."""
        if self.category_names is None:
            raise ValueError(f"add_categories_({names!r}): this {type(self).__name__} ignores categories "
                             "(built with categories=None)")
        with self._lock:
            new = check.new_names("categories", names, self.category_names)
            self._grow_state(len(new), 0)
            self._set_category_names((*self.category_names, *new))

    def _grow_state(self, new_categories: int, new_actions: int) -> None:
        """Resize the state for names about to be added. The neighbour memories store indices
        only, so by default there is nothing to resize."""

    @staticmethod
    def _position(value: Any, positions: dict[str, int], count: int) -> int | None:
        """For the single-decision paths: the index of a known name or of an int index in range,
        else None (a checked path then raises or converts)."""
        if value.__class__ is str:
            return positions.get(value)
        return value if value.__class__ is int and 0 <= value < count else None

    def _fast_row(self, factors: Any) -> np.ndarray | None:
        """For the single-decision paths: one decision's factors as a C-contiguous float64 row (a
        list of numbers converted in one step), or None when the checked path must look at them
        (other shapes, complex, object or string values, a tensor that needs a gradient, ...)."""
        try:
            if factors.__class__ is list:
                row = np.array(factors)  # floats, the common case, come as float64: naming it costs more
                if row.dtype is not FLOAT64:
                    row = np.array(factors, dtype=np.float64)  # ints, bools, ... as before; anything else raises
            elif factors.__class__ is np.ndarray and factors.dtype is FLOAT64 and factors.flags.c_contiguous:
                row = factors  # (a checked row, as factor_row gives: a Decider's verify)
            else:
                raw = np.asarray(factors)
                if raw.dtype.kind not in "fiu":
                    return None
                row = np.ascontiguousarray(raw, dtype=np.float64)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            return None
        return row if row.shape == (self.n_factors,) else None

    def _decision(self, factors: Any, category: Any, action: Any, learn: bool) -> tuple[np.ndarray, int, int] | None:
        """For the single-decision paths: ``(row, category index, action index)`` of one call
        (action 0 when it only scores), or None when the checked path must look at it."""
        c = self._category_position(category)
        a = self._position(action, self._action_positions, len(self.action_names)) if learn else 0
        if c is None or a is None:
            return None
        row = self._fast_row(factors)
        return None if row is None else (row, c, a)

    @staticmethod
    def _stored(skipped: bool) -> dict[str, Any]:
        """``learn_one``'s answer for a memory that stores decisions whole (no gate, no prototype)."""
        return {"skipped": True} if skipped else {"skipped": False, "gated": False, "eta": 1.0, "disp": 0.0,
                                                  "initialized": False}

    def _category_position(self, category: Any) -> int | None:
        """For the single-decision paths: the index of a category name or index (when the memory
        ignores categories, 0 for a name and the index itself, as the checked path does), else None."""
        names = self._category_names
        if names is None:  # any name (stored as 0) or index (stored as it is)
            return 0 if category.__class__ is str else (
                category if category.__class__ is int and 0 <= category < 2**63 else None)
        return self._position(category, self._category_positions, len(names))

    def _meet(self, action: str | int, category: str | int) -> None:
        """With ``grow=True``, add an action or category name met for the first time, once the
        other argument has passed its check (a rejected call adds nothing)."""
        if not self.grow:
            return
        new_action = isinstance(action, str) and bool(action) and action not in self._action_positions
        new_category = (self.category_names is not None and isinstance(category, str) and bool(category)
                        and category not in self._category_positions)
        if not new_action:
            check.lookup("action", action, self.action_names)
        if not new_category:
            self._category_index(category)
        if new_action:
            self.add_actions_([cast(str, action)])
        if new_category:
            self.add_categories_([cast(str, category)])

    def _unseen(self, category: Any) -> bool:
        """A category name a memory built with ``grow=True`` has not met: it scores nothing there."""
        return (self.grow and self.category_names is not None and isinstance(category, str) and bool(category)
                and category not in self._category_positions)

    # -- validation helpers -----------------------------------------------------------
    @property
    def _device(self) -> torch.device:
        return next(self.buffers()).device

    @property
    def _float_dtype(self) -> torch.dtype:
        """The precision the memory computes in: its first floating buffer's (float32 unless moved)."""
        return next((b.dtype for b in self.buffers() if b.is_floating_point()), torch.float32)

    @property
    def _n_categories(self) -> int | None:
        return None if self.category_names is None else len(self.category_names)

    def _check_query(self, x: Tensor, category: Tensor, limit: float | None = None,
                     name: str = "x") -> tuple[Tensor, Tensor]:
        device = self._device
        x = check.check_factors(x, self.n_factors, device, name, dtype=self._float_dtype, limit=limit)
        category = check.check_index(category, "category", self._n_categories, x.shape[0], device,
                                     self.category_names)
        return x, category

    def _check_stream(self, x, category, action, confirmed, skip):
        x, category = self._check_query(x, category, check.LEARN_LIMIT)  # learned values must keep the state finite
        batch, device = x.shape[0], x.device
        action = check.check_index(action, "action", len(self.action_names), batch, device, self.action_names)
        confirmed = check.check_flags(confirmed, "confirmed", batch, device)
        skip = check.check_flags(skip, "skip", batch, device)
        if skip is None:
            skip = torch.zeros(batch, dtype=torch.bool, device=device)
        return x, category, action, confirmed, skip

    def _one_factor_row(self, factors, limit: float | None = None) -> Tensor:
        """One decision's factors (numbers, a NumPy array or a tensor on any device) as a (1, K)
        row on the memory's device, in its precision, checked like ``x`` (``limit``: see
        :func:`gae.validation.check_factors`)."""
        device, dtype = self._device, self._float_dtype
        if isinstance(factors, Tensor):
            if factors.is_complex():
                raise TypeError(f"factors must be {self.n_factors} real numbers, got dtype {factors.dtype}")
            try:  # ints and bools are numbers; float64 stays float64 until its range is checked
                row = factors.detach().to(device, factors.dtype if factors.is_floating_point() else torch.float64)
            except RuntimeError as error:  # a meta tensor has no values to move
                raise ValueError(f"factors is on {factors.device} and cannot be moved to the memory's {device}: "
                                 f"{error}") from None
        else:
            try:
                raw = np.asarray(factors)
                if raw.dtype.kind != "c":  # numpy would drop the imaginary parts with a warning
                    row = torch.as_tensor(raw.astype(np.float64), device=device)
            except (TypeError, ValueError, OverflowError) as error:
                raise TypeError(f"factors must be {self.n_factors} numbers, got {factors!r}") from error
            if raw.dtype.kind == "c":
                raise TypeError(f"factors must be {self.n_factors} real numbers, got {factors!r} (dtype {raw.dtype})")
        if row.shape != (self.n_factors,):
            raise ValueError(f"factors must have {self.n_factors} values, got shape {tuple(row.shape)}")
        return check.check_factors(row.unsqueeze(0), self.n_factors, device, "factors", dtype=dtype, limit=limit)

    def _check_learnable(self) -> None:
        """Raise when the memory cannot learn at all as it is now (``decide`` refuses then too)."""

    def _category_index(self, category: str | int) -> int:
        if self.category_names is None:
            if isinstance(category, str):
                return 0  # categories are ignored by this memory; any name is fine
            if isinstance(category, bool) or not isinstance(category, numbers.Integral):
                raise TypeError(f"category must be a name or an int index, got {category!r}")
            if not 0 <= category < 2**63:
                raise ValueError(f"category index must be in [0, 2**63), got {category}")
            return int(category)
        return check.lookup("category", category, self.category_names)

    def _action_name(self, index: int) -> str | None:
        return None if index < 0 else self._action_names[index]


    # -- what a Decider builds on ----------------------------------------------------------
    def factor_row(self, factors: Sequence[float] | Tensor | np.ndarray) -> np.ndarray:
        """One decision's factors as a float64 NumPy row (a copy), checked as ``learn_one`` checks
        them (finite, within the learning limit, K of them) and refused when the memory cannot
        learn as it is: what a Decider keeps of a decision until it is verified. Raises
        ValueError / TypeError naming the problem."""
        self._check_learnable()
        row = self._learnable_row(factors)
        if row is not None:
            return row
        return self._one_factor_row(factors, check.LEARN_LIMIT)[0].detach().to("cpu", torch.float64).numpy()

    def _learnable_row(self, factors: Any) -> np.ndarray | None:
        """:meth:`factor_row` on the fast path: a float64 copy when the factors convert in one step
        and are finite within the learning limit, else None (the checked path says what is wrong)."""
        row = self._fast_row(factors)
        if row is not None and row.size:
            if factors.__class__ is list:  # its numbers summed and compared in Python cost less than in NumPy
                if math.isfinite(sum(factors)) and -check.LEARN_LIMIT <= min(factors) and max(factors) <= \
                        check.LEARN_LIMIT:  # (a NaN or an inf makes the sum NaN or inf)
                    return row  # (a new array)
            elif np.abs(row).max() <= check.LEARN_LIMIT:  # (False for NaN and inf)
                return row.copy()  # (the fast row may be the caller's own array)
        return None

    def assess_one(self, factors: Sequence[float] | Tensor | np.ndarray, category: str | int = "general",
                   inspect: bool = False) -> Assessment:
        """One decision's :class:`~gae.types.Assessment`: what ``score_one`` answers (the action
        as an index, -1 to abstain), every action's probability, the factors checked as
        ``learn_one`` checks them (a decision that could never be learned is refused now: ValueError
        / TypeError naming the problem, also when the memory cannot learn as it is), and with
        ``inspect`` what the memory's state says of the case (:meth:`inspect_one`, where it
        :attr:`inspects`). A memory built with ``grow=True`` abstains in a category it has not met,
        probabilities all 0. The batched ``forward`` here; a memory with a single-decision path
        answers there."""
        with self._lock:
            row = self.factor_row(factors)
            if self._unseen(category):
                return Assessment(-1, 0.0, [0.0] * len(self.action_names), row)
            x = self._one_factor_row(row)
            with torch.no_grad():
                out = self(x, torch.tensor([self._category_index(category)], device=x.device))
            state = self.inspect_one(row, category) if inspect and self.inspects else None
            return Assessment(int(out.action[0]), float(out.confidence[0]), out.probs[0].tolist(), row, state)

    def next_source_id(self) -> int | None:
        """The source id the next decision learned without one gets (one past the largest given so
        far, never reused): what a Decider on a ledger records for it. None for a memory that keeps
        no sources (it cannot forget by them)."""
        return None

    @property
    def next_seq(self) -> int:
        """The sequence number the next decision learned takes (``num_decisions`` as an int): what
        ``trace``, ``forget_`` and a Decider's act or refer key decisions by."""
        return self._buffers["num_decisions"].item()  # type: ignore[union-attr,return-value]  # (per verify: the buffer)

    def category_index(self, category: str | int) -> int:
        """The index of a category name or index (ValueError / TypeError for one the memory does
        not have; a memory that ignores categories takes any name as 0 and any index as itself)."""
        if category.__class__ is str:
            index = self._category_positions.get(category)
        elif category.__class__ is int and self._category_names is not None:
            index = category if 0 <= category < len(self._category_names) else None
        else:
            index = None
        return self._category_index(category) if index is None else index

    @property
    def inspects(self) -> bool:
        """Whether :meth:`inspect_one` has anything to say of this memory (a spread, a change test or
        judges): a caller may skip it otherwise."""
        return False

    def inspect_one(self, factors: Sequence[float] | Tensor | np.ndarray,
                    category: str | int = "general") -> CaseState:
        """What the memory's state says about one case and its category (:class:`~gae.types.CaseState`):
        its novelty, the support of the category's spread, the progress of its change test and its
        trust in each judge. A memory that keeps none of them answers ``nan``, 0, 0 and None."""
        with self._lock:
            self._one_factor_row(factors)
            self._category_index(category)
            return CaseState(math.nan, 0, 0.0, None)

    def trust_one(self, category: str | int = "general") -> tuple[float, ...] | None:
        """The category's trust in each judge (:attr:`~gae.types.CaseState.trust`), None without judges."""
        self._category_index(category)
        return None

    def action_index(self, action: str | int) -> int:
        """The index of an action name or index (ValueError / TypeError for one the memory does not have)."""
        if action.__class__ is str:
            index = self._action_positions.get(action)
            if index is not None:
                return index
        return check.lookup("action", action, self.action_names)

    def settings(self) -> dict[str, Any]:
        """What must be the same for two memories to learn alike (JSON values): a ledger records
        them, and a Decider opened on it with other settings is refused."""
        raise NotImplementedError

    @classmethod
    def default_settings(cls) -> dict[str, Any]:
        """Each setting's value for a ledger written before the setting existed."""
        return {}

    def empty_like(self, categories: Sequence[str] | None = None,
                   actions: Sequence[str] | None = None) -> DecisionMemory:
        """A memory with this one's factors and settings (and these names, default its own) that
        has learned nothing, in RAM, on the CPU."""
        raise NotImplementedError

    def explain(self, factors: Any, category: Any = "general") -> Any:
        """Every number behind the memory's answer for a decision (or a batch), nothing learned."""
        raise NotImplementedError

    def note_rebuilt_(self, version: int) -> None:
        """After a Decider rebuilt this memory's state from its ledger without some decisions
        (``forget_``, ``undo_``): move :attr:`version` past ``version`` where it only grows."""

    @property
    def version(self) -> int:
        """A number that changes whenever the memory learns or forgets."""
        raise NotImplementedError

    @property
    def state_mark(self) -> tuple[int, ...]:
        """What changes whenever the memory's state does, cheaply: its :attr:`version`, the states
        loaded and the edits made into it (a window cut, a delete), its vocabulary's sizes and each
        parameter's in-place updates (an optimizer step). A holder (a Decider on a ledger) compares
        it to tell whether another caller changed the memory."""
        return (self.version, self.__dict__.get("_edits", 0), len(self._action_names),
                len(self._category_names or ()), *(p._version for p in self._parameters.values() if p is not None))

    def _edited(self) -> None:
        """Count a change of the state that :attr:`version` does not (a load, a window cut, a delete)."""
        self.__dict__["_edits"] = self.__dict__.get("_edits", 0) + 1

    # -- names travel with the state ---------------------------------------------------
    factor_names: tuple[str, ...]

    def _names_state(self) -> dict[str, Any]:
        return {"category_names": None if self.category_names is None else list(self.category_names),
                "action_names": list(self.action_names), "factor_names": list(self.factor_names)}

    def get_extra_state(self) -> dict[str, Any]:
        return self._names_state()

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """The names are checked in ``_load_from_state_dict``, before any tensor is copied; what a
        memory saved before the Decider of its decisions and referral is the Decider's to load."""

    def _check_state(self, state_dict: Mapping[str, Any], prefix: str) -> None:
        """Refuse a state saved by a memory with other names (or another mode)."""
        extra = state_dict.get(prefix + "_extra_state")
        if extra is not None:
            if not isinstance(extra, dict):
                raise ValueError(f"{prefix}_extra_state must be the dict a {type(self).__name__} saves, "
                                 f"got {type(extra).__name__}")
            self._check_names_state(extra)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *args, **kwargs) -> None:
        upgrade = getattr(self, "_upgrade_state", None)
        if upgrade is not None:  # in place, as torch.nn.BatchNorm does: torch passes its own copy of the dict
            upgrade(state_dict, prefix, local_metadata.get("version"))
        check_state_dict(self, state_dict, prefix)  # the whole memory, before any tensor is copied
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False, *,
                        quiet: bool = False):
        """:meth:`torch.nn.Module.load_state_dict`, all or nothing.

        A state saved by a memory of other names, mode or sizes is refused before anything is
        copied (ValueError naming each tensor's saved and current shape); if anything else fails
        half-way (a tampered extra state), the memory is put back as it was and the error raised.
        A state saved by a gae before the :class:`~gae.Decider` may hold pending decisions and a
        referral: the memory loads its own part, and warns (unless ``quiet``) that
        ``Decider(memory).load_state_dict(state)`` keeps the rest.
        """
        extra = state_dict.get("_extra_state") if isinstance(state_dict, Mapping) else None
        if not quiet and isinstance(extra, dict) and (extra.get("pending") or {}).get("id"):
            warnings.warn(f"this state holds {len(extra['pending']['id'])} pending decision(s) (saved by a gae "
                          "before the Decider): the memory loads its own state; load it with "
                          "Decider(memory).load_state_dict(state) to keep them", stacklevel=2)
        with self._lock:
            self._drop_views()  # a load may swap the tensors' data in place (torch's swap_tensors)
            loaded = load_all_or_nothing(self, super().load_state_dict, state_dict, strict, assign)
            self._edited()
            return loaded

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """:meth:`torch.nn.Module.state_dict`, of one state: taken under the memory's lock, its
        tensors copies made there (unless ``keep_vars``), so ``torch.save`` of it while another
        thread learns writes a whole checkpoint. A containing module's ``state_dict`` comes
        through here too."""
        with self._lock:
            state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
            if not keep_vars:  # this memory's entries only: a parent's destination holds others too
                for key, value in state.items():
                    if key.startswith(prefix) and isinstance(value, Tensor):
                        state[key] = value.clone()
            return state

    def parameter_inventory(self) -> dict[str, int]:
        """Every number the memory holds, by parameter and buffer name, and their ``total``."""
        inventory = {name: p.numel() for name, p in self.named_parameters()}
        inventory.update({name: b.numel() for name, b in self.named_buffers()})
        inventory["total"] = sum(inventory.values())
        return inventory

    def _check_names_state(self, state: dict[str, Any]) -> None:
        for key in ("category_names", "action_names", "factor_names"):
            mine = getattr(self, key)
            mine = None if mine is None else list(mine)
            if key in state and state[key] != mine:
                raise ValueError(f"state_dict was saved with {key}={state[key]!r} but this memory has {mine!r}")

    def __getstate__(self) -> dict[str, Any]:
        """The attributes without the lock (each copy gets its own) and the single-decision views
        (views of this instance's tensors: a copy builds its own)."""
        state = dict(super().__getstate__())
        state.pop("_lock", None)
        for name in VIEWS:
            if state.get(name) is not None:
                state[name] = _fresh(state[name])
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A deep copy made whole under the lock (deepcopy reads the attributes after
        ``__getstate__`` returns, when another thread may be learning). Pickling keeps torch's
        own path (``map_location``, shared memory, shared parameters), so it is not locked:
        pickle a memory while no other thread learns it, or pickle a deep copy."""
        return locked_deepcopy(self, self._lock, memo)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__["_lock"] = threading.RLock()
        for name in ("_open", "expired_decisions", "referral", "_max_pending", "_pending_ttl"):
            self.__dict__.pop(name, None)  # pickled by a gae before the Decider: serving state is the Decider's
        self._drop_views()  # fresh views whoever pickled them (an older gae's hold other fields)
        self._migrated()

    def _migrated(self) -> None:
        """After unpickling: what a subclass computes from its state that an older gae did not keep."""

    def note_sources_(self, following: int) -> None:
        """After a Decider rebuilt this memory from its ledger: the next default source id is at
        least ``following``. A memory that keeps no sources has nothing to note."""

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        """torch's conversions (``to``, ``float``, ``share_memory``, ...): a conversion may move a
        tensor's data without replacing the tensor, so the single-decision views (``_host``,
        which every memory that has them keeps) are built again, as after any replacement of a
        buffer or parameter (assignment, ``register_buffer``, a load, a growth): the views then
        need not compare every tensor on every call."""
        result = super()._apply(fn, recurse)
        self._drop_views()
        return result

    def _drop_views(self) -> None:
        for name in VIEWS:
            views = self.__dict__.get(name)
            if views is not None:
                self.__dict__[name] = _fresh(views)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self.__dict__.get("_buffers", ()) or name in self.__dict__.get("_parameters", ()):
            self._drop_views()  # a tensor the views point into was replaced

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self._drop_views()

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        super().register_buffer(name, tensor, persistent)
        self._drop_views()

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        super().register_parameter(name, param)
        self._drop_views()


def _fresh(views: Any) -> Any:
    """An empty holder of the same views: its ``fresh()`` where it needs arguments, else a new one."""
    return views.fresh() if hasattr(views, "fresh") else type(views)()
