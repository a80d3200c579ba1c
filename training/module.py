"""The Lightning loop: stream decisions through the memories, score before learning, log everything.

Each training step is one prequential pass over a batch of the stream (``prequential_``):
every decision is scored with the state left by the decisions before it, the metrics are
updated from those pre-learning predictions, and the memories then learn. The module holds
several judgment memories side by side (``judgments``: by default the seed rule and
``JudgmentConfig.recommended()``) and the k-NN baseline, all fed the same stream. The loss the
optimizer sees is the sum over the judgment memories of the cross-entropy of their prequential
logits with respect to their criterion attention only; prototypes are buffers, learned online,
never by gradient.

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
``stream_position`` only after every memory has learned it; Lightning writes checkpoints
between steps, from the process that learns. So a checkpoint holds the state after a whole
number of batches, and a run killed at any moment (even SIGKILL) resumes from its last
checkpoint to the same end state as an uninterrupted run.

In TensorBoard each memory writes into its own run (``version_N/<name>``) under the same tags,
so one chart shows every memory in its own colour; :mod:`training.tensorboard_layout` has the
layout and the drift marker, :mod:`training.tensorboard_runs` what each run holds, and
docs/tensorboard.md how to read it.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gae import JudgmentConfig, JudgmentMemory, KNNMemory
from gae import validation as check
from gae.traces.writer import TraceWriter
from gae.types import StreamStep
from gae.validation import Names
from training import metrics as M
from training import tensorboard_layout as board
from training import tensorboard_runs as runs
from training.batch import DecisionBatch, gather_decisions
from training.distributed import broadcast_gradients_hook

KNN = "knn"  # the k-NN baseline's run name
RUN_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a judgment memory's name: a module key and a TensorBoard folder
# the state_dict prefixes of a checkpoint written before the module held several memories (one named 'jm')
LEGACY_PREFIXES = {"memory.": "memories.jm.", "jm_metrics.": "metrics.jm.", "knn_metrics.": f"metrics.{KNN}.",
                   "gate_rate.": "gate_rates.jm.", "drift.": "drifts.jm."}


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


def migrated_hparams(hparams: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint's hyperparameters in today's form: the one judgment memory of a checkpoint written
    before ``judgments`` (its ``judgment``, or the flat options of one written before the config
    existed, with the memory's extra state ``extra``) as ``judgments={'jm': ...}``."""
    hparams = dict(hparams)
    if isinstance(hparams.get("judgments"), Mapping):
        return hparams
    config = saved_config(extra or {}, hparams)
    for key in (*JudgmentConfig.options(), "judgment"):
        hparams.pop(key, None)
    return {**hparams, "judgments": {"jm": config.to_dict()}}


def judgment_configs(judgments: Mapping[str, Any] | None, judgment: Any = None, *,
                     knn: bool = True) -> dict[str, JudgmentConfig]:
    """The judgment memories to run, by name: ``judgments`` (name -> a JudgmentConfig or a dict of
    its options), or ``judgment`` alone (one memory named ``jm``, the form of checkpoints written
    before ``judgments``), or by default ``{'seed': JudgmentConfig.seed(), 'recommended':
    JudgmentConfig.recommended()}``. ValueError or TypeError names a bad name or config."""
    if judgments is not None and judgment is not None:
        raise ValueError("give judgments (several memories, by name) or judgment (one memory, named 'jm'), "
                         f"not both; got judgments={judgments!r} and judgment={judgment!r}")
    if judgment is not None:
        judgments = {"jm": judgment}
    elif judgments is None:
        judgments = {"seed": JudgmentConfig.seed(), "recommended": JudgmentConfig.recommended()}
    if not isinstance(judgments, Mapping) or not judgments:
        raise ValueError(f"judgments must be a non-empty mapping of names to configs, got {judgments!r}")
    configs = {}
    for name, config in judgments.items():
        if not isinstance(name, str) or not RUN_NAME.fullmatch(name) or (knn and name == KNN):
            raise ValueError(f"judgments: each name must be letters, digits, '_' or '-' (a TensorBoard run), "
                             f"and not '{KNN}' (the k-NN's run), got {name!r}")
        if callable(getattr(config, "as_dict", None)):  # a jsonargparse Namespace: Lightning's instantiate_module
            config = config.as_dict()  # parses a checkpoint's hparams in place before on_load_checkpoint reads them
            config = config.get("init_args", config)
        if isinstance(config, Mapping):  # YAML and the hparams of a checkpoint give plain dicts
            try:
                config = JudgmentConfig.from_dict(config)
            except (TypeError, ValueError) as error:
                raise type(error)(f"judgments[{name!r}]: {error}") from None
        if not isinstance(config, JudgmentConfig):
            raise TypeError(f"judgments[{name!r}] must be a JudgmentConfig or a dict of its options, got {config!r}")
        configs[name] = config
    return configs


