"""The public benchmark's suite: streams and models under river's prequential harness.

River's bundled data sets and generators, scikit-learn's bundled data sets and gae's own settings,
as lists of river ``(x, y)`` samples; gae's presets and river's reference classifiers as river
models; and one run of a model on a stream (``evaluate.progressive_val_score``, timed).
``scripts/benchmark_streams.py`` runs the suite and ``docs/benchmarks.md`` gives the protocol and
the reason for each choice. river and scikit-learn are optional dependencies (``pip install
'gae-torch[train]'``): this module needs both.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Hashable
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from river import base, compose, datasets, evaluate, forest, metrics, naive_bayes, neighbors, preprocessing, tree
from river.datasets import synth
from river.ensemble import LeveragingBaggingClassifier, SRPClassifier
from sklearn.datasets import load_breast_cancer, load_digits, load_wine

from gae import JudgmentConfig
from gae.river import JudgmentClassifier
from training.evaluation import make_stream, state_bytes

N_SAMPLES = 5000  # samples per stream (a real data set that is shorter is used whole)
# Generator seeds. None was used for any choice in gae: the head-to-head tunes on seeds 0-19, looked at
# 20-59 and reports on 100-119 (docs/protocol.md). A real data set runs once, seeded (models, shuffle) with SEEDS[0].
SEEDS = (200, 201, 202)
DRIFT_SEED_OFFSET = 1000  # the concept after a ConceptDriftStream's switch draws its samples with seed + this
ABRUPT_WIDTH = 0.01  # width of an abrupt switch, as a fraction of the stream (50 of 5,000 samples)
GRADUAL_WIDTH = 0.2  # width of a gradual switch (1,000 of 5,000 samples)
WARM_UP = 100  # samples of an untimed run of a fresh model before the timed one (JIT compilation, caches)
KNN_WINDOWS = (100, 400, 1000)
CATEGORY = "category"  # the feature that carries a gae setting's category to gae's classifiers

Sample = tuple[dict[Hashable, Any], Hashable]
Scaler = Literal["minmax", "standard", "units"] | None
UNITS_RANGE = (-3.0, 3.0)  # RandomUnits: each feature scaled by 10 ** uniform(-3, 3) ...
UNITS_SHIFT = 100.0  # ... and shifted by normal(0, 100) times its scale
Family = Literal["linear", "noisy prototypes", "rules", "fast drift", "multimodal", "real", "gae"]


class StreamSpec(NamedTuple):
    """One stream of the suite.

    Attributes:
        kind: ``'real'`` (river's or scikit-learn's bundled data, one run), ``'synthetic'`` (a river
            generator, one run per seed) or ``'gae'`` (a setting of ``training.evaluation``, one run per
            seed, with categories).
        family: what kind of boundary or drift it tests, so the results can be read per family:
            ``'linear'`` (a rotating hyperplane), ``'noisy prototypes'`` (one noisy prototype per class,
            irrelevant features), ``'rules'`` (a boundary of thresholds and functions, with or without a
            concept switch), ``'fast drift'`` (prototypes that keep moving), ``'multimodal'`` (several
            clusters per class, no drift), ``'real'`` (real data of unknown shape) or ``'gae'`` (gae's
            settings with a drift).
        description: how the docs and the record describe it.
        make: ``(seed, n) -> dataset``: a river data set, a list of samples (scikit-learn's data, shuffled
            with ``seed``) or a gae setting's decision stream.
    """

    kind: Literal["real", "synthetic", "gae"]
    family: Family
    description: str
    make: Callable[[int, int], Any]


class ModelSpec(NamedTuple):
    """One model of the suite.

    Attributes:
        family: ``'gae'`` (driven through :class:`gae.river.JudgmentClassifier`) or ``'river'``.
        description: how the docs and the record describe it.
        make: ``(seed, category) -> classifier``; ``category`` names the category feature (gae settings,
            gae models only) or is None.
        scaler: what runs in front of it: None (nothing), ``'minmax'`` (``preprocessing.MinMaxScaler()``),
            ``'standard'`` (``preprocessing.StandardScaler()``) or ``'units'`` (:class:`RandomUnits`, the
            invariance check's random units).
    """

    family: Literal["gae", "river"]
    description: str
    make: Callable[[int, str | None], base.Classifier]
    scaler: Scaler

    @property
    def scaled(self) -> bool:
        """Whether anything runs in front of the model."""
        return self.scaler is not None


class RunResult(NamedTuple):
    """One model's prequential run on one stream: ``accuracy`` (%), wall time of the harness per decision
    (``us_per_decision``: the whole ``progressive_val_score`` call over ``n``, scaler included),
    ``state_bytes`` at the end (:func:`model_bytes`), ``log_bytes`` (:func:`log_bytes`) and ``n`` samples."""

    accuracy: float
    us_per_decision: float
    state_bytes: int
    log_bytes: int
    n: int


class RandomUnits(base.Transformer):
    """Every numeric feature in other units: ``x * s + t`` with ``s = 10 ** uniform(-3, 3)`` and ``t =
    normal(0, 100) * s``, drawn once per feature from ``seed`` and the feature's name (the same map in
    every process and run): the invariance check's inputs (docs/inputs.md), a river transformer that
    learns nothing."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._maps: dict[Hashable, tuple[float, float]] = {}

    def _map(self, name: Hashable) -> tuple[float, float]:
        if name not in self._maps:
            rng = np.random.default_rng([self.seed, zlib.crc32(repr(name).encode())])
            scale = float(10.0 ** rng.uniform(*UNITS_RANGE))
            self._maps[name] = (scale, float(rng.normal(0.0, UNITS_SHIFT)) * scale)
        return self._maps[name]

    def transform_one(self, x: dict[Hashable, Any]) -> dict[Hashable, Any]:
        out = {}
        for name, value in x.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                scale, shift = self._map(name)
                value = value * scale + shift
            out[name] = value
        return out


