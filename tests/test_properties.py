"""Property-based tests (hypothesis) of JudgmentMemory and KNNMemory.

Every property runs on small hypothesis-drawn streams (1-4 categories, actions and factors,
up to a few dozen decisions, factors in [0, 1]) with hypothesis-drawn hyperparameters. The
settings are derandomized, so the suite is deterministic, and sized to run in a few seconds.

The last tests pin down, as plain regressions, three disagreements between paths that these
properties once found (threshold comparisons in float32 vs float64, a stale score_one cache).
"""

from __future__ import annotations

import copy
import itertools
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gae import JudgmentConfig, JudgmentMemory, KNNMemory

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
FEW = settings(max_examples=30, deadline=None, derandomize=True, database=None)

UNIT32 = st.floats(0.0, 1.0, width=32)  # factors: exactly representable in float32


def as_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


@st.composite
def streams(draw, max_n: int = 30, max_categories: int = 3, max_actions: int = 4, max_factors: int = 4,
            confirmed: bool = True):
    """(shape, x, category, action, confirmed or None, skip) of a small decision stream."""
    n_categories = draw(st.integers(1, max_categories))
    n_actions = draw(st.integers(1, max_actions))
    n_factors = draw(st.integers(1, max_factors))
    n = draw(st.integers(1, max_n))
    x = draw(hnp.arrays(np.float32, (n, n_factors), elements=UNIT32))
    category = draw(hnp.arrays(np.int64, n, elements=st.integers(0, n_categories - 1)))
    action = draw(hnp.arrays(np.int64, n, elements=st.integers(0, n_actions - 1)))
    skip = draw(st.just(np.zeros(n, dtype=bool)) | hnp.arrays(np.bool_, n))
    flags = draw(st.none() | hnp.arrays(np.bool_, n)) if confirmed else None
    tensors = [as_tensor(t) for t in (x, category, action)]
    return ((n_categories, n_actions, n_factors), *tensors,
            None if flags is None else as_tensor(flags), as_tensor(skip))


# Thresholds are compared in float64 by every path, so any float is a fair draw.
THRESHOLD = st.floats(0.0, 1.5)


@st.composite
def judgment_kwargs(draw, options: bool = True):
    kwargs = {
        "tau": draw(st.sampled_from([0.1, 1.0]) | st.floats(0.02, 2.0)),
        "eta_confirmed": draw(st.sampled_from([0.05, 1.0]) | st.floats(0.001, 1.0)),
        "eta_override": draw(st.sampled_from([0.01]) | st.floats(0.001, 1.0)),
        "drift_threshold": draw(st.sampled_from([0.4]) | THRESHOLD),
        "gate_damping": draw(st.sampled_from([0.5, 1.0]) | st.floats(0.01, 1.0)),
    }
    if options:
        kwargs["clip"] = draw(st.sampled_from([None, (0.0, 1.0), (0.25, 0.75)]))
        kwargs["push_rate"] = draw(st.sampled_from([0.0, 0.02]) | st.floats(0.001, 0.5))
        kwargs["min_confidence"] = draw(st.sampled_from([0.0, 0.5]) | st.floats(0.0, 1.0, width=32))
    return kwargs


def make_judgment(shape, kwargs, attention=None, backend="compiled") -> JudgmentMemory:
    memory = JudgmentMemory(*shape, **{"config": JudgmentConfig.seed(), **kwargs})
    memory.backend = backend
    if attention is not None:
        with torch.no_grad():
            memory.criterion_logits.copy_(attention)
    return memory


@st.composite
def attentions(draw, shape):
    n_categories, _, n_factors = shape
    logits = draw(st.none() | hnp.arrays(np.float32, (n_categories, n_factors),
                                         elements=st.floats(-2.0, 2.0, width=32)))
    return None if logits is None else as_tensor(logits)


def tensors_of(memory: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in memory.state_dict().items() if isinstance(v, torch.Tensor)}


def assert_gate_logs_equal(a: JudgmentMemory, b: JudgmentMemory) -> None:
    for name, left, right in zip(a.gate_log._fields, a.gate_log, b.gate_log, strict=True):
        assert torch.equal(left, right), name


