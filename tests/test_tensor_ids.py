"""Ids, scopes and indices given as torch tensors or numpy arrays (issue 18).

Every argument that takes a list of ids, scopes or indices gives the same result for a list, an
integer tensor and a numpy array; a tensor or array of the wrong dtype or rank, or with values
out of range, is refused with the argument and the values in the message, and changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import AdmissionPolicy, EpisodicMemory, RetrievalMemory
from gae.episodic.columns import scope_column
from gae.storage import SQLiteStore
from gae.storage.base import scope_filters, scope_keys
from gae.validation import plain_ids
from tests.test_bad_input import dump

DIM = 4
GEN = torch.Generator().manual_seed(18)
EMB, IMP = torch.randn(3, DIM, generator=GEN), torch.tensor([0.2, 0.6, 0.9])
QUERIES = torch.randn(3, DIM, generator=GEN)
TRACE = {"embedding": torch.ones(DIM), "importance": 0.5, "outcome": "success", "quality": 0.9}

# how a list of ints is given: as is, or as a tensor or array of it (same values)
FORMS = {
    "LongTensor": lambda v: torch.tensor(v, dtype=torch.int64),
    "IntTensor": lambda v: torch.tensor(v, dtype=torch.int32),
    "numpy int64": lambda v: np.array(v, dtype=np.int64),
    "numpy uint32": lambda v: np.array(v, dtype=np.uint32),
}
if torch.cuda.is_available():
    FORMS["cuda LongTensor"] = lambda v: torch.tensor(v, dtype=torch.int64, device="cuda")


def filled(store: SQLiteStore | None = None) -> EpisodicMemory:
    """Six memories of scopes 0, 1, 2 and 'alpha', one of them with provenance."""
    memory = EpisodicMemory(DIM, capacity=8, store=store)
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(6, DIM, generator=gen), torch.rand(6, generator=gen), scope=[0, 1, 2, "alpha", 1, 0],
               source_ids=[[7], [], [8, 9], [], [], [1]], now=1.0)
    return memory


def snapshot(memory: EpisodicMemory) -> dict:
    """Every row, column and counter of a memory, comparable with ``==``."""
    return {"version": memory.version, "len": len(memory), "next_id": int(memory.next_id),
            **{name: memory._column(name).tolist() for name in ("ids", "scope", "created_at", "importance")},
            "embeddings": memory._column("embeddings").tolist(), "scope_names": list(memory.scope_names),
            "source_ids": list(memory.source_ids), "audit": list(memory.audit_log)}


def image(value):
    """A comparable image of a result: tensors and arrays become lists."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, tuple):
        return tuple(image(v) for v in value)
    return value


def admit(scope, source_ids, allowed):
    return lambda m: m.admit_and_add([{**TRACE, "scope": scope, "source_ids": source_ids}, {**TRACE, "scope": 9}],
                                     AdmissionPolicy(allowed_scopes=allowed), now=2.0)


# id, call(memory, form): ``form`` turns each list (or int) of ids into the form under test
EPISODIC_CALLS = [
    ("add scope, one per memory", lambda m, f: m.add(EMB, IMP, scope=f([2, 0, 5]), now=2.0)),
    ("add scope, one for all (0-D)", lambda m, f: m.add(EMB, IMP, scope=f(5), now=2.0)),
    ("add source_ids, 2-D", lambda m, f: m.add(EMB, IMP, source_ids=f([[1, 2], [3, 4], [5, 6]]), now=2.0)),
    ("add source_ids, one row each", lambda m, f: m.add(EMB, IMP, source_ids=[f([1, 2]), f([]), f([3])], now=2.0)),
    ("add source_ids, 0-D entries", lambda m, f: m.add(EMB, IMP, source_ids=[[f(1), f(2)], [], [3]], now=2.0)),
    ("retrieve scopes, shared", lambda m, f: m.retrieve(QUERIES, now=2.0, k=3, scopes=f([0, 2]))),
    ("retrieve scopes, shared, with a name", lambda m, f: m.retrieve(QUERIES, now=2.0, k=3,
                                                                     scopes=[f(1), "alpha"])),
    ("retrieve scopes, one row per query", lambda m, f: m.retrieve(QUERIES, now=2.0, k=3, scopes=f([[0], [1], [2]]))),
    ("retrieve scopes, one list per query", lambda m, f: m.retrieve(QUERIES, now=2.0, k=3,
                                                                    scopes=[f([0, 1]), f([2]), f([])])),
    ("delete ids", lambda m, f: m.delete(f([1, 4, 1]), now=2.0)),
    ("delete one id (0-D)", lambda m, f: m.delete(f(3), now=2.0)),
    ("admit scope, source_ids and allowed_scopes", lambda m, f: admit(f(1), f([4, 5]), f([0, 1]))(m)),
]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("case,call", EPISODIC_CALLS, ids=[c[0] for c in EPISODIC_CALLS])
def test_tensor_and_array_ids_give_the_list_result(case, call, form):
    memory, reference = filled(), filled()
    given_result = call(memory, FORMS[form])
    plain_result = call(reference, lambda v: v)
    assert image(given_result) == image(plain_result)
    assert snapshot(memory) == snapshot(reference)


