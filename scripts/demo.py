"""Stream 2,000 synthetic verified decisions through JudgmentMemory and KNNMemory.

Both memories see the same stream and score every decision before learning from it
(prequential evaluation). The script prints their accuracy over the stream and, for a few
decisions, what the judgment memory saw: the distance to every prototype and its confidence.

    python scripts/demo.py

The stream is :class:`training.streams.DecisionStream` (the head-to-head's generator, here
without drift or label noise).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import JudgmentMemory, KNNMemory  # noqa: E402
from training.streams import DecisionStream  # noqa: E402

CATEGORIES = ["invoice", "refund", "vendor", "payroll"]
ACTIONS = ["approve", "review", "escalate", "reject"]
FACTORS = ["amount", "vendor_age", "mismatch", "urgency", "history", "region", "weekday", "channel"]
INFORMATIVE = 5  # five factors of each category depend on the right action; the rest are noise
N, SEED = 2000, 0


def main() -> None:
    stream = DecisionStream(N, categories=CATEGORIES, actions=ACTIONS, factors=FACTORS, informative=INFORMATIVE,
                            label_noise=0.0, uncertain=0.05, seed=SEED).tensors()
    x, category, truth, uncertain = stream.x, stream.category, stream.truth, stream.skip
    factories = {
        "JudgmentMemory": lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS),
        "KNNMemory (k=5, cap 400)": lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=400,
                                                      categories=CATEGORIES),
    }
    print(f"{N} decisions, {len(CATEGORIES)} categories, {len(FACTORS)} factors ({INFORMATIVE} informative), "
          f"{len(ACTIONS)} actions; every decision scored before it is learned\n")
    memories, steps, seconds = {}, {}, {}
    for name, factory in factories.items():
        factory().prequential_(x[:1], category[:1], truth[:1])  # compile the kernel outside the timing
        memories[name] = memory = factory()
        start = time.perf_counter()
        steps[name] = memory.prequential_(x, category, truth, skip=uncertain)
        seconds[name] = time.perf_counter() - start
    judgment, knn = memories.values()

    print(f"{'memory':<26}{'accuracy':>10}{'first 500':>11}{'last 500':>10}{'abstained':>11}{'us/decision':>13}")
    for name, step in steps.items():
        correct = (step.output.action == truth).float()  # abstentions count as wrong
        print(f"{name:<26}{correct.mean():>10.3f}{correct[:500].mean():>11.3f}{correct[-500:].mean():>10.3f}"
              f"{int((step.output.action < 0).sum()):>11}{1e6 * seconds[name] / N:>13.2f}")

    step = steps["JudgmentMemory"]
    attention = judgment.criterion_attention().detach()
    print("\nJudgmentMemory, a few decisions: weighted distance to each prototype at scoring time")
    print(f"{'#':>5} {'category':<9}{'truth':<10}" + "".join(f"{a:>10}" for a in ACTIONS) + f"  {'-> action':<12}conf")
    for i in (3, 50, 500, 1500, 1999):
        c = int(category[i])
        distance = (step.sq_diff[i] * attention[c]).sum(-1)
        cells = "".join(f"{float(d):>10.3f}" if torch.isfinite(step.output.logits[i, a]) else f"{'-':>10}"
                        for a, d in enumerate(distance))
        action = int(step.output.action[i])
        print(f"{i:>5} {CATEGORIES[c]:<9}{ACTIONS[int(truth[i])]:<10}{cells}  "
              f"{ACTIONS[action] if action >= 0 else 'abstain':<12}{float(step.output.confidence[i]):.3f}")
    gated = step.events.gated
    print(f"\ngate events: {int(gated.sum())} of {int(step.events.applied.sum())} updates; "
          f"judgment state: {judgment.parameter_inventory()['total']} numbers, "
          f"k-NN state: {knn.parameter_inventory()['total']} numbers")


if __name__ == "__main__":
    main()
