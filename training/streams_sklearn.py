"""Decision streams drawn from standard generators not our own: scikit-learn's bundled ones and a rotating boundary."""

from __future__ import annotations

import inspect
from typing import Any, Literal

import numpy as np
import torch

from gae import validation as check
from gae.validation import Names
from training.batch import DecisionBatch
from training.streams import BaseDecisionStream
from training.streams_rotating import make_rotating

Generator = Literal["classification", "moons", "blobs", "circles", "rotating"]

# The generator options each stream starts from; the keyword options of the constructor override them.
# 'classification': 4 classes of 3 clusters each on the vertices of a 4-d hypercube, so the clusters
# of a class lie on opposite sides of the others' and one centroid per class sits among the wrong
# clusters; class_sep keeps the clusters apart enough for a neighbour rule to tell them apart.
# flip_y=0: the stream's own label_noise does the flipping, recorded in `overridden`.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "classification": {"n_features": 8, "n_informative": 4, "n_redundant": 0, "n_classes": 4,
                       "n_clusters_per_class": 3, "class_sep": 2.0, "flip_y": 0.0},
    "moons": {"noise": 0.2},
    "blobs": {"n_features": 8, "centers": 4, "cluster_std": 4.0},
    # the inner circle at half the outer radius, each blurred by noise 0.1: the rings stay apart (the gap's
    # middle is 2.5 standard deviations from each, so well under 1% of points cross it) yet both classes share
    # one centre, so one centroid per action cannot tell them apart while a neighbour rule can; scikit-learn's
    # own defaults (factor 0.8, no noise) are noiseless rings almost on top of one another
    "circles": {"noise": 0.1, "factor": 0.5},
    "rotating": {},  # make_rotating's own defaults: 4 factors (2 in the boundary's plane), a quarter turn
}
# set by the stream itself: the sample count (or each decision's place in the stream), the seed, and shuffling
# (decisions must come in random order)
RESERVED = ("n_samples", "progress", "random_state", "shuffle", "return_X_y", "return_centers")


