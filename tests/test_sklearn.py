"""gae.sklearn.JudgmentClassifier: scikit-learn's own estimator checks, pipelines, and that it
is the judgment memory driven directly, with every option a parameter."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.datasets import load_iris, make_blobs  # noqa: E402
from sklearn.model_selection import StratifiedKFold, cross_val_score  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from gae import JudgmentConfig, JudgmentMemory  # noqa: E402
from gae.sklearn import JudgmentClassifier  # noqa: E402

OPTIONS = JudgmentConfig.options()


def expected_failed_checks(estimator: JudgmentClassifier) -> dict[str, str]:
    """Checks the online memory cannot pass, with the reason: none today, every check passes."""
    return {}


@parametrize_with_checks([JudgmentClassifier(), JudgmentClassifier(drift_mode="seed", prototypes=3)],
                         expected_failed_checks=expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check, monkeypatch):
    # sklearn skips its array API check (NumPy inputs with array API dispatch on) unless this is
    # set; the estimator does not dispatch, so the check holds it to giving the same answers
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)


def stream(seed: int, n: int, *, categories: int = 3, factors: int = 4, classes: int = 3):
    """Rows around a centre per (category, class), the category id in the last column."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-2, 2, (categories, classes, factors))
    category = rng.integers(0, categories, n)
    label = rng.integers(0, classes, n)
    x = centres[category, label] + 0.5 * rng.standard_normal((n, factors))
    return np.column_stack([x, category]), label


def direct_memory(X: np.ndarray, y: np.ndarray, config: JudgmentConfig) -> JudgmentMemory:
    """What fit should build: the memory driven by hand, category ids in sorted order."""
    ids = X[:, -1].astype(np.int64)
    categories, classes = np.unique(ids), np.unique(y)
    memory = JudgmentMemory([str(i) for i in categories], [str(c) for c in classes], X.shape[1] - 1, config)
    memory.learn_(torch.tensor(X[:, :-1], dtype=torch.float32), torch.from_numpy(np.searchsorted(categories, ids)),
                  torch.from_numpy(np.searchsorted(classes, y)))
    return memory


def assert_same_state(a: JudgmentMemory, b: JudgmentMemory) -> None:
    for name, mine, theirs in zip(a.state()._fields, a.state(), b.state(), strict=True):
        assert torch.equal(mine, theirs), name
    assert int(a.num_decisions) == int(b.num_decisions)
    assert torch.equal(a.criterion_logits, b.criterion_logits)


# -- scikit-learn's tools -------------------------------------------------------------------------
def test_pipeline_cross_val_score_beats_chance_by_far():
    X, y = load_iris(return_X_y=True)  # three classes: chance is 1/3
    model = Pipeline([("scale", StandardScaler()), ("judgment", JudgmentClassifier())])
    assert cross_val_score(model, X, y, cv=5).mean() > 0.8  # measured 0.86 (the rows come sorted by class)
    shuffled = StratifiedKFold(5, shuffle=True, random_state=0)
    assert cross_val_score(model, X, y, cv=shuffled).mean() > 0.8  # measured 0.87
    X, y = make_blobs(600, n_features=4, centers=4, random_state=0)  # chance 1/4
    assert cross_val_score(model, X, y, cv=5).mean() > 0.95  # measured 1.0


def test_score_and_predict_proba_are_consistent():
    X, y = stream(0, 300, categories=1)
    model = JudgmentClassifier().fit(X[:, :-1], y)
    proba = model.predict_proba(X[:, :-1])
    assert proba.shape == (300, 3) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(1), 1.0)
    np.testing.assert_array_equal(model.predict(X[:, :-1]), model.classes_[proba.argmax(1)])
    assert model.score(X[:, :-1], y) == np.mean(model.predict(X[:, :-1]) == y) > 0.9


# -- the memory, driven through scikit-learn ------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"drift_mode": "seed"}, {"prototypes": 2, "spawn_threshold": 1.5},
                                     {"clip": (-2.0, 2.0), "push_rate": 0.05, "min_confidence": 0.6}])
