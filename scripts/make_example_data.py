"""Write the example decision files that ship in data/: one synthetic stream as CSV and as JSONL.

    python scripts/make_example_data.py              # rewrites data/example_decisions.{csv,jsonl}
    python scripts/make_example_data.py --out DIR

The 200 decisions are ``DecisionStream(**EXAMPLE)``: four categories, four actions, eight
factors (four informative per category), 10% label noise, 5% uncertain outcomes and a
permutation drift at decision 100, one decision a minute from 2025-01-01 UTC. Factors are
written with six decimals; ``confirmed`` is empty (unknown) and the outcome of a decision
with ``skip`` is ``uncertain``. Both files hold the same values and read back alike with
``FileDecisionStream(path, factors=FACTORS, truth_column="truth")``.
"""

from __future__ import annotations

import csv
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import cli  # noqa: E402
from training.streams import DecisionStream  # noqa: E402

FACTORS = ["amount", "vendor_age", "mismatch", "urgency", "history", "region", "weekday", "channel"]
EXAMPLE: dict[str, Any] = dict(n_decisions=200, categories=["invoice", "refund", "vendor", "payroll"],
               actions=["approve", "review", "escalate", "reject"], factors=FACTORS, drift_at=100, seed=0,
               start_time=datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp(), interval=60.0, id_offset=1000)
COLUMNS = ["id", "timestamp", "category", "action", "truth", "confirmed", "outcome", *FACTORS]


def records(stream: DecisionStream) -> list[dict]:
    """One dict per decision, in the files' column order; None is an empty cell or JSON null."""
    data = stream.tensors()
    rows = []
    for i in range(len(stream)):
        time = datetime.fromtimestamp(float(data.timestamp[i]), tz=timezone.utc)
        rows.append({
            "id": int(data.id[i]), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "category": stream.category_names[int(data.category[i])],
            "action": stream.action_names[int(data.action[i])], "truth": stream.action_names[int(data.truth[i])],
            "confirmed": None, "outcome": "uncertain" if data.skip[i] else "verified",
            # rounded once, so that the CSV text and the JSON number are the same float
            **{name: float(f"{float(v):.6f}") for name, v in zip(FACTORS, data.x[i], strict=True)}})
    return rows


def write(out: Path) -> None:
    rows = records(DecisionStream(**EXAMPLE))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "example_decisions.csv", "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else f"{v:.6f}" if k in FACTORS else v) for k, v in row.items()}
                         for row in rows)
    with open(out / "example_decisions.jsonl", "w", encoding="utf-8") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    parser = cli.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="folder to write the two files to")
    write(parser.parse_args().out)