class SklearnDecisionStream(BaseDecisionStream):
    """A seeded stream of verified decisions whose factors and ground truth come from a standard generator.

    Each category is an independent draw of the generator, with its own ``random_state``
    (derived from ``seed`` and the category index), so every category has its own clusters
    (or its own boundary). A decision draws its category uniformly; the category's draw gives its
    factors and its ground-truth action (the generator's class). From decision ``permute_at`` on
    (if given), the ground truth is the next action, ``(class + 1) % A`` (for two actions, a
    swap): the same regions of factor space now call for another action, an abrupt drift like
    :class:`~training.streams.DecisionStream`'s ``'permute'``. Then, as in ``DecisionStream``, the
    verifier gets it wrong with probability ``label_noise`` (the verified ``action`` is then a
    different action, drawn uniformly: ``overridden``), a fraction ``uncertain`` of outcomes is
    uncertain (``skip``), and ``confirmed`` is -1 (unknown) throughout. The permutation takes no
    draw, so a stream with ``permute_at`` has the factors, categories, verifier errors and
    uncertain outcomes of the one without it, and its ground truth up to ``permute_at``.

    The factors are scaled to [0, 1] per factor by the minimum and maximum over the whole stream
    (all categories together; a constant factor becomes 0), kept in :attr:`factor_range`.

    Generators and their default options (``sklearn.datasets.make_<generator>`` but for ``'rotating'``):

    - ``'classification'``: 8 factors (4 informative, 4 noise), 4 actions of 3 clusters each,
      ``class_sep=2.0``, ``flip_y=0``: several modes per action (``n_clusters_per_class=1`` gives
      one mode per action, 2 two);
    - ``'moons'``: 2 factors, 2 actions (two interleaving half circles), ``noise=0.2``;
    - ``'blobs'``: 8 factors, 4 actions of one Gaussian blob each, ``cluster_std=4.0``: one mode
      per action, the control;
    - ``'circles'``: 2 factors, 2 actions (a ring inside a ring, one centre), ``noise=0.1``,
      ``factor=0.5``;
    - ``'rotating'``: :func:`~training.streams_rotating.make_rotating`, factors uniform in the box,
      ``n_features=4`` (the first two span the boundary's plane, the rest are noise), 2 actions: the
      side of a line through the box's centre whose angle turns by ``rotation`` (default
      :math:`\\pi/2`) radians at a constant rate from the first decision of the stream to the last
      (a gradual, continuous drift; each category starts at its own random angle). Needs no
      scikit-learn.

    Needs scikit-learn (``pip install scikit-learn``, or the ``train`` extra) for all but ``'rotating'``.

    Args:
        n_decisions: length of the stream.
        generator: ``'classification'``, ``'moons'``, ``'blobs'``, ``'circles'`` or ``'rotating'``.
            Default: ``'classification'``.
        categories: a count or a list of names. Default: 1.
        label_noise: probability that the verified action is wrong. Default: 0.1.
        uncertain: probability that the outcome is uncertain (``skip``). Default: 0.05.
        permute_at: index in ``[0, n_decisions]`` from which the ground truth is the next action, or
            None (no permutation). Default: None.
        seed: seed of everything: the category draws, the generators' random states and the noise. Default: 0.
        start_time, interval: timestamps are ``start_time + index * interval`` seconds. Default: 0, 1.
        id_offset: ids are ``id_offset + index``. Default: 0.
        **options: keyword arguments of the generator, overriding the defaults above (all but
            ``n_samples``, ``progress``, ``random_state``, ``shuffle`` and the return switches, which
            the stream sets).

    Attributes:
        generator: the generator's name. options: the options it was called with.
        random_states: the generator's ``random_state`` for each category, a tuple.
        factor_range: (2, K) float64, the minimum and maximum of each raw factor (row 0, row 1).
        permute_at: the argument, an int or None.
        drift_at: the change points, a tuple as in :class:`~training.streams.DecisionStream`:
            ``(permute_at,)`` when ``0 < permute_at < n_decisions``, else ``()`` (a permutation at 0
            or at the end changes nothing within the stream). The rotation is a continuous drift
            without a change point, so it adds none.
        boundary_angle: for ``'rotating'``, (N,) float64, the angle of the line in force at each
            decision (its category's start angle plus ``rotation * index / (N - 1)``); else None.

    Raises:
        ImportError: scikit-learn is not installed (and the generator needs it).
        ValueError, TypeError: a bad argument or option (the message names it).

    Examples::

        >>> stream = SklearnDecisionStream(1000, categories=["invoice", "refund"], seed=1)
        >>> len(stream), stream.n_categories, stream.n_actions, stream.n_factors, stream.drift_at
        (1000, 2, 4, 8, ())
        >>> batch = stream.batch(0, 100)
        >>> float(batch.x.min()) >= 0.0 and float(batch.x.max()) <= 1.0, batch.confirmed.unique().tolist()
        (True, [-1])
        >>> SklearnDecisionStream(500, generator="moons", noise=0.1).n_factors
        2
        >>> SklearnDecisionStream(500, generator="circles").n_actions
        2

    The same circles with their two actions swapped from the middle on::

        >>> plain = SklearnDecisionStream(1000, generator="circles", seed=2).tensors()
        >>> swapped = SklearnDecisionStream(1000, generator="circles", permute_at=500, seed=2)
        >>> swapped.permute_at, swapped.drift_at
        (500, (500,))
        >>> after = swapped.tensors()
        >>> torch.equal(after.x, plain.x), torch.equal(after.truth[:500], plain.truth[:500])
        (True, True)
        >>> torch.equal(after.truth[500:], 1 - plain.truth[500:])
        True

    A boundary that turns a quarter turn over the stream, in 2 informative and 4 noise factors::

        >>> rotating = SklearnDecisionStream(2000, generator="rotating", n_features=6, seed=0)
        >>> rotating.n_factors, rotating.n_actions, rotating.drift_at
        (6, 2, ())
        >>> round(float(rotating.boundary_angle[-1] - rotating.boundary_angle[0]), 4)  # pi / 2
        1.5708
    """

    def __init__(self, n_decisions: int, *, generator: Generator = "classification", categories: Names = 1,
                 label_noise: float = 0.1, uncertain: float = 0.05, permute_at: int | None = None, seed: int = 0,
                 start_time: float = 0.0, interval: float = 1.0, id_offset: int = 0, **options: Any) -> None:
        n = check.check_int("n_decisions", n_decisions, low=1)
        if generator not in DEFAULT_OPTIONS:
            raise ValueError(f"generator must be one of {list(DEFAULT_OPTIONS)}, got {generator!r}")
        make: Any = make_rotating if generator == "rotating" else self._sklearn_generator(generator)
        self.generator = generator
        self.options = self._check_options(make, generator, options)
        category_names = check.resolve_names("categories", categories)
        n_actions = self._n_actions(generator, self.options)
        label_noise = check.check_real("label_noise", label_noise, low=0.0, high=1.0)
        if label_noise > 0 and n_actions < 2:
            raise ValueError(f"label_noise needs at least 2 actions to replace one, got label_noise={label_noise} "
                             f"with {n_actions} action")
        uncertain = check.check_real("uncertain", uncertain, low=0.0, high=1.0)
        self.permute_at = self._check_permute_at(permute_at, n, n_actions)
        self.drift_at = (permute_at,) if permute_at is not None and 0 < permute_at < n else ()
        seed = check.check_int("seed", seed, low=0)
        start_time = check.check_real("start_time", start_time, low=-float("inf"))
        interval = check.check_real("interval", interval, low=0.0)
        id_offset = check.check_int("id_offset", id_offset, low=0)

        n_categories = len(category_names)
        gen = torch.Generator().manual_seed(seed)
        category = torch.randint(n_categories, (n,), generator=gen)
        self.random_states = tuple(int(np.random.SeedSequence((seed, c)).generate_state(1)[0])
                                   for c in range(n_categories))
        raw: np.ndarray | None = None
        truth = torch.zeros(n, dtype=torch.int64)
        angle = np.zeros(n)
        for c, state in enumerate(self.random_states):
            where = (category == c).nonzero().squeeze(-1).numpy()
            if where.size == 0:
                continue
            if generator == "rotating":
                progress = where / max(n - 1, 1)  # the place in the whole stream, so every category turns alike
                factors, classes, angle[where] = make_rotating(progress, random_state=state, **self.options)
            else:
                factors, classes = make(n_samples=where.size, random_state=state, **self.options)
            if raw is None:
                raw = np.zeros((n, factors.shape[1]))
            raw[where] = factors
            truth[torch.from_numpy(where)] = torch.as_tensor(classes, dtype=torch.int64)
        assert raw is not None  # some category has a decision, since n >= 1
        self.boundary_angle = torch.from_numpy(angle) if generator == "rotating" else None
        if permute_at is not None:
            truth[permute_at:] = (truth[permute_at:] + 1) % n_actions
        low, high = raw.min(axis=0), raw.max(axis=0)
        self.factor_range = torch.from_numpy(np.stack([low, high]))
        span = np.where(high > low, high - low, 1.0)
        x = torch.from_numpy((raw - low) / span).float().clamp_(0.0, 1.0)

        wrong = torch.rand(n, generator=gen) < label_noise
        # a wrong verdict is another action: truth + 1..A-1 (mod A); max() keeps one action legal
        offset = torch.randint(1, max(n_actions, 2), (n,), generator=gen)
        skip = torch.rand(n, generator=gen) < uncertain
        action = torch.where(wrong, (truth + offset) % n_actions, truth)
        index = torch.arange(n)
        data = DecisionBatch(
            x=x, category=category, action=action, truth=truth, overridden=action != truth,
            confirmed=torch.full((n,), -1, dtype=torch.int8), skip=skip,
            timestamp=start_time + index.double() * interval, id=index + id_offset, position=index)
        factor_names = tuple(str(k) for k in range(x.shape[1]))
        super().__init__(data, category_names, tuple(str(a) for a in range(n_actions)), factor_names)

    @staticmethod
    def _sklearn_generator(generator: str) -> Any:
        """``sklearn.datasets.make_<generator>``."""
        try:
            from sklearn import datasets
        except ImportError as error:
            raise ImportError(f"SklearnDecisionStream(generator={generator!r}) needs scikit-learn: pip install "
                              "scikit-learn (or the train extra: pip install 'gae-torch[train]')") from error
        return getattr(datasets, f"make_{generator}")

    @staticmethod
    def _check_permute_at(permute_at: int | None, n: int, n_actions: int) -> int | None:
        if permute_at is None:
            return None
        check.check_int("permute_at", permute_at, low=0)
        if permute_at > n:
            raise ValueError(f"permute_at must be None or an index in [0, {n}] (n_decisions), got {permute_at}")
        if n_actions < 2:
            raise ValueError(f"permute_at needs at least 2 actions to permute, got permute_at={permute_at} "
                             f"with {n_actions} action")
        return permute_at

    @staticmethod
    def _check_options(make: Any, generator: str, options: dict[str, Any]) -> dict[str, Any]:
        """The defaults updated by ``options``, each a keyword the generator takes and the stream does not set."""
        known = [name for name in inspect.signature(make).parameters if name not in RESERVED]
        for name in options:
            if name in RESERVED:
                raise ValueError(f"{name} is set by the stream (from n_decisions and seed), not an option; got "
                                 f"{name}={options[name]!r}")
            if name not in known:
                raise TypeError(f"unknown option {name!r} for generator {generator!r}; known: {known}")
        return {**DEFAULT_OPTIONS[generator], **options}

    @staticmethod
    def _n_actions(generator: str, options: dict[str, Any]) -> int:
        """The number of classes the generator draws from."""
        if generator in ("moons", "circles", "rotating"):
            return 2
        if generator == "classification":
            return check.check_int("n_classes", options["n_classes"], low=1)
        centers = options["centers"]
        if isinstance(centers, int):
            return check.check_int("centers", centers, low=1)
        shape = np.shape(centers)
        if len(shape) != 2 or shape[0] < 1:
            raise ValueError(f"centers must be an int or an array of shape (A, K), got {centers!r}")
        return shape[0]
