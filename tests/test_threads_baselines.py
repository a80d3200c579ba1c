"""One KNNMemory or RetrievalMemory shared by many threads: no crash, nothing lost, a serial replay.

Eight threads start together (a barrier) and run their own programs of calls on one memory:
``score_one`` then ``learn_one`` for each decision, and in the mixed programs also batches
through ``prequential_`` and batched scoring through ``forward``. Each decision's factors name
its thread and its number, so the memory's stored traces (the ring of a k-NN, the store of a
retrieval memory) tell the order in which the memory took the learning calls. Then:

- every call returned, and the counts (``num_decisions``, stored traces, ids, version) equal the calls;
- the stored traces are the learned rows: each learning call's decisions together, in order,
  each thread's calls in its program's order;
- a fresh memory given the same calls one by one, in that order, returns what each learning
  call returned and ends with the same state, bit for bit;
- every score (``score_one``, ``forward``) equals the replay's score at one of the states the
  memory went through while that call could have run (after the thread's previous learning
  call, before its next): never a state half-way through a call.

A ring smaller than the calls keeps only the newest traces: there the kept suffix is checked
(each thread's newest decisions, in order) and the final state against a replay that ends with
it. The heavy version (8 threads x 5,000 decisions, 20 runs) is ``make test-slow``.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from gae import KNNMemory, RetrievalMemory

K = 6
ACTIONS = ("approve", "review", "escalate", "reject")
CATEGORIES = ("invoice", "refund", "travel")
THREADS = 8
PROBES = torch.rand(5, K, generator=torch.Generator().manual_seed(0))
PROBE_CATEGORIES = torch.tensor([0, 1, 2, 0, 1])


@pytest.fixture(autouse=True)
def interleave() -> Iterator[None]:
    """Switch threads as often as CPython allows, so that calls interleave inside each other (and
    one torch thread per op: on a loaded machine torch's own pool waits milliseconds per small op)."""
    interval, torch_threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(1e-6)
    torch.set_num_threads(1)
    yield
    sys.setswitchinterval(interval)
    torch.set_num_threads(torch_threads)


class Op(NamedTuple):
    kind: str  # 'score', 'learn_one', 'batch' (prequential_) or 'forward'
    decisions: tuple[int, ...]  # the thread's decisions it carries ('score': the one it scores)


class Program(NamedTuple):
    rows: np.ndarray  # (calls, K) float64 holding float32 values: what a float32 memory stores, exactly
    actions: list[int]
    categories: list[int]
    ops: list[Op]
    learn_op: dict[int, int]  # decision -> index of the op that learns it


def program(seed: int, thread: int, calls: int, mixed: bool) -> Program:
    """A thread's decisions and calls. Factor 0 is 1, factor 1 names the thread and factor 2 the
    decision, so that a stored trace, even centred and normalised, tells which call stored it."""
    rng = np.random.default_rng([seed, thread])
    rows = rng.random((calls, K))
    rows[:, 0] = 1.0
    rows[:, 1] = 0.5 + (thread + 1) / 32
    rows[:, 2] = 0.5 + (np.arange(calls) + 1) / (2 * calls)
    rows = rows.astype(np.float32).astype(np.float64)
    actions = rng.integers(len(ACTIONS), size=calls).tolist()
    categories = rng.integers(len(CATEGORIES), size=calls).tolist()
    ops: list[Op] = []
    d = 0
    while d < calls:
        draw = rng.random() if mixed else 0.0
        if draw < 0.6:
            ops += [Op("score", (d,)), Op("learn_one", (d,))]
            d += 1
        elif draw < 0.8:
            n = min(calls - d, int(rng.integers(1, 4)))
            ops.append(Op("batch", tuple(range(d, d + n))))
            d += n
        else:
            ops.append(Op("forward", ()))
    learn_op = {e: i for i, op in enumerate(ops) if op.kind in ("learn_one", "batch") for e in op.decisions}
    return Program(rows, actions, categories, ops, learn_op)


def call(memory: Any, prog: Program, op: Op) -> Any:
    if op.kind == "forward":
        with torch.no_grad():
            return memory(PROBES, PROBE_CATEGORIES)
    d = op.decisions
    if op.kind == "score":
        return memory.score_one(prog.rows[d[0]], CATEGORIES[prog.categories[d[0]]])
    if op.kind == "learn_one":
        return memory.learn_one(prog.rows[d[0]], ACTIONS[prog.actions[d[0]]], CATEGORIES[prog.categories[d[0]]])
    categories, actions = torch.tensor([prog.categories[e] for e in d]), torch.tensor([prog.actions[e] for e in d])
    return memory.prequential_(torch.tensor(prog.rows[list(d)], dtype=torch.float32), categories, actions)


def share(memory: Any, programs: list[Program]) -> list[list[Any]]:
    """Every thread runs its program on the memory at once; what each call returned."""
    barrier = threading.Barrier(len(programs))
    results: list[list[Any]] = [[] for _ in programs]
    errors: list[BaseException] = []
    torch_threads = torch.get_num_threads()

    def run(thread: int) -> None:
        try:
            torch.set_num_threads(torch_threads)  # OpenMP keeps one per thread: score as the replay will, to the bit
            barrier.wait()
            for op in programs[thread].ops:
                results[thread].append(call(memory, programs[thread], op))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(len(programs))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results


def same(a: Any, b: Any) -> bool:
    """Equal to the bit (NaN equal to NaN), through tuples, lists and dicts."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and bool((a == b).logical_or(a.isnan() & b.isnan() if a.is_floating_point() else a != a).all()))
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return bool(a == b)


def stored(memory: Any, total: int) -> np.ndarray:
    """The stored traces, oldest first, centred (k-NN) or as stored (retrieval: centred and
    normalised), after checking that they are the newest decisions, numbered without a gap."""
    if isinstance(memory, KNNMemory):
        n = len(memory)
        slots = torch.arange(n) if n < memory.capacity else torch.argsort(memory.store_steps)
        assert memory.store_steps[slots].tolist() == list(range(total - n, total))
        return memory.store_factors[slots].double().numpy() - 0.5
    ids = memory.store.column("ids")
    assert ids.tolist() == list(range(total))
    return memory.store.column("embeddings").double().numpy()


def learn_order(memory: Any, programs: list[Program], calls: int) -> list[tuple[int, int]]:
    """The learning calls ``(thread, op index)`` in the order the memory took them, read from its
    stored traces, after checking that each call's decisions are stored together and in order,
    and each thread's calls in program order (the newest ones only, when the ring dropped some)."""
    total = len(programs) * calls
    traces = stored(memory, total)
    thread = np.rint(16 * traces[:, 1] / traces[:, 0]).astype(int) - 1
    decision = np.rint(calls * traces[:, 2] / traces[:, 0]).astype(int) - 1
    decoded = list(zip(thread.tolist(), decision.tolist(), strict=True))
    order: list[tuple[int, int]] = []
    i = 0
    while i < len(decoded):
        t, d = decoded[i]
        assert 0 <= t < len(programs) and 0 <= d < calls, f"trace {i} is no decision of the test: {decoded[i]}"
        index = programs[t].learn_op[d]
        op = programs[t].ops[index]
        got = decoded[i:i + len(op.decisions)]
        assert got == [(t, e) for e in op.decisions], f"a call's decisions are not stored together: {got}, {op}"
        order.append((t, index))
        i += len(op.decisions)
    for t, prog in enumerate(programs):
        mine = [index for u, index in order if u == t]
        everything = sorted(set(prog.learn_op.values()))
        assert mine == everything[len(everything) - len(mine):], f"thread {t}'s calls out of program order"
    assert len(set(order)) == len(order)
    return order


def check_replay(memory: Any, factory: Callable[[], Any], programs: list[Program], results: list[list[Any]],
                 order: list[tuple[int, int]], reads: bool = True) -> None:
    """Replay the learning calls in ``order`` on a fresh memory: each returns what it returned on
    the shared memory, each score matches a state of its window (with ``reads``), and the final
    states are equal."""
    replay = factory()
    position = {key: p for p, key in enumerate(order)}
    opening: dict[int, list[tuple[int, int, int]]] = {}  # state -> the reads whose window opens there
    for t, prog in enumerate(programs):
        lo = 0
        for index, op in enumerate(prog.ops):
            if op.kind in ("learn_one", "batch"):
                lo = position[t, index] + 1
            elif reads:
                hi = next((position[t, j] for j in range(index + 1, len(prog.ops)) if (t, j) in position), len(order))
                opening.setdefault(lo, []).append((hi, t, index))
    active: list[tuple[int, int, int]] = []
    for state in range(len(order) + 1):  # the replay holds the state after `state` learning calls
        active += opening.get(state, [])
        still = []
        for hi, t, index in active:
            if not same(call(replay, programs[t], programs[t].ops[index]), results[t][index]):
                assert hi > state, (f"thread {t}'s {programs[t].ops[index]} answered {results[t][index]}: no state "
                                    "it could have seen gives that")
                still.append((hi, t, index))
        active = still
        if state < len(order):
            t, index = order[state]
            assert same(call(replay, programs[t], programs[t].ops[index]), results[t][index]), \
                f"thread {t}'s {programs[t].ops[index]} returned otherwise than in the replay"
    assert same(memory.state_dict(), replay.state_dict())


def check_suffix(memory: Any, factory: Callable[[], Any], programs: list[Program],
                 order: list[tuple[int, int]]) -> None:
    """A ring that kept only the newest calls: replay the others first (in any order: the ring
    forgets them), then the kept ones in the order taken; the final states are equal."""
    replay = factory()
    kept = set(order)
    for t, prog in enumerate(programs):
        for index, op in enumerate(prog.ops):
            if op.kind == "learn_one" and (t, index) not in kept:
                call(replay, prog, op)
    for t, index in order:
        call(replay, programs[t], programs[t].ops[index])
    assert same(memory.state_dict(), replay.state_dict())


FACTORIES: dict[str, Callable[[int], Any]] = {
    "knn": lambda capacity: KNNMemory(factors=K, actions=ACTIONS, k=3, capacity=capacity, categories=CATEGORIES),
    "knn_scoped": lambda capacity: KNNMemory(factors=K, actions=ACTIONS, k=3, capacity=capacity, categories=CATEGORIES,
                                             scoped=True),
    "retrieval": lambda capacity: RetrievalMemory(factors=K, actions=ACTIONS, k=3, capacity=capacity,
                                                  categories=CATEGORIES),
    "retrieval_scoped": lambda capacity: RetrievalMemory(factors=K, actions=ACTIONS, k=3, capacity=capacity,
                                                         categories=CATEGORIES, scoped=True),
}


def shared_run(name: str, seed: int, calls: int, mixed: bool, capacity: int | None = None, reads: bool = True) -> None:
    """One run: share, then check everything the module's docstring lists (the scores too, with ``reads``)."""
    total = THREADS * calls
    capacity = total if capacity is None else capacity

    def factory() -> Any:
        return FACTORIES[name](capacity)

    memory = factory()
    programs = [program(seed, t, calls, mixed) for t in range(THREADS)]
    results = share(memory, programs)
    assert int(memory.num_decisions) == total
    assert len(memory if isinstance(memory, KNNMemory) else memory.store) == min(total, capacity)
    if isinstance(memory, RetrievalMemory):  # no eviction: one add per decision
        assert memory.version == total and len(memory.labels) == total
        assert [r.action for r in memory.store.audit_log] == ["add"] * total
    order = learn_order(memory, programs, calls)
    if capacity >= total:
        assert len(order) == sum(len(set(p.learn_op.values())) for p in programs)
        check_replay(memory, factory, programs, results, order, reads)
    else:
        check_suffix(memory, factory, programs, order)


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("mixed", [False, True], ids=["one_by_one", "mixed"])
def test_shared_memory_equals_a_serial_replay(name: str, mixed: bool) -> None:
    calls = {(False, "knn"): 150, (True, "knn"): 60, (False, "retrieval"): 40, (True, "retrieval"): 30}
    for seed in range(2):
        shared_run(name, seed, calls=calls[mixed, name.partition("_")[0]], mixed=mixed)


@pytest.mark.parametrize("name", ["knn", "knn_scoped"])
def test_a_full_ring_keeps_the_newest_calls(name: str) -> None:
    for seed in range(2):
        shared_run(name, seed, calls=500, mixed=False, capacity=50)


@pytest.mark.parametrize("name", ["knn", "retrieval"])
def test_copies_taken_while_threads_learn_are_of_one_state(name: str) -> None:
    """``copy.deepcopy`` and ``state_dict`` from a thread of their own while eight threads learn:
    each copy's counts agree with each other (decisions seen, traces or memories stored, ids,
    labels). Pickle keeps torch's own path and is not locked (gae/_base.py)."""
    calls = 100
    memory = FACTORIES[name](THREADS * calls + 1)  # never full: the ring's head counts the decisions
    programs = [program(0, t, calls, mixed=False) for t in range(THREADS)]
    done = threading.Event()
    torn: list[tuple[int, ...]] = []

    def copier() -> None:
        while not done.is_set():
            twins = [copy.deepcopy(memory)]
            if isinstance(memory, KNNMemory):  # a checkpoint taken while others learn, loaded into a fresh memory
                twins.append(FACTORIES[name](THREADS * calls + 1))
                twins[-1].load_state_dict(memory.state_dict())
            for twin in twins:
                n = int(twin.num_decisions)
                if isinstance(twin, KNNMemory):
                    counts = (n, *twin.ring.tolist(), int(twin.store_factors.any(1).sum()))
                else:
                    counts = (n, len(twin.store), twin.version, len(twin.labels), len(twin.store.audit_log))
                if len(set(counts)) != 1:
                    torn.append(counts)

    watcher = threading.Thread(target=copier)
    watcher.start()
    try:
        share(memory, programs)
    finally:
        done.set()
        watcher.join()
    assert not torn, torn[:3]
    assert int(memory.num_decisions) == THREADS * calls


@pytest.mark.slow
@pytest.mark.parametrize("name", ["knn", "knn_scoped", "retrieval"])
def test_heavy(name: str) -> None:
    """8 threads x 5,000 decisions, 20 runs. A k-NN at capacity 400 (its ring's newest calls are
    checked); with every call kept, one run checks every score against the replay too, and a
    retrieval memory (whose eviction is not first in, first out) keeps every call in every run."""
    for seed in range(20):
        if name.startswith("knn"):
            shared_run(name, seed, calls=5000, mixed=False, capacity=400)
        if seed == 0 or not name.startswith("knn"):
            shared_run(name, seed, calls=5000, mixed=False, reads=seed == 0)
