"""gae's layers, read from its own imports: the drawing in docs/architecture.md and the check that
every import points down.

Each module of ``gae`` belongs to one layer (:data:`LAYERS`, lowest first); a module may import
modules of its own layer or of layers below, never above, and no module may import itself back
through others (an import circle). The import graph is read from the source with :mod:`ast`, not
by importing it (:func:`graph`). ``python scripts/architecture.py`` prints every import that
breaks the order (exit 1 if any) and, with ``--figure``, draws the layers with the imports
between packages, the number on an arrow counting the modules' import statements.

    python scripts/architecture.py --figure docs/figures/architecture.png
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lowest first: (layer, the module prefixes it holds, what it is)
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("foundations", ("gae.types", "gae.validation", "gae.kernel_cache", "gae.compiled", "gae.loading",
                     "gae.state_dicts", "gae.moved"),
     "named results, boundary checks, the kernels' cache folder, compiled-call helpers, safe loading"),
    ("storage", ("gae.storage",), "SQLite and Postgres: connections, transactions, locks, checksums, check(), erase"),
    ("episodic", ("gae.episodic",), "EpisodicMemory, its scorer, admission and embedders, on the storage API"),
    ("models", ("gae.models", "gae.judgment"),
     "nn.Modules that score, learn, explain, undo and forget: JudgmentMemory, KNNMemory, RetrievalMemory"),
    ("ledger", ("gae.ledger",), "events, pending rows, snapshots and replay, on the storage API"),
    ("decider", ("gae.decider",), "Decider: decide / verify, act or refer, thread safety, the durable ledger"),
    ("integrations", ("gae.river", "gae.sklearn", "gae.mcp", "gae.traces", "gae.viz"),
     "river and scikit-learn estimators, the MCP server, evaluation traces, figures"),
)
TOP = "gae"  # the package itself: re-exports every layer's public names, each on first use


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (the longest prefix that holds it). The
    package ``gae`` itself (its ``__version__``, its re-exports) counts as the top layer's: only
    the integrations may import it whole."""
    if module == TOP:
        return len(LAYERS) - 1
    best, found = -1, None
    for index, (_, prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise KeyError(f"{module} is in no layer of scripts/architecture.py: add its prefix to LAYERS")
    return found


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``) by its dotted name."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, name: str) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import in one file: ``import a.b`` gives ``('a.b', [])``,
    ``from a import b, c`` gives ``('a', ['b', 'c'])``, relative ones resolved against ``name``.
    Imports under ``if TYPE_CHECKING:`` count too: a type names a dependency."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            yield node.lineno, base, [alias.name for alias in node.names]


def homes(root: Path, package: str) -> dict[str, str]:
    """The modules a package's ``_HOMES`` table says its lazily imported public names live in
    (``from gae import JudgmentMemory`` is an edge to ``gae.judgment``); empty when it has none."""
    init = root / package / "__init__.py"
    if not init.exists():
        return {}
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_HOMES" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """``{module: {module it imports: line}}`` over the modules of ``package``. ``from P import N``
    is an edge to the module ``P.N`` when ``N`` is a module of ``P``, to the module a lazy package's
    ``_HOMES`` names for ``N`` (:func:`homes`), else to ``P``."""
    known = modules(root, package)
    lazy = {name: homes(root, name.replace(".", "/")) for name in known}
    edges: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for line, module, names in imports(path, name):
            home = lazy.get(module, {})
            targets = [f"{module}.{n}" if f"{module}.{n}" in known else home.get(n, module) for n in names] or [module]
            for target in targets:
                if target in known and target != name:
                    edges[name].setdefault(target, line)
    return edges


def upward(edges: dict[str, dict[str, int]]) -> list[str]:
    """Every import from a module to one of a higher layer, as ``module:line -> target (layers)``."""
    found = []
    names = [name for name, _, _ in LAYERS]
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if layer_of(target) > layer_of(module) and module != TOP:
                found.append(f"{module}:{line} -> {target} ({names[layer_of(module)]} imports "
                             f"{names[layer_of(target)]})")
    return found


def package_of(module: str) -> str:
    """The box a module is drawn in: its package below ``gae`` (``gae.judgment``), or the module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def draw(edges: dict[str, dict[str, int]], path: Path) -> None:
    """The layers as bands, lowest at the bottom, each package a box (its modules' lines of code in
    it), and an arrow from package to package for every pair in different layers that imports,
    labelled with how many import statements it stands for (those into the foundations left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    known = modules(ROOT, TOP)
    lines: Counter = Counter()
    for module, file in known.items():
        lines[package_of(module)] += len(file.read_text().splitlines())
    arrows: Counter = Counter()
    for module, targets in edges.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b and a != TOP and layer_of(b) > 0:  # (every layer builds on the foundations: not drawn)
                arrows[(a, b)] += 1
    boxes: dict[str, tuple[float, float]] = {}
    fig, ax = plt.subplots(figsize=(13, 9))
    height = 1.0
    for index, (name, _, about) in enumerate(LAYERS):
        y = index * height * 1.4
        ax.add_patch(plt.Rectangle((0, y), 12, height, color="#eef2f7", zorder=0))
        ax.text(0.1, y + height - 0.12, name, fontsize=11, weight="bold", va="top")
        ax.text(0.1, y + 0.12, about, fontsize=7.5, color="#555555", va="bottom")
        members = sorted(p for p in lines if p != TOP and layer_of(p) == index)
        width = 9.6 / max(len(members), 1)
        for j, member in enumerate(members):
            x = 2.3 + j * width
            ax.add_patch(plt.Rectangle((x, y + 0.3), width * 0.9, height * 0.5, facecolor="white",
                                       edgecolor="#4a6fa5", zorder=2))
            ax.text(x + width * 0.45, y + 0.55, f"{member}\n{lines[member]:,} lines", ha="center", va="center",
                    fontsize=7.5, zorder=3)
            boxes[member] = (x + width * 0.45, y + 0.55)
    for (a, b), count in sorted(arrows.items()):
        if a not in boxes or b not in boxes:
            continue
        (x0, y0), (x1, y1) = boxes[a], boxes[b]
        if y0 == y1:
            continue  # within a layer: not drawn (the check allows them)
        ax.annotate("", xy=(x1, y1 + 0.27), xytext=(x0, y0 - 0.27), zorder=1,
                    arrowprops={"arrowstyle": "->", "color": "#4a6fa5", "alpha": 0.45, "lw": 0.8})
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, str(count), fontsize=6, color="#4a6fa5", alpha=0.8)
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.2, len(LAYERS) * height * 1.4)
    ax.axis("off")
    ax.set_title("gae's layers, lowest at the bottom. An arrow: a package imports another (the number: import "
                 "statements);\nevery layer imports the foundations (not drawn); no import points up "
                 "(scripts/architecture.py checks it)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    from training import cli

    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figure", type=Path, default=None, help="where to draw the layers (a PNG)")
    args = parser.parse_args()
    edges = graph(ROOT, TOP)
    wrong = upward(edges)
    for line in wrong:
        print(line)
    print(f"{sum(map(len, edges.values()))} imports between {len(edges)} modules of gae, "
          f"{len(wrong)} pointing up a layer")
    if args.figure is not None:
        draw(edges, args.figure)
        print(f"wrote {args.figure}")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
