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
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training.data import DecisionStreamDataModule  # noqa: E402
from training.module import DecisionMemoryModule  # noqa: E402

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


class DecisionMemoryCLI(LightningCLI):
    """LightningCLI with the stream's names linked into the model, the logger's folder under
    ``--trainer.default_root_dir``, and overlay configs refused without their base."""

    def add_arguments_to_parser(self, parser) -> None:
        for field, argument in (("category_names", "categories"), ("action_names", "actions"),
                                ("factor_names", "factors")):
            parser.link_arguments(f"data.{field}", f"model.{argument}", apply_on="instantiate")
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir", compute_fn=log_root)

    def parse_arguments(self, parser, args) -> None:
        if args is None or isinstance(args, (list, tuple)):  # (a dict of arguments names no files)
            given = list(sys.argv[1:] if args is None else args)
            if any(arg.split("=", 1)[0] == "--trainer.logger.init_args.save_dir" for arg in given):
                raise SystemExit("--trainer.logger.init_args.save_dir is set from --trainer.default_root_dir "
                                 "(<dir>/lightning_logs): give --trainer.default_root_dir instead")
            check_overlays(config_paths(given))
        super().parse_arguments(parser, args)


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
