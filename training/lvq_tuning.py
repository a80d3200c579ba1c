"""How ``JudgmentConfig.recommended()``'s constants were chosen: the tuning streams and the neighbourhood.

The recommended configuration (``learning='lvq'``, docs/lvq.md) was chosen on *tuning* streams that
no reported figure uses: river's generators on seeds 0-2 (the public benchmark reports seeds
200-202), the real data sets shuffled with seed 0 (there is no other copy of them: their samples
are in both, the benchmark's in another order), and gae's head-to-head settings on seeds 0-4 (the
head-to-head reports seeds 100-119). Each candidate runs on all of them; :func:`neighbourhood` is
the chosen configuration and, one constant at a time, its neighbours, so a rerun shows that the
choice sits on a plateau, not a spike. ``scripts/tune_lvq.py`` runs it and writes the table into
docs/lvq.md.
"""

from __future__ import annotations

from typing import Any

import torch

from gae import JudgmentConfig, JudgmentMemory
from training.evaluation import make_stream, middle

RIVER_SEEDS = (0, 1, 2)  # generator seeds of the tuning streams (the benchmark reports 200-202)
GAE_SEEDS = (0, 1, 2, 3, 4)  # the head-to-head's tuning seeds are 0-19; these are its first five
N_RIVER = 5000  # samples per river stream, as the benchmark
N_GAE = 2000  # decisions per gae setting, as the head-to-head
GAE_SETTINGS = ("permute", "shift", "gradual", "none", "outliers", "multimodal", "classification", "moons",
                "circles", "rotating", "moons_permute", "classification_1_permute", "classification_2",
                "rotating_permute")
RECOVERY = (100, 200)  # decisions after the middle over which the recovery accuracy is taken
# the neighbours of each constant (one at a time, the others at their chosen values)
NEIGHBOURS: dict[str, tuple[Any, ...]] = {
    "prototypes": (16, 64), "units": ("criterion", "category"), "rate_floor": (0.05, 0.2), "push_rate": (0.0, 1.0),
    "relevance_rate": (0.0, 0.1), "miss_penalty": (0.0, 0.35, 0.75), "spawn_threshold": (0.2, 0.8),
    "spawn_support": (0.5, 1.5), "win_decay": (0.005, 0.02), "rate_per_error": (0.0, 0.5),
    "error_decay": (0.01, 0.05)}


# the judges' neighbours: each judge's own option moved (the others as chosen), then the trust's options
JUDGE_NEIGHBOURS: dict[str, dict[str, tuple[Any, ...]]] = {
    "lda_short": {"rate_floor": (0.01, 0.06)}, "lda": {"shrinkage": (0.05, 0.5), "refresh": (8,)},
    "gauss_short": {"rate_floor": (0.02, 0.1)}, "bins": {"bins": (8, 32), "reach": (1.5, 3.0), "prior": (0.25, 1.0)}}
# judges the recommended configuration does not hold, each added to it (the long Gaussian naive Bayes geometry, which
# the recommended set held before the bins judge)
OTHER_JUDGES: dict[str, dict[str, Any]] = {"gauss": {"kind": "gauss"}}
TRUST_NEIGHBOURS: dict[str, tuple[Any, ...]] = {"trust_rate": (0.25, 1.0), "trust_share": (0.005, 0.05),
                                                "trust_floor": (0.02, 0.2)}


