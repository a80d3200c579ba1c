"""The bad-input battery: every public entry point of every memory and of the scorer is fed
each kind of bad input and either refuses it, naming the argument and the value, or accepts it
as docs/inputs.md says (then with exactly the result of the plain input); either way the state
is bit for bit what it was (every state_dict tensor, byte for byte, and the extra state).

tests/test_errors.py and tests/test_episodic_errors.py hold the first errors (NaN, wrong K,
out-of-range indices, ...); this file adds the rest: -inf, rank, dtypes (float64, float16,
bfloat16, complex, bool, integers), values that fit no float32, meta-device tensors,
non-contiguous tensors, mismatched lengths, every argument's own cases, the modes
(seed, adaptive, prototypes), RetrievalMemory, a SQLite-backed EpisodicMemory and the scorer.
"""

from __future__ import annotations

import copy
import math
import sqlite3

import numpy as np
import pytest
import torch

from gae import (
    AdmissionPolicy,
    EpisodicMemory,
    JudgmentConfig,
    JudgmentMemory,
    KNNMemory,
    RetrievalMemory,
    RetrievalScorer,
)
from gae.storage import SQLiteStore
from tests.conftest import clustered_stream

CATEGORIES, ACTIONS, FACTORS = 4, 4, 8
MEMORIES = {
    "judgment": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed()),
    "judgment_adaptive": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed(),
                                                drift_mode="adaptive"),
    "judgment_prototypes": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed(),
                                                  prototypes=3),
    "knn": lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, k=3, capacity=20, categories=CATEGORIES, scoped=True),
    "retrieval": lambda: RetrievalMemory(factors=FACTORS, actions=ACTIONS, k=3, capacity=20, categories=CATEGORIES,
                                         scoped=True),
}
HISTORY = clustered_stream(3, 40)  # learned before every case, so that the state is not trivial
_FED: dict[str, torch.nn.Module] = {}


def fed(name: str):
    """A fresh copy of memory ``name`` after HISTORY (built once: numba compiles once)."""
    if name not in _FED:
        memory = MEMORIES[name]()
        memory.learn_(HISTORY.x, HISTORY.category, HISTORY.action, skip=HISTORY.skip)
        _FED[name] = memory
    return copy.deepcopy(_FED[name])


@pytest.fixture(params=sorted(MEMORIES))
def name(request) -> str:
    return request.param


def frozen(value):
    """A comparable, bit-exact image of a state: tensors become (dtype, shape, bytes)."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return ("tensor", str(value.dtype), tuple(value.shape), flat.view(torch.uint8).numpy().tobytes())
    if isinstance(value, dict):
        return {key: frozen(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [frozen(item) for item in value]
    return value


def state(memory) -> dict:
    return frozen(memory.state_dict())


def assert_refused(call, error, words):
    """``call()`` raises ``error`` with every word in its message (a tuple of words: any of them)."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert all(any(w in message for w in (word if isinstance(word, tuple) else (word,))) for word in words), \
        (words, message)


