"""Where the time of a batched ``JudgmentMemory.forward`` goes, and what this machine allows.

``memory(x, category)`` under ``torch.no_grad()`` on CPU validates the batch, prepares the
attention and the scoring state, allocates the four outputs and runs the compiled kernel
``gae.judgment.kernels.score``. This script times each part on its own, the whole call, and
reference limits of the machine, single-threaded (``OMP_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` are set to 1 before the imports, as in ``scripts/bench.py``), on
``bench.py``'s ``measure_scoring`` setup: C=4 categories x A=4 actions x K=8 factors, a memory
that learned a seeded 100,000-decision stream, uniform queries.

For each batch size B every measurement runs once per round, in turn, after an untimed
warm-up; the table has the median over rounds (the machine is shared and noisy, so the
measurements alternate rather than run one after another). Minor page faults per call come
from ``getrusage``.

Parts of the call:
    validate          ``memory._check_query`` (``check_factors`` + ``check_index``), and each alone
    prepare           the attention and the kernel's numpy views of the state (``_score_compiled``)
    allocate          ``torch.empty`` of the four outputs (no page touched yet)
    kernel (reused)   ``kernels.score`` into outputs written before: no page faults
    kernel (fresh)    ``torch.empty`` + ``kernels.score``: plus the first touch of any new pages
    forward           ``memory(x, category)``, the whole call; whether its outputs land on pages
                      touched before depends on the allocator's history (see the page faults)
    forward, every output page new   validate + prepare + the kernel into freshly mapped memory:
                      the call when the allocator hands out new pages, as in a fresh process
Limits of the machine, same run:
    copy              ``np.copyto`` of as many bytes as the call reads and writes (x, category, outputs)
    touch (reused)    a numba kernel that reads x and category and writes every output, no arithmetic
    touch (new pages) the same into freshly mapped anonymous memory: what first touch costs
    logits only       the kernel's arithmetic without the softmax (no exp, no normalisation)
What would meet the bar:
    forward, reused outputs   validate + prepare + kernel into reused outputs (an ``out=`` argument)
    forward, unchecked        prepare + allocate + kernel, no validation
    kernel, 2 threads         the (nogil) kernel on the two halves of the batch in two threads
    forward, 2 threads        validate + prepare + allocate + the two-thread kernel
    fresh process             ``forward`` in a new process (the allocator's default state), also
                              with ``THP_MEM_ALLOC_ENABLE=1`` (torch asks for huge pages), with
                              glibc told to keep freed memory (``MALLOC_MMAP_THRESHOLD_``,
                              ``MALLOC_TRIM_THRESHOLD_``), and told to map every large block
                              anew (the threshold fixed at its default, 128 KiB: the worst case)

``--against REF`` also times the kernel of ``gae/judgment/kernels/scoring.py`` at git revision
REF (kernel alone, inside ``forward``, and inside ``forward`` on new pages), alternating with
the current one, and says how far the two kernels' outputs are apart.

Without ``--quick`` it also regenerates the section between ``<!-- scoring-speed:start -->`` and
``<!-- scoring-speed:end -->`` of ``--doc`` (docs/scoring_speed.md) and commits its record to
docs/results/scoring-speed.json.

Usage: ``python scripts/profile_scoring.py [--quick] [--repeats N] [--against REF] [--out PATH] [--doc PATH]``
"""

from __future__ import annotations

import os

# Thread pools are sized when numpy, torch and numba are imported, so this must come first.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["NUMBA_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import llvmlite.binding  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gae import JudgmentConfig, JudgmentMemory  # noqa: E402
from gae import validation as check  # noqa: E402
from gae.judgment import kernels  # noqa: E402
from gae.types import MemoryOutput  # noqa: E402
from training import cli  # noqa: E402
from training.readme import publish_section  # noqa: E402

