"""One battery of checks applied to every memory."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, MEMORY_FACTORIES, clustered_stream


def feed(memory, stream, start=0, stop=None):
    sl = slice(start, stop)
    return memory.prequential_(stream.x[sl], stream.category[sl], stream.action[sl], skip=stream.skip[sl])


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], torch.Tensor):
            assert torch.equal(sa[key], sb[key]), key


def test_state_dict_round_trip_through_weights_only_load(memory_factory, stream):
    memory = memory_factory()
    feed(memory, stream, 0, 200)
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    restored = memory_factory()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert_same_state(memory, restored)
    # a restored memory continues exactly as the original would
    a, b = feed(memory, stream, 200), feed(restored, stream, 200)
    assert torch.equal(a.output.action, b.output.action) and torch.equal(a.output.probs, b.output.probs)
    assert_same_state(memory, restored)


def test_gate_log_survives_state_dict():
    stream = clustered_stream(0, 300, drift_at=150)
    memory = JudgmentMemory(4, 4, 8, config=JudgmentConfig.seed())
    feed(memory, stream)
    restored = JudgmentMemory(4, 4, 8, config=JudgmentConfig.seed())
    restored.load_state_dict(memory.state_dict())
    assert len(memory.gate_log.step) > 0
    for a, b in zip(memory.gate_log, restored.gate_log, strict=True):
        assert torch.equal(a, b)


def test_deepcopy_is_independent(memory_factory, stream):
    memory = memory_factory()
    feed(memory, stream, 0, 100)
    twin = copy.deepcopy(memory)
    assert_same_state(memory, twin)
    feed(twin, stream, 100)
    assert not torch.equal(memory.num_decisions, twin.num_decisions)
    feed(memory, stream, 100)
    assert_same_state(memory, twin)


def test_to_converts_state_and_keeps_results(memory_factory, stream):
    memory = memory_factory()
    feed(memory, stream, 0, 150)
    moved = copy.deepcopy(memory).to("cpu").to(torch.float64)
    float_state = [t for t in moved.state_dict().values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert float_state and all(t.dtype == torch.float64 for t in float_state)
    with torch.no_grad():
        fa, fb = memory(stream.x, stream.category), moved(stream.x, stream.category)
    assert torch.equal(fa.action, fb.action)
    if isinstance(memory, JudgmentMemory):  # the online rule is float32 by design: refused, loudly
        with pytest.raises(TypeError, match="learns in float32"):
            feed(moved, stream, 150)
        return
    a, b = feed(memory, stream, 150), feed(moved, stream, 150)
    assert torch.equal(a.output.action, b.output.action)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_module_matches_cpu(memory_factory, stream):
    cpu, gpu = memory_factory(), memory_factory().cuda()
    a = feed(cpu, stream)
    b = gpu.prequential_(stream.x.cuda(), stream.category.cuda(), stream.action.cuda(), skip=stream.skip.cuda())
    assert torch.equal(a.output.action, b.output.action.cpu())
    with torch.no_grad():
        fa, fb = cpu(stream.x, stream.category), gpu(stream.x.cuda(), stream.category.cuda())
    assert torch.equal(fa.action, fb.action.cpu())
    for (key, t), u in zip(cpu.state_dict().items(), gpu.state_dict().values(), strict=True):
        if isinstance(t, torch.Tensor):
            torch.testing.assert_close(t, u.cpu(), msg=key)


def test_learning_builds_no_graph(memory_factory, stream):
    memory = memory_factory()
    x = stream.x.clone().requires_grad_()
    step = memory.prequential_(x, stream.category, stream.action, skip=stream.skip)
    assert all(not t.requires_grad for t in step.output) and all(not t.requires_grad for t in step.events)
    assert all(not b.requires_grad for b in memory.buffers())
    assert all(p.grad is None for p in memory.parameters())


def test_inputs_are_not_mutated(memory_factory, stream):
    memory = memory_factory()
    before = [t.clone() for t in stream]
    feed(memory, stream)
    with torch.no_grad():
        memory(stream.x, stream.category)
    for a, b in zip(before, stream, strict=True):
        assert torch.equal(a, b)


def test_same_seed_same_result(memory_factory):
    runs = []
    for _ in range(2):
        memory = memory_factory()
        stream = clustered_stream(7, 250)
        runs.append((feed(memory, stream), memory))
    assert torch.equal(runs[0][0].output.probs, runs[1][0].output.probs)
    assert_same_state(runs[0][1], runs[1][1])


def test_names_round_trip():
    names = dict(categories=["invoice", "refund"], actions=["approve", "review", "reject"], factors=["amount", "age"])
    memory = JudgmentMemory(**names, config=JudgmentConfig.seed())
    memory.learn_one([0.2, 0.9], "review", "refund")
    restored = JudgmentMemory(**names, config=JudgmentConfig.seed())
    restored.load_state_dict(memory.state_dict())
    assert restored.score_one([0.2, 0.9], "refund") == memory.score_one([0.2, 0.9], "refund") == ("review", 1.0)
    assert restored.gate_records() == memory.gate_records()
    knn = KNNMemory(factors=["amount", "age"], actions=names["actions"], k=1, categories=names["categories"],
                    scoped=True)
    knn.learn_one([0.2, 0.9], "reject", "refund")
    assert knn.score_one([0.2, 0.9], "refund") == ("reject", 1.0)
    assert knn.score_one([0.2, 0.9], "invoice") == (None, 0.0)


@pytest.mark.parametrize("cls,kwargs", [(JudgmentMemory, {"categories": ["a", "b"], "actions": 2, "factors": 2}),
                                        (KNNMemory, {"categories": ["a", "b"], "actions": 2, "factors": 2})])
def test_loading_state_with_other_names_is_refused_and_changes_nothing(cls, kwargs):
    source = cls(**kwargs)
    source.learn_one([0.5, 0.5], 1, "a")
    target = cls(**{**kwargs, "categories": ["a", "c"]})
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ValueError, match="category_names"):
        target.load_state_dict(source.state_dict())
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, target.state_dict()[key])


# -- the models' surface a Decider and an agent build on, on every memory ----------------------
BATTERY = dict(MEMORY_FACTORIES)
try:  # the drift-aware k-NN of the head-to-head (river's ADWIN): a KNNMemory whose window a detector cuts
    from training.knn_adwin import ADWINKNNMemory

    BATTERY["knn_adwin"] = lambda: ADWINKNNMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=50,
                                                  categories=CATEGORIES)
except ImportError:  # pragma: no cover - river is in the dev extra
    pass


@pytest.fixture(params=sorted(BATTERY))
def any_memory(request):
    return BATTERY[request.param]


def cases(stream, n=12):
    """A few decisions as an agent holds them: a list of floats and an int category."""
    return [(stream.x[i].tolist(), int(stream.category[i])) for i in range(n)]


def test_assess_one_is_forward_one_decision_at_a_time(any_memory, stream):
    """The single-decision path behind decide (``assess_one``) answers what the batched ``forward``
    answers: the action, the confidence, every probability (to float32 rounding), and keeps the
    factors as checked float64 rows of their own."""
    memory = any_memory()
    feed(memory, stream, 0, 150)
    for row, c in cases(clustered_stream(3, 20)):
        assessed = memory.assess_one(row, c)
        with torch.no_grad():
            out = memory(torch.tensor([row]), torch.tensor([c]))
        assert assessed.action == int(out.action[0])
        assert assessed.confidence == pytest.approx(float(out.confidence[0]), abs=1e-6)
        assert assessed.probs == pytest.approx(out.probs[0].tolist(), abs=1e-6)
        assert assessed.row.dtype == np.float64 and assessed.row.tolist() == row
        assessed.row[0] += 1  # a copy: what a Decider keeps is its own
        assert memory.assess_one(row, c).row.tolist() == row


def test_inspect_one_is_its_torch_reference(any_memory, stream):
    """What a memory's state says of a case (novelty, support, change, trust) on the fast path
    equals the plain torch computation on the buffers."""
    from gae.judgment import primitives, trust

    memory = any_memory()
    feed(memory, stream, 0, 200)
    for row, c in cases(clustered_stream(5, 20)):
        state = memory.inspect_one(row, c)
        if not isinstance(memory, JudgmentMemory):
            assert not memory.inspects and state.trust is None and state.support == 0
            continue
        config = memory.config
        if config.learning == "lvq":
            expected = primitives.novelty(torch.tensor(row, dtype=torch.float64), memory.centroids[c],
                                          memory.initialized[c], memory.input_variances[c])
            assert state.novelty == pytest.approx(float(expected), rel=1e-9)
            assert state.support == int(memory.input_counts[c])
        else:
            assert state.novelty != state.novelty and state.support == 0  # nan: no spread kept
        if config.adaptive:
            threshold = config.drift.promotion_threshold
            assert state.change == pytest.approx(float(memory.promotion_statistic[c]) / threshold)
        if config.judges:
            assert state.trust == pytest.approx(trust.weights_of(memory.trust_weights)[c].tolist())
            assert memory.trust_one(c) == state.trust
        else:
            assert state.trust is None


def test_empty_like_has_the_settings_and_learns_alike(any_memory, stream):
    memory = any_memory()
    feed(memory, stream, 0, 120)
    blank = memory.empty_like()
    assert type(blank) is type(memory) and blank.settings() == memory.settings()
    assert (blank.category_names, blank.action_names, blank.factor_names) == \
        (memory.category_names, memory.action_names, memory.factor_names)
    assert blank.next_seq == 0 and memory.next_seq == 120
    twin = memory.empty_like()
    feed(blank, stream, 0, 120)
    feed(twin, stream, 0, 120)
    assert_same_state(blank, twin)


def test_explain_answers_for_one_decision_and_a_batch(any_memory, stream):
    memory = any_memory()
    feed(memory, stream, 0, 150)
    row, c = cases(stream, 1)[0]
    one = memory.explain(row, c)
    batch = memory.explain(stream.x[:3], stream.category[:3])
    assert one is not None and batch is not None
    if not isinstance(memory, JudgmentMemory):  # the neighbours the vote comes from
        assert one.ids.shape == (1, memory.k) and batch.ids.shape == (3, memory.k)


def test_a_refused_decision_changes_nothing(any_memory, stream):
    memory = any_memory()
    feed(memory, stream, 0, 100)
    before = copy.deepcopy(memory.state_dict())
    for bad in ([float("nan")] * FACTORS, [1e16] * FACTORS, [0.5] * (FACTORS + 1), ["a"] * FACTORS):
        with pytest.raises((ValueError, TypeError)):
            memory.learn_one(bad, 0, 0)
        with pytest.raises((ValueError, TypeError)):
            memory.assess_one(bad, 0)
    with pytest.raises((ValueError, TypeError)):
        memory.learn_one([0.5] * FACTORS, 0, 0, source_id=-1)
    after = memory.state_dict()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key


def test_serving_is_the_deciders_and_the_old_calls_say_so(any_memory):
    memory = any_memory()
    for name in ("decide", "verify", "pending", "explain_decision", "referral", "max_pending"):
        with pytest.raises(AttributeError, match=r"moved to gae\.Decider"):
            getattr(memory, name)
    factory = type(memory)
    with pytest.raises(TypeError, match=r"Decider\("):
        if factory is JudgmentMemory:
            factory(CATEGORIES, ACTIONS, FACTORS, store=object())
        else:
            factory(factors=FACTORS, actions=ACTIONS, store=object())


# ---------------------------------------------------------------------------------------
# the same contract for the episodic memory (a store of embedded traces, in RAM or on SQLite)
# ---------------------------------------------------------------------------------------
def episodic_memory(tmp_path=None):
    from gae import EpisodicMemory
    from gae.storage import SQLiteStore

    store = None if tmp_path is None else SQLiteStore(tmp_path / "episodic.db")
    return EpisodicMemory(4, capacity=20, eviction="importance_recency", store=store)


def fill(memory, seed=0, n=30):
    """``n`` traces added a few at a time (past capacity: evictions), a delete and an expiry."""
    g = torch.Generator().manual_seed(seed)
    for start in range(0, n, 5):
        embeddings = torch.nn.functional.normalize(torch.randn(5, 4, generator=g), dim=-1)
        memory.add(embeddings, torch.rand(5, generator=g), now=float(start),
                   scope=["alice", "bob"][start % 2], valid_until=float(100 + 2 * start))
    memory.delete([int(memory.column("ids")[0])], now=float(n))
    memory.expire(float(n + 90))
    return memory


def answers(memory, now=125.0):
    """Six queries' top 3 (ids and scores) at ``now``, when some traces are still valid."""
    queries = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(9)), dim=-1)
    got = memory.retrieve(queries, now=now, k=3)
    assert (got.ids >= 0).any()  # (an answer of nothing would hold every comparison trivially)
    return got.ids.tolist(), got.scores.tolist()