def has_prototype_before(category: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """(B,) bool: an earlier, non-skipped decision created a prototype in this category."""
    seen: set[int] = set()
    known = []
    for c, s in zip(category.tolist(), skip.tolist(), strict=True):
        known.append(c in seen)
        if not s:
            seen.add(c)
    return torch.tensor(known, dtype=torch.bool)


def assert_rows_are_distributions(probs: torch.Tensor, action: torch.Tensor, confidence: torch.Tensor,
                                  known: torch.Tensor) -> None:
    """Rows with evidence sum to 1; rows without are all zero and abstain."""
    assert (probs >= 0).all() and torch.isfinite(probs).all()
    if known.any():
        torch.testing.assert_close(probs[known].sum(-1).double(), torch.ones(int(known.sum()), dtype=torch.float64),
                                   rtol=0, atol=1e-5)
    assert (probs[~known] == 0).all()
    assert (action[~known] == -1).all() and (confidence[~known] == 0).all()
    recommending = action >= 0
    assert torch.equal(probs[recommending].gather(1, action[recommending].unsqueeze(1)).squeeze(1),
                       confidence[recommending])


# ---------------------------------------------------------------------------------------
# 1. probabilities are distributions exactly where there is evidence
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), case=streams())
def test_judgment_probs_sum_to_one(data, case):
    shape, x, category, action, confirmed, skip = case
    kwargs = data.draw(judgment_kwargs())
    memory = make_judgment(shape, kwargs, data.draw(attentions(shape)))
    step = memory.prequential_(x, category, action, confirmed, skip)
    out = step.output
    known = has_prototype_before(category, skip)
    assert_rows_are_distributions(out.probs, out.action, out.confidence, known)
    assert torch.equal(torch.isfinite(out.logits).any(-1), known)
    # the recommendation is the arg-max logit (ties: lowest index) unless its probability is
    # below min_confidence (drawn exactly representable in float32, see THRESHOLD)
    best = out.logits.argmax(-1)
    unsure = out.probs.gather(1, best.unsqueeze(1)).squeeze(1).double() < kwargs["min_confidence"]
    assert torch.equal(out.action, torch.where(known & ~unsure, best, -1))

    # forward on the final state, every category: compiled no-grad path and autograd path
    queries = data.draw(hnp.arrays(np.float32, (8, shape[2]), elements=UNIT32))
    cats = torch.arange(8) % shape[0]
    known = memory.initialized.flatten(1).any(-1)[cats]  # (C, A, P) -> (C,): the category has a prototype
    with torch.no_grad():
        fast = memory(as_tensor(queries), cats)
    slow = memory(as_tensor(queries), cats)  # criterion_logits requires grad: the torch path
    for out in (fast, slow):
        assert_rows_are_distributions(out.probs.detach(), out.action, out.confidence.detach(), known)
    torch.testing.assert_close(fast.probs, slow.probs.detach(), rtol=1e-5, atol=1e-5)


@st.composite
def knn_setup(draw):
    n_factors = draw(st.integers(1, 4))
    n_actions = draw(st.integers(1, 4))
    capacity = draw(st.integers(1, 12))
    k = draw(st.integers(1, capacity))
    scoped = draw(st.booleans())
    respect_skip = draw(st.booleans())
    n = draw(st.integers(1, 40))
    n_categories = 3
    x = draw(hnp.arrays(np.float32, (n, n_factors), elements=UNIT32))
    category = draw(hnp.arrays(np.int64, n, elements=st.integers(0, n_categories - 1)))
    action = draw(hnp.arrays(np.int64, n, elements=st.integers(0, n_actions - 1)))
    skip = draw(hnp.arrays(np.bool_, n))
    memory = KNNMemory(factors=n_factors, actions=n_actions, k=k, capacity=capacity, categories=n_categories,
                       scoped=scoped, respect_skip=respect_skip)
    return memory, as_tensor(x), as_tensor(category), as_tensor(action), as_tensor(skip)


@SETTINGS
@given(setup=knn_setup())
def test_knn_probs_sum_to_one_once_k_traces_are_visible(setup):
    memory, x, category, action, skip = setup
    step = memory.prequential_(x, category, action, None, skip)
    store: deque[int] = deque(maxlen=memory.capacity)  # categories of the stored traces, FIFO
    visible = []
    for c, s in zip(category.tolist(), skip.tolist(), strict=True):
        visible.append(sum(t == c for t in store) if memory.scoped else len(store))
        if not (s and memory.respect_skip):
            store.append(c)
    known = torch.tensor(visible) >= memory.k
    out = step.output
    assert_rows_are_distributions(out.probs, out.action, out.confidence, known)
    assert len(memory) == len(store)
    assert torch.equal(step.events.applied, ~(skip & memory.respect_skip))


