"""Dependencies point one way (docs: DESIGN section 2): no import circle inside ``gae``, and
``training`` and ``scripts`` use ``gae`` through its public names only.

The import graph is read from the source with :mod:`ast`, not by importing it
(:func:`scripts.architecture.graph`): every ``import`` and ``from ... import`` statement counts,
at module level or inside a function or a class (a function's import is a circle too, only a
later one), relative ones resolved. ``from P import N`` is an edge to the module ``P.N`` when
``N`` is a module of ``P``, to the home a lazy package names for ``N``, else to ``P``;
``import P.Q`` an edge to ``P.Q``. The packages a module's import runs first (``gae``,
``gae.models`` for ``gae.models.knn``) are not edges: every package that re-exports its
submodules would make a circle with them. The layers of docs/architecture.md are checked here too.
"""

from __future__ import annotations

from pathlib import Path

from scripts.architecture import graph, imports

ROOT = Path(__file__).resolve().parent.parent


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle through each group of modules that import each other (Tarjan's strongly
    connected components), as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    found = []
    for group in groups:  # a shortest way back to the group's first module, through the group
        members, start = set(group), min(group)
        paths = {start: [start]}
        frontier = [start]
        circle: list[str] | None = None
        while frontier and circle is None:
            following = []
            for node in frontier:
                for target in sorted(edges[node]):
                    if target == start:
                        circle = [*paths[node], start]
                        break
                    if target in members and target not in paths:
                        paths[target] = [*paths[node], target]
                        following.append(target)
                if circle is not None:
                    break
            frontier = following
        assert circle is not None
        found.append(circle)
    return found


def describe(circle: list[str], edges: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(circle, circle[1:], strict=False)) + \
        f" -> {circle[-1]}"


def test_gae_has_no_import_circle() -> None:
    edges = graph(ROOT, "gae")
    assert len(edges) > 20 and edges["gae.models.knn"]  # it read the package
    found = circles(edges)
    assert not found, "import circles in gae:\n" + "\n".join(describe(c, edges) for c in found)


def test_training_and_scripts_use_public_names_of_gae_only() -> None:
    private = []
    for folder in ("training", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for line, module, names in imports(path, name):
                if module != "gae" and not module.startswith("gae."):
                    continue
                bad = [part for part in module.split(".") if part.startswith("_")]
                bad += [n for n in names if n.startswith("_")]
                if bad:
                    private.append(f"{path.relative_to(ROOT)}:{line}: {module} {names or ''} ({', '.join(bad)})")
    assert not private, "training/ and scripts/ import private names of gae:\n" + "\n".join(private)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The reader on a package made for it: a circle through a relative import inside a function,
    a ``from package import submodule`` edge, and a private name."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text("from pkg.sub import b\nA = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import C\n    return C\n")
    (package / "c.py").write_text("from . import a\nimport pkg._hidden\nC = 2\n")
    (package / "_hidden.py").write_text("")
    edges = graph(tmp_path, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b": 1} and edges["pkg.sub.b"] == {"pkg.c": 2}
    assert edges["pkg.c"] == {"pkg.a": 1, "pkg._hidden": 2} and edges["pkg"] == {"pkg.a": 1}
    assert circles(edges) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    del edges["pkg.c"]["pkg.a"]
    assert circles(edges) == []
    assert list(imports(package / "c.py", "pkg.c"))[1] == (2, "pkg._hidden", [])


def test_every_import_points_down_a_layer_or_stays_in_its_own() -> None:
    """docs/architecture.md's layers (scripts/architecture.py's LAYERS): storage below the episodic
    memory, the models, the ledger, the Decider and the integrations; no module imports a layer above."""
    from scripts.architecture import LAYERS, layer_of, upward

    edges = graph(ROOT, "gae")
    assert {layer_of(module) for module in edges} == set(range(len(LAYERS)))  # every module is in a layer
    wrong = upward(edges)
    assert not wrong, "imports pointing up a layer:\n" + "\n".join(wrong)


def test_a_model_imports_no_storage_ledger_or_server() -> None:
    """A judgment memory or a k-NN used inside a larger model loads the models' code alone: no
    SQLite or Postgres driver, no store, no ledger, no Decider, no server (measured in a fresh
    interpreter: what ``import`` runs, ``from gae import JudgmentMemory`` included)."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "from gae import JudgmentMemory, KNNMemory\n"
             "import gae.judgment.memory, gae.models.knn\n"
             "JudgmentMemory(2, 2, 3).learn_one([0.1, 0.2, 0.3], 0, 0)\n"
             "loaded = [m for m in sys.modules if m.split('.')[0] in ('sqlite3', 'psycopg', 'mcp', 'lightning')\n"
             "          or m.startswith(('gae.storage', 'gae.ledger', 'gae.decider', 'gae.episodic', 'gae.mcp'))]\n"
             "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_layer_check_finds_an_import_that_points_up() -> None:
    """The check on an edge made for it: a model importing the Decider is reported, naming both."""
    from scripts.architecture import upward

    assert upward({"gae.models.knn": {"gae.decider.decider": 12}, "gae.decider.decider": {"gae.models.base": 3}}) \
        == ["gae.models.knn:12 -> gae.decider.decider (models imports decider)"]