@pytest.mark.parametrize("form", list(FORMS))
def test_store_retrieve_takes_tensor_and_array_scopes(tmp_path, form):
    """The stores' own retrieval (one parser with EpisodicMemory's) ranks the same for every form."""
    convert = FORMS[form]
    with SQLiteStore(tmp_path / "memory.db") as store:
        filled(store)
        queries = QUERIES.numpy()
        for scopes in ([0, 2], [[0], [1], [2]]):
            given_result = store.retrieve(queries, 2.0, k=3, scopes=convert(scopes))
            plain_result = store.retrieve(queries, 2.0, k=3, scopes=scopes)
            assert all(np.array_equal(a, b) for a, b in zip(given_result, plain_result, strict=True)), scopes
        assert scope_keys(convert([3, 0]), "scopes") == scope_keys([3, 0], "scopes") == ["#3", "#0"]


@pytest.mark.parametrize("form", list(FORMS))
def test_retrieval_memory_delete_takes_tensor_and_array_ids(form):
    def run(convert):
        memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=10)
        gen = torch.Generator().manual_seed(1)
        memory.learn_(torch.rand(5, 2, generator=gen), torch.zeros(5, dtype=torch.long), torch.tensor([0, 1, 0, 1, 1]))
        removed = memory.delete(convert([0, 3]))
        return removed, dict(memory.labels), snapshot(memory.store)

    assert run(FORMS[form]) == run(lambda v: v)


def test_policy_takes_tensor_and_array_scopes():
    for allowed in (torch.tensor([0, 3]), np.array([0, 3]), [torch.tensor(0), np.int64(3)]):
        policy = AdmissionPolicy(allowed_scopes=allowed)
        assert policy.allowed_scopes == (0, 3) and repr(policy).endswith("allowed_scopes=(0, 3))")
        assert policy.admit({"outcome": "success", "quality": 1.0, "scope": torch.tensor(3)}).accepted
        assert policy.admit({"outcome": "success", "quality": 1.0, "scope": np.int64(2)}).reason == \
            "scope 2 not in (0, 3)"
    assert AdmissionPolicy(allowed_scopes=np.array(["alpha", "team"])).allowed_scopes == ("alpha", "team")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=6))
def test_scope_column_is_the_same_for_every_form(values):
    plain, names = scope_column(values, len(values), [], torch.device("cpu"))
    for convert in (FORMS["LongTensor"], FORMS["numpy int64"]):
        column, new_names = scope_column(convert(values), len(values), [], torch.device("cpu"))
        assert torch.equal(column, plain) and new_names == names == []
    assert scope_filters(np.array(values), 2) == scope_filters(values, 2) == [[f"#{v}" for v in values]] * 2


def test_plain_ids_makes_python_values():
    assert plain_ids("ids", torch.tensor(7), (0,)) == 7 and type(plain_ids("ids", np.int16(7), (0,))) is int
    assert plain_ids("ids", torch.tensor([[1, 2]], dtype=torch.uint8), None) == [[1, 2]]
    assert plain_ids("scopes", np.array(["a", "b"]), (1,), names=True) == ["a", "b"]
    assert plain_ids("ids", [1.5, "a"], (1,)) == [1.5, "a"]  # lists are the caller's to check
    with pytest.raises(TypeError, match=r"ids must hold integers, got numpy <U1 \['a'\]"):
        plain_ids("ids", np.array(["a"]), (1,))
    with pytest.raises(TypeError, match=r"ids must hold integers, got numpy object"):
        plain_ids("ids", np.array([1, None]), (1,))