class DecisionMemoryModule(L.LightningModule):
    """Judgment memories (:class:`~gae.JudgmentMemory`) and a :class:`~gae.KNNMemory` on one decision stream.

    Args:
        categories, actions, factors: counts or names (linked from the data module by the CLI).
        judgments: the judgment memories by name, each a :class:`~gae.JudgmentConfig` or a dict of
            its options (in YAML ``model.judgments.recommended.learning: lvq`` and so on). Each name
            is the memory's TensorBoard run. Default: ``seed`` (:meth:`JudgmentConfig.seed`, the
            original design) and ``recommended`` (:meth:`JudgmentConfig.recommended`).
        judgment: one judgment memory, named ``jm``, instead of ``judgments`` (the form of earlier
            checkpoints, which load with it). Default: None.
        learn_attention: train each judgment memory's ``criterion_logits`` by gradient; False keeps
            plain Euclidean distances (no optimizer at all). Default: True.
        lr: Adam learning rate of the attention. Default: 0.05.
        knn: also feed a :class:`~gae.KNNMemory` the same stream (run ``knn``). Default: True.
        knn_k, knn_capacity, knn_scoped: the baseline's settings. Default: 5, 400, False.
        rolling_window: decisions in the rolling accuracy. Default: 50.
        curve_points_per_batch: rolling-accuracy points logged per batch against the decision
            index (a per-decision curve on short streams, a thinned one on long ones). Default: 10.
        figure_every_n_steps: how often the attention heatmap, per-criterion scalars and
            prototype histograms are written. Default: 20.
        trace: write the evaluation trace of every memory to this JSONL file (see
            ``gae/traces/writer.py`` and docs/trace.md; one run per memory, by its name), with the
            state each writer started from in ``<trace>.<run>-<stream position>.pt`` for
            ``scripts/replay_trace.py``. Rank 0 writes it. Default: None (no trace).

    TensorBoard (rank 0, when the logger's experiment is a ``SummaryWriter``): each memory writes
    into its own run, a subfolder of the version named after it, under the same tags: every
    metric of :meth:`metric_values` against the decision index, the rolling curve
    (``curve/rolling``) and, for a judgment memory, the attention, prototypes, promotions and the
    gate log. The version's own run holds the Custom Scalars layout, the hyperparameters with the
    final metrics, and, when the data module's stream drifts (its ``drift_at``),
    :data:`~training.tensorboard_layout.DRIFT_MARKER` on its own chart.
    """

    def __init__(self, categories: Names = 4, actions: Names = 4, factors: Names = 8, *,
                 judgments: dict[str, JudgmentConfig] | None = None, judgment: JudgmentConfig | None = None,
                 learn_attention: bool = True, lr: float = 0.05,
                 knn: bool = True, knn_k: int = 5, knn_capacity: int = 400, knn_scoped: bool = False,
                 rolling_window: int = 50, curve_points_per_batch: int = 10, figure_every_n_steps: int = 20,
                 trace: str | None = None) -> None:
        super().__init__()
        for option, value in (("knn_k", knn_k), ("knn_capacity", knn_capacity), ("rolling_window", rolling_window),
                              ("curve_points_per_batch", curve_points_per_batch),
                              ("figure_every_n_steps", figure_every_n_steps)):
            check.check_int(option, value, low=1)
        check.check_real("lr", lr, low=0.0, low_open=True)
        if trace is not None and not os.path.isdir(os.path.dirname(os.path.abspath(trace))):
            raise ValueError(f"trace must be a file in an existing folder, got {trace!r}")
        configs = judgment_configs(judgments, judgment, knn=knn)
        # plain values only, so that a checkpoint loads with torch.load(weights_only=True)
        self.save_hyperparameters(ignore=["judgments", "judgment"])
        self.knn = KNNMemory(factors=factors, actions=actions, k=knn_k, capacity=knn_capacity, categories=categories,
                             scoped=knn_scoped) if knn else None
        self._build(categories, actions, factors, configs)
        # decisions of the stream already learned: a resumed run skips them, whatever the loader replays
        self.register_buffer("stream_position", torch.zeros((), dtype=torch.int64))
        self._curve_points = curve_points_per_batch
        self._figure_every = figure_every_n_steps
        self._tracers: dict[str, TraceWriter] | None = None  # opened at the first step (on a resume too)
        self._writers: runs.RunWriters | None = None  # opened at the first logged step of each fit
        self._drift_points: tuple[int, ...] = ()  # of the data module's stream, read at each fit's start
        self._layout_pending = False  # each fit's runs get the Custom Scalars layout at their first logged step

    stream_position: Tensor

    def _build(self, categories: Names, actions: Names, factors: Names, configs: dict[str, JudgmentConfig]) -> None:
        """The judgment memories of ``configs`` and every memory's metrics (a fresh state)."""
        self.save_hyperparameters({**self.hparams, "judgments": {name: c.to_dict() for name, c in configs.items()}})
        trainable = bool(self.hparams["learn_attention"])
        self.memories = nn.ModuleDict({name: JudgmentMemory(categories, actions, factors, config)
                                       for name, config in configs.items()})
        for memory in self.memories.values():
            memory.criterion_logits.requires_grad_(trainable)
        # every rank feeds its metrics the same global stream, so computing needs no sync
        window = self.hparams["rolling_window"]
        self.metrics = nn.ModuleDict({name: M.StreamMetrics(window=window, sync_on_compute=False)
                                      for name in self.run_names})
        self.after_drift = nn.ModuleDict({name: M.CumulativeAccuracy(sync_on_compute=False)
                                          for name in self.run_names})
        self.gate_rates = nn.ModuleDict({name: M.GateRate(sync_on_compute=False) for name in configs})
        self.drifts = nn.ModuleDict({name: M.PrototypeDrift(sync_on_compute=False) for name in configs})

    @property
    def run_names(self) -> list[str]:
        """Every memory's name (its TensorBoard run): the judgment memories', then ``knn``."""
        return [*self.memories, *([KNN] if self.knn is not None else [])]

    @property
    def memory(self) -> JudgmentMemory:
        """The first judgment memory (the only one of a run with one)."""
        return next(iter(self.judges().values()))

    def judges(self) -> dict[str, JudgmentMemory]:
        """The judgment memories by name (``memories``, typed)."""
        return cast(dict[str, JudgmentMemory], dict(self.memories))

    def _metrics(self, name: str) -> M.StreamMetrics:
        return cast(M.StreamMetrics, self.metrics[name])

    def _after_drift(self, name: str) -> M.CumulativeAccuracy:
        return cast(M.CumulativeAccuracy, self.after_drift[name])

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``, all or nothing across the memories: each checks its sizes
        and names before it copies a tensor, and if one fails after another has loaded, the
        previous state is loaded back before the error is raised."""
        before = {key: value.clone() if isinstance(value, Tensor) else copy.deepcopy(value)
                  for key, value in self.state_dict().items()}
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except BaseException:
            super().load_state_dict(before, strict=False)
            raise

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Migrate an earlier checkpoint and build the memories it holds. A checkpoint written before
        the module held several memories has one judgment memory, renamed ``jm`` here (state keys
        ``memory.*`` -> ``memories.jm.*``); one written before the config existed keeps its options
        flat in its hparams. If the checkpoint's memories (names or configs) differ from this
        module's, the module is rebuilt with the checkpoint's before its state is loaded, so each
        memory learns on with the rule it was trained with."""
        state = checkpoint.get("state_dict", {})
        if any(key.startswith("memory.") for key in state):
            for key in list(state):
                prefix = next((old for old in LEGACY_PREFIXES if key.startswith(old)), None)
                if prefix is not None:
                    state[LEGACY_PREFIXES[prefix] + key[len(prefix):]] = state.pop(key)
            for name in ("jm", *([KNN] if any(key.startswith(f"metrics.{KNN}.") for key in state) else [])):
                for key, value in M.CumulativeAccuracy().state_dict(prefix=f"after_drift.{name}.").items():
                    state.setdefault(key, value)  # it did not count after the drift: from the resume on
        extra = state.get("memories.jm._extra_state", {})
        hparams = migrated_hparams(checkpoint.get("hyper_parameters", {}), extra if isinstance(extra, Mapping) else {})
        configs = judgment_configs(hparams["judgments"], knn=self.knn is not None)
        if configs != {name: memory.config for name, memory in self.memories.items()}:
            first = self.memory
            device = first.centroids.device
            self._build(first.category_names, first.action_names, first.factor_names, configs)
            self.to(device)

    def configure_optimizers(self) -> Any:
        if not self.hparams["learn_attention"]:
            return None
        return torch.optim.Adam([memory.criterion_logits for memory in self.judges().values()], lr=self.hparams["lr"])

    def on_fit_start(self) -> None:
        """Read the stream's drift points for the marker; under DDP, share rank 0's attention gradient
        instead of averaging identical ones."""
        self._drift_points = board.drift_points(getattr(getattr(self.trainer, "datamodule", None), "stream", None))
        self.teardown("fit")  # what an earlier fit left open: this one opens its own traces and runs
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
        before = {name: memory.centroids.clone() for name, memory in self.judges().items()}
        tracers = self._open_traces()
        steps: dict[str, StreamStep] = {}
        for name, memory in self.judges().items():
            steps[name] = tracers.get(name, memory).prequential_(batch.x, batch.category, batch.action,
                                                                 _confirmed(batch.confirmed), batch.skip)
        if self.knn is not None:
            steps[KNN] = tracers.get(KNN, self.knn).prequential_(batch.x, batch.category, batch.action,
                                                                 skip=batch.skip)
        for tracer in tracers.values():  # each step's lines reach the file: an exception loses none
            tracer.flush()
        # only once every memory has learned the batch: the position never counts a batch a memory lacks
        self.stream_position.fill_(int(batch.position[-1]) + 1)
        after = batch.position >= self._drift_points[0] if self._drift_points else None
        for name, step in steps.items():
            self._metrics(name).update(step.output.action, batch.truth, step.output.confidence)
            if after is not None and bool(after.any()):
                self._after_drift(name).update(step.output.action[after], batch.truth[after])
        for name, memory in self.judges().items():
            events = steps[name].events
            cast(M.GateRate, self.gate_rates[name]).update(events.gated, events.applied, events.promoted,
                                                           events.recycled)
            # every prototype slot is one prototype to the drift metric: (C, A, P, K) -> (C, A * P, K)
            cast(M.PrototypeDrift, self.drifts[name]).update(before[name].flatten(1, 2), memory.centroids.flatten(1, 2),
                                     memory.initialized.flatten(1, 2))
        self._log_step(batch, steps)
        if not self.hparams["learn_attention"]:
            return None
        return self._attention_loss(steps, batch)

    def _open_traces(self) -> dict[str, Any]:
        """The trace writers (none without ``trace``, or off rank 0), each saving the state it starts from."""
        if self._tracers is None:
            self._tracers = {}
            path = self.hparams.get("trace")
            if path is not None and self.global_rank == 0:
                position = int(self.stream_position)
                memories: dict[str, Any] = {**self.judges(), **({KNN: self.knn} if self.knn is not None else {})}
                self._tracers = {name: TraceWriter(path, memory, run=name, checkpoint=f"{path}.{name}-{position}.pt")
                                 for name, memory in memories.items()}
        return self._tracers

    def on_train_end(self) -> None:
        for tracer in (self._tracers or {}).values():
            tracer.close()
        self._tracers = None
        self._log_final()
        self._close_writers()
        if self.global_rank == 0 and int(self.stream_position) > 0:
            print(f"\n{self.summary()}")

    def configure_callbacks(self) -> list[L.Callback]:
        return [_CloseOnException()]  # Lightning tells callbacks, not the module, of an exception

    def teardown(self, stage: str) -> None:
        """After a fit, also one that raised: close every writer, so that a fit resumed on this
        module opens its own traces and runs."""
        self._close_writers()
        for tracer in (self._tracers or {}).values():
            tracer.close()
        self._tracers = None

    def _unseen(self, batch: DecisionBatch) -> DecisionBatch | None:
        """The part of the batch the memory has not learned yet (all of it, except on a replay)."""
        fresh = batch.position >= self.stream_position
        if bool(fresh.all()):
            return batch
        if not bool(fresh.any()):
            return None
        return DecisionBatch(*(field[fresh] for field in batch))

    def _attention_loss(self, steps: Mapping[str, StreamStep], batch: DecisionBatch) -> Tensor | None:
        losses = [loss for name, memory in self.judges().items()
                  if (loss := memory.attention_loss(steps[name], batch.category, batch.action, batch.skip)) is not None]
        if not losses:
            return None  # nothing to learn from yet: Lightning skips the optimizer step
        loss = torch.stack(losses).sum()
        self.log("loss/attention", loss, prog_bar=False, logger=False, batch_size=len(batch.position))
        return loss

    # -- logging --------------------------------------------------------------------------
    def _runs(self) -> runs.RunWriters | None:
        """Every run's writer (rank 0, with a TensorBoard logger), opened at the first logged step of a fit."""
        if self.global_rank != 0:  # every rank holds the same values: one writes them
            return None
        if self._writers is None:
            experiment = getattr(self.logger, "experiment", None)
            folder = experiment.get_logdir() if experiment is not None and hasattr(experiment, "add_scalar") else None
            if not isinstance(folder, str):  # no TensorBoard writer (another logger, or fast_dev_run's dummy)
                return None
            self._writers = runs.RunWriters(experiment, folder, self.run_names)
            self._layout_pending = True
        return self._writers

    def _close_writers(self) -> None:
        if self._writers is not None:
            self._writers.close()
        self._writers = None

    def _log_step(self, batch: DecisionBatch, steps: Mapping[str, StreamStep]) -> None:
        decision = int(self.stream_position)
        values = self.metric_values()
        self.log_dict({f"acc_{name}": values[name]["acc/rolling"] for name in self.run_names}, prog_bar=True,
                      logger=False, batch_size=len(batch.position))
        writers = self._runs()
        if writers is None:
            return
        curve_steps = self._log_rolling_curves(writers, batch)
        for name, scalars in values.items():
            for tag, value in scalars.items():
                writers[name].add_scalar(tag, float(value), decision)
        self._log_stream(writers, batch, [*curve_steps, decision], values)
        figures = self.global_step % self._figure_every == 0
        for name, memory in self.judges().items():
            writer, events = writers[name], steps[name].events
            if memory.config.adaptive:
                runs.log_tracking(writer, memory, decision)
            if memory.config.judges:
                runs.log_trust(writer, memory, decision)
            if promoted := int(events.promoted.sum()):
                runs.log_promotions(writer, memory, promoted)
            if recycled := int(events.recycled.sum()):
                runs.log_recycles(writer, memory, recycled)
            if figures:
                runs.log_figures(writer, memory, decision)
                runs.log_explanation(writer, memory, batch.x[-1:], batch.category[-1:], int(batch.action[-1]),
                                     int(batch.position[-1]), decision)
        if figures:
            writers.flush()

    def _log_rolling_curves(self, writers: runs.RunWriters, batch: DecisionBatch) -> list[int]:
        """Each memory's rolling accuracy (``curve/rolling``) at evenly spaced decisions of the batch,
        against the decision index; returns the steps."""
        n = len(batch.position)
        stride = max(1, n // max(1, self._curve_points))
        positions = torch.arange(stride - 1, n, stride).tolist()
        steps = [int(batch.position[position]) + 1 for position in positions]
        for name in self.run_names:
            curve = self._metrics(name).rolling_curve()  # (n,) rolling accuracy after each decision of the batch
            for position, step in zip(positions, steps, strict=True):
                writers[name].add_scalar("curve/rolling", float(curve[position]), step)
        return steps

    def _log_stream(self, writers: runs.RunWriters, batch: DecisionBatch, steps: list[int],
                    values: Mapping[str, Mapping[str, float]]) -> None:
        """The drift marker at the batch's logged ``steps`` and drift edges, in the root run, and, once
        per fit, the Custom Scalars layout of the tags every memory logs."""
        points = self._drift_points
        if points:
            first, last = int(batch.position[0]) + 1, int(batch.position[-1]) + 1
            for step in board.marker_steps(points, first=first, last=last, steps=steps):
                writers.root.add_scalar(board.DRIFT_MARKER, board.drift_marker(points, step), step)
        if self._layout_pending and hasattr(writers.root, "add_custom_scalars"):
            charts = board.compared_charts({name: [*tags, "curve/rolling"] for name, tags in values.items()})
            writers.root.add_custom_scalars(board.custom_scalars_layout(charts, marker=bool(points)))
            if points:
                writers.root.add_text(board.DRIFT_MARKER, "the stream changes at decision "
                                      + ", ".join(f"{point:,}" for point in points), 0)
            self._layout_pending = False

    def _log_final(self) -> None:
        writers = self._runs()
        if writers is None:
            return
        decision = int(self.stream_position)
        for name, memory in self.judges().items():
            runs.log_figures(writers[name], memory, decision)
            writers[name].add_text("gate/log", runs.gate_log_table(memory, decision), decision)
        final = {f"final/{name}/{tag}": value for name, scalars in self.metric_values().items()
                 for tag, value in scalars.items()}
        if self.logger is not None:
            self.logger.log_hyperparams(dict(self.hparams), final)

    def metric_values(self) -> dict[str, dict[str, float]]:
        """Every memory's metrics as they stand, by run name, then tag (``acc/rolling``, ``gate/rate``, ...)."""
        values: dict[str, dict[str, float]] = {}
        for name in self.run_names:
            scalars = dict(self._metrics(name).compute())
            if name in self.memories:
                scalars.update({**cast(M.GateRate, self.gate_rates[name]).compute(),
                                **cast(M.PrototypeDrift, self.drifts[name]).compute()})
            values[name] = {tag: float(value) for tag, value in scalars.items()}
        return values

    def gate_log_table(self, name: str | None = None) -> str:
        """The judgment memory ``name``'s (the first's by default) recent learning events as a Markdown table."""
        memory = self.memory if name is None else self.judges()[name]
        return runs.gate_log_table(memory, int(self.stream_position))

    def summary(self) -> str:
        """Each memory's accuracy as a short table: cumulative, after the stream's first drift, and rolling."""
        points = self._drift_points
        head = f"{int(self.stream_position):,} decisions" + (
            f", the stream changes at decision {', '.join(f'{point:,}' for point in points)}" if points else "")
        lines = [head, f"{'memory':<14}{'cumulative':>12}{'after drift':>13}{'rolling':>9}"]
        for name, scalars in self.metric_values().items():
            seen = int(self._after_drift(name).total) if points else 0
            after = f"{float(self._after_drift(name).compute()):.1%}" if seen else "-"
            lines.append(f"{name:<14}{scalars['acc/cumulative']:>12.1%}{after:>13}{scalars['acc/rolling']:>9.1%}")
        return "\n".join(lines)


class _CloseOnException(L.Callback):
    """Closes the module's trace and TensorBoard writers when its fit raises."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        pl_module.teardown("fit")


def _confirmed(confirmed: Tensor) -> Tensor | None:
    """The stream's confirmation flags for ``prequential_``: None lets the memory derive them."""
    unknown = confirmed < 0
    if bool(unknown.all()):
        return None
    if bool(unknown.any()):
        raise ValueError("a batch mixes known and unknown confirmations (confirmed = -1); "
                         "a stream must give the confirmed column for every decision or for none")
    return confirmed > 0
