"""gae.river: the memories as river classifiers, checked by river's own battery and against the memories."""

from __future__ import annotations

import copy
import inspect
import math
import pickle

import numpy as np
import pytest
import torch

river = pytest.importorskip("river")

from river import checks, datasets, evaluate, metrics, preprocessing  # noqa: E402

from gae import JudgmentConfig, JudgmentMemory, KNNMemory  # noqa: E402
from gae.river import JudgmentClassifier, KNNClassifier  # noqa: E402

CLASSIFIERS = [JudgmentClassifier, KNNClassifier]
# every JudgmentConfig option at a valid value other than the recommended one
OPTIONS = {"tau": 0.2, "eta_confirmed": 0.1, "eta_override": 0.02, "drift_threshold": 0.5, "gate_damping": 0.25,
           "clip": (-5.0, 5.0), "push_rate": 0.01, "min_confidence": 0.1, "drift_mode": "seed", "shadow_eta": 0.4,
           "promotion_threshold": 3.5, "tracking_eta": 0.3, "evidence_clip": 2.0, "evidence_allowance": 0.5,
           "lead_rate": 0.2, "prototypes": 2, "spawn_threshold": 0.7, "spawn_support": 2.0, "win_decay": 0.1,
           "learning": "lvq", "units": "criterion", "rate_floor": 0.05, "relevance_rate": 0.02, "miss_penalty": 0.2,
           "rate_per_error": 0.5, "error_decay": 0.05,
           "max_log_events": 100, "judges": {"gauss": {"kind": "gauss", "rate_floor": 0.01, "prior": 2.0}},
           "trust_rate": 0.7, "trust_share": 0.05, "trust_floor": 0.1}


def stream(seed: int = 0, n: int = 240) -> list[tuple[dict, int]]:
    """Decisions clustered per (desk, label); label 2 appears at step 60, desk 'c' at step 120."""
    rng = np.random.default_rng(seed)
    centres = rng.random((3, 3, 4))
    rows = []
    for step in range(n):
        desk = int(rng.integers(0, 3 if step >= 120 else 2))
        label = int(rng.integers(0, 3 if step >= 60 else 2))
        values = np.clip(centres[desk, label] + 0.1 * rng.standard_normal(4), 0, 1)
        rows.append(({"desk": "abc"[desk], **{f"f{i}": float(v) for i, v in enumerate(values)}}, label))
    return rows


def frozen(model) -> bytes:
    return pickle.dumps(model)


# -- river's conventions ----------------------------------------------------------------
@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_river_estimator_checks(cls):
    for params in cls._unit_test_params():
        checks.check_estimator(cls(**params))  # nothing skipped: _unit_test_skips is empty
    assert not cls()._unit_test_skips()


@pytest.mark.parametrize(("cls", "floor"), [(JudgmentClassifier, 0.84), (KNNClassifier, 0.84)])
def test_phishing_progressive_accuracy(cls, floor):
    # measured: 87.1% (judgment) and 86.7% (k-NN); the majority label (False) is 56.2%
    metric = evaluate.progressive_val_score(datasets.Phishing(), preprocessing.StandardScaler() | cls(),
                                            metrics.Accuracy())
    assert metric.get() > floor


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_predict_one_is_the_most_probable_label(cls):
    model = preprocessing.StandardScaler() | cls()
    for x, y in datasets.Phishing().take(300):
        proba = model.predict_proba_one(x)
        if proba:
            assert math.isclose(sum(proba.values()), 1.0)
            assert proba[model.predict_one(x)] == max(proba.values())
        model.learn_one(x, y)


def test_min_confidence_abstention_still_predicts_the_most_probable_label():
    model = JudgmentClassifier(min_confidence=0.99, tau=10.0)
    model.learn_one({"a": 0.0}, "low")
    model.learn_one({"a": 1.0}, "high")
    assert model.memory.score_one([0.2], 0)[0] is None  # the memory abstains
    proba = model.predict_proba_one({"a": 0.2})
    assert proba["low"] > proba["high"] > 0 and model.predict_one({"a": 0.2}) == "low"


