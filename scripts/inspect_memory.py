"""Print what a saved JudgmentMemory holds: prototypes, attention, gate events and explanations.

    python scripts/inspect_memory.py memory.pt                         # a JudgmentMemory state_dict
    python scripts/inspect_memory.py lightning_logs/default/version_0/checkpoints/last.ckpt
    python scripts/inspect_memory.py last.ckpt --memory recommended
    python scripts/inspect_memory.py last.ckpt --category invoice --explain '0.9,0.1,0.5,0.2,0.3,0.4,0.5,0.6'
    python scripts/inspect_memory.py last.ckpt --trace 'invoice,approve'

Reads the file with ``torch.load(weights_only=True)`` (nothing in it is executed). A Lightning
checkpoint holds a judgment memory per name (``memories.<name>.``; ``--memory`` picks one, the
first by default; a checkpoint written before that has one, under ``memory.``); the config each
memory records rebuilds it. A bare
state_dict is rebuilt from the names, drift mode and prototype count it carries (its other
hyperparameters, such as tau, take the defaults unless given with ``--tau``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import JudgmentMemory  # noqa: E402
from training import cli  # noqa: E402
from training.module import saved_config  # noqa: E402


def lightning_memories(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The judgment memories' states in a Lightning checkpoint's ``state``, by name (``memories.<name>.``;
    an earlier checkpoint's one memory, under ``memory.``, as ``jm``)."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith("memories."):
            name, _, rest = key[len("memories."):].partition(".")
            found.setdefault(name, {})[rest] = value
        elif key.startswith("memory."):
            found.setdefault("jm", {})[key[len("memory."):]] = value
    return found


def load_memory(path: Path, tau: float | None = None, name: str | None = None) -> JudgmentMemory:
    """The JudgmentMemory saved in ``path`` (a state_dict, or a Lightning checkpoint's memory ``name``,
    its first by default)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated, tampered or foreign file: say what it is, never execute it
        raise SystemExit(f"{path}: not a loadable checkpoint ({type(error).__name__}: {error})") from None
    hparams: dict[str, Any] = {}
    if isinstance(saved, dict) and "state_dict" in saved:  # Lightning
        hparams = saved.get("hyper_parameters", {})
        memories = lightning_memories(saved["state_dict"])
        if name is not None and name not in memories:
            raise SystemExit(f"{path}: no judgment memory named {name!r}; it holds {sorted(memories) or 'none'}")
        saved = memories[name] if name is not None else next(iter(memories.values()), {})
    elif name is not None:
        raise SystemExit(f"--memory {name}: {path} is a bare state_dict of one memory, not a Lightning checkpoint")
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
            for p in range(memory.config.slots.prototypes):
                if bool(memory.initialized[c, a, p]):
                    row = ", ".join(f"{float(v):.3f}" for v in memory.centroids[c, a, p])
                    slot = f" [{p}]" if memory.config.slots.prototypes > 1 else ""
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


def main(argv: list[str] | None = None) -> str:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a JudgmentMemory state_dict or a Lightning checkpoint")
    parser.add_argument("--memory", help="the judgment memory of a Lightning checkpoint to show (its name, e.g. "
                        "recommended; default: the first)")
    parser.add_argument("--category", help="show this category only (and explain in it)")
    parser.add_argument("--explain", help="comma-separated factors of one decision to explain")
    parser.add_argument("--trace", help="'category,action': the decisions that shaped that prototype")
    parser.add_argument("--events", type=cli.int_at_least(0), default=20,
                        help="learning events to list, newest last (an int >= 0, default 20; 0 lists none)")
    parser.add_argument("--tau", type=cli.number_in(0, low_open=True),
                        help="the memory's tau (> 0), for a bare state_dict")
    args = parser.parse_args(argv)
    memory = load_memory(args.checkpoint, args.tau, args.memory)
    if args.category is not None and args.category not in memory.category_names:
        parser.error(f"--category {args.category}: not a category of this memory; its categories are "
                     f"{', '.join(memory.category_names)}")
    text = report(memory, args.category, args.explain, args.trace, args.events)
    print(text)
    return text


if __name__ == "__main__":
    main()
