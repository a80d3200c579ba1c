r"""Metrics of a prequential stream: accuracy, calibration, abstention, gating and prototype drift.

Every input is a *pre-learning* output of :meth:`~gae.JudgmentMemory.prequential_` (or the
memory's state around it), one entry per decision, in stream order. An abstention (action
``-1``) counts as wrong everywhere and, in calibration, as confidence 0.

The maths lives in plain functions in :mod:`training.metrics_functional` (:func:`correctness`, :func:`rolling_accuracy`,
:func:`calibration_bins`, :func:`calibration_error`, :func:`mean_distance`); each
:class:`torchmetrics.Metric` below validates its input, calls them and holds the state.

Stream semantics, shared by every metric here:

- ``compute()`` gives the value over the decisions seen since the last reset (0 before any);
  ``forward(batch)`` is ``update(batch)`` then ``compute()``: in a stream the value that matters
  after a batch is the running one, not the value of the batch alone.
- Every state is persistent (in ``state_dict``), so a run resumed from a checkpoint ends with
  the same metrics as an uninterrupted one.
- Under DDP, every rank runs the memory over the same, global stream (that is how the memory
  stays identical on every rank), so every rank feeds these metrics the same decisions and
  holds the same states. Each state is therefore declared with
  ``dist_reduce_fx=same_on_every_rank``: on sync it checks that the gathered copies agree
  and keeps one. A sum would count every decision once per rank; a rank that was fed only
  its shard of the stream is refused loudly instead of being averaged into a wrong number.
  As the states already agree, ``sync_on_compute=False`` (a keyword every metric passes on
  to :class:`~torchmetrics.Metric`) skips the collectives and the check.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection

from training.metrics_functional import (
    _check_positive_int,
    _check_predictions,
    _check_vector,
    _ece_from_bins,
    _rate,
    calibration_bins,
    calibration_error,
    correctness,
    mean_distance,
    rolling_accuracy,
)

__all__ = ["AbstentionRate", "CumulativeAccuracy", "ExpectedCalibrationError", "GateRate", "PrototypeDrift",
           "RollingAccuracy", "StreamMetrics", "calibration_bins", "calibration_error", "correctness",
           "mean_distance", "rolling_accuracy", "same_on_every_rank"]

# -- the metrics -----------------------------------------------------------------------------


def same_on_every_rank(gathered: Tensor) -> Tensor:
    """DDP reduction of a state every rank holds identically: check the (world, ...) copies agree, keep one."""
    first = gathered[0]
    if gathered.is_floating_point():
        agree = torch.allclose(gathered, first.expand_as(gathered), rtol=1e-6, atol=1e-9)
    else:
        agree = torch.equal(gathered, first.expand_as(gathered))
    if not agree:
        raise RuntimeError("stream metric states differ between ranks: every rank must feed the metrics the same, "
                           "global stream of decisions (the one its memory learns from), not its own shard")
    return first


class _StreamMetric(Metric):
    """Base of the metrics here: persistent states that every rank holds identically, stream ``forward``."""

    full_state_update = True  # the states are not merged batch by batch (see ``same_on_every_rank``)
    is_differentiable = False

    def _add_stream_state(self, name: str, default: Tensor) -> None:
        self.add_state(name, default, dist_reduce_fx=same_on_every_rank, persistent=True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``update(*args, **kwargs)`` then ``compute()``: the running value after this batch."""
        self.update(*args, **kwargs)
        self._forward_cache = self.compute()
        return self._forward_cache

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        loaded = {name: state_dict[prefix + name] for name in self._defaults if prefix + name in state_dict}
        for name, value in loaded.items():  # refuse before anything is set (e.g. another window size)
            default = self._defaults[name]
            if isinstance(default, Tensor) and default.numel() and value.shape != default.shape:
                raise ValueError(f"{prefix + name} has shape {tuple(value.shape)} in the state_dict but "
                                 f"{type(self).__name__} expects {tuple(default.shape)}")
        if strict:
            missing_keys.extend(prefix + name for name in self._defaults if name not in loaded)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for name, value in loaded.items():  # own copies on this metric's device, never the caller's tensors
            setattr(self, name, value.detach().to(self.device, copy=True))


