"""What every decision memory shares: names, boundary checks, the single-decision API and safe loading."""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from gae import validation as check
from gae._views import ViewsMixin
from gae.durable import DurableMixin
from gae.lifecycle import MAX_PENDING, LifecycleMixin
from gae.refer import Referral
from gae.state_dicts import check_state_dict, load_all_or_nothing
from gae.types import LearnEvents, StreamStep

INCORRECT = "__incorrect__"  # the original API's outcome marker for an uncertain decision
FLOAT64 = np.dtype(np.float64)  # the single-decision rows' dtype (NumPy keeps one object per builtin dtype)


class DecisionMemory(LifecycleMixin, DurableMixin, ViewsMixin, nn.Module):
    """Base of :class:`~gae.JudgmentMemory` and :class:`~gae.KNNMemory`.

    Subclasses set ``category_names`` (or None when categories are ignored),
    ``action_names`` and ``n_factors``, and implement ``forward`` and ``_prequential``
    on inputs that have already been validated.

    Thread safety: every memory holds one re-entrant lock (``_lock``, a
    :class:`threading.RLock`) that each public call holds from its checks to its last write,
    so learning is serialized (calls apply one after another, in the order the lock was
    taken), a score taken while another thread learns sees the state before or after that
    whole call, never half of it, and the logs stay consistent. A subclass takes the same lock
    in every public method it overrides. ``state_dict()`` and ``copy.deepcopy`` are taken whole
    under it; pickle (and ``torch.save`` of a whole module) keeps torch's own path and is not
    locked: pickle a memory while no other thread learns it. A copy gets a lock of its own.
    """

    def __init__(self, *, max_pending: int = MAX_PENDING, pending_ttl: float | None = None) -> None:
        super().__init__()
        self.__dict__["_lock"] = threading.RLock()  # outside nn.Module's attribute machinery
        self._init_pending(max_pending, pending_ttl)  # decide / verify (gae/lifecycle.py)
        self.referral = Referral()  # act or refer (gae/refer.py); a subclass with options sets its own before it
        # loads a state (_fresh_referral: what an older pickle without one gets)

    n_factors: int
    _lock: threading.RLock  # see the class docstring; outside nn.Module's attributes, so not a buffer or module
    backend: str = "compiled"
    grow: bool = False  # learn_one adds an action or category it has not met (see add_actions_)

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
                ``forget_``. Default: the decisions' sequence numbers. Memories without a log
                validate and ignore them.

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
                  outcome: str | None = None) -> dict[str, Any]:
        """Learn one verified decision; ``outcome='__incorrect__'`` marks it uncertain (skipped).

        Returns a dict like the original: ``{'skipped': True}`` or the gate's verdict with
        ``gated``, ``eta``, ``disp`` and ``initialized``. A memory built with ``grow=True``
        adds an action or category name it has not met (:meth:`add_actions_`).
        """
        return self._learn_checked(factors, action, category, confirmed, outcome, None)

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
            sources = None if source_id is None else torch.tensor([source_id], device=device)
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

    # -- names travel with the state ---------------------------------------------------
    factor_names: tuple[str, ...]

    def _names_state(self) -> dict[str, Any]:
        return {"category_names": None if self.category_names is None else list(self.category_names),
                "action_names": list(self.action_names), "factor_names": list(self.factor_names)}

    def get_extra_state(self) -> dict[str, Any]:
        return {**self._names_state(), **self._pending_state(), "referral": self.referral.state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.referral.load_state(state.get("referral"))  # checked whole first: a bad one raises here, first
        self._load_pending_state(state)  # the names are checked in _load_from_state_dict, before any tensor is copied

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

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """:meth:`torch.nn.Module.load_state_dict`, all or nothing.

        A state saved by a memory of other names, mode or sizes is refused before anything is
        copied (ValueError naming each tensor's saved and current shape); if anything else fails
        half-way (a tampered extra state), the memory is put back as it was and the error raised.
        """
        with self._lock:
            self._drop_views()  # a load may swap the tensors' data in place (torch's swap_tensors)
            return load_all_or_nothing(self, super().load_state_dict, state_dict, strict, assign)

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

