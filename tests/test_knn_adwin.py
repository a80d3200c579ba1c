"""training.knn_adwin: KNN-ADWIN against plain KNNMemory and a slow reference loop."""

from __future__ import annotations

import copy
import doctest
import functools
import io
import pickle
import sys

import pytest
import torch

drift = pytest.importorskip("river.drift")

from gae import KNNMemory  # noqa: E402
from gae.types import StreamStep  # noqa: E402
from tests.conftest import ACTIONS, CATEGORIES, FACTORS, clustered_stream  # noqa: E402
from training import knn_adwin  # noqa: E402
from training.knn_adwin import ADWINKNNMemory  # noqa: E402

OPTIONS = [{}, {"scoped": True}, {"respect_skip": True}, {"k": 3, "capacity": 150}]


def make(**options) -> ADWINKNNMemory:
    return ADWINKNNMemory(factors=FACTORS, actions=ACTIONS,
                          **{"k": 5, "capacity": 400, "categories": CATEGORIES, **options})


def feed(memory, stream, sizes=(None,)):
    """prequential_ over the stream in consecutive batches of the given sizes (cycled; None: the rest)."""
    steps, start, n, turn = [], 0, stream.x.shape[0], 0
    while start < n:
        size = sizes[turn % len(sizes)] or n
        part = slice(start, min(n, start + size))
        steps.append(memory.prequential_(stream.x[part], stream.category[part], stream.action[part],
                                         skip=stream.skip[part]))
        start, turn = part.stop, turn + 1
    return knn_adwin._concat(steps)


def assert_same_step(a: StreamStep, b: StreamStep) -> None:
    for left, right in ((a.output, b.output), (a.events, b.events), (a.retrieved, b.retrieved)):
        for u, v in zip(left, right, strict=True):
            assert (u is None and v is None) or torch.equal(u, v)


def assert_same_buffers(a, b):
    for (name, u), (_, v) in zip(a.named_buffers(), b.named_buffers(), strict=True):
        assert torch.equal(u, v), name


def accuracy(step, stream, start, stop):
    return float((step.output.action[start:stop] == stream.action[start:stop]).float().mean())


@functools.cache
def reference(seed: int, delta: float, options: tuple) -> tuple[list, list[int], KNNMemory]:
    """The obvious loop: a KNNMemory one decision at a time, a separate ADWIN fed each verified
    decision's error, and the window cut to its width after the decision that made it fire."""
    stream = clustered_stream(seed, 900, drift_at=450)
    options = {"k": 5, "capacity": 400, "categories": CATEGORIES, **dict(options)}
    memory, detector, cuts = KNNMemory(factors=FACTORS, actions=ACTIONS, **options), drift.ADWIN(delta=delta), []
    answers = []
    for i in range(stream.x.shape[0]):
        row, c, a, skip = stream.x[i].tolist(), int(stream.category[i]), int(stream.action[i]), bool(stream.skip[i])
        answer = memory.score_one(row, c)
        answers.append(answer)
        memory.learn_one(row, a, c, outcome="__incorrect__" if skip else None)
        if not skip:
            detector.update(float(answer[0] != str(a)))  # an abstention (None) is an error
            if detector.drift_detected and memory.keep_newest_(int(detector.width)):
                cuts.append(i)
    return answers, cuts, memory


@pytest.mark.parametrize("options", OPTIONS)
def test_a_detector_that_never_fires_leaves_the_plain_knn(options):
    stream = clustered_stream(3, 1200, drift_at=600)
    options = {"k": 5, "capacity": 400, "categories": CATEGORIES, **options}
    memory = ADWINKNNMemory(factors=FACTORS, actions=ACTIONS, delta=1e-300, **options)
    plain = KNNMemory(factors=FACTORS, actions=ACTIONS, **options)
    assert_same_step(feed(memory, stream, (1, 300, 7, None)), feed(plain, stream))
    assert memory.cuts == []
    assert_same_buffers(memory, plain)


def test_the_window_is_cut_after_the_drift_and_the_knn_recovers_faster():
    stream = clustered_stream(0, 1200, drift_at=600)
    memory, plain = make(), KNNMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=400, categories=CATEGORIES)
    ours, theirs = feed(memory, stream), feed(plain, stream)
    assert any(600 <= step < 700 for step in memory.cuts), memory.cuts  # (an earlier cut: the learning curve)
    recovered, stuck = accuracy(ours, stream, 700, 900), accuracy(theirs, stream, 700, 900)
    assert recovered > 0.75 and recovered - stuck > 0.25, (recovered, stuck)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("sizes", [(None,), (1,), (5, 100, 1, 33)])
