"""Replay an evaluation trace from a checkpoint: every answer recomputed, every removal's effect listed.

    python scripts/replay_trace.py results/trace.jsonl results/trace.checkpoints/permute-jm.pt
    python scripts/replay_trace.py trace.jsonl start.pt --json replay.json

The checkpoint is one :func:`gae.traces.writer.save_checkpoint` wrote (``TraceWriter(...,
checkpoint=)``, ``scripts/evaluate.py --trace``, the Lightning loop's ``trace``); it is read
with ``torch.load(weights_only=True)``. Every run of the trace that passes through its state
is replayed. Exits with status 1 when a line is not reproduced exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae.traces.replay import ReplayReport, replay  # noqa: E402
from gae.traces.writer import load_checkpoint  # noqa: E402
from training.cli import auto_cli  # noqa: E402

SHOWN = 20  # rows of each listing printed (the JSON report has them all)


def replay_trace(trace: Path, checkpoint: Path, json_out: Path | None = None) -> ReplayReport:
    """Replay ``trace`` from ``checkpoint`` and print what was checked and what a removal changes.

    Args:
        trace: the JSONL trace.
        checkpoint: the memory state to start from.
        json_out: also write the whole report as JSON here.
    """
    actions = load_checkpoint(checkpoint)[0].action_names
    result = replay(trace, checkpoint)
    if result.checked == 0:
        print("the runs that pass through this checkpoint have no decision lines after it: nothing to check")
    print(f"replayed {len(result.runs)} run(s) ({', '.join(result.runs) or '-'}): {result.checked} decisions "
          f"recomputed, {len(result.mismatches)} mismatches")
    for mismatch in result.mismatches[:SHOWN]:
        print(f"  MISMATCH run {mismatch.run!r} line {mismatch.line}: {mismatch.field} traced {mismatch.traced!r}, "
              f"replayed {mismatch.replayed!r}")

    def name(action: int | None) -> str:
        return "(abstain)" if action is None else actions[action]

    for removal in result.removals:
        print(f"\nrun {removal.run!r} line {removal.line}: {removal.kind} {removal.ids} changes "
              f"{len(removal.changed)} earlier answer(s)")
        if removal.changed:
            print("  | line | decision | answered | would answer now |\n  |---:|---:|---|---|")
            for change in removal.changed[:SHOWN]:
                print(f"  | {change.line} | {change.id} | {name(change.answer)} | {name(change.now)} |")
            if len(removal.changed) > SHOWN:
                print(f"  ... and {len(removal.changed) - SHOWN} more")
    if json_out is not None:
        json_out.write_text(json.dumps({
            "runs": result.runs, "checked": result.checked, "ok": result.ok,
            "mismatches": [m._asdict() for m in result.mismatches],
            "removals": [{**r._asdict(), "changed": [c._asdict() for c in r.changed]} for r in result.removals]},
            indent=2))
    return result


def main() -> None:
    import torch

    torch.set_num_threads(1)  # one decision at a time: thread hand-offs would cost more than they save
    result = auto_cli(replay_trace)
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
