"""Explanations of the judgment memory's recommendations: every number behind them, with names.

:func:`explain` computes an :class:`Explanation` with the rule's own scoring formula
(:func:`gae.judgment.rule.distances`); ``print()`` it for a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from gae.judgment import rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.state import JudgmentState

SHOWN_DECISIONS = 8  # __str__ prints the first few decisions of a batch, and says how many it left out


class Threshold(NamedTuple):
    """A bin that decided a ``bins`` judge's answer (docs/judges.md): the value of ``factor`` lies
    in ``[low, high)`` (the user's units; ``-inf`` / ``inf`` for the open end bins), and the judge's
    histograms of that bin favour ``action`` over ``rival`` by ``nats``."""

    judge: str
    factor: str
    low: float
    high: float
    action: str
    rival: str
    nats: float

    def __str__(self) -> str:
        digits = 10  # an open bin's edge: its width unknown here, digits enough for a shift of many spreads
        if math.isfinite(self.low) and math.isfinite(self.high) and self.high > self.low:
            # a bin is a fraction of a spread wide: enough digits that its two edges differ, however far the shift
            digits = max(4, math.ceil(math.log10(max(abs(self.low), abs(self.high)) / (self.high - self.low))) + 3)
        low = "" if self.low == float("-inf") else f"{self.low:.{digits}g} <= "
        high = "" if self.high == float("inf") else f" < {self.high:.{digits}g}"
        return (f"{self.judge}: {low}{self.factor}{high} favours {self.action} over {self.rival} "
                f"by {self.nats:.2f} nats")


@dataclass(frozen=True)
class Explanation:
    """Why a :class:`~gae.JudgmentMemory` recommends what it does, for a batch of B decisions.

    Every action is represented by its nearest scoring prototype (the only one when
    ``prototypes=1``), the one that set its logit; in ``drift_mode='adaptive'``, while the
    category's tracking prototypes lead, the tracking prototype (the gate's view, ``displacement``
    and ``gated``, still measures the prototype itself).

    With judges (``config.judges``, docs/judges.md), ``action``, ``confidence`` and ``probs`` are
    the memory's answer, the mixture of its judges' votes; ``votes`` and ``trust`` show each
    judge's vote and weight, and every other field describes the prototypes (judge 0), whose
    own recommendation is ``prototypes_action``.

    Attributes:
        action: (B,) int64, the recommended action, -1 where the memory abstains.
        confidence: (B,) float, its probability (0 on abstention).
        probs: (B, A) float, the softmax over actions (with judges: their mixture).
        distance: (B, A) float, the weighted squared distance to each action's nearest prototype,
            ``sum_k weight[k] * (x[k] - prototype[k]) ** 2``; ``inf`` where the action has none.
            ``logit = -distance / tau``.
        contributions: (B, A, K) float, each criterion's share of that distance,
            ``weight[k] * (x[k] - prototype[k]) ** 2``; sums to ``distance`` over K.
        weight: (B, K) float, the one weight each criterion has in the distance, for each
            decision's category: the memory's metric (:meth:`~gae.JudgmentMemory.metric`,
            :func:`gae.judgment.rule.metric`). With the gated rule it is the attention; with
            ``learning='lvq'`` it has three parts, ``attention * relevance / spread``.
        attention: (B, K) float, a part of ``weight``: the criterion attention of each
            decision's category (learned by gradient; all ones until then).
        relevance: (B, K) float, a part of ``weight`` with ``learning='lvq'``: the relevances it
            learned for each decision's category (summing to 1); uniform with the gated rule,
            which has none and leaves them out of ``weight``.
        spread: (B, K) float, a part of ``weight`` with ``learning='lvq'``: what each squared
            difference is divided by, the category's running variance in the config's ``units``
            (:func:`gae.judgment.rule.spread`), so a distance is measured in the data's own
            units; ones with the gated rule.
        nearest: (B, A) int64, the prototype slot each action scored with, -1 where none.
        margin: (B,) float, the distance of the second-best action's prototype minus the best's
            (``inf`` when fewer than two actions have a prototype, ``nan`` when none does).
        displacement: (B,) float, the unweighted L2 distance from the recommended action's
            nearest prototype in use (the gate's distance; ``nan`` on abstention); with
            ``learning='lvq'``, the squared distance under the metric as it stands (learning
            first adds the decision to the running statistics, then measures).
        gated: (B,) bool, learning this decision as the recommended action would be damped by
            the drift gate (``displacement > drift_threshold``; see ``spawns`` for P > 1).
            Always False with ``learning='lvq'``, which has no gate.
        spawns: (B,) bool, learning it would start a new prototype instead (``prototypes > 1``
            and ``displacement > spawn_threshold``); always False with one prototype, and with
            ``learning='lvq'``, which spawns only where its recommendation was wrong.
        category: (B,) int64, the decisions' categories.
        category_names, action_names, factor_names: the memory's names, for printing.
        judge_names: the judges, in vote order: ``'prototypes'``, then the config's judges.
        votes: (B, J, A) float, each judge's probabilities (all zero where it has no opinion
            yet); without judges, J = 1 and the vote is ``probs``.
        trust: (B, J) float, the category's weight on each judge (summing to 1).
        prototypes_action: (B,) int64, the prototypes' own recommendation (-1: none), the
            action ``nearest``, ``displacement``, ``gated`` and ``spawns`` speak of; ``action``
            without judges.
        thresholds: per decision, the bins that decided each ``bins`` judge's answer
            (:class:`Threshold`, the strongest first, at most three per judge); empty tuples
            without such a judge.
    """

    action: Tensor
    confidence: Tensor
    probs: Tensor
    distance: Tensor
    contributions: Tensor
    weight: Tensor
    attention: Tensor
    relevance: Tensor
    spread: Tensor
    nearest: Tensor
    margin: Tensor
    displacement: Tensor
    gated: Tensor
    spawns: Tensor
    category: Tensor
    category_names: tuple[str, ...]
    action_names: tuple[str, ...]
    factor_names: tuple[str, ...]
    judge_names: tuple[str, ...]
    votes: Tensor
    trust: Tensor
    prototypes_action: Tensor
    thresholds: tuple[tuple[Threshold, ...], ...] = ()

    lvq: bool = False  # the memory learns with learning='lvq'

    def __len__(self) -> int:
        return self.action.shape[0]

    def __str__(self) -> str:
        blocks = [self._decision(b) for b in range(min(len(self), SHOWN_DECISIONS))]
        if len(self) > SHOWN_DECISIONS:
            blocks.append(f"... {len(self) - SHOWN_DECISIONS} more decisions not shown")
        return "\n\n".join(blocks)

    def _decision(self, b: int) -> str:
        category = self.category_names[int(self.category[b])]
        action, own = int(self.action[b]), int(self.prototypes_action[b])
        judged = len(self.judge_names) > 1
        margin = f"margin {float(self.margin[b]):.4f}"
        head = f"decision {b} ({category}): " + (
            "abstains" if action < 0 else
            f"recommends {self.action_names[action]} (confidence {float(self.confidence[b]):.3f}, "
            + (f"the mixture of {len(self.judge_names)} judges)" if judged else f"{margin})"))
        if own >= 0:
            learning = ("would start a new prototype" if bool(self.spawns[b]) else
                        "would be gated" if bool(self.gated[b]) else "would not be gated")
            if self.lvq:
                learning = "would move its nearest prototype toward it"
            displacement = f"displacement {float(self.displacement[b]):.3f}"
            head += (f"; the prototypes recommend {self.action_names[own]} ({margin})" if judged else "") + (
                f"; learning it as {self.action_names[own]} {learning} ({displacement})")
        factors = list(self.factor_names)
        rows = [["action", "prototype", "distance", "prob", *factors]]
        if self.lvq:  # the weight and its parts: weight = attention x relevance / spread
            rows += [["weight", "", "", "", *(f"{float(w):.4g}" for w in self.weight[b])],
                     ["= attention", "", "", "", *(f"{float(w):.3f}" for w in self.attention[b])],
                     ["x relevance", "", "", "", *(f"{float(w):.3f}" for w in self.relevance[b])],
                     ["/ spread", "", "", "", *(f"{float(w):.4g}" for w in self.spread[b])]]
        else:  # one part: the attention
            rows.append(["weight (attention)", "", "", "", *(f"{float(w):.3f}" for w in self.weight[b])])
        for a, name in enumerate(self.action_names):
            probability = f"{float(self.votes[b, 0, a]):.3f}"  # the prototypes' own
            if int(self.nearest[b, a]) < 0:
                rows.append([name, "-", "inf", probability, *("-" for _ in factors)])
                continue
            mark = " *" if a == own else ""
            rows.append([name + mark, str(int(self.nearest[b, a])), f"{float(self.distance[b, a]):.4f}",
                         probability, *(f"{float(v):.4f}" for v in self.contributions[b, a])])
        lines = _table(rows)
        if judged:  # each judge's weight and vote, the mixture last
            votes = [[name, f"{float(self.trust[b, j]):.3f}", *(f"{float(v):.3f}" for v in self.votes[b, j])]
                     for j, name in enumerate(self.judge_names)]
            lines += _table([["judge", "trust", *self.action_names], *votes,
                             ["mixture", "", *(f"{float(v):.3f}" for v in self.probs[b])]])
        if b < len(self.thresholds):
            lines += [str(threshold) for threshold in self.thresholds[b]]
        return "\n".join([head, *lines])


def _table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                      for i, (cell, width) in enumerate(zip(row, widths, strict=True))) for row in rows]


def margins(distance: Tensor) -> Tensor:
    """(B,) second-smallest minus smallest of each row of a (B, A) distance matrix (``inf`` for
    absent actions): ``inf`` with one finite entry, ``nan`` with none."""
    if distance.shape[1] < 2:
        best = distance[:, 0]
        return torch.where(torch.isfinite(best), float("inf"), float("nan"))
    two = distance.topk(2, dim=1, largest=False).values
    gap = two[:, 1] - two[:, 0]
    return torch.where(torch.isfinite(two[:, 0]), gap, float("nan"))


@torch.no_grad()
def explain(state: JudgmentState, config: JudgmentConfig, attention: Tensor, x: Tensor, category: Tensor,
            names: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]) -> Explanation:
    """The :class:`Explanation` of scoring ``x`` (B, K) in ``category`` (B,) against ``state``.

    ``attention`` is the (C, K) criterion attention; ``names`` the memory's (category, action,
    factor) names. The distances are the rule's (:func:`rule.distances`) to what scores; the
    gate's view measures the prototypes themselves, unweighted, as learning would.
    """
    alpha = attention[category]  # (B, K)
    weights = rule.metric(attention, state, config)[category]  # (B, K): alpha * relevance / spread with lvq
    lvq = config.learning == "lvq"
    if lvq:
        relevance = rule.relevances(state.relevance_logits)[category]
        spread = rule.spread(rule.unit_variances(state, config), config)[category]
    else:
        relevance, spread = torch.full_like(alpha, 1.0 / alpha.shape[1]), torch.ones_like(alpha)
    estimates = rule.scoring_estimates(state, config)
    sq_diff, distance = rule.distances(x, estimates[category], weights)  # (B, A, P, K), (B, A, P)
    scoring = rule.scoring_mask(state.initialized, state.wins, config.slots.spawn_support)[category]
    distance, nearest = distance.masked_fill(~scoring, float("inf")).min(-1)  # (B, A)
    present = torch.isfinite(distance)
    nearest = torch.where(present, nearest, -1)
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    actions = torch.arange(state.centroids.shape[1], device=x.device)
    contributions = sq_diff[rows, actions, nearest.clamp(min=0)] * weights[:, None, :]
    contributions = contributions.masked_fill(~present[..., None], float("nan"))
    out = rule.output((-distance / config.rule.tau).masked_fill(~present, float("-inf")), config.rule.min_confidence)
    # learning the recommendation would move its nearest prototype in use (the prototypes themselves, also
    # while tracking prototypes score in drift_mode='adaptive'), by the unweighted distance
    if lvq:  # its rule's distance: the metric's
        length = rule.distances(x, state.centroids[category], weights)[1]
    else:
        length = rule.distances(x, state.centroids[category], torch.ones_like(alpha))[1].sqrt()
    length = length.masked_fill(~state.initialized[category], float("inf"))  # (B, A, P)
    recommended = out.action.clamp(min=0)
    displacement, taught = length[rows.squeeze(1), recommended].min(-1)
    displacement = torch.where(out.action >= 0, displacement, float("nan"))
    spawns = (displacement > config.slots.spawn_threshold) & (config.slots.prototypes > 1) & (not lvq)
    gated = (displacement > config.rule.drift_threshold) & ~spawns & (not lvq)
    if config.adaptive:  # a promoted prototype restarting (no weight yet) is not gated
        cell = (category, recommended, taught)
        gated &= ~(state.following[cell] & (state.follow_weight[cell] == 0))
    category_names, action_names, factor_names = names
    return Explanation(out.action, out.confidence, out.probs, distance, contributions, weight=weights, attention=alpha,
                       relevance=relevance, spread=spread, nearest=nearest, margin=margins(distance),
                       displacement=displacement, gated=gated, spawns=spawns, category=category,
                       category_names=category_names, action_names=action_names, factor_names=factor_names,
                       judge_names=("prototypes",), votes=out.probs[:, None, :],
                       trust=torch.ones_like(out.confidence)[:, None], prototypes_action=out.action, lvq=lvq)

