"""Generated README and doc sections: scripts write their measured tables between marker comments.

A section named ``name`` is the text between ``<!-- name:start -->`` and ``<!-- name:end -->``.
Every section is rendered by a pure function of a committed record (``docs/results/``), so
``tests/test_generated_docs.py`` can render it again without measuring and compare.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path("docs") / "results"  # committed records, relative to the repository root
SECTION = re.compile(r"<!-- ([a-z0-9-]+):start -->\n(.*?)\n?<!-- \1:end -->", flags=re.S)


def markers(name: str) -> tuple[str, str]:
    """The start and end marker lines of the section ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def sections(text: str) -> dict[str, str]:
    """Every generated section of a Markdown text, by name: the text between its markers."""
    return {match.group(1): match.group(2) for match in SECTION.finditer(text)}


def replace_section(path: Path, start: str, end: str, body: str) -> bool:
    """Put ``body`` between the ``start`` and ``end`` marker lines of ``path``.

    Returns False, changing nothing, when the file or either marker is missing, so a script
    run against a README without its section never damages it.
    """
    text = path.read_text() if path.exists() else ""
    head, found_start, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        return False
    path.write_text(f"{head}{start}\n{body}\n{end}{tail}")
    return True


def root_of(doc: Path) -> Path:
    """The checkout ``doc`` belongs to: ``doc`` is the README at its root or a page in ``docs/``."""
    return doc.parent.parent if doc.parent.name == "docs" else doc.parent


def docs_of(doc: Path) -> Path:
    """The ``docs/`` folder of the checkout ``doc`` belongs to (:func:`root_of`)."""
    return root_of(doc) / "docs"


def figures_link(doc: Path) -> str:
    """The folder of the docs' figures as a link from ``doc``: ``docs/figures`` from the README,
    ``figures`` from a page in ``docs/``."""
    return "figures" if doc.parent.name == "docs" else "docs/figures"


def record_path(doc: Path, name: str) -> Path:
    """Where the record behind ``doc``'s section ``name`` is committed: ``docs/results/<name>.json``
    of the checkout ``doc`` belongs to (:func:`root_of`)."""
    return root_of(doc) / RESULTS / f"{name}.json"


def as_saved(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as it reads back from its JSON file (tuples as lists, keys as strings): what a
    section is rendered from, so the committed record renders the same text again."""
    return json.loads(json.dumps(record))


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def publish_section(doc: Path, name: str, record: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> bool:
    """Put ``render(record)`` in ``doc``'s section ``name`` and commit ``record`` beside it
    (:func:`record_path`), so the two never disagree. False, writing nothing, when ``doc`` has no
    such section."""
    if not replace_section(doc, *markers(name), render(as_saved(record))):
        return False
    write_record(record_path(doc, name), record)
    return True


def with_figure(text: str, stem: str, figures: str) -> str:
    """A section's table followed by its figure, ``figures/<stem>.png`` relative to the doc."""
    return f"{text}\n\n![{stem}]({figures}/{stem}.png)"


def publish(record: dict[str, Any], figure: Any, section: Callable[[dict[str, Any]], str], out: Path, stem: str,
            doc: Path | None = None, figures: str | None = None) -> None:
    """Write a measurement's ``<stem>.json`` and ``<stem>.png`` (a matplotlib figure) to ``out``,
    print its section, and, given ``doc``, put the section (``section(record)``, which links the
    figure as ``figures/<stem>.png``) in ``doc``'s section ``stem``: the figure copied to ``doc``'s
    folder / ``figures`` (default: :func:`figures_link`, the docs' figures), the record to
    ``docs/results/<stem>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    figure.savefig(out / f"{stem}.png", dpi=100)
    print(section(as_saved(record)))
    print(f"\nwrote {out / f'{stem}.json'} and {out / f'{stem}.png'} in {record['seconds']:.0f} s")
    if doc is not None and publish_section(doc, stem, record, section):
        target = doc.parent / (figures_link(doc) if figures is None else figures)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / f"{stem}.png", target / f"{stem}.png")
