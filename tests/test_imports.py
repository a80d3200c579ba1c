"""Dependencies point one way (docs: DESIGN section 2): no import circle inside ``gae``, and
``training`` and ``scripts`` use ``gae`` through its public names only.

The import graph is read from the source with :mod:`ast`, not by importing it: every
``import`` and ``from ... import`` statement counts, at module level or inside a function or a
class (a function's import is a circle too, only a later one), relative ones resolved.
``from P import N`` is an edge to the module ``P.N`` when ``N`` is a module of ``P``, else to
``P``; ``import P.Q`` an edge to ``P.Q``. The packages a module's import runs first (``gae``,
``gae.baselines`` for ``gae.baselines.knn``) are not edges: every package that re-exports its
submodules would make a circle with them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    ``from a import b, c`` gives ``('a', ['b', 'c'])``, relative ones resolved against ``name``."""
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


def graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """``{module: {module it imports: line}}`` over the modules of ``package``."""
    known = modules(root, package)
    edges: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for line, module, names in imports(path, name):
            targets = [f"{module}.{n}" if f"{module}.{n}" in known else module for n in names] or [module]
            for target in targets:
                if target in known and target != name:
                    edges[name].setdefault(target, line)
    return edges


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
    assert len(edges) > 20 and edges["gae.baselines.knn"]  # it read the package
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
