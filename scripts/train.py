"""Train and evaluate a decision memory on a stream, from a LightningCLI YAML config.

    python scripts/train.py fit --config configs/default.yaml
    python scripts/train.py fit --config configs/default.yaml --config configs/gpu.yaml
    python scripts/train.py fit --config configs/default.yaml --ckpt_path last.ckpt   # resume mid-stream

The data module's category, action and factor names are linked into the model, so sizes
are given once, in ``data:``. At the end the script prints where the logs and checkpoints
are and the command that opens TensorBoard.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training.data import DecisionStreamDataModule  # noqa: E402
from training.module import DecisionMemoryModule  # noqa: E402


class DecisionMemoryCLI(LightningCLI):
    """LightningCLI with the stream's names linked into the model."""

    def add_arguments_to_parser(self, parser) -> None:
        for field, argument in (("category_names", "categories"), ("action_names", "actions"),
                                ("factor_names", "factors")):
            parser.link_arguments(f"data.{field}", f"model.{argument}", apply_on="instantiate")


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