def test_equals_the_reference_loop(options, sizes):
    stream = clustered_stream(1, 900, drift_at=450)
    answers, cuts, slow = reference(1, 0.01, tuple(sorted(options.items())))
    memory = make(delta=0.01, **options)
    step = feed(memory, stream, sizes)
    assert cuts and memory.cuts == cuts
    assert [(memory._action_name(int(a)), float(c)) for a, c in zip(step.output.action, step.output.confidence,
                                                                      strict=True)] == answers
    assert_same_buffers(memory, slow)


def test_learn_one_feeds_the_detector():
    stream = clustered_stream(1, 500, drift_at=250)
    batched, single = make(delta=0.01), make(delta=0.01)
    feed(batched, stream)
    for i in range(stream.x.shape[0]):
        single.learn_one(stream.x[i].tolist(), int(stream.action[i]), int(stream.category[i]),
                         outcome="__incorrect__" if bool(stream.skip[i]) else None)
    assert batched.cuts and single.cuts == batched.cuts
    assert_same_buffers(single, batched)


def test_state_dict_keeps_the_cuts_and_restarts_the_detector():
    stream = clustered_stream(0, 900, drift_at=450)
    memory = make(delta=0.01)
    feed(memory, stream)
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    restored = make(delta=0.01)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.cuts == memory.cuts and restored.cuts
    assert_same_buffers(restored, memory)
    assert restored.detector.width == 0 and memory.detector.width > 0


@pytest.mark.parametrize("cuts", [[-1], [1.5], "12", [True]])
def test_a_tampered_cut_list_loads_nothing(cuts):
    stream = clustered_stream(0, 300)
    source, memory = make(), make()
    feed(source, stream)
    state = source.state_dict()
    state["_extra_state"] = {**state["_extra_state"], "cuts": cuts}
    with pytest.raises(ValueError, match="cuts"):
        memory.load_state_dict(state)
    assert len(memory) == 0 and memory.cuts == []


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda memory: pickle.loads(pickle.dumps(memory))])
def test_a_copy_carries_the_detector(clone):
    stream = clustered_stream(0, 900, drift_at=450)
    memory = make(delta=0.01)
    first = slice(0, 500)
    memory.prequential_(stream.x[first], stream.category[first], stream.action[first], skip=stream.skip[first])
    twin = clone(memory)
    rest = slice(500, 900)
    a = memory.prequential_(stream.x[rest], stream.category[rest], stream.action[rest], skip=stream.skip[rest])
    b = twin.prequential_(stream.x[rest], stream.category[rest], stream.action[rest], skip=stream.skip[rest])
    assert_same_step(a, b)
    assert twin.cuts == memory.cuts and twin.detector is not memory.detector
    assert_same_buffers(twin, memory)


@pytest.mark.parametrize("delta", [0, 1, -0.5, 1.5, float("nan"), True, "0.01", None])
def test_a_bad_delta_is_refused(delta):
    with pytest.raises(ValueError, match=f"delta must be a number in \\(0, 1\\), got {delta!r}"):
        make(delta=delta)


def test_the_knn_options_are_checked_as_knn_memory_does():
    with pytest.raises(ValueError, match="k must be <= capacity"):
        make(k=10, capacity=5)
    with pytest.raises(ValueError, match="scoped=True needs categories"):
        ADWINKNNMemory(factors=2, actions=2, scoped=True)


def test_without_river_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "river", None)
    with pytest.raises(ImportError, match="pip install river"):
        make()


def test_a_rejected_batch_changes_nothing():
    memory = make()
    with pytest.raises(ValueError):
        memory.prequential_(torch.full((3, FACTORS), float("nan")), torch.zeros(3, dtype=torch.long),
                            torch.zeros(3, dtype=torch.long))
    assert memory.detector.width == 0 and int(memory.num_decisions) == 0


def test_docstring_examples():
    result = doctest.testmod(knn_adwin)
    assert result.attempted > 0 and result.failed == 0