C, A, K = 4, 4, 8
TARGET = 20e6  # decisions/s at B = 1M, single-threaded: the project's bar
FULL_SIZES, QUICK_SIZES = (10_000, 100_000, 1_000_000), (10_000, 100_000)
CHILD_ENVIRONMENTS = {  # name -> variables added for a fresh process
    "fresh process": {},
    "fresh process, THP_MEM_ALLOC_ENABLE=1": {"THP_MEM_ALLOC_ENABLE": "1"},
    "fresh process, glibc keeps freed memory": {"MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                                                "MALLOC_TRIM_THRESHOLD_": str(1 << 31)},
    "fresh process, glibc maps new memory every call": {"MALLOC_MMAP_THRESHOLD_": str(1 << 17)},  # fixed: no reuse
}


# -- the setup of bench.py's measure_scoring ------------------------------------------------------
def make_stream(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded synthetic decisions as ``scripts/bench.py`` makes them: factors uniform in [0, 1]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, K, generator=generator)
    return x, torch.randint(0, C, (n,), generator=generator), torch.randint(0, A, (n,), generator=generator)


def trained_memory(n: int) -> JudgmentMemory:
    """A default memory that learned an n-decision stream (bench.py: n = 100,000)."""
    memory = JudgmentMemory(C, A, K, config=JudgmentConfig.seed())
    memory.prequential_(*make_stream(n))
    return memory


# -- the parts of forward ------------------------------------------------------------------------
def prepare(memory: JudgmentMemory, x: torch.Tensor, category: torch.Tensor) -> tuple:
    """The kernel's arguments but the outputs, as ``forward`` and ``_score_compiled`` build them."""
    alpha = memory.criterion_attention()
    return (x.detach().float().contiguous().numpy(), category.contiguous().numpy(),
            memory.scoring_centroids().contiguous().numpy(), memory.initialized.numpy(), memory.wins.numpy(),
            alpha.detach().float().contiguous().numpy(), kernels.Options.of(memory.config))


def allocate(n: int) -> MemoryOutput:
    """Fresh outputs, as ``_score_compiled`` allocates them."""
    return MemoryOutput(torch.empty(n, A), torch.empty(n, A), torch.empty(n, dtype=torch.int64), torch.empty(n))


def as_numpy(out: MemoryOutput) -> tuple:
    return tuple(t.numpy() for t in out)


def halves(args: tuple, out: tuple) -> list[tuple]:
    """The kernel's arguments for each half of the batch (views: x, category and the outputs)."""
    n = args[0].shape[0]
    cut = n // 2
    state = args[2:]
    return [(args[0][part], args[1][part], *state, tuple(o[part] for o in out))
            for part in (slice(0, cut), slice(cut, n))]


def in_two_threads(kernel, args: tuple, out: tuple) -> None:
    """The kernel on two halves of the batch at once; it releases the GIL (``nogil=True``)."""
    threads = [threading.Thread(target=kernel, args=half) for half in halves(args, out)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# -- reference kernels for the machine's limits --------------------------------------------------
@numba.njit(nogil=True, boundscheck=False)
def touch(x, category, logits, probs, action, confidence):  # pragma: no cover
    """Read every factor and category, write every output: the memory traffic of the call, no maths."""
    for b in range(x.shape[0]):
        total = np.float32(0.0)
        for k in range(x.shape[1]):
            total += x[b, k]
        for a in range(logits.shape[1]):
            logits[b, a] = total
            probs[b, a] = total
        action[b] = category[b]
        confidence[b] = total


@numba.njit(nogil=True, boundscheck=False, fastmath={"reassoc", "contract", "nsz", "arcp", "afn"})
def logits_only(x, category, estimates, initialized, alpha, tau, logits, probs, action, confidence):  # pragma: no cover
    """The scoring kernel's per-decision arithmetic (one prototype per action) and argmax, and
    every output written, but no softmax: ``probs`` gets ``logit - top``, ``confidence`` the top."""
    tau32 = np.float32(tau)
    for b in range(x.shape[0]):
        c = category[b]
        best = -1
        top = np.float32(-np.inf)
        for a in range(estimates.shape[1]):
            d = np.float32(0.0)
            for k in range(x.shape[1]):
                diff = x[b, k] - estimates[c, a, 0, k]
                d += alpha[c, k] * (diff * diff)
            logit = -d / tau32 if initialized[c, a, 0] else np.float32(-np.inf)
            logits[b, a] = logit
            if logit > top:
                top = logit
                best = a
        for a in range(estimates.shape[1]):
            probs[b, a] = logits[b, a] - top
        action[b] = best
        confidence[b] = top


def new_pages(n: int) -> tuple:
    """Outputs in freshly mapped anonymous memory, every page untouched (the mapping lives as long
    as the arrays)."""
    shapes = (((n, A), np.float32), ((n, A), np.float32), ((n,), np.int64), ((n,), np.float32))
    sizes = [int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in shapes]
    region = mmap.mmap(-1, sum(sizes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as malloc maps, not shared
    arrays, offset = [], 0
    for (shape, dtype), size in zip(shapes, sizes, strict=True):
        arrays.append(np.frombuffer(region, dtype, int(np.prod(shape)), offset).reshape(shape))
        offset += size
    return tuple(arrays)


# -- the kernel at another git revision -----------------------------------------------------------
def kernel_at(revision: str, folder: Path):
    """``score`` from ``gae/judgment/kernels/scoring.py`` at a git revision, imported from a copy."""
    source = subprocess.run(["git", "show", f"{revision}:gae/judgment/kernels/scoring.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = folder / "scoring_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("scoring_at_revision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's cache looks the module up by name
    spec.loader.exec_module(module)
    return module.score


@contextlib.contextmanager
def scoring_kernel(kernel):
    """``forward`` calls ``kernels.score`` through the package: swap it for the block."""
    current = kernels.score
    kernels.score = kernel
    try:
        yield
    finally:
        kernels.score = current


# -- timing ----------------------------------------------------------------------------------------
def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure_round(measurements: dict[str, Callable[[], object]], records: dict[str, dict]) -> None:
    """Each measurement once, in turn: its wall time and the minor page faults it caused."""
    for name, run in measurements.items():
        faults = minor_faults()
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        records[name]["seconds"].append(elapsed)
        records[name]["minor_faults"].append(minor_faults() - faults)


def summarise(n: int, record: dict) -> dict:
    median = statistics.median(record["seconds"])
    return {**record, "median_ms": median * 1e3, "per_second": n / median,
            "median_minor_faults": statistics.median(record["minor_faults"])}


def measure_batch(memory: JudgmentMemory, n: int, repeats: int, against) -> dict:
    """Every in-process measurement at batch size n, alternating over ``repeats`` rounds."""
    x, category, _ = make_stream(n, seed=1)
    args = prepare(memory, x, category)
    reused = as_numpy(allocate(n))
    spare = as_numpy(allocate(n))
    source = np.ones(sum(a.nbytes for a in (args[0], args[1], *reused)), np.uint8)
    target = np.empty_like(source)
    state = (args[2], args[3], args[5], memory.config.rule.tau)

    def forward():
        memory(x, category)

    def forward_reused():
        checked = memory._check_query(x, category)
        kernels.score(*prepare(memory, *checked), reused)

    def forward_new_pages(kernel=kernels.score):
        checked = memory._check_query(x, category)
        kernel(*prepare(memory, *checked), new_pages(n))

    def forward_unchecked():
        kernels.score(*prepare(memory, x, category), as_numpy(allocate(n)))

    def forward_two_threads():
        checked = memory._check_query(x, category)
        in_two_threads(kernels.score, prepare(memory, *checked), as_numpy(allocate(n)))

    measurements: dict[str, Callable[[], object]] = {
        "validate": lambda: memory._check_query(x, category),
        "validate: check_factors": lambda: check.check_factors(x, K, x.device),
        "validate: check_index": lambda: check.check_index(category, "category", C, n, x.device),
        "prepare": lambda: prepare(memory, x, category),
        "allocate": lambda: allocate(n),
        "kernel (reused outputs)": lambda: kernels.score(*args, reused),
        "kernel (fresh outputs)": lambda: kernels.score(*args, as_numpy(allocate(n))),
        "forward": forward,
        "forward, every output page new": forward_new_pages,
        "limit: copy": lambda: np.copyto(target, source),
        "limit: touch (reused outputs)": lambda: touch(args[0], args[1], *reused),
        "limit: touch (new pages)": lambda: touch(args[0], args[1], *new_pages(n)),
        "limit: logits only (no softmax)": lambda: logits_only(args[0], args[1], *state, *reused),
        "option: forward, reused outputs": forward_reused,
        "option: forward, unchecked": forward_unchecked,
        "option: kernel, 2 threads (reused outputs)": lambda: in_two_threads(kernels.score, args, spare),
        "option: forward, 2 threads": forward_two_threads,
    }
    if against is not None:
        revision, old_kernel = against

        def forward_old():
            with scoring_kernel(old_kernel):
                memory(x, category)

        measurements[f"kernel at {revision} (reused outputs)"] = lambda: old_kernel(*args, spare)
        measurements[f"forward with the kernel at {revision}"] = forward_old
        measurements[f"forward, every output page new, kernel at {revision}"] = lambda: forward_new_pages(old_kernel)
    records: dict[str, dict] = {name: {"seconds": [], "minor_faults": []} for name in measurements}
    with torch.no_grad():
        for run in measurements.values():  # warm-up: compiled code loaded, caches filled
            run()
        for _ in range(repeats):
            measure_round(measurements, records)
    result = {name: summarise(n, record) for name, record in records.items()}
    if against is not None:
        result["agreement"] = agreement(kernels.score, against[1], args, n)
    result["limit: copy"]["bytes"] = int(source.nbytes)
    result["limit: copy"]["gb_per_second"] = source.nbytes / statistics.median(records["limit: copy"]["seconds"]) / 1e9
    return result


def agreement(kernel, other, args: tuple, n: int) -> dict:
    """How far two kernels' outputs on the same batch are apart: the largest absolute difference
    of each output, and whether logits and actions are identical."""
    first, second = as_numpy(allocate(n)), as_numpy(allocate(n))
    kernel(*args, first)
    other(*args, second)
    largest = {name: float(np.where(a == b, 0.0, np.abs(a.astype(np.float64) - b)).max())  # -inf == -inf: 0
               for name, a, b in zip(MemoryOutput._fields, first, second, strict=True)}
    return {"max_abs_difference": largest, "logits_identical": bool(np.array_equal(first[0], second[0])),
            "actions_identical": bool(np.array_equal(first[2], second[2]))}


def child_forward(n: int, calls: int, training: int) -> dict:
    """In this (fresh) process: ``forward`` ``calls`` times at batch size n, each call's time and faults."""
    torch.set_num_threads(1)
    memory = trained_memory(training)
    x, category, _ = make_stream(n, seed=1)
    record: dict[str, list] = {"seconds": [], "minor_faults": []}
    with torch.no_grad():
        for _ in range(calls):
            measure_round({"forward": lambda: memory(x, category)}, {"forward": record})
    later = record["seconds"][1:]  # the first call also loads the compiled kernel
    return {**record, "median_ms_after_first": statistics.median(later) * 1e3,
            "per_second_after_first": n / statistics.median(later),
            "median_minor_faults_after_first": statistics.median(record["minor_faults"][1:])}


def measure_fresh_processes(n: int, calls: int, training: int) -> dict:
    """``forward`` in a new process per allocator setting (the setting must be there at start)."""
    results = {}
    for name, variables in CHILD_ENVIRONMENTS.items():
        progress(f"{name}: forward x {calls} at B={n:,}")
        command = [sys.executable, __file__, "--child-forward", str(n), "--repeats", str(calls),
                   "--training", str(training)]
        done = subprocess.run(command, env={**os.environ, **variables}, check=True, capture_output=True, text=True)
        results[name] = {"environment": variables, **json.loads(done.stdout.strip().splitlines()[-1])}
    return results


# -- report ----------------------------------------------------------------------------------------
def progress(message: str) -> None:
    """One line of progress on stderr, so stdout stays the table."""
    print(f"[profile] {message}", file=sys.stderr, flush=True)


def table(by_size: dict[int, dict], children: dict, largest: int) -> str:
    """Markdown: per measurement, median ms and decisions/s at each B, and page faults at the largest."""
    sizes = sorted(by_size)
    head = ["measurement"] + [f"B={n:,} ms" for n in sizes] + [f"B={largest:,} M/s", "faults/call"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name in (name for name in by_size[largest] if name != "agreement"):
        cells = [f"{by_size[n][name]['median_ms']:.3f}" if name in by_size[n] else "" for n in sizes]
        top = by_size[largest][name]
        rate = f"{top['per_second'] / 1e6:.1f}" if not name.startswith(("validate", "prepare", "allocate")) else ""
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {rate} | {top['median_minor_faults']:.0f} |")
    for name, child in children.items():
        cells = [""] * (len(sizes) - 1) + [f"{child['median_ms_after_first']:.3f}",
                                           f"{child['per_second_after_first'] / 1e6:.1f}",
                                           f"{child['median_minor_faults_after_first']:.0f}"]
        rows.append(f"| {name} (calls 2..) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def machine() -> str:
    """One line naming the machine and software the numbers come from."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or platform.machine()) \
        if Path("/proc/cpuinfo").exists() else platform.machine()
    return (f"{model}, {os.cpu_count()} CPUs, numba {numba.__version__} ({llvmlite.binding.get_host_cpu_name()}), "
            f"torch {torch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, 1 thread")


def section(record: dict) -> str:
    """docs/scoring_speed.md's generated section, rendered from a ``--out`` record: the table and
    what follows from it."""
    by_size = {int(n): result for n, result in record["batches"].items()}
    largest = max(by_size)
    at = by_size[largest]

    def ms(name: str) -> float:
        return at[name]["median_ms"]

    def rate(name: str) -> str:
        return f"{at[name]['per_second'] / 1e6:.1f} M/s"

    copy, target = at["limit: copy"], record["target_per_second"] / 1e6
    kernel, touch = ms("kernel (reused outputs)"), ms("limit: touch (reused outputs)")
    first_touch = ms("limit: touch (new pages)") - touch
    faults = at["limit: touch (new pages)"]["median_minor_faults"]
    lines = [table(by_size, record["fresh_processes"], largest), "",
             f"At B = {largest:,} (the bar: {target:.0f} M/s on one thread):", "",
             f"- the whole call: {rate('forward')}; when every output page is new: "
             f"{rate('forward, every output page new')};",
             f"- the kernel into outputs written before: {kernel:.1f} ms, against {touch:.1f} ms to read the "
             f"inputs and write the outputs with no arithmetic and {ms('limit: copy'):.1f} ms to copy the call's "
             f"{copy['bytes'] / 1e6:.0f} MB ({copy['gb_per_second']:.1f} GB/s): it is bound by its arithmetic, "
             f"of which the softmax is {kernel - ms('limit: logits only (no softmax)'):.1f} ms;",
             f"- a page's first touch costs {first_touch * 1e3 / max(faults, 1):.1f} us ({faults:,.0f} pages of "
             f"outputs: {first_touch:.1f} ms when all are new);",
             f"- two threads make the kernel {kernel / ms('option: kernel, 2 threads (reused outputs)'):.2f} times "
             "faster;",
             ]
    if f"kernel at {record.get('against')} (reused outputs)" in at:
        old = at[f"kernel at {record['against']} (reused outputs)"]["median_ms"]
        lines.append(f"- the kernel before this one (`{record['against']}`): {old:.1f} ms "
                     f"({old / kernel:.2f} times this one's);")
    lines[-1] = lines[-1][:-1] + "."
    lines += ["", f"Measured on {record['machine']}; git {record['git']}; {record['repeats']} rounds, medians; "
              f"load average {record['load_average']['before'][0]:.2f} before, "
              f"{record['load_average']['after'][0]:.2f} after. Regenerate with `python {record['command']}`."]
    return "\n".join(lines)


def revision() -> str:
    """The checkout's commit, with '+changes' when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout
    return head.strip() + ("+changes" if dirty.strip() else "")


def main() -> None:
    """Parse the flags, run every measurement, print the table, write the JSON."""
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="B up to 100,000, 3 rounds, a memory trained on 10,000 decisions: a smoke test")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per batch size (default 15, --quick 3)")
    parser.add_argument("--against", metavar="REF", help="also time the kernel at this git revision")
    parser.add_argument("--out", type=Path, default=Path("results/profile/scoring.json"), help="JSON output")
    parser.add_argument("--doc", type=Path, default=Path("docs/scoring_speed.md"),
                        help="page whose scoring-speed section is regenerated (never with --quick)")
    parser.add_argument("--training", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-forward", type=int, metavar="B", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 15)
    training = args.training if args.training is not None else (10_000 if args.quick else 100_000)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    if args.child_forward is not None:
        print(json.dumps(child_forward(args.child_forward, repeats, training)))
        return

    torch.set_num_threads(1)
    began, load_before = time.perf_counter(), os.getloadavg()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    memory = trained_memory(training)
    with tempfile.TemporaryDirectory() as folder:
        against = (args.against, kernel_at(args.against, Path(folder))) if args.against else None
        by_size = {}
        for n in sizes:
            progress(f"B={n:,}: {repeats} rounds")
            by_size[n] = measure_batch(memory, n, repeats, against)
    largest = max(sizes)
    children = measure_fresh_processes(largest, max(repeats // 2, 3) + 1, training)
    load_after, elapsed = os.getloadavg(), time.perf_counter() - began

    print(table(by_size, children, largest))
    copy = by_size[largest]["limit: copy"]
    print(f"\ncopy: {copy['bytes'] / 1e6:.0f} MB at {copy['gb_per_second']:.1f} GB/s; bar: {TARGET / 1e6:.0f} M/s "
          f"at B=1,000,000; forward at B={largest:,}: {by_size[largest]['forward']['per_second'] / 1e6:.1f} M/s")
    if args.against:
        for n in sizes:
            same = by_size[n]["agreement"]
            print(f"B={n:,}, against {args.against}: logits identical {same['logits_identical']}, actions identical "
                  f"{same['actions_identical']}, largest |difference| "
                  + ", ".join(f"{name} {value:.3g}" for name, value in same["max_abs_difference"].items()))
    print(f"{machine()}; git {revision()}; {repeats} rounds, medians; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; total {elapsed:.0f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["scripts/profile_scoring.py", *sys.argv[1:]])
    record = {"machine": machine(), "git": revision(), "command": command,
              "quick": args.quick, "repeats": repeats, "training_decisions": training, "against": args.against,
              "shape": {"categories": C, "actions": A, "factors": K}, "target_per_second": TARGET,
              "load_average": {"before": load_before, "after": load_after}, "total_seconds": elapsed,
              "batches": {str(n): result for n, result in by_size.items()}, "fresh_processes": children}
    args.out.write_text(json.dumps(record, indent=2))
    progress(f"wrote {args.out}")
    if not args.quick and publish_section(args.doc, "scoring-speed", record, section):
        progress(f"updated {args.doc} and its record in docs/results/")


if __name__ == "__main__":
    main()