def _scaler(kind: str, seed: int) -> base.Transformer:
    if kind == "units":
        return RandomUnits(seed)
    return {"minmax": preprocessing.MinMaxScaler, "standard": preprocessing.StandardScaler}[kind]()


def _switch(before: Any, after: Any, seed: int, n: int, width: float) -> synth.ConceptDriftStream:
    """``before`` switching to ``after`` around the middle of ``n`` samples, over ``width * n`` samples."""
    return synth.ConceptDriftStream(stream=before, drift_stream=after, position=n // 2,
                                    width=max(1, round(width * n)), seed=seed)


def _gae(setting: str) -> Callable[[int, int], Any]:
    return lambda seed, n: make_stream(setting, seed, n)


def _sklearn(load: Callable[..., Any]) -> Callable[[int, int], list[Sample]]:
    """A scikit-learn data set as samples (``f0``, ``f1``, ...: floats; the label an int), its rows in the
    order of ``numpy.random.default_rng(seed).permutation`` (wine's and breast cancer's files hold long runs
    of one class, which a prequential run would read as drifts)."""
    def make(seed: int, n: int) -> list[Sample]:
        features, labels = load(return_X_y=True)
        return [({f"f{k}": float(value) for k, value in enumerate(features[row])}, int(labels[row]))
                for row in np.random.default_rng(seed).permutation(len(labels))]
    return make


def _hyperplane(mag_change: float) -> Callable[[int, int], Any]:
    return lambda seed, n: synth.Hyperplane(seed=seed, n_features=10, n_drift_features=5, mag_change=mag_change)


def _led(seed: int) -> synth.LED:
    return synth.LED(seed=seed, noise_percentage=0.1, irrelevant_features=True)


