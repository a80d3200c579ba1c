"""KNN-ADWIN: a k-NN whose window is cut when a drift detector watching its own errors fires.

The evaluation's contestant ``knn_adwin`` (Bifet and Gavaldà's ADWIN on the prequential error of
a k-NN, as scikit-multiflow's ``KNNADWINClassifier``). It lives in ``training/`` because the
detector is river's :class:`river.drift.ADWIN`, an optional dependency (``pip install river``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gae import KNNMemory
from gae.moved import refuse_serving
from gae.types import LearnEvents, MemoryOutput, Retrieved, StreamStep
from gae.validation import Names, names_by_keyword

_CHUNK = 256  # decisions scored ahead of the detector per engine call (a cut re-runs the chunk's prefix)


def _adwin(delta: float) -> Any:
    """A fresh :class:`river.drift.ADWIN` with significance ``delta`` (river's other defaults)."""
    try:
        from river import drift
    except ImportError as error:
        raise ImportError("ADWINKNNMemory needs river for its drift detector: pip install river") from error
    return drift.ADWIN(delta=delta)


def _concat(steps: list[StreamStep]) -> StreamStep:
    """The steps of consecutive chunks of a k-NN stream as one (the fields a k-NN fills)."""
    if len(steps) == 1:
        return steps[0]
    output = MemoryOutput(*(torch.cat(parts) for parts in zip(*(s.output for s in steps), strict=True)))
    events = LearnEvents(*(torch.cat(parts) for parts in zip(*(s.events for s in steps), strict=True)))
    retrieved = [step.retrieved for step in steps if step.retrieved is not None]  # a k-NN always fills it
    return StreamStep(output, events, None, retrieved=Retrieved(torch.cat([r.ids for r in retrieved]),
                                                                 torch.cat([r.scores for r in retrieved])))


class ADWINKNNMemory(KNNMemory):
    r"""A :class:`~gae.KNNMemory` whose window ADWIN cuts when the k-NN's error rate changes.

    Each decision is scored before it is learned, exactly as by a :class:`~gae.KNNMemory` of the
    same options, and its error :math:`e_t = [\hat a_t \ne a_t]` (an abstention counts as an
    error) is fed to an ADWIN detector. When ADWIN detects a change in the mean of :math:`e`,
    it drops the older part of its own window, keeping its newest :math:`W` errors; the k-NN then
    keeps only its :math:`W` newest traces (:meth:`~gae.KNNMemory.keep_newest_`), after that
    decision is learned:

    .. math::
        \text{ADWIN fires after decision } t \implies
        \text{traces} \leftarrow \text{the newest } \min(W_t, \text{len}) \text{ traces}

    scikit-multiflow's ``KNNADWINClassifier`` (default window 1000, as ``capacity`` here) stores
    a sample before it predicts it, so the sample is among its own neighbours; here the error is
    prequential. Like it, a k-NN with fewer than ``k`` traces in reach counts as wrong, and a
    detection cuts only when ADWIN's window is shorter than the k-NN's.

    A decision flagged ``skip`` (an uncertain outcome) is not fed to the detector: its action is
    not verified, so whether the k-NN was wrong about it is unknown. The k-NN still stores it
    unless ``respect_skip`` (as :class:`~gae.KNNMemory`), so a cut keeps the :math:`W` newest
    traces, which may cover fewer decisions than the detector's window when skipped ones are
    stored.

    Args:
        factors: number of factors, or their names; a keyword, as ``actions`` (see :class:`~gae.KNNMemory`).
        actions: number of actions, or their names.
        k: neighbours that vote. Default: 5.
        capacity: the most traces kept (KNN-ADWIN's maximum window). Default: 1000.
        categories: number of categories, or their names; None ignores categories. Default: None.
        scoped: restrict neighbours to the decision's category (needs ``categories``). Default: False.
        delta: ADWIN's significance, in (0, 1); smaller fires less often. Default: 0.002 (river's).
        respect_skip: do not store decisions marked ``skip``. Default: False.

    Attributes:
        detector: the :class:`river.drift.ADWIN` watching the errors (``width``, ``estimation``).
        cuts: list of int, the sequence number of each decision after which the window was cut
            (a detection that would keep every trace is not a cut).
        num_cuts: ``len(cuts)``.
        store_factors, store_actions, store_categories, store_steps, ring, num_decisions: the
            k-NN's buffers (:class:`~gae.KNNMemory`).

    ``state_dict`` holds the k-NN's buffers and ``cuts`` (extra state); the detector is not a
    tensor and is not saved: after :meth:`load_state_dict` it starts afresh, with an empty
    window. ``copy.deepcopy`` and pickle copy it whole.

    Thread safety: as :class:`~gae.KNNMemory`. The detector and ``cuts`` change only while the
    memory learns (``prequential_``, ``learn_``, ``learn_one``) or loads, under its lock, so they
    stay in step with the window.

    Examples::

        >>> memory = ADWINKNNMemory(factors=1, actions=["low", "high"], k=1, capacity=100)
        >>> x = torch.tensor([[0.1], [0.9]]).repeat(300, 1)
        >>> action = torch.tensor([0, 1]).repeat(300)
        >>> action[300:] = 1 - action[300:]  # the mapping flips half-way
        >>> step = memory.prequential_(x, torch.zeros(600, dtype=torch.long), action)
        >>> memory.num_cuts > 0 and memory.cuts[0] >= 300
        True
        >>> bool((step.output.action[-100:] == action[-100:]).all())  # recovered
        True
    """

    delta: float
    detector: Any  # river.drift.ADWIN
    cuts: list[int]

    @names_by_keyword
    def __init__(self, *, factors: Names, actions: Names, k: int = 5, capacity: int = 1000,
                 categories: Names | None = None, scoped: bool = False, delta: float = 0.002,
                 respect_skip: bool = False, **serving: Any) -> None:
        refuse_serving(type(self).__name__, serving)
        if serving:
            raise TypeError(f"ADWINKNNMemory() got unexpected keyword argument(s) {sorted(serving)}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        super().__init__(factors=factors, actions=actions, k=k, capacity=capacity, categories=categories, scoped=scoped,
                         respect_skip=respect_skip)
        self.delta = float(delta)
        self.detector = _adwin(self.delta)
        self.cuts = []

    def settings(self) -> dict[str, Any]:
        """:meth:`KNNMemory.settings` and ``delta``: what a ledger records."""
        return {**super().settings(), "delta": self.delta}

    def empty_like(self, categories: Sequence[str] | None = None,
                   actions: Sequence[str] | None = None) -> ADWINKNNMemory:
        """A memory with this one's factors and settings, a fresh detector and no cuts, that has
        learned nothing, in RAM, on the CPU."""
        blank = ADWINKNNMemory(factors=self.factor_names, actions=self.action_names if actions is None else actions,
                               k=self.k, capacity=self.capacity,
                               categories=self.category_names if categories is None else categories,
                               scoped=self.scoped, delta=self.delta, respect_skip=self.respect_skip)
        blank.backend = self.backend
        return blank

    @property
    def num_cuts(self) -> int:
        """How many times the window was cut."""
        return len(self.cuts)

    def learn_one(self, factors, action: str | int, category: str | int = "general", confirmed: bool | None = True,
                  outcome: str | None = None, *, source_id: int | None = None) -> dict[str, Any]:
        """Learn one decision through :meth:`prequential_`, so the detector sees it (the checked
        path of every gae decision memory: KNNMemory's single-decision path would bypass it)."""
        return super(KNNMemory, self).learn_one(factors, action, category, confirmed, outcome, source_id=source_id)

    def _prequential(self, x, category, action, confirmed, skip, source_ids=None) -> StreamStep:
        """Chunks of the k-NN's own engine, scored ahead of the detector: when it fires inside a
        chunk, the ring is put back and only the chunk's prefix up to that decision is learned
        again (the engine is deterministic, so the answers are the same), then the window is cut."""
        def engine(part: slice) -> StreamStep:
            return KNNMemory._prequential(self, x[part], category[part], action[part],
                                          None if confirmed is None else confirmed[part], skip[part])

        buffers = (self.store_factors, self.store_actions, self.store_categories, self.store_steps, self.ring,
                   self.num_decisions)
        steps, start, n = [], 0, x.shape[0]
        while start < n:
            stop = min(n, start + _CHUNK)
            before = [buffer.clone() for buffer in buffers]
            step = engine(slice(start, stop))
            fired = self._feed((step.output.action != action[start:stop]).tolist(), skip[start:stop].tolist())
            if fired is not None and start + fired + 1 < stop:
                for buffer, saved in zip(buffers, before, strict=True):
                    buffer.copy_(saved)  # in place: the single-decision path's views stay valid
                stop = start + fired + 1
                step = engine(slice(start, stop))
            if fired is not None and self.keep_newest_(int(self.detector.width)):
                self.cuts.append(int(self.num_decisions) - 1)
            steps.append(step)
            start = stop
        return _concat(steps)

    def _feed(self, wrong: list[bool], skipped: list[bool]) -> int | None:
        """Feed the detector each verified decision's error, in order, up to the first that makes
        it fire: that decision's position in the chunk, or None."""
        for position, (error, skip) in enumerate(zip(wrong, skipped, strict=True)):
            if skip:
                continue
            self.detector.update(1.0 if error else 0.0)
            if self.detector.drift_detected:
                return position
        return None

    # -- state: the cuts travel in the extra state; the detector starts afresh on a load -------
    def get_extra_state(self) -> dict[str, Any]:
        return {**super().get_extra_state(), "cuts": list(self.cuts)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.cuts = [int(step) for step in state.get("cuts", [])]

    def _check_state(self, state_dict: Mapping[str, Any], prefix: str) -> None:
        super()._check_state(state_dict, prefix)
        extra = state_dict.get(prefix + "_extra_state")
        cuts = extra.get("cuts", []) if isinstance(extra, dict) else []
        if not isinstance(cuts, list) or not all(type(step) is int and step >= 0 for step in cuts):
            raise ValueError(f"{prefix}_extra_state['cuts'] must be a list of decision numbers (ints >= 0), "
                             f"got {cuts!r}")

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False, *,
                        quiet: bool = False):
        """:meth:`KNNMemory.load_state_dict`, then a fresh detector (its window is not saved)."""
        with self._lock:  # the load and the fresh detector, one call for the other threads
            result = super().load_state_dict(state_dict, strict, assign, quiet=quiet)
            self.detector = _adwin(self.delta)
            return result

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, delta={self.delta}"
