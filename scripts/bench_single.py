"""One decision at a time: what an agent calls, against plain numpy transcriptions of the same rules.

An agent holds one case: it scores it (``score_one``), acts, and later learns the verified
outcome (``learn_one``). This module times exactly that, call by call, as a user would: named
categories and actions, a fresh memory per repeat, each decision's ``score_one`` +
``learn_one`` timed together, p50 and p99 of the individual decisions, medians over repeats.
Each gae memory and its reference take turns decision by decision (who goes first
alternates), and each ratio is taken within a repeat, so both sides of a ratio meet the same
machine load (on this shared 2-CPU machine, load from outside slows a run by up to half, in
bursts).

The references are plain numpy transcriptions with the same per-call API, written the way one
would write them by hand (they are checked to give the same answers as gae first):

- :class:`NumpyJudgment`: the seed rule (one prototype per category and action, gated eta);
- :class:`NumpyRing`: a ring-buffer k-NN voting with ``1 / (d + 1e-8)``, as ``KNNMemory``;
- :class:`NumpyRetrieval`: the retrieval score ``w_sim cos + w_rec exp(-age / tau) + w_imp imp``
  over the stored decisions, top-k and the vote, as ``RetrievalMemory.score_one``.

:func:`measure_river` times the same memories as river estimators under river's own
prequential harness, against river's k-NN. Used by ``scripts/bench.py``; run alone for a quick look:
``python scripts/bench_single.py [--decisions N] [--repeats R]``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from training import cli

C, A, K = 4, 4, 8
CATEGORIES = tuple(f"category {i}" for i in range(C))
ACTIONS = tuple(f"action {i}" for i in range(A))
CAPACITY = 400  # the k-NN and retrieval memories' store
JUDGMENT_MODES = {"seed": {}, "adaptive": {"drift_mode": "adaptive"}, "prototypes=4": {"prototypes": 4}}
RECOMMENDED = "gae judgment, recommended"  # JudgmentConfig.recommended(): lvq and 4 judges


class NumpyJudgment:
    """The seed rule in plain numpy with gae's per-call API (float32 like gae)."""

    def __init__(self, tau: float = 0.1, eta_confirmed: float = 0.05, eta_override: float = 0.01,
                 threshold: float = 0.4, damping: float = 0.5) -> None:
        self.category = {name: i for i, name in enumerate(CATEGORIES)}
        self.action = {name: i for i, name in enumerate(ACTIONS)}
        self.centroids = np.zeros((C, A, K), np.float32)
        self.initialized = np.zeros((C, A), bool)
        self.weights = np.ones((C, K), np.float32)
        self.tau, self.threshold = np.float32(tau), threshold
        self.eta = (np.float32(eta_confirmed), np.float32(eta_override), np.float32(damping))

    def score_one(self, factors, category: str) -> tuple[str | None, float]:
        c = self.category[category]
        known = np.flatnonzero(self.initialized[c])
        if known.size == 0:
            return None, 0.0
        x = np.asarray(factors, dtype=np.float32)
        distance = ((x - self.centroids[c, known]) ** 2 * self.weights[c]).sum(-1)
        logits = -distance / self.tau
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = int(np.argmax(probs))
        return ACTIONS[known[best]], float(probs[best])

    def learn_one(self, factors, action: str, category: str, confirmed: bool = True) -> None:
        c, a = self.category[category], self.action[action]
        x = np.asarray(factors, dtype=np.float32)
        if not self.initialized[c, a]:
            self.centroids[c, a], self.initialized[c, a] = x, True
            return
        eta = self.eta[0] if confirmed else self.eta[1]
        if np.sqrt(((x - self.centroids[c, a]) ** 2).sum()) > self.threshold:
            eta = eta * self.eta[2]
        self.centroids[c, a] += eta * (x - self.centroids[c, a])


