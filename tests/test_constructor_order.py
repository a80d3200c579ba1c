"""No silent swaps: the k-NN and retrieval memories take ``factors`` and ``actions`` by keyword.

``JudgmentMemory(categories, actions, factors)`` is positional; a k-NN or retrieval memory that
took ``(factors, actions)`` positionally would read ``KNNMemory(["approve", "reject"], 8)``, the
judgment memory's order, as two factors named approve and reject and eight actions. The first
``partial_fit`` of the scikit-learn estimator needs ``classes``, and its error says what to pass.
"""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gae import Decider, JudgmentMemory, KNNMemory, RetrievalMemory
from gae.ledger import ledgers
from gae.storage import SQLiteStore
from gae.traces.writer import build_memory, memory_config


def adwin_knn() -> type:
    pytest.importorskip("river.drift")
    from training.knn_adwin import ADWINKNNMemory

    return ADWINKNNMemory


CLASSES: dict[str, Callable[[], type]] = {"KNNMemory": lambda: KNNMemory, "RetrievalMemory": lambda: RetrievalMemory,
                                          "ADWINKNNMemory": adwin_knn}


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("args,shown", [
    ((["approve", "reject"], 8), "2 positional arguments: ['approve', 'reject'], 8"),  # the judgment memory's order
    ((8,), "1 positional argument: 8"),
    ((3, ["approve", "reject"]), "2 positional arguments: 3, ['approve', 'reject']"),  # the order it used to take
])
def test_a_positional_call_is_refused_naming_the_keywords_what_was_given_and_the_judgment_order(name, args, shown):
    cls = CLASSES[name]()
    given = copy.deepcopy(args)
    with pytest.raises(TypeError) as info:
        cls(*args, k=1)
    message = str(info.value)
    assert message.startswith(f"{name} takes factors= and actions= as keywords, e.g. {name}(factors=8, "
                              "actions=['approve', 'reject'], k=5)"), message
    assert shown in message, message
    assert "JudgmentMemory's order is (categories, actions, factors)" in message, message
    assert args == given  # the arguments are untouched


@pytest.mark.parametrize("name", CLASSES)
def test_a_call_with_the_names_in_the_wrong_place_among_keywords_is_refused_too(name):
    with pytest.raises(TypeError, match=f"{name} takes factors= and actions= as keywords.*1 positional argument: 8"):
        CLASSES[name]()(8, actions=["approve", "reject"])


def test_a_refused_positional_call_writes_nothing_to_the_ledger(tmp_path: Path):
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path, synchronous="OFF")
    with pytest.raises(TypeError, match="takes factors= and actions= as keywords"):
        Decider(KNNMemory(["approve", "reject"], 8, k=1), store=store)
    with pytest.raises(TypeError, match="takes factors= and actions= as keywords"):  # refused before the store is read
        KNNMemory(["approve", "reject"], 8, k=1, store=store)
    assert ledgers(store) == []
    # had it gone through, the ledger would hold 2 factors named approve / reject and 8 actions,
    # and this memory, with other names, would be refused
    decider = Decider(KNNMemory(factors=8, actions=["approve", "reject"], k=1),
                      store=SQLiteStore(path, synchronous="OFF"))
    memory = decider.memory
    assert decider.version == 0 and memory.n_factors == 8 and memory.action_names == ("approve", "reject")
    decider.learn_one([0.5] * 8, "reject")
    reopened = Decider(KNNMemory(factors=8, actions=["approve", "reject"], k=1),
                       store=SQLiteStore(path, synchronous="OFF"))
    assert reopened.version == 1 and reopened.memory.score_one([0.5] * 8) == ("reject", 1.0)


