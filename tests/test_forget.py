"""forget_ equals retraining without the forgotten decisions, also where the memory derived the
confirmed flags from its own recommendations (``confirmed=None``): a replay derives them again
from the state it rebuilds, and keeps the flags the caller gave."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import clustered_stream, make_judgment
from tests.test_audit import MODES, assert_same_state

SIZES = [1, 7, 50, 13, 120, 2, 64, 33, 90, 20]  # calls of mixed sizes, 400 decisions


def calls(n: int):
    """(start, stop, given) per call: the confirmed flags are given in every third call, derived otherwise."""
    start, out = 0, []
    for i, size in enumerate(SIZES * (n // sum(SIZES))):
        out.append((start, start + size, i % 3 == 2))
        start += size
    return out


def feed(memory, stream, confirmed, dropped: set[int] = frozenset()):
    for start, stop, given in calls(len(stream.x)):
        rows = torch.tensor([r for r in range(start, stop) if r not in dropped], dtype=torch.int64)
        if rows.numel():
            memory.prequential_(stream.x[rows], stream.category[rows], stream.action[rows],
                                confirmed[rows] if given else None, stream.skip[rows], rows)
    return memory


@pytest.mark.parametrize("mode", sorted(MODES))
def test_forget_recomputes_derived_confirmations(mode):
    stream = clustered_stream(8, 800, drift_at=400)
    confirmed = torch.rand(800, generator=torch.Generator().manual_seed(9)) < 0.6
    memory = feed(make_judgment(**MODES[mode]), stream, confirmed)
    assert not bool(memory.decision_log.events()["given"].all())  # some flags were derived
    dropped = {0, 3, 8, 57, 58, 390, 401, 402, 650, 799}
    assert memory.forget_(sorted(dropped)) == len(dropped)
    retrained = feed(make_judgment(**MODES[mode]), stream, confirmed, dropped)
    assert_same_state(memory, retrained)  # the same engine on the same decisions: bit for bit
    log, again = memory.decision_log.events(), retrained.decision_log.events()
    for column in ("confirmed", "given", "eta", "gated", "prototype", "source_id"):
        assert torch.equal(log[column], again[column]), column
    assert memory.gate_records() == retrained.gate_records()


@pytest.mark.parametrize("mode", ["seed", "prototypes"])
def test_a_derived_flag_can_change_in_the_replay(mode):
    # the case: calls of 50 with skips, six decisions forgotten; before the replay derived the
    # flags again, the prototypes ended up to 0.11 (seed) and 0.30 (prototypes=3) away from retraining
    stream = clustered_stream(2, 600, drift_at=300)
    memory = make_judgment(**MODES[mode])
    for start in range(0, 600, 50):
        part = slice(start, start + 50)
        memory.prequential_(stream.x[part], stream.category[part], stream.action[part], None, stream.skip[part],
                            torch.arange(start, start + 50))
    before = memory.decision_log.events()["confirmed"].clone()
    dropped = [1, 2, 299, 300, 301, 450]
    memory.forget_(dropped)
    retrained = make_judgment(**MODES[mode])
    keep = torch.tensor([i for i in range(600) if i not in dropped])
    retrained.prequential_(stream.x[keep], stream.category[keep], stream.action[keep], None, stream.skip[keep], keep)
    assert_same_state(memory, retrained)
    kept = torch.ones(600, dtype=torch.bool)
    kept[dropped] = False
    assert not torch.equal(memory.decision_log.events()["confirmed"], before[kept])  # some flag did change


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_memory_no_longer_used_is_freed_at_once_with_its_log(mode):
    # no reference cycle through the history: refcounting frees the memory and its decision log, without
    # waiting for the cyclic garbage collector (a sweep that makes memories would otherwise pile them up)
    import gc
    import weakref

    stream = clustered_stream(4, 400, drift_at=200)
    memory = feed(make_judgment(**MODES[mode]), stream, torch.zeros(400, dtype=torch.bool))
    memory.forget_([5])
    memory.score_one(stream.x[0].tolist(), 0)
    gone = weakref.ref(memory)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del memory
        assert gone() is None
    finally:
        if enabled:
            gc.enable()


def test_source_ids_accept_what_a_pytorch_user_passes_and_refuse_the_rest():
    import numpy as np

    from gae.validation import source_ids

    for given in (3, [3, 4], (3, 4), torch.tensor([3, 4]), torch.tensor(3), np.array([3, 4], dtype=np.uint64),
                  [np.int64(3), torch.tensor(4)]):
        assert source_ids(given).tolist() in ([3], [3, 4])
    for bad in ([], [1.5], [True], torch.tensor([1.0]), np.array([[1]]), "3", np.array([2**64 - 1], dtype=np.uint64),
                None):
        with pytest.raises(ValueError, match="source_ids must be a non-empty list of integers"):
            source_ids(bad)
