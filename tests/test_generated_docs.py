"""Every generated section of README.md and docs/*.md is what its script renders from the committed record.

A section is the text between ``<!-- name:start -->`` and ``<!-- name:end -->``. Each name is
rendered by a pure function of one file under docs/results/, the record the script committed
when it last wrote the section, so a hand-edited figure, a stale section or a renderer changed
without regenerating fails here. Nothing is measured.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from training import headline
from training.readme import RESULTS, sections
from training.report_sections import DOC_SECTIONS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def script(module: str, function: str) -> Callable[[Path], str]:
    """A script's renderer applied to a JSON record. Importing a script may set thread
    variables for its own run (scripts/bench.py does); they are put back."""
    def render(path: Path) -> str:
        environment = dict(os.environ)
        try:
            renderer = getattr(importlib.import_module(module), function)
        finally:
            os.environ.clear()
            os.environ.update(environment)
        return renderer(json.loads(path.read_text()))
    return render


def output(fence: str | None = None) -> Callable[[Path], str]:
    """A record that is the script's own text output (written with ``--out`` or its stdout), shown
    as it is or in a code block."""
    def render(path: Path) -> str:
        text = path.read_text().rstrip("\n")
        return text if fence is None else f"```{fence}\n{text}\n```"
    return render


RENDERERS: dict[str, tuple[str, Callable[[Path], str]]] = {  # section: (record in docs/results/, renderer)
    "report": ("report.json", script("training.report_sections", "readme_section")),
    # the docs pages' sections of the head-to-head, each rendered by the function the script writes it with
    **{name: ("report.json", script("training.report_sections", render.__name__))
       for name, (_, render) in DOC_SECTIONS.items()},
    "scaling": ("scaling.json", script("scripts.scaling", "section")),
    "bench": ("bench.json", script("scripts.bench", "section")),
    "bench-decisions": ("bench.json", script("scripts.bench", "decisions_section")),
    "scoring-speed": ("scoring-speed.json", script("scripts.profile_scoring", "section")),
    "bench-retrieval": ("bench-retrieval.json", script("scripts.bench_retrieval", "tables")),
    "bench-store": ("bench-store.json", script("scripts.bench_store", "tables")),
    "bench-store-integrity": ("bench-store-integrity.json", script("scripts.bench_store", "integrity_tables")),
    "soak": ("soak.json", script("scripts.soak", "section")),
    "benchmark-streams": ("benchmark-streams.json", script("scripts.benchmark_streams", "section")),
    "tune-lvq": ("tune-lvq.json", script("scripts.tune_lvq", "section")),
    "load-store": ("load-store.json", script("scripts.load_store", "section")),
    "load-ledger": ("load-ledger.json", script("scripts.load_ledger", "section")),
    "bench-mcp": ("bench-mcp.json", script("scripts.bench_mcp", "table")),
    "mcp-clients": ("mcp-clients.json", script("scripts.mcp_clients", "table")),
    "bench-decider": ("bench-decider.json", script("scripts.bench_decider", "section")),
    "autonomy": ("autonomy.json", script("scripts.autonomy", "section")),
    "sweep-prototypes": ("sweep-prototypes.md", output()),  # scripts/sweep_prototypes.py --out
    "ddp-gather": ("ddp-gather.txt", output("text")),  # the script in docs/scaling.md
    "train-summary": ("train-summary.txt", output("text")),  # scripts/tensorboard_screenshots.py: make train's
    # the README's headline, from report.json and benchmark-streams.json beside it
    "headline": ("report.json", lambda path: headline.render(path.parent)),
}
# Sections written before their script committed its record: checked once the record exists
# (the script's next run with --readme writes it). Remove a name when its record is committed.
NOT_YET_RECORDED = {"bench-retrieval", "bench-store"}

FOUND = [(page, name, body) for page in PAGES for name, body in sections(page.read_text()).items()]


def test_every_marker_opens_a_section():
    for page in PAGES:
        text = page.read_text()
        opened = re.findall(r"<!-- ([\w-]+):(?:start|end) -->", text)
        assert sorted(set(opened)) == sorted(sections(text)), f"{page.name}: a marker without its pair"


def test_every_record_renders_a_section():
    used = {RENDERERS[name][0] for _, name, _ in FOUND if name in RENDERERS}
    committed = {path.name for path in (ROOT / RESULTS).iterdir()}
    assert committed <= used, f"records no section is rendered from: {sorted(committed - used)}"


@pytest.mark.parametrize(("page", "name", "body"), FOUND, ids=[f"{p.name}:{n}" for p, n, _ in FOUND])
def test_section_is_rendered_from_its_record(page, name, body):
    assert name in RENDERERS, f"{page.name}: section {name!r} has no renderer in {__name__}.RENDERERS"
    record, render = RENDERERS[name]
    path = ROOT / RESULTS / record
    if not path.exists():
        assert name in NOT_YET_RECORDED, f"{page.name}: section {name!r} has no record {RESULTS / record}"
        pytest.skip(f"{RESULTS / record} is not committed yet")
    expected = render(path)
    diff = "\n".join(difflib.unified_diff(body.splitlines(), expected.splitlines(), f"{page.name} ({name})",
                                          f"rendered from {RESULTS / record}", lineterm="", n=1))
    assert body == expected, f"regenerate the section (its script's --readme / --doc):\n{diff[:4000]}"