def test_fit_equals_driving_the_memory(options):
    X, y = stream(1, 400)
    model = JudgmentClassifier(category=4, **options).fit(X, y)
    memory = direct_memory(X, y, JudgmentConfig.recommended().replace(**options))
    assert_same_state(model.memory_, memory)
    test, _ = stream(2, 200)
    with torch.no_grad():
        out = memory(torch.tensor(test[:, :-1], dtype=torch.float32), torch.from_numpy(test[:, -1].astype(np.int64)))
    np.testing.assert_allclose(model.predict_proba(test), out.probs.double().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(model.predict(test), model.classes_[out.probs.argmax(1).numpy()])


def test_partial_fit_in_two_halves_equals_fit():
    X, y = stream(3, 400)
    first = X[:, -1] < 2  # the second half meets category 2 for the first time: added to the memory
    X = np.concatenate([X[first][:100], X[~first | (np.arange(400) >= 250)]])
    y = np.concatenate([y[first][:100], y[~first | (np.arange(400) >= 250)]])
    whole = JudgmentClassifier(category=4).fit(X, y)
    halves = JudgmentClassifier(category=4).partial_fit(X[:100], y[:100], classes=[0, 1, 2])
    assert halves.categories_.tolist() == [0, 1]
    halves.partial_fit(X[100:], y[100:])
    assert halves.categories_.tolist() == whole.categories_.tolist() == [0, 1, 2]
    assert_same_state(halves.memory_, whole.memory_)
    np.testing.assert_array_equal(halves.class_count_, whole.class_count_)
    np.testing.assert_array_equal(halves.predict_proba(X), whole.predict_proba(X))
    online = JudgmentClassifier(category=4)
    for start in range(0, len(X), 37):  # any split learns the same stream
        online.partial_fit(X[start:start + 37], y[start:start + 37], classes=[0, 1, 2])
    assert_same_state(online.memory_, whole.memory_)


def test_partial_fit_after_fit_continues_the_memory():
    X, y = stream(4, 300)
    model = JudgmentClassifier(category=4).fit(X[:200], y[:200])
    memory = model.memory_
    model.partial_fit(X[200:], y[200:])
    assert model.memory_ is memory and int(memory.num_decisions) == 300
    assert_same_state(memory, JudgmentClassifier(category=4).fit(X, y).memory_)


def test_partial_fit_follows_the_classes_convention():
    X, y = stream(5, 60)
    model = JudgmentClassifier()
    with pytest.raises(ValueError, match="classes must be given on the first call"):
        model.partial_fit(X, y)
    assert not hasattr(model, "memory_")
    model.partial_fit(X, y, classes=[0, 1, 2, 3])  # a class with no row yet
    assert model.classes_.tolist() == [0, 1, 2, 3] and model.class_count_[3] == 0
    assert model.predict_proba(X).shape == (60, 4)
    with pytest.raises(ValueError, match=r"classes=\[0, 1\] differs"):
        model.partial_fit(X, y, classes=[0, 1])
    before = (int(model.memory_.num_decisions), model.class_count_.copy())
    with pytest.raises(ValueError, match=r"labels outside classes \[0, 1, 2, 3\]: \[7\]"):
        model.partial_fit(X[:3], [0, 7, 1])
    assert (int(model.memory_.num_decisions), model.class_count_.tolist()) == (before[0], before[1].tolist())
    model.partial_fit(X[:3], [3, 3, 3], classes=[3, 2, 1, 0])  # the same classes, in any order
    assert model.class_count_[3] == 3


def test_partial_fit_refuses_parameters_changed_since_the_memory_was_built():
    X, y = stream(6, 50)
    model = JudgmentClassifier(category=4).fit(X, y)
    model.set_params(tau=0.3)
    with pytest.raises(ValueError, match=r"tau: 0.1 -> 0.3.*call fit"):
        model.partial_fit(X, y)
    model.set_params(tau=0.1, category=0)
    with pytest.raises(ValueError, match=r"category: 4 -> 0"):
        model.partial_fit(X, y)
    model.set_params(category=4, clip=[-9, 9])
    with pytest.raises(ValueError, match=r"clip: None -> \(-9.0, 9.0\)"):
        model.partial_fit(X, y)
    assert int(model.memory_.num_decisions) == 50
    model.set_params(clip=None, tau=0.1 + 0j)
    with pytest.raises(TypeError, match="tau"):
        model.partial_fit(X, y)


# -- parameters ---------------------------------------------------------------------------------
def other_value(name: str, default):
    """A valid value of each option other than its recommended default."""
    special = {"clip": (-3.0, 3.0), "max_log_events": 50, "drift_mode": "adaptive",
               "learning": "gated", "units": "criterion",
               "judges": {"lda": {"kind": "lda", "shrinkage": 0.5, "rate_floor": 0.0, "refresh": 4}}}
    if name in special:
        return special[name]
    if isinstance(default, int):
        return default + 1
    return default / 2 if default > 0 else 0.25


def test_parameters_are_the_config_options_with_recommended_defaults_and_a_bounded_log():
    signature = inspect.signature(JudgmentClassifier)
    assert list(signature.parameters) == ["category", *OPTIONS]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())
    defaults = JudgmentConfig.recommended().replace(max_log_events=10_000)
    assert JudgmentClassifier().get_params() == {"category": None,
                                                 **{name: defaults.parameter(name) for name in OPTIONS}}
    assert JudgmentClassifier().get_params()["learning"] == "lvq"
    assert repr(JudgmentClassifier()) == "JudgmentClassifier()"
    assert repr(JudgmentClassifier(tau=0.5, category=1)) == "JudgmentClassifier(category=1, tau=0.5)"
    assert repr(JudgmentClassifier(max_log_events=None)) == "JudgmentClassifier(max_log_events=None)"
    X, y = stream(17, 20)
    assert JudgmentClassifier().fit(X, y).memory_.config == defaults
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['taus'\]"):
        JudgmentClassifier(taus=0.2)


