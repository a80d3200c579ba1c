"""Decision streams held as tensors: the shared base and the seeded synthetic generator."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from gae import validation as check
from gae.validation import Names
from training.batch import DecisionBatch

DriftKind = Literal["permute", "redraw", "shift"]


class BaseDecisionStream:
    """A finite stream of verified decisions, held as full-stream tensors and served in order.

    Subclasses build the tensors (:class:`DecisionStream` draws them, ``FileDecisionStream``
    reads them); everything that serves them lives here, so every stream batches alike.

    Args:
        data: the whole stream as one :class:`~training.batch.DecisionBatch`.
        category_names, action_names, factor_names: the names behind the indices and columns.
    """

    def __init__(self, data: DecisionBatch, category_names: tuple[str, ...], action_names: tuple[str, ...],
                 factor_names: tuple[str, ...]) -> None:
        self._data = data
        self.category_names = category_names
        self.action_names = action_names
        self.factor_names = factor_names

    def __len__(self) -> int:
        return self._data.x.shape[0]

    @property
    def n_categories(self) -> int:
        return len(self.category_names)

    @property
    def n_actions(self) -> int:
        return len(self.action_names)

    @property
    def n_factors(self) -> int:
        return len(self.factor_names)

    def tensors(self) -> DecisionBatch:
        """The whole stream. These are the stream's own tensors: do not modify them in place."""
        return self._data

    def batch(self, start: int, stop: int) -> DecisionBatch:
        """Decisions ``start`` to ``stop - 1``, as fresh tensors (safe to modify, pin or send to a worker).

        Raises:
            ValueError: unless ``0 <= start < stop <= len(self)``.
        """
        check.check_int("start", start, low=0)
        check.check_int("stop", stop, low=0)
        if not start < stop <= len(self):
            raise ValueError(f"batch needs 0 <= start < stop <= {len(self)}, got start={start}, stop={stop}")
        return DecisionBatch(*(column[start:stop].clone() for column in self._data))