def neighbourhood() -> dict[str, dict[str, Any]]:
    """``name -> options changed from the recommended``: ``'chosen'`` (none), then ``'<option>=<value>'``;
    for the judges (docs/judges.md) ``'judges=none'`` (the prototypes alone), ``'without <judge>'``,
    ``'with <judge>'`` (:data:`OTHER_JUDGES`) and ``'<judge>.<option>=<value>'``."""
    candidates: dict[str, dict[str, Any]] = {"chosen": {}}
    for option, values in {**NEIGHBOURS, **TRUST_NEIGHBOURS}.items():
        for value in values:
            candidates[f"{option}={value}"] = {option: value}
    chosen = JudgmentConfig.recommended().to_dict()["judges"]
    candidates["judges=none"] = {"judges": {}}
    for name in chosen:
        candidates[f"without {name}"] = {"judges": {other: spec for other, spec in chosen.items() if other != name}}
    for name, spec in OTHER_JUDGES.items():
        candidates[f"with {name}"] = {"judges": {**chosen, name: spec}}
    for name, options in JUDGE_NEIGHBOURS.items():
        for option, values in options.items():
            for value in values:
                candidates[f"{name}.{option}={value}"] = {"judges": {**chosen, name: {**chosen[name], option: value}}}
    return candidates


def streams() -> list[tuple[str, str, int]]:
    """Every tuning run as ``(family, stream, seed)``: river's streams of the benchmark (a real data
    set once) and gae's settings."""
    from training import river_suite as suite

    river = [("river", s, seed) for s in suite.STREAMS if suite.STREAMS[s].kind != "gae"
             for seed in suite.seeds_of(s, list(RIVER_SEEDS))]
    return river + [("gae", s, seed) for s in GAE_SETTINGS for seed in GAE_SEEDS]


def run(options: dict[str, Any], family: str, stream: str, seed: int) -> dict[str, float]:
    """One candidate (the options it changes) on one tuning stream: ``accuracy`` (%) and, on a gae
    setting, ``recovery`` (%): the accuracy over decisions :data:`RECOVERY` after the middle."""
    torch.set_num_threads(1)
    config = JudgmentConfig.recommended().replace(max_log_events=0, **options)
    if family == "river":
        from river import evaluate, metrics

        from gae.river import JudgmentClassifier
        from training import river_suite as suite

        model = JudgmentClassifier(**config.to_dict())  # no scaler: its answers are the same in any units
        score = evaluate.progressive_val_score(suite.samples(stream, seed, N_RIVER, "river", shuffled=True), model,
                                               metrics.Accuracy())
        return {"accuracy": 100 * score.get()}
    source = make_stream(stream, seed, N_GAE)
    data = source.tensors()
    memory = JudgmentMemory(source.category_names, source.action_names, source.factor_names, config)
    step = memory.prequential_(data.x, data.category, data.action, skip=data.skip)
    correct = (step.output.action == data.truth).float()  # as the head-to-head scores: against the ground truth
    start = middle(N_GAE)
    return {"accuracy": 100 * float(correct.mean()),
            "recovery": 100 * float(correct[start + RECOVERY[0]:start + RECOVERY[1]].mean())}


def summarize(results: dict[str, dict[tuple[str, str, int], dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per candidate: the mean accuracy over river's tuning streams (each stream its seeds' mean
    first) and over gae's settings, and the mean recovery accuracy over the settings whose labels
    or prototypes change at the middle."""
    from training.bars import drift_kind

    table: dict[str, dict[str, Any]] = {}
    for name, by_task in results.items():
        per: dict[tuple[str, str], list[dict[str, float]]] = {}
        for (family, stream, _), figures in by_task.items():
            per.setdefault((family, stream), []).append(figures)
        means = {key: {k: sum(f[k] for f in runs) / len(runs) for k in runs[0]} for key, runs in per.items()}
        river = [m["accuracy"] for (family, _), m in means.items() if family == "river"]
        gae = [m["accuracy"] for (family, _), m in means.items() if family == "gae"]
        changing = [m["recovery"] for (family, s), m in means.items()
                    if family == "gae" and drift_kind(s) in ("permute", "shift")]
        table[name] = {"river": sum(river) / len(river), "gae": sum(gae) / len(gae),
                       "recovery": sum(changing) / len(changing),
                       "streams": {f"{family}:{s}": m["accuracy"] for (family, s), m in means.items()}}
    return table