@pytest.mark.parametrize("bound", ["default", None, 0, 40])
def test_the_log_bound_is_a_parameter(bound):
    X, y = stream(18, 200)
    model = JudgmentClassifier(category=4, **({} if bound == "default" else {"max_log_events": bound}))
    bound = 10_000 if bound == "default" else bound
    assert clone(model).get_params()["max_log_events"] == bound
    for start in range(0, 200, 10):
        model.partial_fit(X[start:start + 10], y[start:start + 10], classes=[0, 1, 2])
    memory, log = model.memory_, model.memory_.decision_log
    assert memory.config.max_log_events == bound and int(memory.num_decisions) == 200
    if bound in (None, 10_000):
        assert len(log) == 200
    elif bound == 0:
        assert len(log) == 0
    else:  # folded as it passed the bound: its base and the log account for every decision
        assert 0 < len(log) <= 40 and int(log.base["num_decisions"]) + len(log) == 200


def test_every_option_round_trips_get_params_set_params_clone_and_fit():
    defaults = JudgmentConfig.recommended()
    changed = {name: other_value(name, defaults.option(name)) for name in OPTIONS}
    assert all(changed[name] != defaults.option(name) for name in OPTIONS)
    expected = {"category": 2, **changed}
    model = JudgmentClassifier(**expected)
    assert model.get_params() == expected
    assert clone(model).get_params() == expected
    assert JudgmentClassifier().set_params(**expected).get_params() == expected
    for name, value in expected.items():
        assert getattr(model, name) is value  # stored unchanged (sklearn's rule for __init__)
    X, y = stream(7, 40, factors=2)
    model.fit(X[:, [0, 1, 2]], y)
    assert model.memory_.config == JudgmentConfig(**changed)


@pytest.mark.parametrize("option, value", [("tau", 0), ("eta_confirmed", 1.5), ("drift_mode", "fast"),
                                           ("prototypes", 0), ("clip", (1.0, -1.0)), ("max_log_events", -1)])
def test_a_bad_option_raises_at_fit_naming_it_and_changes_nothing(option, value):
    X, y = stream(8, 30)
    model = JudgmentClassifier(**{option: value})  # __init__ only stores
    with pytest.raises((ValueError, TypeError), match=option):
        model.fit(X, y)
    assert not hasattr(model, "memory_") and not hasattr(model, "n_features_in_")
    with pytest.raises((ValueError, TypeError), match=option):
        model.partial_fit(X, y, classes=[0, 1, 2])
    fitted = JudgmentClassifier().fit(X, y)
    memory, proba = fitted.memory_, fitted.predict_proba(X)
    with pytest.raises((ValueError, TypeError), match=option):
        fitted.set_params(**{option: value}).fit(X[:, :2], y)
    assert fitted.memory_ is memory and fitted.n_features_in_ == 5
    np.testing.assert_array_equal(fitted.predict_proba(X), proba)


# -- categories ---------------------------------------------------------------------------------
def test_the_category_column_separates_categories():
    rng = np.random.default_rng(9)
    x = rng.uniform(0, 1, (400, 2))
    category = rng.integers(0, 2, 400)
    y = (x[:, 0] > 0.5) ^ (category == 1)  # category 1 reverses the rule
    X = np.column_stack([category * 7, x])  # ids 0 and 7, in the first column
    assert JudgmentClassifier().fit(X[:, 1:], y).score(X[:, 1:], y) < 0.7
    model = JudgmentClassifier(category=0).fit(X, y)
    assert model.score(X, y) > 0.9
    assert model.categories_.tolist() == [0, 7]
    assert model.memory_.category_names == ("0", "7") and model.memory_.factor_names == ("1", "2")
    assert model.memory_.action_names == ("False", "True")


def test_an_unseen_category_gets_the_class_frequencies():
    X, y = stream(10, 90, categories=2)
    model = JudgmentClassifier(category=4).fit(X, y)
    prior = np.bincount(y, minlength=3) / 90
    np.testing.assert_array_equal(model.class_count_, np.bincount(y, minlength=3))
    unseen = X[:5].copy()
    unseen[:, 4] = [2, 3, 99, 2**40, 5]
    np.testing.assert_allclose(model.predict_proba(unseen), np.tile(prior, (5, 1)))
    assert model.predict(unseen).tolist() == [int(np.argmax(prior))] * 5
    mixed = np.concatenate([X[:3], unseen[:2]])
    np.testing.assert_array_equal(model.predict_proba(mixed)[:3], model.predict_proba(X[:3]))


