"""Generated README sections: scripts write their measured tables between marker comments."""

from __future__ import annotations

from pathlib import Path


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
