"""The Lightning loop end to end: every config, TensorBoard event files, exact resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from gae import JudgmentConfig
from gae.judgment.config import GROUPS, PATHS
from gae.traces.replay import replay
from scripts.train import main
from training.data import DecisionStream, DecisionStreamDataModule
from training.module import DecisionMemoryModule

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FIELDS = [f.name for f in dataclasses.fields(JudgmentConfig)]  # rule, drift, slots, learning, lvq, log, judges, trust
SMALL = ["--data.stream.init_args.n_decisions=400", "--data.stream.init_args.drift_at=200",
         "--trainer.enable_progress_bar=false"]


def fit(tmp_path: Path, *extra: str, config: str = "default.yaml"):
    args = ["fit", f"--config={CONFIGS / 'default.yaml'}"]
    if config != "default.yaml":
        args.append(f"--config={CONFIGS / config}")
    # default_root_dir too: under fast_dev_run the logger is a dummy and checkpoints would land in cwd
    return main([*args, f"--trainer.default_root_dir={tmp_path}",
                 *extra])


@pytest.mark.parametrize("config", ["default.yaml", "drift.yaml", "large.yaml", "file.yaml", "adaptive.yaml",
                                    "prototypes.yaml"])
def test_every_config_runs_fast_dev_run(tmp_path, config):
    cli = fit(tmp_path, "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false", config=config)
    assert int(cli.model.stream_position) == cli.datamodule.batch_size
    assert int(cli.model.memory.num_decisions) == cli.datamodule.batch_size


def test_default_root_dir_decides_where_logs_and_checkpoints_go(tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a run started anywhere writes nothing there
    cli = main(["fit", f"--config={CONFIGS / 'default.yaml'}", f"--trainer.default_root_dir={tmp_path / 'runs'}",
                "--data.stream.init_args.n_decisions=100", "--data.stream.init_args.drift_at=50",
                "--trainer.enable_progress_bar=false"])
    log_dir = Path(cli.trainer.logger.log_dir)
    assert log_dir == tmp_path / "runs" / "lightning_logs" / "default" / "version_0"
    assert any(log_dir.glob("events.out.tfevents.*")) and any((log_dir / "checkpoints").glob("*.ckpt"))
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("overlay", sorted(path.name for path in CONFIGS.glob("*.yaml") if path.name != "default.yaml"))
def test_an_overlay_alone_is_refused_by_name(overlay, tmp_path):
    assert (CONFIGS / overlay).read_text().startswith("# extends: configs/default.yaml")
    with pytest.raises(SystemExit, match=f"{overlay} is an overlay of configs/default.yaml"):
        main(["fit", f"--config={CONFIGS / overlay}", f"--trainer.default_root_dir={tmp_path}"])


def test_print_config_lists_every_judgment_option_in_its_group(capsys):
    with pytest.raises(SystemExit):
        main(["fit", f"--config={CONFIGS / 'default.yaml'}", "--print_config"])
    judgments = yaml.safe_load(capsys.readouterr().out)["model"]["judgments"]
    assert list(judgments) == ["seed", "recommended"]
    for name, expected in (("seed", JudgmentConfig.seed()), ("recommended", JudgmentConfig.recommended())):
        assert list(judgments[name]) == FIELDS  # the groups, learning and the judges; no option left flat
        listed = [(group, option) for group in GROUPS for option in judgments[name][group]]
        assert listed == [path for path in PATHS.values() if len(path) == 2]  # every option, in its group
        assert JudgmentConfig.from_dict(judgments[name]) == expected


def test_the_default_config_runs_the_seed_rule_the_recommended_config_and_the_knn():
    config = yaml.safe_load((CONFIGS / "default.yaml").read_text())["model"]
    judgments = config["judgments"]
    assert list(judgments) == ["seed", "recommended"] and config["knn"] is True
    for name, expected in (("seed", JudgmentConfig.seed()), ("recommended", JudgmentConfig.recommended())):
        assert list(judgments[name]) == FIELDS  # every option listed, in its group
        assert all(list(judgments[name][group]) == [f.name for f in dataclasses.fields(kind)]
                   for group, kind in GROUPS.items())
        assert JudgmentConfig.from_dict(judgments[name]) == expected
    for overlay, expected in (("seed.yaml", JudgmentConfig.seed()), ("recommended.yaml", JudgmentConfig.recommended())):
        given = yaml.safe_load((CONFIGS / overlay).read_text())["model"]["judgments"]
        assert list(given) == [overlay[:-5]] and JudgmentConfig.from_dict(given[overlay[:-5]]) == expected


def test_a_flat_config_of_earlier_gae_and_a_mixed_one_still_run(tmp_path):
    """YAML written before the groups (every option flat, as hparams.yaml and configs/ had them) runs
    as it did; a flat option beside its group overrides the group's field."""
    flat = JudgmentConfig.seed().replace(drift_mode="adaptive", tau=0.2).to_dict()
    mixed = {"drift": {"mode": "adaptive"}, "slots": {"prototypes": 2}, "tau": 0.3, "rule": {"tau": 0.1}}
    overlay = tmp_path / "judgments.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"judgments": {"flat": flat, "mixed": mixed}}}))
    cli = fit(tmp_path, f"--config={overlay}", "--model.judgments.mixed.slots.spawn_support=2.5",
              "--model.judgments.flat.eta_confirmed=0.1", "--trainer.fast_dev_run=true",
              "--trainer.enable_progress_bar=false")
    assert cli.model.memories["flat"].config == JudgmentConfig(drift_mode="adaptive", tau=0.2, eta_confirmed=0.1)
    assert cli.model.memories["mixed"].config == JudgmentConfig(drift_mode="adaptive", prototypes=2, tau=0.3,
                                                               spawn_support=2.5)


