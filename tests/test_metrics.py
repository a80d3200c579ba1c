"""Stream metrics against slow, obvious references; split invariance; resume; DDP sync; every error path."""

from __future__ import annotations

import copy
import doctest
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchmetrics.functional.classification import binary_calibration_error, multiclass_calibration_error

from tests.conftest import clustered_stream, make_judgment
from training import metrics as M

ACTIONS = 4


def random_predictions(seed: int, n: int, abstain: float = 0.2, ones: float = 0.1):
    """pred with abstentions (-1, confidence 0), target, confidence with some exact 1.0."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, ACTIONS, (n,), generator=gen)
    pred = torch.where(torch.rand(n, generator=gen) < 0.5, target, torch.randint(0, ACTIONS, (n,), generator=gen))
    pred = torch.where(torch.rand(n, generator=gen) < abstain, -1, pred)
    confidence = torch.rand(n, generator=gen)
    confidence = torch.where(torch.rand(n, generator=gen) < ones, 1.0, confidence)
    return pred, target, confidence.where(pred >= 0, 0.0)


def split(n: int, sizes: list[int]) -> list[slice]:
    """Consecutive slices of 0..n with the given sizes, cycled, the last one cut to fit."""
    slices, start, i = [], 0, 0
    while start < n:
        stop = min(n, start + sizes[i % len(sizes)])
        slices.append(slice(start, stop))
        start, i = stop, i + 1
    return slices


# -- slow, obvious references ----------------------------------------------------------------

def ref_correct(pred, target) -> list[bool]:
    return [p != -1 and p == t for p, t in zip(pred.tolist(), target.tolist(), strict=True)]


def ref_rolling(correct: list[bool], window: int) -> list[float]:
    return [sum(correct[max(0, i - window + 1):i + 1]) / min(i + 1, window) for i in range(len(correct))]


def ref_ece(confidence, correct: list[bool], n_bins: int) -> float:
    conf, acc = np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        last = b == n_bins - 1
        members = [i for i in range(len(conf)) if edges[b] <= conf[i] and (conf[i] < edges[b + 1] or last)]
        if members:
            total += len(members) / len(conf) * abs(conf[members].mean() - acc[members].mean())
    return total


def ref_drift(batches):
    """(shift, from_start) after each (before, after, initialized), by loops over prototypes."""
    start: dict[tuple[int, int], np.ndarray] = {}
    out = []
    for before, after, initialized in batches:
        before, after, initialized = before.numpy().astype(np.float64), after.numpy().astype(np.float64), \
            initialized.numpy()
        cells = [(c, a) for c in range(initialized.shape[0]) for a in range(initialized.shape[1]) if initialized[c, a]]
        moved = [np.linalg.norm(after[c, a] - before[c, a]) for c, a in cells if (c, a) in start]
        start = {cell: start.get(cell, after[cell]) for cell in cells}
        away = [np.linalg.norm(after[cell] - start[cell]) for cell in cells]
        out.append((float(np.mean(moved)) if moved else 0.0, float(np.mean(away)) if away else 0.0))
    return out


# -- values ------------------------------------------------------------------------------------

def test_abstention_is_wrong_everywhere():
    pred, target = torch.tensor([-1, -1, 0]), torch.tensor([0, 1, 0])
    assert M.correctness(torch.tensor([-1]), torch.tensor([-1])).tolist() == [False]
    metrics = M.StreamMetrics("jm", window=2)
    metrics.update(pred, target, torch.tensor([0.9, 0.0, 0.5]))  # the 0.9 is ignored: an abstention is 0
    values = metrics.compute()
    assert float(values["acc/rolling_jm"]) == 0.5 and float(values["acc/cumulative_jm"]) == pytest.approx(1 / 3)
    assert float(values["abstain/rate_jm"]) == pytest.approx(2 / 3)
    assert float(values["calibration/ece_jm"]) == pytest.approx(ref_ece([0.0, 0.0, 0.5], [False, False, True], 15))


@pytest.mark.parametrize("window", [1, 3, 50])
def test_rolling_accuracy_functional_matches_loop(window):
    pred, target, _ = random_predictions(window, 137)
    correct = ref_correct(pred, target)
    curve = M.rolling_accuracy(torch.tensor(correct), window)
    assert curve.dtype == torch.float32
    torch.testing.assert_close(curve, torch.tensor(ref_rolling(correct, window)))
    assert M.rolling_accuracy(torch.zeros(0, dtype=torch.bool), window).shape == (0,)


@pytest.mark.parametrize("window,sizes", [(1, [1]), (5, [3, 7, 1]), (50, [64]), (50, [13, 2, 49, 51])])
def test_rolling_metric_and_curve_match_loop(window, sizes):
    pred, target, _ = random_predictions(7, 300)
    correct = ref_correct(pred, target)
    metric, curve = M.RollingAccuracy(window), []
    for part in split(300, sizes):
        metric.update(pred[part], target[part])
        curve.append(metric.rolling_curve())
        assert float(metric.compute()) == pytest.approx(ref_rolling(correct, window)[part.stop - 1])
    torch.testing.assert_close(torch.cat(curve), torch.tensor(ref_rolling(correct, window)))


def test_counting_metrics_match_loops():
    pred, target, confidence = random_predictions(3, 400)
    correct = ref_correct(pred, target)
    cumulative, abstention, ece = M.CumulativeAccuracy(), M.AbstentionRate(), M.ExpectedCalibrationError(10)
    for part in split(400, [17, 40]):
        cumulative.update(pred[part], target[part])
        abstention.update(pred[part])
        ece.update(pred[part], target[part], confidence[part])
    assert float(cumulative.compute()) == pytest.approx(sum(correct) / 400)
    assert float(abstention.compute()) == pytest.approx((pred == -1).sum().item() / 400)
    assert float(ece.compute()) == pytest.approx(ref_ece(confidence, correct, 10), abs=1e-6)
    assert bool((confidence == 1.0).any())  # the closed last bin is exercised


def test_ece_agrees_with_torchmetrics():
    # binary form: confidence against correctness, abstentions included (torchmetrics puts an exact
    # confidence of 1 in a bin of its own, so the case keeps them out)
    pred, target, confidence = random_predictions(5, 500, ones=0.0)
    metric = M.ExpectedCalibrationError()
    metric.update(pred, target, confidence)
    correct = M.correctness(pred, target).long()
    torch.testing.assert_close(metric.compute(), binary_calibration_error(confidence, correct, n_bins=15))
    # multiclass form: the memory's probabilities, top-1 action and its probability
    gen = torch.Generator().manual_seed(6)
    probs = torch.softmax(2 * torch.randn(500, ACTIONS, generator=gen), dim=1)
    truth = torch.randint(0, ACTIONS, (500,), generator=gen)
    confidence, action = probs.max(dim=1)
    metric = M.ExpectedCalibrationError(n_bins=10)
    metric.update(action, truth, confidence)
    torch.testing.assert_close(metric.compute(), multiclass_calibration_error(probs, truth, ACTIONS, n_bins=10))
    torch.testing.assert_close(M.calibration_error(confidence, action == truth, 10), metric.compute())


def test_gate_rate_counts():
    gen = torch.Generator().manual_seed(0)
    applied = torch.rand(200, generator=gen) < 0.7
    gated = applied & (torch.rand(200, generator=gen) < 0.2)
    promoted = applied & (torch.rand(200, generator=gen) < 0.05)
    recycled = applied & (torch.rand(200, generator=gen) < 0.1)
    metric = M.GateRate()
    for i, part in enumerate(split(200, [9, 31])):
        metric.update(gated[part], applied[part], promoted[part] if i % 2 else None,
                      recycled[part] if i % 3 else None)
    values = metric.compute()
    assert set(values) == {"gate/rate", "gate/events", "gate/promotions", "gate/recycles"}
    assert 0 < int(values["gate/recycles"]) == sum(r for i, part in enumerate(split(200, [9, 31])) if i % 3
                                               for r in recycled[part].tolist())
    assert int(values["gate/events"]) == sum(gated.tolist())
    counted = [p for i, part in enumerate(split(200, [9, 31])) if i % 2 for p in promoted[part].tolist()]
    assert 0 < int(values["gate/promotions"]) == sum(counted)
    assert float(values["gate/rate"]) == pytest.approx(sum(gated.tolist()) / sum(applied.tolist()))
    with pytest.raises(ValueError, match="recycled"):
        metric.update(gated[:5], applied[:5], None, recycled[:4])


def test_prototype_drift_matches_loops_on_a_real_stream():
    memory, stream, metric = make_judgment(), clustered_stream(1, 240, drift_at=120), M.PrototypeDrift()
    batches = []
    for part in split(240, [1, 7, 30]):
        before = memory.centroids.flatten(1, 2).clone()  # (C, A, P, K) -> (C, A * P, K): every slot a prototype
        memory.prequential_(stream.x[part], stream.category[part], stream.action[part], skip=stream.skip[part])
        after, initialized = memory.centroids.flatten(1, 2), memory.initialized.flatten(1, 2)
        batches.append((before, after.clone(), initialized.clone()))
        metric.update(before, after, initialized)
        shift, from_start = ref_drift(batches)[-1]
        values = metric.compute()
        assert float(values["drift/shift"]) == pytest.approx(shift, abs=1e-6)
        assert float(values["drift/from_start"]) == pytest.approx(from_start, abs=1e-6)
    assert float(values["drift/from_start"]) > 0


def test_prototype_drift_forgets_a_removed_prototype():
    metric, zero = M.PrototypeDrift(), torch.zeros(1, 1, 2)
    one, none = torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.bool)
    metric.update(zero, zero + 1, one)
    metric.update(zero + 1, zero, none)  # undone: nothing is tracked
    assert [float(v) for v in metric.compute().values()] == [0.0, 0.0]
    metric.update(zero, zero + 3, one)  # made again: a new start, and no shift from the uninitialised value
    assert [float(v) for v in metric.compute().values()] == [0.0, 0.0]
    metric.update(zero + 3, zero + 4, one)
    assert [float(v) for v in metric.compute().values()] == pytest.approx([2 ** 0.5, 2 ** 0.5])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 120), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
       window=st.sampled_from([1, 4, 50]))
def test_any_split_gives_the_same_metrics(seed, n, sizes, window):
    pred, target, confidence = random_predictions(seed, n)
    whole, parts = M.StreamMetrics("jm", window), M.StreamMetrics("jm", window)
    whole.update(pred, target, confidence)
    curve = []
    for part in split(n, sizes):
        parts.update(pred[part], target[part], confidence[part])
        curve.append(parts.rolling_curve())
    torch.testing.assert_close(parts.compute(), whole.compute(), rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.cat(curve), whole.rolling_curve(), rtol=0, atol=0)


def test_forward_is_update_then_compute():
    pred, target, confidence = random_predictions(2, 90)
    stepped, updated = M.StreamMetrics("knn", 20), M.StreamMetrics("knn", 20)
    for part in split(90, [30]):
        value = stepped(pred[part], target[part], confidence[part])
        updated.update(pred[part], target[part], confidence[part])
        assert value.keys() == {"acc/rolling_knn", "acc/cumulative_knn", "calibration/ece_knn", "abstain/rate_knn"}
        torch.testing.assert_close(value, updated.compute(), rtol=0, atol=0)


def test_reset_returns_to_the_start():
    pred, target, confidence = random_predictions(4, 60)
    metrics, gate, drift = M.StreamMetrics("jm", 8), M.GateRate(), M.PrototypeDrift()
    metrics.update(pred, target, confidence)
    gate.update(torch.tensor([True]), torch.tensor([True]))
    drift.update(torch.zeros(2, 2, 3), torch.ones(2, 2, 3), torch.ones(2, 2, dtype=torch.bool))
    for metric in (metrics, gate, drift):
        metric.reset()
    with pytest.raises(RuntimeError, match="rolling_curve"):
        metrics.rolling_curve()
    with pytest.warns(UserWarning, match="before the ``update``"):
        values = [*metrics.compute().values(), *gate.compute().values(), *drift.compute().values()]
    assert all(float(v) == 0.0 for v in values)
    drift.update(torch.zeros(1, 1, 1), torch.ones(1, 1, 1), torch.ones(1, 1, dtype=torch.bool))  # another shape
    fresh = M.StreamMetrics("jm", 8)
    fresh.update(pred, target, confidence)
    metrics.update(pred, target, confidence)
    torch.testing.assert_close(metrics.compute(), fresh.compute())


# -- checkpoints and DDP -----------------------------------------------------------------------

class Holder(nn.Module):
    """What a LightningModule holds: every metric as a submodule."""

    def __init__(self, window: int = 10) -> None:
        super().__init__()
        self.jm, self.gate, self.drift = M.StreamMetrics("jm", window), M.GateRate(), M.PrototypeDrift()

    def feed(self, stream, memory, part):
        before = memory.centroids.flatten(1, 2).clone()
        step = memory.prequential_(stream.x[part], stream.category[part], stream.action[part],
                                   skip=stream.skip[part])
        self.jm.update(step.output.action, stream.action[part], step.output.confidence)
        self.gate.update(step.events.gated, step.events.applied)
        self.drift.update(before, memory.centroids.flatten(1, 2), memory.initialized.flatten(1, 2))

    def values(self):
        return {**self.jm.compute(), **self.gate.compute(), **self.drift.compute()}


def test_a_resumed_run_ends_with_the_metrics_of_an_uninterrupted_one():
    stream = clustered_stream(2, 300, drift_at=150)
    memory, holder = make_judgment(drift_threshold=0.2), Holder()
    parts = split(300, [23])
    for part in parts:
        holder.feed(stream, memory, part)
    memory, first = make_judgment(drift_threshold=0.2), Holder()
    for part in parts[:7]:
        first.feed(stream, memory, part)
    buffer = io.BytesIO()
    torch.save({"metrics": first.state_dict(), "memory": memory.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    assert {"jm.acc/rolling.ring", "jm.acc/rolling.seen", "jm.acc/cumulative.total", "gate.gated",
            "drift.start"} <= set(saved["metrics"])
    memory, resumed = make_judgment(drift_threshold=0.2), Holder()
    memory.load_state_dict(saved["memory"])
    resumed.load_state_dict(saved["metrics"])
    for value in saved["metrics"].values():
        value.fill_(1)  # the metrics hold their own copies
    for part in parts[7:]:
        resumed.feed(stream, memory, part)
    assert int(holder.gate.compute()["gate/events"]) > 0
    torch.testing.assert_close(resumed.values(), holder.values(), rtol=0, atol=1e-6)


def test_state_dict_of_another_shape_or_missing_a_state_is_refused():
    small, large = M.RollingAccuracy(5), M.RollingAccuracy(50)
    small.update(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"ring has shape \(5,\).*expects \(50,\)"):
        large.load_state_dict(small.state_dict())
    assert large.ring.shape == (50,)
    with pytest.raises(RuntimeError, match="Missing key.*seen"):
        large.load_state_dict({"ring": torch.zeros(50, dtype=torch.bool)})


def fake_gather(perturb: bool):
    """A two-rank all_gather whose second rank holds the same state, or a different one."""
    def gather(tensor, group=None):
        other = tensor.clone()
        if perturb:
            other = ~other if other.dtype == torch.bool else other + 1
        return [tensor, other]
    return gather


def fed_metrics(**kwargs):
    pred, target, confidence = random_predictions(8, 70)
    gen = torch.Generator().manual_seed(8)
    metrics = [M.RollingAccuracy(10, **kwargs), M.CumulativeAccuracy(**kwargs),
               M.ExpectedCalibrationError(**kwargs), M.AbstentionRate(**kwargs), M.GateRate(**kwargs),
               M.PrototypeDrift(**kwargs)]
    for metric in metrics[:3]:
        metric.update(pred, target, *([confidence] if isinstance(metric, M.ExpectedCalibrationError) else []))
    metrics[3].update(pred)
    metrics[4].update(pred == target, (pred == target) | (pred < 0))
    centroids = torch.rand(3, 2, 3, 4, generator=gen)
    metrics[5].update(torch.zeros(2, 3, 4), centroids[0], torch.rand(2, 3, generator=gen) < 0.5)
    metrics[5].update(centroids[1], centroids[2], torch.ones(2, 3, dtype=torch.bool))
    return metrics


def test_ddp_sync_keeps_one_copy_of_identical_states_and_refuses_differing_ones():
    local = fed_metrics()
    synced = fed_metrics(dist_sync_fn=fake_gather(False), distributed_available_fn=lambda: True)
    for single, gathered in zip(local, synced, strict=True):
        torch.testing.assert_close(gathered.compute(), single.compute(), rtol=0, atol=0)
        assert not gathered._is_synced  # the local states are back
    for metric in fed_metrics(dist_sync_fn=fake_gather(True), distributed_available_fn=lambda: True):
        with pytest.raises(RuntimeError, match="global stream"):
            metric.compute()


# -- errors --------------------------------------------------------------------------------------

P, T, C = torch.tensor([0, 1, -1]), torch.tensor([0, 2, 1]), torch.tensor([0.5, 0.7, 0.0])
G, A = torch.tensor([True, False, False]), torch.tensor([True, True, False])
Z, ONES = torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool)

GOOD_CALLS = {M.RollingAccuracy: (P, T), M.CumulativeAccuracy: (P, T), M.AbstentionRate: (P,),
              M.ExpectedCalibrationError: (P, T, C), M.GateRate: (G, A), M.PrototypeDrift: (Z, Z + 1, ONES)}
BAD_CALLS = [  # (metric, args, error, words the message must contain)
    (M.RollingAccuracy, (P[:0], T[:0]), ValueError, ["pred", "empty", "(0,)"]),
    (M.RollingAccuracy, (P, T[:2]), ValueError, ["target", "(2,)", "(3,)"]),
    (M.RollingAccuracy, (P.unsqueeze(1), T), ValueError, ["pred", "(3, 1)"]),
    (M.RollingAccuracy, (P.float(), T), TypeError, ["pred", "torch.float32"]),
    (M.RollingAccuracy, (P.tolist(), T), TypeError, ["pred", "list"]),
    (M.RollingAccuracy, (P - 2, T), ValueError, ["pred", "-1", "-3"]),
    (M.CumulativeAccuracy, (P, T - 3), ValueError, ["target", "-3"]),
    (M.AbstentionRate, (P[:0],), ValueError, ["pred", "empty"]),
    (M.ExpectedCalibrationError, (P, T, C[:1]), ValueError, ["confidence", "(1,)", "(3,)"]),
    (M.ExpectedCalibrationError, (P, T, C + 0.5), ValueError, ["confidence", "[0, 1]", "1.2", "[1]"]),
    (M.ExpectedCalibrationError, (P, T, torch.tensor([float("nan"), 0.5, 0.0])), ValueError, ["confidence", "nan"]),
    (M.ExpectedCalibrationError, (P, T, C.double().long()), TypeError, ["confidence", "torch.int64"]),
    (M.GateRate, (G.long(), A), TypeError, ["gated", "torch.int64"]),
    (M.GateRate, (G, A[:2]), ValueError, ["applied", "(2,)"]),
    (M.GateRate, (G[:0], A[:0]), ValueError, ["gated", "empty"]),
    (M.GateRate, (A, G), ValueError, ["gated", "applied", "[1]"]),
    (M.PrototypeDrift, (Z, Z[:1], ONES), ValueError, ["after", "(2, 3, 4)", "(1, 3, 4)"]),
    (M.PrototypeDrift, (Z[0], Z[0], ONES), TypeError, ["before", "(3, 4)"]),
    (M.PrototypeDrift, (Z, Z, ONES[:1]), ValueError, ["initialized", "(2, 3)", "(1, 3)"]),
    (M.PrototypeDrift, (Z, Z, ONES.long()), TypeError, ["initialized", "torch.int64"]),
]


@pytest.mark.parametrize("factory,args,error,words", BAD_CALLS)
def test_bad_input_is_refused_by_name_and_changes_nothing(factory, args, error, words):
    metric = factory()
    metric.update(*GOOD_CALLS[factory])
    before = copy.deepcopy(metric.metric_state)
    with pytest.raises(error) as info:
        metric.update(*args)
    message = str(info.value)
    assert all(word in message for word in words), message
    for name, value in before.items():
        assert torch.equal(getattr(metric, name), value), name


def test_a_rejected_batch_changes_no_metric_of_a_collection():
    metrics = M.StreamMetrics("jm", 4)
    metrics.update(P, T, C)
    before = {key: float(value) for key, value in metrics.compute().items()}
    with pytest.raises(ValueError, match="confidence"):
        metrics.update(P, T, C + 2)  # only the calibration metric reads confidence
    assert {key: float(value) for key, value in metrics.compute().items()} == before


def test_drift_refuses_another_memory_until_reset():
    drift = M.PrototypeDrift()
    drift.update(Z, Z, ONES)
    with pytest.raises(ValueError, match=r"after has shape \(1, 3, 4\).*\(2, 3, 4\); reset"):
        drift.update(Z[:1], Z[:1], ONES[:1])


@pytest.mark.parametrize("make,error,words", [
    (lambda: M.RollingAccuracy(0), ValueError, ["window", "0"]),
    (lambda: M.RollingAccuracy(True), TypeError, ["window", "True"]),
    (lambda: M.ExpectedCalibrationError(2.5), TypeError, ["n_bins", "2.5"]),
    (lambda: M.StreamMetrics(""), ValueError, ["suffix", "''"]),
    (lambda: M.rolling_accuracy(torch.ones(2, 2), 3), ValueError, ["correct", "(2, 2)"]),
    (lambda: M.calibration_error(C, P >= 0, 0), ValueError, ["n_bins", "0"]),
])
def test_bad_arguments_are_refused_by_name(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert all(word in str(info.value) for word in words), str(info.value)


def test_docstring_examples_run():
    result = doctest.testmod(M, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