# ---------------------------------------------------------------------------------------
# 2. the gate damps a step by exactly gate_damping
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(
    x0=hnp.arrays(np.float32, 4, elements=UNIT32),
    x1=hnp.arrays(np.float32, 4, elements=UNIT32),
    eta_confirmed=st.floats(0.001, 1.0),
    eta_override=st.floats(0.001, 1.0),
    gate_damping=st.floats(0.01, 1.0),
    confirmed=st.none() | st.booleans(),
    backend=st.sampled_from(["compiled", "reference"]),
)
def test_gated_step_is_damped_step(x0, x1, eta_confirmed, eta_override, gate_damping, confirmed, backend):
    assume(np.abs(x1 - x0).max() > 1e-3)  # a displacement that float32 sees as > 0
    kwargs = dict(eta_confirmed=eta_confirmed, eta_override=eta_override, gate_damping=gate_damping)
    free = make_judgment((1, 2, 4), dict(kwargs, drift_threshold=1e6), backend=backend)
    gated = make_judgment((1, 2, 4), dict(kwargs, drift_threshold=0.0), backend=backend)
    flag = None if confirmed is None else torch.tensor([confirmed])
    events = []
    for memory in (free, gated):
        first = memory.learn_(as_tensor(x0[None]), torch.tensor([0]), torch.tensor([1]))
        assert first.initialized.all() and not first.gated.any()  # first touch: no gate
        events.append(memory.learn_(as_tensor(x1[None]), torch.tensor([0]), torch.tensor([1]), flag))
    assert not events[0].gated.any() and events[1].gated.all()
    # with one prototype the memory recommends action 1 itself: confirmed=None means confirmed
    eta = np.float32(eta_confirmed if confirmed in (None, True) else eta_override)
    assert float(events[0].eta[0]) == eta
    assert float(events[1].eta[0]) == eta * np.float32(gate_damping)
    assert float(events[0].displacement[0]) == float(events[1].displacement[0]) > 0
    start = torch.from_numpy(x0).double()
    free_step = free.centroids[0, 1, 0].double() - start
    gated_step = gated.centroids[0, 1, 0].double() - start
    torch.testing.assert_close(gated_step, gate_damping * free_step, rtol=0, atol=1e-6)
    assert len(gated.gate_log.step) == 1 and len(free.gate_log.step) == 0
    torch.testing.assert_close(gated.gate_log.eta, events[1].eta, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# 3. skipped decisions change nothing
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), prefix=streams(max_n=15), n_skipped=st.integers(1, 15))
def test_skip_changes_nothing(data, prefix, n_skipped):
    shape, x, category, action, confirmed, skip = prefix
    memory = make_judgment(shape, data.draw(judgment_kwargs()), data.draw(attentions(shape)))
    memory.learn_(x, category, action, confirmed, skip)
    before, decisions_before = tensors_of(memory), int(memory.num_decisions)
    log_before = tuple(t.clone() for t in memory.gate_log)

    xs = as_tensor(data.draw(hnp.arrays(np.float32, (n_skipped, shape[2]), elements=UNIT32)))
    cats = as_tensor(data.draw(hnp.arrays(np.int64, n_skipped, elements=st.integers(0, shape[0] - 1))))
    acts = as_tensor(data.draw(hnp.arrays(np.int64, n_skipped, elements=st.integers(0, shape[1] - 1))))
    flags = data.draw(st.none() | hnp.arrays(np.bool_, n_skipped))
    with torch.no_grad():
        expected = memory(xs, cats)  # nothing is learned, so every decision sees this state
    step = memory.prequential_(xs, cats, acts, None if flags is None else as_tensor(flags),
                               torch.ones(n_skipped, dtype=torch.bool))

    after = tensors_of(memory)
    for name, tensor in before.items():
        if name != "num_decisions":
            assert torch.equal(tensor, after[name]), name
    # documented: num_decisions counts decisions seen, skipped ones included (it is the
    # sequence number of the next decision)
    assert int(memory.num_decisions) == decisions_before + n_skipped
    for old, new in zip(log_before, memory.gate_log, strict=True):
        assert torch.equal(old, new)
    events = step.events
    assert events.skipped.all() and not events.applied.any() and not events.gated.any()
    assert not events.initialized.any() and (events.eta == 0).all() and (events.displacement == 0).all()
    torch.testing.assert_close(step.output.probs, expected.probs, rtol=1e-5, atol=1e-6)