# id, call(memory), error, words that must be in the message
EPISODIC_REFUSED = [
    ("add scope float tensor", lambda m: m.add(EMB, IMP, scope=torch.tensor([0.0, 1.0, 2.0])), TypeError,
     ["scope", "torch.float32", "[0.0, 1.0, 2.0]"]),
    ("add scope bool tensor", lambda m: m.add(EMB, IMP, scope=torch.tensor([True, False, True])), TypeError,
     ["scope", "torch.bool", "[True, False, True]"]),
    ("add scope complex tensor", lambda m: m.add(EMB, IMP, scope=torch.zeros(3, dtype=torch.complex64)), TypeError,
     ["scope", "complex64"]),
    ("add scope float numpy", lambda m: m.add(EMB, IMP, scope=np.array([0.0, 1.0, 2.0])), TypeError,
     ["scope", "float64", "[0.0, 1.0, 2.0]"]),
    ("add scope 2-D", lambda m: m.add(EMB, IMP, scope=torch.tensor([[0, 1, 2]])), ValueError,
     ["scope", "0-D or 1-D", "(1, 3)", "[0, 1, 2]"]),
    ("add scope negative", lambda m: m.add(EMB, IMP, scope=torch.tensor([0, -1, 2])), ValueError, ["scope", "-1"]),
    ("add scope one negative (0-D)", lambda m: m.add(EMB, IMP, scope=np.int64(-4)), ValueError, ["scope", "-4"]),
    ("add scope beyond int64", lambda m: m.add(EMB, IMP, scope=np.array([0, 2**63, 1], dtype=np.uint64)),
     ValueError, ["scope", str(2**63)]),
    ("add scope too short", lambda m: m.add(EMB, IMP, scope=torch.tensor([0, 1])), ValueError, ["scope", "(3)", "2"]),
    ("add scope on meta", lambda m: m.add(EMB, IMP, scope=torch.zeros(3, dtype=torch.long, device="meta")),
     TypeError, ["scope", "meta"]),
    ("add source_ids float", lambda m: m.add(EMB, IMP, source_ids=torch.ones(3, 2)), TypeError,
     ["source_ids", "torch.float32", "1.0"]),
    ("add source_ids 1-D", lambda m: m.add(EMB, IMP, source_ids=torch.tensor([1, 2, 3])), ValueError,
     ["source_ids", "2-D", "(3,)"]),
    ("add source_ids 3-D", lambda m: m.add(EMB, IMP, source_ids=np.zeros((3, 1, 1), dtype=np.int64)), ValueError,
     ["source_ids", "2-D", "(3, 1, 1)"]),
    ("add source_ids bool row", lambda m: m.add(EMB, IMP, source_ids=[torch.tensor([True]), [], []]), TypeError,
     ["source_ids[0]", "torch.bool", "[True]"]),
    ("add source_ids 2-D row", lambda m: m.add(EMB, IMP, source_ids=[[], np.array([[1, 2]]), []]), ValueError,
     ["source_ids[1]", "1-D", "(1, 2)"]),
    ("add source_ids float entry", lambda m: m.add(EMB, IMP, source_ids=[[], [], [torch.tensor(1.5)]]), TypeError,
     ["source_ids[2]", "torch.float32", "1.5"]),
    ("add source_ids too few rows", lambda m: m.add(EMB, IMP, source_ids=torch.zeros(2, 1, dtype=torch.long)),
     ValueError, ["source_ids", "(3)", "2"]),
    ("retrieve scopes float", lambda m: m.retrieve(QUERIES, now=2.0, scopes=torch.tensor([0.0])), TypeError,
     ["scopes", "torch.float32", "[0.0]"]),
    ("retrieve scopes bool numpy", lambda m: m.retrieve(QUERIES, now=2.0, scopes=np.array([True])), TypeError,
     ["scopes", "bool", "[True]"]),
    ("retrieve scopes 0-D", lambda m: m.retrieve(QUERIES, now=2.0, scopes=torch.tensor(1)), ValueError,
     ["scopes", "1-D or 2-D", "()"]),
    ("retrieve scopes 3-D", lambda m: m.retrieve(QUERIES, now=2.0, scopes=torch.zeros(3, 1, 1, dtype=torch.long)),
     ValueError, ["scopes", "1-D or 2-D", "(3, 1, 1)"]),
    ("retrieve scopes negative", lambda m: m.retrieve(QUERIES, now=2.0, scopes=torch.tensor([0, -3])), ValueError,
     ["scopes", "-3"]),
    ("retrieve scopes rows for 2 of 3 queries", lambda m: m.retrieve(QUERIES, now=2.0, scopes=np.array([[0], [1]])),
     ValueError, ["scopes", "(3)", "2"]),
    ("retrieve scopes float row", lambda m: m.retrieve(QUERIES, now=2.0, scopes=[[0], torch.tensor([1.0]), [2]]),
     TypeError, ["scopes", "torch.float32", "[1.0]"]),
    ("delete float tensor", lambda m: m.delete(torch.tensor([1.0, 2.0])), TypeError, ["ids", "torch.float32", "1.0"]),
    ("delete bool numpy", lambda m: m.delete(np.array([True, False])), TypeError, ["ids", "bool", "[True, False]"]),
    ("delete negative", lambda m: m.delete(torch.tensor([1, -1])), ValueError, ["ids", "-1"]),
    ("delete unknown", lambda m: m.delete(np.array([0, 99])), ValueError, ["ids", "[99]"]),
    ("delete on meta", lambda m: m.delete(torch.tensor([0], device="meta")), TypeError, ["ids", "meta"]),
    ("admit scope float", admit(torch.tensor(1.0), [], [0, 1]), TypeError, ["scope", "torch.float32", "1.0"]),
    ("admit source_ids float", admit(1, torch.tensor([1.5]), None), TypeError, ["source_ids[0]", "1.5"]),
]


