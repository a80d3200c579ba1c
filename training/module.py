"""The Lightning loop: stream decisions through the memories, score before learning, log everything.

Each training step is one prequential pass over a batch of the stream (``prequential_``):
every decision is scored with the state left by the decisions before it, the metrics are
updated from those pre-learning predictions, and the memories then learn. The loss the
optimizer sees is the cross-entropy of the prequential logits with respect to the criterion
attention only; prototypes are buffers, learned online, never by gradient.

Under DDP (``strategy='ddp'``, any number of processes, Gloo or NCCL) each rank serves its
own part of the stream (:class:`~training.data.StreamLoader`: rank r of W serves batches r,
r + W, ...), and each step first gathers the parts of every rank in rank order
(:func:`~training.batch.gather_decisions`). Every rank then runs the same exact loop over
that global batch, so the memories, the metrics and the attention loss are the same on every
rank and equal those of one process reading the stream in batches W times larger. The
attention gradient is therefore identical on every rank already: DDP is told to share rank
0's instead of averaging (:func:`training.distributed.broadcast_gradients_hook`), which keeps it
exact for any world size. Whether a process group exists is decided at each step, never at
construction. docs/scaling.md has the commands, the costs and the limits.

A batch lands whole or not at all. ``JudgmentMemory.prequential_`` learns on private copies
of its state and writes them back only after the whole batch is done, and a step advances
``stream_position`` only after both memories have learned it; Lightning writes checkpoints
between steps, from the process that learns. So a checkpoint holds the state after a whole
number of batches, and a run killed at any moment (even SIGKILL) resumes from its last
checkpoint to the same end state as an uninterrupted run.

In TensorBoard the memories are compared on shared charts: at its first logged step the module
writes a Custom Scalars layout with one chart per metric that every memory logs (``acc/rolling``
holds ``acc/rolling_jm`` and ``acc/rolling_knn``, and so on), and, when the data module's stream
drifts, a ``drift/marker`` scalar (0 before the drift, 1 after) drawn on every one of those
charts; :mod:`training.tensorboard_layout` derives the charts and the marker.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from gae.traces.writer import TraceWriter
from gae.types import StreamStep
from gae.validation import Names
from training import metrics as M
from training import tensorboard_layout as board
from training.batch import DecisionBatch, gather_decisions
from training.distributed import broadcast_gradients_hook
from training.plots import attention_heatmap

GATE_LOG_ROWS = 100  # the gate log text shows the most recent events; the count says how many in all


def saved_config(extra: Mapping[str, Any], hparams: Mapping[str, Any]) -> JudgmentConfig:
    """The config a saved memory was built with: its own record (``extra``, the memory's extra
    state), the module's hparams (``judgment``), or, in a checkpoint written before the config
    existed, the options the hparams and the memory's state named one by one."""
    if isinstance(extra.get("config"), Mapping):
        return JudgmentConfig.from_dict(extra["config"])
    if isinstance(hparams.get("judgment"), Mapping):
        return JudgmentConfig.from_dict(hparams["judgment"])
    options = {key: hparams[key] for key in JudgmentConfig.options() if key in hparams}
    options.setdefault("drift_mode", extra.get("drift_mode", "seed"))
    options.setdefault("prototypes", extra.get("prototypes", 1))
    return JudgmentConfig.from_dict(options)