class NumpyRing:
    """A ring-buffer k-NN in plain numpy (distances in float64, stable order, weighted vote)."""

    def __init__(self, k: int = 5, capacity: int = CAPACITY) -> None:
        self.k, self.capacity = k, capacity
        self.action = {name: i for i, name in enumerate(ACTIONS)}
        self.factors = np.zeros((capacity, K), np.float32)
        self.actions = np.zeros(capacity, np.int64)
        self.size = self.head = 0

    def score_one(self, factors, category: str = "") -> tuple[str | None, float]:
        if self.size < self.k:
            return None, 0.0
        order = (self.head - self.size + np.arange(self.size)) % self.capacity  # oldest first
        x = np.asarray(factors, dtype=np.float32).astype(np.float64)
        distance = np.sqrt(((self.factors[order].astype(np.float64) - x) ** 2).sum(-1))
        nearest = np.argsort(distance, kind="stable")[:self.k]
        votes = np.zeros(A)
        np.add.at(votes, self.actions[order][nearest], 1.0 / (distance[nearest] + 1e-8))
        best = int(np.argmax(votes))
        return ACTIONS[best], float(votes[best] / votes.sum())

    def learn_one(self, factors, action: str, category: str = "") -> None:
        self.factors[self.head] = factors
        self.actions[self.head] = self.action[action]
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)


class NumpyRetrieval:
    """``RetrievalMemory`` in plain numpy (unscoped, the default scorer): the factors centred and
    normalised, the score ``w_sim cos + w_rec exp(-age / tau) + w_imp importance`` (importance 1)
    on the decision clock, top-k in row order for ties, the score-weighted vote; storing appends
    the decision, then evicts the stored row with the lowest score against it (the first such)."""

    def __init__(self, k: int = 5, capacity: int = CAPACITY, weights=(0.60, 0.25, 0.15), tau: float = 15.0,
                 center: float = 0.5) -> None:
        self.k, self.capacity, self.tau, self.center = k, capacity, np.float32(tau), np.float32(center)
        self.weights = tuple(np.float32(w) for w in weights)
        self.action = {name: i for i, name in enumerate(ACTIONS)}
        self.units = np.zeros((capacity + 1, K), np.float32)
        self.created = np.zeros(capacity + 1, np.float32)
        self.labels = np.zeros(capacity + 1, np.int64)
        self.size = 0
        self.now = 0

    def _unit(self, factors) -> np.ndarray:
        centred = np.asarray(factors, dtype=np.float32) - self.center
        return centred / max(np.float32(np.linalg.norm(centred)), np.float32(1e-12))

    def _scores(self, unit: np.ndarray) -> np.ndarray:
        w_sim, w_rec, w_imp = self.weights
        n = self.size
        recency = np.exp(-(np.float32(self.now) - self.created[:n]) / self.tau)
        return w_sim * (self.units[:n] @ unit) + w_rec * recency + w_imp

    def score_one(self, factors, category: str = "") -> tuple[str | None, float]:
        if self.size < self.k:
            return None, 0.0
        scores = self._scores(self._unit(factors))
        top = np.argsort(-scores, kind="stable")[:self.k]
        votes = np.zeros(A, np.float32)
        np.add.at(votes, self.labels[top], np.maximum(scores[top], np.float32(1e-8)))
        best = int(np.argmax(votes))
        return ACTIONS[best], float(votes[best] / votes.sum())

    def learn_one(self, factors, action: str, category: str = "") -> None:
        unit = self._unit(factors)
        n = self.size
        self.units[n], self.created[n], self.labels[n] = unit, self.now, self.action[action]
        self.size = n + 1
        if self.size > self.capacity:  # evict the lowest score against the new decision, keeping row order
            gone = int(np.argmin(self._scores(unit)))
            for column in (self.units, self.created, self.labels):
                column[gone:n] = column[gone + 1:n + 1]
            self.size = n
        self.now += 1