@FEW
@given(setup=knn_setup())
def test_knn_respect_skip_changes_nothing(setup):
    memory, x, category, action, _ = setup
    memory.respect_skip = True
    half = x.shape[0] // 2
    if half:
        memory.learn_(x[:half], category[:half], action[:half])
    before = tensors_of(memory)
    events = memory.learn_(x[half:], category[half:], action[half:], None,
                           torch.ones(x.shape[0] - half, dtype=torch.bool))
    after = tensors_of(memory)
    for name, tensor in before.items():
        if name != "num_decisions":
            assert torch.equal(tensor, after[name]), name
    assert int(after["num_decisions"]) == x.shape[0]
    assert events.skipped.all() and not events.applied.any()


# ---------------------------------------------------------------------------------------
# 4. a prototype stays in the bounding box of what it saw
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), case=streams(max_n=40, max_categories=2, max_actions=3))
def test_prototype_stays_in_bounding_box_of_its_inputs(data, case):
    shape, x, category, action, confirmed, skip = case
    kwargs = data.draw(judgment_kwargs(options=False))
    kwargs["clip"] = data.draw(st.sampled_from([None, (0.0, 1.0)]))  # inputs lie in [0, 1]
    kwargs["min_confidence"] = data.draw(st.sampled_from([0.0, 0.6]))
    memory = make_judgment(shape, kwargs, data.draw(attentions(shape)))  # push_rate = 0
    # learn in a few chunks and check the property after each one
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, x.shape[0] - 1)), max_size=3))))
    bounds = [0, *[c for c in cuts if c < x.shape[0]], x.shape[0]]
    low = torch.full(shape, np.inf, dtype=torch.float64)
    high = torch.full(shape, -np.inf, dtype=torch.float64)
    for start, stop in itertools.pairwise(bounds):
        sl = slice(start, stop)
        memory.learn_(x[sl], category[sl], action[sl], None if confirmed is None else confirmed[sl], skip[sl])
        for b in range(start, stop):
            if not skip[b]:
                c, a = int(category[b]), int(action[b])
                low[c, a] = torch.minimum(low[c, a], x[b].double())
                high[c, a] = torch.maximum(high[c, a], x[b].double())
        seen = torch.isfinite(low[..., 0])
        assert torch.equal(memory.initialized[:, :, 0], seen)  # one prototype slot
        centroids = memory.centroids[:, :, 0].double()[seen]
        # convex combinations in float32: allow a rounding of the last bit
        assert (centroids >= low[seen] - 1e-6).all() and (centroids <= high[seen] + 1e-6).all()


@SETTINGS
@given(data=st.data(), case=streams())
def test_clip_keeps_every_prototype_in_the_box(data, case):
    shape, x, category, action, confirmed, skip = case
    kwargs = data.draw(judgment_kwargs())
    kwargs["clip"] = data.draw(st.sampled_from([(0.0, 1.0), (0.25, 0.75)]))
    kwargs["push_rate"] = data.draw(st.floats(0.01, 1.0))  # pushes aim outside the box
    memory = make_judgment(shape, kwargs, backend=data.draw(st.sampled_from(["compiled", "reference"])))
    memory.learn_(x, category, action, confirmed, skip)
    low, high = kwargs["clip"]
    prototypes = memory.centroids[memory.initialized]  # the others are unused zeros
    assert (prototypes >= low).all() and (prototypes <= high).all()


# ---------------------------------------------------------------------------------------
# 5. one batch equals the same decisions in several batches
# ---------------------------------------------------------------------------------------
def concat_steps(steps):
    output = type(steps[0].output)(*(torch.cat(parts) for parts in zip(*(s.output for s in steps), strict=True)))
    events = type(steps[0].events)(*(torch.cat(parts) for parts in zip(*(s.events for s in steps), strict=True)))
    sq_diff = None if steps[0].sq_diff is None else torch.cat([s.sq_diff for s in steps])
    return output, events, sq_diff


def split_points(data, n: int) -> list[int]:
    cuts = data.draw(st.lists(st.integers(1, n - 1), max_size=5)) if n > 1 else []
    return [0, *sorted(set(cuts)), n]


