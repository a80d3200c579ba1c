r"""A rotating linear boundary: the gradual-drift generator of the drift literature, in the shape of scikit-learn's.

The rotating-hyperplane streams (Hulten, Spencer and Domingos, 2001, and the ``Hyperplane``
generators of MOA and river) turn a linear boundary a little at every step, so the labels of a
fixed region change slowly and continuously, with no change point. This is the two-dimensional
version with noise factors, seeded and numpy-only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from gae import validation as check


class RotatingDraw(NamedTuple):
    """One draw of :func:`make_rotating`."""

    x: np.ndarray  # (N, K) float64, uniform in [0, 1]^K
    classes: np.ndarray  # (N,) int64 in {0, 1}: the side of the line in force at each decision
    angle: np.ndarray  # (N,) float64: the angle of that line, theta_0 + rotation * progress, in radians


def rotating_classes(x: np.ndarray, angle: np.ndarray) -> np.ndarray:
    r"""(N,) int64: the side of the line through the centre of the box, in the plane of factors 0 and 1.

    The line in force at decision :math:`i` passes through :math:`(0.5, 0.5)` with direction
    :math:`(\cos\theta_i, \sin\theta_i)`; the class is 1 on the side its normal
    :math:`(-\sin\theta_i, \cos\theta_i)` points to:

    .. math::
        y_i = [\,-(x_{i0} - 0.5)\sin\theta_i + (x_{i1} - 0.5)\cos\theta_i > 0\,]

    Args:
        x: (N, K) factors, K >= 2, in the box [0, 1]^K.
        angle: (N,) the angle :math:`\theta_i` of the line at each decision, in radians.
    """
    side = -(x[:, 0] - 0.5) * np.sin(angle) + (x[:, 1] - 0.5) * np.cos(angle)
    return (side > 0).astype(np.int64)


def make_rotating(progress: np.ndarray, *, n_features: int = 4, rotation: float = math.pi / 2,
                  random_state: int | None = None) -> RotatingDraw:
    r"""Factors uniform in [0, 1]^K and two classes split by a line that turns as the stream goes on.

    The line's angle at a decision is :math:`\theta = \theta_0 + \text{rotation} \cdot p`, where
    :math:`p \in [0, 1]` is the decision's position in the whole stream (0 at the first decision,
    1 at the last) and :math:`\theta_0` is drawn uniformly in :math:`[0, 2\pi)`; the class is the
    side of the line (:func:`rotating_classes`). Factors 0 and 1 span the plane of the line; the
    other ``n_features - 2`` are noise factors. Half the box lies on each side at every angle,
    so the classes stay balanced.

    Args:
        progress: (N,) each decision's position in the stream, in [0, 1] (not its index among
            the N: a stream that interleaves several draws passes the positions of each one's
            decisions, so all of them turn together).
        n_features: K >= 2, the number of factors. Default: 4.
        rotation: the total turn of the line from progress 0 to progress 1, in radians (negative:
            clockwise). Default: :math:`\pi / 2`.
        random_state: seed of the start angle and the factors (drawn in that order). Default: None.

    Returns:
        :class:`RotatingDraw`: ``x`` (N, K) float64, ``classes`` (N,) int64 in {0, 1} and
        ``angle`` (N,) float64, the angle :math:`\theta` of the line in force at each decision.

    Raises:
        ValueError, TypeError: a bad argument (the message names it).

    Examples::

        >>> x, classes, angle = make_rotating(np.linspace(0.0, 1.0, 1000), random_state=0)
        >>> x.shape, sorted(set(classes.tolist())), bool(0.0 <= angle[0] < 2 * math.pi)
        ((1000, 4), [0, 1], True)
        >>> round(float(angle[-1] - angle[0]), 4)  # a quarter turn from the first decision to the last
        1.5708
        >>> bool(abs(classes.mean() - 0.5) < 0.05)
        True
    """
    progress = np.asarray(progress, dtype=np.float64)
    if progress.ndim != 1 or not np.all((progress >= 0.0) & (progress <= 1.0)):
        raise ValueError(f"progress must be a 1-D array of values in [0, 1], got shape {progress.shape} "
                         f"and range [{progress.min(initial=0.0)}, {progress.max(initial=0.0)}]")
    n_features = check.check_int("n_features", n_features, low=2)
    rotation = check.check_real("rotation", rotation, low=-math.inf)
    rng = np.random.default_rng(random_state)
    angle = rng.uniform(0.0, 2 * math.pi) + rotation * progress
    x = rng.uniform(0.0, 1.0, size=(progress.size, n_features))
    return RotatingDraw(x, rotating_classes(x, angle), angle)
