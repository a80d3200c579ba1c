"""Extreme but accepted inputs, in every mode and through every entry point (issue 28).

JudgmentMemory learns any finite value with ``|x| <= 1e15`` (``gae.validation.LEARN_LIMIT``,
docs/inputs.md). Whatever it accepts must leave every buffer finite and every later call
working, and a call it refuses must change nothing. The properties below feed each mode
(the seed rule, ``drift_mode='adaptive'``, also with a tiny ``tau``, ``prototypes=4``, the
gated rule with pushes, ``JudgmentConfig.recommended()`` and lvq with ``units='criterion'``), through ``learn_one``,
``prequential_``, ``learn_`` and the torch reference, streams of magnitudes near the limit,
denormals (1e-40 in float32, 5e-324 as float64 input), a constant criterion, one criterion
1e12 times the others, a category seen once and signs alternating at 1e14, mixed with
refused calls (NaN, inf, values past the limit or past float32, wrong shapes).

Hypothesis runs derandomized with a few examples per case, so the file is deterministic and
quick. The plain tests at the end are the issue's reproduction and the cases it led to.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae import JudgmentConfig, JudgmentMemory
from gae.judgment import lvq, rule
from gae.validation import LEARN_LIMIT

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None)

C, A, K = 2, 3, 3
SEED = JudgmentConfig.seed()
MODES = {
    "seed": SEED,
    "adaptive": SEED.replace(drift_mode="adaptive"),
    "adaptive_tiny_tau": SEED.replace(drift_mode="adaptive", tau=1e-12),  # logits of huge values are -inf
    "prototypes": SEED.replace(prototypes=4),
    "gated_push": SEED.replace(prototypes=4, push_rate=1.0),
    "lvq": JudgmentConfig.recommended(),
    "lvq_criterion": JudgmentConfig.recommended().replace(units="criterion"),
}
PATHS = ("learn_one", "prequential_", "learn_", "reference")

# accepted values: near the limit, denormal in float32 (1e-40) and float64 (5e-324, which rounds to 0)
HUGE = [LEARN_LIMIT, -LEARN_LIMIT, 9.999e14, -7e14, 1e14, -1e14, 1e13]
TINY = [1e-40, -1e-40, 5e-324, -5e-324, 1.4e-45, 3e-39, 0.0]
ORDINARY = st.floats(0.0, 1.0)
EXTREME = st.sampled_from(HUGE + TINY) | st.floats(-LEARN_LIMIT, LEARN_LIMIT) | ORDINARY
# refused as a learned row: (the value placed in it, the error)
REFUSED_VALUES = [math.nan, math.inf, -math.inf, 1.0000001e15, -2e15, 1e39, -1e300]


def ordinary_history(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ordinary decisions in [0, 1], learned before every case, so that the state is not trivial."""
    gen = torch.Generator().manual_seed(seed)
    action = torch.randint(0, A, (n,), generator=gen)
    x = (torch.rand(n, K, generator=gen) * 0.3 + 0.3 * action[:, None]).clamp(0, 1)
    return x, torch.randint(0, 1, (n,), generator=gen), action  # category 0 only: 1 stays unseen


_FED: dict[str, JudgmentMemory] = {}


def fed(mode: str, path: str) -> JudgmentMemory:
    """A fresh copy of a memory of ``mode`` after the ordinary history (built once per mode)."""
    if mode not in _FED:
        memory = JudgmentMemory(C, A, K, MODES[mode])
        memory.learn_(*ordinary_history())
        _FED[mode] = memory
    memory = copy.deepcopy(_FED[mode])
    if path == "reference":
        memory.backend = "reference"
    return memory