class DecisionMemoryModule(L.LightningModule):
    """A :class:`~gae.JudgmentMemory` (and optionally a :class:`~gae.KNNMemory`) on a decision stream.

    Args:
        categories, actions, factors: counts or names (linked from the data module by the CLI).
        judgment: the memory's :class:`~gae.JudgmentConfig` (every option of its rule, its modes
            and its decision log; in YAML ``model.judgment.drift_mode: adaptive`` and so on).
            Default: :meth:`JudgmentConfig.seed`, the original design.
        learn_attention: train ``criterion_logits`` by gradient; False keeps the original
            design's plain Euclidean distance (no optimizer at all). Default: True.
        lr: Adam learning rate of the attention. Default: 0.05.
        knn: also feed a :class:`~gae.KNNMemory` the same stream, for the head-to-head. Default: True.
        knn_k, knn_capacity, knn_scoped: the baseline's settings. Default: 5, 400, False.
        rolling_window: decisions in the rolling accuracy. Default: 50.
        curve_points_per_batch: rolling-accuracy points logged per batch against the decision
            index (a per-decision curve on short streams, a thinned one on long ones). Default: 10.
        figure_every_n_steps: how often the attention heatmap, per-criterion scalars and
            prototype histograms are written. Default: 20.
        trace: write the evaluation trace of both memories to this JSONL file (see
            ``gae/traces/writer.py`` and docs/trace.md; runs ``jm`` and ``knn``), with the state each
            writer started from in ``<trace>.<run>-<stream position>.pt`` for
            ``scripts/replay_trace.py``. Rank 0 writes it. Default: None (no trace).

    TensorBoard (rank 0, when the logger's experiment is a ``SummaryWriter``): every metric of
    :meth:`metric_values` against the decision index, the rolling curve (``curve/rolling_jm``,
    ``curve/rolling_knn``), the attention, prototypes, promotions and the gate log, and, at the
    first logged step of each fit, a Custom Scalars layout (category ``jm vs knn``, or ``jm``
    without the k-NN) with one chart per metric holding every memory's tag. When the data
    module's stream has drift points (its ``drift_at``: a scikit-learn stream's holds its permutation), ``drift/marker``
    is logged at every step the curves are, and at both sides of each drift, and is drawn on
    every chart; it is the fraction of the drift points before the step (0, then 1 after a
    single drift). A fit without a data module, or a stream that never drifts, has no marker.
    """

    def __init__(self, categories: Names = 4, actions: Names = 4, factors: Names = 8, *,
                 judgment: JudgmentConfig | None = None, learn_attention: bool = True, lr: float = 0.05,
                 knn: bool = True, knn_k: int = 5, knn_capacity: int = 400, knn_scoped: bool = False,
                 rolling_window: int = 50, curve_points_per_batch: int = 10, figure_every_n_steps: int = 20,
                 trace: str | None = None) -> None:
        super().__init__()
        if isinstance(judgment, Mapping):  # the hparams of a checkpoint keep the config as a plain dict
            judgment = JudgmentConfig.from_dict(judgment)
        config = JudgmentConfig.seed() if judgment is None else judgment
        if not isinstance(config, JudgmentConfig):
            raise TypeError(f"judgment must be a JudgmentConfig, a dict of its options or None, got {judgment!r}")
        # plain values only, so that a checkpoint loads with torch.load(weights_only=True)
        self.save_hyperparameters(ignore=["judgment"])
        self.save_hyperparameters({**self.hparams, "judgment": config.to_dict()})
        self.memory = JudgmentMemory(categories, actions, factors, config)
        self.memory.criterion_logits.requires_grad_(learn_attention)
        self.knn = KNNMemory(factors, actions, k=knn_k, capacity=knn_capacity, categories=categories,
                             scoped=knn_scoped) if knn else None
        # decisions of the stream already learned: a resumed run skips them, whatever the loader replays
        self.register_buffer("stream_position", torch.zeros((), dtype=torch.int64))
        # every rank feeds its metrics the same global stream, so computing needs no sync
        self.jm_metrics = M.StreamMetrics("jm", rolling_window, sync_on_compute=False)
        self.knn_metrics = M.StreamMetrics("knn", rolling_window, sync_on_compute=False) if knn else None
        self.gate_rate = M.GateRate(sync_on_compute=False)
        self.drift = M.PrototypeDrift(sync_on_compute=False)
        self._curve_points = curve_points_per_batch
        self._figure_every = figure_every_n_steps
        self._tracers: dict[str, TraceWriter] | None = None  # opened at the first step (on a resume too)
        self._drift_points: tuple[int, ...] = ()  # of the data module's stream, read at each fit's start
        self._layout_written = False  # each fit writes the Custom Scalars layout at its first logged step

    stream_position: Tensor

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``, all or nothing across the two memories: each checks
        its sizes and names before it copies a tensor, and if one fails after the other has
        loaded, the previous state is loaded back before the error is raised."""
        before = {key: value.clone() if isinstance(value, Tensor) else copy.deepcopy(value)
                  for key, value in self.state_dict().items()}
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except BaseException:
            super().load_state_dict(before, strict=False)
            raise

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint written before the config existed keeps its options flat in its hparams,
        which ``load_from_checkpoint`` does not pass on: the memory is rebuilt with them (before
        its state is loaded), so it learns on with the rule it was trained with."""
        hparams = checkpoint.get("hyper_parameters", {})
        if "judgment" in hparams:
            return
        extra = checkpoint.get("state_dict", {}).get("memory._extra_state", {})
        config = saved_config(extra if isinstance(extra, Mapping) else {}, hparams)
        if config != self.memory.config:
            trainable = self.memory.criterion_logits.requires_grad
            self.memory = JudgmentMemory(self.memory.category_names, self.memory.action_names,
                                         self.memory.factor_names, config).to(self.memory.centroids.device)
            self.memory.criterion_logits.requires_grad_(trainable)
            self.save_hyperparameters({**self.hparams, "judgment": config.to_dict()})

    def configure_optimizers(self) -> Any:
        if not self.hparams["learn_attention"]:
            return None
        return torch.optim.Adam([self.memory.criterion_logits], lr=self.hparams["lr"])

    def on_fit_start(self) -> None:
        """Read the stream's drift points for the marker; under DDP, share rank 0's attention gradient
        instead of averaging identical ones."""
        self._drift_points = board.drift_points(getattr(getattr(self.trainer, "datamodule", None), "stream", None))
        self._layout_written = False  # a resumed fit may log to a new event file: it gets the layout too
        model = self.trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            return
        if any(hook is broadcast_gradients_hook for hook, _ in getattr(model, "_comm_hooks", [])):
            return  # a second fit on the same wrapped model
        try:
            model.register_comm_hook(state=None, hook=broadcast_gradients_hook)
        except RuntimeError:  # the strategy registered the user's own hook (DDPStrategy(ddp_comm_hook=...))
            rank_zero_warn("DDP already has a communication hook, so the attention gradient (the same on every "
                           "rank) goes through it: the ranks stay identical, but equal a one-process run only "
                           "if that hook returns the gradient unchanged")

    # -- the step -----------------------------------------------------------------------
    def training_step(self, stream_batch: DecisionBatch, batch_idx: int) -> Tensor | None:
        batch = self._unseen(gather_decisions(stream_batch))  # the global batch, on every rank
        if batch is None:
            return None
        before = self.memory.centroids.clone()
        tracers = self._open_traces()
        step = tracers.get("jm", self.memory).prequential_(batch.x, batch.category, batch.action,
                                                            _confirmed(batch.confirmed), batch.skip)
        knn_step = None
        if self.knn is not None:
            knn_step = tracers.get("knn", self.knn).prequential_(batch.x, batch.category, batch.action,
                                                                 skip=batch.skip)
        for tracer in tracers.values():  # each step's lines reach the file: an exception loses none
            tracer.flush()
        # only once both memories have learned the batch: the position never counts a batch a memory lacks
        self.stream_position.fill_(int(batch.position[-1]) + 1)
        self._update_metrics(self.jm_metrics, step, batch)
        self.gate_rate.update(step.events.gated, step.events.applied, step.events.promoted, step.events.recycled)
        # every prototype slot is one prototype to the drift metric: (C, A, P, K) -> (C, A * P, K)
        self.drift.update(before.flatten(1, 2), self.memory.centroids.flatten(1, 2),
                          self.memory.initialized.flatten(1, 2))
        if knn_step is not None and self.knn_metrics is not None:
            self._update_metrics(self.knn_metrics, knn_step, batch)
        self._log_step(batch, int(step.events.promoted.sum()), int(step.events.recycled.sum()))
        return self._attention_loss(step, batch) if self.hparams["learn_attention"] else None

    def _open_traces(self) -> dict[str, Any]:
        """The trace writers (none without ``trace``, or off rank 0), each saving the state it starts from."""
        if self._tracers is None:
            self._tracers = {}
            path = self.hparams.get("trace")
            if path is not None and self.global_rank == 0:
                position = int(self.stream_position)
                memories = {"jm": self.memory, "knn": self.knn}
                self._tracers = {name: TraceWriter(path, memory, run=name, checkpoint=f"{path}.{name}-{position}.pt")
                                 for name, memory in memories.items() if memory is not None}
        return self._tracers

    def on_train_end(self) -> None:
        for tracer in (self._tracers or {}).values():
            tracer.close()
        self._tracers = None
        self._log_final()

    def _unseen(self, batch: DecisionBatch) -> DecisionBatch | None:
        """The part of the batch the memory has not learned yet (all of it, except on a replay)."""
        fresh = batch.position >= self.stream_position
        if bool(fresh.all()):
            return batch
        if not bool(fresh.any()):
            return None
        return DecisionBatch(*(field[fresh] for field in batch))

    @staticmethod
    def _update_metrics(collection: M.StreamMetrics, step: StreamStep, batch: DecisionBatch) -> None:
        collection.update(step.output.action, batch.truth, step.output.confidence)

    def _attention_loss(self, step: StreamStep, batch: DecisionBatch) -> Tensor | None:
        loss = self.memory.attention_loss(step, batch.category, batch.action, batch.skip)
        if loss is not None:
            self.log("loss/attention", loss, prog_bar=False, logger=False, batch_size=len(batch.position))
        return loss  # None (nothing to learn from yet): Lightning skips the optimizer step

    # -- logging --------------------------------------------------------------------------
    def _writer(self) -> Any:
        if self.global_rank != 0:  # every rank holds the same values: one writes them
            return None
        experiment = getattr(self.logger, "experiment", None)
        return experiment if hasattr(experiment, "add_scalar") else None

    def _log_step(self, batch: DecisionBatch, promotions: int = 0, recycles: int = 0) -> None:
        decision = int(self.stream_position)
        scalars = self.metric_values()
        bar = {"acc_jm": scalars["acc/rolling_jm"]}
        if "acc/rolling_knn" in scalars:
            bar["acc_knn"] = scalars["acc/rolling_knn"]
        self.log_dict(bar, prog_bar=True, logger=False, batch_size=len(batch.position))
        writer = self._writer()
        if writer is None:
            return
        for tag, value in scalars.items():
            writer.add_scalar(tag, float(value), decision)
        curve_steps, curve_tags = self._log_rolling_curve(writer, batch)
        self._log_comparison(writer, batch, [*curve_steps, decision], [*scalars, *curve_tags])
        if self.memory.config.adaptive:  # how many categories score with their tracking prototypes, and
            lead = self.memory.tracking_lead.detach().cpu()  # each one's lead (its evidence: above 0, they score)
            writer.add_scalar("gate/tracking_categories", float((lead > 0).sum()), decision)
            for name, value in zip(self.memory.category_names, lead.tolist(), strict=True):
                writer.add_scalar(f"tracking_lead/{name}", value, decision)
        if promotions:
            self._log_promotions(writer, promotions)
        if recycles:
            self._log_recycles(writer, recycles)
        if self.global_step % self._figure_every == 0:
            self._log_figures(writer, decision)
            self._log_explanation(writer, batch, decision)

    def _memory_metrics(self) -> dict[str, M.StreamMetrics]:
        """Each memory's metrics by its short name in the tags: ``jm``, and ``knn`` when the k-NN runs."""
        return {"jm": self.jm_metrics, **({"knn": self.knn_metrics} if self.knn_metrics is not None else {})}

    def _log_rolling_curve(self, writer: Any, batch: DecisionBatch) -> tuple[list[int], list[str]]:
        """Rolling accuracy at evenly spaced decisions of the batch, against the decision index;
        returns the steps and the tags it logged."""
        collections = self._memory_metrics()
        n = len(batch.position)
        stride = max(1, n // max(1, self._curve_points))
        positions = torch.arange(stride - 1, n, stride).tolist()
        steps = [int(batch.position[position]) + 1 for position in positions]
        for name, collection in collections.items():
            curve = collection.rolling_curve()  # (n,) rolling accuracy after each decision of the batch
            for position, step in zip(positions, steps, strict=True):
                writer.add_scalar(f"curve/rolling_{name}", float(curve[position]), step)
        return steps, [f"curve/rolling_{name}" for name in collections]

    def _log_comparison(self, writer: Any, batch: DecisionBatch, steps: list[int], tags: list[str]) -> None:
        """The drift marker at the batch's logged ``steps`` and drift edges, and, once per fit, the
        Custom Scalars layout of the ``tags`` logged (see :mod:`training.tensorboard_layout`)."""
        points = self._drift_points
        if points:
            first, last = int(batch.position[0]) + 1, int(batch.position[-1]) + 1
            for step in board.marker_steps(points, first=first, last=last, steps=steps):
                writer.add_scalar(board.DRIFT_MARKER, board.drift_marker(points, step), step)
        if not self._layout_written and hasattr(writer, "add_custom_scalars"):
            memories = tuple(self._memory_metrics())
            charts = board.compared_charts(tags, memories)
            writer.add_custom_scalars(board.custom_scalars_layout(charts, memories, marker=bool(points)))
            self._layout_written = True

    def _log_promotions(self, writer: Any, count: int) -> None:
        """Each promotion of the latest batch as TensorBoard text at its decision, with its evidence."""
        for r in self.memory.promotion_records(last=count):
            writer.add_text("gate/promotion", f"decision {r['step']}: the prototypes of **{r['category']}** "
                            f"were promoted to their run means (mean shift {r['shift']:.3f}); "
                            f"CUSUM {r['statistic']:.2f} after {r['shadow_right']} decisions closer to the shadows "
                            f"and {r['main_right']} closer to the prototypes", r["step"] + 1)

    def _log_explanation(self, writer: Any, batch: DecisionBatch, decision: int) -> None:
        """The batch's last decision, explained by the memory as it stands, as TensorBoard text."""
        explanation = self.memory.explain(batch.x[-1:], batch.category[-1:])
        verified = self.memory.action_names[int(batch.action[-1])]
        text = "\n".join("    " + line for line in str(explanation).splitlines())  # a Markdown code block
        writer.add_text("explain/decision", f"decision {int(batch.position[-1])}, verified action **{verified}**:"
                        f"\n\n{text}", decision)

    def _log_recycles(self, writer: Any, count: int) -> None:
        """Each recycled prototype of the latest batch as TensorBoard text at its decision."""
        log = self.memory.recycle_log
        names = self.memory.category_names, self.memory.action_names
        for s, c, a, p, d in zip(*(field[-count:] for field in log), strict=True):
            writer.add_text("gate/recycle", f"decision {int(s)}: prototype {int(p)} of **{names[1][int(a)]}** in "
                            f"**{names[0][int(c)]}** had the fewest recent wins and was replaced by a decision "
                            f"{float(d):.3f} from every prototype of its action", int(s) + 1)

    def _log_figures(self, writer: Any, decision: int) -> None:
        attention = self.memory.criterion_attention().detach().cpu()
        names = self.memory.category_names, self.memory.factor_names
        writer.add_figure("attention/heatmap", attention_heatmap(attention, *names), decision)
        # learning='lvq' learns relevances online (GRLVQ): K x relevance, so that 1 is neutral as for attention
        relevance = self.memory.relevances().detach().cpu() * self.memory.n_factors if self.memory.config.lvq else None
        if relevance is not None:
            writer.add_figure("relevance/heatmap", attention_heatmap(relevance, *names, title="criterion relevance "
                                                                     "(K x relevance, learned online)"), decision)
        for c, category in enumerate(names[0]):
            for k, criterion in enumerate(names[1]):
                writer.add_scalar(f"attention/{category}/{criterion}", float(attention[c, k]), decision)
                if relevance is not None:
                    writer.add_scalar(f"relevance/{category}/{criterion}", float(relevance[c, k]), decision)
            known = self.memory.initialized[c]
            if bool(known.any()):
                writer.add_histogram(f"prototypes/{category}", self.memory.centroids[c][known].cpu(), decision)

    def _log_final(self) -> None:
        writer = self._writer()
        if writer is None:
            return
        decision = int(self.stream_position)
        self._log_figures(writer, decision)
        writer.add_text("gate/log", self.gate_log_table(), decision)
        final = {f"final/{tag}": float(value) for tag, value in self.metric_values().items()}
        if self.logger is not None:
            self.logger.log_hyperparams(dict(self.hparams), final)

    def metric_values(self) -> dict[str, float]:
        """Every metric as it stands, by its namespaced key (``acc/rolling_jm``, ``gate/rate``, ...)."""
        values = {**self.jm_metrics.compute(), **self.gate_rate.compute(), **self.drift.compute()}
        if self.knn_metrics is not None:
            values.update(self.knn_metrics.compute())
        return {tag: float(value) for tag, value in values.items()}

    def gate_log_table(self) -> str:
        """The most recent learning events (gate steps, promotions) as a Markdown table for
        TensorBoard's text plugin; every promotion is listed, with its evidence."""
        records = self.memory.gate_records()
        promotions = [r for r in records if r["event"] == "promoted"]
        recycles = [r for r in records if r["event"] == "recycled"]
        lines = [f"{len(records) - len(promotions) - len(recycles)} gate events, {len(promotions)} promotions and "
                 f"{len(recycles)} recycled prototypes in {int(self.stream_position)} decisions"
                 + (f"; the last {GATE_LOG_ROWS} events shown" if len(records) > GATE_LOG_ROWS else ""), "",
                 "| step | event | category | action | displacement | eta | evidence |",
                 "|---:|---|---|---|---:|---:|---|"]
        for r in records[-GATE_LOG_ROWS:]:
            if r["event"] == "gated":
                lines.append(f"| {r['step']} | gated | {r['category']} | {r['action']} | {r['disp']:.3f} | "
                             f"{r['eta']:.4f} | |")
            elif r["event"] == "recycled":
                lines.append(f"| {r['step']} | recycled | {r['category']} | {r['action']} | {r['disp']:.3f} | 1 | "
                             f"prototype {r['prototype']}, the fewest recent wins |")
            else:
                lines.append(f"| {r['step']} | **promoted** | {r['category']} | all | {r['shift']:.3f} | | "
                             f"CUSUM {r['statistic']:.2f}; {r['shadow_right']} decisions closer to the shadows, "
                             f"{r['main_right']} closer to the prototypes |")
        return "\n".join(lines)


def _confirmed(confirmed: Tensor) -> Tensor | None:
    """The stream's confirmation flags for ``prequential_``: None lets the memory derive them."""
    unknown = confirmed < 0
    if bool(unknown.all()):
        return None
    if bool(unknown.any()):
        raise ValueError("a batch mixes known and unknown confirmations (confirmed = -1); "
                         "a stream must give the confirmed column for every decision or for none")
    return confirmed > 0