def with_value(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous (transposed) layout."""
    out = t.t().contiguous().t()
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as every other element of a twice-as-long buffer (non-contiguous)."""
    wide = t.new_zeros((*t.shape[:-1], 2 * t.shape[-1]))
    wide[..., ::2] = t
    out = wide[..., ::2]
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


# ---------------------------------------------------------------------------------------
# the batched API: forward, prequential_, learn_
# ---------------------------------------------------------------------------------------
BATCH = clustered_stream(4, 6)
X, CAT, ACT = BATCH.x, BATCH.category, BATCH.action
META = "meta"
SCORING, LEARNING = "scoring", "learning"  # which entry points a case reaches

BATCH_REFUSED = [  # id, arguments over (x, category, action), reached by, error, words of the message
    ("x -inf", {"x": with_value(X, (1, 4), -math.inf)}, SCORING, ValueError, ["x", "-inf", "[1, 4]"]),
    ("x rank 3", {"x": X.unsqueeze(0)}, SCORING, ValueError, ["x", "(1, 6, 8)"]),
    ("x rank 0", {"x": X[0, 0]}, SCORING, ValueError, ["x", "()"]),
    ("x float64 beyond float32", {"x": with_value(X.double(), (2, 1), 1e300)}, SCORING, ValueError,
     ["x", "float32", "1e+300", "[2, 1]"]),
    ("x complex", {"x": X.to(torch.complex64)}, SCORING, TypeError, ["x", "complex64"]),
    ("x bool", {"x": X > 0.5}, SCORING, TypeError, ["x", "torch.bool"]),
    ("x int", {"x": (X * 10).int()}, SCORING, TypeError, ["x", "torch.int32"]),
    ("x numpy", {"x": X.numpy()}, SCORING, TypeError, ["x", "ndarray"]),
    ("x on meta", {"x": X.to(META)}, SCORING, ValueError, ["x", "meta", "cpu"]),
    ("category on meta", {"category": CAT.to(META)}, SCORING, ValueError, ["category", "meta", "cpu"]),
    ("category bool", {"category": CAT > 1}, SCORING, TypeError, ["category", "torch.bool"]),
    ("category rank 2", {"category": CAT.unsqueeze(1)}, SCORING, ValueError, ["category", "(6, 1)"]),
    ("category rank 0", {"category": CAT[0]}, SCORING, ValueError, ["category", "()"]),
    ("category longer", {"category": torch.cat([CAT, CAT])}, SCORING, ValueError, ["category", "(12,)"]),
    ("category list", {"category": CAT.tolist()}, SCORING, TypeError, ["category", "list"]),
    ("category float64", {"category": CAT.double()}, SCORING, TypeError, ["category", "torch.float64"]),
    ("x huge, learned", {"x": with_value(X, (3, 0), 3e38)}, LEARNING, ValueError, ["x", "1e+15", "3e+38", "[3, 0]"]),
    ("action on meta", {"action": ACT.to(META)}, LEARNING, ValueError, ["action", "meta", "cpu"]),
    ("action bool", {"action": ACT > 1}, LEARNING, TypeError, ["action", "torch.bool"]),
    ("action negative", {"action": with_value(ACT, 4, -2)}, LEARNING, ValueError, ["action", "-2"]),
    ("action longer", {"action": torch.cat([ACT, ACT])}, LEARNING, ValueError, ["action", "(12,)"]),
    ("action float", {"action": ACT.float()}, LEARNING, TypeError, ["action", "torch.float32"]),
    ("confirmed int", {"confirmed": torch.ones(6, dtype=torch.int64)}, LEARNING, TypeError,
     ["confirmed", "torch.int64"]),
    ("confirmed longer", {"confirmed": torch.ones(7, dtype=torch.bool)}, LEARNING, ValueError, ["confirmed", "(7,)"]),
    ("confirmed on meta", {"confirmed": torch.ones(6, dtype=torch.bool, device=META)}, LEARNING, ValueError,
     ["confirmed", "meta"]),
    ("confirmed list", {"confirmed": [True] * 6}, LEARNING, TypeError, ["confirmed", "list"]),
    ("skip float", {"skip": torch.zeros(6)}, LEARNING, TypeError, ["skip", "torch.float32"]),
    ("skip shorter", {"skip": torch.zeros(2, dtype=torch.bool)}, LEARNING, ValueError, ["skip", "(2,)"]),
    ("skip on meta", {"skip": torch.zeros(6, dtype=torch.bool, device=META)}, LEARNING, ValueError, ["skip", "meta"]),
    ("source_ids negative", {"source_ids": torch.tensor([0, 1, 2, 3, 4, -5])}, LEARNING, ValueError,
     ["source_ids", "-5"]),
    ("source_ids float", {"source_ids": torch.arange(6.0)}, LEARNING, TypeError, ["source_ids", "torch.float32"]),
    ("source_ids bool", {"source_ids": torch.ones(6, dtype=torch.bool)}, LEARNING, TypeError,
     ["source_ids", "torch.bool"]),
    ("source_ids shorter", {"source_ids": torch.arange(3)}, LEARNING, ValueError, ["source_ids", "(3,)"]),
    ("source_ids on meta", {"source_ids": torch.arange(6, device=META)}, LEARNING, ValueError,
     ["source_ids", "meta"]),
]


def batch_calls(memory, case_reach):
    """The entry points a case reaches, each as ``call(arguments)``."""
    calls = {"prequential_": lambda a: memory.prequential_(**a), "learn_": lambda a: memory.learn_(**a)}
    if case_reach == SCORING:
        calls["forward"] = lambda a: memory(a["x"], a["category"])
        if isinstance(memory, JudgmentMemory):
            calls["nearest_prototype"] = lambda a: memory.nearest_prototype(a["x"], a["category"])
            calls["explain"] = lambda a: memory.explain(a["x"], a["category"])
    return calls


@pytest.mark.parametrize("case,arguments,reach,error,words", BATCH_REFUSED, ids=[c[0] for c in BATCH_REFUSED])
def test_bad_batch_is_refused_by_every_entry_point_and_changes_nothing(name, case, arguments, reach, error, words):
    memory = fed(name)
    before = state(memory)
    full = {"x": X, "category": CAT, "action": ACT, **arguments}
    for entry, call in batch_calls(memory, reach).items():
        if entry == "explain" and not all(isinstance(full[key], torch.Tensor) for key in ("x", "category")):
            continue  # explain reads a list as one decision's factors: the single-decision cases cover it
        # explain takes one decision's ``factors`` or a batch ``x``: either name will do
        named = [("x", "factors") if word == "x" and entry == "explain" else word for word in words]
        assert_refused(lambda call=call: call(full), error, named)
        assert state(memory) == before, entry


def same_answers(a, b) -> None:
    for field in ("action", "confidence", "probs"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


BATCH_ACCEPTED = [  # id, the input as given, the plain input it must be treated as (float32, contiguous, int64)
    ("x float64", {"x": X.double()}, {}),
    ("x float16", {"x": X.half()}, {"x": X.half().float()}),
    ("x bfloat16", {"x": X.bfloat16()}, {"x": X.bfloat16().float()}),
    ("x column-major", {"x": column_major(X)}, {}),
    ("x strided", {"x": strided(X)}, {}),
    ("indices strided", {"category": strided(CAT), "action": strided(ACT)}, {}),
    ("indices int32 and uint8", {"category": CAT.int(), "action": ACT.to(torch.uint8)}, {}),
    ("flags strided", {"confirmed": strided(ACT > 1), "skip": strided(CAT == 0)},
     {"confirmed": ACT > 1, "skip": CAT == 0}),
    ("source_ids strided and int32", {"source_ids": strided(torch.arange(100, 106)).int()},
     {"source_ids": torch.arange(100, 106)}),
    ("x requiring grad", {"x": X.clone().requires_grad_()}, {}),
]


@pytest.mark.parametrize("case,given,plain", BATCH_ACCEPTED, ids=[c[0] for c in BATCH_ACCEPTED])
def test_accepted_batch_gives_the_plain_inputs_result(name, case, given, plain):
    base = {"x": X, "category": CAT, "action": ACT}
    memory, reference = fed(name), fed(name)
    with torch.no_grad():
        same_answers(memory(given.get("x", X), given.get("category", CAT)),
                     reference(plain.get("x", X), plain.get("category", CAT)))
    a = memory.prequential_(**{**base, **given})
    b = reference.prequential_(**{**base, **plain})
    same_answers(a.output, b.output)
    assert state(memory) == state(reference)


def test_huge_factors_are_scored_but_not_learned(name):
    """Scoring takes any finite float32; learning refuses |x| > 1e15, which would overflow the state."""
    memory = fed(name)
    before = state(memory)
    huge = with_value(X, (0, 0), 1e30)
    with torch.no_grad():
        out = memory(huge, CAT)
    assert out.action.shape == (6,) and not torch.isnan(out.probs).any()
    assert_refused(lambda: memory.learn_(huge, CAT, ACT), ValueError, ["x", "1e+15", "1e+30", "[0, 0]"])
    assert state(memory) == before
    memory.learn_(with_value(X, (0, 0), 1e15), CAT, ACT)  # the bound itself is learned, and the state stays finite
    assert all(torch.isfinite(t).all() for key, t in memory.state_dict().items()  # validity windows may be inf
               if isinstance(t, torch.Tensor) and t.is_floating_point() and "valid_" not in key)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_for_a_cpu_memory(name):
    memory = fed(name)
    before = state(memory)
    assert_refused(lambda: memory.learn_(X.cuda(), CAT, ACT), ValueError, ["x", "cuda", "cpu"])
    assert_refused(lambda: memory(X, CAT.cuda()), ValueError, ["category", "cuda", "cpu"])
    assert state(memory) == before
    reference = fed(name)  # the single-decision API moves one decision to the memory's device
    assert memory.learn_one(X[0].cuda(), 1, 2) == reference.learn_one(X[0], 1, 2)
    assert state(memory) == state(reference)


# ---------------------------------------------------------------------------------------
# the single-decision API: score_one, learn_one
# ---------------------------------------------------------------------------------------
ROW = [0.1, 0.9, 0.3, 0.5, 0.2, 0.8, 0.6, 0.4]
SINGLE_REFUSED = [  # id, call, error, words
    ("factors -inf", lambda m: m.score_one(ROW[:7] + [-math.inf], 0), ValueError, ["factors", "-inf"]),
    ("factors beyond float32", lambda m: m.score_one([1e300] + ROW[1:], 0), ValueError,
     ["factors", "float32", "1e+300"]),
    ("factors rank 2", lambda m: m.score_one([ROW], 0), ValueError, ["factors", "(1, 8)"]),
    ("factors None", lambda m: m.score_one(None, 0), ValueError, ["factors", "()"]),
    ("factors text", lambda m: m.score_one("abcdefgh", 0), TypeError, ["factors", "abcdefgh"]),
    ("factors dict", lambda m: m.score_one({"a": 1}, 0), TypeError, ["factors", "{'a': 1}"]),
    ("factors on meta", lambda m: m.score_one(torch.ones(8, device=META), 0), ValueError, ["factors", "meta"]),
    ("factors complex tensor", lambda m: m.score_one(torch.ones(8, dtype=torch.complex64), 0), TypeError,
     ["factors", "complex64"]),
    ("learn factors complex tensor", lambda m: m.learn_one(torch.ones(8, dtype=torch.complex64), 0, 0), TypeError,
     ["factors", "complex64"]),
    ("category bool", lambda m: m.score_one(ROW, True), TypeError, ["category", "True"]),
    ("category float", lambda m: m.score_one(ROW, 1.0), TypeError, ["category", "1.0"]),
    ("category None", lambda m: m.score_one(ROW, None), TypeError, ["category", "None"]),
    ("category tensor", lambda m: m.score_one(ROW, torch.tensor(1)), TypeError, ["category", "tensor(1)"]),
    ("category negative", lambda m: m.score_one(ROW, -1), ValueError, ["category", "-1"]),
    ("category beyond int64", lambda m: m.score_one(ROW, 10**30), ValueError, ["category", str(10**30)]),
    ("learn factors -inf", lambda m: m.learn_one([-math.inf] + ROW[1:], 0, 0), ValueError, ["factors", "-inf"]),
    ("learn factors huge", lambda m: m.learn_one([1e20] + ROW[1:], 0, 0), ValueError, ["factors", "1e+15", "1e+20"]),
    ("learn factors on meta", lambda m: m.learn_one(torch.ones(8, device=META), 0, 0), ValueError,
     ["factors", "meta"]),
    ("learn action bool", lambda m: m.learn_one(ROW, True, 0), TypeError, ["action", "True"]),
    ("learn action None", lambda m: m.learn_one(ROW, None, 0), TypeError, ["action", "None"]),
    ("learn action float", lambda m: m.learn_one(ROW, 1.0, 0), TypeError, ["action", "1.0"]),
    ("learn action tensor", lambda m: m.learn_one(ROW, torch.tensor(1), 0), TypeError, ["action", "tensor(1)"]),
    ("learn action negative", lambda m: m.learn_one(ROW, -1, 0), ValueError, ["action", "-1"]),
    ("learn category negative", lambda m: m.learn_one(ROW, 0, -3), ValueError, ["category", "-3"]),
    ("learn category beyond int64", lambda m: m.learn_one(ROW, 0, 10**30), ValueError, ["category", str(10**30)]),
    ("learn confirmed int", lambda m: m.learn_one(ROW, 0, 0, confirmed=1), TypeError, ["confirmed", "1"]),
    ("learn confirmed tensor", lambda m: m.learn_one(ROW, 0, 0, confirmed=torch.tensor(True)), TypeError,
     ["confirmed", "tensor(True)"]),
    ("learn outcome bytes", lambda m: m.learn_one(ROW, 0, 0, outcome=b"__incorrect__"), TypeError,
     ["outcome", "b'__incorrect__'"]),
]
SINGLE_MEMORIES = [*sorted(MEMORIES), "knn_uncategorised"]


def single_memory(name: str):
    if name == "knn_uncategorised":  # categories ignored: any name, or any int >= 0, is fine
        memory = KNNMemory(factors=FACTORS, actions=ACTIONS, k=3, capacity=20)
        memory.learn_(HISTORY.x, HISTORY.category, HISTORY.action)
        return memory
    return fed(name)


@pytest.mark.parametrize("memory_name", SINGLE_MEMORIES)
@pytest.mark.parametrize("case,call,error,words", SINGLE_REFUSED, ids=[c[0] for c in SINGLE_REFUSED])
def test_bad_single_decision_is_refused_and_changes_nothing(memory_name, case, call, error, words):
    memory = single_memory(memory_name)
    before = state(memory)
    assert_refused(lambda: call(memory), error, words)
    assert state(memory) == before


SINGLE_ACCEPTED = [  # id, the factors / category / action as given, as plain Python values
    ("numpy float64", (np.array(ROW), 1, 2), (ROW, 1, 2)),
    ("tensor float64", (torch.tensor(ROW, dtype=torch.float64), 1, 2), (ROW, 1, 2)),
    ("tensor float16", (torch.tensor(ROW).half(), 1, 2), (torch.tensor(ROW).half().tolist(), 1, 2)),
    ("tensor strided", (strided(torch.tensor(ROW)), 1, 2), (ROW, 1, 2)),
    ("ints and bools", ([0, 1, True, False, 1, 0, 1, 1], 1, 2), ([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0], 1, 2)),
    ("numpy integer indices", (ROW, np.int64(1), np.int64(2)), (ROW, 1, 2)),
]


@pytest.mark.parametrize("memory_name", SINGLE_MEMORIES)
@pytest.mark.parametrize("case,given,plain", SINGLE_ACCEPTED, ids=[c[0] for c in SINGLE_ACCEPTED])
def test_accepted_single_decision_gives_the_plain_result(memory_name, case, given, plain):
    memory, reference = single_memory(memory_name), single_memory(memory_name)
    factors, category, action = given
    assert memory.score_one(factors, category) == reference.score_one(plain[0], plain[1])
    assert memory.learn_one(factors, action, category) == reference.learn_one(plain[0], plain[2], plain[1])
    assert state(memory) == state(reference)


def test_outcomes_other_than_the_marker_are_learned_and_the_marker_is_skipped(name):
    memory, reference = fed(name), fed(name)
    assert memory.learn_one(ROW, 1, 2, outcome="\x00 anything else") == reference.learn_one(ROW, 1, 2)
    assert state(memory) == state(reference)
    assert memory.learn_one(ROW, 1, 2, outcome="__incorrect__", confirmed=np.bool_(False))["skipped"] is \
        isinstance(memory, (JudgmentMemory, RetrievalMemory))  # KNNMemory learns it unless respect_skip


def test_an_uncategorised_memory_takes_any_category_name():
    memory = single_memory("knn_uncategorised")
    reference = single_memory("knn_uncategorised")
    assert memory.learn_one(ROW, 1, "never seen") == reference.learn_one(ROW, 1, 0)
    assert state(memory) == state(reference)


# ---------------------------------------------------------------------------------------
# JudgmentMemory's own entry points: explain, nearest_prototype, undo_, forget_, trace
# ---------------------------------------------------------------------------------------
JUDGMENT_REFUSED = [
    ("explain one decision, tensor category", lambda m: m.explain(ROW, torch.tensor(0)), TypeError,
     ["category", "tensor"]),
    ("explain a batch, int category", lambda m: m.explain(X, 0), TypeError, ["category", "(B,)", "0"]),
    ("explain one decision on meta", lambda m: m.explain(torch.ones(8, device=META), 0), ValueError,
     ["factors", "meta"]),
    ("explain an empty batch", lambda m: m.explain(X[:0], CAT[:0]), ValueError, ["factors", "empty"]),
    ("undo_ 0", lambda m: m.undo_(0), ValueError, ["n", "0"]),
    ("undo_ bool", lambda m: m.undo_(True), TypeError, ["n", "True"]),
    ("undo_ float", lambda m: m.undo_(1.0), TypeError, ["n", "1.0"]),
    ("undo_ past the log", lambda m: m.undo_(10**6), ValueError, ["1000000", "applied decisions"]),
    ("forget_ nothing", lambda m: m.forget_([]), ValueError, ["source_ids", "[]"]),
    ("forget_ floats", lambda m: m.forget_([1.5]), ValueError, ["source_ids", "1.5"]),
    ("forget_ text", lambda m: m.forget_(["a"]), ValueError, ["source_ids", "'a'"]),
    ("forget_ bools", lambda m: m.forget_([True]), ValueError, ["source_ids", "True"]),
    ("forget_ beyond int64", lambda m: m.forget_([10**30]), ValueError, ["source_ids", str(10**30)]),
    ("forget_ None", lambda m: m.forget_(None), ValueError, ["source_ids", "None"]),
    ("forget_ on meta", lambda m: m.forget_(torch.tensor([1], device=META)), ValueError, ["source_ids", "meta"]),
    ("forget_ unknown", lambda m: m.forget_([999]), ValueError, ["source_ids", "999"]),
    ("trace unknown category", lambda m: m.trace("payroll", 0), ValueError, ["category", "payroll"]),
    ("trace negative action", lambda m: m.trace(0, -1), ValueError, ["action", "-1"]),
    ("trace top 0", lambda m: m.trace(0, 0, top=0), ValueError, ["top", "0"]),
    ("trace prototype out of range", lambda m: m.trace(0, 0, prototype=5), ValueError, ["prototype", "5"]),
]


@pytest.mark.parametrize("memory_name", [name for name in sorted(MEMORIES) if name.startswith("judgment")])
@pytest.mark.parametrize("case,call,error,words", JUDGMENT_REFUSED, ids=[c[0] for c in JUDGMENT_REFUSED])
def test_bad_judgment_call_is_refused_and_changes_nothing(memory_name, case, call, error, words):
    memory = fed(memory_name)
    before = state(memory)
    assert_refused(lambda: call(memory), error, words)
    assert state(memory) == before


# ---------------------------------------------------------------------------------------
# EpisodicMemory, in memory and on SQLite
# ---------------------------------------------------------------------------------------
DIM = 4
EMB, IMP = torch.randn(3, DIM, generator=torch.Generator().manual_seed(1)), torch.tensor([0.1, 0.5, 0.9])
TRACE = {"embedding": torch.ones(DIM), "importance": 0.5, "outcome": "success", "quality": 0.9}


def add(m, **kwargs):
    arguments = {"embeddings": EMB, "importance": IMP, "scope": ["gamma", "alpha", 0], "now": 2.0, **kwargs}
    return m.add(arguments.pop("embeddings"), arguments.pop("importance"), **arguments)


def admit(*traces):
    return lambda m: m.admit_and_add(list(traces), AdmissionPolicy(), now=2.0)


EPISODIC_REFUSED = [  # id, call, error, words
    ("embeddings -inf", lambda m: add(m, embeddings=with_value(EMB, (2, 0), -math.inf)), ValueError,
     ["embeddings", "-inf", "[2, 0]"]),
    ("embeddings rank 3", lambda m: add(m, embeddings=EMB.unsqueeze(0)), ValueError, ["embeddings", "(1, 3, 4)"]),
    ("embeddings float64 beyond float32", lambda m: add(m, embeddings=with_value(EMB.double(), (0, 1), 1e300)),
     ValueError, ["embeddings", "1e+300", "[0, 1]"]),
    ("embeddings huge", lambda m: add(m, embeddings=with_value(EMB, (1, 1), 3e38)), ValueError,
     ["embeddings", "1e+15", "3e+38"]),
    ("embeddings complex", lambda m: add(m, embeddings=EMB.to(torch.complex64)), TypeError,
     ["embeddings", "complex64"]),
    ("embeddings bool", lambda m: add(m, embeddings=EMB > 0), TypeError, ["embeddings", "torch.bool"]),
    ("embeddings on meta", lambda m: add(m, embeddings=EMB.to(META)), ValueError, ["embeddings", "meta", "cpu"]),
    ("query on meta", lambda m: add(m, query=torch.ones(DIM, device=META)), ValueError, ["query", "meta"]),
    ("query beyond float32", lambda m: add(m, query=torch.full((DIM,), 1e300, dtype=torch.float64)), ValueError,
     ["query", "float32", "1e+300"]),
    ("source_ids text", lambda m: add(m, source_ids=["ab", [1], [2]]), TypeError, ["source_ids[0]", "'ab'"]),
    ("source_ids float", lambda m: add(m, source_ids=[[1.5], [1], [2]]), TypeError, ["source_ids[0]", "1.5"]),
    ("source_ids bool", lambda m: add(m, source_ids=[[1], [True], [2]]), TypeError, ["source_ids[1]", "True"]),
    ("source_ids None row", lambda m: add(m, source_ids=[[1], None, [2]]), TypeError, ["source_ids[1]", "None"]),
    ("source_ids beyond int64", lambda m: add(m, source_ids=[[1], [2], [10**30]]), ValueError,
     ["source_ids[2]", str(10**30)]),
    ("source_ids an int", lambda m: add(m, source_ids=5), TypeError, ["source_ids", "5"]),
    ("content one string", lambda m: add(m, content="abc"), TypeError, ["content", "'abc'"]),
    ("valid_from after valid_until", lambda m: add(m, valid_from=5.0, valid_until=torch.tensor([9.0, 1.0, 9.0])),
     ValueError, ["valid_from", "valid_until", "5.0 > 1.0", "memory 1"]),
    ("scope None", lambda m: add(m, scope=None), TypeError, ["scope", "None"]),
    ("scope beyond int64", lambda m: add(m, scope=[0, 1, 2**70]), ValueError, ["scope", str(2**70)]),
    ("importance on meta", lambda m: add(m, importance=IMP.to(META)), ValueError, ["importance", "meta"]),
    ("importance text", lambda m: add(m, importance="high"), TypeError, ["importance", "'high'"]),
    ("confidence text", lambda m: add(m, confidence=["a", "b", "c"]), TypeError, ["confidence", "'a'"]),
    ("retrieve -inf", lambda m: m.retrieve(with_value(EMB, (0, 3), -math.inf), now=2.0), ValueError,
     ["queries", "-inf", "[0, 3]"]),
    ("retrieve beyond float32", lambda m: m.retrieve(EMB.double() * 1e300, now=2.0), ValueError,
     ["queries", "float32"]),
    ("retrieve rank 3", lambda m: m.retrieve(EMB.unsqueeze(0), now=2.0), ValueError, ["queries", "(1, 3, 4)"]),
    ("retrieve on meta", lambda m: m.retrieve(EMB.to(META), now=2.0), ValueError, ["queries", "meta"]),
    ("retrieve int queries", lambda m: m.retrieve(EMB.long(), now=2.0), TypeError, ["queries", "torch.int64"]),
    ("retrieve now bool", lambda m: m.retrieve(EMB, now=True), TypeError, ["now", "True"]),
    ("retrieve k numpy", lambda m: m.retrieve(EMB, now=2.0, k=np.int64(2)), TypeError, ["k", "2"]),
    ("retrieve scopes bool", lambda m: m.retrieve(EMB, now=2.0, scopes=[True]), ValueError, ["scopes", "True"]),
    ("retrieve scopes float tensor", lambda m: m.retrieve(EMB, now=2.0, scopes=torch.tensor([0.0])), TypeError,
     ["scopes", "torch.float32"]),
    ("delete None", lambda m: m.delete(None), TypeError, ["ids", "None"]),
    ("delete text", lambda m: m.delete(["a"]), TypeError, ["ids", "'a'"]),
    ("delete bool", lambda m: m.delete(torch.tensor([True])), TypeError, ["ids", "torch.bool"]),
    ("delete beyond int64", lambda m: m.delete([10**30]), TypeError, ["ids", str(10**30)]),
    ("delete on meta", lambda m: m.delete(torch.tensor([0], device=META)), TypeError, ["ids", "meta"]),
    ("delete negative", lambda m: m.delete([-1]), ValueError, ["ids", "-1"]),
    ("delete reason not text", lambda m: m.delete([0], reason=5), TypeError, ["reason", "5"]),
    ("expire -inf", lambda m: m.expire(-math.inf), ValueError, ["now", "-inf"]),
    ("admit no embedding", admit({k: v for k, v in TRACE.items() if k != "embedding"}), ValueError,
     ["trace", "'embedding'"]),
    ("admit no importance", admit({k: v for k, v in TRACE.items() if k != "importance"}), ValueError,
     ["trace", "'importance'"]),
    ("admit text embedding", admit({**TRACE, "embedding": "abcd"}), TypeError, ["embedding", "'abcd'"]),
    ("admit meta embedding", admit({**TRACE, "embedding": torch.ones(DIM, device=META)}), TypeError,
     ["embedding", "meta"]),
    ("admit NaN embedding", admit({**TRACE, "embedding": [0.0, math.nan, 0.0, 1.0]}), ValueError,
     ["embeddings", "nan", "[0, 1]"]),
    ("admit embedding beyond float32", admit({**TRACE, "embedding": torch.full((DIM,), 1e300, dtype=torch.float64)}),
     ValueError, ["embeddings", "1e+300"]),
    ("admit embeddings of two widths", admit(TRACE, {**TRACE, "embedding": torch.ones(DIM + 1)}), ValueError,
     ["embeddings", "(4,)", "(5,)"]),
    ("admit text importance", admit({**TRACE, "importance": "high"}), TypeError, ["importance", "'high'"]),
    ("admit text created_at", admit({**TRACE, "created_at": "now"}), TypeError, ["created_at", "'now'"]),
    ("admit source_ids an int", admit({**TRACE, "source_ids": 5}), TypeError, ["source_ids[0]", "5"]),
    ("admit a trace that is text", admit("success"), TypeError, ["traces[0]", "'success'"]),
    ("admit one dict, not a list", lambda m: m.admit_and_add(TRACE, AdmissionPolicy(), now=2.0), TypeError,
     ["traces", "dict"]),
    ("admit without a policy", lambda m: m.admit_and_add([TRACE], None, now=2.0), TypeError, ["policy", "None"]),
]


def filled(store=None) -> EpisodicMemory:
    memory = EpisodicMemory(DIM, capacity=5, store=store)
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(3, DIM, generator=gen), torch.rand(3, generator=gen), scope=["alpha", 0, 1], now=1.0,
               source_ids=[[7], [], [8, 9]], content=["one", None, "three"])
    return memory


def dump(path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def episodic_state(memory: EpisodicMemory) -> dict:
    return {"state": state(memory), "allocated": memory.embeddings.shape[0]}


@pytest.mark.parametrize("backing", ["tensors", "sqlite"])
@pytest.mark.parametrize("case,call,error,words", EPISODIC_REFUSED, ids=[c[0] for c in EPISODIC_REFUSED])
def test_bad_episodic_call_is_refused_and_changes_nothing(tmp_path, backing, case, call, error, words):
    path = tmp_path / "memory.db"
    store = SQLiteStore(path) if backing == "sqlite" else None
    try:
        memory = filled(store)
        before = episodic_state(memory)
        stored = dump(path) if store is not None else None
        assert_refused(lambda: call(memory), error, words)
        assert episodic_state(memory) == before
        if stored is not None:
            assert dump(path) == stored  # not a row, not an audit line
    finally:
        if store is not None:
            store.close()


EPISODIC_ACCEPTED = [  # id, call as given, the call with plain inputs
    ("embeddings float64", lambda m: add(m, embeddings=EMB.double()), lambda m: add(m)),
    ("embeddings float16", lambda m: add(m, embeddings=EMB.half()), lambda m: add(m, embeddings=EMB.half().float())),
    ("embeddings column-major", lambda m: add(m, embeddings=column_major(EMB)), lambda m: add(m)),
    ("embeddings requiring grad", lambda m: add(m, embeddings=EMB.clone().requires_grad_()), lambda m: add(m)),
    ("importance strided float64", lambda m: add(m, importance=strided(IMP.double())),
     lambda m: add(m, importance=IMP)),
    ("source_ids as tensors", lambda m: add(m, source_ids=[torch.tensor([1, 2]), torch.tensor([], dtype=torch.long),
                                                            [np.int64(3)]]),
     lambda m: add(m, source_ids=[[1, 2], [], [3]])),
    ("queries float64", lambda m: m.retrieve(EMB.double(), now=2.0, k=2), lambda m: m.retrieve(EMB, now=2.0, k=2)),
    ("queries strided", lambda m: m.retrieve(strided(EMB), now=2.0, k=2), lambda m: m.retrieve(EMB, now=2.0, k=2)),
    ("delete a 2-D tensor of ids", lambda m: m.delete(torch.tensor([[0], [2]])), lambda m: m.delete([0, 2])),
    ("retrieve scopes tensor", lambda m: m.retrieve(EMB, now=2.0, k=2, scopes=torch.tensor([0, 1])),
     lambda m: m.retrieve(EMB, now=2.0, k=2, scopes=[0, 1])),
    ("admit tensor numbers", admit({**TRACE, "importance": torch.tensor(0.5), "quality": 0.9}), admit(TRACE)),
]


@pytest.mark.parametrize("case,given,plain", EPISODIC_ACCEPTED, ids=[c[0] for c in EPISODIC_ACCEPTED])
def test_accepted_episodic_call_gives_the_plain_result(case, given, plain):
    memory, reference = filled(), filled()
    a, b = given(memory), plain(reference)
    assert frozen(a) == frozen(b)
    assert episodic_state(memory) == episodic_state(reference)


# ---------------------------------------------------------------------------------------
# RetrievalScorer: forward and components
# ---------------------------------------------------------------------------------------
Q, E = torch.randn(2, DIM, generator=torch.Generator().manual_seed(2)), torch.randn(5, DIM)
AGE, IMPORTANCE = torch.tensor([0.0, 1.0, 5.0, 30.0, 2.0]), torch.tensor([0.1, 0.9, 0.5, 0.0, 1.0])
SCORER_REFUSED = [  # id, arguments over (queries, embeddings, age, importance, mask), error, words
    ("queries NaN", {"queries": with_value(Q, (1, 2), math.nan)}, ValueError, ["queries", "nan", "[1, 2]"]),
    ("embeddings +inf", {"embeddings": with_value(E, (3, 0), math.inf)}, ValueError, ["embeddings", "inf", "[3, 0]"]),
    ("age -inf", {"age": with_value(AGE, 4, -math.inf)}, ValueError, ["age", "-inf", "[4]"]),
    ("importance NaN", {"importance": with_value(IMPORTANCE, 0, math.nan)}, ValueError, ["importance", "nan"]),
    ("queries beyond float32", {"queries": Q.double() * 1e300}, ValueError, ["queries", "float32"]),
    ("queries of another width", {"queries": Q[:, :3]}, ValueError, ["queries", "(Q, 4)", "(2, 3)"]),
    ("queries rank 1", {"queries": Q[0]}, ValueError, ["queries", "(Q, 4)", "(4,)"]),
    ("embeddings rank 3", {"embeddings": E.unsqueeze(0)}, ValueError, ["embeddings", "(N, D)", "(1, 5, 4)"]),
    ("age of another length", {"age": AGE[:3]}, ValueError, ["age", "(5,)", "(3,)"]),
    ("importance of another length", {"importance": IMPORTANCE[:4]}, ValueError, ["importance", "(5,)", "(4,)"]),
    ("mask of another length", {"mask": torch.ones(3, dtype=torch.bool)}, ValueError, ["mask", "(5,)", "(3,)"]),
    ("int queries", {"queries": Q.long()}, TypeError, ["queries", "torch.int64"]),
    ("bool age", {"age": AGE > 1}, TypeError, ["age", "torch.bool"]),
    ("complex embeddings", {"embeddings": E.to(torch.complex64)}, TypeError, ["embeddings", "complex64"]),
    ("int mask", {"mask": torch.ones(5, dtype=torch.int64)}, TypeError, ["mask", "torch.int64"]),
    ("list queries", {"queries": Q.tolist()}, TypeError, ["queries", "list"]),
    ("queries on meta", {"queries": Q.to(META)}, ValueError, ["queries", "meta", "cpu"]),
    ("importance on meta", {"importance": IMPORTANCE.to(META)}, ValueError, ["importance", "meta"]),
    ("mask on meta", {"mask": torch.ones(5, dtype=torch.bool, device=META)}, ValueError, ["mask", "meta"]),
]


def score(scorer, components=False, **arguments):
    full = {"queries": Q, "embeddings": E, "age": AGE, "importance": IMPORTANCE, **arguments}
    if components:
        full.pop("mask", None)
        return scorer.components(**full)
    return scorer(**full)


@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("case,arguments,error,words", SCORER_REFUSED, ids=[c[0] for c in SCORER_REFUSED])
def test_bad_scorer_input_is_refused(learnable, case, arguments, error, words):
    scorer = RetrievalScorer(learnable=learnable)
    before = state(scorer)
    assert_refused(lambda: score(scorer, **arguments), error, words)
    if "mask" not in arguments:
        assert_refused(lambda: score(scorer, components=True, **arguments), error, words)
    assert state(scorer) == before


SCORER_ACCEPTED = [  # id, inputs as given, the plain inputs
    ("float64", {"queries": Q.double(), "embeddings": E.double(), "age": AGE.double()}, {}),
    ("float16 queries", {"queries": Q.half()}, {"queries": Q.half().float()}),
    ("integer age", {"age": AGE.long()}, {}),
    ("non-contiguous", {"queries": column_major(Q), "embeddings": column_major(E), "age": strided(AGE),
                        "importance": strided(IMPORTANCE)}, {}),
    ("per-query age and mask", {"age": AGE.expand(2, 5), "mask": torch.tensor([True, False, True, True, False])},
     {"age": AGE.expand(2, 5).contiguous(), "mask": torch.tensor([[True, False, True, True, False]] * 2)}),
]


@pytest.mark.parametrize("case,given,plain", SCORER_ACCEPTED, ids=[c[0] for c in SCORER_ACCEPTED])
def test_accepted_scorer_input_gives_the_plain_result(case, given, plain):
    scorer = RetrievalScorer()
    a, b = score(scorer, **given), score(scorer, **plain)
    assert a.dtype == torch.float32 and torch.equal(a, b)


def test_the_scorer_scores_empty_inputs_to_empty_results():
    scorer = RetrievalScorer()
    assert score(scorer, queries=Q[:0]).shape == (0, 5)
    assert score(scorer, embeddings=E[:0], age=AGE[:0], importance=IMPORTANCE[:0]).shape == (2, 0)
