"""One JudgmentMemory shared by many threads: no crash, nothing lost, the state of a serial replay.

Each thread scores and learns decisions whose first factor names the thread and the call, so
the decision log tells the order in which the memory took the calls; a fresh memory fed the
logged rows one by one, in that order, must end bit for bit where the shared one ended. A
scorer thread checks that every score answers from the state of a whole number of calls.
The heavy version (8 threads x 5,000 decisions, 20 runs) is ``make test-slow``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory

CATEGORIES, ACTIONS, K = ("invoice", "refund"), ("approve", "review", "reject"), 4
MODES = {"seed": JudgmentConfig.seed(), "recommended": JudgmentConfig.recommended(),
         "adaptive": JudgmentConfig(drift_mode="adaptive"), "prototypes": JudgmentConfig(prototypes=4)}
PROBES = torch.rand(16, K, generator=torch.Generator().manual_seed(0))
PROBE_CATEGORIES = torch.arange(16) % len(CATEGORIES)


@pytest.fixture(autouse=True)
def interleave() -> Iterator[None]:
    """Switch threads as often as CPython allows, so that calls interleave inside each other."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def decisions(thread: int, calls: int) -> list[tuple[np.ndarray, str, str]]:
    rng = np.random.default_rng(thread)
    rows = []
    for i in range(calls):
        factors = rng.random(K)
        factors[0] = thread + i / calls  # which thread, which call: the log tells the order taken
        rows.append((factors, ACTIONS[int(rng.integers(len(ACTIONS)))], CATEGORIES[i % 2]))
    return rows


def share(memory: JudgmentMemory, threads: int, calls: int, batched_every: int) -> list[tuple[int, torch.Tensor]]:
    """Every thread scores then learns its decisions (every ``batched_every``-th one as a batch of
    one through ``learn_``); a scorer thread records the scores it saw with the version they were
    taken at, whenever the version did not move during the call."""
    barrier = threading.Barrier(threads + 1)
    done = threading.Event()
    seen: list[tuple[int, torch.Tensor]] = []
    errors: list[BaseException] = []

    def learner(thread: int) -> None:
        try:
            barrier.wait()
            for i, (factors, action, category) in enumerate(decisions(thread, calls)):
                memory.score_one(factors, category)
                if i % batched_every == 0:
                    memory.learn_(torch.tensor(factors, dtype=torch.float32).unsqueeze(0),
                                  torch.tensor([CATEGORIES.index(category)]), torch.tensor([ACTIONS.index(action)]))
                else:
                    memory.learn_one(factors, action, category, confirmed=None)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def scorer() -> None:
        barrier.wait()
        while not done.is_set():
            before = memory.version
            with torch.no_grad():
                probs = memory(PROBES, PROBE_CATEGORIES).probs
            if memory.version == before:
                seen.append((before, probs))

    workers = [threading.Thread(target=learner, args=(t,)) for t in range(threads)]
    watcher = threading.Thread(target=scorer)
    for worker in (*workers, watcher):
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    watcher.join()
    assert not errors, errors
    return seen


def replay(config: JudgmentConfig, log: dict[str, torch.Tensor], checkpoints: set[int]) -> tuple[
        JudgmentMemory, dict[int, torch.Tensor]]:
    """A fresh memory fed the logged rows one by one, with its scores at the ``checkpoints`` versions."""
    serial = JudgmentMemory(CATEGORIES, ACTIONS, K, config)
    scores = {}
    for i in range(len(log["seq"])):
        if i in checkpoints:
            with torch.no_grad():
                scores[i] = serial(PROBES, PROBE_CATEGORIES).probs
        serial.learn_one(log["x"][i], int(log["action"][i]), int(log["category"][i]), confirmed=None)
    return serial, scores


def check_run(mode: str, threads: int, calls: int) -> None:
    config = MODES[mode]
    memory = JudgmentMemory(CATEGORIES, ACTIONS, K, config)
    seen = share(memory, threads, calls, batched_every=7)
    total = threads * calls
    log = memory.decision_log.events()
    assert int(memory.num_decisions) == total and memory.version == total
    assert torch.equal(log["seq"], torch.arange(total))  # one row per call, none twice, none lost
    if config.prototypes == 1:  # more prototypes: a spawn or a recycle starts a slot's count again
        assert int(memory.counts.sum()) == int((~log["skipped"]).sum())
    first = log["x"][:, 0].double()
    thread, call = first.floor().long(), ((first - first.floor()) * calls).round().long()
    taken = sorted(zip(thread.tolist(), call.tolist(), strict=True))
    assert taken == [(t, i) for t in range(threads) for i in range(calls)]
    for t in range(threads):  # each thread's calls were taken in the order it made them
        assert bool((call[thread == t].diff() > 0).all())
    serial, scores = replay(config, log, {version for version, _ in seen})
    for name, buffer in serial.state_dict().items():
        if isinstance(buffer, torch.Tensor):
            assert torch.equal(buffer, memory.state_dict()[name]), name
    replayed = serial.decision_log.events()
    for name, column in log.items():
        assert torch.equal(column, replayed[name]), name
    for version, probs in seen:  # every score came from the state of a whole number of calls
        if version in scores:
            assert torch.equal(probs, scores[version]), version


