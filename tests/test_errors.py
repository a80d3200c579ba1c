"""Every bad input is refused with a message naming the argument and the value, and changes nothing."""

from __future__ import annotations

import copy

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from tests.conftest import clustered_stream

GOOD = clustered_stream(0, 6)
X, C, A = GOOD.x, GOOD.category, GOOD.action


def with_nan(x, value):
    x = x.clone()
    x[2, 3] = value
    return x


BAD_STREAMS = [  # (x, category, action, confirmed, skip), error, words the message must contain
    ((with_nan(X, float("nan")), C, A, None, None), ValueError, ["x", "nan", "[2, 3]"]),
    ((with_nan(X, float("inf")), C, A, None, None), ValueError, ["x", "inf"]),
    ((X[:, :5], C, A, None, None), ValueError, ["x", "(6, 5)"]),
    ((X[0], C, A, None, None), ValueError, ["x", "(8,)"]),
    ((X.long(), C, A, None, None), TypeError, ["x", "torch.int64"]),
    ((X.tolist(), C, A, None, None), TypeError, ["x", "list"]),
    ((X[:0], C[:0], A[:0], None, None), ValueError, ["x", "empty"]),
    ((X, C.float(), A, None, None), TypeError, ["category", "torch.float32"]),
    ((X, C + 4, A, None, None), ValueError, ["category", "[0, 4)"]),
    ((X, C - 5, A, None, None), ValueError, ["category", "-"]),
    ((X, C[:3], A, None, None), ValueError, ["category", "(3,)"]),
    ((X, C, A + 9, None, None), ValueError, ["action", "[0, 4)"]),
    ((X, C, A.unsqueeze(1), None, None), ValueError, ["action", "(6, 1)"]),
    ((X, C, A, torch.ones(6), None), TypeError, ["confirmed", "torch.float32"]),
    ((X, C, A, None, torch.ones(5, dtype=torch.bool)), ValueError, ["skip", "(5,)"]),
]


def snapshot(memory):
    return copy.deepcopy(memory.state_dict())


def assert_unchanged(memory, before):
    after = memory.state_dict()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key


@pytest.mark.parametrize("args,error,words", BAD_STREAMS)
def test_bad_stream_is_refused_and_changes_nothing(memory_factory, args, error, words):
    memory = memory_factory()
    memory.learn_(GOOD.x, GOOD.category, GOOD.action)
    before = snapshot(memory)
    for call in (memory.prequential_, memory.learn_):
        with pytest.raises(error) as info:
            call(*args)
        for word in words:
            assert word in str(info.value), (word, str(info.value))
    assert_unchanged(memory, before)


@pytest.mark.parametrize("args,error,words", [case for case in BAD_STREAMS if case[0][2] is A and case[0][3] is None
                                              and case[0][4] is None])
def test_bad_query_is_refused(memory_factory, args, error, words):
    memory = memory_factory()
    with pytest.raises(error) as info:
        memory(*args[:2])
    assert all(word in str(info.value) for word in words), str(info.value)


def test_bad_batch_never_half_applies():
    """A bad value at the end of a batch must not let the earlier decisions land."""
    memory = JudgmentMemory(4, 4, 8, config=JudgmentConfig.seed())
    before = snapshot(memory)
    with pytest.raises(ValueError):
        memory.learn_(X, C, torch.tensor([0, 1, 2, 3, 0, 7]))
    assert_unchanged(memory, before)
    assert int(memory.num_decisions) == 0 and len(memory.gate_log.step) == 0


