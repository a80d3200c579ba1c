"""gae against a plain-Python transcription of the original design, decision by decision.

``tests/seed_reference.py`` transcribes the seed's ``JudgmentMemory`` and ``AgenticMemory``
(lists, dicts, ``math``; no numpy, no torch). Here both are fed the same seeded decision
streams as gae's :class:`~gae.JudgmentMemory` and :class:`~gae.KNNMemory`, once through the
single-decision API (``score_one`` / ``learn_one``) and once through one batched
``prequential_`` call, and every decision's recommendation, confidence and learn event, the
gate log and the final state must agree.

The streams follow the seed's head-to-head: 4 named categories, 8 factors in [0, 1], 4
actions, decisions clustered around a centre per (category, action), some verifier
disagreement (label noise, so overrides happen), some uncertain outcomes
(``'__incorrect__'``), and in one stream a drift at the middle (every action's cluster
moves to another centre) so that the conservation gate fires a lot. Factors are rounded to
float32 before either side sees them, so the only difference between the double-precision
seed and the float32 package is the rounding of the state.
"""

from __future__ import annotations

import functools
import math
import random
import struct

import pytest
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory

try:
    from tests import seed_reference as seed
except ImportError:  # tests/ on sys.path instead of the repository root
    import seed_reference as seed  # type: ignore[no-redef]