@pytest.mark.parametrize("mode", sorted(MODES))
def test_threads_share_one_memory(mode: str) -> None:
    check_run(mode, threads=8, calls=300)


@pytest.mark.slow
@pytest.mark.parametrize("run", range(20))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_threads_share_one_memory_heavy(mode: str, run: int) -> None:
    check_run(mode, threads=8, calls=5_000)


def test_a_copy_has_a_lock_of_its_own() -> None:
    import copy
    import pickle

    memory = JudgmentMemory(CATEGORIES, ACTIONS, K, config=JudgmentConfig.seed())
    memory.learn_one([0.5] * K, "approve", "invoice")
    for twin in (copy.deepcopy(memory), pickle.loads(pickle.dumps(memory))):
        assert twin._lock is not memory._lock
        with memory._lock:  # held here: the copy must not wait for it
            twin.learn_one([0.4] * K, "reject", "invoice")
        assert int(twin.num_decisions) == 2


def test_a_copy_taken_while_another_thread_learns_is_of_one_state() -> None:
    import copy

    memory = JudgmentMemory(CATEGORIES, ACTIONS, K, JudgmentConfig.recommended())
    done = threading.Event()

    def learner() -> None:
        for factors, action, category in decisions(0, 3_000):
            memory.learn_one(factors, action, category, confirmed=None)
        done.set()

    worker = threading.Thread(target=learner)
    worker.start()
    copies = []
    while not done.is_set():
        copies.append(copy.deepcopy(memory))
    worker.join()
    assert copies
    for twin in copies[:: max(1, len(copies) // 5)]:  # each one a whole number of calls, logs and state alike
        log = twin.decision_log.events()
        assert int(twin.num_decisions) == len(log["seq"])
        serial, _ = replay(JudgmentConfig.recommended(), log, set())
        for name, buffer in serial.named_buffers():
            assert torch.equal(buffer, twin.get_buffer(name)), name


def test_a_checkpoint_saved_while_another_thread_learns_is_whole() -> None:
    import io

    memory = JudgmentMemory(CATEGORIES, ACTIONS, K, JudgmentConfig.recommended())
    done = threading.Event()

    def learner() -> None:
        for factors, action, category in decisions(1, 3_000):
            memory.learn_one(factors, action, category, confirmed=None)
        done.set()

    worker = threading.Thread(target=learner)
    worker.start()
    saved = []
    while not done.is_set():
        buffer = io.BytesIO()
        torch.save(memory.state_dict(), buffer)  # serialized after state_dict returned, while learning goes on
        saved.append(buffer.getvalue())
    worker.join()
    for i, data in enumerate(saved):
        loaded = JudgmentMemory(CATEGORIES, ACTIONS, K, JudgmentConfig.recommended())
        loaded.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
        log = loaded.decision_log.events()
        assert int(loaded.num_decisions) == len(log["seq"]) == loaded.version  # buffers, log and counter agree
        if i % max(1, len(saved) // 5):
            continue
        serial, _ = replay(JudgmentConfig.recommended(), log, set())
        for name, buffer in serial.named_buffers():
            assert torch.equal(buffer, loaded.get_buffer(name)), name


class Parent(torch.nn.Module):
    """A model holding the memory and a second reference to its attention."""

    def __init__(self, memory: JudgmentMemory) -> None:
        super().__init__()
        self.memory, self.shared = memory, memory.criterion_logits


def test_pickling_keeps_torch_s_own_path() -> None:
    """Shared parameters stay shared, map_location is honoured, and state_dict entries are copies."""
    import io
    import pickle

    parent = Parent(JudgmentMemory(CATEGORIES, ACTIONS, K, config=JudgmentConfig.seed()))
    parent.memory.learn_one([0.5] * K, "approve", "invoice")
    again = pickle.loads(pickle.dumps(parent))
    assert again.shared is again.memory.criterion_logits
    buffer = io.BytesIO()
    torch.save(parent, buffer)
    mapped = []
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False, map_location=lambda storage, _: mapped.append(1) or storage)
    assert mapped and loaded.shared is loaded.memory.criterion_logits
    state = parent.state_dict()  # through the parent: the memory's entries are copies taken under its lock
    assert state["memory.centroids"].data_ptr() != parent.memory.centroids.data_ptr()
    assert torch.equal(state["memory.centroids"], parent.memory.centroids)