@st.composite
def extreme_rows(draw, n_min: int = 1, n_max: int = 12):
    """(rows as float64 (n, K), categories (n,), actions (n,)): a stream of one kind of extreme."""
    n = draw(st.integers(n_min, n_max))
    kind = draw(st.sampled_from(["mixed", "huge", "tiny", "constant", "ratio", "alternating", "seen_once"]))
    if kind == "huge":
        rows = [[draw(st.sampled_from(HUGE)) for _ in range(K)] for _ in range(n)]
    elif kind == "tiny":
        rows = [[draw(st.sampled_from(TINY)) for _ in range(K)] for _ in range(n)]
    elif kind == "constant":  # one criterion never varies, at an extreme value, the others ordinary
        value = draw(st.sampled_from([LEARN_LIMIT, 1e-40, 5e-324, 0.0, 123.0]))
        rows = [[value, *(draw(ORDINARY) for _ in range(K - 1))] for _ in range(n)]
    elif kind == "ratio":  # criterion 0 is 1e12 times the others
        rows = [[1e12 * v, v, draw(ORDINARY)] for v in (draw(ORDINARY) for _ in range(n))]
    elif kind == "alternating":
        rows = [[(-1.0) ** i * 1e14, (-1.0) ** (i + 1) * 1e14, draw(ORDINARY)] for i in range(n)]
    else:
        rows = [[draw(EXTREME) for _ in range(K)] for _ in range(n)]
    x = np.array(rows, dtype=np.float64)
    if kind == "seen_once":  # category 1, never seen in the history, gets one decision (an extreme one)
        x[:] = [[draw(EXTREME) for _ in range(K)] for _ in range(n)]
        category = np.zeros(n, dtype=np.int64)
        category[draw(st.integers(0, n - 1))] = 1
    else:
        category = np.array([draw(st.integers(0, C - 1)) for _ in range(n)], dtype=np.int64)
    action = np.array([draw(st.integers(0, A - 1)) for _ in range(n)], dtype=np.int64)
    return x, category, action