def contestants(package: Any = None) -> dict[str, Callable[[], object]]:
    """Name -> a factory of a fresh memory with ``score_one`` / ``learn_one`` (the gae memories
    from ``package``, another version's ``gae`` for ``scripts/bench_against.py``; default gae)."""
    judgment, knn, retrieval = ((JudgmentMemory, KNNMemory, RetrievalMemory) if package is None else
                                (package.JudgmentMemory, package.KNNMemory, package.RetrievalMemory))
    configs = JudgmentConfig if package is None else package.JudgmentConfig
    seed = configs.seed()  # the modes are the seed rule's (a memory's default is the recommended config)
    made: dict[str, Callable[[], object]] = {
        f"gae judgment, {mode}": (lambda options=options: judgment(CATEGORIES, ACTIONS, K, seed, **options))
        for mode, options in JUDGMENT_MODES.items()}
    config = configs.recommended()
    made[RECOMMENDED] = lambda: judgment(CATEGORIES, ACTIONS, K, config)
    made[f"{RECOMMENDED} without judges"] = lambda: judgment(
        CATEGORIES, ACTIONS, K, config.replace(judges=None) if "judges" in config.options() else config)
    made["numpy judgment, seed rule"] = NumpyJudgment
    made["gae k-NN"] = lambda: knn(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY)
    made["numpy ring-buffer k-NN"] = NumpyRing
    made["gae retrieval"] = lambda: retrieval(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY)
    made["numpy retrieval score"] = NumpyRetrieval
    return made


def decisions(n: int, seed: int = 0) -> list[tuple[list[float], str, str]]:
    """Seeded decisions as a user holds them: a list of floats and the names."""
    rng = np.random.default_rng(seed)
    centres = rng.random((C, A, K))
    category, action = rng.integers(0, C, n), rng.integers(0, A, n)
    x = np.clip(centres[category, action] + 0.1 * rng.standard_normal((n, K)), 0, 1)
    return [(row, CATEGORIES[c], ACTIONS[a]) for row, c, a in zip(x.tolist(), category, action, strict=True)]


