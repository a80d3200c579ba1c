"""The estimators' input holes: a missing label (None, NaN) or a sample with no factor is refused
by name and changes nothing, in gae.river and gae.sklearn alike."""

from __future__ import annotations

import copy
import decimal
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

# every spelling of a missing label a user may pass: None, and NaN as each numeric type holds it
MISSING_LABELS = [None, float("nan"), math.nan, np.nan, np.float64("nan"), np.float32(math.nan),
                  np.float16(math.nan), np.longdouble("nan"), complex(math.nan, 0.0), decimal.Decimal("NaN")]
MISSING_IDS = ["None", "float", "math", "np.nan", "float64", "float32", "float16", "longdouble", "complex",
               "Decimal"]


def snapshot(model: Any, memory_attribute: str) -> tuple[Any, dict[str, Any]]:
    """Copies of the memory's state_dict (None before it is built) and of the estimator's own attributes."""
    memory = getattr(model, memory_attribute, None)
    state = None if memory is None else copy.deepcopy(memory.state_dict())
    own = {name: copy.deepcopy(value) for name, value in vars(model).items()
           if name not in (memory_attribute, "_lock")}
    return state, own


def equal(a: Any, b: Any) -> bool:
    """Equal values, tensors and arrays compared by dtype, shape and every element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(u, v) for u, v in zip(a, b, strict=True))
    return a == b


# -- gae.river -------------------------------------------------------------------------------------
def river_classes():
    pytest.importorskip("river")
    from gae.river import JudgmentClassifier, KNNClassifier

    return {"judgment": JudgmentClassifier, "knn": KNNClassifier}


@pytest.fixture(params=["judgment", "knn"])
def river_cls(request):
    return river_classes()[request.param]


@pytest.mark.parametrize("label", MISSING_LABELS, ids=MISSING_IDS)
def test_river_refuses_a_missing_label_and_changes_nothing(river_cls, label):
    fresh = river_cls()
    before = snapshot(fresh, "memory")
    with pytest.raises(ValueError, match=r"y must be a label, got .*(None|nan|NaN)"):
        fresh.learn_one({"a": 0.5, "b": 0.5}, label)
    assert fresh.memory is None and equal(snapshot(fresh, "memory"), before)
    model = river_cls()
    model.learn_one({"a": 0.5, "b": 0.5}, "x")
    before = snapshot(model, "memory")
    for _ in range(3):  # each NaN object used to become one more label
        with pytest.raises(ValueError, match="y must be a label"):
            model.learn_one({"a": 0.1, "b": 0.9}, label)
    assert equal(snapshot(model, "memory"), before)
    assert model.memory.action_names == ("x",) and model.predict_one({"a": 0.1, "b": 0.9}) == "x"
    model.learn_one({"a": 0.1, "b": 0.9}, "y")  # still learns a real label
    assert model.memory.action_names == ("x", "y")


@pytest.mark.parametrize("x", [{}, {"unseen": 1.0}, {"unseen": 1.0, "other": 2}],
                         ids=["only-category", "only-new-features", "two-new-features"])
def test_river_refuses_a_sample_with_none_of_the_factors(river_cls, x):
    model = river_cls(category="desk")
    for first in ({}, {"desk": "a"}):  # the first sample: nothing to take the factors from
        with pytest.raises(ValueError, match="x must have at least one feature besides the category field"):
            model.learn_one(first, "x")
    assert model.memory is None
    model.learn_one({"desk": "a", "f": 0.5, "g": 0.5}, "x")
    before = snapshot(model, "memory")
    for sample in ({"desk": "a", **x}, {"desk": "b", **x}):  # a known category and a new one
        with pytest.raises(ValueError, match=r"x must hold at least one of the features \['f', 'g'\].*got \{"):
            model.learn_one(sample, "y")  # used to learn a decision of all zeros
    assert equal(snapshot(model, "memory"), before) and int(model.memory.num_decisions) == 1
    assert model.predict_one({"desk": "a", **x}) == "x"  # scored as zeros (missing="zero")


def test_river_with_missing_error_names_the_first_missing_feature():
    model = river_classes()["judgment"](missing="error")
    model.learn_one({"f": 0.5, "g": 0.5}, "x")
    before = snapshot(model, "memory")
    with pytest.raises(KeyError, match="x has no feature 'f'"):
        model.learn_one({}, "y")
    assert equal(snapshot(model, "memory"), before)


# -- gae.sklearn -----------------------------------------------------------------------------------
def sklearn_class():
    pytest.importorskip("sklearn")
    from gae.sklearn import JudgmentClassifier

    return JudgmentClassifier


X = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [0.2, 0.8]])
BAD_Y = [  # (y, the value and position the message names)
    ([0, None, 1, 0], r"None at y\[1\]"),
    ([None, None, None, None], r"None at y\[0\]"),
    (["a", "b", None, "a"], r"None at y\[2\]"),
    ([0.0, 1.0, 0.0, float("nan")], r"nan at y\[3\]"),
    (np.array([0, 1, np.nan, 1], dtype=np.float32), r"nan at y\[2\]"),
    (np.array(["a", math.nan, "b", "a"], dtype=object), r"nan at y\[1\]"),
    (np.array([1, 2, np.float32("nan"), 1], dtype=object), r"nan at y\[2\]"),
]


@pytest.mark.parametrize(("y", "words"), BAD_Y)
def test_sklearn_refuses_missing_labels_by_position_and_changes_nothing(y, words):
    cls = sklearn_class()
    for call in (lambda m: m.fit(X, y), lambda m: m.partial_fit(X, y, classes=[0, 1])):
        model = cls()
        before = snapshot(model, "memory_")
        with pytest.raises(ValueError, match=f"y must hold labels, not missing values: got {words}"):
            call(model)
        assert equal(snapshot(model, "memory_"), before) and not hasattr(model, "memory_")
    fitted = cls().fit(X, [0, 1, 0, 1])
    before = snapshot(fitted, "memory_")
    for call in (lambda m: m.partial_fit(X, y), lambda m: m.fit(X, y)):
        with pytest.raises(ValueError, match=f"y must hold labels, not missing values: got {words}"):
            call(fitted)
        assert equal(snapshot(fitted, "memory_"), before)


@pytest.mark.parametrize("classes", [[0, 1, None], [0.0, 1.0, float("nan")], np.array([0, np.nan])])
def test_sklearn_refuses_missing_classes_and_changes_nothing(classes):
    model = sklearn_class()()
    with pytest.raises(ValueError, match=r"classes must hold labels, not missing values: got (None|nan) at "
                                         r"classes\[\d\]"):
        model.partial_fit(X, [0, 1, 0, 1], classes=classes)
    assert not hasattr(model, "memory_")


def test_sklearn_refuses_an_empty_X_and_changes_nothing():
    # scikit-learn's own check answers (X with no rows or no columns), before the memory is built
    cls = sklearn_class()
    for empty, y in ((np.zeros((0, 2)), []), (np.zeros((4, 0)), [0, 1, 0, 1])):
        model = cls()
        with pytest.raises(ValueError, match=r"Found array with 0 (sample|feature)\(s\)"):
            model.fit(empty, y)
        assert not hasattr(model, "memory_")
        fitted = cls().fit(X, [0, 1, 0, 1])
        before = snapshot(fitted, "memory_")
        with pytest.raises(ValueError, match=r"Found array with 0 (sample|feature)\(s\)|features"):
            fitted.partial_fit(empty, y)
        assert equal(snapshot(fitted, "memory_"), before)


def test_a_label_not_equal_to_itself_is_refused_everywhere() -> None:
    import numpy as np
    import pytest as _pytest

    river = _pytest.importorskip("gae.river")
    model = river.JudgmentClassifier()
    model.learn_one({"a": 0.5}, "x")
    with _pytest.raises(ValueError, match="y must be a label"):
        model.learn_one({"a": 0.4}, np.datetime64("NaT"))
    assert model._labels == ["x"]
    from gae.sklearn import _is_missing

    assert _is_missing(np.datetime64("NaT")) and not _is_missing(np.datetime64("2026-01-01")) and not _is_missing("x")