def test_a_run_prints_each_memorys_accuracy_and_the_recommended_judgment_leads(tmp_path, capsys):
    cli = fit(tmp_path, "--data.stream.init_args.n_decisions=1000", "--data.stream.init_args.drift_at=500",
              "--trainer.enable_progress_bar=false")
    printed = capsys.readouterr().out
    values = cli.model.metric_values()
    assert "1,000 decisions, the stream changes at decision 500" in printed
    rows = {line.split()[0]: line.split()[1:] for line in printed.splitlines()
            if line.split() and line.split()[0] in ("seed", "recommended", "knn")}
    assert list(rows) == ["seed", "recommended", "knn"]
    for name, (cumulative, after, rolling) in rows.items():
        assert cumulative == f"{values[name]['acc/cumulative']:.1%}" and rolling == f"{values[name]['acc/rolling']:.1%}"
        expected = cli.model.after_drift[name]
        assert int(expected.total) == 500 and after == f"{float(expected.compute()):.1%}"
    assert values["recommended"]["acc/cumulative"] >= values["knn"]["acc/cumulative"]


def test_an_overlay_runs_its_one_judgment_memory(tmp_path):
    cli = fit(tmp_path, "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false",
              "--model.judgments.recommended.tau=0.2", config="recommended.yaml")
    assert list(cli.model.memories) == ["recommended"] and cli.model.run_names == ["recommended", "knn"]
    assert cli.model.memory.config == JudgmentConfig.recommended().replace(tau=0.2)


def test_bad_judgment_names_are_refused_by_name():
    with pytest.raises(ValueError, match="'knn'"):
        DecisionMemoryModule(judgments={"knn": JudgmentConfig()})
    with pytest.raises(ValueError, match="'a/b'"):
        DecisionMemoryModule(judgments={"a/b": JudgmentConfig()})
    with pytest.raises(ValueError, match="non-empty"):
        DecisionMemoryModule(judgments={})
    with pytest.raises(ValueError, match="not both"):
        DecisionMemoryModule(judgments={"a": JudgmentConfig()}, judgment=JudgmentConfig())
    with pytest.raises(TypeError, match=r"judgments\['a'\]"):
        DecisionMemoryModule(judgments={"a": 3})
    assert list(DecisionMemoryModule(judgments={"knn": {}}, knn=False).memories) == ["knn"]  # free without the k-NN


def test_a_checkpoint_keeps_the_configs_as_plain_values(tmp_path):
    cli = fit(tmp_path, "--model.judgments.seed.drift_mode=adaptive", "--model.judgments.seed.tau=0.2",
              "--data.stream.init_args.n_decisions=100", "--data.stream.init_args.drift_at=50",
              "--trainer.enable_progress_bar=false")
    assert cli.model.memories["seed"].config == JudgmentConfig(drift_mode="adaptive", tau=0.2)
    path = next(Path(cli.trainer.logger.log_dir).glob("checkpoints/*.ckpt"))
    saved = torch.load(path, weights_only=True)
    assert saved["hyper_parameters"]["judgments"] == {name: memory.config.to_dict()
                                                      for name, memory in cli.model.memories.items()}
    again = DecisionMemoryModule.load_from_checkpoint(path, weights_only=True)
    for name, memory in cli.model.memories.items():
        assert again.memories[name].config == memory.config
        assert torch.equal(again.memories[name].centroids, memory.centroids)