@pytest.mark.parametrize("name", CLASSES)
def test_the_signature_shows_factors_and_actions_keyword_only(name):
    parameters = inspect.signature(CLASSES[name]()).parameters
    assert list(parameters)[:2] == ["factors", "actions"]
    assert parameters["factors"].kind is parameters["actions"].kind is inspect.Parameter.KEYWORD_ONLY
    *named, last = parameters.values()
    if last.kind is inspect.Parameter.VAR_KEYWORD:  # only to answer a serving argument with the Decider's call
        assert last.name == "serving", parameters
        cls = CLASSES[name]()
        with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['bogus'\]"):
            cls(factors=2, actions=2, bogus=1)
        with pytest.raises(TypeError, match=r"serving a memory moved to gae\.Decider"):
            cls(factors=2, actions=2, store=None)
    else:
        named.append(last)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in named), parameters
    assert parameters["factors"].default is parameters["actions"].default is inspect.Parameter.empty


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("factors,actions,categories,factor_names,action_names,category_names", [
    (8, ["approve", "reject"], None, tuple(str(i) for i in range(8)), ("approve", "reject"), None),
    (["amount", "age"], 3, 2, ("amount", "age"), ("0", "1", "2"), ("0", "1")),
    (("amount", "age"), ("approve", "reject"), ["invoice", "refund"], ("amount", "age"), ("approve", "reject"),
     ("invoice", "refund")),
])
def test_the_keyword_form_takes_counts_and_names(name, factors, actions, categories, factor_names, action_names,
                                                 category_names):
    memory = CLASSES[name]()(factors=factors, actions=actions, categories=categories, k=1)
    assert memory.factor_names == factor_names and memory.n_factors == len(factor_names)
    assert memory.action_names == action_names and memory.category_names == category_names
    category = 0 if categories is not None else "general"
    x = [0.25] * len(factor_names)
    memory.learn_one(x, action_names[-1], category)
    assert memory.score_one(x, category) == (action_names[-1], 1.0)


def test_the_same_keywords_name_a_judgment_memory_and_a_knn_alike():
    names: dict[str, Any] = {"categories": ["invoice", "refund"], "actions": ["approve", "reject"],
                             "factors": ["amount", "age"]}
    judgment, knn, retrieval = JudgmentMemory(**names), KNNMemory(**names, k=1), RetrievalMemory(**names, k=1)
    for memory in (knn, retrieval):
        assert (memory.category_names, memory.action_names, memory.factor_names) == (
            judgment.category_names, judgment.action_names, judgment.factor_names)


@pytest.mark.parametrize("name", ["KNNMemory", "RetrievalMemory"])
@pytest.mark.parametrize("argument,value", [("factors", torch.tensor(8)), ("actions", torch.tensor(2)),
                                            ("factors", np.array(["amount", "age"]))])
def test_tensors_and_arrays_are_no_names_and_are_refused_naming_the_argument(name, argument, value):
    options: dict[str, Any] = {"factors": 2, "actions": 2, argument: value}
    with pytest.raises(TypeError, match=f"{argument} must be an int or a list of names"):
        CLASSES[name]()(**options)


@pytest.mark.parametrize("name", CLASSES)
def test_a_keyword_built_memory_copies_pickles_and_rebuilds(name):
    cls = CLASSES[name]()
    memory = cls(factors=["amount", "age"], actions=["approve", "reject"], categories=["a", "b"], k=1, capacity=10)
    memory.learn_one([0.9, 0.1], "approve", "a")
    memory.learn_one([0.1, 0.9], "reject", "b")
    copies = [copy.deepcopy(memory), pickle.loads(pickle.dumps(memory))]
    if name != "ADWINKNNMemory":  # a trace header rebuilds gae's own memories
        rebuilt = build_memory(memory_config(memory))
        rebuilt.load_state_dict(memory.state_dict())
        copies.append(rebuilt)
    for other in copies:
        assert type(other) is cls and other.factor_names == memory.factor_names
        for x in ([0.8, 0.2], [0.2, 0.8]):
            assert other.score_one(x, "a") == memory.score_one(x, "a")


# -- the first partial_fit ------------------------------------------------------------------------
def test_the_first_partial_fit_without_classes_says_what_to_pass_and_changes_nothing():
    pytest.importorskip("sklearn")
    from gae.sklearn import JudgmentClassifier

    X, y = [[0.1, 0.2], [0.9, 0.8], [0.2, 0.1]], ["no", "yes", "no"]
    model = JudgmentClassifier()
    with pytest.raises(ValueError) as info:
        model.partial_fit(X, y)
    message = str(info.value)
    for words in ("first call to partial_fit", "classes=", "every label the memory will learn",
                  "classes=np.unique(y_all)", "or call fit first", "got classes=None"):
        assert words in message, message
    assert not hasattr(model, "memory_") and not hasattr(model, "classes_")
    model.partial_fit(X, y, classes=np.unique(["no", "yes", "maybe"]))
    assert model.classes_.tolist() == ["maybe", "no", "yes"]
    assert model.predict([[0.85, 0.9]]).tolist() == ["yes"]
    model.partial_fit([[0.5, 0.5]], ["maybe"])  # later calls need no classes
    assert "classes" in JudgmentClassifier.partial_fit.__doc__ and "np.unique(y_all)" in JudgmentClassifier.__doc__
