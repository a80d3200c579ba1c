"""Erase means erased: ``EpisodicMemory.delete(..., erase=True)`` on SQLite leaves no byte of the
deleted content or embedding in any file of the store (the database, its write-ahead log and its
shared-memory index, the full-text index included), which a plain delete does not promise; and
``SQLiteStore.purge()`` does the same for everything deleted before. Every check scans the bytes
of every file in the store's folder for a unique marker string, its lower-case full-text term,
and the marker memory's float32 embedding as the store writes it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from gae import EpisodicMemory
from gae.episodic.store import SQLiteStore

DIM = 16
MARKER = "ZEBRAQUOKKA7781"


def marker_embedding() -> torch.Tensor:
    return (torch.full((1, DIM), 0.25) + torch.arange(DIM) * 0.001)


def traces(folder: Path) -> dict[str, list[str]]:
    """For each file of the store, which of the marker's traces its bytes hold."""
    unit = marker_embedding() / marker_embedding().norm()
    patterns = {"content": MARKER.encode(), "term": MARKER.lower().encode(),
                "embedding": unit.float().numpy().astype(np.float32).tobytes()}
    found = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        found[path.name] = [name for name, pattern in patterns.items() if pattern in data]
    return found


def filled(folder: Path) -> tuple[EpisodicMemory, int]:
    """A store with the marker memory between 500 others (so it shares pages with them)."""
    memory = EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(folder / "memories.db"))
    gen = torch.Generator().manual_seed(0)
    memory.add(torch.randn(200, DIM, generator=gen), 0.5, content=[f"filler {i} lorem ipsum" for i in range(200)])
    (marker,) = memory.add(marker_embedding(), 0.9, content=[f"the {MARKER} secret"]).tolist()
    memory.add(torch.randn(300, DIM, generator=gen), 0.5, content=[f"more filler {i} dolor" for i in range(300)])
    return memory, marker


def test_a_plain_delete_leaves_traces_in_the_files_the_scan_finds(tmp_path):
    """The control: without erase, the write-ahead log still holds the deleted row's old pages."""
    memory, marker = filled(tmp_path)
    memory.delete([marker])
    assert any(found for found in traces(tmp_path).values())


def test_erase_leaves_no_trace_in_any_file(tmp_path):
    memory, marker = filled(tmp_path)
    assert any(found for found in traces(tmp_path).values())  # it was written
    assert memory.delete([marker], now=5.0, reason="user request 42", erase=True) == 1
    assert traces(tmp_path) == {name: [] for name in traces(tmp_path)}
    assert (tmp_path / "memories.db-wal").stat().st_size == 0  # the log was truncated
    # the audit keeps who, when, why and the id, never the content
    record = memory.store.audit()[-1]
    assert (record.action, record.time, record.ids, record.reason) == ("delete", 5.0, (marker,), "user request 42")
    assert MARKER not in repr(memory.store.audit())
    # the memory and a memory reopened on the store no longer have it; the others are intact
    reopened = EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(tmp_path / "memories.db"))
    assert marker not in reopened.column("ids").tolist() and len(reopened) == len(memory) == 500
    hits = reopened.store.retrieve(np.ones((1, DIM), dtype=np.float32), now=10.0, k=3, text="filler", w_text=1.0)
    assert (hits.ids >= 0).all()


def test_purge_erases_what_plain_deletes_left(tmp_path):
    memory, marker = filled(tmp_path)
    memory.delete([marker])
    memory.store.purge()
    assert traces(tmp_path) == {name: [] for name in traces(tmp_path)}
    assert len(EpisodicMemory(DIM, capacity=10_000, store=SQLiteStore(tmp_path / "memories.db"))) == 500


def test_an_erase_waits_for_a_reader_then_says_what_is_left(tmp_path):
    memory, marker = filled(tmp_path)
    memory.store.erase_timeout = 0.05
    reader = sqlite3.connect(tmp_path / "memories.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memories").fetchone()  # a read snapshot that still needs the WAL
    with pytest.raises(TimeoutError, match="the delete is committed, but a reader still uses the write-ahead log"):
        memory.delete([marker], erase=True)
    assert marker not in memory.column("ids").tolist()  # committed: acknowledged as deleted, not yet erased
    reader.execute("COMMIT")
    reader.close()
    memory.store.purge()
    assert traces(tmp_path) == {name: [] for name in traces(tmp_path)}


def test_bad_erase_arguments_are_refused_and_change_nothing(tmp_path):
    memory, marker = filled(tmp_path)
    version = memory.version
    with pytest.raises(TypeError, match="erase must be a bool, got 'yes'"):
        memory.delete([marker], erase="yes")
    assert memory.version == version and marker in memory.column("ids").tolist()
    with pytest.raises(ValueError, match="erase_timeout must be a number of seconds >= 0, got -1"):
        SQLiteStore(tmp_path / "other.db", erase_timeout=-1)


def test_without_a_store_erase_deletes_as_usual():
    memory = EpisodicMemory(DIM, capacity=10)
    (i,) = memory.add(marker_embedding(), 0.5).tolist()
    assert memory.delete([i], erase=True) == 1 and len(memory) == 0
