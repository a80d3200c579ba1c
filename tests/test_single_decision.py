"""The single-decision path (score_one / learn_one / prequential_ of one) against the batched engine.

A run of single decisions must end bit for bit where one batched call over the same decisions
ends: state, decision log, event logs, version and outputs, also between attention steps,
undo, forget, loads and copies. The batched calls take the checked engine (private copies, one
kernel call over the batch), which the single-decision path must never differ from.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, clustered_stream, make_judgment

MODES = {
    "seed": {},
    "options": {"clip": (0.0, 1.0), "push_rate": 0.02, "min_confidence": 0.3},
    "adaptive": {"drift_mode": "adaptive"},
    "prototypes": {"prototypes": 3, "spawn_threshold": 0.3},
    "adaptive_prototypes": {"drift_mode": "adaptive", "prototypes": 3, "spawn_threshold": 0.3, "push_rate": 0.02},
    "lvq": {"learning": "lvq", "prototypes": 3, "push_rate": 0.5, "relevance_rate": 0.05, "clip": (0.0, 1.0),
            "miss_penalty": 0.5},
}
NAMES = ([f"category {i}" for i in range(CATEGORIES)], [f"action {i}" for i in range(ACTIONS)])


def tensors(memory) -> dict[str, torch.Tensor]:
    return {k: v for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}


def assert_same_logs(a: JudgmentMemory, b: JudgmentMemory) -> None:
    left, right = a.decision_log.events(), b.decision_log.events()
    for key in left:
        assert torch.equal(left[key], right[key]), key
    for name in ("gate_log", "promotion_log", "recycle_log"):
        for field, x, y in zip(getattr(a, name)._fields, getattr(a, name), getattr(b, name), strict=True):
            assert torch.equal(x, y), (name, field)
    assert a.version == b.version


def assert_same(a, b) -> None:
    left, right = tensors(a), tensors(b)
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def flags(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which decisions have a given confirmed flag (the others are derived) and the flags."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=gen) < 0.5, torch.rand(n, generator=gen) < 0.7


@pytest.mark.parametrize("mode", sorted(MODES))
def test_ten_thousand_single_decisions_equal_one_batched_call(mode):
    n = 10_000
    stream = clustered_stream(3, n, drift_at=n // 2, skip_rate=0.05)
    given, confirmed = flags(n, 3)
    batched = JudgmentMemory(*NAMES, FACTORS, JudgmentConfig.seed(), **MODES[mode])
    single = JudgmentMemory(*NAMES, FACTORS, JudgmentConfig.seed(), **MODES[mode])
    # the batched call: given flags where given, derived elsewhere, in one call
    used = torch.where(given, confirmed, torch.zeros_like(confirmed))
    step = batched._prequential(*batched._check_stream(stream.x, stream.category, stream.action, used, stream.skip),
                                given=given)
    answers, results = [], []
    x = stream.x.numpy()
    for i in range(n):
        category, action = NAMES[0][int(stream.category[i])], NAMES[1][int(stream.action[i])]
        answers.append(single.score_one(x[i], category))
        flag = bool(confirmed[i]) if bool(given[i]) else None
        results.append(single.learn_one(x[i], action, category, flag,
                                        "__incorrect__" if bool(stream.skip[i]) else None))
    assert_same(batched, single)
    assert_same_logs(batched, single)
    names = [None if int(a) < 0 else NAMES[1][int(a)] for a in step.output.action]
    assert [answer for answer, _ in answers] == names
    torch.testing.assert_close(torch.tensor([c for _, c in answers]), step.output.confidence, rtol=1e-6, atol=1e-7)
    events = step.events
    for i, result in enumerate(results):
        if bool(events.skipped[i]):
            assert result == {"skipped": True}
        else:
            assert result == {"skipped": False, "gated": bool(events.gated[i]), "eta": float(events.eta[i]),
                              "disp": float(events.displacement[i]), "initialized": bool(events.initialized[i])}


@pytest.mark.parametrize("mode", ["seed", "adaptive_prototypes"])
def test_prequential_of_one_decision_returns_what_the_batched_call_returns(mode):
    n = 600
    stream = clustered_stream(4, n, drift_at=300)
    given, confirmed = flags(n, 4)
    batched, single = make_judgment(**MODES[mode]), make_judgment(**MODES[mode])
    whole = batched.prequential_(stream.x, stream.category, stream.action, confirmed, stream.skip)
    steps = [single.prequential_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1],
                                 confirmed[i:i + 1], stream.skip[i:i + 1]) for i in range(n)]
    for name in ("sq_diff", "nearest", "before"):
        assert torch.equal(getattr(whole, name), torch.cat([getattr(s, name) for s in steps])), name
    for part in ("output", "events"):
        for field, x in zip(getattr(whole, part)._fields, getattr(whole, part), strict=True):
            assert torch.equal(x, torch.cat([getattr(getattr(s, part), field) for s in steps])), (part, field)
    assert_same(batched, single)
    assert_same_logs(batched, single)


@pytest.mark.parametrize("mode", ["seed", "adaptive", "prototypes"])
def test_single_decisions_mixed_with_everything_else_match_batched_calls(mode):
    """Runs of single decisions between batched calls, attention steps, undo, forget, a
    checkpoint round trip and copies, against a memory that learns each run in one batched call."""
    stream = clustered_stream(5, 900, drift_at=450)
    fast, slow = make_judgment(**MODES[mode]), make_judgment(**MODES[mode])
    optimizers = [torch.optim.SGD([m.criterion_logits], lr=0.5) for m in (fast, slow)]

    def learn(memory, lo, hi):
        if memory is slow:  # the whole run in one checked batched call
            memory.prequential_(stream.x[lo:hi], stream.category[lo:hi], stream.action[lo:hi], None,
                                stream.skip[lo:hi])
            return
        for i in range(lo, hi):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]), None,
                             "__incorrect__" if bool(stream.skip[i]) else None)

    def step_attention(memory, optimizer, lo, hi):
        step = memory.prequential_(stream.x[lo:hi], stream.category[lo:hi], stream.action[lo:hi])
        loss = memory.attention_loss(step, stream.category[lo:hi], stream.action[lo:hi])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for memory, optimizer in zip((fast, slow), optimizers, strict=True):
        learn(memory, 0, 200)
        step_attention(memory, optimizer, 200, 260)  # logs the staged decisions first, then this call
        learn(memory, 260, 400)  # under the new attention
        with torch.no_grad():
            memory.criterion_logits.add_(0.1)
        learn(memory, 400, 401)  # an attention change between single decisions ends the staged run
        with torch.no_grad():
            memory.criterion_logits.add_(0.1)
        learn(memory, 401, 500)
        memory.undo_(7)
        learn(memory, 500, 600)
        memory.forget_([3, 250, 480, 550])
    assert_same(fast, slow)
    assert_same_logs(fast, slow)
    assert torch.equal(fast.criterion_logits, slow.criterion_logits)

    learn(fast, 600, 650)  # staged when the state is saved and copied
    restored = make_judgment(**MODES[mode])
    restored.load_state_dict(fast.state_dict())
    twin = copy.deepcopy(fast)
    pickled = pickle.loads(pickle.dumps(fast))
    learn(slow, 600, 650)
    learn(slow, 650, 900)
    for memory in (fast, restored, twin, pickled):
        learn(memory, 650, 900)
        assert_same(memory, slow)
        assert_same_logs(memory, slow)


@pytest.mark.parametrize("max_log_events", [1, 5, 9])
def test_a_staged_batch_of_one_row_returns_what_the_batch_returns(max_log_events):
    stream = clustered_stream(12, 60)
    fast, slow = make_judgment(max_log_events=max_log_events), make_judgment(max_log_events=max_log_events)
    whole = slow.prequential_(stream.x, stream.category, stream.action)
    steps = [fast.prequential_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1])
             for i in range(60)]
    assert torch.equal(torch.cat([s.events.eta for s in steps]), whole.events.eta)
    assert torch.equal(torch.cat([s.output.probs for s in steps]), whole.output.probs)
    results = [make_judgment(max_log_events=max_log_events).learn_one(stream.x[0].numpy(), 1, 1)]
    assert results[0]["initialized"]
    assert_same(fast, slow)


def test_the_staged_run_folds_into_a_bounded_log():
    stream = clustered_stream(6, 1000)
    fast, slow = make_judgment(max_log_events=40), make_judgment(max_log_events=40)
    for i in range(1000):
        fast.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    slow.prequential_(stream.x, stream.category, stream.action, torch.ones(1000, dtype=torch.bool))
    assert len(fast.decision_log) <= 40 < 1000
    assert_same(fast, slow)
    undone = copy.deepcopy(fast)
    undone.undo_(5)  # the staged run was folded into the log's base: undo replays from there
    fresh = make_judgment()
    fresh.prequential_(stream.x[:995], stream.category[:995], stream.action[:995], torch.ones(995, dtype=torch.bool))
    for key, value in tensors(fresh).items():
        if key != "num_decisions":
            assert torch.equal(value, tensors(undone)[key]), key


def test_bad_single_decisions_change_nothing_and_keep_the_staged_ones():
    memory = make_judgment(drift_mode="adaptive")
    stream = clustered_stream(7, 50)
    for i in range(30):
        memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    assert memory.history.staged is not None and memory.history.staged.n == 30
    snapshot, version = copy.deepcopy(memory), memory.version
    bad = [([float("nan")] * FACTORS, 0, 0, ValueError), ([1e300] * FACTORS, 0, 0, ValueError),
           ([0.5] * (FACTORS - 1), 0, 0, ValueError), ([0.5] * FACTORS, 9, 0, ValueError),
           ([0.5] * FACTORS, "nope", 0, ValueError), ([0.5] * FACTORS, 0, 9, ValueError),
           (np.full(FACTORS, 1 + 1j), 0, 0, TypeError), ("abc", 0, 0, TypeError)]
    for factors, action, category, error in bad:
        with pytest.raises(error):
            memory.learn_one(factors, action, category)
    with pytest.raises(TypeError):
        memory.learn_one([0.5] * FACTORS, 0, 0, confirmed="yes")
    assert memory.version == version and memory.history.staged.n == 30
    assert_same(memory, snapshot)
    assert_same_logs(memory, snapshot)
    for factors, _, _, error in bad[:2]:  # not finite, beyond float32
        with pytest.raises(error):
            memory.score_one(factors, 0)


def test_inputs_a_user_passes_take_the_fast_path_or_the_checked_one_with_the_same_result():
    stream = clustered_stream(8, 200)
    memory, reference = make_judgment(), make_judgment()
    for i in range(200):
        row = stream.x[i]
        as_given = [row, row.numpy(), row.tolist(), row.double().numpy(), row.numpy()[None, :][0]][i % 5]
        memory.learn_one(as_given, int(stream.action[i]), np.int64(stream.category[i]) if i % 7 == 0
                         else int(stream.category[i]))
    reference.prequential_(stream.x, stream.category, stream.action, torch.ones(200, dtype=torch.bool))
    assert_same(memory, reference)
    strided = np.repeat(stream.x[:1].numpy(), 2, axis=0).T[:, 0]  # a non-contiguous view
    assert memory.score_one(strided, 1) == reference.score_one(stream.x[0], 1)
    assert memory.score_one(np.arange(FACTORS), 2) == reference.score_one(torch.arange(FACTORS).float(), 2)


def test_the_views_follow_the_memory_when_its_tensors_are_replaced():
    stream = clustered_stream(9, 300)
    memory, reference = make_judgment(), make_judgment()
    for i in range(100):
        memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    reference.prequential_(stream.x[:100], stream.category[:100], stream.action[:100],
                           torch.ones(100, dtype=torch.bool))
    memory.double()  # float64 buffers: learning refuses, scoring takes the checked path (in float64)
    with pytest.raises(TypeError, match="float32"):
        memory.learn_one(stream.x[100].numpy(), 0, 0)
    answer, expected = memory.score_one(stream.x[100].numpy(), 1), reference.score_one(stream.x[100].numpy(), 1)
    assert answer[0] == expected[0] and answer[1] == pytest.approx(expected[1], rel=1e-6)
    memory.float()
    memory.centroids = memory.centroids.clone()  # an assignment replaces the buffer
    for i in range(100, 300):
        memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    reference.prequential_(stream.x[100:], stream.category[100:], stream.action[100:],
                           torch.ones(200, dtype=torch.bool))
    assert_same(memory, reference)


def test_the_views_are_built_again_when_a_conversion_moves_the_data():
    stream = clustered_stream(13, 300)
    for make in (make_judgment, lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, categories=CATEGORIES)):
        memory, reference = make(), make()
        for i in range(150):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
        pointer = next(memory.buffers()).data_ptr()
        memory.share_memory()  # moves every tensor's data into shared memory, the tensors stay the same objects
        assert next(memory.buffers()).data_ptr() != pointer
        for i in range(150, 300):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
        reference.prequential_(stream.x, stream.category, stream.action, torch.ones(300, dtype=torch.bool))
        assert_same(memory, reference)


def test_an_array_table_holds_c_contiguous_arrays_only():
    from gae.compiled import ArrayTable

    table = ArrayTable([np.zeros((2, 3), np.float32), np.zeros((), np.int64)])
    assert table.shapes.tolist() == [[2, 3, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"C-contiguous arrays of rank <= 4, got shape \(3, 2\)"):
        ArrayTable([np.zeros((2, 3), np.float32).T])


@pytest.mark.parametrize("options", [{}, {"scoped": True, "respect_skip": True}, {"capacity": 20, "k": 3}])
def test_knn_single_decisions_equal_the_batched_engine(options):
    n = 3000
    stream = clustered_stream(10, n, skip_rate=0.1)
    batched = KNNMemory(factors=FACTORS, actions=ACTIONS, categories=CATEGORIES, **options)
    single = KNNMemory(factors=FACTORS, actions=ACTIONS, categories=CATEGORIES, **options)
    step = batched.prequential_(stream.x, stream.category, stream.action, None, stream.skip)
    answers = []
    for i in range(n):
        answers.append(single.score_one(stream.x[i].numpy(), int(stream.category[i])))
        result = single.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]), None,
                                  "__incorrect__" if bool(stream.skip[i]) else None)
        assert result["skipped"] == bool(step.events.skipped[i])
    assert_same(batched, single)
    assert [a for a, _ in answers] == [None if int(a) < 0 else str(int(a)) for a in step.output.action]
    assert torch.equal(torch.tensor([c for _, c in answers], dtype=torch.float32), step.output.confidence)
    with pytest.raises(ValueError):
        single.learn_one([float("inf")] * FACTORS, 0, 0)
    assert_same(batched, single)
    ones = KNNMemory(factors=FACTORS, actions=ACTIONS, categories=CATEGORIES, **options)  # prequential_ of one decision
    steps = [ones.prequential_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1], None,
                               stream.skip[i:i + 1]) for i in range(n)]
    assert_same(batched, ones)
    for part in ("output", "events", "retrieved"):
        for field, x in zip(getattr(step, part)._fields, getattr(step, part), strict=True):
            if x is not None:
                assert torch.equal(x, torch.cat([getattr(getattr(s, part), field) for s in steps])), (part, field)


# -- growing vocabularies ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["seed", "adaptive", "prototypes"])
def test_a_grown_memory_equals_one_built_with_every_name(mode):
    stream = clustered_stream(11, 800, drift_at=400)
    early = (stream.category < 2) & (stream.action < 3)
    full = JudgmentMemory(*NAMES, FACTORS, JudgmentConfig.seed(), **MODES[mode])
    grown = JudgmentMemory(NAMES[0][:2], NAMES[1][:3], FACTORS, JudgmentConfig.seed(), grow=True, **MODES[mode])
    order = torch.cat([early.nonzero().squeeze(1), (~early).nonzero().squeeze(1)])
    for memory in (full, grown):
        for i in order.tolist():
            memory.learn_one(stream.x[i].numpy(), NAMES[1][int(stream.action[i])],
                             NAMES[0][int(stream.category[i])])
    assert grown.action_names == full.action_names and grown.category_names == full.category_names
    for key, value in tensors(full).items():
        assert torch.equal(value, tensors(grown)[key]), key
    events_full, events_grown = full.decision_log.events(), grown.decision_log.events()
    for key in events_full:
        assert torch.equal(events_full[key], events_grown[key]), key
    # what was learned before the growth can be forgotten: the replay starts from the grown base
    for memory in (full, grown):
        memory.forget_(order[:50].tolist())
    for key, value in tensors(full).items():
        assert torch.equal(value, tensors(grown)[key]), key
    restored = JudgmentMemory(*NAMES, FACTORS, JudgmentConfig.seed(), **MODES[mode])
    restored.load_state_dict(grown.state_dict())
    restored.undo_(3)
    grown.undo_(3)
    assert_same(restored, grown)


def test_growing_keeps_the_attention_and_refuses_bad_names():
    memory = JudgmentMemory(["a", "b"], ["x", "y"], 3, config=JudgmentConfig.seed())
    with torch.no_grad():
        memory.criterion_logits.copy_(torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    memory.learn_one([0.1, 0.2, 0.3], "x", "a")
    snapshot, version = copy.deepcopy(memory), memory.version
    for names, error in ((["x"], ValueError), (["z", "z"], ValueError), ([], ValueError), ([""], TypeError),
                         ([3], TypeError), (None, TypeError)):
        with pytest.raises(error):
            memory.add_actions_(names)
        with pytest.raises(error):
            memory.add_categories_(names if names != ["x"] else ["a"])
    assert memory.version == version
    assert_same(memory, snapshot)
    parameter = memory.criterion_logits
    memory.add_categories_("c")
    memory.add_actions_(["z", "w"])
    assert memory.criterion_logits is parameter  # optimizers keep the same object (their state must be rebuilt)
    assert memory.criterion_logits.shape == (3, 3) and torch.equal(memory.criterion_logits[2], torch.zeros(3))
    assert torch.equal(memory.criterion_logits[:2], snapshot.criterion_logits)
    assert memory.centroids.shape == (3, 4, 1, 3) and memory.version == version + 2
    assert memory.score_one([0.1, 0.2, 0.3], "c") == (None, 0.0)
    assert memory.learn_one([0.9, 0.9, 0.9], "w", "c")["initialized"]
    assert memory.score_one([0.9, 0.9, 0.9], "c")[0] == "w"
    with pytest.raises(ValueError, match="unknown action 'new'"):
        memory.learn_one([0.1, 0.2, 0.3], "new", "a")  # grow=False


def test_grow_true_learns_names_on_first_sight():
    memory = JudgmentMemory(["general"], ["first"], 2, config=JudgmentConfig.seed(), grow=True, drift_mode="adaptive")
    assert memory.score_one([0.5, 0.5], "unseen") == (None, 0.0)  # scoring does not add names
    with pytest.raises(ValueError, match="factors"):
        memory.score_one([float("nan"), 0.5], "unseen")
    assert memory.category_names == ("general",)
    memory.learn_one([0.1, 0.1], "first", "general")
    memory.learn_one([0.9, 0.9], "second", "general")
    memory.learn_one([0.5, 0.5], "first", "elsewhere")
    assert memory.action_names == ("first", "second") and memory.category_names == ("general", "elsewhere")
    assert memory.score_one([0.85, 0.9], "general")[0] == "second"
    with pytest.raises(ValueError):
        memory.learn_one([float("nan"), 0.0], "third", "general")
    assert memory.action_names == ("first", "second")  # a rejected call adds no name


def test_knn_grows_names_only():
    memory = KNNMemory(factors=2, actions=["x"], k=1, categories=["a"], scoped=True, grow=True)
    memory.learn_one([0.1, 0.2], "y", "b")
    assert memory.action_names == ("x", "y") and memory.category_names == ("a", "b")
    assert memory.score_one([0.1, 0.2], "b") == ("y", 1.0)
    assert memory.score_one([0.1, 0.2], "a") == (None, 0.0)
    unscoped = KNNMemory(factors=2, actions=["x"], k=1)
    with pytest.raises(ValueError, match="ignores categories"):
        unscoped.add_categories_(["b"])


def test_a_buffer_moved_into_shared_memory_alone_is_seen_before_the_next_decision():
    stream = clustered_stream(14, 300)
    for make in (lambda: make_judgment(drift_mode="adaptive"),
                 lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, categories=4)):
        memory, reference = make(), make()
        for i in range(150):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
        for tensor in memory.buffers():  # Tensor.share_memory_ moves the data and frees the old block
            tensor.share_memory_()
        for i in range(150, 300):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
            memory.score_one(stream.x[i].numpy(), int(stream.category[i]))
        reference.prequential_(stream.x, stream.category, stream.action, torch.ones(300, dtype=torch.bool))
        assert_same(memory, reference)


def test_buffers_loaded_in_another_integer_dtype_take_the_checked_path():
    stream = clustered_stream(15, 200)
    memory, reference = make_judgment(), make_judgment()
    state = memory.state_dict()
    state["counts"], state["num_decisions"] = state["counts"].int(), state["num_decisions"].int()
    memory.load_state_dict(state, assign=True)
    assert memory.counts.dtype == torch.int32
    for i in range(200):
        memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    reference.prequential_(stream.x, stream.category, stream.action, torch.ones(200, dtype=torch.bool))
    for key, value in tensors(reference).items():
        assert torch.equal(value, tensors(memory)[key].to(value.dtype)), key


def test_single_decisions_learned_in_inference_mode_log_outside_it():
    stream = clustered_stream(16, 40)
    memory, reference = make_judgment(), make_judgment()
    with torch.inference_mode():
        for i in range(20):
            memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    for i in range(20, 40):
        memory.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]))
    reference.prequential_(stream.x, stream.category, stream.action, torch.ones(40, dtype=torch.bool))
    assert_same_logs(memory, reference)
    memory.undo_(3)


def test_a_rejected_learn_one_adds_no_name():
    memory = JudgmentMemory(["general"], ["first", "second"], 2, config=JudgmentConfig.seed(), grow=True)
    version = memory.version
    with pytest.raises(ValueError, match="action index"):
        memory.learn_one([0.1, 0.2], 7, "vip")
    with pytest.raises(ValueError, match="category"):
        memory.learn_one([0.1, 0.2], "third", 99)
    assert memory.action_names == ("first", "second") and memory.category_names == ("general",)
    assert memory.version == version
    knn = KNNMemory(factors=2, actions=["x"], k=1, categories=["a"], scoped=True, grow=True)
    assert knn.score_one([0.1, 0.2], "unseen") == (None, 0.0)  # as a judgment memory: nothing learned there


def test_a_knn_that_ignores_categories_stores_an_int_category_as_the_checked_path_does():
    stream = clustered_stream(17, 100)
    fast, slow = KNNMemory(factors=FACTORS, actions=ACTIONS), KNNMemory(factors=FACTORS, actions=ACTIONS)
    for i in range(100):
        fast.learn_one(stream.x[i].numpy(), int(stream.action[i]), int(stream.category[i]) + 5)
    slow.prequential_(stream.x, stream.category + 5, stream.action)
    assert_same(fast, slow)
