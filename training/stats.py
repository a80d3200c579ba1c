"""Statistics for an evaluation repeated over stream seeds: bootstrap intervals and drift recovery.

Plain numpy, seeded and deterministic. The unit of resampling is the stream seed: each seed is
one independent replication of the whole evaluation, so its decisions are never resampled on
their own (they are correlated within a stream).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

# Bound on the elements materialised per chunk of resamples, so (R, S, T) curves never need
# R * S * T floats at once; the indices are drawn up front, so chunking does not change results.
_CHUNK_ELEMENTS = 1 << 22


class Interval(NamedTuple):
    """A statistic with its percentile bootstrap interval.

    ``mean``, ``low`` and ``high`` are floats for a (S,) sample and (T,) arrays for (S, T) curves.
    """

    mean: Any  # the statistic on the full sample (the mean unless another statistic was given)
    low: Any  # the (1 - level) / 2 percentile of the bootstrap distribution
    high: Any  # the (1 + level) / 2 percentile
    resamples: int
    level: float


def bootstrap_ci(values: Any, *, resamples: int = 500, level: float = 0.95, seed: int = 0,
                 statistic: Callable[..., Any] = np.mean) -> Interval:
    r"""Percentile bootstrap interval over seeds: resample the S seeds with replacement.

    For resample :math:`r` with seed indices :math:`i_{r,1..S}` drawn uniformly,
    :math:`\theta_r = \text{statistic}(v_{i_{r,1}}, \dots, v_{i_{r,S}})`, and the interval is
    the :math:`(1 \mp \text{level}) / 2` percentiles of :math:`\theta_{1..R}` (linear
    interpolation). For (S, T) curves this is done per column with the same resampled seeds.

    Args:
        values: (S,) one figure per seed, or (S, T) one curve per seed; S >= 2, all finite.
        resamples: R, number of bootstrap resamples (default 500).
        level: coverage of the interval, in (0, 1) (default 0.95).
        seed: seeds the resampling; the same seed gives the same interval (default 0).
        statistic: a numpy-style reduction taking ``axis=`` (default ``np.mean``; ``np.median``
            works too).

    Returns:
        :class:`Interval` ``(mean, low, high, resamples, level)``.

    Examples::

        >>> bootstrap_ci([0.5, 0.5, 0.5])
        Interval(mean=0.5, low=0.5, high=0.5, resamples=500, level=0.95)
        >>> interval = bootstrap_ci([0.81, 0.84, 0.79, 0.86, 0.83], resamples=1000, seed=0)
        >>> round(interval.mean, 3), interval.low <= interval.mean <= interval.high
        (0.826, True)
    """
    sample = _as_sample("values", values)
    _check_options(resamples, level, seed, statistic, sample)
    return _interval(sample, resamples, level, seed, statistic)


def paired_difference(a: Any, b: Any, *, resamples: int = 500, level: float = 0.95, seed: int = 0,
                      statistic: Callable[..., Any] = np.mean) -> Interval:
    """Bootstrap interval of ``a - b`` paired by seed: row ``s`` of both comes from stream seed ``s``.

    Pairing removes the between-seed variation both contestants share (an easy stream is easy
    for both), so the interval is much tighter than comparing two independent intervals.

    Args:
        a: (S,) or (S, T), the first contestant per seed.
        b: same shape as ``a``, the second contestant on the same seeds, in the same order.
        resamples, level, seed, statistic: as in :func:`bootstrap_ci`.

    Returns:
        :class:`Interval` of the statistic of ``a - b``.
    """
    first, second = _as_sample("a", a), _as_sample("b", b)
    if first.shape != second.shape:
        raise ValueError(f"a and b must have the same shape (the same seeds), got {first.shape} and {second.shape}")
    difference = first - second
    _check_options(resamples, level, seed, statistic, difference)
    return _interval(difference, resamples, level, seed, statistic)


def ratio_of_means(a: Any, b: Any, *, resamples: int = 500, level: float = 0.95, seed: int = 0) -> Interval:
    """Bootstrap interval of ``mean(a) / mean(b)`` paired by seed (the same seeds drawn for both).

    For a bar such as "recovers in at most a third of the decisions k-NN needs", where the
    ratio of the two means is the figure and the difference would not say it. A mean of ``b``
    of zero (``b`` never needed a decision) makes the ratio infinite, or 1 when ``a``'s mean is
    zero too; so no resample is dropped. The interval's ends are order statistics of the
    resampled ratios (``numpy.quantile(method='inverted_cdf')``), which stay defined when some
    of them are infinite.

    Args:
        a: (S,) the first contestant per seed, non-negative.
        b: (S,) the second contestant on the same seeds, in the same order, non-negative.
        resamples, level, seed: as in :func:`bootstrap_ci`.

    Returns:
        :class:`Interval` of the ratio of means.

    Examples::

        >>> ratio_of_means([1.0, 2.0, 3.0], [3.0, 6.0, 9.0]).mean
        0.3333333333333333
        >>> ratio_of_means([5.0, 5.0], [0.0, 0.0]).high
        inf
    """
    first, second = _as_sample("a", a), _as_sample("b", b)
    if first.ndim != 1 or first.shape != second.shape:
        raise ValueError(f"a and b must both be (S,) on the same seeds, got shapes {first.shape} and {second.shape}")
    for name, sample in (("a", first), ("b", second)):
        if (sample < 0).any():
            raise ValueError(f"{name} must be non-negative (the ratio of its means is read as a ratio of sizes), "
                             f"got {sample.tolist()}")
    _check_options(resamples, level, seed, np.mean, first)
    index = _resampled_seeds(len(first), resamples, seed)  # (R, S)
    thetas = _ratio(first[index].mean(axis=1), second[index].mean(axis=1))
    low, high = np.quantile(thetas, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    mean = float(_ratio(np.array([first.mean()]), np.array([second.mean()]))[0])
    return Interval(mean, float(low), float(high), resamples, float(level))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` of non-negative means, with x / 0 = inf and 0 / 0 = 1."""
    ratio = np.where(numerator > 0, np.inf, 1.0)
    np.divide(numerator, denominator, out=ratio, where=denominator > 0)
    return ratio