class DecisionStream(BaseDecisionStream):
    r"""A seeded synthetic stream of verified decisions, with label noise, uncertain outcomes and drift.

    Each category has ``informative`` factors, drawn at random per category (so the attention
    has a different pattern to learn in each), whose prototype values differ between actions
    (uniform in [0, 1] per action); on the other factors every action shares one value (noise
    factors). With ``modes`` M > 1 each action has M prototypes (clusters) per category, drawn
    alike, so one centroid per action no longer describes it: cluster :math:`j` belongs to action
    :math:`\lfloor j / M \rfloor` (``cluster // modes``). A decision draws a category, its
    ground-truth action and (when M > 1) a mode uniformly, and its factors as the prototype of
    cluster ``truth * M + mode`` plus Gaussian noise. The verifier gets it wrong with
    probability ``label_noise`` (the verified ``action`` is then a different action, drawn
    uniformly: ``overridden``), and a fraction ``uncertain`` of outcomes is uncertain (``skip``).
    ``confirmed`` is -1 (unknown) throughout.

    At each ``drift_at`` index the prototypes of the drifting categories change (at once, or
    by linear interpolation over ``drift_duration`` decisions):

    - ``'permute'``: action :math:`a` takes the prototypes (all M) of action :math:`a + 1 \bmod A`
      (every action moves);
    - ``'redraw'``: fresh random prototypes, same informative factors;
    - ``'shift'``: each prototype (cluster) moves by ``drift_shift`` (L2) in a random direction
      within its category's informative factors, then is clipped to [0, 1] (so noise factors stay
      shared).

    A fraction ``outliers`` of decisions are outliers: a factor vector far from every current
    prototype (cluster) of its category (the farthest of 16 uniform draws in [0, 1]^K) with a random
    action, which is also its ground truth (no memory can predict it). They are listed in
    :attr:`outlier_mask`.

    The stream is a function of its arguments only: the same seed gives bit-identical tensors.
    All decision draws come before the drift draws, and those before the outlier draws, so a
    stream with drift equals the one without it up to the first ``drift_at``, and a stream
    without outliers is the same with or without the argument. The mode is drawn only when
    M > 1, so ``modes=1`` gives the stream of earlier versions, bit for bit.

    Args:
        n_decisions: length of the stream.
        categories, actions, factors: counts or lists of names (as in :class:`~gae.JudgmentMemory`).
            Default: 4, 4, 8.
        informative: informative factors per category, in ``[1, K]``. Default: 4.
        modes: prototypes (clusters) per action and category, M >= 1. Default: 1.
        factor_noise: standard deviation of the Gaussian noise on every factor. Default: 0.1.
        label_noise: probability that the verified action is wrong. Default: 0.1.
        uncertain: probability that the outcome is uncertain (``skip``). Default: 0.05.
        drift_at: index (or increasing indices) in ``[1, n_decisions)`` from which the world
            changes, or None. Default: None.
        drift_categories: the categories (names or indices) that drift; None: all. Default: None.
        drift_kind: ``'permute'``, ``'redraw'`` or ``'shift'``. Default: ``'permute'``.
        drift_shift: distance each prototype moves under ``'shift'``. Default: 0.3.
        drift_duration: decisions over which the prototypes interpolate linearly from the old to
            the new ones (0: an abrupt drift). Must fit before the next drift point. Default: 0.
        outliers: fraction of decisions replaced by outliers, in [0, 1). Default: 0.
        seed: seed of the ``torch.Generator`` that draws everything. Default: 0.
        clip: clip factors to [0, 1]. Default: True.
        start_time, interval: timestamps are ``start_time + index * interval`` seconds. Default: 0, 1.
        id_offset: ids are ``id_offset + index``. Default: 0.

    Attributes:
        prototypes: (D + 1, C, A * M, K) ground-truth prototypes: ``[0]`` before the first drift,
            ``[j]`` from ``drift_at[j - 1]`` on; cluster ``j`` belongs to action ``j // modes``
            (for M = 1, (D + 1, C, A, K): one per action).
        modes: M, the prototypes per action.
        informative_mask: (C, K) bool, the informative factors of each category.
        outlier_mask: (N,) bool, the decisions that are outliers.
        drift_at: the drift indices, a tuple. drift_categories: the drifting category indices.

    Shape:
        - ``batch(start, stop)``: a :class:`~training.batch.DecisionBatch` of ``stop - start`` decisions.

    Examples::

        >>> stream = DecisionStream(1000, categories=["invoice", "refund"], drift_at=500, seed=1)
        >>> len(stream), stream.n_factors, tuple(stream.prototypes.shape)
        (1000, 8, (2, 2, 4, 8))
        >>> batch = stream.batch(0, 100)
        >>> batch.x.shape, batch.confirmed.unique().tolist()
        (torch.Size([100, 8]), [-1])
        >>> bool((batch.overridden == (batch.action != batch.truth)).all())
        True

    Three modes per action: the nearest cluster in force, mapped to its action, is the ceiling
    that one centroid per action cannot reach::

        >>> multi = DecisionStream(1000, modes=3, seed=1)
        >>> multi.modes, tuple(multi.prototypes.shape), tuple(multi.prototypes_in_force().shape)
        (3, (1, 4, 12, 8), (1000, 12, 8))
        >>> data = multi.tensors()
        >>> cluster = ((data.x[:, None, :] - multi.prototypes_in_force()) ** 2).sum(-1).argmin(-1)
        >>> bool(((cluster // multi.modes) == data.truth).float().mean() > 0.9)
        True
    """

    def __init__(self, n_decisions: int, *, categories: Names = 4, actions: Names = 4, factors: Names = 8,
                 informative: int = 4, modes: int = 1, factor_noise: float = 0.1, label_noise: float = 0.1,
                 uncertain: float = 0.05, drift_at: int | list[int] | None = None,
                 drift_categories: list[int | str] | None = None, drift_kind: DriftKind = "permute",
                 drift_shift: float = 0.3, drift_duration: int = 0, outliers: float = 0.0, seed: int = 0,
                 clip: bool = True, start_time: float = 0.0,
                 interval: float = 1.0, id_offset: int = 0) -> None:
        n = check.check_int("n_decisions", n_decisions, low=1)
        category_names = check.resolve_names("categories", categories)
        action_names = check.resolve_names("actions", actions)
        factor_names = check.resolve_names("factors", factors)
        n_factors = len(factor_names)
        if check.check_int("informative", informative, low=1) > n_factors:
            raise ValueError(f"informative must be in [1, {n_factors}] (the number of factors), got {informative}")
        self.modes = check.check_int("modes", modes, low=1)
        factor_noise = check.check_real("factor_noise", factor_noise, low=0.0)
        label_noise = check.check_real("label_noise", label_noise, low=0.0, high=1.0)
        if label_noise > 0 and len(action_names) < 2:
            raise ValueError(f"label_noise needs at least 2 actions to replace one, got label_noise={label_noise} "
                             f"with actions={list(action_names)}")
        uncertain = check.check_real("uncertain", uncertain, low=0.0, high=1.0)
        self.drift_at = self._check_drift_at(drift_at, n)
        if drift_categories is None:
            self.drift_categories = tuple(range(len(category_names)))
        else:
            self.drift_categories = tuple(check.lookup("drift_categories", c, category_names)
                                          for c in drift_categories)
            if len(set(self.drift_categories)) != len(self.drift_categories):
                raise ValueError(f"drift_categories must be distinct, got {drift_categories!r}")
        if drift_kind not in ("permute", "redraw", "shift"):
            raise ValueError(f"drift_kind must be 'permute', 'redraw' or 'shift', got {drift_kind!r}")
        self.drift_kind = drift_kind
        self.drift_shift = check.check_real("drift_shift", drift_shift, low=0.0)
        self.drift_duration = check.check_int("drift_duration", drift_duration, low=0)
        ends = [*self.drift_at[1:], n]
        if self.drift_duration and any(start + self.drift_duration > end
                                       for start, end in zip(self.drift_at, ends, strict=True)):
            raise ValueError(f"drift_duration={drift_duration} does not fit: each drift must end before the next "
                             f"drift point and the end of the stream (drift_at={list(self.drift_at)}, n_decisions={n})")
        outliers = check.check_real("outliers", outliers, low=0.0, high=1.0)
        if outliers == 1.0:
            raise ValueError("outliers must be in [0, 1): a stream of outliers only has nothing to learn, got 1.0")
        seed = check.check_int("seed", seed, low=0)
        if not isinstance(clip, bool):
            raise TypeError(f"clip must be a bool, got {clip!r}")
        start_time = check.check_real("start_time", start_time, low=-float("inf"))
        interval = check.check_real("interval", interval, low=0.0)
        id_offset = check.check_int("id_offset", id_offset, low=0)

        n_categories, n_actions = len(category_names), len(action_names)
        gen = torch.Generator().manual_seed(seed)
        # which factors inform each category: the first `informative` of a random permutation
        chosen = torch.rand(n_categories, n_factors, generator=gen).argsort(dim=1)[:, :informative]
        self.informative_mask = torch.zeros(n_categories, n_factors, dtype=torch.bool).scatter_(1, chosen, True)
        first = self._draw_prototypes(gen, n_actions * modes)
        category = torch.randint(n_categories, (n,), generator=gen)
        truth = torch.randint(n_actions, (n,), generator=gen)
        noise = torch.randn(n, n_factors, generator=gen)
        wrong = torch.rand(n, generator=gen) < label_noise
        # a wrong verdict is another action: truth + 1..A-1 (mod A); max() keeps one action legal
        offset = torch.randint(1, max(n_actions, 2), (n,), generator=gen)
        skip = torch.rand(n, generator=gen) < uncertain
        # no draw when modes == 1, so such a stream is the one earlier versions drew
        mode = torch.randint(modes, (n,), generator=gen) if modes > 1 else torch.zeros(n, dtype=torch.int64)
        prototypes = [first]
        for _ in self.drift_at:
            prototypes.append(self._drift(prototypes[-1], gen))
        self.prototypes = torch.stack(prototypes)

        index = torch.arange(n)
        period = torch.bucketize(index, torch.tensor(self.drift_at, dtype=torch.int64), right=True)
        x = self._prototypes_at(index, period, category, truth * modes + mode) + factor_noise * noise
        if clip:
            x.clamp_(0.0, 1.0)
        action = torch.where(wrong, (truth + offset) % n_actions, truth)
        self.outlier_mask = torch.zeros(n, dtype=torch.bool)
        if outliers > 0:
            x, action, truth = self._add_outliers(gen, outliers, x, action, truth, index, period, category)
        data = DecisionBatch(
            x=x, category=category, action=action, truth=truth, overridden=action != truth,
            confirmed=torch.full((n,), -1, dtype=torch.int8), skip=skip,
            timestamp=start_time + index.double() * interval, id=index + id_offset, position=index)
        super().__init__(data, category_names, action_names, factor_names)

    @staticmethod
    def _check_drift_at(drift_at: int | list[int] | None, n: int) -> tuple[int, ...]:
        if drift_at is None:
            return ()
        points = [drift_at] if isinstance(drift_at, int) and not isinstance(drift_at, bool) else drift_at
        if not isinstance(points, (list, tuple)) or not points:
            raise TypeError(f"drift_at must be None, an int or a non-empty list of ints, got {drift_at!r}")
        for point in points:
            check.check_int("drift_at", point, low=1)
        if any(point >= n for point in points) or list(points) != sorted(set(points)):
            raise ValueError(f"drift_at must be strictly increasing indices in [1, {n}), got {drift_at!r}")
        return tuple(points)

    def prototypes_in_force(self) -> Tensor:
        """(N, A * M, K): the ground-truth prototypes of each decision's category when it was drawn
        (during a gradual drift, the blend then in force); cluster ``j`` belongs to action ``j // modes``."""
        index = torch.arange(len(self))
        period = torch.bucketize(index, torch.tensor(self.drift_at, dtype=torch.int64), right=True)
        return self._prototypes_at(index, period, self._data.category, slice(None))

    def _prototypes_at(self, index: Tensor, period: Tensor, category: Tensor, cluster: Tensor | slice) -> Tensor:
        """The ground-truth prototype in force at each decision: (N, K) for a cluster per decision,
        (N, A * M, K) for ``cluster=slice(None)``; blended while a gradual drift is under way."""
        at = self.prototypes[period, category, cluster]
        if not self.drift_duration or not self.drift_at:
            return at
        before = self.prototypes[(period - 1).clamp(min=0), category, cluster]
        start = torch.tensor((0, *self.drift_at))[period]
        weight = ((index - start + 1).double() / self.drift_duration).clamp(max=1.0).float()
        weight = torch.where(period > 0, weight, 1.0)
        return torch.lerp(before, at, weight.view(-1, *([1] * (at.dim() - 1))))

    def _add_outliers(self, gen: torch.Generator, rate: float, x: Tensor, action: Tensor, truth: Tensor,
                      index: Tensor, period: Tensor, category: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Replace a fraction ``rate`` of decisions by far points with random actions."""
        n, n_factors = x.shape
        chosen = torch.rand(n, generator=gen) < rate
        where = chosen.nonzero().squeeze(-1)
        candidates = torch.rand(where.numel(), 16, n_factors, generator=gen)  # 16 candidates per outlier
        random_action = torch.randint(self.prototypes.shape[2] // self.modes, (where.numel(),), generator=gen)
        prototypes = self._prototypes_at(index[where], period[where], category[where], slice(None))  # (O, A * M, K)
        nearest = torch.cdist(candidates, prototypes).amin(-1)  # (O, 16): distance to the closest prototype
        farthest = candidates[torch.arange(where.numel()), nearest.argmax(-1)]
        self.outlier_mask = chosen
        x, action, truth = x.clone(), action.clone(), truth.clone()
        x[where], action[where], truth[where] = farthest, random_action, random_action
        return x, action, truth

    def _draw_prototypes(self, gen: torch.Generator, n_clusters: int) -> Tensor:
        """(C, A * M, K): uniform per cluster on informative factors, one shared value on noise factors."""
        n_categories, n_factors = self.informative_mask.shape
        per_cluster = torch.rand(n_categories, n_clusters, n_factors, generator=gen)
        shared = torch.rand(n_categories, 1, n_factors, generator=gen)
        return torch.where(self.informative_mask[:, None, :], per_cluster, shared)

    def _drift(self, before: Tensor, gen: torch.Generator) -> Tensor:
        """The prototypes after one drift; categories that do not drift keep theirs."""
        if self.drift_kind == "permute":
            after = before.roll(-self.modes, dims=1)  # action a takes every cluster of action a + 1
        elif self.drift_kind == "redraw":
            after = self._draw_prototypes(gen, before.shape[1])
        else:
            direction = torch.randn(before.shape, generator=gen) * self.informative_mask[:, None, :]
            direction = direction / direction.norm(dim=-1, keepdim=True)
            after = (before + self.drift_shift * direction).clamp(0.0, 1.0)
        drifting = torch.zeros(before.shape[0], dtype=torch.bool)
        drifting[list(self.drift_categories)] = True
        return torch.where(drifting[:, None, None], after, before)