@SETTINGS
@given(data=st.data(), case=streams(max_n=40), backend=st.sampled_from(["compiled", "reference"]))
def test_judgment_split_batches_equal_one_batch(data, case, backend):
    shape, x, category, action, confirmed, skip = case
    kwargs, attention = data.draw(judgment_kwargs()), data.draw(attentions(shape))
    whole = make_judgment(shape, kwargs, attention, backend)
    parts = make_judgment(shape, kwargs, attention, backend)
    one = whole.prequential_(x, category, action, confirmed, skip)
    bounds = split_points(data, x.shape[0])
    steps = [parts.prequential_(x[a:b], category[a:b], action[a:b],
                                None if confirmed is None else confirmed[a:b], skip[a:b])
             for a, b in itertools.pairwise(bounds)]
    output, events, sq_diff = concat_steps(steps)
    assert_pieces_equal(one, output, events, whole, parts)
    assert torch.equal(one.sq_diff, sq_diff)
    assert_gate_logs_equal(whole, parts)



def assert_pieces_equal(one, output, events, whole, parts):
    """A one-batch step equals the concatenated steps of the split run, and so do the final states."""
    for name, left, right in zip(one.output._fields, one.output, output, strict=True):
        assert torch.equal(left, right), name
    for name, left, right in zip(one.events._fields, one.events, events, strict=True):
        assert torch.equal(left, right), name
    for (name, left), right in zip(tensors_of(whole).items(), tensors_of(parts).values(), strict=True):
        assert torch.equal(left, right), name

@SETTINGS
@given(data=st.data(), setup=knn_setup(), backend=st.sampled_from(["compiled", "reference"]))
def test_knn_split_batches_equal_one_batch(data, setup, backend):
    memory, x, category, action, skip = setup
    twin = KNNMemory(factors=memory.n_factors, actions=len(memory.action_names), k=memory.k, capacity=memory.capacity,
                     categories=3, scoped=memory.scoped, respect_skip=memory.respect_skip)
    memory.backend = twin.backend = backend
    one = memory.prequential_(x, category, action, None, skip)
    bounds = split_points(data, x.shape[0])
    steps = [twin.prequential_(x[a:b], category[a:b], action[a:b], None, skip[a:b])
             for a, b in itertools.pairwise(bounds)]
    output, events, _ = concat_steps(steps)
    assert_pieces_equal(one, output, events, memory, twin)