# -- the rows ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_nothing_learned_predicts_nothing(cls):
    model = cls()
    assert model.memory is None and model.predict_one({"a": 1.0}) is None and model.predict_proba_one({"a": 1}) == {}


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_factors_are_the_first_samples_features_in_sorted_order(cls):
    model, shuffled = cls(), cls()
    model.learn_one({"c": 0.3, "a": 0.1, "b": 0.2}, "x")
    shuffled.learn_one({"b": 0.2, "c": 0.3, "a": 0.1}, "x")
    assert model.memory.factor_names == shuffled.memory.factor_names == ("a", "b", "c")
    mixed = cls()
    mixed.learn_one({1: 0.5, "1": 0.25, "b": True, 0: np.float32(2)}, "x")  # names of two types, alike as str
    assert mixed.memory.factor_names == ("0", "1", "1 (2)", "b")


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_missing_features_are_zero_and_unseen_ones_ignored(cls):
    model = cls(k=1) if cls is KNNClassifier else cls()
    model.learn_one({"a": 0.0, "b": 0.0}, "zero")
    model.learn_one({"a": 1.0, "b": 1.0, "new": 5.0}, "one")  # 'new' came after the first sample
    assert model.memory.factor_names == ("a", "b")
    for x in ({"a": 0.9}, {"b": 0.9, "new": -9.0}, {"a": 0.1, "new": "not read"}):
        full = {"a": 0.0, "b": 0.0} | {k: v for k, v in x.items() if k in ("a", "b")}
        assert model.predict_one(x) == model.predict_one(full)
        assert model.predict_proba_one(x) == model.predict_proba_one(full)


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_missing_features_with_missing_error(cls):
    model = cls(missing="error")
    with pytest.raises(ValueError, match="at least one feature"):
        model.learn_one({}, "x")
    model.learn_one({"a": 0.5, "b": 0.5}, "x")
    before = frozen(model)
    for call in (lambda: model.learn_one({"a": 0.5}, "y"), lambda: model.predict_one({"a": 0.5}),
                 lambda: model.predict_proba_one({"a": 0.5, "c": 1.0})):
        with pytest.raises(KeyError, match="x has no feature 'b'"):
            call()
    assert frozen(model) == before
    model.learn_one({"a": 0.5, "b": 0.5, "c": 1.0}, "y")  # extra features are still ignored
    assert model.predict_one({"a": 0.5, "b": 0.5}) in ("x", "y")


BAD_SAMPLES = [  # (x, y, error, words)
    ({"a": "0.5", "b": 1.0}, "x", TypeError, "feature 'a' must be a number.*'0.5'"),
    ({"a": None, "b": 1.0}, "x", TypeError, "feature 'a' must be a number.*None"),
    ({"a": 1j, "b": 1.0}, "x", TypeError, "feature 'a' must be a number"),
    ({"a": [1.0], "b": 1.0}, "x", TypeError, "feature 'a' must be a number"),
    ({"a": 0.5, "b": float("nan")}, "x", ValueError, "feature 'b' must be a finite number.*nan"),
    ({"a": 0.5, "b": float("inf")}, "x", ValueError, "feature 'b' must be a finite number.*inf"),
    ({"a": 1e300, "b": 1.0}, "x", ValueError, "feature 'a' must be a finite number.*1e\\+300"),
    ([("a", 1.0)], "x", TypeError, "x must be a dict of features, got list"),
    ({"a": 0.5, "b": 1.0}, ["x"], TypeError, "y must be a hashable label, got \\['x'\\]"),
]


@pytest.mark.parametrize("cls", CLASSIFIERS)
@pytest.mark.parametrize(("x", "y", "error", "words"), BAD_SAMPLES)
def test_bad_samples_are_refused_by_name_and_change_nothing(cls, x, y, error, words):
    fresh = cls()
    with pytest.raises(error, match=words):
        fresh.learn_one(x, y)  # as the first sample: nothing is built
    assert frozen(fresh) == frozen(cls()) and fresh.memory is None
    model = cls()
    model.learn_one({"a": 0.5, "b": 0.5}, "x")
    before = frozen(model)
    with pytest.raises(error, match=words):
        model.learn_one(x, y)
    if y == "x":
        for predict in (model.predict_one, model.predict_proba_one):
            with pytest.raises(error, match=words):
                predict(x)
    assert frozen(model) == before


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_values_too_large_to_learn_are_still_scored(cls):
    model = cls()
    model.learn_one({"a": 0.5}, "x")
    before = frozen(model)
    with pytest.raises(ValueError, match=r"feature 'a' must be a finite number in \[-1e\+15, 1e\+15\], got 1e\+20"):
        model.learn_one({"a": 1e20}, "x")
    assert frozen(model) == before and model.predict_one({"a": 1e20}) == "x"


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_numpy_and_bool_values_are_numbers(cls):
    model, plain = cls(), cls()
    model.learn_one({"a": np.float32(0.5), "b": np.int64(2), "c": np.bool_(True)}, "x")
    plain.learn_one({"a": 0.5, "b": 2, "c": True}, "x")
    model.learn_one({"a": 1, "b": False, "c": 0.25}, "y")
    plain.learn_one({"a": 1.0, "b": 0.0, "c": 0.25}, "y")
    assert model.predict_proba_one({"a": 0.9, "b": 1}) == plain.predict_proba_one({"a": 0.9, "b": 1.0})