@pytest.mark.parametrize("backing", ["tensors", "sqlite"])
@pytest.mark.parametrize("case,call,error,words", EPISODIC_REFUSED, ids=[c[0] for c in EPISODIC_REFUSED])
def test_bad_tensor_ids_are_refused_and_change_nothing(tmp_path, backing, case, call, error, words):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path) if backing == "sqlite" else None
    try:
        memory = filled(store)
        before, stored = snapshot(memory), dump(path) if store is not None else None
        with pytest.raises(error) as info:
            call(memory)
        assert all(word in str(info.value) for word in words), (words, str(info.value))
        assert snapshot(memory) == before
        if store is not None:
            assert dump(path) == stored  # not a row, not an audit line
    finally:
        if store is not None:
            store.close()


@pytest.mark.parametrize("scopes,error,words", [
    (torch.tensor([0.5]), TypeError, ["scopes", "torch.float32", "0.5"]),
    (np.array([[0, 1]]), ValueError, ["scopes", "1-D", "(1, 2)"]),
    (torch.tensor([-2]), ValueError, ["scopes", "-2"]),
])
def test_store_refuses_bad_tensor_scopes(tmp_path, scopes, error, words):
    path = tmp_path / "memory.db"
    with SQLiteStore(path) as store:
        filled(store)
        stored = dump(path)
        with pytest.raises(error) as info:
            scope_keys(scopes, "scopes")  # PostgresStore.set_scopes' parser
        assert all(word in str(info.value) for word in words), str(info.value)
        if scopes.ndim == 1:
            with pytest.raises(error, match="scopes"):
                store.retrieve(QUERIES.numpy(), 2.0, scopes=scopes)
        assert dump(path) == stored


@pytest.mark.parametrize("allowed,error,words", [
    (torch.tensor([0.0, 1.0]), TypeError, ["allowed_scopes", "torch.float32", "[0.0, 1.0]"]),
    (torch.tensor([True]), TypeError, ["allowed_scopes", "torch.bool"]),
    (np.array([[0, 1]]), ValueError, ["allowed_scopes", "1-D", "(1, 2)"]),
    (torch.tensor(3), ValueError, ["allowed_scopes", "1-D", "()"]),
    (5, TypeError, ["allowed_scopes", "5"]),
])
def test_policy_refuses_bad_tensor_scopes(allowed, error, words):
    with pytest.raises(error) as info:
        AdmissionPolicy(allowed_scopes=allowed)
    assert all(word in str(info.value) for word in words), str(info.value)


@pytest.mark.parametrize("ids,error,words", [
    (torch.tensor([0.0]), TypeError, ["ids", "torch.float32"]),
    (np.array([-1]), ValueError, ["ids", "-1"]),
])
def test_retrieval_memory_delete_refuses_bad_tensor_ids(ids, error, words):
    memory = RetrievalMemory(factors=2, actions=2, k=1, capacity=10)
    memory.learn_(torch.rand(3, 2, generator=torch.Generator().manual_seed(2)), torch.zeros(3, dtype=torch.long),
                  torch.tensor([0, 1, 0]))
    before, labels = snapshot(memory.store), dict(memory.labels)
    with pytest.raises(error) as info:
        memory.delete(ids)
    assert all(word in str(info.value) for word in words), str(info.value)
    assert snapshot(memory.store) == before and memory.labels == labels