def learn(memory: JudgmentMemory, path: str, x: np.ndarray, category: np.ndarray, action: np.ndarray,
          split: bool = True) -> None:
    """Learn the rows through ``path`` (``confirmed=None``: the memory's own recommendation decides),
    with ``split`` a ``prequential_`` batch in two calls."""
    if path == "learn_one":
        for row, c, a in zip(x, category, action, strict=True):
            memory.learn_one(row.tolist(), int(a), int(c), confirmed=None)
        return
    tensors = (torch.from_numpy(x), torch.from_numpy(category), torch.from_numpy(action))  # x: float64 input
    if path == "learn_":
        memory.learn_(*tensors)
    else:  # prequential_, on either backend
        half = max(1, x.shape[0] // 2) if split else x.shape[0]
        memory.prequential_(*(t[:half] for t in tensors))
        if x.shape[0] > half:
            memory.prequential_(*(t[half:] for t in tensors))


def frozen(value):
    """A bit-exact image of a state: tensors become (dtype, shape, bytes), through nested containers."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return ("tensor", str(value.dtype), tuple(value.shape), flat.view(torch.uint8).numpy().tobytes())
    if isinstance(value, dict):
        return {key: frozen(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [frozen(item) for item in value]
    return value


def snapshot(memory: JudgmentMemory) -> dict:
    """Every state_dict entry, cloned (tensors) or as its bit-exact image (the extra state)."""
    return {key: value.detach().clone() if isinstance(value, torch.Tensor) else frozen(value)
            for key, value in memory.state_dict().items()}


def assert_unchanged(before: dict, memory: JudgmentMemory) -> None:
    after = snapshot(memory)
    assert after.keys() == before.keys()
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
        else:
            assert after[key] == value, key  # the extra state: names, config, logs


def assert_finite(memory: JudgmentMemory) -> None:
    for key, value in memory.state_dict().items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert bool(torch.isfinite(value).all()), (key, value)
    # every value a prototype (or its shadow, tracking or run copy) holds is one that could be learned
    for name in ("centroids", "shadow_centroids", "tracking_centroids", "run_centroids", "input_means"):
        values = getattr(memory, name)
        assert not values.numel() or float(values.abs().max()) <= LEARN_LIMIT, name


def assert_scores_clean(memory: JudgmentMemory, x: torch.Tensor, category: torch.Tensor) -> None:
    """Scores are finite, or a clean abstention (action -1, confidence 0, probabilities 0)."""
    with torch.no_grad():
        compiled = memory(x, category)
    with torch.enable_grad():  # the torch formula, as a model that embeds the memory scores
        reference = memory(x.clone().requires_grad_(True), category)
    for out in (compiled, reference):
        probs, action, confidence = out.probs.detach(), out.action, out.confidence.detach()
        assert bool(torch.isfinite(probs).all()) and bool(torch.isfinite(confidence).all())
        assert not bool(torch.isnan(out.logits.detach()).any())
        abstain = action < 0
        assert bool((confidence[abstain] == 0).all()) and bool((probs[abstain] == 0).all())
        scored = ~abstain
        if bool(scored.any()):
            best = out.logits.detach()[scored].amax(-1)
            assert bool(torch.isfinite(best).all())
            torch.testing.assert_close(probs[scored].sum(-1), torch.ones(int(scored.sum())))
    for row, c in zip(x.tolist(), category.tolist(), strict=True):
        name, confidence_one = memory.score_one(row, c)
        assert math.isfinite(confidence_one) and (name is not None or confidence_one == 0.0)


def assert_ordinary_calls_work(memory: JudgmentMemory, path: str) -> None:
    """After anything accepted, ordinary decisions learn and score through every entry point."""
    gen = torch.Generator().manual_seed(1)
    x, category, action = torch.rand(6, K, generator=gen), torch.tensor([0, 1, 0, 1, 0, 1]), torch.arange(6) % A
    learn(memory, path, x[:2].double().numpy(), category[:2].numpy(), action[:2].numpy())
    memory.prequential_(x[2:4], category[2:4], action[2:4])
    for row, c, a in zip(x[4:].tolist(), category[4:].tolist(), action[4:].tolist(), strict=True):
        memory.learn_one(row, a, c, confirmed=None)
    assert_finite(memory)
    queries = torch.tensor([[0.5, 0.5, 0.5], [LEARN_LIMIT, -LEARN_LIMIT, 1e-40], [1e14, -1e14, 0.0],
                            [5e-324, 0.0, 1.0]], dtype=torch.float64).float()
    assert_scores_clean(memory, queries, torch.tensor([0, 1, 1, 0]))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", sorted(MODES))
@SETTINGS
@given(stream=extreme_rows())
def test_extreme_accepted_inputs_keep_the_state_finite(mode, path, stream):
    memory = fed(mode, path)
    learn(memory, path, *stream)
    assert_finite(memory)
    assert_scores_clean(memory, torch.from_numpy(stream[0]).float(), torch.from_numpy(stream[1]))
    assert_ordinary_calls_work(memory, path)


@st.composite
def calls(draw):
    """A sequence of learning calls: (rows, categories, actions, refused) where ``refused`` says
    whether the memory must refuse it (a bad value somewhere, or a bad shape)."""
    sequence = []
    for _ in range(draw(st.integers(1, 5))):
        x, category, action = draw(extreme_rows(1, 4))
        refused = draw(st.booleans())
        if refused:
            how = draw(st.sampled_from(["value", "wide", "narrow", "category", "action"]))
            if how == "value":
                x[draw(st.integers(0, x.shape[0] - 1)), draw(st.integers(0, K - 1))] = draw(
                    st.sampled_from(REFUSED_VALUES))
            elif how == "wide":
                x = np.concatenate([x, x[:, :1]], 1)
            elif how == "narrow":
                x = x[:, :-1]
            elif how == "category":
                category[-1] = C
            else:
                action[-1] = A
        sequence.append((x, category, action, refused))
    return sequence


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", sorted(MODES))
@SETTINGS
@given(sequence=calls())
def test_a_refused_call_changes_nothing_and_an_accepted_one_never_raises(mode, path, sequence):
    memory = fed(mode, path)
    for x, category, action, refused in sequence:
        if path == "learn_one" and refused:  # one row at a time: the good rows before the bad one land
            bad = next(i for i in range(x.shape[0]) if x.shape[1] != K or not np.all(np.abs(x[i]) <= LEARN_LIMIT)
                       or category[i] >= C or action[i] >= A)
            learn(memory, path, x[:bad], category[:bad], action[:bad])
            x, category, action = x[bad:bad + 1], category[bad:bad + 1], action[bad:bad + 1]
        before = snapshot(memory)
        try:
            learn(memory, path, x, category, action, split=False)
        except (ValueError, TypeError):
            assert refused, "an accepted call raised"
            assert_unchanged(before, memory)
        else:
            assert not refused, "a bad call was accepted"
        assert_finite(memory)
    assert_ordinary_calls_work(memory, path)


# -- the issue's reproduction and what it led to -------------------------------------------------
def issue_stream(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_issue_28_one_extreme_value_no_longer_breaks_the_recommended_rule():
    """299 ordinary decisions, one whose first factor is 1e13, then ordinary ones: every call learns,
    the state stays finite (before, each later call raised ZeroDivisionError and still changed
    input_counts, input_means and input_variances)."""
    rng = issue_stream()
    memory = JudgmentMemory(2, 2, 3, JudgmentConfig.recommended())
    for _ in range(299):
        memory.learn_one(rng.random(3).tolist(), int(rng.integers(2)), int(rng.integers(2)))
    extreme = rng.random(3)
    extreme[0] = 1e13
    memory.learn_one(extreme.tolist(), 0, 0)
    for _ in range(100):
        before = int(memory.input_counts.sum())
        result = memory.learn_one(rng.random(3).tolist(), int(rng.integers(2)), int(rng.integers(2)))
        assert not result["skipped"] and int(memory.input_counts.sum()) == before + 1
    assert_finite(memory)
    assert_scores_clean(memory, torch.rand(4, 3), torch.tensor([0, 1, 0, 1]))


@pytest.mark.parametrize("path", ["prequential_", "learn_", "reference"])
def test_issue_28_the_batched_paths_and_the_reference_agree(path):
    """The same stream through the batched engine and the torch reference: no error, a finite
    state (the reference used to turn the relevance logits into NaN), the same decisions."""
    rng = issue_stream(1)
    x = rng.random((400, 3))
    x[299, 0] = 1e13
    category, action = rng.integers(2, size=400), rng.integers(2, size=400)
    memory = JudgmentMemory(2, 2, 3, JudgmentConfig.recommended())
    if path == "reference":
        memory.backend = "reference"
    out = (memory.learn_ if path == "learn_" else memory.prequential_)(
        torch.from_numpy(x).float(), torch.from_numpy(category), torch.from_numpy(action))
    assert_finite(memory)
    compiled = JudgmentMemory(2, 2, 3, JudgmentConfig.recommended())
    expected = compiled.prequential_(torch.from_numpy(x).float(), torch.from_numpy(category), torch.from_numpy(action))
    if path != "learn_":
        assert torch.equal(out.output.action, expected.output.action)
    torch.testing.assert_close(memory.relevance_logits, compiled.relevance_logits, rtol=1e-4, atol=1e-5)


def test_issue_28_through_the_river_classifier():
    river = pytest.importorskip("gae.river")
    rng = issue_stream(2)
    model = river.JudgmentClassifier()
    for _ in range(299):
        row = rng.random(3)
        model.learn_one({"a": row[0], "b": row[1], "c": row[2]}, int(row[0] + row[1] > 1))
    model.learn_one({"a": 1e13, "b": 0.5, "c": 0.5}, 1)
    for _ in range(50):
        row = rng.random(3)
        sample = {"a": row[0], "b": row[1], "c": row[2]}
        model.learn_one(sample, int(row[0] + row[1] > 1))
        assert model.predict_one(sample) in (0, 1)
    assert_finite(model.memory)


def test_issue_28_through_the_sklearn_classifier():
    sklearn = pytest.importorskip("gae.sklearn")
    rng = issue_stream(3)
    X = rng.random((400, 3))
    X[299, 0] = 1e13
    y = (X[:, 1] + X[:, 2] > 1).astype(int)
    model = sklearn.JudgmentClassifier()
    for start in range(0, 400, 50):
        model.partial_fit(X[start:start + 50], y[start:start + 50], classes=[0, 1])
    assert_finite(model.memory_)
    assert np.isfinite(model.predict_proba(X[:10])).all()


def test_the_relevance_step_is_rescaled_where_its_square_underflows():
    """Distances of about 1e-24 (one huge value made the category's spread vast): the square of
    their sum is 0 in float32, and the step is the rescaled one, the same direction and size as the
    formula's in float64."""
    memory = JudgmentMemory(["c"], ["a", "b"], 2, config=SEED, learning="lvq", units="criterion", relevance_rate=0.1)
    memory.learn_(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.zeros(2, dtype=torch.long), torch.tensor([0, 1]))
    state, alpha, config = memory.state(), memory.criterion_attention().detach(), memory.config
    state.input_variances[0] = torch.tensor([1e24, 3e23])
    x = torch.tensor([0.2, 0.9])
    lam = rule.relevances(state.relevance_logits[0]).double()
    scale = alpha[0].double() / rule.spread(state.input_variances[0], config).double()
    g_own = scale * (x.double() - state.centroids[0, 0, 0].double()) ** 2
    g_rival = scale * (x.double() - state.centroids[0, 1, 0].double()) ** 2
    d_own, d_rival = (lam * g_own).sum(), (lam * g_rival).sum()
    assert float((d_own + d_rival) ** 2) < torch.finfo(torch.float32).tiny  # float32 would divide by 0
    expected = state.relevance_logits[0].double() - 0.1 * lam * 2 * (d_rival * g_own - d_own * g_rival) / (
        d_own + d_rival) ** 2
    lvq.relevance_step(x, 0, 0, 0, 1, 0, alpha, state, config)
    torch.testing.assert_close(state.relevance_logits[0].double(), expected, rtol=1e-5, atol=1e-7)
    assert not torch.equal(state.relevance_logits[0], torch.zeros(2))


def test_pushes_hold_a_prototype_within_the_learned_range():
    """The gated rule's push (``push_rate``) moves a prototype away from a decision: it is no mean
    of learned values, and used to carry one past the limit (here to 1.7e15)."""
    memory = JudgmentMemory(1, 2, 1, config=SEED, push_rate=1.0)
    for value, action in ((0.0, 1), (0.9e15, 0), (0.1e15, 1)):
        memory.learn_one([value], action, 0, confirmed=None)
    assert float(memory.centroids.abs().max()) == float(np.float32(LEARN_LIMIT))  # rule.STATE_LIMIT
    reference = JudgmentMemory(1, 2, 1, config=SEED, push_rate=1.0)
    reference.backend = "reference"
    reference.prequential_(torch.tensor([[0.0], [0.9e15], [0.1e15]]), torch.zeros(3, dtype=torch.long),
                           torch.tensor([1, 0, 1]))
    assert torch.equal(reference.centroids, memory.centroids)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_the_change_test_stays_finite_when_both_distances_overflow(backend):
    """With a tiny tau, the logits of values near the limit are -inf: the change test and the
    tracking lead see no gap instead of NaN."""
    rng = issue_stream(4)
    memory = JudgmentMemory(1, 2, 3, config=SEED, drift_mode="adaptive", tau=1e-12)
    memory.backend = backend
    x = torch.from_numpy(LEARN_LIMIT * np.sign(rng.standard_normal((60, 3)))).float()
    memory.prequential_(x, torch.zeros(60, dtype=torch.long), torch.from_numpy(rng.integers(2, size=60)))
    assert_finite(memory)


def test_a_tau_float32_cannot_hold_is_refused():
    """The rule divides by tau in float32: a tau that rounds to 0 there is refused up front (it
    used to be accepted, and the first learned decision raised ZeroDivisionError)."""
    with pytest.raises(ValueError, match="tau must be at least the smallest float32"):
        JudgmentConfig(tau=1e-46)
    JudgmentMemory(1, 2, 2, config=SEED, tau=1e-44).learn_one([1.0, 0.0], 0, 0)  # the smallest ones are kept