@pytest.mark.parametrize("category, column, error, words", [
    (4, 1.5, ValueError, ["X[:, 4]", "category column", "1.5", "row 2"]),
    (4, -1.0, ValueError, ["X[:, 4]", "-1.0"]),
    (5, None, ValueError, ["category", "[0, 5)", "5"]),
    (-1, None, ValueError, ["category", "-1"]),
    (1.0, None, TypeError, ["category", "1.0"]),
    (True, None, TypeError, ["category", "True"]),
])
def test_bad_categories_are_refused_by_name(category, column, error, words):
    X, y = stream(11, 20)
    if column is not None:
        X[2, 4] = column
    for call in (lambda m: m.fit(X, y), lambda m: m.partial_fit(X, y, classes=[0, 1, 2])):
        model = JudgmentClassifier(category=category)
        with pytest.raises(error) as caught:
            call(model)
        assert all(word in str(caught.value) for word in words), caught.value
        assert not hasattr(model, "memory_")
    fitted = JudgmentClassifier(category=4).fit(*stream(12, 20))
    if column is not None:
        with pytest.raises(ValueError, match="category column"):
            fitted.predict(X)


def test_the_category_column_cannot_be_the_only_column_or_beyond_int64():
    with pytest.raises(ValueError, match="only column"):
        JudgmentClassifier(category=0).fit([[0], [1]], [0, 1])
    X = np.array([[1, 0], [2, 2**63 + 3]], dtype=np.uint64)
    with pytest.raises(ValueError, match=r"X\[:, 1\].*\[0, 2\*\*63\), got 9223372036854775811 at row 1"):
        JudgmentClassifier(category=1).fit(X, [0, 1])


# -- inputs -------------------------------------------------------------------------------------
def test_lists_int_and_float32_inputs_give_the_same_answers():
    X, y = stream(13, 60)
    X = np.round(X)
    expected = JudgmentClassifier(category=4).fit(X, y).predict_proba(X)
    for data in (X.tolist(), X.astype(np.float32), X.astype(np.int64), np.asfortranarray(X)):
        model = JudgmentClassifier(category=4).fit(data, y.tolist())
        np.testing.assert_array_equal(model.predict_proba(data), expected)


def test_string_labels_name_the_actions():
    X, y = stream(14, 60, categories=1)
    labels = np.array(["approve", "escalate", "reject"])[y]
    model = JudgmentClassifier().fit(X[:, :-1], labels)
    assert model.memory_.action_names == ("approve", "escalate", "reject")
    assert set(model.predict(X[:, :-1])) <= set(labels)


def test_values_the_memory_cannot_hold_are_refused_by_position_and_change_nothing():
    X, y = stream(15, 30)
    model = JudgmentClassifier(category=4).fit(X, y)
    memory, count = model.memory_, model.class_count_.copy()
    big = X.copy()
    big[3, 1] = 2e15
    with pytest.raises(ValueError, match=r"X must lie in \[-1e\+15, 1e\+15\].*2e\+15 at X\[3, 1\]"):
        model.partial_fit(big, y)
    with pytest.raises(ValueError, match=r"X must lie in \[-1e\+15, 1e\+15\].*2e\+15 at X\[3, 1\]"):
        model.fit(big, y)
    assert model.memory_ is memory and int(memory.num_decisions) == 30
    np.testing.assert_array_equal(model.class_count_, count)
    assert model.predict(big).shape == (30,)  # scoring takes anything float32 holds
    big[3, 1] = 1e39
    with pytest.raises(ValueError, match=r"to be scored .* 1e\+39 at X\[3, 1\]"):
        model.predict(big)
    big[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        model.fit(big, y)


def test_a_dataframe_names_the_factors():
    pd = pytest.importorskip("pandas")
    from sklearn.utils.estimator_checks import check_dataframe_column_names_consistency

    X, y = stream(16, 50)
    frame = pd.DataFrame(X, columns=["amount", "age", "risk", "score", "team"])
    model = JudgmentClassifier(category=4).fit(frame, y)
    assert model.feature_names_in_.tolist() == list(frame.columns)
    assert model.memory_.factor_names == ("amount", "age", "risk", "score")
    np.testing.assert_array_equal(model.predict_proba(frame), JudgmentClassifier(category=4).fit(X, y).predict_proba(X))
    check_dataframe_column_names_consistency("JudgmentClassifier", JudgmentClassifier())
