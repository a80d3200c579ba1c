"""Train and evaluate a decision memory on a stream, from a LightningCLI YAML config.

    python scripts/train.py fit --config configs/default.yaml
    python scripts/train.py fit --config configs/default.yaml --config configs/gpu.yaml
    python scripts/train.py fit --config configs/default.yaml --ckpt_path last.ckpt   # resume mid-stream

The data module's category, action and factor names are linked into the model, so sizes
are given once, in ``data:``. ``--trainer.default_root_dir DIR`` decides where the logs and
checkpoints go (``DIR/lightning_logs/<name>/version_N``; the working directory by default, as in
Lightning). Every config in configs/ but default.yaml is an overlay: its first line
``# extends: configs/default.yaml`` names the config it goes on top of, and it is refused
without it. At the end the script prints where the logs and checkpoints are and the command
that opens TensorBoard.

A bad option or value is answered in a few lines and exit status 2 (training/cli.py): a typo,
nested anywhere (``--model.judgment.drift_mod``, ``--trainer.max_epoch``), with its close match
and the accepted keys; a value refused when the model, the data module or the trainer is built
from it (``--data.batch_size 0``) in one line naming the option. An error of the run itself keeps
its traceback.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training.cli import JsonArgumentParser, arguments_checked, check_only, fail, refusals  # noqa: E402
from training.data import DecisionStreamDataModule  # noqa: E402
from training.module import DecisionMemoryModule, migrated_hparams  # noqa: E402

EXTENDS = re.compile(r"^#\s*extends:\s*(\S+)")


def log_root(default_root_dir: Any) -> str:
    """Where the TensorBoard logger writes: ``<default_root_dir>/lightning_logs``, as Lightning's own
    default logger does (the working directory when ``default_root_dir`` is not set)."""
    return os.path.join(os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd(),
                        "lightning_logs")


def config_paths(args: list[str]) -> list[str]:
    """The ``--config`` / ``-c`` files of a command line, in order."""
    paths = []
    for i, arg in enumerate(args):
        if arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
        elif arg in ("--config", "-c") and i + 1 < len(args):
            paths.append(args[i + 1])
    return paths


def check_overlays(paths: list[str]) -> None:
    """Refuse an overlay config given without the config its ``# extends:`` line names before it."""
    seen: list[Path] = []
    for given in paths:
        path = Path(given).resolve()
        first = path.read_text().splitlines()[:1] if path.is_file() else []
        match = EXTENDS.match(first[0]) if first else None
        if match is not None and (ROOT / match.group(1)).resolve() not in seen:
            raise SystemExit(f"{path.name} is an overlay of {match.group(1)}: give that config first, e.g.\n"
                             f"  python scripts/train.py fit --config {match.group(1)} --config {given}")
        seen.append(path)


class DecisionMemoryParser(JsonArgumentParser, LightningArgumentParser):
    """LightningCLI's parser with the errors of :class:`training.cli.JsonArgumentParser`: a bad
    option or value in a few lines, exit status 2."""


class DecisionMemoryCLI(LightningCLI):
    """LightningCLI with the stream's names linked into the model, the logger's folder under
    ``--trainer.default_root_dir``, overlay configs refused without their base, and a bad option
    or value answered in a few lines (:class:`DecisionMemoryParser`, :meth:`instantiate_classes`)."""

    def __init__(self, *args: Any, parser_class: type[LightningArgumentParser] = DecisionMemoryParser,
                 **kwargs: Any) -> None:
        self.given: list[str] = []  # the command line, for naming the option of a refused value
        super().__init__(*args, parser_class=parser_class, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        for field, argument in (("category_names", "categories"), ("action_names", "actions"),
                                ("factor_names", "factors")):
            parser.link_arguments(f"data.{field}", f"model.{argument}", apply_on="instantiate")
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir", compute_fn=log_root)

    def parse_arguments(self, parser, args) -> None:
        if args is None or isinstance(args, (list, tuple)):  # (a dict of arguments names no files)
            given = self.given = list(sys.argv[1:] if args is None else args)
            if any(arg.split("=", 1)[0] == "--trainer.logger.init_args.save_dir" for arg in given):
                raise SystemExit("--trainer.logger.init_args.save_dir is set from --trainer.default_root_dir "
                                 "(<dir>/lightning_logs): give --trainer.default_root_dir instead")
            check_overlays(config_paths(given))
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Lightning's merges every hyperparameter of a ``--ckpt_path`` over the config, silently
        dropping options given on the command line. Here the checkpoint gives only its judgment
        memories (``judgments``, an earlier checkpoint's one memory as ``jm``: :func:`migrated_hparams`),
        so the run resumes the memories it saved, and only when the command line names none."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not path or not Path(path).is_file():
            return
        prog = self._parser(subcommand).prog
        try:
            saved = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as error:  # not a checkpoint (or a tampered one): never unpickled
            fail(prog, [f"--ckpt_path {path}: not a loadable checkpoint ({type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else ''})"])
        hparams = saved.get("hyper_parameters", {}) if isinstance(saved, dict) else {}
        if not hparams or any(arg.startswith("--model.judgment") for arg in self.given):
            return
        extra = saved.get("state_dict", {}).get("memory._extra_state")
        judgments = migrated_hparams(hparams, extra if isinstance(extra, dict) else None)["judgments"]
        self.config = self.parser.parse_object({subcommand: {"model": {"judgments": judgments}}}, self.config)

    def before_instantiate_classes(self) -> None:
        """Refuse a ``--ckpt_path`` that names no file before anything is built (Lightning's own
        FileNotFoundError comes once the run has started, with a traceback); Lightning's keywords
        (``last``, ``best``, ``hpc``, ``registry...``) and URLs are left to Lightning. With
        ``GAE_CHECK_ARGS=1`` the command line is only checked: the objects are built (so a value
        they refuse fails), nothing is run."""
        path = self._get(self.config, "ckpt_path")
        if (isinstance(path, str) and path not in ("last", "best", "hpc") and not path.startswith("registry")
                and "://" not in path and not Path(path).is_file()):
            fail(self._parser(self.subcommand).prog, [f"--ckpt_path: no checkpoint file at {path}"])

    def instantiate_classes(self) -> None:
        """Build the model, the data module and the trainer; a value one of them refuses (a
        ValueError, TypeError or Lightning's MisconfigurationException raised while it is built:
        ``--data.batch_size 0``, ``--model.judgment.tau -1``) is answered in one line naming the
        option, exit status 2. The run itself is outside: its errors keep their traceback."""
        with refusals(self._parser(self.subcommand), self.given,
                      errors=(ValueError, TypeError, MisconfigurationException)):
            super().instantiate_classes()
        if check_only():
            arguments_checked(self._parser(self.subcommand).prog.replace(" [options]", ""))


def main(args: list[str] | None = None) -> DecisionMemoryCLI:
    cli = DecisionMemoryCLI(DecisionMemoryModule, DecisionStreamDataModule, args=args,
                            save_config_kwargs={"overwrite": True})
    trainer = cli.trainer
    if trainer.is_global_zero and trainer.logger is not None and trainer.logger.log_dir is not None:
        log_dir = Path(trainer.logger.log_dir)
        print(f"\nlogs and checkpoints: {log_dir}")
        print(f"open them with:       tensorboard --logdir {log_dir.parent}")
    return cli


if __name__ == "__main__":
    main()
