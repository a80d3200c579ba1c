"""Streams whose actions have several modes: DecisionStream(modes=M) and the scikit-learn streams."""

from __future__ import annotations

import doctest
import importlib.util
import sys

import pytest
import torch

from training.batch import DecisionBatch
from training.streams import DecisionStream

needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn")
KINDS = ["permute", "redraw", "shift"]
DTYPES = {"x": torch.float32, "category": torch.int64, "action": torch.int64, "truth": torch.int64,
          "overridden": torch.bool, "confirmed": torch.int8, "skip": torch.bool, "timestamp": torch.float64,
          "id": torch.int64, "position": torch.int64}


def assert_batches_equal(a: DecisionBatch, b: DecisionBatch) -> None:
    for name, left, right in zip(DecisionBatch._fields, a, b, strict=True):
        assert left.dtype == right.dtype and torch.equal(left, right), name


def truth_clusters(stream: DecisionStream) -> torch.Tensor:
    """(N, M, K): the prototypes in force of each decision's ground-truth action, one per mode."""
    in_force = stream.prototypes_in_force()  # (N, A * M, K)
    n, _, n_factors = in_force.shape
    per_action = in_force.reshape(n, stream.n_actions, stream.modes, n_factors)
    return per_action[torch.arange(n), stream.tensors().truth]


# -- DecisionStream(modes=M) ---------------------------------------------------------------
@pytest.mark.parametrize("options", [{"seed": 0}, {"seed": 3, "drift_at": [300, 600], "drift_kind": "permute"},
                                     {"seed": 4, "drift_at": 500, "drift_kind": "redraw", "drift_duration": 100},
                                     {"seed": 5, "drift_at": 400, "drift_kind": "shift", "outliers": 0.1}])
def test_one_mode_is_the_default_stream(options):
    plain, one = DecisionStream(1000, **options), DecisionStream(1000, modes=1, **options)
    assert_batches_equal(plain.tensors(), one.tensors())
    assert torch.equal(plain.prototypes, one.prototypes) and torch.equal(plain.outlier_mask, one.outlier_mask)
    assert one.modes == 1 and one.prototypes.shape[2] == one.n_actions