STREAMS: dict[str, StreamSpec] = {
    "phishing": StreamSpec("real", "real", "Phishing: 1,250 web pages, 9 features, 2 classes",
                           lambda seed, n: datasets.Phishing()),
    "bananas": StreamSpec("real", "multimodal", "Bananas: 5,300 points, 2 features, 2 banana-shaped classes",
                          lambda seed, n: datasets.Bananas()),
    "image_segments": StreamSpec("real", "real", "ImageSegments: 2,310 image regions, 18 features, 7 classes",
                                 lambda seed, n: datasets.ImageSegments()),
    "digits": StreamSpec("real", "real", "scikit-learn's digits: 1,797 8x8 images, 64 features, 10 classes, "
                         "shuffled", _sklearn(load_digits)),
    "breast_cancer": StreamSpec("real", "real", "scikit-learn's breast cancer: 569 tumours, 30 features, "
                                "2 classes, shuffled", _sklearn(load_breast_cancer)),
    "wine": StreamSpec("real", "real", "scikit-learn's wine: 178 wines, 13 features, 3 classes, shuffled",
                       _sklearn(load_wine)),
    "rbf": StreamSpec("synthetic", "multimodal", "RandomRBF: 3 classes, 10 features, 50 centroids",
                      lambda seed, n: synth.RandomRBF(seed_model=seed, seed_sample=seed, n_classes=3,
                                                      n_features=10, n_centroids=50)),
    "rbf_drift": StreamSpec("synthetic", "fast drift",
                            "RandomRBFDrift: as rbf, 25 of the 50 centroids moving (speed 0.001)",
                            lambda seed, n: synth.RandomRBFDrift(seed_model=seed, seed_sample=seed, n_classes=3,
                                                                 n_features=10, n_centroids=50, change_speed=0.001,
                                                                 n_drift_centroids=25)),
    "rbf_fast": StreamSpec("synthetic", "fast drift", "RandomRBFDrift: as rbf, all 50 centroids moving (speed 0.01)",
                           lambda seed, n: synth.RandomRBFDrift(seed_model=seed, seed_sample=seed, n_classes=3,
                                                                n_features=10, n_centroids=50, change_speed=0.01,
                                                                n_drift_centroids=50)),
    "hyperplane_slow": StreamSpec("synthetic", "linear", "Hyperplane: 10 features, 5 drifting (magnitude 0.001), "
                                  "5% label noise", _hyperplane(0.001)),
    "hyperplane_fast": StreamSpec("synthetic", "linear", "Hyperplane: as hyperplane_slow, magnitude 0.01",
                                  _hyperplane(0.01)),
    "led": StreamSpec("synthetic", "noisy prototypes", "LED: 7 segments, 10% noise, 17 irrelevant features, "
                      "10 digits, no drift", lambda seed, n: _led(seed)),
    "led_drift": StreamSpec("synthetic", "noisy prototypes", "LED switching to LEDDrift (7 features swapped) at "
                            "the middle (abrupt)",
                            lambda seed, n: _switch(_led(seed), synth.LEDDrift(seed=seed + DRIFT_SEED_OFFSET,
                                                                               noise_percentage=0.1,
                                                                               irrelevant_features=True,
                                                                               n_drift_features=7),
                                                    seed, n, ABRUPT_WIDTH)),
    "sine_abrupt": StreamSpec("synthetic", "rules", "Sine: SINE1 switching to reversed SINE1 at the middle (abrupt)",
                              lambda seed, n: _switch(synth.Sine(0, seed=seed),
                                                      synth.Sine(1, seed=seed + DRIFT_SEED_OFFSET),
                                                      seed, n, ABRUPT_WIDTH)),
    "sine_gradual": StreamSpec("synthetic", "rules",
                               "Sine: SINE2 switching to reversed SINE2 around the middle (gradual)",
                               lambda seed, n: _switch(synth.Sine(2, seed=seed),
                                                       synth.Sine(3, seed=seed + DRIFT_SEED_OFFSET),
                                                       seed, n, GRADUAL_WIDTH)),
    "stagger": StreamSpec("synthetic", "rules", "STAGGER: concept 0 switching to concept 1 at the middle (abrupt)",
                          lambda seed, n: _switch(synth.STAGGER(0, seed=seed),
                                                  synth.STAGGER(1, seed=seed + DRIFT_SEED_OFFSET),
                                                  seed, n, ABRUPT_WIDTH)),
    "agrawal_abrupt": StreamSpec("synthetic", "rules", "Agrawal: function 0 switching to function 2 at the middle "
                                 "(abrupt)", lambda seed, n: _switch(synth.Agrawal(0, seed=seed),
                                                                     synth.Agrawal(2, seed=seed + DRIFT_SEED_OFFSET),
                                                                     seed, n, ABRUPT_WIDTH)),
    "agrawal_gradual": StreamSpec("synthetic", "rules", "Agrawal: function 1 switching to function 4 around the "
                                  "middle (gradual)",
                                  lambda seed, n: _switch(synth.Agrawal(1, seed=seed),
                                                          synth.Agrawal(4, seed=seed + DRIFT_SEED_OFFSET),
                                                          seed, n, GRADUAL_WIDTH)),
    "mixed": StreamSpec("synthetic", "rules", "Mixed: 2 boolean and 2 numeric features, no drift",
                        lambda seed, n: synth.Mixed(seed=seed)),
    "random_tree": StreamSpec("synthetic", "rules", "RandomTree: 5 numeric and 5 nominal features, 2 classes, "
                              "no drift", lambda seed, n: synth.RandomTree(seed_tree=seed, seed_sample=seed)),
    "gae_permute": StreamSpec("gae", "gae", "gae's permute setting: 4 categories, 8 factors, 4 actions permuted "
                              "at the middle", _gae("permute")),
    "gae_multimodal": StreamSpec("gae", "multimodal", "gae's multimodal setting: 3 clusters per action, no drift",
                                 _gae("multimodal")),
    "gae_moons_permute": StreamSpec("gae", "gae", "gae's moons_permute setting: scikit-learn's moons, "
                                    "4 categories, labels swapped at the middle", _gae("moons_permute")),
}