# ---------------------------------------------------------------------------------------
# 6. the compiled engine equals the torch reference
# ---------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data(), case=streams(max_n=40))
def test_compiled_engine_equals_reference(data, case):
    shape, x, category, action, confirmed, skip = case
    kwargs, attention = data.draw(judgment_kwargs()), data.draw(attentions(shape))
    fast = make_judgment(shape, kwargs, attention, "compiled")
    slow = make_judgment(shape, kwargs, attention, "reference")
    # start from a state that is not empty, so that the first decisions already score
    warm = data.draw(st.integers(0, x.shape[0] // 2))
    if warm:
        for memory in (fast, slow):
            memory.learn_(x[:warm], category[:warm], action[:warm],
                          None if confirmed is None else confirmed[:warm], skip[:warm])
        x, category, action, skip = x[warm:], category[warm:], action[warm:], skip[warm:]
        confirmed = None if confirmed is None else confirmed[warm:]
    a = fast.prequential_(x, category, action, confirmed, skip)
    b = slow.prequential_(x, category, action, confirmed, skip)
    assert torch.equal(a.output.action, b.output.action)
    torch.testing.assert_close(a.output.logits, b.output.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.output.probs, b.output.probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.output.confidence, b.output.confidence, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.sq_diff, b.sq_diff, rtol=1e-6, atol=1e-7)
    for name in ("applied", "gated", "skipped", "initialized"):
        assert torch.equal(getattr(a.events, name), getattr(b.events, name)), name
    assert torch.equal(a.events.eta, b.events.eta)
    torch.testing.assert_close(a.events.displacement, b.events.displacement, rtol=1e-6, atol=1e-7)
    for (name, left), right in zip(tensors_of(fast).items(), tensors_of(slow).values(), strict=True):
        torch.testing.assert_close(left, right, rtol=1e-6, atol=1e-6, msg=name)
    assert torch.equal(fast.gate_log.step, slow.gate_log.step)


@SETTINGS
@given(setup=knn_setup())
def test_knn_compiled_equals_reference(setup):
    memory, x, category, action, skip = setup
    twin = KNNMemory(factors=memory.n_factors, actions=len(memory.action_names), k=memory.k, capacity=memory.capacity,
                     categories=3, scoped=memory.scoped, respect_skip=memory.respect_skip)
    twin.backend = "reference"
    a = memory.prequential_(x, category, action, None, skip)
    b = twin.prequential_(x, category, action, None, skip)
    assert torch.equal(a.output.action, b.output.action)
    torch.testing.assert_close(a.output.probs, b.output.probs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(a.output.confidence, b.output.confidence, rtol=1e-6, atol=1e-7)
    for name, left, right in zip(a.events._fields, a.events, b.events, strict=True):
        assert torch.equal(left, right), name
    for (name, left), right in zip(tensors_of(memory).items(), tensors_of(twin).values(), strict=True):
        assert torch.equal(left, right), name
    # batched forward (torch.cdist + sort) on the final store equals the engine's scoring:
    # a prequential pass that learns nothing scores every decision with that same store
    frozen = copy.deepcopy(memory)
    frozen.respect_skip = True
    with torch.no_grad():
        out = memory(x, category)
    for backend in ("compiled", "reference"):
        frozen.backend = backend
        ref = frozen.prequential_(x, category, action, None, torch.ones_like(skip)).output
        assert torch.equal(out.action, ref.action)
        torch.testing.assert_close(out.probs, ref.probs, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(out.confidence, ref.confidence, rtol=1e-6, atol=1e-7)


@FEW
@given(data=st.data(), case=streams(max_n=20))
def test_score_one_equals_forward(data, case):
    shape, x, category, action, confirmed, skip = case
    memory = make_judgment(shape, data.draw(judgment_kwargs()), data.draw(attentions(shape)))
    memory.learn_(x, category, action, confirmed, skip)
    queries = data.draw(hnp.arrays(np.float32, (4, shape[2]), elements=UNIT32))
    for q in queries:
        for c in range(shape[0]):
            with torch.no_grad():
                out = memory(as_tensor(q[None]), torch.tensor([c]))
            name, confidence = memory.score_one(q, c)
            want = int(out.action[0])
            assert name == (None if want < 0 else memory.action_names[want])
            assert confidence == pytest.approx(float(out.confidence[0]), rel=1e-5, abs=1e-7)


# ---------------------------------------------------------------------------------------
# Regressions: disagreements between paths found while writing the properties above.
# ---------------------------------------------------------------------------------------
def test_drift_threshold_is_compared_alike_by_both_backends():
    results = {}
    for backend in ("compiled", "reference"):
        memory = JudgmentMemory(1, 1, 2, config=JudgmentConfig.seed())
        memory.backend = backend
        memory.learn_one([0.0, 0.0], 0, 0)
        results[backend] = memory.learn_one([0.4, 0.0], 0, 0)
    assert results["compiled"]["gated"] is True  # what the seed rule says: 0.40000000596 > 0.4
    assert results["reference"] == results["compiled"]


def test_min_confidence_is_compared_alike_by_every_path():
    # two prototypes, one factor, tau=1: confidence = 1 / (1 + exp(-v^2)) for the query 0;
    # v = 0.9204877 (float32) makes it exactly float32(0.7) in both implementations.
    v = float(np.float32(0.9204877))
    actions = {}
    for backend in ("compiled", "reference"):
        memory = JudgmentMemory(1, 2, 1, config=JudgmentConfig.seed(), tau=1.0, min_confidence=0.7)
        memory.backend = backend
        memory.learn_(torch.tensor([[0.0], [v]]), torch.tensor([0, 0]), torch.tensor([0, 1]))
        step = memory.prequential_(torch.tensor([[0.0]]), torch.tensor([0]), torch.tensor([0]))
        assert float(step.output.confidence[0]) == float(np.float32(0.7)) or int(step.output.action[0]) == -1
        assert float(step.output.probs[0, 0]) == float(np.float32(0.7))
        actions[backend] = int(step.output.action[0])
        with torch.no_grad():
            actions[backend + " forward no-grad"] = int(memory(torch.tensor([[0.0]]), torch.tensor([0])).action[0])
        actions[backend + " forward autograd"] = int(memory(torch.tensor([[0.0]]), torch.tensor([0])).action[0])
    assert len(set(actions.values())) == 1, actions


def test_score_one_sees_attention_written_through_data():
    memory = JudgmentMemory(1, 2, 2, config=JudgmentConfig.seed())
    memory.learn_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0, 0]), torch.tensor([0, 1]))
    query = [0.4, 0.9]
    assert memory.score_one(query, 0)[0] == "1"  # plain distance: closer to (1, 1)
    memory.criterion_logits.data.copy_(torch.tensor([[5.0, -5.0]]))  # now only factor 0 counts
    with torch.no_grad():
        assert int(memory(torch.tensor([query]), torch.tensor([0])).action[0]) == 0
    assert memory.score_one(query, 0)[0] == "0"