CATEGORIES = ("invoice", "refund", "vendor", "payroll")
ACTIONS = ("approve", "review", "escalate", "reject")
K = 8
N = 600
INCORRECT = "__incorrect__"
# (seed, drift_at): three streams, the second one with a drift at the middle.
STREAMS = [(101, None), (202, N // 2), (303, None)]
KNN_CAP = 150  # smaller than the stream: FIFO eviction happens 450 times

REL = 1e-4  # float32 state vs double seed
CENTROID_ATOL = 1e-5


def f32(value: float) -> float:
    """Round a Python float to the nearest float32 (and back to a Python float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


class Decision:
    __slots__ = ("factors", "category", "action", "outcome")

    def __init__(self, factors, category, action, outcome):
        self.factors, self.category, self.action, self.outcome = factors, category, action, outcome


@functools.cache
def make_stream(rng_seed: int, drift_at, n: int = N, noise: float = 0.08, label_noise: float = 0.1,
                incorrect_rate: float = 0.1) -> tuple[Decision, ...]:
    rng = random.Random(rng_seed)
    centres = {(c, a): [rng.uniform(0.1, 0.9) for _ in range(K)] for c in CATEGORIES for a in ACTIONS}
    decisions = []
    for t in range(n):
        category = rng.choice(CATEGORIES)
        true_action = rng.randrange(len(ACTIONS))
        source = true_action
        if drift_at is not None and t >= drift_at:
            source = (true_action + 1) % len(ACTIONS)  # the world's prototypes move
        centre = centres[(category, ACTIONS[source])]
        factors = [f32(min(1.0, max(0.0, v + rng.gauss(0.0, noise)))) for v in centre]
        action = ACTIONS[true_action]
        if rng.random() < label_noise:  # the verifier disagrees with the cluster
            action = rng.choice(ACTIONS)
        outcome = INCORRECT if rng.random() < incorrect_rate else None
        decisions.append(Decision(factors, category, action, outcome))
    return tuple(decisions)


def stream_tensors(decisions):
    x = torch.tensor([d.factors for d in decisions], dtype=torch.float32)
    category = torch.tensor([CATEGORIES.index(d.category) for d in decisions])
    action = torch.tensor([ACTIONS.index(d.action) for d in decisions])
    skip = torch.tensor([d.outcome == INCORRECT for d in decisions])
    return x, category, action, skip


def action_index(name) -> int:
    return -1 if name is None else ACTIONS.index(name)


def assert_close(got: float, want: float, what: str, rel: float = REL, abs_: float = 1e-6) -> None:
    assert math.isclose(got, want, rel_tol=rel, abs_tol=abs_), f"{what}: gae {got!r} vs seed {want!r}"


# ---------------------------------------------------------------------------------------
# JudgmentMemory
# ---------------------------------------------------------------------------------------
@functools.cache
def run_seed_judgment(rng_seed: int, drift_at):
    """Feed the seed memory; the caller confirms iff the memory's own pre-learning
    recommendation equals the verified action, as in the seed's head-to-head."""
    memory = seed.JudgmentMemory()
    scores, results = [], []
    for d in make_stream(rng_seed, drift_at):
        recommended, confidence = memory.score(d.factors, d.category)
        scores.append((recommended, confidence))
        results.append(memory.learn(d.factors, d.action, d.category, confirmed=recommended == d.action,
                                    outcome=d.outcome))
    return memory, scores, results


def seed_centroids(memory: seed.JudgmentMemory):
    centroids = torch.zeros(len(CATEGORIES), len(ACTIONS), K, dtype=torch.float64)
    initialized = torch.zeros(len(CATEGORIES), len(ACTIONS), dtype=torch.bool)
    for c, cell in memory.centroids.items():
        for a, mu in cell.items():
            centroids[CATEGORIES.index(c), ACTIONS.index(a)] = torch.tensor(mu, dtype=torch.float64)
            initialized[CATEGORIES.index(c), ACTIONS.index(a)] = True
    return centroids, initialized


def expected_counts(decisions) -> torch.Tensor:
    counts = torch.zeros(len(CATEGORIES), len(ACTIONS), dtype=torch.int64)
    for d in decisions:
        if d.outcome != INCORRECT:
            counts[CATEGORIES.index(d.category), ACTIONS.index(d.action)] += 1
    return counts


def assert_judgment_state(memory: JudgmentMemory, seed_memory, decisions) -> None:
    centroids, initialized = seed_centroids(seed_memory)
    assert memory.centroids.shape[2] == 1  # the seed design: one prototype slot per (category, action)
    assert torch.equal(memory.initialized[:, :, 0], initialized)
    torch.testing.assert_close(memory.centroids[:, :, 0].double(), centroids, rtol=0, atol=CENTROID_ATOL)
    assert torch.equal(memory.counts[:, :, 0], expected_counts(decisions))
    assert int(memory.num_decisions) == len(decisions)


def assert_gate_log(memory: JudgmentMemory, seed_memory, results, decisions) -> None:
    gated_steps = [t for t, r in enumerate(results) if r.get("gated")]
    log = memory.gate_log
    assert len(log.step) == len(seed_memory.gate_log) == len(gated_steps)
    assert log.step.tolist() == gated_steps
    for i, (step, entry) in enumerate(zip(gated_steps, seed_memory.gate_log, strict=True)):
        assert int(log.action[i]) == ACTIONS.index(entry["action"])
        assert int(log.category[i]) == CATEGORIES.index(decisions[step].category)
        assert_close(float(log.displacement[i]), entry["disp"], f"gate log disp #{i}")
        assert_close(float(log.eta[i]), results[step]["eta"], f"gate log eta #{i}")
    records = memory.gate_records()
    want = [(s, e["action"]) for s, e in zip(gated_steps, seed_memory.gate_log, strict=True)]
    assert [(r["step"], r["action"]) for r in records] == want


def test_streams_exercise_every_branch():
    """The comparisons below only mean something if the streams hit every path of the seed."""
    all_etas = set()
    gates = []
    for rng_seed, drift_at in STREAMS:
        memory, scores, results = run_seed_judgment(rng_seed, drift_at)
        decisions = make_stream(rng_seed, drift_at)
        skipped = sum(r.get("skipped", False) for r in results)
        firsts = sum(r.get("initialized", False) for r in results)
        gates.append(sum(r.get("gated", False) for r in results))
        etas = {r["eta"] for r in results if "eta" in r}
        assert skipped > 20 and firsts == len(CATEGORIES) * len(ACTIONS) and gates[-1] > 10
        # confirmed, gated confirmed, gated override, first touch
        assert {0.05, 0.025, 0.005, 1.0} <= etas
        all_etas |= etas
        assert scores[0] == (None, 0.0)  # the very first decision abstains
        half = len(decisions) // 2
        correct = sum(s[0] == d.action for s, d in zip(scores[:half], decisions[:half], strict=True))
        assert correct > 0.6 * half  # clustered data: far above the 25 % of chance
    assert 0.01 in all_etas  # an ungated override somewhere
    assert gates[1] > 2 * max(gates[0], gates[2])  # the drift shows in the gate


@pytest.mark.parametrize("rng_seed, drift_at", STREAMS)
def test_judgment_single_decisions_match_seed(rng_seed, drift_at):
    decisions = make_stream(rng_seed, drift_at)
    seed_memory, seed_scores, seed_results = run_seed_judgment(rng_seed, drift_at)
    memory = JudgmentMemory(list(CATEGORIES), list(ACTIONS), K, config=JudgmentConfig.seed())
    for t, d in enumerate(decisions):
        recommended, confidence = memory.score_one(d.factors, d.category)
        want_action, want_confidence = seed_scores[t]
        assert recommended == want_action, f"decision {t}: gae {recommended} vs seed {want_action}"
        assert_close(confidence, want_confidence, f"decision {t} confidence")
        # the caller derives `confirmed` from gae's own recommendation, as the seed's caller does
        result = memory.learn_one(d.factors, d.action, d.category, confirmed=recommended == d.action,
                                  outcome=d.outcome)
        want = seed_results[t]
        if want.get("skipped"):
            assert result == {"skipped": True}, f"decision {t}"
            continue
        assert result["skipped"] is False
        assert result["initialized"] == want.get("initialized", False), f"decision {t}"
        assert result["gated"] == want["gated"], f"decision {t}"
        assert_close(result["eta"], want["eta"], f"decision {t} eta")
        assert_close(result["disp"], want["disp"], f"decision {t} disp")
    assert_judgment_state(memory, seed_memory, decisions)
    assert_gate_log(memory, seed_memory, seed_results, decisions)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("rng_seed, drift_at", STREAMS)
def test_judgment_prequential_matches_seed(rng_seed, drift_at, backend):
    decisions = make_stream(rng_seed, drift_at)
    seed_memory, seed_scores, seed_results = run_seed_judgment(rng_seed, drift_at)
    memory = JudgmentMemory(list(CATEGORIES), list(ACTIONS), K, config=JudgmentConfig.seed())
    memory.backend = backend
    x, category, action, skip = stream_tensors(decisions)
    step = memory.prequential_(x, category, action, None, skip)  # confirmed=None: derived, like the seed
    out, events = step.output, step.events
    for t in range(len(decisions)):
        want_action, want_confidence = seed_scores[t]
        assert int(out.action[t]) == action_index(want_action), f"decision {t}"
        assert_close(float(out.confidence[t]), want_confidence, f"decision {t} confidence")
        want = seed_results[t]
        assert bool(events.skipped[t]) == bool(want.get("skipped", False)), f"decision {t}"
        assert bool(events.applied[t]) == (not want.get("skipped", False)), f"decision {t}"
        if want.get("skipped"):
            assert not events.gated[t] and not events.initialized[t] and float(events.eta[t]) == 0.0
            continue
        assert bool(events.initialized[t]) == want.get("initialized", False), f"decision {t}"
        assert bool(events.gated[t]) == want["gated"], f"decision {t}"
        assert_close(float(events.eta[t]), want["eta"], f"decision {t} eta")
        assert_close(float(events.displacement[t]), want["disp"], f"decision {t} disp")
    # probabilities of the recommended action are the confidences
    known = out.action >= 0
    assert torch.equal(out.probs[known].gather(1, out.action[known].unsqueeze(1)).squeeze(1),
                       out.confidence[known])
    assert_judgment_state(memory, seed_memory, decisions)
    assert_gate_log(memory, seed_memory, seed_results, decisions)


# ---------------------------------------------------------------------------------------
# KNNMemory vs AgenticMemory
# ---------------------------------------------------------------------------------------
@functools.cache
def run_seed_knn(rng_seed: int, drift_at):
    memory = seed.AgenticMemory(k=5, cap=KNN_CAP)
    scores = []
    for d in make_stream(rng_seed, drift_at):
        recommended, confidence = memory.score(d.factors, d.category)
        scores.append((recommended, confidence))
        # the seed's learn takes **kwargs and ignores them: '__incorrect__' outcomes are stored too
        memory.learn(d.factors, d.action, category=d.category, confirmed=recommended == d.action,
                     outcome=d.outcome)
    return memory, scores


def assert_knn_store(memory: KNNMemory, seed_memory) -> None:
    size, head = (int(v) for v in memory.ring)
    assert size == len(seed_memory.store) == KNN_CAP
    order = (head - size + torch.arange(size)) % memory.capacity  # oldest first
    want = torch.tensor([t["factors"] for t in seed_memory.store], dtype=torch.float32)
    assert torch.equal(memory.store_factors[order], want)  # stored exactly (float32 inputs)
    assert memory.store_actions[order].tolist() == [ACTIONS.index(t["action"]) for t in seed_memory.store]


@pytest.mark.parametrize("rng_seed, drift_at", STREAMS)
def test_knn_single_decisions_match_seed(rng_seed, drift_at):
    decisions = make_stream(rng_seed, drift_at)
    seed_memory, seed_scores = run_seed_knn(rng_seed, drift_at)
    memory = KNNMemory(factors=K, actions=list(ACTIONS), k=5, capacity=KNN_CAP)
    for t, d in enumerate(decisions):
        recommended, confidence = memory.score_one(d.factors, d.category)
        want_action, want_confidence = seed_scores[t]
        assert recommended == want_action, f"decision {t}: gae {recommended} vs seed {want_action}"
        assert_close(confidence, want_confidence, f"decision {t} confidence")
        result = memory.learn_one(d.factors, d.action, d.category, confirmed=recommended == d.action,
                                  outcome=d.outcome)
        assert result["skipped"] is False  # like the seed, the baseline learns uncertain outcomes too
    assert_knn_store(memory, seed_memory)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("rng_seed, drift_at", STREAMS)
def test_knn_prequential_matches_seed(rng_seed, drift_at, backend):
    decisions = make_stream(rng_seed, drift_at)
    seed_memory, seed_scores = run_seed_knn(rng_seed, drift_at)
    memory = KNNMemory(factors=K, actions=list(ACTIONS), k=5, capacity=KNN_CAP)
    memory.backend = backend
    x, category, action, skip = stream_tensors(decisions)
    step = memory.prequential_(x, category, action, None, skip)
    assert step.events.applied.all() and not step.events.skipped.any()
    for t in range(len(decisions)):
        want_action, want_confidence = seed_scores[t]
        assert int(step.output.action[t]) == action_index(want_action), f"decision {t}"
        assert_close(float(step.output.confidence[t]), want_confidence, f"decision {t} confidence")
    assert_knn_store(memory, seed_memory)
    # batched scoring of the final store agrees with the seed as well
    with torch.no_grad():
        final = memory(x[:50], category[:50])
    for t in range(50):
        want_action, want_confidence = seed_memory.score(decisions[t].factors)
        assert int(final.action[t]) == action_index(want_action)
        assert_close(float(final.confidence[t]), want_confidence, f"forward {t} confidence")


def test_knn_stream_is_not_trivial():
    for rng_seed, drift_at in STREAMS:
        decisions = make_stream(rng_seed, drift_at)
        _, scores = run_seed_knn(rng_seed, drift_at)
        assert scores[:5] == [(None, 0.0)] * 5 and scores[5][0] is not None  # k=5: 5 traces needed
        confidences = [c for a, c in scores if a is not None]
        assert min(confidences) < 0.6 < max(confidences)  # split votes and clear ones
        correct = sum(s[0] == d.action for s, d in zip(scores, decisions, strict=True))
        assert correct > 0.3 * len(decisions)


# ---------------------------------------------------------------------------------------
# Hand-computed confidences
# ---------------------------------------------------------------------------------------
def test_hand_computed_confidences():
    # JudgmentMemory: prototypes at (0, 0) "approve" and (0.5, 0) "reject" (first touch);
    # query (0.125, 0): d_approve = 0.015625, d_reject = 0.140625, logits -0.15625 and -1.40625 (tau=0.1),
    # confidence = 1 / (1 + exp(-1.25)).
    want = 1.0 / (1.0 + math.exp(-1.25))
    reference = seed.JudgmentMemory()
    memory = JudgmentMemory(["invoice"], ["approve", "reject"], 2, config=JudgmentConfig.seed())
    for factors, name in (([0.0, 0.0], "approve"), ([0.5, 0.0], "reject")):
        assert reference.learn(factors, name, "invoice")["initialized"]
        assert memory.learn_one(factors, name, "invoice")["initialized"]
    assert reference.score([0.125, 0.0], "invoice") == ("approve", pytest.approx(want, rel=1e-12))
    assert memory.score_one([0.125, 0.0], "invoice") == ("approve", pytest.approx(want, rel=1e-6))
    step = memory.prequential_(torch.tensor([[0.125, 0.0]]), torch.tensor([0]), torch.tensor([1]))
    assert float(step.output.confidence[0]) == pytest.approx(want, rel=1e-6)
    assert step.output.probs[0].tolist() == pytest.approx([want, 1.0 - want], rel=1e-6)
    # learning it as 'reject' is an override (the recommendation was 'approve'), eta 0.01;
    # disp from (0.5, 0) is 0.375 <= 0.4, so no gate; reject moves to 0.5 - 0.01 * 0.375.
    assert step.events.eta.tolist() == pytest.approx([0.01])
    assert float(step.events.displacement[0]) == pytest.approx(0.375)
    assert memory.centroids[0, 1, 0].tolist() == pytest.approx([0.49625, 0.0], abs=1e-7)
    reference.learn([0.125, 0.0], "reject", "invoice", confirmed=False)
    assert reference.centroids["invoice"]["reject"] == pytest.approx([0.49625, 0.0], abs=1e-12)

    # KNN: traces at distance 0.25 (approve), 0.75 (reject), 3 (approve) from the query; k=2.
    # votes: approve 1/(0.25+1e-8), reject 1/(0.75+1e-8) -> confidence = 0.75 (to 1e-8).
    want = (1 / (0.25 + 1e-8)) / (1 / (0.25 + 1e-8) + 1 / (0.75 + 1e-8))
    assert want == pytest.approx(0.75, abs=1e-7)
    reference = seed.AgenticMemory(k=2, cap=3)
    memory = KNNMemory(factors=2, actions=["approve", "reject"], k=2, capacity=3)
    for factors, name in (([0.0, 0.0], "approve"), ([1.0, 0.0], "reject"), ([0.25, 3.0], "approve")):
        reference.learn(factors, name)
        memory.learn_one(factors, name)
    assert reference.score([0.25, 0.0]) == ("approve", pytest.approx(want, rel=1e-12))
    assert memory.score_one([0.25, 0.0]) == ("approve", pytest.approx(want, rel=1e-6))
    # a fourth trace evicts the oldest (FIFO): the nearest are now reject at 0.75, approve at 1
    reference.learn([0.25, 1.0], "approve")
    memory.learn_one([0.25, 1.0], "approve")
    want = (1 / (0.75 + 1e-8)) / (1 / (0.75 + 1e-8) + 1 / (1.0 + 1e-8))
    assert want == pytest.approx(4 / 7, abs=1e-7)
    assert reference.score([0.25, 0.0]) == ("reject", pytest.approx(want, rel=1e-12))
    assert memory.score_one([0.25, 0.0]) == ("reject", pytest.approx(want, rel=1e-6))
