"""The standard streams for the head-to-head: circles, the rotating boundary, one or two clusters per class,
and the label permutation at a decision index."""

from __future__ import annotations

import doctest
import importlib.util
import math
import sys

import numpy as np
import pytest
import torch

from training.batch import DecisionBatch
from training.streams_rotating import make_rotating, rotating_classes
from training.streams_sklearn import SklearnDecisionStream

needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn")


def assert_batches_equal(a: DecisionBatch, b: DecisionBatch) -> None:
    for name, left, right in zip(DecisionBatch._fields, a, b, strict=True):
        assert left.dtype == right.dtype and torch.equal(left, right), name


def raw_factors(stream: SklearnDecisionStream) -> np.ndarray:
    """(N, K) float64: the generator's factors, undoing the min-max scaling (to float32 precision)."""
    low, high = stream.factor_range.numpy()
    return low + stream.tensors().x.double().numpy() * (high - low)


def linear_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(K + 1,): a least-squares linear classifier of y in {0, 1} (bias last)."""
    return np.linalg.lstsq(np.c_[x, np.ones(len(x))], 2.0 * y - 1.0, rcond=None)[0]


def linear_accuracy(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(((np.c_[x, np.ones(len(x))] @ weights > 0) == y).mean())


# -- the label permutation -------------------------------------------------------------------
@pytest.mark.parametrize(("generator", "n_actions"), [
    pytest.param("classification", 4, marks=needs_sklearn), pytest.param("circles", 2, marks=needs_sklearn),
    ("rotating", 2)])
def test_permute_at_maps_the_truth_to_the_next_action_from_the_index_on(generator, n_actions):
    plain = SklearnDecisionStream(600, generator=generator, categories=2, label_noise=0.2, seed=4)
    permuted = SklearnDecisionStream(600, generator=generator, categories=2, label_noise=0.2, permute_at=250, seed=4)
    assert (plain.permute_at, plain.drift_at) == (None, ())
    assert (permuted.permute_at, permuted.drift_at) == (250, (250,))
    a, b = plain.tensors(), permuted.tensors()
    for name in ("x", "category", "overridden", "confirmed", "skip", "timestamp", "id", "position"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(b.truth[:250], a.truth[:250]) and torch.equal(b.action[:250], a.action[:250])
    assert torch.equal(b.truth[250:], (a.truth[250:] + 1) % n_actions)
    # the verifier's errors are drawn apart from the truth: a wrong verdict moves with it
    assert torch.equal(b.action[250:], (a.action[250:] + 1) % n_actions)
    assert bool(b.overridden.any()) and torch.equal(b.overridden, b.action != b.truth)
    assert bool((b.truth[250:] != a.truth[250:]).all())


@pytest.mark.parametrize(("permute_at", "drift_at"), [(0, ()), (1, (1,)), (99, (99,)), (100, ())])
def test_permute_at_the_ends_changes_nothing_within_the_stream(permute_at, drift_at):
    plain = SklearnDecisionStream(100, generator="rotating", seed=1).tensors()
    stream = SklearnDecisionStream(100, generator="rotating", permute_at=permute_at, seed=1)
    assert stream.permute_at == permute_at and stream.drift_at == drift_at
    truth = stream.tensors().truth
    assert torch.equal(truth[:permute_at], plain.truth[:permute_at])
    assert torch.equal(truth[permute_at:], 1 - plain.truth[permute_at:])


# -- the rotating boundary -------------------------------------------------------------------
def test_rotating_truth_is_the_side_of_the_turning_line():
    stream = SklearnDecisionStream(3000, generator="rotating", n_features=5, categories=3, label_noise=0.0, seed=2)
    data = stream.tensors()
    assert (stream.n_factors, stream.n_actions, stream.options) == (5, 2, {"n_features": 5})
    assert stream.boundary_angle is not None and stream.boundary_angle.dtype == torch.float64
    angle = stream.boundary_angle.numpy()
    raw = raw_factors(stream)
    side = -(raw[:, 0] - 0.5) * np.sin(angle) + (raw[:, 1] - 0.5) * np.cos(angle)
    clear = np.abs(side) > 1e-5  # away from the line, where float32 scaling cannot move a point across it
    assert clear.mean() > 0.99
    assert np.array_equal(data.truth.numpy()[clear], (side[clear] > 0).astype(np.int64))
    assert float(data.truth.float().mean()) == pytest.approx(0.5, abs=0.03)
    # each category starts at its own angle and all turn a quarter turn over the whole stream, at a constant rate
    category = data.category.numpy()
    index = np.arange(3000)
    start = [angle[category == c][0] - math.pi / 2 * index[category == c][0] / 2999 for c in range(3)]
    assert np.allclose(angle, np.take(start, category) + math.pi / 2 * index / 2999, atol=1e-12)
    assert min(abs(a - b) for a, b in ((start[0], start[1]), (start[0], start[2]), (start[1], start[2]))) > 1e-3


@pytest.mark.parametrize(("rotation", "low", "high"), [(math.pi / 2, 0.0, 0.7), (0.0, 0.9, 1.0)])
def test_a_line_fit_on_the_first_tenth_fails_on_the_last_only_when_the_boundary_turns(rotation, low, high):
    stream = SklearnDecisionStream(2000, generator="rotating", rotation=rotation, label_noise=0.0, seed=3)
    x, y = stream.tensors().x.double().numpy(), stream.tensors().truth.numpy()
    weights = linear_fit(x[:200], y[:200])
    assert linear_accuracy(weights, x[:200], y[:200]) > 0.95
    assert low < linear_accuracy(weights, x[-200:], y[-200:]) < high


def test_rotating_needs_no_scikit_learn_and_make_rotating_matches_its_formula(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    stream = SklearnDecisionStream(50, generator="rotating", rotation=-1.0, seed=0)
    assert stream.boundary_angle is not None
    assert float(stream.boundary_angle[-1] - stream.boundary_angle[0]) == pytest.approx(-1.0)
    progress = np.linspace(0.0, 1.0, 400)
    x, classes, angle = make_rotating(progress, n_features=3, rotation=2.0, random_state=7)
    again = make_rotating(progress, n_features=3, rotation=2.0, random_state=7)
    assert x.shape == (400, 3) and np.array_equal(x, again.x) and np.array_equal(classes, again.classes)
    assert np.allclose(angle - angle[0], 2.0 * progress) and 0.0 <= angle[0] < 2 * math.pi
    assert np.array_equal(classes, rotating_classes(x, angle)) and x.min() >= 0.0 and x.max() <= 1.0
    # the normal (-sin, cos) of a line at angle 0 points up: the upper half is class 1
    assert rotating_classes(np.array([[0.5, 0.9], [0.5, 0.1]]), np.zeros(2)).tolist() == [1, 0]


# -- circles and the clusters per class ------------------------------------------------------
@needs_sklearn
def test_circles_are_two_rings_around_one_centre():
    stream = SklearnDecisionStream(2000, generator="circles", label_noise=0.0, seed=5)
    data = stream.tensors()
    assert stream.options == {"noise": 0.1, "factor": 0.5} and stream.boundary_angle is None
    assert set(data.truth.tolist()) == {0, 1}
    assert float(data.truth.float().mean()) == pytest.approx(0.5, abs=0.01)  # make_circles splits n in half
    outer, inner = (data.x[data.truth == a] for a in (0, 1))
    assert float((outer.mean(0) - inner.mean(0)).norm()) < 0.05  # one centre: a centroid per action cannot tell
    centre = data.x.mean(0)
    radius_outer, radius_inner = ((points - centre).norm(dim=1) for points in (outer, inner))
    assert float(radius_inner.median()) < 0.6 * float(radius_outer.median())


@needs_sklearn
@pytest.mark.parametrize("clusters", [1, 2])
def test_classification_with_one_or_two_clusters_per_class(clusters):
    from sklearn.datasets import make_classification

    stream = SklearnDecisionStream(1500, n_clusters_per_class=clusters, label_noise=0.0, seed=1)
    assert stream.options["n_clusters_per_class"] == clusters and stream.n_actions == 4
    data = stream.tensors()
    x, y = make_classification(n_samples=1500, random_state=stream.random_states[0], **stream.options)
    assert np.array_equal(data.truth.numpy(), y) and np.allclose(raw_factors(stream), x, atol=1e-5)
    # one centroid per class describes one cluster per class, not two
    means = torch.stack([data.x[data.truth == a].mean(0) for a in range(4)])
    accuracy = float((torch.cdist(data.x, means).argmin(1) == data.truth).float().mean())
    assert accuracy > 0.93 if clusters == 1 else 0.7 < accuracy < 0.9


@pytest.mark.parametrize("generator", [pytest.param("circles", marks=needs_sklearn), "rotating"])
def test_new_streams_are_a_function_of_the_seed(generator):
    first, again, other = (SklearnDecisionStream(500, generator=generator, categories=2, permute_at=200, seed=seed)
                           for seed in (6, 6, 7))
    assert_batches_equal(first.tensors(), again.tensors())
    assert not torch.equal(first.tensors().x, other.tensors().x)
    x = first.tensors().x
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "error", "name"), [
    ({"permute_at": -1}, ValueError, "permute_at"),
    ({"permute_at": 11}, ValueError, "permute_at"),
    ({"permute_at": 1.5}, TypeError, "permute_at"),
    ({"permute_at": True}, TypeError, "permute_at"),
    ({"permute_at": "3"}, TypeError, "permute_at"),
    ({"n_features": 1}, ValueError, "n_features"),
    ({"n_features": 2.5}, TypeError, "n_features"),
    ({"rotation": math.inf}, ValueError, "rotation"),
    ({"rotation": "quarter"}, TypeError, "rotation"),
    ({"noise": 0.1}, TypeError, "noise"),
    ({"progress": [0.5]}, ValueError, "progress"),
    ({"n_samples": 3}, ValueError, "n_samples"),
])
def test_bad_rotating_options_raise_naming_them(options, error, name):
    with pytest.raises(error, match=name):
        SklearnDecisionStream(10, generator="rotating", **options)


@needs_sklearn
@pytest.mark.parametrize(("options", "error", "name"), [
    ({"generator": "circles", "noise": -1.0}, ValueError, "noise"),
    ({"generator": "circles", "factor": 1.5}, ValueError, "factor"),
    ({"generator": "circles", "n_features": 3}, TypeError, "n_features"),
    ({"n_classes": 1, "label_noise": 0.0, "permute_at": 5}, ValueError, "permute_at"),
    ({"n_clusters_per_class": 5}, ValueError, "n_classes"),  # 4 classes x 5 clusters > 2 ** 4 vertices
])
def test_bad_sklearn_options_raise_naming_them(options, error, name):
    with pytest.raises(error, match=name):
        SklearnDecisionStream(10, **options)


@pytest.mark.parametrize(("progress", "options", "error", "name"), [
    (np.array([0.0, 1.5]), {}, ValueError, "progress"),
    (np.zeros((2, 2)), {}, ValueError, "progress"),
    (np.zeros(3), {"n_features": 0}, ValueError, "n_features"),
    (np.zeros(3), {"rotation": math.nan}, ValueError, "rotation"),
])
def test_make_rotating_rejects_bad_arguments(progress, options, error, name):
    with pytest.raises(error, match=name):
        make_rotating(progress, **options)


def test_rotating_docstring_examples_run():
    from training import streams_rotating

    result = doctest.testmod(streams_rotating, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
