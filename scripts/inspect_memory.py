"""Print what a saved JudgmentMemory holds: prototypes, attention, gate events and explanations.

    python scripts/inspect_memory.py memory.pt                         # a JudgmentMemory state_dict
    python scripts/inspect_memory.py lightning_logs/default/version_0/checkpoints/last.ckpt
    python scripts/inspect_memory.py last.ckpt --category invoice --explain '0.9,0.1,0.5,0.2,0.3,0.4,0.5,0.6'
    python scripts/inspect_memory.py last.ckpt --trace 'invoice,approve'

Reads the file with ``torch.load(weights_only=True)`` (nothing in it is executed). A Lightning
checkpoint's memory is the one under ``memory.``; its hyperparameters rebuild it. A bare
state_dict is rebuilt from the names, drift mode and prototype count it carries (its other
hyperparameters, such as tau, take the defaults unless given with ``--tau``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import JudgmentMemory  # noqa: E402
from training.module import saved_config  # noqa: E402


def load_memory(path: Path, tau: float | None = None) -> JudgmentMemory:
    """The JudgmentMemory saved in ``path`` (a state_dict or a Lightning checkpoint)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated, tampered or foreign file: say what it is, never execute it
        raise SystemExit(f"{path}: not a loadable checkpoint ({type(error).__name__}: {error})") from None
    hparams: dict[str, Any] = {}
    if isinstance(saved, dict) and "state_dict" in saved:  # Lightning
        hparams = saved.get("hyper_parameters", {})
        saved = {key[len("memory."):]: value for key, value in saved["state_dict"].items()
                 if key.startswith("memory.")}
    extra = saved.get("_extra_state") if isinstance(saved, dict) else None
    if not isinstance(extra, dict) or "category_names" not in extra:
        raise SystemExit(f"{path}: no JudgmentMemory state in it (expected its state_dict or a Lightning checkpoint)")
    config = saved_config(extra, hparams)
    if tau is not None:
        config = config.replace(tau=tau)
    memory = JudgmentMemory(extra["category_names"], extra["action_names"], extra["factor_names"], config)
    memory.load_state_dict(saved)
    return memory


def report(memory: JudgmentMemory, category: str | None, explain: str | None, trace: str | None,
           events: int) -> str:
    names = memory.category_names
    chosen = [category] if category is not None else list(names)
    lines = [repr(memory), "", f"{int(memory.num_decisions)} decisions learned, "
             f"{len(memory.decision_log)} in the decision log", ""]
    attention = memory.criterion_attention().detach()
    for name in chosen:
        c = names.index(name)
        lines.append(f"## {names[c]}")
        lines.append("attention: " + ", ".join(f"{f}={float(w):.3f}" for f, w in zip(memory.factor_names,
                                                                                      attention[c], strict=True)))
        for a, action in enumerate(memory.action_names):
            for p in range(memory.config.prototypes):
                if bool(memory.initialized[c, a, p]):
                    row = ", ".join(f"{float(v):.3f}" for v in memory.centroids[c, a, p])
                    slot = f" [{p}]" if memory.config.prototypes > 1 else ""
                    lines.append(f"  {action}{slot}: ({row})  updates={int(memory.counts[c, a, p])}")
        lines.append("")
    records = memory.gate_records()
    shown = records[len(records) - min(events, len(records)):]  # (records[-0:] would be all of them)
    lines.append(f"{len(records)} learning events (gate, promotions, recycles); the last {len(shown)}"
                 + (":" if shown else ""))
    lines += event_table(shown)
    if explain is not None:
        values = [float(v) for v in explain.split(",")]
        lines += ["", str(memory.explain(values, chosen[0]))]
    if trace is not None:
        category_name, action_name = trace.split(",")
        found = memory.trace(category_name, action_name)
        lines += ["", f"the decisions that shaped {category_name}/{action_name} most (source id: weight):"]
        lines += [f"  {int(s)}: {float(w):.4f}" for s, w in zip(found.source_ids, found.weights, strict=True)]
    return "\n".join(lines)


def event_table(records: list[dict]) -> list[str]:
    """Learning events as the lines of a table: one column per field (in order of first use),
    numbers rounded to 4 significant digits, a blank where an event lacks the field."""
    if not records:
        return []
    columns = list(dict.fromkeys(key for record in records for key in record))

    def cell(value: object) -> str:
        return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(record.get(column)) for column in columns] for record in records]
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(columns)]
    return ["  " + "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
            for row in [columns, *cells]]


def _count(text: str) -> int:
    """An int >= 0 for ``--events`` (argparse names the option and the value otherwise)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a JudgmentMemory state_dict or a Lightning checkpoint")
    parser.add_argument("--category", help="show this category only (and explain in it)")
    parser.add_argument("--explain", help="comma-separated factors of one decision to explain")
    parser.add_argument("--trace", help="'category,action': the decisions that shaped that prototype")
    parser.add_argument("--events", type=_count, default=20,
                        help="learning events to list, newest last (an int >= 0, default 20; 0 lists none)")
    parser.add_argument("--tau", type=float, help="the memory's tau, for a bare state_dict")
    args = parser.parse_args(argv)
    memory = load_memory(args.checkpoint, args.tau)
    text = report(memory, args.category, args.explain, args.trace, args.events)
    print(text)
    return text


if __name__ == "__main__":
    main()