# -- labels ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_labels_of_any_hashable_type_come_back_as_themselves(cls):
    labels = [False, 2, "2", (1, "a"), "", 2.5]  # '2' and 2 are two labels (None and NaN are none)
    model = cls(k=1) if cls is KNNClassifier else cls()
    for step, label in enumerate(labels):  # each label new mid-stream
        model.learn_one({"a": float(step), "b": -float(step)}, label)
    assert model.memory.action_names == ("False", "2", "2 (2)", "(1, 'a')", "''", "2.5")
    for step, label in enumerate(labels):
        predicted = model.predict_one({"a": float(step), "b": -float(step)})
        assert predicted == label and type(predicted) is type(label)
        proba = model.predict_proba_one({"a": float(step), "b": -float(step)})
        assert list(proba) == labels and math.isclose(sum(proba.values()), 1.0)


@pytest.mark.parametrize("cls", CLASSIFIERS)
def test_abstaining_memory_answers_with_the_label_frequencies(cls):
    model = cls(category="desk", scoped=True) if cls is KNNClassifier else cls(category="desk")
    for label in ("no", "yes", "yes", "maybe"):
        model.learn_one({"desk": "a", "v": 0.5}, label)
    assert model.predict_proba_one({"desk": "unseen", "v": 0.5}) == {"no": 0.25, "yes": 0.5, "maybe": 0.25}
    assert model.predict_one({"desk": "unseen", "v": 0.5}) == "yes"


# -- categories --------------------------------------------------------------------------
def test_the_category_field_scopes_the_judgment_memory():
    model = JudgmentClassifier(category="desk")
    model.learn_one({"desk": "a", "v": 0.0}, "left")
    model.learn_one({"desk": "a", "v": 1.0}, "right")
    model.learn_one({"desk": 3, "v": 0.0}, "right")  # int and bool categories are their str
    model.learn_one({"desk": True, "v": 1.0}, "left")
    assert model.memory.category_names == ("a", "3", "True") and model.memory.factor_names == ("v",)
    assert model.predict_one({"desk": "a", "v": 0.1}) == "left"
    assert model.predict_one({"desk": "3", "v": 0.9}) == "right"  # desk 3 only knows 'right'
    assert model.predict_proba_one({"desk": 3, "v": 0.9}) == {"left": 0.0, "right": 1.0}
    assert model.predict_one({"desk": np.bool_(True), "v": 0.0}) == "left"


def test_a_scoped_knn_votes_within_the_category():
    flat, scoped = KNNClassifier(category="desk", k=1), KNNClassifier(category="desk", k=1, scoped=True)
    for model in (flat, scoped):
        model.learn_one({"desk": "a", "v": 0.0}, "left")
        model.learn_one({"desk": "b", "v": 1.0}, "right")
        assert model.memory.category_names == ("a", "b")
    assert flat.predict_one({"desk": "b", "v": 0.1}) == "left"
    assert scoped.predict_one({"desk": "b", "v": 0.1}) == "right"
    assert flat.predict_one({"desk": "new", "v": 0.1}) == "left"  # unscoped: any category votes
    assert scoped.predict_proba_one({"desk": "new", "v": 0.1}) == {"left": 0.5, "right": 0.5}  # abstains


@pytest.mark.parametrize("cls", CLASSIFIERS)
@pytest.mark.parametrize(("desk", "error", "words"), [
    (None, KeyError, "x has no category field 'desk'"), (0.5, TypeError, "category field 'desk' must be a str"),
    ("", ValueError, "category field 'desk' must not be an empty str")])
