"""The load test in short: writers and readers sharing one store keep every invariant (scripts/load_store.py)."""

from __future__ import annotations

import importlib.util

import pytest

from scripts.load_store import load_store, section

STORES = ["sqlite"] + (["postgres"] if importlib.util.find_spec("pgserver") else [])


def test_a_short_load_keeps_every_invariant_on_every_store(tmp_path):
    record = load_store(out=tmp_path, stores=STORES, grid=[2], seconds=1.0)
    assert [(c["store"], c["writers"], c["readers"]) for c in record["cells"]] == [(s, 2, 2) for s in STORES]
    for cell in record["cells"]:
        assert cell["checks"] == dict.fromkeys(cell["checks"], True), cell
        assert cell["writes_per_s"] > 0 and cell["retrieves_per_s"] > 0
    assert (tmp_path / "load-store.json").exists() and (tmp_path / "load-store.png").exists()
    assert "| sqlite | 2 | 2 |" in section(record) and "all pass" in section(record)


@pytest.mark.parametrize(("arguments", "error"), [
    ({"grid": [0]}, "grid must be distinct ints >= 1"), ({"grid": [2, 2]}, "grid must be distinct ints >= 1"),
    ({"seconds": 0}, r"seconds must be in \(0, 600\]"), ({"stores": ["mysql"]}, "stores must be distinct names")])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, arguments, error):
    with pytest.raises(ValueError, match=error):
        load_store(out=tmp_path, **arguments)
