"""Compare two head-to-head ``report.json`` files, latencies and wall times aside.

    python scripts/compare_reports.py BEFORE/report.json AFTER/report.json

Prints every differing value (accuracies, CIs, bars, claims) and exits 1 if there is one; a
refactoring that changes no behaviour leaves nothing to print. What is set aside: the keys that
measure time (``latency*``, ``*_us``, ``seconds``, ``*_per_second``) and the contestants'
descriptions (their option lists grow when options are added).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TIMED = ("latency", "_us", "seconds", "per_second")
DESCRIPTIVE = ("contestants",)


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Every leaf where ``before`` and ``after`` differ, as ``path: before -> after``."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after)):
            if any(part in key for part in TIMED) or (not path and key in DESCRIPTIVE):
                continue
            if key not in before or key not in after:
                out.append(f"{path}/{key}: only in {'after' if key not in before else 'before'}")
                continue
            out += differences(before[key], after[key], f"{path}/{key}")
        return out
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} items -> {len(after)}"]
        return [line for i, (b, a) in enumerate(zip(before, after, strict=True))
                for line in differences(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    before, after = (json.loads(Path(name).read_text()) for name in argv)
    found = differences(before, after)
    for line in found:
        print(line)
    print(f"{len(found)} differences (latencies and wall times aside)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