# gae's configurations in the suite: its two presets, the recommended prototypes without their judges (the
# recommended configuration before issue 31), the drift-aware mode (the recommended one before learning='lvq') and
# the multi-prototype variant (add a new preset here)
GAE_CONFIGS: dict[str, JudgmentConfig] = {"jm_recommended": JudgmentConfig.recommended(),
                                          "jm_lvq": JudgmentConfig.recommended().replace(judges=None),
                                          "jm_seed": JudgmentConfig.seed(),
                                          "jm_adaptive": JudgmentConfig.seed().replace(drift_mode="adaptive"),
                                          "jm_prototypes": JudgmentConfig.seed().replace(prototypes=4)}


def _judgment(config: JudgmentConfig) -> Callable[[int, str | None], base.Classifier]:
    return lambda seed, category: JudgmentClassifier(category=category, **config.to_dict())


def _knn(window: int) -> Callable[[int, str | None], base.Classifier]:
    return lambda seed, category: neighbors.KNNClassifier(n_neighbors=5,
                                                          engine=neighbors.LazySearch(window_size=window))


# the gae models whose answers are the same in any units (units='memory', docs/inputs.md), run as a user would
# run them: with no scaler in front. The others measure plain distances, and a MinMaxScaler puts their factors in [0, 1]
UNITS_FREE = ("jm_recommended", "jm_lvq")
# the recommended configuration again behind each front: the invariance check (docs/inputs.md)
FRONTS: dict[str, Scaler] = {"jm_units": "units", "jm_minmax": "minmax", "jm_standard": "standard"}
FRONT_WORDS: dict[Scaler, str] = {
    "units": "in random units (RandomUnits: each feature scaled by 1e-3 to 1e3 and shifted)",
    "minmax": "behind MinMaxScaler", "standard": "behind StandardScaler"}

MODELS: dict[str, ModelSpec] = {
    **{name: ModelSpec("gae", f"gae JudgmentClassifier, {name[3:]} ({config!r})", _judgment(config),
                       None if name in UNITS_FREE else "minmax")
       for name, config in GAE_CONFIGS.items()},
    **{name: ModelSpec("gae", f"gae JudgmentClassifier, recommended, {FRONT_WORDS[front]}",
                       _judgment(GAE_CONFIGS["jm_recommended"]), front) for name, front in FRONTS.items()},
    **{f"knn_{window}": ModelSpec("river", f"river KNNClassifier, 5 neighbours, window {window}", _knn(window),
                                  "minmax")
       for window in KNN_WINDOWS},
    "hat": ModelSpec("river", "river HoeffdingAdaptiveTreeClassifier (defaults)",
                     lambda seed, category: tree.HoeffdingAdaptiveTreeClassifier(seed=seed), None),
    "arf": ModelSpec("river", "river ARFClassifier, 10 trees",
                     lambda seed, category: forest.ARFClassifier(n_models=10, seed=seed), None),
    "srp": ModelSpec("river", "river SRPClassifier, 10 Hoeffding trees on random patches",
                     lambda seed, category: SRPClassifier(n_models=10, seed=seed), None),
    "lb": ModelSpec("river", "river LeveragingBaggingClassifier, 10 Hoeffding trees",
                    lambda seed, category: LeveragingBaggingClassifier(model=tree.HoeffdingTreeClassifier(),
                                                                       n_models=10, seed=seed), None),
    "gnb": ModelSpec("river", "river GaussianNB", lambda seed, category: naive_bayes.GaussianNB(), None),
}


def seeds_of(stream: str, seeds: tuple[int, ...] | list[int]) -> list[int]:
    """The seeds a stream runs with: each of ``seeds`` for a generator, the first for a real data set."""
    return list(seeds[:1]) if STREAMS[stream].kind == "real" else list(seeds)


