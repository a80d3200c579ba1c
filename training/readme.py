"""Generated README sections: scripts write their measured tables between marker comments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


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


def publish(record: dict[str, Any], figure: Any, text: str, out: Path, stem: str, doc: Path | None = None,
            markers: tuple[str, str] = ("", ""), figures: str = "docs/figures") -> None:
    """Write a measurement's ``<stem>.json`` and ``<stem>.png`` (a matplotlib figure) to ``out``,
    print its table, and, given ``doc``, put the table and the figure between ``markers`` there
    (the figure copied to ``doc``'s folder / ``figures``, linked from the section)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    figure.savefig(out / f"{stem}.png", dpi=100)
    print(text)
    print(f"\nwrote {out / f'{stem}.json'} and {out / f'{stem}.png'} in {record['seconds']:.0f} s")
    if doc is not None and replace_section(doc, *markers, f"{text}\n\n![{stem}]({figures}/{stem}.png)"):
        target = doc.parent / figures
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / f"{stem}.png", target / f"{stem}.png")
