"""What a store raises when it meets damage, a newer gae's file, or another writer's commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StoreConflict(RuntimeError):
    """A commit found the store at another version than the one its change was made on: another
    writer committed first. Nothing of the change was written. (A memory writes holding the
    store's lock from its reload on, so it never meets one: this is the store's second line.)"""


class StoreCorrupted(ValueError):
    """A store's file (or table) is damaged, or holds what no gae wrote: opening refuses it, a
    read of a damaged row raises it, and ``check()`` raises it. The message names the store
    (``where``: the SQLite file's path, or the Postgres table) and every problem found
    (``problems``: the table and row, or what the database reported); nothing was changed."""

    def __init__(self, where: str, problems: str | Sequence[str]) -> None:
        self.where = where
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        shown = self.problems[:10]
        more = f"; and {len(self.problems) - len(shown)} more" if len(self.problems) > len(shown) else ""
        super().__init__(f"{where} is damaged: " + "; ".join(shown) + more)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with its arguments, not its message
        return type(self), (self.where, self.problems)


class NewerSchema(ValueError):
    """A store written by a newer gae (or with a damaged version number): refused as such, not as damage."""