@pytest.mark.parametrize("on_store", [False, True], ids=["ram", "sqlite"])
def test_episodic_memory_keeps_the_modules_contract(tmp_path, on_store):
    """State round trip through a weights-only load, an independent deep copy, ``to`` keeping the
    answers, inputs not mutated, a refused call changing nothing, and (on a store) a memory
    reopened on it the same."""
    from gae import EpisodicMemory

    memory = fill(episodic_memory(tmp_path if on_store else None))
    expected = answers(memory)

    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    loaded = EpisodicMemory(4, capacity=20, eviction="importance_recency")
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    assert answers(loaded) == expected and loaded.version == memory.version

    twin = copy.deepcopy(loaded)
    twin.add(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), 1.0, now=150.0)
    assert answers(loaded) == expected and len(twin) == len(loaded) + 1

    moved = copy.deepcopy(loaded).to(torch.float64)
    assert answers(moved)[0] == answers(loaded)[0]

    embeddings = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    kept = embeddings.clone()
    memory.add(embeddings, 0.5, now=160.0)
    assert torch.equal(embeddings, kept)  # normalized into the memory, not in place
    expected, version = answers(memory), memory.version

    before = copy.deepcopy(memory.state_dict())
    for bad in (dict(embeddings=torch.full((1, 4), float("nan")), importance=0.5),
                dict(embeddings=torch.ones(1, 5), importance=0.5),
                dict(embeddings=torch.ones(1, 4), importance=1.5)):
        with pytest.raises((ValueError, TypeError)):
            memory.add(bad["embeddings"], bad["importance"], now=170.0)
    with pytest.raises((ValueError, TypeError, KeyError)):
        memory.delete([10**6], now=170.0)
    after = memory.state_dict()
    assert memory.version == version and answers(memory) == expected
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key

    if on_store:  # the store is the source of truth: a memory built on it is the same memory
        memory.store.close()
        reopened = episodic_memory(tmp_path)
        assert answers(reopened) == expected and reopened.version == version
        reopened.store.close()
