"""The decision log of JudgmentMemory: trace, exact undo and exact unlearning, in every mode."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import clustered_stream, make_judgment

MODES = {
    "seed": {},
    "options": {"clip": (0.0, 1.0), "push_rate": 0.02, "min_confidence": 0.3},
    "adaptive": {"drift_mode": "adaptive", "promotion_threshold": 2.0},
    "prototypes": {"prototypes": 3},
    "prototypes_adaptive": {"prototypes": 3, "drift_mode": "adaptive", "promotion_threshold": 2.0},
}


def tensors(memory) -> dict[str, torch.Tensor]:
    return {k: v for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}


def assert_same_state(a, b, exact: bool = True) -> None:
    left, right = tensors(a), tensors(b)
    assert left.keys() == right.keys()
    for key in left:
        if exact or not left[key].is_floating_point():
            assert torch.equal(left[key], right[key]), key
        else:
            torch.testing.assert_close(left[key], right[key], rtol=1e-5, atol=1e-5, msg=key)


def feed(memory, stream, start: int, stop: int, batch: int = 50, confirmed=None, learn_attention: bool = False):
    optimizer = torch.optim.Adam([memory.criterion_logits], lr=0.05) if learn_attention else None
    for i in range(start, stop, batch):
        j = min(i + batch, stop)
        part = slice(i, j)
        step = memory.prequential_(stream.x[part], stream.category[part], stream.action[part],
                                   None if confirmed is None else confirmed[part], stream.skip[part],
                                   torch.arange(i, j))
        if optimizer is not None:
            loss = memory.attention_loss(step, stream.category[part], stream.action[part], stream.skip[part])
            if loss is not None:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_undo_is_exact_and_redo_returns_the_same_state(mode):
    stream = clustered_stream(1, 600, drift_at=300)
    memory = make_judgment(**MODES[mode])
    feed(memory, stream, 0, 430, learn_attention=True)
    before = copy.deepcopy(memory)
    feed(memory, stream, 430, 600, learn_attention=True)  # the attention moves during the undone decisions too
    applied = int((~stream.skip[430:600]).sum())
    memory.undo_(applied)
    assert_same_state(memory, before)
    assert torch.equal(memory.criterion_logits, before.criterion_logits)
    assert memory.gate_records() == before.gate_records()
    feed(memory, stream, 430, 600)  # redo
    again = copy.deepcopy(before)
    feed(again, stream, 430, 600)
    assert_same_state(memory, again)


def test_undo_past_the_log_start_fails_and_changes_nothing():
    stream = clustered_stream(2, 100)
    memory = make_judgment(max_log_events=60)
    feed(memory, stream, 0, 100, batch=10)
    assert 30 <= len(memory.decision_log) <= 60
    unbounded = make_judgment()
    feed(unbounded, stream, 0, 100, batch=10)
    assert_same_state(memory, unbounded)  # folding the log changes nothing the memory knows
    first = int(memory.decision_log.events()["seq"][0])  # the folded decisions' events leave with them
    kept = [record for record in unbounded.gate_records() if record["step"] >= first]
    assert kept and len(kept) < len(unbounded.gate_records())
    assert memory.gate_records() == kept
    snapshot = copy.deepcopy(memory)
    with pytest.raises(ValueError, match="reaches before the start of the decision log.*folded"):
        memory.undo_(len(memory.decision_log) + 1)
    assert_same_state(memory, snapshot)
    memory.undo_(5)  # within reach: fine
    with pytest.raises(ValueError, match="n must be"):
        memory.undo_(0)


def fed_without(mode: str, stream, confirmed, dropped: set[int]):
    """A fresh memory fed the stream without the dropped decisions (same batches otherwise)."""
    memory = make_judgment(**MODES[mode])
    for i in range(0, len(stream.x), 50):
        rows = [r for r in range(i, min(i + 50, len(stream.x))) if r not in dropped]
        if rows:
            index = torch.tensor(rows)
            memory.prequential_(stream.x[index], stream.category[index], stream.action[index], confirmed[index],
                                stream.skip[index], index)
    return memory


@pytest.mark.parametrize("mode", sorted(MODES))
def test_forget_equals_retraining_without_the_episodes(mode):
    stream = clustered_stream(3, 5000, drift_at=2500)
    confirmed = torch.rand(5000, generator=torch.Generator().manual_seed(4)) < 0.7  # the verifier's facts
    memory = make_judgment(**MODES[mode])
    feed(memory, stream, 0, 5000, confirmed=confirmed)
    dropped = {5, 17, 2400, 2401, 2650, 4999}
    assert memory.forget_(sorted(dropped)) == len(dropped)
    retrained = fed_without(mode, stream, confirmed, dropped)
    assert_same_state(memory, retrained)  # the same engine on the same decisions: bit for bit
    assert int(memory.num_decisions) == 5000 - len(dropped)
    assert [r["event"] for r in memory.gate_records()] == [r["event"] for r in retrained.gate_records()]


@settings(max_examples=8, deadline=None)
@given(st.sets(st.integers(0, 299), min_size=1, max_size=12), st.sampled_from(sorted(MODES)))
def test_forget_random_selections(dropped, mode):
    stream = clustered_stream(5, 300, drift_at=150)
    confirmed = torch.rand(300, generator=torch.Generator().manual_seed(6)) < 0.6
    memory = make_judgment(**MODES[mode])
    feed(memory, stream, 0, 300, confirmed=confirmed)
    memory.forget_(sorted(dropped))
    assert_same_state(memory, fed_without(mode, stream, confirmed, dropped))


def test_forgetting_an_unknown_id_is_a_clear_error():
    stream = clustered_stream(6, 100)
    memory = make_judgment()
    feed(memory, stream, 0, 100)
    snapshot = copy.deepcopy(memory)
    with pytest.raises(ValueError, match=r"not in the decision log: \[1000\]"):
        memory.forget_([3, 1000])
    with pytest.raises(ValueError, match="list of integers"):
        memory.forget_([1.5])
    assert_same_state(memory, snapshot)


def test_trace_weights_match_a_slow_reference():
    stream = clustered_stream(7, 800)
    memory = make_judgment()
    feed(memory, stream, 0, 800)
    log = memory.decision_log.events()
    for c, a in ((0, 0), (2, 3)):
        rows = [i for i in range(len(log["seq"])) if int(log["category"][i]) == c and int(log["action"][i]) == a
                and not bool(log["skipped"][i])]
        weights = {}
        for position, i in enumerate(rows):  # the slow, obvious product
            w = float(log["eta"][i])
            for j in rows[position + 1:]:
                w *= 1.0 - float(log["eta"][j])
            weights[int(log["source_id"][i])] = w
        trace = memory.trace(c, a, top=5)
        best = sorted(weights.items(), key=lambda item: -item[1])[:5]
        assert trace.source_ids.tolist() == [s for s, _ in best]
        torch.testing.assert_close(trace.weights, torch.tensor([w for _, w in best]), rtol=1e-5, atol=1e-7)
        assert sum(weights.values()) == pytest.approx(1.0)  # a prototype is a weighted mean of its decisions
        # and the weights rebuild the prototype from the decisions' factors
        rebuilt = sum(w * stream.x[s] for s, w in weights.items())
        torch.testing.assert_close(rebuilt.float(), memory.centroids[c, a, 0], rtol=1e-4, atol=1e-4)


def test_the_log_travels_in_the_state_dict(tmp_path):
    stream = clustered_stream(8, 300)
    memory = make_judgment(prototypes=2)
    feed(memory, stream, 0, 300)
    path = tmp_path / "memory.pt"
    torch.save(memory.state_dict(), path)
    copy_ = make_judgment(prototypes=2)
    copy_.load_state_dict(torch.load(path, weights_only=True))
    assert len(copy_.decision_log) == 300
    copy_.forget_([10, 20])
    memory.forget_([10, 20])
    assert_same_state(copy_, memory)
    events = memory.decision_log.events()
    assert set(events) >= {"seq", "source_id", "category", "action", "confirmed", "skipped", "eta", "displacement",
                           "gated", "initialized", "before"}
    assert events["before"].shape == (298, 8)


def test_a_log_smaller_than_a_call_folds_without_recursing():
    stream = clustered_stream(9, 300)
    memory = make_judgment(max_log_events=20)
    feed(memory, stream, 0, 300, batch=50)  # every call is bigger than the whole log
    unbounded = make_judgment()
    feed(unbounded, stream, 0, 300, batch=50)
    assert_same_state(memory, unbounded)
    assert len(memory.decision_log) <= 50


def test_max_log_events_zero_keeps_no_log():
    stream = clustered_stream(10, 100)
    memory = make_judgment(max_log_events=0)
    feed(memory, stream, 0, 100)
    assert len(memory.decision_log) == 0
    with pytest.raises(ValueError, match="holds 0 applied decisions"):
        memory.undo_()
    with pytest.raises(ValueError, match="not in the decision log"):
        memory.forget_([3])
    with pytest.raises(ValueError, match="max_log_events"):
        make_judgment(max_log_events=-1)


def test_default_source_ids_are_never_reused_after_a_forget():
    stream = clustered_stream(11, 6)
    memory = make_judgment()
    memory.learn_(stream.x[:4], stream.category[:4], stream.action[:4])
    memory.forget_([0])
    memory.learn_(stream.x[4:5], stream.category[4:5], stream.action[4:5])
    assert memory.decision_log.events()["source_id"].tolist() == [1, 2, 3, 4]
    assert memory.forget_([3]) == 1


def test_a_log_that_does_not_cover_the_state_refuses_to_replay():
    stream = clustered_stream(12, 120)
    logged = make_judgment()
    feed(logged, stream, 0, 60)
    state = {k: v for k, v in logged.state_dict().items() if k != "_extra_state"}
    memory = make_judgment()
    memory.load_state_dict(state, strict=False)  # the buffers without the log
    feed(memory, stream, 60, 120)
    snapshot = copy.deepcopy(memory)
    with pytest.raises(ValueError, match="does not cover this memory's state"):
        memory.undo_(1)
    assert_same_state(memory, snapshot)


def test_the_saved_log_is_compact_and_replays_many_small_calls_at_once(tmp_path):
    stream = clustered_stream(13, 400)
    memory = make_judgment()
    for i in range(0, 400, 2):  # two decisions per call, the attention unchanged: one run of logits
        memory.learn_(stream.x[i:i + 2], stream.category[i:i + 2], stream.action[i:i + 2])
    saved = memory.state_dict()["_extra_state"]["decision_log"]
    # every 64 calls with the same attention are joined into one chunk; the last 8 are still apart
    assert saved["logits"].shape == (1, 4, 8) and saved["call_sizes"].tolist() == [128] * 3 + [2] * 8
    assert saved["columns"]["x"].shape == (400, 8)
    single = make_judgment()  # one decision per call: staged by the single-decision path, logged as one call
    for i in range(400):
        single.learn_(stream.x[i:i + 1], stream.category[i:i + 1], stream.action[i:i + 1])
    assert single.state_dict()["_extra_state"]["decision_log"]["call_sizes"].tolist() == [400]
    path = tmp_path / "memory.pt"
    torch.save(memory.state_dict(), path)
    reloaded = make_judgment()
    reloaded.load_state_dict(torch.load(path, weights_only=True))
    reloaded.undo_(3)
    memory.undo_(3)
    assert_same_state(reloaded, memory)


def test_trace_follows_each_prototype_slot():
    stream = clustered_stream(14, 600)
    memory = make_judgment(prototypes=3, spawn_threshold=0.35)
    feed(memory, stream, 0, 600)
    log = memory.decision_log.events()
    slots = {int(p) for p in log["prototype"][(log["category"] == 1) & (log["action"] == 2)].tolist()} - {-1}
    assert len(slots) > 1
    for slot in slots:
        trace = memory.trace(1, 2, top=1000, prototype=slot)
        rows = ((log["category"] == 1) & (log["action"] == 2) & (log["prototype"] == slot) & ~log["skipped"])
        assert set(trace.source_ids.tolist()) == set(log["source_id"][rows].tolist())
        if not bool(memory.initialized[1, 2, slot]):
            continue
        rebuilt = (trace.weights.double()[:, None] * stream.x[trace.source_ids].double()).sum(0)
        torch.testing.assert_close(rebuilt.float(), memory.centroids[1, 2, slot], rtol=1e-4, atol=1e-4)
