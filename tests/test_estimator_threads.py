"""Threads sharing one estimator: gae.river's classifiers and gae.sklearn's never crash, never lose
an update, and end in the state a serial replay of the same calls, in the order the memory took
them, leaves; every answer a thread got is the answer of a state between two whole calls.

The order is read back from the memory: each call's factors are unique, so the rows of the
judgment memory's decision log (or of the k-NN ring) name the calls in the order they were
learned."""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch

from gae import JudgmentConfig

THREADS = 8
LABELS = ["no", "yes", "maybe"]  # 'maybe' and desk 'd3' appear only in each thread's second half
SEED = {name: getattr(JudgmentConfig.seed(), name) for name in JudgmentConfig.options()}
Call = tuple[int, int]  # (thread, its call number)


@pytest.fixture(autouse=True)
def frequent_switches() -> Iterator[None]:
    """Switch threads every 10 us instead of CPython's 5 ms, so that calls interleave at many points."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def run_threads(work: Callable[[int], None]) -> None:
    """``work(thread)`` in THREADS threads released together; the first error any of them raised."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def target(thread: int) -> None:
        try:
            barrier.wait()
            work(thread)
        except BaseException as error:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=target, args=(thread,)) for thread in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads), "a thread never finished (a deadlock?)"
    if errors:
        raise errors[0]


def equal(a: Any, b: Any) -> bool:
    """Equal values, tensors and arrays compared by dtype, shape and every element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and np.array_equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(u, v) for u, v in zip(a, b, strict=True))
    return a == b


def assert_same_estimator(shared: Any, serial: Any, memory_attribute: str) -> None:
    """The same memory state_dict and the same attributes of the estimator's own."""
    assert equal(getattr(shared, memory_attribute).state_dict(), getattr(serial, memory_attribute).state_dict())
    own = [name for name in vars(shared) if name not in (memory_attribute, "_lock")]
    assert own == [name for name in vars(serial) if name not in (memory_attribute, "_lock")]
    for name in own:
        assert equal(getattr(shared, name), getattr(serial, name)), name


def key(row: Any) -> bytes:
    """A row of factors as the memory stores it (float32), to look its call up by."""
    return np.asarray(row, dtype=np.float32).tobytes()


def check_order(order: list[Call], calls: list[Call]) -> list[Call]:
    """``order``, after checking it holds every call once and each thread's calls in its own order."""
    assert sorted(order) == sorted(calls), "a call is missing from the memory, or in it twice"
    for thread in range(THREADS):
        mine = [step for owner, step in order if owner == thread]
        assert mine == sorted(mine), f"thread {thread}'s calls were learned out of its order"
    return order


def replay(serial: Any, order: list[Call], learn: Callable[[Any, Call], None],
           answers: dict[Call, tuple[Any, ...]] | None, answer: Callable[[Any, Call], tuple[Any, ...]]) -> None:
    """Learn the calls on ``serial`` in ``order``. With ``answers`` (what each thread got just before
    each of its calls), check each of them is ``answer`` of some state between the thread's previous
    call and that one: scoring never sees half a call."""
    next_call = dict.fromkeys(range(THREADS), 0)
    matched: set[tuple[Call, int]] = set()
    for thread, step in order:
        if answers is not None:
            for owner, pending in next_call.items():  # each thread's next call is waiting: its answer is due
                call = (owner, pending)
                if call not in answers or all((call, j) in matched for j in range(len(answers[call]))):
                    continue
                now = answer(serial, call)
                matched.update((call, j) for j, got in enumerate(answers[call]) if equal(got, now[j]))
            assert all(((thread, step), j) in matched for j in range(len(answers[thread, step]))), \
                f"thread {thread}'s answers before its call {step} come from no state between two whole calls"
        learn(serial, (thread, step))
        next_call[thread] = step + 1


# -- gae.river ---------------------------------------------------------------------------------------
def river_stream(seed: int, per_thread: int) -> list[list[tuple[dict[str, Any], str]]]:
    """Each thread's (x, y): a desk and two factors around a centre per (desk, label)."""
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(THREADS):
        rows = []
        for step in range(per_thread):
            late = step >= per_thread // 2
            desk, label = int(rng.integers(0, 4 if late else 3)), int(rng.integers(0, 3 if late else 2))
            a, b = 0.3 * label + 0.1 * desk + 0.05 * rng.standard_normal(2)
            rows.append(({"desk": f"d{desk}", "a": float(a), "b": float(b)}, LABELS[label]))
        calls.append(rows)
    return calls


