"""The ledger's load test in short: processes and threads deciding and verifying on one ledger keep every invariant
(scripts/load_ledger.py); and docs/ledger.md's examples run as printed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from scripts.load_ledger import load_ledger, section

STORES = ["sqlite"] + (["postgres"] if importlib.util.find_spec("pgserver") else [])
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "ledger.md"


def test_a_short_load_keeps_every_invariant_on_every_store(tmp_path):
    record = load_ledger(out=tmp_path, stores=STORES, grid=[2], seconds=1.0)
    assert [(c["store"], c["durable_decisions"], c["processes"], c["threads"]) for c in record["cells"]] == \
        [(s, mode, 2, 2) for s in STORES for mode in (True, False)]
    for cell in record["cells"]:
        assert cell["checks"] == dict.fromkeys(cell["checks"], True), cell
        assert len(cell["checks"]) == 9
        assert cell["verifications_per_s"] > 0 and cell["decisions_per_s"] > 0
    assert (tmp_path / "load-ledger.json").exists() and (tmp_path / "load-ledger.png").exists()
    text = section(record)
    assert "| sqlite | yes | 2 |" in text and "| sqlite | no | 2 |" in text and "all pass" in text
    assert "not measured" in text  # the targets are at 4 processes


@pytest.mark.parametrize(("arguments", "error"), [
    ({"grid": [0]}, "grid must be distinct ints >= 1"), ({"grid": [2, 2]}, "grid must be distinct ints >= 1"),
    ({"threads": 0}, r"threads must be an int in \[1, 64\]"), ({"seconds": 0}, r"seconds must be in \(0, 600\]"),
    ({"delay_ms": -1}, r"delay_ms must be in \[0, 60000\]"), ({"stores": ["mysql"]}, "stores must be distinct names"),
    ({"durable_decisions": [True, True]}, "durable_decisions must be distinct bools"),
    ({"durable_decisions": []}, "durable_decisions must be distinct bools")])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, arguments, error):
    with pytest.raises(ValueError, match=error):
        load_ledger(out=tmp_path, **arguments)
    assert not list(tmp_path.iterdir())


def test_a_readme_without_the_section_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no section\n")
    with pytest.raises(ValueError, match="has no load-ledger section"):
        load_ledger(out=tmp_path / "out", readme=readme)
    assert readme.read_text() == "# no section\n"


@pytest.mark.parametrize("index", range(len(re.findall(r"```python\n", GUIDE.read_text()))))
def test_the_guides_examples_run_as_printed(index):
    block = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)[index]
    exec(compile(block, f"docs/ledger.md block {index}", "exec"), {})