@pytest.mark.parametrize(("options", "category", "truth", "total"), [
    ({"seed": 0}, [2, 3, 0, 0, 0, 1, 2, 0, 1, 2, 3, 2], [2, 3, 1, 0, 0, 0, 3, 3, 0, 2, 2, 0], 42.353),
    ({"seed": 1, "drift_at": 6, "outliers": 0.3}, [3, 3, 0, 2, 3, 1, 1, 2, 0, 2, 0, 2],
     [1, 1, 1, 2, 1, 1, 0, 2, 0, 3, 1, 0], 51.13587),
])
def test_one_mode_draws_the_stream_of_earlier_versions(options, category, truth, total):
    data = DecisionStream(12, **options).tensors()  # values drawn before modes existed
    assert data.category.tolist() == category and data.truth.tolist() == truth
    assert float(data.x.double().sum()) == pytest.approx(total, abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_every_decision_comes_from_a_cluster_of_its_truth(kind):
    stream = DecisionStream(1200, modes=3, factor_noise=0.0, drift_at=[400, 800], drift_kind=kind,
                            drift_duration=50, seed=2)
    assert stream.modes == 3 and stream.prototypes.shape == (3, 4, 12, 8)
    assert stream.prototypes_in_force().shape == (1200, 12, 8)
    x = stream.tensors().x
    match = (truth_clusters(stream) == x[:, None, :]).all(-1)  # (N, M)
    assert bool(match.any(-1).all())
    assert bool(match.any(0).all())  # every mode is drawn


def test_the_modes_of_an_action_are_apart_and_noise_factors_stay_shared():
    stream = DecisionStream(100, modes=4, categories=3, informative=3, seed=6)
    clusters = stream.prototypes[0].view(3, 4, 4, 8)  # (C, A, M, K)
    mask = stream.informative_mask
    spread = clusters.amax(dim=2) - clusters.amin(dim=2)  # (C, A, K) across the modes of each action
    assert bool((spread[~mask[:, None, :].expand_as(spread)] == 0).all())
    assert bool((spread[mask[:, None, :].expand_as(spread)] > 0).all())


def test_permute_gives_each_action_every_cluster_of_the_next():
    stream = DecisionStream(100, modes=3, actions=4, drift_at=50, drift_kind="permute", seed=1)
    before, after = (p.view(4, 4, 3, 8) for p in stream.prototypes)  # (C, A, M, K)
    for a in range(4):
        assert torch.equal(after[:, a], before[:, (a + 1) % 4])


def test_shift_moves_each_cluster_and_outliers_take_an_action():
    shifted = DecisionStream(100, modes=2, drift_at=50, drift_kind="shift", drift_shift=0.2, seed=4)
    distance = (shifted.prototypes[1] - shifted.prototypes[0]).norm(dim=-1)  # (C, A * M)
    assert distance.shape == (4, 8) and bool((distance > 0).all()) and bool((distance <= 0.2 + 1e-6).all())
    noisy = DecisionStream(2000, modes=3, outliers=0.2, seed=5)
    data = noisy.tensors()
    assert int(data.truth.max()) < noisy.n_actions and bool((data.action[noisy.outlier_mask] < 4).all())
    nearest = torch.cdist(data.x[:, None, :], noisy.prototypes_in_force()).squeeze(1).amin(-1)  # (N,)
    assert float(nearest[noisy.outlier_mask].median()) > float(nearest[~noisy.outlier_mask].median())


@pytest.mark.parametrize(("modes", "error"), [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_modes_raise_naming_the_argument(modes, error):
    with pytest.raises(error, match="modes"):
        DecisionStream(10, modes=modes)


# -- SklearnDecisionStream -------------------------------------------------------------------
@needs_sklearn
@pytest.mark.parametrize(("generator", "actions", "factors"), [("classification", 4, 8), ("moons", 2, 2),
                                                               ("blobs", 4, 8), ("circles", 2, 2), ("rotating", 2, 4)])
def test_sklearn_streams_have_the_decision_stream_fields(generator, actions, factors):
    from training.streams_sklearn import SklearnDecisionStream

    stream = SklearnDecisionStream(300, generator=generator, categories=["a", "b", "c"], seed=1, start_time=10.0,
                                   interval=2.0, id_offset=5)
    data = stream.tensors()
    assert (len(stream), stream.n_categories, stream.n_actions, stream.n_factors) == (300, 3, actions, factors)
    assert {name: t.dtype for name, t in zip(DecisionBatch._fields, data, strict=True)} == DTYPES
    assert data.x.shape == (300, factors) and all(t.shape == (300,) for t in data[1:])
    assert set(data.category.tolist()) == {0, 1, 2} and set(data.truth.tolist()) == set(range(actions))
    assert bool((data.confirmed == -1).all()) and torch.equal(data.overridden, data.action != data.truth)
    assert torch.equal(data.position, torch.arange(300)) and torch.equal(data.id, torch.arange(300) + 5)
    assert torch.equal(data.timestamp, 10.0 + 2.0 * torch.arange(300).double())
    # min-max over the whole stream: every factor spans [0, 1] exactly
    assert torch.equal(data.x.amin(0), torch.zeros(factors)) and torch.equal(data.x.amax(0), torch.ones(factors))


@needs_sklearn
def test_sklearn_streams_are_a_function_of_the_seed_and_categories_differ():
    from training.streams_sklearn import SklearnDecisionStream

    first, again, other = (SklearnDecisionStream(2000, categories=2, seed=seed) for seed in (3, 3, 4))
    assert_batches_equal(first.tensors(), again.tensors())
    assert not torch.equal(first.tensors().x, other.tensors().x)
    assert len(set(first.random_states)) == 2
    data = first.tensors()
    means = torch.stack([torch.stack([data.x[(data.category == c) & (data.truth == a)].mean(0) for a in range(4)])
                         for c in range(2)])  # (C, A, K): each category's own class means
    assert float((means[0] - means[1]).norm(dim=-1).min()) > 0.1


@needs_sklearn
def test_sklearn_label_noise_and_uncertain_rates_are_honoured():
    from training.streams_sklearn import SklearnDecisionStream

    data = SklearnDecisionStream(5000, label_noise=0.2, uncertain=0.1, seed=2).tensors()
    assert float(data.overridden.float().mean()) == pytest.approx(0.2, abs=0.02)
    assert float(data.skip.float().mean()) == pytest.approx(0.1, abs=0.015)
    clean = SklearnDecisionStream(500, generator="moons", label_noise=0.0, seed=2).tensors()
    assert torch.equal(clean.action, clean.truth) and not bool(clean.overridden.any())


@needs_sklearn
@pytest.mark.parametrize(("options", "error", "name"), [
    ({"n_decisions": 0}, ValueError, "n_decisions"),
    ({"n_decisions": 10, "generator": "swiss_roll"}, ValueError, "generator"),
    ({"n_decisions": 10, "categories": 0}, ValueError, "categories"),
    ({"n_decisions": 10, "label_noise": 1.5}, ValueError, "label_noise"),
    ({"n_decisions": 10, "uncertain": "a"}, TypeError, "uncertain"),
    ({"n_decisions": 10, "seed": -1}, ValueError, "seed"),
    ({"n_decisions": 10, "random_state": 3}, ValueError, "random_state"),
    ({"n_decisions": 10, "n_samples": 3}, ValueError, "n_samples"),
    ({"n_decisions": 10, "generator": "moons", "n_features": 3}, TypeError, "n_features"),
    ({"n_decisions": 10, "n_classes": 0}, ValueError, "n_classes"),
    ({"n_decisions": 10, "n_classes": 1}, ValueError, "label_noise"),
    ({"n_decisions": 10, "generator": "blobs", "centers": None}, ValueError, "centers"),
    ({"n_decisions": 10, "generator": "moons", "noise": -1.0}, ValueError, "noise"),
])
def test_sklearn_bad_arguments_raise_naming_them(options, error, name):
    from training.streams_sklearn import SklearnDecisionStream

    with pytest.raises(error, match=name):
        SklearnDecisionStream(**options)


@needs_sklearn
def test_sklearn_stream_without_scikit_learn_says_how_to_install_it(monkeypatch):
    from training.streams_sklearn import SklearnDecisionStream

    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        SklearnDecisionStream(10)


@needs_sklearn
def test_sklearn_docstring_examples_run():
    from training import streams_sklearn

    result = doctest.testmod(streams_sklearn, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