def legacy(saved: dict, *, flat: bool) -> dict:
    """``saved`` (a checkpoint of configs/seed.yaml) as gae wrote it with one judgment memory, before
    ``judgments``: its state under ``memory.``, ``jm_metrics.`` ..., its config as ``judgment`` or, with
    ``flat``, as flat options from before JudgmentConfig."""
    old = {"memories.seed.": "memory.", "metrics.seed.": "jm_metrics.", "metrics.knn.": "knn_metrics.",
           "gate_rates.seed.": "gate_rate.", "drifts.seed.": "drift."}
    state = {}
    for key, value in saved["state_dict"].items():
        if key.startswith("after_drift."):
            continue  # counted since the module held several memories
        prefix = next((p for p in old if key.startswith(p)), None)
        state[key if prefix is None else old[prefix] + key[len(prefix):]] = value
    saved["state_dict"] = state
    options = saved["hyper_parameters"].pop("judgments")["seed"]
    if flat:  # as gae wrote it before JudgmentConfig: flat options
        saved["hyper_parameters"].update({key: options[key] for key in ("tau", "eta_confirmed", "drift_threshold")})
        extra = state["memory._extra_state"]
        del extra["config"]
        extra.update(drift_mode="seed", prototypes=1)
    else:
        saved["hyper_parameters"]["judgment"] = options
    return saved


@pytest.mark.parametrize("flat", [False, True], ids=["judgment", "flat-options"])
def test_a_checkpoint_of_one_judgment_memory_loads_as_jm_with_its_config(tmp_path, flat):
    stream = ["--data.stream.init_args.n_decisions=200", "--data.stream.init_args.drift_at=50",
              "--trainer.enable_progress_bar=false"]
    cli = fit(tmp_path, "--model.judgments.seed.tau=0.2", "--model.judgments.seed.eta_confirmed=0.1", *stream,
              "--trainer.max_steps=2", "--trainer.callbacks=[]", "--trainer.callbacks+=ModelCheckpoint",
              "--trainer.callbacks.every_n_train_steps=2", config="seed.yaml")
    assert int(cli.model.stream_position) == 100
    path = next(Path(cli.trainer.logger.log_dir).glob("checkpoints/*.ckpt"))
    torch.save(legacy(torch.load(path, weights_only=True), flat=flat), tmp_path / "old.ckpt")
    again = DecisionMemoryModule.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=True)
    assert list(again.memories) == ["jm"] and again.memory.config == JudgmentConfig(tau=0.2, eta_confirmed=0.1)
    assert torch.equal(again.memory.centroids, cli.model.memory.centroids)
    values, before = again.metric_values(), cli.model.metric_values()
    assert values["jm"] == before["seed"] and values["knn"] == before["knn"]
    # resumed by the CLI with today's default.yaml: the checkpoint's one memory learns on, not the config's two
    resumed = fit(tmp_path / "resumed", *stream, f"--ckpt_path={tmp_path / 'old.ckpt'}")
    assert list(resumed.model.memories) == ["jm"] and int(resumed.model.memory.num_decisions) == 200


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_overlay_runs(tmp_path):
    cli = fit(tmp_path, "--trainer.fast_dev_run=true", *SMALL, config="gpu.yaml")
    assert cli.model.memory.centroids.device.type == "cuda"


def test_names_are_linked_from_the_data(tmp_path):
    cli = fit(tmp_path, "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false", config="file.yaml")
    assert cli.model.memory.category_names == cli.datamodule.category_names
    assert cli.model.memory.factor_names[0] == "amount"