def test_bad_categories_are_refused_and_change_nothing(cls, desk, error, words):
    model = cls(category="desk")
    x = {"v": 1.0} if desk is None else {"desk": desk, "v": 1.0}
    with pytest.raises(error, match=words):
        model.learn_one(x, "x")
    assert model.memory is None
    model.learn_one({"desk": "a", "v": 0.5}, "x")
    before = frozen(model)
    for call in (lambda: model.learn_one(x, "y"), lambda: model.predict_one(x), lambda: model.predict_proba_one(x)):
        with pytest.raises(error, match=words):
            call()
    assert frozen(model) == before


# -- options, clone and pickle -----------------------------------------------------------
def test_the_signature_is_the_config_with_the_recommended_defaults_and_a_bounded_log():
    parameters = inspect.signature(JudgmentClassifier).parameters
    assert list(parameters) == ["category", "missing", *JudgmentConfig.options()]
    defaults = JudgmentConfig.recommended().replace(max_log_events=10_000)
    assert all(parameters[name].default == defaults.parameter(name) for name in JudgmentConfig.options())
    model = JudgmentClassifier()
    model.learn_one({"a": 1.0}, "x")
    assert model.memory.config == defaults and model.memory.config.learning == "lvq"


@pytest.mark.parametrize("bound", ["default", None, 0, 40])
def test_the_log_bound_is_an_option(bound):
    model = JudgmentClassifier(category="desk", **({} if bound == "default" else {"max_log_events": bound}))
    bound = 10_000 if bound == "default" else bound
    assert model._get_params()["max_log_events"] == model.clone()._get_params()["max_log_events"] == bound
    for x, y in stream(n=200):
        model.learn_one(x, y)
    memory, log = model.memory, model.memory.decision_log
    assert memory.config.max_log_events == bound and int(memory.num_decisions) == 200
    if bound in (None, 10_000):
        assert len(log) == 200
    elif bound == 0:
        assert len(log) == 0
    else:  # folded as it passed the bound: its base and the log account for every decision
        assert 0 < len(log) <= 40 and int(log.base["num_decisions"]) + len(log) == 200


def test_every_option_reaches_the_memory():
    assert set(OPTIONS) == set(JudgmentConfig.options())  # a new option needs a value here
    model = JudgmentClassifier(**OPTIONS)
    assert model._get_params() == {"category": None, "missing": "zero", **OPTIONS}
    model.learn_one({"a": 1.0}, "x")
    assert model.memory.config == JudgmentConfig(**OPTIONS)
    tau = JudgmentClassifier(tau=0.2)
    tau.learn_one({"a": 1.0}, "x")
    assert tau.memory.config.tau == 0.2
    assert tau.memory.config.replace(tau=0.1) == JudgmentConfig.recommended().replace(max_log_events=10_000)
    knn = KNNClassifier(category="desk", k=2, capacity=7, scoped=True, respect_skip=True)
    knn.learn_one({"desk": "a", "v": 1.0}, "x")
    memory = knn.memory
    assert (memory.k, memory.capacity, memory.scoped, memory.respect_skip) == (2, 7, True, True)
    assert memory.category_names == ("a",) and memory.grow