def time_pair(memory, reference, stream: list, score_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Nanoseconds of each decision's ``score_one`` + ``learn_one`` (only ``score_one`` with
    ``score_only``: the decision is learned untimed, so every memory sees the same stream), for
    two memories taking turns decision by decision (who goes first alternates), so that both
    meet the same machine load; ``reference`` may be None."""
    ns = (np.empty(len(stream)), np.empty(len(stream)))
    clock = time.perf_counter_ns
    pair = (memory, reference)
    order = ((0, 1), (1, 0)) if reference is not None else ((0,), (0,))
    for i, (row, category, action) in enumerate(stream):
        for j in order[i % 2]:
            who = pair[j]
            start = clock()
            who.score_one(row, category)
            if score_only:
                ns[j][i] = clock() - start
                who.learn_one(row, action, category)
            else:
                who.learn_one(row, action, category)
                ns[j][i] = clock() - start
    return ns


def agree(stream: list) -> dict[str, bool]:
    """The transcriptions answer what gae answers on the same stream (speed means nothing otherwise)."""
    pairs = {"judgment": (JudgmentMemory(CATEGORIES, ACTIONS, K, config=JudgmentConfig.seed()), NumpyJudgment()),
             "knn": (KNNMemory(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY), NumpyRing()),
             "retrieval": (RetrievalMemory(factors=K, actions=ACTIONS, k=5, capacity=CAPACITY), NumpyRetrieval())}
    result = {}
    for name, (mine, theirs) in pairs.items():
        same = True
        for row, category, action in stream:
            (a, p), (b, q) = mine.score_one(row, category), theirs.score_one(row, category)
            same &= a == b and abs(p - q) <= 1e-5
            mine.learn_one(row, action, category)
            theirs.learn_one(row, action, category)
        result[name] = bool(same)
    return result


REFERENCES = {**{f"gae judgment, {mode}": "numpy judgment, seed rule" for mode in JUDGMENT_MODES},
              "gae k-NN": "numpy ring-buffer k-NN", "gae retrieval": "numpy retrieval score",
              # no transcription: timed in turn with the seed rule's for the same load, no ratio reported
              **dict.fromkeys((RECOMMENDED, f"{RECOMMENDED} without judges"), "numpy judgment, seed rule")}
UNTRANSCRIBED = (RECOMMENDED, f"{RECOMMENDED} without judges")


def measure_decisions(n: int, repeats: int, progress: Callable[[str], None] = print) -> dict:
    """Per gae memory, timed decision by decision in turn with its numpy reference (fresh
    memories each repeat): the per-repeat p50 / p99 in microseconds of one decision
    (``score_one`` + ``learn_one``; the retrieval pair: ``score_one`` alone) and their medians,
    the median over repeats of the p50 ratio to the reference, and whether the transcriptions
    agree with gae. A reference's latencies are pooled over its pairings."""
    stream = decisions(n)
    made = contestants()
    progress(f"one decision at a time: score_one + learn_one over {n:,} decisions, {len(REFERENCES)} pairs")
    for name, reference in REFERENCES.items():  # load compiled code and warm caches, untimed
        time_pair(made[name](), made[reference](), stream[:300], score_only="retrieval" in name)
    p50: dict[str, list[float]] = {name: [] for name in made}
    p99: dict[str, list[float]] = {name: [] for name in made}
    ratios: dict[str, list[float]] = {name: [] for name in REFERENCES if name not in UNTRANSCRIBED}
    for _ in range(repeats):
        for name, reference in REFERENCES.items():
            timed = time_pair(made[name](), made[reference](), stream, score_only="retrieval" in name)
            for who, ns in zip((name, reference), timed, strict=True):
                us = ns[n // 10:] / 1e3  # past the start, when the memories are still empty
                p50[who].append(float(np.percentile(us, 50)))
                p99[who].append(float(np.percentile(us, 99)))
            if name not in UNTRANSCRIBED:
                ratios[name].append(p50[name][-1] / p50[reference][-1])
    latency = {name: {"p50": p50[name], "p99": p99[name], "median_p50": statistics.median(p50[name]),
                      "median_p99": statistics.median(p99[name])} for name in made}
    return {"n": n, "latency_us": latency, "ratio_p50": {name: statistics.median(r) for name, r in ratios.items()},
            "ratios": ratios, "agree": agree(stream[:2000])}


def measure_river(repeats: int, progress: Callable[[str], None] = print) -> dict | None:
    """Microseconds per decision and accuracy under river's own prequential harness
    (``evaluate.progressive_val_score`` on the bundled Phishing data, ``StandardScaler`` in front):
    gae's river estimators against river's k-NN. None when river is not installed."""
    try:
        from river import datasets, evaluate, metrics, neighbors, preprocessing
    except ImportError:
        return None
    from gae.river import JudgmentClassifier, KNNClassifier

    models = {"gae JudgmentClassifier (recommended)": JudgmentClassifier,
              "gae KNNClassifier (capacity 400)": lambda: KNNClassifier(capacity=CAPACITY),
              "river KNNClassifier (window 400)": lambda: neighbors.KNNClassifier(
                  engine=neighbors.LazySearch(window_size=CAPACITY))}
    data = list(datasets.Phishing())
    progress(f"river's harness: progressive_val_score on Phishing ({len(data):,} decisions), {len(models)} models")
    result = {}
    for name, make in models.items():
        evaluate.progressive_val_score(data[:200], preprocessing.StandardScaler() | make(), metrics.Accuracy())  # warm
        times, accuracy = [], 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            metric = evaluate.progressive_val_score(data, preprocessing.StandardScaler() | make(), metrics.Accuracy())
            times.append((time.perf_counter() - start) / len(data) * 1e6)
            accuracy = metric.get()
        result[name] = {"us_per_decision": times, "median_us": statistics.median(times), "accuracy": accuracy}
    return {"n": len(data), "models": result}


def main() -> None:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=cli.int_at_least(20), default=6000,
                        help="decisions per memory and repeat (at least 20)")
    parser.add_argument("--repeats", type=cli.int_at_least(1), default=3, help="timed repeats (median)")
    args = parser.parse_args()
    record = measure_decisions(args.decisions, args.repeats)
    for name, values in record["latency_us"].items():
        extra = f"  {record['ratio_p50'][name]:.2f}x its reference" if name in record["ratio_p50"] else ""
        print(f"{name:34s} p50 {values['median_p50']:8.1f} us   p99 {values['median_p99']:8.1f} us{extra}")
    print("transcriptions agree with gae:", record["agree"])
    river = measure_river(args.repeats)
    for name, values in ({} if river is None else river["models"]).items():
        print(f"{name:40s} {values['median_us']:8.1f} us a decision, accuracy {values['accuracy']:.3f}")


if __name__ == "__main__":
    main()