def samples(stream: str, seed: int, n: int, family: str, shuffled: bool = False) -> list[Sample]:
    """The first ``n`` samples of a stream (all of a shorter data set, scikit-learn's in its shuffled order)
    as ``(x, y)`` pairs; ``shuffled``: a river data set's too, its rows in the order of
    ``numpy.random.default_rng(seed).permutation`` (a tuning run's real data, never in the order reported).

    A gae setting's decision becomes ``x``: its factors (``x0``, ``x1``, ...) and its category, as the
    field :data:`CATEGORY` for a gae model and one-hot (``category_<name>``: 1.0 or 0.0) for a river
    model; ``y``: the verified action's name (label noise included). Its uncertain outcomes
    (``skip``) are left out: river's harness learns every sample it scores.
    """
    source = STREAMS[stream].make(seed, n)
    if isinstance(source, list):  # scikit-learn's data, already samples
        return source[:n]
    if STREAMS[stream].kind != "gae":
        if shuffled and STREAMS[stream].kind == "real":
            rows = [(dict(x), y) for x, y in source]
            return [rows[row] for row in np.random.default_rng(seed).permutation(len(rows))[:n]]
        return [(dict(x), y) for x, y in source.take(n)]
    data = source.tensors()
    names = [f"x{name}" for name in source.factor_names]
    rows = []
    for x, category, action, skip in zip(data.x.tolist(), data.category.tolist(), data.action.tolist(),
                                         data.skip.tolist(), strict=True):
        if skip:
            continue
        features: dict[Hashable, Any] = dict(zip(names, x, strict=True))
        if family == "gae":
            features[CATEGORY] = source.category_names[category]
        else:
            features.update({f"category_{name}": float(index == category)
                             for index, name in enumerate(source.category_names)})
        rows.append((features, source.action_names[action]))
    return rows


def build(model: str | ModelSpec, seed: int, stream: str) -> base.Estimator:
    """A fresh model (a name among :data:`MODELS`, or a spec) for a stream, its scaler in front
    (``ModelSpec.scaler``); for a gae model on a gae setting, the category field named (and led past the
    scaler)."""
    spec = MODELS[model] if isinstance(model, str) else model
    category = CATEGORY if spec.family == "gae" and STREAMS[stream].kind == "gae" else None
    classifier = spec.make(seed, category)
    if spec.scaler is None:
        return classifier
    scaler = _scaler(spec.scaler, seed)
    if category is None:
        return scaler | classifier
    # the category field is a name: it passes the scaler by, untouched
    return ((compose.Discard(category) | scaler) + compose.Select(category)) | classifier


def _classifier(model: base.Estimator) -> base.Estimator:
    return list(model.steps.values())[-1] if hasattr(model, "steps") else model


def model_bytes(model: base.Estimator) -> int:
    """The state of a model, the scaler left out: a gae classifier's memory's parameters and buffers
    (:func:`training.evaluation.state_bytes`; its audit logs are :func:`log_bytes`), a river model's
    ``_raw_memory_usage`` (river's deep size of the object graph, Python object overheads included)."""
    classifier = _classifier(model)
    if isinstance(classifier, JudgmentClassifier):
        return 0 if classifier.memory is None else state_bytes(classifier.memory)
    return int(classifier._raw_memory_usage)


def log_bytes(model: base.Estimator) -> int:
    """Bytes of the tensors of a gae memory's audit logs (the decision log behind ``trace``, ``undo_`` and
    ``forget_``, and the event logs: its extra state), which grow with every decision unless
    ``max_log_events`` bounds them; 0 for a river model."""
    classifier = _classifier(model)
    if not isinstance(classifier, JudgmentClassifier) or classifier.memory is None:
        return 0
    return _tensor_bytes(classifier.memory.get_extra_state())


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def run(model: str | ModelSpec, stream: str, seed: int, n: int, shuffled: bool = False) -> RunResult:
    """One prequential run (test, then train, one sample at a time) of a fresh ``model`` (a name among
    :data:`MODELS`, or a spec) on ``stream`` (its samples: :func:`samples`), after an untimed warm-up run of
    another fresh one on the first :data:`WARM_UP` samples."""
    torch.set_num_threads(1)  # one decision at a time: thread hand-offs would cost more than they save
    spec = MODELS[model] if isinstance(model, str) else model
    data = samples(stream, seed, n, spec.family, shuffled)
    evaluate.progressive_val_score(data[:WARM_UP], build(model, seed, stream), metrics.Accuracy())
    fresh = build(model, seed, stream)
    began = time.perf_counter()
    accuracy = evaluate.progressive_val_score(data, fresh, metrics.Accuracy())
    seconds = time.perf_counter() - began
    return RunResult(100 * accuracy.get(), seconds / len(data) * 1e6, model_bytes(fresh), log_bytes(fresh),
                     len(data))


def run_task(task: tuple[str, str, int, int]) -> RunResult:
    """:func:`run` of a ``(model, stream, seed, n)`` task: what a process pool maps."""
    return run(*task)