@pytest.mark.parametrize(("make", "error", "words"), [
    (lambda: JudgmentClassifier(taus=0.2), TypeError, r"unknown option\(s\) \['taus'\]"),
    (lambda: JudgmentClassifier(k=5), TypeError, r"unknown option\(s\) \['k'\]"),
    (lambda: JudgmentClassifier(tau=0), ValueError, "tau must be in"),
    (lambda: JudgmentClassifier(drift_mode="fast"), ValueError, "drift_mode must be"),
    (lambda: JudgmentClassifier(missing="drop"), ValueError, "missing must be 'zero' or 'error', got 'drop'"),
    (lambda: JudgmentClassifier(category=["desk"]), TypeError, "category must be None or the name"),
    (lambda: KNNClassifier(tau=0.2), TypeError, "unexpected keyword argument 'tau'"),
    (lambda: KNNClassifier(k=0), ValueError, "k must be >= 1, got 0"),
    (lambda: KNNClassifier(k=3, capacity=2), ValueError, "k must be <= capacity"),
    (lambda: KNNClassifier(k=2.0), TypeError, "k must be an int"),
    (lambda: KNNClassifier(scoped=True), ValueError, "scoped=True needs category"),
    (lambda: KNNClassifier(category="d", scoped=1), TypeError, "scoped must be a bool"),
])
def test_bad_options_are_refused_at_construction(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize("make", [lambda: JudgmentClassifier("desk", "error", tau=0.2, clip=(-1.0, 2.0)),
                                  lambda: KNNClassifier("desk", "error", k=3, capacity=50, scoped=True)])
@pytest.mark.parametrize("copier", [lambda model: pickle.loads(pickle.dumps(model)), copy.deepcopy])
def test_clone_keeps_the_params_and_a_copy_keeps_the_predictions(make, copier):
    model, rows = make(), stream()
    for x, y in rows[:150]:
        model.learn_one(x, y)
    clone = model.clone()
    assert clone._get_params() == model._get_params() and repr(clone) == repr(model) and clone.memory is None
    restored = copier(model)
    for x, y in rows[150:]:
        assert restored.predict_one(x) == model.predict_one(x)
        assert restored.predict_proba_one(x) == model.predict_proba_one(x)
        restored.learn_one(x, y)
        model.learn_one(x, y)


# -- the reference: the memory driven by hand --------------------------------------------
def reference_predictions(memory_factory, rows, scoped_category: bool):
    """What the adapter must say before each decision, from a memory driven directly: features in
    sorted order, str labels, the label frequencies where the memory abstains."""
    features = sorted(key for key in rows[0][0] if key != "desk")
    memory, counts, out = None, {}, []
    for x, y in rows:
        row = np.array([x.get(name, 0.0) for name in features])
        if memory is None:
            out.append((None, {}))
        else:
            known = x["desk"] in memory.category_names
            probs = None
            if known or not scoped_category:
                index = memory.category_names.index(x["desk"]) if known else 0
                with torch.no_grad():
                    probs = memory(torch.from_numpy(row)[None], torch.tensor([index])).probs[0].double()
            if probs is not None and float(probs.sum()) > 0:
                proba = {int(name): float(p) for name, p in zip(memory.action_names, probs / probs.sum(), strict=True)}
                name = memory.score_one(row, index)[0]
                predicted = int(name) if name is not None else max(proba, key=proba.__getitem__)
            else:
                proba = {label: count / sum(counts.values()) for label, count in counts.items()}
                predicted = max(proba, key=proba.__getitem__)
            out.append((predicted, proba))
        if memory is None:
            memory = memory_factory(features, str(y), x["desk"])
        memory.learn_one(row, str(y), x["desk"], confirmed=None)
        counts[y] = counts.get(y, 0) + 1
    return out


@pytest.mark.parametrize(("make", "memory_factory", "scoped_category"), [
    (lambda: JudgmentClassifier(category="desk"),
     lambda f, a, c: JudgmentMemory([c], [a], f, JudgmentConfig.recommended(), grow=True), True),
    (lambda: JudgmentClassifier(category="desk", prototypes=2, tau=0.05),
     lambda f, a, c: JudgmentMemory([c], [a], f, JudgmentConfig.recommended(), tau=0.05, prototypes=2, grow=True),
     True),
    (lambda: JudgmentClassifier(category="desk", learning="gated", drift_mode="seed", tau=0.05),
     lambda f, a, c: JudgmentMemory([c], [a], f, JudgmentConfig.recommended(), learning="gated", tau=0.05,
                                    grow=True), True),
    (lambda: KNNClassifier(category="desk", k=3, capacity=40, scoped=True),
     lambda f, a, c: KNNMemory(factors=f, actions=[a], k=3, capacity=40, categories=[c], scoped=True, grow=True), True),
    (lambda: KNNClassifier(category="desk", k=3, capacity=40),
     lambda f, a, c: KNNMemory(factors=f, actions=[a], k=3, capacity=40, categories=[c], grow=True), False),
])
def test_the_classifier_says_what_the_memory_says(make, memory_factory, scoped_category):
    rows = stream(seed=1)
    model = make()
    expected = reference_predictions(memory_factory, rows, scoped_category)
    for (x, y), (predicted, proba) in zip(rows, expected, strict=True):
        assert model.predict_one(x) == predicted
        got = model.predict_proba_one(x)
        assert list(got) == list(proba)
        assert all(math.isclose(got[label], p, rel_tol=1e-12, abs_tol=1e-12) for label, p in proba.items())
        model.learn_one(x, y)
