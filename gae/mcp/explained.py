"""A judgment memory's :class:`~gae.judgment.explain.Explanation` of one decision as plain JSON
values: names for indices, None for the infinities and NaNs JSON has no word for."""

from __future__ import annotations

import math
from typing import Any

from typing_extensions import TypedDict  # pydantic needs it for nested TypedDicts before Python 3.12

from gae.judgment.explain import Explanation


class JudgeJSON(TypedDict):
    """One judge's say in the answer: its trust (the judges' trusts sum to 1) and its votes
    (action: probability)."""

    trust: float
    votes: dict[str, float]


class ThresholdJSON(TypedDict):
    """A bin that decided a bins judge's answer: the factor's value lies in [low, high) (None: an
    open end), which favours action over rival by nats."""

    judge: str
    factor: str
    low: float | None
    high: float | None
    action: str
    rival: str
    nats: float


class ExplanationJSON(TypedDict):
    """Why a decision was decided as it was: the answer (action, confidence, probs, margin), each
    action's distance to its nearest prototype and each factor's contributions to it, each factor's
    weight and its parts attention and relevance, each judge's trust and votes, and the thresholds
    of the bins judge."""

    category: str
    action: str | None
    confidence: float
    probs: dict[str, float]
    margin: float | None
    distance: dict[str, float | None]
    contributions: dict[str, dict[str, float]]
    nearest_prototype: dict[str, int]
    weight: dict[str, float]
    attention: dict[str, float]
    relevance: dict[str, float]
    prototypes_action: str | None
    judges: dict[str, JudgeJSON]
    thresholds: list[ThresholdJSON]


def _number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def explanation_json(explanation: Explanation, b: int = 0) -> ExplanationJSON:
    """Decision ``b`` of ``explanation``: the answer (``action``, ``confidence``, ``probs``), each
    action's nearest prototype (``distance``, ``contributions`` per factor), each factor's
    ``weight`` in the distance and its parts ``attention`` and ``relevance``, each judge's
    ``trust`` and ``votes``, and the ``thresholds`` that decided each ``bins`` judge's answer (the
    bin ``[low, high)`` of a factor's value, None for an open end, favouring ``action`` over
    ``rival`` by ``nats``)."""
    e = explanation
    actions, factors = e.action_names, e.factor_names

    def named(index: Any) -> str | None:
        return actions[int(index)] if int(index) >= 0 else None

    distance = {a: _number(e.distance[b, j]) for j, a in enumerate(actions)}
    return {
        "category": e.category_names[int(e.category[b])],
        "action": named(e.action[b]),
        "confidence": float(e.confidence[b]),
        "probs": {a: float(e.probs[b, j]) for j, a in enumerate(actions)},
        "margin": _number(e.margin[b]),
        "distance": distance,
        "contributions": {a: {f: float(e.contributions[b, j, k]) for k, f in enumerate(factors)}
                          for j, a in enumerate(actions) if distance[a] is not None},
        "nearest_prototype": {a: int(e.nearest[b, j]) for j, a in enumerate(actions) if int(e.nearest[b, j]) >= 0},
        "weight": {f: float(e.weight[b, k]) for k, f in enumerate(factors)},
        "attention": {f: float(e.attention[b, k]) for k, f in enumerate(factors)},
        "relevance": {f: float(e.relevance[b, k]) for k, f in enumerate(factors)},
        "prototypes_action": named(e.prototypes_action[b]),
        "judges": {judge: {"trust": float(e.trust[b, i]), "votes": {a: float(e.votes[b, i, j])
                                                                    for j, a in enumerate(actions)}}
                   for i, judge in enumerate(e.judge_names)},
        "thresholds": [{"judge": t.judge, "factor": t.factor, "low": _number(t.low), "high": _number(t.high),
                        "action": t.action, "rival": t.rival, "nats": t.nats}
                       for t in (e.thresholds[b] if b < len(e.thresholds) else ())],
    }