def read_run(folder: Path) -> EventAccumulator:
    """The events of one run (one folder, not its subfolders), every event kept."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_event_files_hold_every_tag(tmp_path):
    cli = fit(tmp_path, *SMALL)
    log_dir = Path(cli.trainer.logger.log_dir)
    root = read_run(log_dir)
    # the root run: the stream's drift alone on its chart, and each memory's final metrics beside the hparams
    assert [tag for tag in root.Tags()["scalars"] if not tag.startswith("final/")] == ["stream/drift"]
    assert {"final/seed/acc/cumulative", "final/recommended/acc/cumulative", "final/knn/acc/cumulative"} <= set(
        root.Tags()["scalars"])
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(root.PluginTagToContent("hparams"))
    common = ("acc/rolling", "acc/cumulative", "calibration/ece", "abstain/rate", "curve/rolling")
    knn = read_run(log_dir / "knn")
    assert set(knn.Tags()["scalars"]) == set(common)
    assert [event.step for event in knn.Scalars("curve/rolling")] == list(range(1, 401))
    for name in ("seed", "recommended"):
        tags = read_run(log_dir / name).Tags()
        assert {*common, "gate/rate", "gate/events", "drift/shift", "drift/from_start",
                "attention/invoice/amount"} <= set(tags["scalars"]), name
        assert {f"attention_chart/{category}" for category in cli.model.memory.category_names} <= set(tags["images"])
    assert ("relevance_chart/invoice" in read_run(log_dir / "recommended").Tags()["images"]) is True
    events = read_run(log_dir / "seed")
    tags = events.Tags()
    seed = cli.model.memories["seed"]
    explained = events.Tensors("explain/decision/text_summary")
    assert explained and "recommends" in tensor_util.make_ndarray(explained[0].tensor_proto).item().decode()
    assert "prototypes/invoice" in tags["histograms"]
    rolling = events.Scalars("acc/rolling")
    assert [event.step for event in rolling] == list(range(50, 401, 50))  # against the decision index
    assert all(0.0 <= event.value <= 1.0 for event in rolling)
    assert [event.step for event in events.Scalars("curve/rolling")] == list(range(1, 401))  # every decision
    assert rolling[-1].value == pytest.approx(cli.model.metric_values()["seed"]["acc/rolling"])
    gate_events = [event.value for event in events.Scalars("gate/events")]
    assert gate_events == sorted(gate_events) and gate_events[-1] == len(seed.gate_log.step)
    attention = sum(events.Scalars(f"attention/invoice/{name}")[-1].value for name in seed.factor_names)
    assert attention == pytest.approx(8.0, rel=1e-5)  # the weights of a category sum to K
    text = tensor_util.make_ndarray(events.Tensors("gate/log/text_summary")[-1].tensor_proto).item().decode()
    assert f"{len(seed.gate_log.step)} gate events, 0 promotions and 0 recycled prototypes in 400 " \
           "decisions" in text


def test_promotions_reach_tensorboard(tmp_path):
    cli = fit(tmp_path, *SMALL, config="adaptive.yaml")
    promotions = cli.model.memory.promotion_log
    assert list(cli.model.memories) == ["adaptive"] and cli.model.memory.config.drift_mode == "adaptive"
    assert promotions.step.numel() > 0
    events = read_run(Path(cli.trainer.logger.log_dir) / "adaptive")
    assert events.Scalars("gate/promotions")[-1].value == promotions.step.numel()
    tracking = events.Scalars("gate/tracking_categories")
    assert tracking[-1].value == float((cli.model.memory.tracking_lead > 0).sum())
    assert all(0 <= event.value <= len(cli.model.memory.category_names) for event in tracking)
    leads = [events.Scalars(f"tracking_lead/{name}")[-1].value for name in cli.model.memory.category_names]
    assert leads == pytest.approx(cli.model.memory.tracking_lead.tolist())
    assert tracking[-1].value == sum(lead > 0 for lead in leads)
    texts = events.Tensors("gate/promotion/text_summary")
    assert [event.step for event in texts] == (promotions.step + 1).tolist()  # at the decision, one per promotion
    first = tensor_util.make_ndarray(texts[0].tensor_proto).item().decode()
    category = cli.model.memory.category_names[int(promotions.category[0])]
    promoted = f"decision {int(promotions.step[0])}: the prototypes of **{category}** were promoted to their run means"
    assert promoted in first
    log = tensor_util.make_ndarray(events.Tensors("gate/log/text_summary")[-1].tensor_proto).item().decode()
    assert f", {promotions.step.numel()} promotions and 0 recycled" in log and "**promoted**" in log


def test_recycled_prototypes_reach_tensorboard(tmp_path):
    cli = fit(tmp_path, *SMALL, config="prototypes.yaml")
    memory = cli.model.memory
    recycled = memory.recycle_log
    assert memory.config.prototypes == 4 and cli.datamodule.stream.modes == 3 and recycled.step.numel() > 0
    events = read_run(Path(cli.trainer.logger.log_dir) / "prototypes")
    assert events.Scalars("gate/recycles")[-1].value == recycled.step.numel()
    texts = events.Tensors("gate/recycle/text_summary")
    assert [event.step for event in texts] == (recycled.step + 1).tolist()
    log = tensor_util.make_ndarray(events.Tensors("gate/log/text_summary")[-1].tensor_proto).item().decode()
    assert f"{recycled.step.numel()} recycled prototypes in 400 decisions" in log
    assert "prototypes/invoice" in events.Tags()["histograms"]


def state(model: DecisionMemoryModule) -> dict[str, torch.Tensor]:
    return {key: value for key, value in model.state_dict().items() if isinstance(value, torch.Tensor)}


def test_resume_mid_stream_ends_where_an_uninterrupted_run_ends(tmp_path):
    checkpoints = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                   "--trainer.callbacks.every_n_train_steps=3", "--trainer.callbacks.save_last=true"]
    whole = fit(tmp_path / "whole", *SMALL)
    cut = fit(tmp_path / "cut", *SMALL, "--trainer.max_steps=4", "--trainer.callbacks=[]", *checkpoints)
    assert 0 < int(cut.model.stream_position) < 400
    last = next((tmp_path / "cut").rglob("last.ckpt"))
    assert torch.load(last, weights_only=True)["state_dict"]  # checkpoints load without pickle code
    resumed = fit(tmp_path / "resumed", *SMALL, f"--ckpt_path={last}")
    assert int(resumed.model.stream_position) == 400
    expected, got = state(whole.model), state(resumed.model)
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    assert resumed.model.metric_values() == whole.model.metric_values()
    for name, memory in whole.model.memories.items():
        for a, b in zip(resumed.model.memories[name].gate_log, memory.gate_log, strict=True):
            assert torch.equal(a, b)


def test_the_loop_writes_a_trace_that_replays_across_a_resume(tmp_path):
    trace = tmp_path / "trace.jsonl"
    checkpoints = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                   "--trainer.callbacks.every_n_train_steps=3", "--trainer.callbacks.save_last=true"]
    cut = fit(tmp_path / "cut", *SMALL, f"--model.trace={trace}", "--trainer.max_steps=4", "--trainer.callbacks=[]",
              *checkpoints)
    last = next((tmp_path / "cut").rglob("last.ckpt"))
    position = int(torch.load(last, weights_only=True)["state_dict"]["stream_position"])
    fit(tmp_path / "resumed", *SMALL, f"--model.trace={trace}", f"--ckpt_path={last}")
    learned = int(cut.model.stream_position)  # the cut run learned 4 batches of 50; its last checkpoint, 3
    assert (learned, position) == (200, 150)
    for run in ("seed", "recommended", "knn"):
        first = replay(trace, f"{trace}.{run}-0.pt")  # the cut run's lines, the superseded last batch too
        assert first.ok and first.runs == [run] and first.checked == learned
        # from the resumed state: the cut run's lines after it, then the resumed run's, all exact
        resumed = replay(trace, f"{trace}.{run}-{position}.pt")
        assert resumed.ok and resumed.checked == (learned - position) + (400 - position)


def test_a_replayed_batch_is_not_learned_twice():
    data = DecisionStreamDataModule(DecisionStream(300, seed=1), batch_size=100)
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, knn=False)
    batches = list(data.train_dataloader())
    for batch in (batches[0], batches[1], batches[0], batches[1]):
        model.training_step(batch, 0)
    assert all(int(memory.num_decisions) == 200 for memory in model.memories.values())
    assert int(model.stream_position) == 200


def test_frozen_attention_is_the_seed_rule():
    data = DecisionStreamDataModule(DecisionStream(300, seed=2), batch_size=100)
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, learn_attention=False)
    assert model.configure_optimizers() is None
    for batch in data.train_dataloader():
        assert model.training_step(batch, 0) is None
    for memory in model.memories.values():
        assert torch.equal(memory.criterion_logits, torch.zeros(4, 8))



def test_a_module_load_is_all_or_nothing_across_its_memories():
    data = DecisionStreamDataModule(DecisionStream(200, seed=3), batch_size=100)
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names)
    for batch in data.train_dataloader():
        model.training_step(batch, 0)
    before = {key: value.clone() for key, value in model.state_dict().items() if isinstance(value, torch.Tensor)}
    fresh = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, knn_capacity=100)
    with pytest.raises((RuntimeError, ValueError), match="400"):  # the k-NN store's size, saved vs this module's
        model.load_state_dict(fresh.state_dict())
    for key, value in model.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key]), key  # the memory loaded before the k-NN failed is put back


def test_an_lvq_memory_logs_its_learned_relevances(tmp_path):
    cli = fit(tmp_path, *SMALL, "--model.judgments.recommended.prototypes=4", config="recommended.yaml")
    events = read_run(Path(cli.trainer.logger.log_dir) / "recommended")
    tags = events.Tags()
    assert "relevance_chart/invoice" in tags["images"]
    names = cli.model.memory.factor_names
    logged = [events.Scalars(f"relevance/invoice/{name}")[-1].value for name in names]
    assert sum(logged) == pytest.approx(8.0, rel=1e-5)  # K x relevance: 1 is neutral, a category's sum to K
    learned = cli.model.memory.relevances()[cli.model.memory.category_names.index("invoice")] * len(names)
    assert logged == pytest.approx(learned.tolist(), rel=1e-5) and max(logged) > 1.0  # it learned something


def test_the_module_refuses_bad_settings_by_name(tmp_path):
    for options, named in (({"knn_k": 0}, "knn_k"), ({"rolling_window": 0}, "rolling_window"),
                           ({"figure_every_n_steps": 0}, "figure_every_n_steps"), ({"lr": -1.0}, "lr"),
                           ({"trace": str(tmp_path / "missing" / "t.jsonl")}, "trace"),
                           ({"judgments": {"fast": {"tau": -1}}}, r"judgments\['fast'\]: tau")):
        with pytest.raises((ValueError, TypeError), match=named):
            DecisionMemoryModule(**options)


def test_a_fit_that_raises_closes_its_traces_and_a_resumed_fit_opens_its_own(tmp_path):
    from lightning import Callback, Trainer

    class Stop(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("stopped")

    data = DecisionStreamDataModule(DecisionStream(300, seed=4), batch_size=50)
    trace = tmp_path / "trace.jsonl"
    model = DecisionMemoryModule(data.category_names, data.action_names, data.factor_names, trace=str(trace))
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[Stop()])
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.fit(model, data)
    assert model._tracers is None and int(model.stream_position) == 150
    Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False).fit(model, data)
    assert (tmp_path / "trace.jsonl.seed-150.pt").exists()  # the second fit's writer starts where it resumed


def test_a_resume_keeps_the_options_given_on_its_command_line(tmp_path):
    cut = fit(tmp_path / "cut", *SMALL, "--trainer.max_steps=2", "--trainer.callbacks=[]",
              "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=2")
    last = next((tmp_path / "cut").rglob("*.ckpt"))
    assert int(cut.model.stream_position) == 100
    resumed = fit(tmp_path / "resumed", *SMALL, f"--ckpt_path={last}", "--model.figure_every_n_steps=7")
    assert resumed.model.hparams["figure_every_n_steps"] == 7 and int(resumed.model.stream_position) == 400


def test_the_trust_in_each_judge_reaches_tensorboard(tmp_path):
    judges = '{"gauss": {}, "lda_short": {"kind": "lda", "rate_floor": 0.05}}'
    cli = fit(tmp_path, *SMALL, f"--model.judgments.recommended.judges={judges}", config="recommended.yaml")
    memory = cli.model.memories["recommended"]
    assert memory.judge_names() == ("prototypes", "gauss", "lda_short")
    events = read_run(Path(cli.trainer.logger.log_dir) / "recommended")
    trust = memory.trust()
    for j, judge in enumerate(memory.judge_names()):
        series = events.Scalars(f"trust_mean/{judge}")
        assert [event.step for event in series] == list(range(50, 401, 50))  # against the decision index
        assert series[-1].value == pytest.approx(float(trust[:, j].mean()))
        for c, category in enumerate(memory.category_names):
            assert events.Scalars(f"trust/{category}/{judge}")[-1].value == pytest.approx(float(trust[c, j]))
    total = sum(events.Scalars(f"trust_mean/{judge}")[3].value for judge in memory.judge_names())
    assert total == pytest.approx(1.0, rel=1e-5)  # the weights of a category sum to 1, and so their means
    knn_tags = read_run(Path(cli.trainer.logger.log_dir) / "knn").Tags()["scalars"]
    assert not any(tag.startswith(("trust/", "trust_mean/")) for tag in knn_tags)
