"""The judgment memory's buffers: one layout in every mode, and the migration of older checkpoints.

Like ``torch.nn.BatchNorm``, the set of buffers, their ranks and dtypes never depend on the
options: every per-prototype buffer has a slot dimension P (1 in the original design), and a
feature that is off keeps its buffers empty (size 0), so nothing is stored for it and nothing
changes shape between modes. ``VERSION`` is the layout's number (``JudgmentMemory._version``);
:func:`upgrade` turns any state an earlier gae saved into this layout.

Layout version 5 (C categories, A actions, P prototype slots, K factors):

==========================  =========  ==============  ======================================
buffer                      dtype      shape           when the feature is off
==========================  =========  ==============  ======================================
``centroids``               float32    (C, A, P, K)
``initialized``             bool       (C, A, P)
``counts``                  int64      (C, A, P)
``wins``                    float32    (C, A, P)       (0, 0, 0) when P = 1
``num_decisions``           int64      ()
``shadow_centroids``        float32    (C, A, P, K)    (0, 0, 0, 0) unless drift_mode='adaptive'
``promotion_statistic``     float32    (C,)            (0,)
``promotion_evidence``      int64      (C, 2)          (0, 2)
``following``               bool       (C, A, P)       (0, 0, 0)
``follow_weight``           float32    (C, A, P)       (0, 0, 0)
``run_centroids``           float32    (C, A, P, K)    (0, 0, 0, 0)
``run_counts``              int64      (C, A, P)       (0, 0, 0)
``tracking_centroids``      float32    (C, A, P, K)    (0, 0, 0, 0)
``tracking_lead``           float32    (C,)            (0,)
``input_counts``            int64      (C,)            (0,) unless learning='lvq'
``input_means``             float32    (C, K)          (0, 0)
``input_variances``         float32    (C, K)          (0, 0)
``relevance_logits``        float32    (C, K)          (0, 0)
``recent_errors``           float32    (C,)            (0,)
``factor_counts``           int64      (1,)            (0,)
``factor_means``            float32    (1, K)          (0, 0)
``factor_variances``        float32    (1, K)          (0, 0)
``trust_weights``           float32    (C, J)          (0, 0) without judges
``judge_<name>_<buffer>``   (judge's)  (judge's)       not registered: only the config's judges
==========================  =========  ==============  ======================================

The judges (``JudgmentConfig.judges``, :mod:`gae.judgment.judges`) are the one exception to a
fixed set: each judge of the config registers its kind's buffers under its own name, and the J
columns of ``trust_weights`` are the prototypes then each judge. A state saved with other judges
is refused by name (``JudgmentMemory`` checks the config it was saved with).

Version 4 had no ``recent_errors`` and no running statistics over all categories (``factor_*``);
its states gain the first at 0 (no recent error), of the size of ``input_counts``, and the others
pooled from the categories' own (``input_*``, by the law of total variance): what they would hold.

Version 3 had no judges and no ``trust_weights``; its states gain it empty.

Version 2 had no ``learning='lvq'`` and none of its four buffers; its states gain them empty.

Version 1 (gae before the layout was fixed) kept (C, A, K) / (C, A) buffers with one
prototype, had no ``wins`` then, and registered the adaptive buffers only in that mode; its
adaptive layout went through two formats (the first without the tracking prototypes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from gae.judgment.config import JudgmentConfig

VERSION = 5


class JudgmentState(NamedTuple):
    """Every learned buffer but ``num_decisions``, in layout order (see the module's table).
    The engine takes and updates them in place; each is (C, A, P, ...) or per category."""

    centroids: Tensor
    initialized: Tensor
    counts: Tensor
    wins: Tensor
    shadow_centroids: Tensor
    promotion_statistic: Tensor
    promotion_evidence: Tensor
    following: Tensor
    follow_weight: Tensor
    run_centroids: Tensor
    run_counts: Tensor
    tracking_centroids: Tensor
    tracking_lead: Tensor
    input_counts: Tensor
    input_means: Tensor
    input_variances: Tensor
    relevance_logits: Tensor
    recent_errors: Tensor
    factor_counts: Tensor
    factor_means: Tensor
    factor_variances: Tensor


_ADAPTIVE = JudgmentState._fields[4:13]
_LVQ = JudgmentState._fields[13:]
BUFFERS = (*JudgmentState._fields[:4], "num_decisions", *_ADAPTIVE, *_LVQ, "trust_weights")  # registration order
# (then each judge's buffers: gae.judgment.judges.layout)


def layout(n_categories: int, n_actions: int, n_factors: int, config: JudgmentConfig) -> dict[str, tuple]:
    """``name -> (shape, dtype)`` of every buffer of a memory of these sizes and options."""
    cells = (n_categories, n_actions, config.slots.prototypes)
    on, lvq = config.adaptive, config.learning == "lvq"

    def per_prototype(*rest: int, used: bool = True) -> tuple[int, ...]:
        return (*cells, *rest) if used else (0, 0, 0, *(0 for _ in rest))

    f32, i64, boolean = torch.float32, torch.int64, torch.bool
    return {
        "centroids": (per_prototype(n_factors), f32),
        "initialized": (per_prototype(), boolean),
        "counts": (per_prototype(), i64),
        "wins": (per_prototype(used=config.slots.prototypes > 1), f32),
        "num_decisions": ((), i64),
        "shadow_centroids": (per_prototype(n_factors, used=on), f32),
        "promotion_statistic": ((n_categories if on else 0,), f32),
        "promotion_evidence": ((n_categories if on else 0, 2), i64),
        "following": (per_prototype(used=on), boolean),
        "follow_weight": (per_prototype(used=on), f32),
        "run_centroids": (per_prototype(n_factors, used=on), f32),
        "run_counts": (per_prototype(used=on), i64),
        "tracking_centroids": (per_prototype(n_factors, used=on), f32),
        "tracking_lead": ((n_categories if on else 0,), f32),
        "input_counts": ((n_categories if lvq else 0,), i64),
        "input_means": ((n_categories, n_factors) if lvq else (0, 0), f32),
        "input_variances": ((n_categories, n_factors) if lvq else (0, 0), f32),
        "relevance_logits": ((n_categories, n_factors) if lvq else (0, 0), f32),
        "recent_errors": ((n_categories if lvq else 0,), f32),
        "factor_counts": ((1 if lvq else 0,), i64),
        "factor_means": ((1, n_factors) if lvq else (0, 0), f32),
        "factor_variances": ((1, n_factors) if lvq else (0, 0), f32),
        **_judges().layout(config.judged(), n_categories, n_actions, n_factors),  # trust_weights, then each judge's
    }


def _judges() -> Any:
    from gae.judgment import judges  # the judges' modules build on the primitives, which import this one
    return judges


def register(module: torch.nn.Module, n_categories: int, n_actions: int, n_factors: int,
             config: JudgmentConfig) -> None:
    """Register every buffer of :func:`layout` on ``module``, zero-filled."""
    for name, (shape, dtype) in layout(n_categories, n_actions, n_factors, config).items():
        module.register_buffer(name, torch.zeros(shape, dtype=dtype))


def grown(buffers: dict[str, Tensor], n_categories: int, n_actions: int, n_factors: int,
          config: JudgmentConfig) -> dict[str, Tensor]:
    """The buffers of :func:`layout` for a memory grown to ``n_categories`` x ``n_actions``: each
    a new zero-filled tensor (the value of a cell nothing has learned) with ``buffers[name]``,
    of the smaller layout, in its leading corner. A new dict; ``buffers`` is not changed."""
    result = {}
    for name, (shape, _) in layout(n_categories, n_actions, n_factors, config).items():
        old = buffers[name]
        new = old.new_zeros(shape)  # the buffer's own dtype and device (a memory may have been moved)
        new[tuple(slice(0, size) for size in old.shape)] = old
        result[name] = new
    return result


_RETIRED = ("category_accuracy",)  # a buffer of the first following design (f4d9d81..2e861dc), nothing reads it


def is_current(buffers: dict[str, Any]) -> bool:
    """The saved buffers already have this layout (every name, per-prototype ranks)."""
    centroids = buffers.get("centroids")
    return all(name in buffers for name in BUFFERS) and isinstance(centroids, Tensor) and centroids.dim() == 4


def upgrade(buffers: dict[str, Any], config: JudgmentConfig) -> dict[str, Any]:
    """The buffers of a version-1 or -2 state (``name -> tensor``, no prefix) in this layout; a new dict.

    A version-2 state (gae before ``learning='lvq'``) gains the four lvq buffers empty, as a
    gated memory keeps them (a gated state into an lvq memory: the mode check names it).

    One prototype's (C, A, K) / (C, A) buffers gain their slot dimension, and ``wins``, which
    one prototype did not have, is added empty. The adaptive buffers are added empty to the
    state of a seed memory, as this layout keeps them. An adaptive state of an earlier format
    gains what that format lacked at its neutral value: tracking prototypes equal to the
    prototypes with no lead, no run in progress, no prototype following a change (the first
    following design's per-category flag and accuracies are dropped: a follow-up in progress
    ends, the seed rule goes on); the change test's statistic and evidence, which every format
    kept, carry on. The core buffers (``centroids``, ``initialized``, ``counts``,
    ``num_decisions``) are never made up, and a state of a layout this does not know is left
    as it is, for the load to refuse by name.
    """
    out = dict(buffers)
    centroids = out.get("centroids")
    if isinstance(centroids, Tensor) and "trust_weights" not in out:
        out["trust_weights"] = torch.zeros(0, 0)  # version 3 and before had no judges
    if not isinstance(centroids, Tensor) or centroids.dim() not in (3, 4) or is_current(out):
        return out
    for name in _RETIRED:
        out.pop(name, None)
    following = out.get("following")
    if isinstance(following, Tensor) and following.dim() == 1:  # per category: the first following design
        del out["following"]
    if centroids.dim() == 3:  # version 1 with prototypes=1: no slot dimension on the per-prototype buffers
        for name, (shape, _) in layout(1, 1, 1, config).items():
            if len(shape) >= 3 and isinstance(out.get(name), Tensor):
                out[name] = out[name].unsqueeze(2)
    n_categories, n_actions, n_slots, n_factors = out["centroids"].shape
    saved_adaptive = "shadow_centroids" in out
    sizes = layout(n_categories, n_actions, n_factors, config.replace(
        prototypes=n_slots, drift_mode="adaptive" if saved_adaptive else "seed", learning="gated"))
    if "wins" not in out and n_slots == 1:
        out["wins"] = torch.zeros(sizes["wins"][0])
    if saved_adaptive or not config.adaptive:  # (a seed state into an adaptive memory: the mode check names it)
        for name in _ADAPTIVE:
            if name not in out:
                shape, dtype = sizes[name]
                out[name] = out["centroids"].clone() if name == "tracking_centroids" and saved_adaptive \
                    else torch.zeros(shape, dtype=dtype)
    if "recent_errors" not in out and isinstance(out.get("input_counts"), Tensor):  # version 4
        out.update(_pooled(out["input_counts"], out["input_means"], out["input_variances"]))
    for name in _LVQ:  # no state before version 3 learned with lvq
        if name not in out:
            shape, dtype = sizes[name]
            out[name] = torch.zeros(shape, dtype=dtype)
    return out


def _pooled(counts: Tensor, means: Tensor, variances: Tensor) -> dict[str, Tensor]:
    """What a version-4 state lacks, from its categories' running statistics: ``recent_errors``
    at 0, and the running count, mean and (population) variance of each criterion over all the
    categories' decisions (the law of total variance, in float64), empty where ``counts`` is."""
    if not counts.numel():
        return {"recent_errors": torch.zeros(0), "factor_counts": torch.zeros(0, dtype=torch.int64),
                "factor_means": torch.zeros(0, 0), "factor_variances": torch.zeros(0, 0)}
    n = counts.double()[:, None]
    total = n.sum()
    mean = (n * means.double()).sum(0) / total.clamp(min=1.0)
    variance = (n * (variances.double() + (means.double() - mean) ** 2)).sum(0) / total.clamp(min=1.0)
    return {"recent_errors": torch.zeros(counts.shape[0]), "factor_counts": counts.sum().reshape(1),
            "factor_means": mean.float()[None], "factor_variances": variance.float()[None]}


def upgrade_state_dict(state_dict: dict[str, Any], prefix: str, config: JudgmentConfig,
                       version: int | None = None) -> None:
    """In place: the memory's entries of ``state_dict`` (under ``prefix``) in this layout
    (:func:`upgrade`), its decision log's base state too. Nothing happens to a state saved in
    this layout (``version``, torch's ``_metadata`` record of ``JudgmentMemory._version``, is
    ``VERSION``; without it, by the state's own layout), so a partial ``strict=False`` load
    of a current state keeps what it does not name."""
    if version is not None and version >= VERSION:
        return
    own = {name: state_dict[prefix + name] for name in (*BUFFERS, *_RETIRED) if prefix + name in state_dict}
    extra = state_dict.get(prefix + "_extra_state")
    log = extra.get("decision_log") if isinstance(extra, dict) else None
    base = log.get("base") if isinstance(log, dict) else None
    if is_current(own) and (not base or is_current(base)):
        return
    upgraded = upgrade(own, config)
    for name in own.keys() - upgraded.keys():
        del state_dict[prefix + name]
    for name, tensor in upgraded.items():
        state_dict[prefix + name] = tensor
    if base and isinstance(extra, dict) and isinstance(log, dict):
        state_dict[prefix + "_extra_state"] = {**extra, "decision_log": {**log, "base": upgrade(base, config)}}