class RollingAccuracy(_StreamMetric):
    r"""Accuracy over the last ``window`` decisions (not batches) of the stream.

    A ring holds the correctness of the last ``window`` decisions; decision ``t`` (0-based)
    is written at slot ``t mod window``. ``compute()`` is the accuracy of the last
    ``min(window, seen)`` decisions; :meth:`rolling_curve` the value after each decision of
    the latest update, for plots against the decision index.

    Args:
        window: decisions in the window. Default: 50.

    Shape:
        - pred: (B,) int64, the pre-learning action, -1 for an abstention.
        - target: (B,) int64, the action that counts as right.

    Attributes:
        ring: (window,) bool, correctness of the last decisions, by slot.
        seen: () int64, decisions seen since the last reset.

    Examples::

        >>> metric = RollingAccuracy(window=3)
        >>> metric.update(torch.tensor([0, 1, -1, 2]), torch.tensor([0, 1, 2, 2]))
        >>> metric.compute()
        tensor(0.6667)
        >>> metric.rolling_curve()
        tensor([1.0000, 1.0000, 0.6667, 0.6667])
    """

    higher_is_better = True
    ring: Tensor
    seen: Tensor

    def __init__(self, window: int = 50, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.window = _check_positive_int("window", window)
        self._add_stream_state("ring", torch.zeros(window, dtype=torch.bool))
        self._add_stream_state("seen", torch.zeros((), dtype=torch.int64))
        self._curve: Tensor | None = None

    def _history(self) -> Tensor:
        """Correctness of the last ``min(window, seen)`` decisions, oldest first."""
        seen = int(self.seen)
        if seen <= self.window:
            return self.ring[:seen]
        return self.ring.roll(-(seen % self.window))

    def update(self, pred: Tensor, target: Tensor) -> None:
        _check_predictions(pred, target)
        correct = correctness(pred, target)
        history = self._history()
        self._curve = rolling_accuracy(torch.cat([history, correct]), self.window)[history.shape[0]:]
        n = correct.shape[0]
        kept = min(n, self.window)  # older decisions of a long batch leave the window anyway
        slots = (self.seen + torch.arange(n - kept, n, device=self.ring.device)) % self.window
        self.ring[slots] = correct[n - kept:]
        self.seen += n

    def compute(self) -> Tensor:
        return _rate(self.ring.sum(), self.seen.clamp(max=self.window))

    def rolling_curve(self) -> Tensor:
        """(B,) rolling accuracy after each decision of the latest ``update``."""
        if self._curve is None:
            raise RuntimeError("rolling_curve() needs an update() since the metric was made or reset")
        return self._curve

    def reset(self) -> None:
        super().reset()
        self._curve = None


class CumulativeAccuracy(_StreamMetric):
    """Accuracy over every decision since the last reset. Same shapes as :class:`RollingAccuracy`.

    Attributes:
        correct: () int64, right predictions. total: () int64, decisions.

    Examples::

        >>> metric = CumulativeAccuracy()
        >>> metric.update(torch.tensor([0, 1, -1, 2]), torch.tensor([0, 1, 2, 2]))
        >>> metric.compute()
        tensor(0.7500)
    """

    higher_is_better = True
    correct: Tensor
    total: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_stream_state("correct", torch.zeros((), dtype=torch.int64))
        self._add_stream_state("total", torch.zeros((), dtype=torch.int64))

    def update(self, pred: Tensor, target: Tensor) -> None:
        _check_predictions(pred, target)
        self.correct += correctness(pred, target).sum()
        self.total += pred.shape[0]

    def compute(self) -> Tensor:
        return _rate(self.correct, self.total)


class ExpectedCalibrationError(_StreamMetric):
    """Expected calibration error of the confidence against correctness (:func:`calibration_error`).

    An abstention counts as confidence 0 and wrong, whatever confidence is passed with it.

    Args:
        n_bins: equal-width confidence bins over [0, 1]. Default: 15.

    Shape:
        - pred, target: (B,) int64 as in :class:`RollingAccuracy`.
        - confidence: (B,) float in [0, 1], the probability of ``pred``.

    Attributes:
        count: (n_bins,) int64. confidence_sum: (n_bins,) float64. correct_sum: (n_bins,) int64.

    Examples::

        >>> metric = ExpectedCalibrationError(n_bins=10)
        >>> metric.update(torch.tensor([0, 1, 2, -1]), torch.tensor([0, 0, 1, 1]), torch.tensor([0.9, 0.9, 0.2, 0.5]))
        >>> metric.compute()
        tensor(0.2500)
    """

    higher_is_better = False
    count: Tensor
    confidence_sum: Tensor
    correct_sum: Tensor

    def __init__(self, n_bins: int = 15, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_bins = _check_positive_int("n_bins", n_bins)
        self._add_stream_state("count", torch.zeros(n_bins, dtype=torch.int64))
        self._add_stream_state("confidence_sum", torch.zeros(n_bins, dtype=torch.float64))
        self._add_stream_state("correct_sum", torch.zeros(n_bins, dtype=torch.int64))

    def update(self, pred: Tensor, target: Tensor, confidence: Tensor) -> None:
        _check_predictions(pred, target, confidence)
        confidence = confidence.where(pred >= 0, 0)
        count, confidence_sum, correct_sum = calibration_bins(confidence, correctness(pred, target), self.n_bins)
        self.count += count
        self.confidence_sum += confidence_sum
        self.correct_sum += correct_sum

    def compute(self) -> Tensor:
        return _ece_from_bins(self.count, self.confidence_sum, self.correct_sum)


class AbstentionRate(_StreamMetric):
    """Fraction of decisions where the memory abstained (``pred == -1``).

    Attributes:
        abstained: () int64. total: () int64.

    Examples::

        >>> metric = AbstentionRate()
        >>> metric.update(torch.tensor([0, -1, -1, 2]))
        >>> metric.compute()
        tensor(0.5000)
    """

    higher_is_better = False
    abstained: Tensor
    total: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_stream_state("abstained", torch.zeros((), dtype=torch.int64))
        self._add_stream_state("total", torch.zeros((), dtype=torch.int64))

    def update(self, pred: Tensor) -> None:
        _check_predictions(pred)
        self.abstained += (pred < 0).sum()
        self.total += pred.shape[0]

    def compute(self) -> Tensor:
        return _rate(self.abstained, self.total)


class GateRate(_StreamMetric):
    """Drift-gate events per applied update (:attr:`~gae.types.LearnEvents.gated` / ``applied``).

    ``compute()`` returns ``{'gate/rate': events / applied updates (0 before any),
    'gate/events': the number of gate events, 'gate/promotions': the number of promotions of
    shadow prototypes (``drift_mode='adaptive'``), 'gate/recycles': the number of recycled
    prototypes (``prototypes > 1``)}``.

    Shape:
        - gated, applied: (B,) bool, as in :class:`~gae.types.LearnEvents`; a gated step is applied.
        - promoted: (B,) bool or None (no promotions).
        - recycled: (B,) bool or None (no recycled prototypes).

    Attributes:
        gated: () int64. applied: () int64. promoted: () int64. recycled: () int64.

    Examples::

        >>> metric = GateRate()
        >>> metric.update(torch.tensor([True, False, False, False]), torch.tensor([True, True, False, True]))
        >>> {tag: round(float(value), 4) for tag, value in metric.compute().items()}
        {'gate/rate': 0.3333, 'gate/events': 1.0, 'gate/promotions': 0.0, 'gate/recycles': 0.0}
    """

    higher_is_better = False
    gated: Tensor
    applied: Tensor
    promoted: Tensor
    recycled: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_stream_state("gated", torch.zeros((), dtype=torch.int64))
        self._add_stream_state("applied", torch.zeros((), dtype=torch.int64))
        self._add_stream_state("promoted", torch.zeros((), dtype=torch.int64))
        self._add_stream_state("recycled", torch.zeros((), dtype=torch.int64))

    def update(self, gated: Tensor, applied: Tensor, promoted: Tensor | None = None,
               recycled: Tensor | None = None) -> None:
        _check_vector("gated", gated, "bool")
        _check_vector("applied", applied, "bool", gated.shape[0])
        for name, flags in (("promoted", promoted), ("recycled", recycled)):
            if flags is not None:
                _check_vector(name, flags, "bool", gated.shape[0])
        unapplied = gated & ~applied
        if bool(unapplied.any()):
            raise ValueError(f"gated marks a step that applied does not, at [{int(unapplied.nonzero()[0, 0])}]: "
                             "a gated step is damped, not dropped")
        self.gated += gated.sum()
        self.applied += applied.sum()
        if promoted is not None:
            self.promoted += promoted.sum()
        if recycled is not None:
            self.recycled += recycled.sum()

    def compute(self) -> dict[str, Tensor]:
        return {"gate/rate": _rate(self.gated, self.applied), "gate/events": self.gated,
                "gate/promotions": self.promoted, "gate/recycles": self.recycled}


class PrototypeDrift(_StreamMetric):
    r"""How far the prototypes move: in the latest batch, and in all since they were first seen.

    Call ``update(before, after, initialized)`` after every batch, with the centroids before
    and after it and the ``initialized`` mask after it. With :math:`E` the prototypes
    initialized both at the previous update and now, and :math:`I` those initialized now,

    .. math::
        \text{shift} = \frac{1}{|E|}\sum_{(c,a) \in E} \lVert \mu^{after}_{c,a} - \mu^{before}_{c,a} \rVert_2,
        \qquad
        \text{from\_start} = \frac{1}{|I|}\sum_{(c,a) \in I} \lVert \mu^{after}_{c,a} - \mu^{start}_{c,a} \rVert_2

    (0 over an empty set), where :math:`\mu^{start}` is a prototype as first seen, at the end
    of the batch that created it. A prototype created in a batch is left out of that batch's
    shift (it has no earlier position); one that stops being initialized (``undo_``,
    ``forget_``) is forgotten and starts afresh when made again. ``compute()`` returns
    ``{'drift/shift': ..., 'drift/from_start': ...}``. The state takes its shape from the
    first update; ``reset()`` before following another memory.

    Shape:
        - before, after: (C, A, K) float, one prototype per (category, action): a
          ``JudgmentMemory``'s (C, A, P, K) ``centroids`` with the slots flattened into A.
        - initialized: (C, A) bool, ``JudgmentMemory.initialized`` after the batch (flattened alike).

    Attributes:
        start: (C, A, K), each tracked prototype as first seen (empty before the first update).
        tracked: (C, A) bool, the prototypes initialized at the latest update.
        shift: () float, from_start: () float, the values after the latest update.

    Examples::

        >>> metric = PrototypeDrift()
        >>> zero, one = torch.zeros(1, 2, 2), torch.tensor([[True, False]])
        >>> metric.update(zero, torch.tensor([[[3.0, 0.0], [0.0, 0.0]]]), one)
        >>> metric.update(torch.tensor([[[3.0, 0.0], [0.0, 0.0]]]), torch.tensor([[[3.0, 4.0], [0.0, 0.0]]]), one)
        >>> metric.compute()
        {'drift/shift': tensor(4.), 'drift/from_start': tensor(4.)}
    """

    higher_is_better = False
    start: Tensor
    tracked: Tensor
    shift: Tensor
    from_start: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_stream_state("start", torch.zeros(0))
        self._add_stream_state("tracked", torch.zeros(0, dtype=torch.bool))
        self._add_stream_state("shift", torch.zeros(()))
        self._add_stream_state("from_start", torch.zeros(()))

    def update(self, before: Tensor, after: Tensor, initialized: Tensor) -> None:
        for name, value in (("before", before), ("after", after)):
            if not isinstance(value, Tensor) or not value.is_floating_point() or value.dim() != 3:
                raise TypeError(f"{name} must be a floating (C, A, K) tensor, got "
                                f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}")
        if after.shape != before.shape:
            raise ValueError(f"after must have the shape of before {tuple(before.shape)}, got {tuple(after.shape)}")
        if not isinstance(initialized, Tensor) or initialized.dtype != torch.bool:
            raise TypeError(f"initialized must be a bool tensor, got "
                            f"{initialized.dtype if isinstance(initialized, Tensor) else type(initialized).__name__}")
        if initialized.shape != before.shape[:2]:
            raise ValueError(f"initialized must have shape {tuple(before.shape[:2])}, got {tuple(initialized.shape)}")
        if self.start.numel() and self.start.shape != after.shape:
            raise ValueError(f"after has shape {tuple(after.shape)} but this metric follows prototypes of shape "
                             f"{tuple(self.start.shape)}; reset() it to follow another memory")
        if not self.start.numel():
            self.start = torch.zeros_like(after)
            self.tracked = torch.zeros_like(initialized)
        self.shift = mean_distance(after, before, self.tracked & initialized)
        first_seen = initialized & ~self.tracked
        self.start = torch.where(first_seen.unsqueeze(-1), after, self.start)
        self.tracked = initialized.clone()
        self.from_start = mean_distance(after, self.start, initialized)

    def compute(self) -> dict[str, Tensor]:
        return {"drift/shift": self.shift, "drift/from_start": self.from_start}


class StreamMetrics(MetricCollection):
    """The accuracy, calibration and abstention of one memory, under keys ending in ``_{suffix}``.

    ``compute()`` returns ``{'acc/rolling_{suffix}', 'acc/cumulative_{suffix}',
    'calibration/ece_{suffix}', 'abstain/rate_{suffix}'}``; hold one per memory
    (``StreamMetrics('jm')``, ``StreamMetrics('knn')``), or one per TensorBoard run without a
    suffix (``StreamMetrics()``: ``'acc/rolling'``, ...), as the training module does.

    Args:
        suffix: the memory's short name in the keys, or None for the bare keys. Default: None.
        window: of :class:`RollingAccuracy`. Default: 50.
        n_bins: of :class:`ExpectedCalibrationError`. Default: 15.
        kwargs: passed to every metric (e.g. ``sync_on_compute=False``).

    Examples::

        >>> metrics = StreamMetrics("jm", window=2)
        >>> metrics.update(torch.tensor([0, 1, -1]), torch.tensor([0, 1, 2]), torch.tensor([0.8, 0.6, 0.0]))
        >>> {key: round(float(value), 4) for key, value in sorted(metrics.compute().items())}
        {'abstain/rate_jm': 0.3333, 'acc/cumulative_jm': 0.6667, 'acc/rolling_jm': 0.5, 'calibration/ece_jm': 0.2}
        >>> metrics.rolling_curve()
        tensor([1.0000, 1.0000, 0.5000])
    """

    def __init__(self, suffix: str | None = None, window: int = 50, n_bins: int = 15, **kwargs: Any) -> None:
        if suffix is not None and (not isinstance(suffix, str) or not suffix or "." in suffix):
            raise ValueError(f"suffix must be None or a non-empty string without '.', got {suffix!r}")
        super().__init__({"acc/rolling": RollingAccuracy(window, **kwargs),
                          "acc/cumulative": CumulativeAccuracy(**kwargs),
                          "calibration/ece": ExpectedCalibrationError(n_bins, **kwargs),
                          "abstain/rate": AbstentionRate(**kwargs)},
                         postfix=None if suffix is None else f"_{suffix}", compute_groups=False)

    def update(self, pred: Tensor, target: Tensor, confidence: Tensor) -> None:  # type: ignore[override]
        """Pre-learning ``pred`` (B,), the ``target`` (B,) that counts as right, ``confidence`` (B,)."""
        _check_predictions(pred, target, confidence)  # before any metric changes
        super().update(pred=pred, target=target, confidence=confidence)

    def forward(self, pred: Tensor, target: Tensor, confidence: Tensor) -> dict[str, Any]:  # type: ignore[override]
        _check_predictions(pred, target, confidence)
        return super().forward(pred=pred, target=target, confidence=confidence)

    def rolling_curve(self) -> Tensor:
        """(B,) rolling accuracy after each decision of the latest update (:meth:`RollingAccuracy.rolling_curve`)."""
        return cast(RollingAccuracy, self["acc/rolling"]).rolling_curve()
