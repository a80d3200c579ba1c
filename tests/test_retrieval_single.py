"""RetrievalMemory's single-decision path (score_one / learn_one) against its checked, batched path.

A run of single decisions must end bit for bit where one ``prequential_`` call over the same
decisions ends (every state_dict tensor, allocated rows included, labels, audit log, version)
and answer what that call answered before learning each decision, names and confidences
exactly. :func:`numpy_score_one` is the plain NumPy transcription of the score and vote that
scripts/bench.py times ``score_one`` against.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from gae import RetrievalMemory, RetrievalScorer
from gae.models import retrieval_engine
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, clustered_stream

NAMES = ([f"category {i}" for i in range(CATEGORIES)], [f"action {i}" for i in range(ACTIONS)])


def numpy_score_one(memory: RetrievalMemory, factors, category: str | int = "general") -> tuple[str | None, float]:
    """``memory.score_one`` transcribed plainly in NumPy: the same score and top-k vote, equal up to
    rounding (NumPy adds in its own order) and to the order of exactly tied scores."""
    store = memory.store
    n, k = len(store), memory.k
    if n < k:
        return None, 0.0
    buffers = store._buffers
    column = {name: buffers[name].numpy()[:n] for name in ("embeddings", "created_at", "importance", "scope",
                                                           "valid_from", "valid_until", "ids")}
    w_sim, w_rec, w_imp = store.scorer.weights.detach().numpy()
    now = float(memory.num_decisions) * memory.seconds_per_decision
    query = np.asarray(factors, dtype=np.float32) - np.float32(memory.center)
    query = query / max(np.linalg.norm(query), np.float32(1e-12))
    recency = np.exp(-(now - column["created_at"]).astype(np.float32) / store.scorer.tau.numpy())
    scores = w_sim * (column["embeddings"] @ query) + w_rec * recency + w_imp * column["importance"]
    visible = (column["valid_from"] <= now) & (now < column["valid_until"])
    if memory.scoped:
        visible &= column["scope"] == memory._category_index(category)
    scores[~visible] = -np.inf
    top = np.argsort(-scores, kind="stable")[:k]
    if not np.isfinite(scores[top]).all():
        return None, 0.0
    labels = [memory.labels.get(i, 0) for i in column["ids"][top].tolist()]
    votes = np.bincount(labels, np.maximum(scores[top], 1e-8), minlength=len(memory.action_names))
    share = votes / votes.sum()
    best = int(share.argmax())
    return memory.action_names[best], float(share[best])


def make(**kwargs) -> RetrievalMemory:
    return RetrievalMemory(factors=FACTORS, actions=NAMES[1], **{"k": 5, "categories": NAMES[0], **kwargs})


def assert_same(a: RetrievalMemory, b: RetrievalMemory) -> None:
    left, right = a.state_dict(), b.state_dict()
    assert left.keys() == right.keys()
    for key in left:
        if isinstance(left[key], torch.Tensor):
            assert left[key].dtype == right[key].dtype and torch.equal(left[key], right[key]), key
        else:
            assert left[key] == right[key], key
    assert a.labels == b.labels and a.version == b.version


def replay(memory: RetrievalMemory, stream, skip_outcome: bool = True) -> tuple[list, list]:
    """score_one then learn_one for every decision, in stream order: (answers, learn_one results)."""
    answers, results = [], []
    x = stream.x.numpy()
    for i in range(x.shape[0]):
        category, action = NAMES[0][int(stream.category[i])], NAMES[1][int(stream.action[i])]
        answers.append(memory.score_one(x[i], category))
        outcome = "__incorrect__" if skip_outcome and bool(stream.skip[i]) else None
        results.append(memory.learn_one(x[i], action, category, outcome=outcome))
    return answers, results


def assert_answers(step, answers) -> None:
    names = [None if int(a) < 0 else NAMES[1][int(a)] for a in step.output.action]
    assert [name for name, _ in answers] == names
    assert [confidence for _, confidence in answers] == step.output.confidence.tolist()


CONFIGS = {
    "scoped_respecting_skips": {"capacity": 40, "scoped": True, "respect_skip": True},
    "unscoped_storing_skips": {"capacity": 25, "categories": None, "scoped": False, "respect_skip": False,
                               "center": 0.3, "seconds_per_decision": 0.7,
                               "scorer": RetrievalScorer(0.5, 0.3, 0.2, tau=40.0, learnable=True)},
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_single_decisions_equal_one_batched_call(config, monkeypatch):
    """1,500 decisions per configuration, 3,000 in all (the batched reference takes ~1 ms each)."""
    summed = []  # the votes' totals torch adds (three actions or more voted; two or fewer add up in any order)
    torch_sum = torch.sum
    monkeypatch.setattr(retrieval_engine.torch, "sum", lambda *a, **kw: summed.append(1) or torch_sum(*a, **kw))
    n = 1500
    stream = clustered_stream(5, n, drift_at=n // 2, skip_rate=0.2)
    batched, single = make(**copy.deepcopy(CONFIGS[config])), make(**copy.deepcopy(CONFIGS[config]))
    step = batched.prequential_(stream.x, stream.category, stream.action, skip=stream.skip)
    summed.clear()
    answers, results = replay(single, stream)
    assert_same(batched, single)
    assert_answers(step, answers)
    skipped = [bool(s) and single.respect_skip for s in stream.skip]
    assert [r == {"skipped": True} for r in results] == skipped
    assert all(r == {"skipped": False, "gated": False, "eta": 1.0, "disp": 0.0, "initialized": False}
               for r, s in zip(results, skipped, strict=True) if not s)
    assert int(single.num_decisions) == n and len(single.store) == single.store.capacity
    assert sum(r.action == "evict" for r in single.store.audit_log) > n // 2
    assert 0 < len(summed) < n


def test_exact_ties_at_the_kth_score_are_broken_as_torch_topk_breaks_them(monkeypatch):
    """Repeated factors at a clock so fast that every recency is 1: many scores tie exactly, and
    which of them make the top k is torch.topk's choice, asked on the checked path's scores."""
    asked = []
    topk = torch.topk
    monkeypatch.setattr(retrieval_engine.torch, "topk", lambda *a, **kw: asked.append(1) or topk(*a, **kw))
    stream = clustered_stream(6, 300, skip_rate=0.0)
    stream = stream._replace(x=stream.x[torch.arange(300) % 7])
    batched, single = (make(capacity=30, seconds_per_decision=1e-30) for _ in range(2))
    step = batched.prequential_(stream.x, stream.category, stream.action)
    answers, _ = replay(single, stream)
    assert_same(batched, single)
    assert_answers(step, answers)
    assert len(asked) > 50


def test_the_numpy_transcription_agrees():
    memory = make(capacity=60, scoped=True)
    stream = clustered_stream(7, 400)
    memory.learn_(stream.x[:300], stream.category[:300], stream.action[:300])
    for x, c in zip(stream.x[300:].numpy(), stream.category[300:].tolist(), strict=True):
        name, confidence = memory.score_one(x, NAMES[0][c])
        reference = numpy_score_one(memory, x, NAMES[0][c])
        assert name == reference[0] and confidence == pytest.approx(reference[1], rel=1e-5)


def checked(memory: RetrievalMemory) -> RetrievalMemory:
    """A copy that always takes the checked path."""
    twin = copy.deepcopy(memory)
    twin.backend = "reference"
    return twin


BAD_ONE = [
    ("nan", [float("nan")] + [0.5] * 7, "category 0", "action 0"),
    ("inf", [0.5] * 7 + [float("inf")], "category 0", "action 0"),
    ("beyond float32", [1e39] + [0.5] * 7, "category 0", "action 0"),
    ("wrong length", [0.5] * 7, "category 0", "action 0"),
    ("wrong rank", [[0.5] * 8], "category 0", "action 0"),
    ("text", ["a"] * 8, "category 0", "action 0"),
    ("unknown category", [0.5] * 8, "category 9", "action 0"),
    ("category index", [0.5] * 8, 4, "action 0"),
    ("negative category", [0.5] * 8, -1, "action 0"),
    ("unknown action", [0.5] * 8, "category 0", "action 9"),
    ("action index", [0.5] * 8, "category 0", 4),
    ("bool action", [0.5] * 8, "category 0", True),
]


BAD_CALLS = [("learn_one", case) for case in BAD_ONE] + [("score_one", case) for case in BAD_ONE
                                                           if "action" not in case[0]]


@pytest.mark.parametrize("method,case", BAD_CALLS, ids=[f"{method}-{case[0]}" for method, case in BAD_CALLS])
def test_bad_input_raises_the_checked_error_and_changes_nothing(method, case):
    what, factors, category, action = case
    memory = make(capacity=20, scoped=True)
    stream = clustered_stream(8, 30)
    memory.learn_(stream.x, stream.category, stream.action)
    reference, before = checked(memory), copy.deepcopy(memory)
    arguments = (factors, category) if method == "score_one" else (factors, action, category)
    try:
        expected = getattr(reference, method)(*arguments)
    except (TypeError, ValueError) as error:
        with pytest.raises(type(error)) as raised:
            getattr(memory, method)(*arguments)
        assert str(raised.value) == str(error)
        assert_same(memory, before)
    else:  # accepted (a bool action is the index 1): then exactly as the checked path
        assert getattr(memory, method)(*arguments) == expected and what == "bool action"
        assert_same(memory, reference)


@pytest.mark.parametrize("method", ["score_one", "learn_one"])
def test_values_the_store_refuses_raise_the_checked_error(method):
    """A query that overflows float32 (a huge centre) or, to be learned, factors beyond the learning
    limit: the compiled path leaves them to the checked path, which names them."""
    overflowing = make(capacity=20, center=-3.4e38)  # it can learn nothing; an empty store scores nothing
    beyond = make(capacity=20)
    beyond.learn_(torch.rand(10, FACTORS), torch.zeros(10, dtype=torch.long), torch.zeros(10, dtype=torch.long))
    for memory, factors in ((overflowing, [3.4e38] * 8), (beyond, [2e15] * 8)):
        reference, before = checked(memory), copy.deepcopy(memory)
        arguments = (factors, "category 0") if method == "score_one" else (factors, "action 0", "category 0")
        try:
            expected = getattr(reference, method)(*arguments)
        except ValueError as error:
            with pytest.raises(ValueError) as raised:
                getattr(memory, method)(*arguments)
            assert str(raised.value) == str(error) and method == "learn_one"
            assert_same(memory, before)
        else:
            assert getattr(memory, method)(*arguments) == expected and method == "score_one"
            assert_same(memory, reference)


def test_copies_build_their_own_views():
    memory = make(capacity=20, scoped=True)
    stream = clustered_stream(9, 60)
    replay(memory, clustered_stream(9, 30))
    for clone in (copy.deepcopy(memory), pickle.loads(pickle.dumps(memory))):
        assert clone._host.held == ()
        replay(clone, stream)
        assert clone.version != memory.version
        views = clone._host.embeddings
        assert not np.shares_memory(views, memory.store.embeddings.numpy())
        assert memory.store.embeddings.data_ptr() not in {t.data_ptr() for t in clone._host.held}
    replay(memory, stream)
    assert_same(memory, clone)


def test_unusual_modules_take_the_checked_path(tmp_path):
    """A float64 memory and a store written through to SQLite answer and learn as the checked path does."""
    from gae.episodic import EpisodicMemory
    from gae.storage import SQLiteStore

    stream = clustered_stream(10, 80)
    for variant in ("double", "store"):
        memory, reference = make(capacity=20), make(capacity=20)
        reference.backend = "reference"
        if variant == "double":
            memory, reference = memory.double(), reference.double()
        else:
            for i, twin in enumerate((memory, reference)):
                twin.store = EpisodicMemory(FACTORS, 20, eviction="lowest_score", store=SQLiteStore(tmp_path / f"{i}"))
        step = reference.prequential_(stream.x, stream.category, stream.action)
        answers, _ = replay(memory, stream, skip_outcome=False)
        assert_answers(step, answers)
        assert memory.store.audit_log == reference.store.audit_log and memory.labels == reference.labels
        assert memory._host.held == () or variant == "store"
    assert len(memory.store.store.open(FACTORS).rows) == 20


def test_deletes_loads_and_new_actions_between_single_decisions():
    """The views follow the store through deletes, a load that replaces its tensors, a new action
    and a move of its data to shared memory."""
    stream = clustered_stream(11, 240)
    fast, reference, other = (make(capacity=20, scoped=True) for _ in range(3))
    reference.backend = "reference"
    other.learn_(stream.x[:12], stream.category[:12], stream.action[:12])  # 16 rows allocated, the others 32
    for part in range(4):
        piece = type(stream)(*(t[60 * part:60 * (part + 1)] for t in stream))
        assert replay(fast, piece) == replay(reference, piece)
        assert_same(fast, reference)
        for memory in (fast, reference):
            if part == 0:
                memory.delete(memory.store.column("ids")[:3].tolist())
            elif part == 1:
                memory.load_state_dict(other.state_dict())
            elif part == 2:
                memory.add_actions_(["action 4"])
    assert fast._host.embeddings.shape[0] == fast.store.embeddings.shape[0]
    fast.store.share_memory()  # the same tensors, their data moved (DecisionMemory._apply does not see it)
    piece = type(stream)(*(t[:30] for t in stream))
    assert replay(fast, piece) == replay(reference, piece)
    assert_same(fast, reference)
    assert np.shares_memory(fast._host.embeddings, fast.store.embeddings.numpy())


def test_an_unknown_label_and_a_nan_score_take_the_checked_path():
    stream = clustered_stream(12, 60)
    broken = make(capacity=20)
    broken.learn_(stream.x, stream.category, stream.action)
    broken.labels = {i: 7 for i in broken.labels}  # no such action: scatter_add_ refuses it
    with pytest.raises(RuntimeError) as expected:
        checked(broken).score_one(stream.x[0].numpy(), "category 0")
    with pytest.raises(RuntimeError) as raised:
        broken.score_one(stream.x[0].numpy(), "category 0")
    assert str(raised.value) == str(expected.value)
    huge = make(capacity=20, scoped=True)
    huge.learn_(stream.x, stream.category, stream.action)
    rows = huge.store.embeddings[:20]
    rows.copy_(rows.sign() * 3e38)  # a tampered state: similarities overflow, -inf + inf is NaN
    host = huge._host.get(huge)
    assert host is not None
    assert any(host.score(huge, x, c) is None for x, c in zip(stream.x.numpy(), stream.category.tolist(),
                                                                  strict=True))
    reference = checked(huge)
    for x, c, a in zip(stream.x[:20].numpy(), stream.category[:20].tolist(), stream.action[:20].tolist(),
                         strict=True):
        assert huge.score_one(x, c) == reference.score_one(x, c)
        assert huge.learn_one(x, a, c) == reference.learn_one(x, a, c)
    assert_same(huge, reference)


def test_views_built_in_inference_mode_work_outside_it():
    """(Learning in inference mode must not grow the store: its new tensors would be inference
    tensors, which the checked path cannot write outside it.)"""
    stream = clustered_stream(13, 120)
    trained = make(capacity=20)
    trained.learn_(stream.x[:40], stream.category[:40], stream.action[:40])
    memory, reference = copy.deepcopy(trained), checked(trained)
    with torch.inference_mode():
        middle = type(stream)(*(t[40:80] for t in stream))
        assert replay(memory, middle) == replay(reference, middle)
    rest = type(stream)(*(t[80:] for t in stream))
    assert replay(memory, rest) == replay(reference, rest)
    assert_same(memory, reference)