def recovery_decisions(rolling: Any, drift_at: int, *, fraction: float = 0.9, baseline_window: int = 200) -> Any:
    """Decisions after a drift until the rolling accuracy is back at ``fraction`` of its pre-drift level.

    Decision ``i`` (0-based) is row position ``i``; decisions ``drift_at`` onwards are after the
    drift. The pre-drift level is the mean of ``rolling[drift_at - baseline_window : drift_at]``
    and the target is ``fraction`` times it. Counting the decision at ``drift_at`` as the first:

    * ``0``: the curve never falls below the target after the drift (nothing to recover);
    * ``n``: it falls below, and first reaches the target again at decision ``drift_at + n - 1``;
    * ``nan``: it falls below and never reaches the target again within the stream.

    The first return to the target counts, even if the curve dips again later. The result is
    float for every case so that ``nan`` and batches share one dtype.

    Args:
        rolling: (T,) or (S, T) rolling accuracy (e.g. ``rolling_accuracy``), all finite.
        drift_at: index of the first decision after the drift; needs
            ``baseline_window <= drift_at < T``.
        fraction: share of the pre-drift level that counts as recovered, in (0, 1] (default 0.9).
        baseline_window: decisions before the drift averaged for the pre-drift level (default 200).

    Returns:
        a float for (T,), a (S,) float array for (S, T).

    Examples::

        >>> curve = [0.9, 0.9, 0.9, 0.5, 0.6, 0.85, 0.9]
        >>> recovery_decisions(curve, drift_at=3, baseline_window=3)
        3.0
    """
    curves = np.asarray(_check_finite("rolling", rolling), dtype=np.float64)
    if curves.ndim not in (1, 2) or curves.shape[-1] == 0:
        raise ValueError(f"rolling must be (T,) or (S, T) with T >= 1, got shape {curves.shape}")
    _check_int("baseline_window", baseline_window, minimum=1)
    _check_int("drift_at", drift_at, minimum=baseline_window)
    length = curves.shape[-1]
    if drift_at >= length:
        raise ValueError(f"drift_at must be before the end of the stream (T={length}), got {drift_at}")
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
    batch = np.atleast_2d(curves)  # (S, T)
    target = fraction * batch[:, drift_at - baseline_window:drift_at].mean(axis=1)  # (S,)
    after = batch[:, drift_at:]  # (S, T - drift_at)
    below = after < target[:, None]
    fell = below.any(axis=1)
    first_below = below.argmax(axis=1)
    positions = np.arange(after.shape[1])
    back = ~below & (positions[None, :] > first_below[:, None])
    recovered = back.any(axis=1)
    decisions = np.where(fell, np.where(recovered, back.argmax(axis=1) + 1.0, np.nan), 0.0)
    return float(decisions[0]) if curves.ndim == 1 else decisions


def _interval(sample: np.ndarray, resamples: int, level: float, seed: int,
              statistic: Callable[..., Any]) -> Interval:
    index = _resampled_seeds(sample.shape[0], resamples, seed)  # (R, S)
    chunk = max(1, _CHUNK_ELEMENTS // sample.size)
    thetas = np.concatenate([np.asarray(statistic(sample[index[start:start + chunk]], axis=1), dtype=np.float64)
                             for start in range(0, resamples, chunk)])  # (R,) or (R, T)
    low, high = np.quantile(thetas, [(1 - level) / 2, (1 + level) / 2], axis=0)
    mean = np.asarray(statistic(sample, axis=0), dtype=np.float64)
    if sample.ndim == 1:
        return Interval(float(mean), float(low), float(high), resamples, float(level))
    return Interval(mean, low, high, resamples, float(level))


def _resampled_seeds(n_seeds: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n_seeds) indices of the seeds drawn with replacement: the same draw for every
    statistic given the same seed, so intervals of one run pair up."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(resamples, n_seeds))


def _as_sample(name: str, values: Any) -> np.ndarray:
    sample = np.asarray(_check_finite(name, values), dtype=np.float64)
    if sample.ndim not in (1, 2) or sample.shape[0] < 2 or sample.size == 0:
        raise ValueError(f"{name} must be (S,) or (S, T) with at least 2 seeds and T >= 1, got shape {sample.shape}")
    return sample


def _check_finite(name: str, values: Any) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a numeric array, got {type(values).__name__}: {error}") from None
    bad = np.argwhere(~np.isfinite(array))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name} must be finite, got {array[where]} at index {where} ({len(bad)} non-finite)")
    return array


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_options(resamples: int, level: float, seed: int, statistic: Callable[..., Any],
                   sample: np.ndarray) -> None:
    _check_int("resamples", resamples, minimum=1)
    _check_int("seed", seed, minimum=0)
    if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    if not callable(statistic):
        raise ValueError(f"statistic must be callable like np.mean, got {statistic!r}")
    try:
        shape = np.shape(statistic(sample, axis=0))
    except TypeError as error:
        raise ValueError(f"statistic must take an axis= keyword like np.mean: {error}") from None
    if shape != sample.shape[1:]:
        raise ValueError(f"statistic(values, axis=0) must have shape {sample.shape[1:]}, got {shape}")
