"""Stream 2,000 synthetic verified decisions through gae's judgment memory and a k-NN.

Three memories see the same stream and score every decision before learning from it
(prequential evaluation): gae's judgment memory as ``JudgmentMemory`` builds it by default
(``JudgmentConfig.recommended()``), the original design's seed rule (``JudgmentConfig.seed()``)
and a k-NN over the last 400 decisions. The script prints each one's accuracy, what the
recommended judgment answered for a few decisions, and the outcome in one sentence.

    python scripts/demo.py
    python scripts/demo.py --decisions 500 --seed 3

The stream is :class:`training.streams.DecisionStream` (the head-to-head's generator, here
without drift or label noise).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from gae import JudgmentConfig, JudgmentMemory, KNNMemory  # noqa: E402
from training import cli  # noqa: E402
from training.streams import DecisionStream  # noqa: E402

CATEGORIES = ["invoice", "refund", "vendor", "payroll"]
ACTIONS = ["approve", "review", "escalate", "reject"]
FACTORS = ["amount", "vendor_age", "mismatch", "urgency", "history", "region", "weekday", "channel"]
INFORMATIVE = 5  # five factors of each category depend on the right action; the rest are noise
RECOMMENDED, SEED_RULE, KNN = "gae judgment, recommended", "gae judgment, seed rule", "k-NN (k=5, last 400)"
MEMORIES = {  # name: (what it is, a fresh one)
    RECOMMENDED: ("JudgmentMemory(categories, actions, factors): JudgmentConfig.recommended(), the default",
                  lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS)),
    SEED_RULE: ("JudgmentMemory(..., config=JudgmentConfig.seed()): the original design's gated rule",
                lambda: JudgmentMemory(CATEGORIES, ACTIONS, FACTORS, config=JudgmentConfig.seed())),
    KNN: ("KNNMemory(k=5, capacity=400): a vote of the 5 nearest of the last 400 decisions",
          lambda: KNNMemory(factors=FACTORS, actions=ACTIONS, k=5, capacity=400, categories=CATEGORIES)),
}


def conclusion(accuracy: dict[str, float], n: int) -> str:
    """The run in one sentence, from its numbers."""
    best = max(accuracy, key=accuracy.__getitem__)
    return (f"In short: on {n:,} decisions, gae's recommended judgment was right {100 * accuracy[RECOMMENDED]:.1f}% "
            f"of the time, the k-NN {100 * accuracy[KNN]:.1f}% and the seed rule {100 * accuracy[SEED_RULE]:.1f}%; "
            f"the most accurate here: {best}.")


def main(argv: list[str] | None = None) -> None:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=cli.int_at_least(100), default=2000, help="decisions in the stream")
    parser.add_argument("--seed", type=cli.int_at_least(0), default=0, help="the stream's seed")
    args = parser.parse_args(argv)
    n = args.decisions
    stream = DecisionStream(n, categories=CATEGORIES, actions=ACTIONS, factors=FACTORS, informative=INFORMATIVE,
                            label_noise=0.0, uncertain=0.05, seed=args.seed).tensors()
    x, category, truth, uncertain = stream.x, stream.category, stream.truth, stream.skip
    print(f"{n:,} decisions, {len(CATEGORIES)} categories, {len(FACTORS)} factors ({INFORMATIVE} informative), "
          f"{len(ACTIONS)} actions; every decision scored before it is learned\n")
    print("The contestants:")
    for name, (what, _) in MEMORIES.items():
        print(f"  {name:<28}{what}")
    memories, steps, seconds = {}, {}, {}
    for name, (_, factory) in MEMORIES.items():
        factory().prequential_(x[:1], category[:1], truth[:1])  # compile the kernels outside the timing
        memories[name] = memory = factory()
        start = time.perf_counter()
        steps[name] = memory.prequential_(x, category, truth, skip=uncertain)
        seconds[name] = time.perf_counter() - start

    quarter = n // 4
    print(f"\n{'memory':<28}{'accuracy':>10}{f'first {quarter}':>11}{f'last {quarter}':>10}{'abstained':>11}"
          f"{'us/decision':>13}{'state (numbers)':>17}")
    accuracy = {}
    for name, step in steps.items():
        correct = (step.output.action == truth).float()  # abstentions count as wrong
        accuracy[name] = float(correct.mean())
        print(f"{name:<28}{correct.mean():>10.3f}{correct[:quarter].mean():>11.3f}{correct[-quarter:].mean():>10.3f}"
              f"{int((step.output.action < 0).sum()):>11}{1e6 * seconds[name] / n:>13.2f}"
              f"{memories[name].parameter_inventory()['total']:>17,}")

    step = steps[RECOMMENDED]
    print(f"\n{RECOMMENDED}, a few decisions: each action's probability when the decision was scored")
    print(f"{'#':>5} {'category':<9}{'truth':<10}" + "".join(f"{a:>10}" for a in ACTIONS) + f"  {'-> action':<12}conf")
    for i in sorted({3, 50, n // 4, (3 * n) // 4, n - 1}):
        c, action = int(category[i]), int(step.output.action[i])
        cells = "".join(f"{float(p):>10.3f}" for p in step.output.probs[i])
        print(f"{i:>5} {CATEGORIES[c]:<9}{ACTIONS[int(truth[i])]:<10}{cells}  "
              f"{ACTIONS[action] if action >= 0 else 'abstain':<12}{float(step.output.confidence[i]):.3f}")
    seed_events = steps[SEED_RULE].events
    print(f"\n{SEED_RULE}: its gate damped {int(seed_events.gated.sum())} of {int(seed_events.applied.sum())} updates "
          "(a decision far from its prototype moves it at half the step)")
    print(f"\n{conclusion(accuracy, n)}")


if __name__ == "__main__":
    main()
