"""The original design's two memories, transcribed to plain Python (lists, dicts, ``math``).

This is the executable form of the pseudocode in the seed ("Full Production Classes — Not
Pseudocode"): ``AgenticMemory`` (k-NN retrieval) and ``JudgmentMemory`` (centroid
learning). The tests in ``test_seed_reference.py`` hold :class:`gae.KNNMemory` and
:class:`gae.JudgmentMemory` equal to it, decision by decision. No numpy, no torch: the
point is an independent oracle that shares no code with the package.

The transcription keeps the seed's control flow, names, defaults, dict orders and
tie-breaking (``max(votes, key=votes.get)``, stable ``list.sort``). Every place where it
has to deviate, or to fill a gap the pseudocode leaves, is marked ``DEVIATION`` below.

Arithmetic is Python float (IEEE double). gae keeps its state in float32, so the tests feed
both sides factors that are exactly representable in float32 and compare with tolerances.
"""

from __future__ import annotations

import itertools
import math

__all__ = ["AgenticMemory", "JudgmentMemory", "euclidean", "norm"]


def euclidean(a, b):
    """Euclidean distance of two equal-length sequences (the seed's ``euclidean``)."""
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def norm(v):
    """L2 norm of a sequence (the seed's ``norm``)."""
    return math.sqrt(sum(x * x for x in v))


# DEVIATION: the seed stamps traces with ``now()`` (wall-clock time). Timestamps are never
# read by the seed, and a clock would make the transcription non-deterministic, so a
# process-wide counter stands in for it.
_clock = itertools.count()


def now():
    return next(_clock)


class AgenticMemory:
    """k-NN retrieval memory. The pattern behind LangChain, Mem0,
    and most agentic frameworks."""

    def __init__(self, k=5, cap=200):
        self.store = []  # flat list, all categories mixed
        self.k = k  # neighbors to retrieve
        self.cap = cap  # max traces before eviction

    def score(self, factors, category="general"):
        """O(n*K) — scans entire store, every call."""
        if len(self.store) < self.k:
            return None, 0.0

        dists = [(euclidean(factors, t["factors"]), t) for t in self.store]
        # list.sort is stable: among equal distances the older trace comes first.
        dists.sort(key=lambda x: x[0])
        neighbors = dists[: self.k]

        votes = {}
        for d, t in neighbors:
            w = 1.0 / (d + 1e-8)
            votes[t["action"]] = votes.get(t["action"], 0) + w

        # max() keeps the first maximal key in dict insertion order, i.e. the action met
        # first in neighbour order.
        best = max(votes, key=votes.get)
        return best, votes[best] / sum(votes.values())
        # → THEN: 1 LLM call to synthesize retrieved context  (not transcribed: no LLM here)

    def learn(self, factors, action, **kwargs):
        """Append. No compression. No gate. No quality signal."""
        self.store.append(
            {
                # DEVIATION (defensive only): store a copy, so that a caller mutating its
                # list later cannot rewrite history. The seed stores the reference.
                "factors": list(factors),
                "action": action,
                "ts": now(),
            }
        )
        if len(self.store) > self.cap:
            self.store.pop(0)  # FIFO eviction
        # No drift protection
        # No outcome-quality handling
        # kwargs silently ignored (so '__incorrect__' outcomes are learned too)


class JudgmentMemory:
    """Centroid learning. O(1) inference, conservation-gated updates."""

    def __init__(self, tau=0.1, drift_thresh=0.4):
        self.centroids = {}  # {category: {action: [mu]}}
        self.tau = tau  # softmax temperature
        self.drift_thresh = drift_thresh
        self.gate_log = []  # every drift event recorded

    def score(self, factors, category="general"):
        """O(A*K) — constant, category-scoped. Zero LLM calls."""
        if category not in self.centroids:
            return None, 0.0

        C = self.centroids[category]
        dists = {a: sum((f - c) ** 2 for f, c in zip(factors, mu)) for a, mu in C.items()}  # noqa: B905
        exps = {a: math.exp(-d / self.tau) for a, d in dists.items()}
        Z = sum(exps.values())
        # Ties go to the action whose prototype was created first in this category (dict
        # order); gae breaks exact ties by action index. Only exact ties can differ, and the
        # tests' continuous random streams do not produce them.
        best = max(exps, key=exps.get)
        return best, exps[best] / Z
        # → Done. 0 LLM calls. <1ms.

    def learn(self, factors, action, category, confirmed=True, outcome=None):
        """Update centroid. Conservation gate checks drift."""
        if outcome == "__incorrect__":
            return {"skipped": True}  # uncertain → skip

        eta = 0.05 if confirmed else 0.01  # 5x differential

        # DEVIATION: first-touch initialisation. The seed reads
        # ``self.centroids[category][action]`` unconditionally, which raises KeyError on the
        # first decision of every (category, action): the pseudocode never says how a
        # prototype comes to exist. Here (and in gae, DESIGN.md section 3) the first verified
        # decision of a cell becomes its prototype; the gate does not run and nothing is
        # logged. The returned eta=1.0 / disp=0.0 mirror gae's LearnEvents convention
        # ("the prototype moved all the way to x"); the seed has no value for them.
        cell = self.centroids.setdefault(category, {})
        if action not in cell:
            cell[action] = list(factors)
            return {"initialized": True, "gated": False, "eta": 1.0, "disp": 0.0}

        mu = cell[action]

        # Conservation gate
        disp = norm([f - c for f, c in zip(factors, mu)])  # noqa: B905  (the seed's norm(factors - mu))
        if disp > self.drift_thresh:
            eta *= 0.5  # dampen outlier
            self.gate_log.append({"disp": disp, "action": action})

        for i in range(len(mu)):
            mu[i] += eta * (factors[i] - mu[i])  # c += η·(x - c)

        return {"gated": disp > self.drift_thresh, "eta": eta, "disp": disp}
