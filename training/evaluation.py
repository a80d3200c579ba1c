"""The head-to-head protocol: contestants, one prequential run per (contestant, stream seed), figures.

Every contestant sees the same stream and scores each decision strictly before it learns it
(``prequential_`` in batches, exactly a loop of single decisions). The protocol and the
reason for every choice is written down in ``docs/protocol.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from gae import JudgmentConfig, JudgmentMemory, KNNMemory, RetrievalMemory
from gae.traces.writer import TraceWriter
from training.metrics_functional import calibration_error, correctness, rolling_accuracy
from training.streams import BaseDecisionStream, DecisionStream
from training.streams_sklearn import SklearnDecisionStream

WINDOW = 50  # rolling accuracy window of the original design
RECOVERY_AFTER = 150  # the original claim's "N=1,150" is 150 decisions after its drift at 1,000
BATCH = 50  # decisions per prequential call (and per attention step); results do not depend on it


@dataclass(frozen=True)
class Contestant:
    """One memory configuration in the head-to-head.

    Attributes:
        label: how tables and plots name it.
        kind: ``'judgment'``, ``'knn'``, ``'knn_adwin'`` (k-NN whose window ADWIN cuts,
            :class:`training.knn_adwin.ADWINKNNMemory`) or ``'retrieval'``.
        options: keyword arguments of the memory's constructor; for a judgment memory, its whole
            :class:`~gae.JudgmentConfig` as a dict (:func:`judgment`), so the report lists every option.
            Empty for a contestant in :data:`TUNED`, whose options are chosen per setting.
        learn_attention: train the criterion attention online (Adam on the prequential loss).
        skip_uncertain: pass the stream's uncertain-outcome flags on (False learns from them).
    """

    label: str
    kind: Literal["judgment", "knn", "knn_adwin", "retrieval"]
    options: dict[str, Any] = field(default_factory=dict)
    learn_attention: bool = False
    skip_uncertain: bool = True


def judgment(**overrides: Any) -> dict[str, Any]:
    """The options of a judgment contestant: the seed config with ``overrides``, every option named."""
    return JudgmentConfig.seed().replace(**overrides).to_dict()


CONTESTANTS: dict[str, Contestant] = {
    # the original design's rule, JudgmentConfig.seed(), and its modes
    "jm": Contestant("JudgmentMemory, seed rule (JudgmentConfig.seed())", "judgment", judgment()),
    "jm_attention": Contestant("JudgmentMemory, seed rule, attention learned", "judgment", judgment(),
                               learn_attention=True),
    "jm_adaptive": Contestant("JudgmentMemory, seed rule, drift_mode='adaptive'", "judgment",
                              judgment(drift_mode="adaptive")),
    "jm_prototypes": Contestant("JudgmentMemory, seed rule, prototypes=4", "judgment", judgment(prototypes=4)),
    # the default of JudgmentMemory, gae.river and gae.sklearn (docs/lvq.md, docs/judges.md)
    "jm_recommended": Contestant("JudgmentMemory, JudgmentConfig.recommended(), the default (learning='lvq', 4 judges)",
                                 "judgment", JudgmentConfig.recommended().to_dict()),
    # the original design's baseline as its pseudocode defines it (cap = 200), and its fair variant
    "knn": Contestant("KNNMemory (k=5, cap 200, flat)", "knn", {"k": 5, "capacity": 200}),
    "knn_scoped": Contestant("KNNMemory (k=5, cap 200) scoped by category", "knn",
                             {"k": 5, "capacity": 200, "scoped": True}),
    # the strongest k-NN: capacity, k and scope chosen per setting on the tuning seeds (training/tuning.py)
    "knn_best": Contestant("k-NN, capacity, k and scope tuned per setting", "knn"),
    "knn_adwin": Contestant("k-NN + ADWIN window cut, tuned per setting", "knn_adwin"),
    "retrieval": Contestant("RetrievalMemory (recency-weighted score, cap 400, scoped)", "retrieval",
                            {"k": 5, "capacity": 400, "scoped": True}),
}
# the contestants whose options are chosen per setting on the tuning seeds, and the kind of grid they come from
TUNED: dict[str, str] = {"knn_best": "knn", "knn_adwin": "knn_adwin"}
# the grid they are chosen from: every capacity and k, flat and scoped (issue 20's sensitivity table)
KNN_CAPACITIES = (50, 100, 200, 400, 800, 1600)
KNN_KS = (1, 3, 5, 10)


def grid_name(kind: str, capacity: int, k: int, scoped: bool) -> str:
    """The name of one point of a k-NN grid, e.g. ``knn_scoped_c200_k5``."""
    return f"{kind}_{'scoped' if scoped else 'flat'}_c{capacity}_k{k}"


def knn_grid(kind: str) -> dict[str, Contestant]:
    """Every point of the k-NN grid of one kind (``'knn'`` or ``'knn_adwin'``), by :func:`grid_name`."""
    return {grid_name(kind, capacity, k, scoped): Contestant(grid_name(kind, capacity, k, scoped), kind,  # type: ignore[arg-type]
                                                             {"k": k, "capacity": capacity, "scoped": scoped})
            for scoped in (False, True) for capacity in KNN_CAPACITIES for k in KNN_KS}


GRID: dict[str, Contestant] = {name: c for kind in sorted(set(TUNED.values())) for name, c in knn_grid(kind).items()}
# the adaptive mode's real shadow rate: its "shadow rule alone" comparator uses it, not a stand-in
SHADOW_ETA = JudgmentConfig.seed().drift.shadow_eta
# variants of JudgmentMemory that exist only to be ablated against "jm"
VARIANTS: dict[str, Contestant] = {
    "jm_no_gate": Contestant("JudgmentMemory, seed rule, drift gate off", "judgment", judgment(gate_damping=1.0)),
    "jm_equal_eta": Contestant("JudgmentMemory, seed rule, equal rates 0.05/0.05", "judgment",
                               judgment(eta_override=0.05)),
    "jm_learn_uncertain": Contestant("JudgmentMemory, seed rule, learns uncertain outcomes", "judgment", judgment(),
                                     skip_uncertain=False),
    # the adaptive mode's shadow rule on its own: fast and ungated, with no change test in front of it
    "jm_fast": Contestant(f"JudgmentMemory, seed rule, ungated shadow rule (eta {SHADOW_ETA:g}, gate off)", "judgment",
                          judgment(eta_confirmed=SHADOW_ETA, eta_override=SHADOW_ETA, gate_damping=1.0)),
}
# (name, with, without): each ablation is the paired difference with - without
ABLATIONS: list[tuple[str, str, str]] = [
    ("judgment memory present vs removed (falls back to k-NN)", "jm", "knn"),
    ("drift gate on vs off", "jm", "jm_no_gate"),
    ("eta differential 0.05/0.01 vs equal 0.05", "jm", "jm_equal_eta"),
    ("attention learned vs fixed", "jm_attention", "jm"),
    ("uncertain outcomes skipped vs learned", "jm", "jm_learn_uncertain"),
    ("drift-aware (adaptive) vs seed rule", "jm_adaptive", "jm"),
    (f"change test vs its shadow rule alone (ungated, eta {SHADOW_ETA:g})", "jm_adaptive", "jm_fast"),
    ("four prototypes per action vs one", "jm_prototypes", "jm"),
    ("recommended (learning='lvq') vs the seed rule", "jm_recommended", "jm"),
]
# The stream of the original head-to-head; the drift kind is the one thing that varies by setting.
STREAM: dict[str, Any] = {"n_decisions": 2000, "categories": 4, "actions": 4, "factors": 8, "informative": 4,
                          "factor_noise": 0.1, "label_noise": 0.1, "uncertain": 0.05, "drift_at": 1000}
SETTINGS: dict[str, dict[str, Any]] = {
    "permute": {"drift_kind": "permute"},
    "shift": {"drift_kind": "shift", "drift_shift": 0.3},
    "gradual": {"drift_kind": "permute", "drift_duration": 500},  # the permutation, blended over 500 decisions
    "none": {"drift_at": None},
    "outliers": {"drift_at": None, "outliers": 0.05},  # no drift; 5% far points with random actions
    "multimodal": {"drift_at": None, "modes": 3},  # no drift; every action has 3 clusters per category
    # scikit-learn's generators (and a rotating boundary), 4 categories (one independent draw each);
    # "permute": the ground truth's labels shift cyclically at the middle of the stream (training.streams_sklearn)
    "classification": {"sklearn": "classification", "categories": 4},  # 3 clusters per class
}
_SKLEARN: dict[str, dict[str, Any]] = {  # each also as "<name>_permute", its labels permuted at the middle
    "classification_1": {"sklearn": "classification", "n_clusters_per_class": 1},  # one mode per action
    "classification_2": {"sklearn": "classification", "n_clusters_per_class": 2},
    "moons": {"sklearn": "moons"},  # two interleaved half-moons: a curved boundary
    "circles": {"sklearn": "circles"},  # a ring around a disc: no prototype describes the ring
    "rotating": {"sklearn": "rotating"},  # a linear boundary turning all along (training/streams_rotating.py)
}
for _name, _options in _SKLEARN.items():
    SETTINGS[_name] = {**_options, "categories": 4}
    SETTINGS[f"{_name}_permute"] = {**_options, "categories": 4, "permute": True}
# the settings in which the original page's claims are judged (both have a drift at the middle)
CLAIM_SETTINGS = ("permute", "shift")
# RetrievalMemory costs ~1 ms a decision (200x the others): it runs in the two original drift settings only
SLOW_CONTESTANTS: dict[str, tuple[str, ...]] = {"retrieval": ("permute", "shift")}


def traceable(name: str) -> bool:
    """Whether a contestant's run can be traced and replayed: not a grid point (those only tune),
    and not a k-NN with ADWIN, whose detector is not part of the memory's saved state."""
    return name not in GRID and (name not in CONTESTANTS or CONTESTANTS[name].kind != "knn_adwin")