@pytest.mark.parametrize("cls", [JudgmentMemory, KNNMemory])
def test_single_decision_errors(cls):
    kwargs = dict(categories=["invoice", "refund"], actions=["approve", "reject"], factors=3)
    memory = (cls(**kwargs, config=JudgmentConfig.seed()) if cls is JudgmentMemory else
              cls(factors=3, actions=kwargs["actions"], k=1, categories=kwargs["categories"], scoped=True))
    memory.learn_one([0.1, 0.2, 0.3], "approve", "invoice")
    before = snapshot(memory)
    cases = [
        (lambda: memory.score_one([0.1, 0.2, 0.3], "payroll"), ValueError, ["category", "payroll", "invoice"]),
        (lambda: memory.score_one([0.1, 0.2], "invoice"), ValueError, ["factors", "3"]),
        (lambda: memory.score_one([0.1, float("nan"), 0.3], "invoice"), ValueError, ["factors", "nan"]),
        (lambda: memory.score_one(["a", "b", "c"], "invoice"), TypeError, ["factors"]),
        (lambda: memory.score_one([0.1, 0.2, 0.3], 5), ValueError, ["category", "5"]),
        (lambda: memory.learn_one([0.1, 0.2, 0.3], "escalate", "invoice"), ValueError, ["action", "escalate"]),
        (lambda: memory.learn_one([0.1, 0.2, 0.3], 2, "invoice"), ValueError, ["action", "2"]),
        (lambda: memory.learn_one([0.1, 0.2, 0.3], "approve", "invoice", confirmed="yes"), TypeError,
         ["confirmed", "yes"]),
        (lambda: memory.learn_one([0.1, 0.2, 0.3], "approve", "invoice", outcome=3), TypeError, ["outcome", "3"]),
        (lambda: memory.learn_one([0.1, 0.2, float("inf")], "approve", "invoice"), ValueError, ["factors", "inf"]),
    ]
    for call, error, words in cases:
        with pytest.raises(error) as info:
            call()
        assert all(word in str(info.value) for word in words), (words, str(info.value))
    assert_unchanged(memory, before)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"tau": 0.0}, ValueError, ["tau", "0.0"]),
    ({"tau": -1.0}, ValueError, ["tau", "-1.0"]),
    ({"tau": float("nan")}, ValueError, ["tau", "nan"]),
    ({"tau": "0.1"}, TypeError, ["tau", "'0.1'"]),
    ({"eta_confirmed": 0.0}, ValueError, ["eta_confirmed", "0.0"]),
    ({"eta_confirmed": 1.5}, ValueError, ["eta_confirmed", "1.5"]),
    ({"eta_override": -0.01}, ValueError, ["eta_override", "-0.01"]),
    ({"drift_threshold": -0.4}, ValueError, ["drift_threshold", "-0.4"]),
    ({"gate_damping": 0.0}, ValueError, ["gate_damping", "0.0"]),
    ({"gate_damping": 2.0}, ValueError, ["gate_damping", "2.0"]),
    ({"clip": (1.0, 0.0)}, ValueError, ["clip", "(1.0, 0.0)"]),
    ({"clip": 1.0}, TypeError, ["clip", "1.0"]),
    ({"push_rate": -0.1}, ValueError, ["push_rate", "-0.1"]),
    ({"min_confidence": 1.2}, ValueError, ["min_confidence", "1.2"]),
    ({"categories": 0}, ValueError, ["categories", "0"]),
    ({"actions": ["a", "a"]}, ValueError, ["actions", "'a'"]),
    ({"factors": "abc"}, TypeError, ["factors", "'abc'"]),
])
def test_judgment_hyperparameters(kwargs, error, words):
    base = {"categories": 4, "actions": 4, "factors": 8}
    with pytest.raises(error) as info:
        JudgmentMemory(**{**base, "config": JudgmentConfig.seed(), **kwargs})
    assert all(word in str(info.value) for word in words), str(info.value)


@pytest.mark.parametrize("kwargs,error,words", [
    ({"k": 0}, ValueError, ["k", "0"]),
    ({"k": 2.5}, TypeError, ["k", "2.5"]),
    ({"capacity": 0}, ValueError, ["capacity", "0"]),
    ({"k": 10, "capacity": 5}, ValueError, ["k", "10", "capacity"]),
    ({"scoped": True}, ValueError, ["scoped", "categories"]),
    ({"actions": []}, ValueError, ["actions", "[]"]),
])
def test_knn_hyperparameters(kwargs, error, words):
    base = {"factors": 8, "actions": 4}
    with pytest.raises(error) as info:
        KNNMemory(**{**base, **kwargs})
    assert all(word in str(info.value) for word in words), str(info.value)


@pytest.mark.parametrize("factors, error, words", [
    ([1 + 2j] + [0.0] * 7, TypeError, ["factors", "(1+2j)"]),  # never scored on its real part
    ([10**40] + [0.0] * 7, ValueError, ["factors", "float32"]),  # no OverflowError from the compiled path
    ([1e39] + [0.0] * 7, ValueError, ["factors", "float32"]),
])
def test_score_one_compiled_path_refuses_what_the_checked_path_refuses(factors, error, words, recwarn):
    memory = JudgmentMemory(4, 4, 8, config=JudgmentConfig.seed())
    memory.learn_(X, C, A)
    before = copy.deepcopy(memory.state_dict())
    with pytest.raises(error) as caught:
        memory.score_one(factors, 0)
    assert all(word in str(caught.value) for word in words), str(caught.value)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]  # no overflow warning first
    for key, value in memory.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key])


def test_attention_loss_checks_its_category_and_action_against_the_step():
    memory = JudgmentMemory(4, 4, 8, config=JudgmentConfig.seed())
    step = memory.prequential_(X, C, A)
    with pytest.raises(ValueError, match=r"category must have shape \(6,\)"):
        memory.attention_loss(step, C[:2], A)
    with pytest.raises(ValueError, match="action must be in"):
        memory.attention_loss(step, C, torch.full_like(A, 9))
    with pytest.raises(ValueError, match="skip"):
        memory.attention_loss(step, C, A, torch.zeros(2, dtype=torch.bool))


def test_episodic_columns_name_the_argument():
    from gae import EpisodicMemory

    memory = EpisodicMemory(8, 10)
    with pytest.raises(ValueError, match="importance is a meta tensor"):
        memory.add(X[:1], torch.ones(1, device="meta"))
    with pytest.raises(TypeError, match="importance must be one number or one per memory, got 'high'"):
        memory.add(X[:1], "high")
    with pytest.raises(ValueError, match=r"scope must be a name or an int in \[0, 2\*\*63\)"):
        memory.add(X[:1], 1.0, scope=2**70)
    assert len(memory) == 0 and memory.version == 0