def river_models() -> dict[str, Callable[..., Any]]:
    pytest.importorskip("river")
    from gae.river import JudgmentClassifier, KNNClassifier

    return {"judgment-recommended": lambda **kw: JudgmentClassifier(category="desk", **kw),
            "judgment-seed": lambda **kw: JudgmentClassifier(category="desk", **{**SEED, **kw}),
            "knn": lambda capacity: KNNClassifier(category="desk", k=3, capacity=capacity)}


def river_order(model: Any, calls_of_row: dict[bytes, Call]) -> list[Call]:
    memory = model.memory
    if hasattr(memory, "decision_log"):
        rows = memory.decision_log.events()["x"].numpy()
    else:  # the k-NN ring, large enough to hold every decision: its steps are the order
        n = len(memory)
        rows = memory.store_factors[:n][torch.argsort(memory.store_steps[:n])].numpy()
    return check_order([calls_of_row[key(row)] for row in rows], list(calls_of_row.values()))


def check_river(name: str, seed: int, per_thread: int, check_answers: bool, **options: Any) -> None:
    calls = river_stream(seed, per_thread)
    calls_of_row = {key([x["a"], x["b"]]): (thread, step)
                    for thread, rows in enumerate(calls) for step, (x, _) in enumerate(rows)}
    total = THREADS * per_thread
    assert len(calls_of_row) == total  # every call's factors are its own
    make = river_models()[name]
    model = make(capacity=total, **options) if name == "knn" else make(**options)
    answers: dict[Call, tuple[Any, ...]] = {}

    def work(thread: int) -> None:
        for step, (x, y) in enumerate(calls[thread]):
            if check_answers:
                answers[thread, step] = (model.predict_proba_one(x), model.predict_one(x))
            else:
                model.predict_proba_one(x)
            model.learn_one(x, y)

    run_threads(work)
    assert int(model.memory.num_decisions) == total and sum(model._counts) == total  # no update lost
    order = river_order(model, calls_of_row)
    serial = model.clone()

    def learn(target: Any, call: Call) -> None:
        target.learn_one(*calls[call[0]][call[1]])

    def answer(target: Any, call: Call) -> tuple[Any, ...]:
        x = calls[call[0]][call[1]][0]
        return target.predict_proba_one(x), target.predict_one(x)

    replay(serial, order, learn, answers if check_answers else None, answer)
    assert_same_estimator(model, serial, "memory")


@pytest.mark.parametrize("name", ["judgment-recommended", "judgment-seed", "knn"])
def test_river_classifier_shared_by_threads(name):
    check_river(name, seed=0, per_thread=40, check_answers=True)


def test_river_classifier_with_a_bounded_log_shared_by_threads():
    pytest.importorskip("river")
    from gae.river import JudgmentClassifier

    bound, per_thread = 64, 40
    calls = river_stream(1, per_thread)
    model = JudgmentClassifier(category="desk", max_log_events=bound)

    def work(thread: int) -> None:
        for x, y in calls[thread]:
            model.predict_one(x)
            model.learn_one(x, y)

    run_threads(work)
    memory, total = model.memory, THREADS * per_thread
    assert int(memory.num_decisions) == total and sum(model._counts) == total
    assert sorted(model._labels) == sorted(LABELS) and memory.action_names == tuple(model._labels_names)
    assert sorted(model._categories) == ["d0", "d1", "d2", "d3"]
    assert memory.category_names == tuple(model._categories)  # one name each, in the memory's order
    log = memory.decision_log
    assert 0 < len(log) <= bound  # folded, several times
    assert int(log.base["num_decisions"]) + len(log) == total  # the base and the log account for every decision