def runs_in(name: str, setting: str) -> bool:
    """Whether a contestant is part of a setting's roster."""
    return setting in SLOW_CONTESTANTS.get(name, (setting,))


def make_stream(setting: str, seed: int, n_decisions: int | None = None) -> BaseDecisionStream:
    """The protocol's stream for a setting and seed (any drift starts at the middle of the stream)."""
    if "sklearn" in SETTINGS[setting]:
        n = n_decisions or STREAM["n_decisions"]
        options = {key: value for key, value in SETTINGS[setting].items() if key not in ("sklearn", "permute")}
        return SklearnDecisionStream(n, generator=SETTINGS[setting]["sklearn"], label_noise=STREAM["label_noise"],
                                     uncertain=STREAM["uncertain"], seed=seed,
                                     permute_at=middle(n) if SETTINGS[setting].get("permute") else None, **options)
    spec = {**STREAM, **SETTINGS[setting], "seed": seed}
    if n_decisions is not None:
        spec["n_decisions"] = n_decisions
        if spec["drift_at"] is not None:
            spec["drift_at"] = middle(n_decisions)
            spec["drift_duration"] = min(spec.get("drift_duration", 0), n_decisions // 4)
    return DecisionStream(**spec)


def middle(n_decisions: int) -> int:
    """The decision at which a setting's drift (or permutation) starts, and "before" ends: the middle."""
    return n_decisions // 2


def has_ceiling(setting: str) -> bool:
    """Whether the setting's streams know their true prototypes (the synthetic ones do)."""
    return "sklearn" not in SETTINGS[setting]


def ceiling(stream: BaseDecisionStream) -> dict[str, Any]:
    """The accuracy ceiling of a stream: each decision given to the action of the nearest
    ground-truth prototype (cluster) in force (the Bayes rule for isotropic noise, equal priors and
    one mode per action; close to it with several), in the format of :func:`run`.

    No memory can know the true prototypes; what separates a memory from this is what it still
    has to learn. Outliers are scored like any decision (they are unpredictable).
    """
    if not isinstance(stream, DecisionStream):
        raise TypeError(f"the ceiling needs a stream that knows its true prototypes (DecisionStream), "
                        f"got {type(stream).__name__}")
    data = stream.tensors()
    action = ((data.x[:, None, :] - stream.prototypes_in_force()) ** 2).sum(-1).argmin(-1) // stream.modes
    return {"action": action.numpy(), "confidence": np.ones(len(stream), dtype=np.float32),
            "correct": correctness(action, data.truth).numpy(), "latency_us": np.zeros(1),
            "promotions": np.zeros(0, dtype=np.int64), "state_bytes": 0}


def build(contestant: Contestant, stream: BaseDecisionStream) -> JudgmentMemory | KNNMemory | RetrievalMemory:
    tuned = [name for name in TUNED if contestant == CONTESTANTS[name]]  # as declared: no options chosen
    if tuned:
        raise ValueError(f"{tuned[0]} is tuned per setting: it runs with the options chosen for its setting "
                         "(run_stream's tuned=), not as declared")
    names = stream.category_names, stream.action_names, stream.factor_names
    if contestant.kind == "judgment":
        return JudgmentMemory(*names, JudgmentConfig.from_dict(contestant.options))
    if contestant.kind == "retrieval":
        return RetrievalMemory(factors=names[2], actions=names[1], categories=names[0], **contestant.options)
    if contestant.kind == "knn_adwin":
        from training.knn_adwin import ADWINKNNMemory  # needs river, an optional dependency

        return ADWINKNNMemory(factors=names[2], actions=names[1], categories=names[0], **contestant.options)
    return KNNMemory(factors=names[2], actions=names[1], categories=names[0], **contestant.options)


def learn_batch(memory: Any, x: torch.Tensor, category: torch.Tensor, action: torch.Tensor,
                skip: torch.Tensor | None, optimizer: torch.optim.Optimizer | None = None,
                writer: TraceWriter | None = None) -> Any:
    """One prequential call (through ``writer``, which traces it, when given), then (with an
    optimizer, for a JudgmentMemory) one attention step on its loss; returns the
    :class:`~gae.types.StreamStep`."""
    step = (memory if writer is None else writer).prequential_(x, category, action, skip=skip)
    if optimizer is not None and isinstance(memory, JudgmentMemory):
        loss = memory.attention_loss(step, category, action, skip)
        if loss is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return step


def state_bytes(memory: torch.nn.Module) -> int:
    """Bytes of the memory's parameters and buffers: what it holds to score and learn (its event
    logs, kept for audit in the extra state, are not counted)."""
    return sum(t.numel() * t.element_size() for t in [*memory.parameters(), *memory.buffers()])


class TraceSpec(NamedTuple):
    """Where a run's evaluation trace goes (see :mod:`gae.traces.writer`): the JSONL ``file`` (appended
    to), the ``run`` name on its lines and the ``checkpoint`` of the memory it starts from."""

    file: str
    run: str
    checkpoint: str


def run(contestant: Contestant, stream: BaseDecisionStream, lr: float = 0.05,
        trace: TraceSpec | None = None) -> dict[str, Any]:
    """One prequential pass; returns per-decision ``action``, ``confidence``, ``correct``, the
    per-batch wall time per decision (``latency_us``: scoring, learning, any attention step and,
    with ``trace``, writing the trace), the decisions after which the change test promoted a category
    (``promotions``), the size of the memory's state at the end (``state_bytes``, see
    :func:`state_bytes`) and the wall time of the whole pass (``seconds``)."""
    memory = build(contestant, stream)
    optimizer = torch.optim.Adam(memory.parameters(), lr=lr) if contestant.learn_attention else None
    writer = None if trace is None else TraceWriter(trace.file, memory, run=trace.run, checkpoint=trace.checkpoint)
    actions, confidences, latencies = [], [], []
    started = time.perf_counter()
    try:
        for start in range(0, len(stream), BATCH):
            batch = stream.batch(start, start + BATCH)
            skip = batch.skip if contestant.skip_uncertain else None
            began = time.perf_counter()
            step = learn_batch(memory, batch.x, batch.category, batch.action, skip, optimizer, writer)
            latencies.append((time.perf_counter() - began) * 1e6 / len(batch.x))
            actions.append(step.output.action)
            confidences.append(step.output.confidence)
    finally:  # the lines of a run that failed are written too, up to the failure
        if writer is not None:
            writer.close()
    seconds = time.perf_counter() - started
    action, confidence = torch.cat(actions), torch.cat(confidences)
    truth = stream.tensors().truth
    promotions = memory.promotion_log.step if isinstance(memory, JudgmentMemory) else torch.zeros(0)
    return {"action": action.numpy(), "confidence": confidence.numpy(),
            "correct": correctness(action, truth).numpy(), "latency_us": np.asarray(latencies),
            "promotions": promotions.numpy().astype(np.int64), "state_bytes": state_bytes(memory),
            "seconds": seconds}


def figures(result: dict[str, Any], drift_at: int) -> dict[str, Any]:
    """The protocol's figures of one run (abstentions count as wrong)."""
    correct = result["correct"].astype(np.float64)
    rolling = rolling_accuracy(torch.from_numpy(result["correct"]), WINDOW).numpy()
    return {
        "rolling": rolling,
        "cumulative": float(correct.mean()),
        "mean_rolling": float(rolling.mean()),
        "before_drift": float(correct[:drift_at].mean()),
        "after_drift": float(correct[drift_at:].mean()),
        "at_recovery_point": float(rolling[min(drift_at + RECOVERY_AFTER, len(rolling)) - 1]),
        "ece": float(calibration_error(torch.from_numpy(result["confidence"]).double(),
                                       torch.from_numpy(result["correct"]))),
        "latency_us": float(np.median(result["latency_us"])),
        "promotions_before": float((result["promotions"] < drift_at).sum()),
        "promotions_after": float((result["promotions"] >= drift_at).sum()),
        "state_bytes": float(result["state_bytes"]),
    }


def run_stream(setting: str, seed: int, n_decisions: int, names: list[str], trace_dir: str | None = None,
               tuned: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The figures of every named contestant (or variant, grid point of :data:`GRID`, or
    ``'ceiling'``) on one stream.

    One task of the head-to-head: a process pool runs these in parallel, one stream each.
    ``tuned`` gives the options chosen for this setting of each contestant in :data:`TUNED`
    that is named. A grid point returns only its cumulative accuracy and its accuracy
    :data:`RECOVERY_AFTER` decisions after the middle (what the tuning and the sensitivity table
    need). With ``trace_dir``, every memory's run is traced to ``{setting}-{seed}-{name}.jsonl``
    there, from the state saved in ``{setting}-{seed}-{name}.pt``.
    """
    torch.set_num_threads(1)  # the memories' work is tiny: thread hand-offs would cost more than they save
    stream = make_stream(setting, seed, n_decisions)
    drift_at = middle(n_decisions)
    roster = {**CONTESTANTS, **VARIANTS, **GRID}
    for name, options in (tuned or {}).items():
        roster[name] = replace(roster[name], options=options)
    results = {}
    for name in names:
        if name == "ceiling":
            results[name] = figures(ceiling(stream), drift_at)
            continue
        trace = None
        if trace_dir is not None and traceable(name):
            stem = f"{trace_dir}/{setting}-{seed}-{name}"
            trace = TraceSpec(f"{stem}.jsonl", f"{setting}/{seed}/{name}", f"{stem}.pt")
        result = run(roster[name], stream, trace=trace)
        if name in GRID:
            result = figures(result, drift_at)
            results[name] = {key: result[key] for key in ("cumulative", "at_recovery_point")}
        else:
            results[name] = {**figures(result, drift_at), "seconds": result["seconds"]}
    return results
