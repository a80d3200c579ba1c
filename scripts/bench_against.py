"""One decision at a time, this checkout against an earlier revision, in one process.

A change's cost on ``score_one`` + ``learn_one`` is a few percent, less than this shared
machine's load changes between two runs. So both versions run in one process, taking turns
decision by decision as :func:`scripts.bench_single.time_pair` has each memory and its numpy
transcription do: the revision's ``gae`` is copied out of git under another package name
(``gae_at_<rev>``, its imports rewritten) and each memory of ``scripts/bench_single.py`` is
built from both. Per repeat, the ratio of the p50s; reported, the median over repeats.

    python scripts/bench_against.py --rev 362a626
    python scripts/bench_against.py --rev HEAD~1 --memories '["gae k-NN"]' --repeats 9

A ratio of 1.03 means this checkout's decision takes 3% longer than the revision's. The
revision's numba kernels compile in a temporary folder on every run (a minute or two).
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_single import REFERENCES, contestants, decisions, time_pair  # noqa: E402

from training import cli  # noqa: E402

IMPORT = re.compile(r"\b(from|import) gae(\.|\b)")


def package_at(rev: str, into: Path) -> object:
    """The ``gae`` package of git revision ``rev``, imported as ``gae_at_<rev>`` from ``into``."""
    name = "gae_at_" + re.sub(r"\W", "_", rev)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "gae"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "gae").rename(into / name)
    for path in (into / name).rglob("*.py"):
        text = IMPORT.sub(lambda m: f"{m.group(1)} {name}{m.group(2)}", path.read_text())
        path.write_text(text.replace('"gae.', f'"{name}.'))
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def main() -> None:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", required=True, help="the git revision to compare against")
    parser.add_argument("--memories", default=None, help="a JSON list of memory names (default: all)")
    parser.add_argument("--decisions", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.repeats < 1 or args.decisions < 20:
        parser.error(f"--repeats must be >= 1 and --decisions >= 20, got {args.repeats} and {args.decisions}")
    stream = decisions(args.decisions)
    with tempfile.TemporaryDirectory() as folder:
        old = package_at(args.rev, Path(folder))
        mine, theirs = contestants(), contestants(old)
        names = list(REFERENCES) if args.memories is None else json.loads(args.memories)
        unknown = sorted(set(names) - set(REFERENCES))
        if unknown:
            parser.error(f"--memories: unknown {unknown}; choose among {list(REFERENCES)}")
        print(f"score_one + learn_one (retrieval: score_one alone), {args.decisions:,} decisions, "
              f"median of {args.repeats} repeats; this checkout against {args.rev}")
        for name in names:
            score_only = "retrieval" in name
            time_pair(mine[name](), theirs[name](), stream[:300], score_only)  # compile and warm, untimed
            p50s, ratios = [], []
            for _ in range(args.repeats):
                now, then = (np.percentile(ns[args.decisions // 10:], 50) / 1e3
                             for ns in time_pair(mine[name](), theirs[name](), stream, score_only))
                p50s.append((now, then))
                ratios.append(now / then)
            print(f"{name:30s} p50 {statistics.median(p[0] for p in p50s):7.2f} us, at {args.rev}: "
                  f"{statistics.median(p[1] for p in p50s):7.2f} us, ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