# -- gae.sklearn -------------------------------------------------------------------------------------
def sklearn_stream(seed: int, per_thread: int, chunk: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Each thread's partial_fit calls: (X (chunk, 3), the category id in the last column; y (chunk,))."""
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(THREADS):
        rows = []
        for step in range(per_thread):
            late = step >= per_thread // 2
            desk, label = rng.integers(0, 4 if late else 3, chunk), rng.integers(0, 3 if late else 2, chunk)
            x = (0.3 * label + 0.1 * desk)[:, None] + 0.05 * rng.standard_normal((chunk, 2))
            rows.append((np.column_stack([x, desk]), np.array(LABELS, dtype=object)[label]))
        calls.append(rows)
    return calls


def sklearn_answer(model: Any, X: np.ndarray) -> tuple[Any, ...]:
    from sklearn.exceptions import NotFittedError

    try:
        return model.predict_proba(X), model.predict(X)
    except NotFittedError:
        return None, None


def check_sklearn(options: dict[str, Any], seed: int, per_thread: int, check_answers: bool, chunk: int = 4) -> None:
    pytest.importorskip("sklearn")
    from sklearn.base import clone

    from gae.sklearn import JudgmentClassifier

    calls = sklearn_stream(seed, per_thread, chunk)
    rows_of = {key(X[row, :2]): ((thread, step), row) for thread, chunks in enumerate(calls)
               for step, (X, _) in enumerate(chunks) for row in range(chunk)}
    assert len(rows_of) == THREADS * per_thread * chunk
    model = JudgmentClassifier(category=2, **options)
    answers: dict[Call, tuple[Any, ...]] = {}

    def work(thread: int) -> None:
        for step, (X, y) in enumerate(calls[thread]):
            got = sklearn_answer(model, X)
            if check_answers:
                answers[thread, step] = got
            model.partial_fit(X, y, classes=LABELS)

    run_threads(work)
    memory = model.memory_
    assert int(memory.num_decisions) == THREADS * per_thread * chunk
    assert model.class_count_.sum() == THREADS * per_thread * chunk
    learned = [rows_of[key(row)] for row in memory.decision_log.events()["x"].numpy()]
    order = [call for call, _ in learned[::chunk]]
    assert learned == [(call, row) for call in order for row in range(chunk)]  # each call's rows together
    check_order(order, [(thread, step) for thread in range(THREADS) for step in range(per_thread)])
    serial = clone(model)

    def learn(target: Any, call: Call) -> None:
        target.partial_fit(*calls[call[0]][call[1]], classes=LABELS)

    replay(serial, order, learn, answers if check_answers else None,
           lambda target, call: sklearn_answer(target, calls[call[0]][call[1]][0]))
    assert_same_estimator(model, serial, "memory_")


@pytest.mark.parametrize("options", [{}, SEED], ids=["recommended", "seed"])
def test_sklearn_classifier_shared_by_threads(options):
    check_sklearn(options, seed=2, per_thread=12, check_answers=True)


# -- the heavy versions: make test-slow (about half an hour on one core) -----------------------------
@pytest.mark.slow
@pytest.mark.parametrize("run", range(20))
@pytest.mark.parametrize("name", ["judgment-recommended", "judgment-seed", "knn"])
def test_river_classifier_shared_by_threads_heavy(name, run):
    if name == "knn":  # the ring must hold every decision to name its place: scoring grows with it
        check_river(name, seed=100 + run, per_thread=1_250, check_answers=False)
    else:  # 8 x 5,000 decisions, and the whole log (max_log_events=None), so that it names every call's place
        check_river(name, seed=100 + run, per_thread=5_000, check_answers=False, max_log_events=None)


@pytest.mark.slow
@pytest.mark.parametrize("run", range(20))
@pytest.mark.parametrize("options", [{}, SEED], ids=["recommended", "seed"])
def test_sklearn_classifier_shared_by_threads_heavy(options, run):
    # 8 threads x 250 calls of 20 rows: 5,000 decisions a thread
    check_sklearn({**options, "max_log_events": None}, seed=200 + run, per_thread=250, check_answers=False,
                  chunk=20)


def take_and_release(lock: Any, out: list[bool]) -> None:
    taken = lock.acquire(timeout=5)
    if taken:
        lock.release()
    out.append(taken)


def test_copies_of_a_shared_estimator_get_locks_of_their_own():
    pytest.importorskip("river")
    pytest.importorskip("sklearn")
    import pickle

    from sklearn.base import clone

    from gae.river import JudgmentClassifier as RiverClassifier
    from gae.river import KNNClassifier
    from gae.sklearn import JudgmentClassifier as SklearnClassifier

    river_models = [RiverClassifier(category="desk"), KNNClassifier(category="desk")]
    for model in river_models:
        model.learn_one({"desk": "a", "v": 0.5}, "x")
    fitted = SklearnClassifier().fit([[0.0], [1.0]], ["a", "b"])
    copies = [(model, copier(model)) for model in river_models
              for copier in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), lambda m: m.clone(),
                             lambda m: m.clone(include_attributes=True))]
    copies += [(fitted, copier(fitted)) for copier in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)),
                                                       clone)]
    for original, duplicate in copies:
        assert type(duplicate._lock) is type(original._lock) and duplicate._lock is not original._lock
        with original._lock:  # held here: the copy's own lock is free for another thread
            free: list[bool] = []
            probe = threading.Thread(target=take_and_release, args=(duplicate._lock, free))
            probe.start()
            probe.join()
            assert free == [True]
    assert "_lock" not in SklearnClassifier().get_params() and "_lock" not in river_models[0]._get_params()
