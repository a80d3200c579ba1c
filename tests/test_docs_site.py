"""The docs site builds strictly, as ``make docs`` builds it, and the README stays a short front page.

The build reads docs/mkdocs.yml from standard input (the file says why) with ``--strict``: a
broken link or anchor, a page missing from the nav, a docstring the API reference cannot read
or a missing reference fails it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training.readme import sections

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "mkdocs.yml"
README = ROOT / "README.md"
MAX_README_LINES = 250


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``make docs`` in ``root`` (a checkout or a copy of its README and docs/), into ``site``."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    with CONFIG.open() as config:
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "-", "-d", str(site)],
                              stdin=config, cwd=root, env=environment, capture_output=True, text=True, timeout=300)


def nav_pages(entries: list) -> list[str]:
    """Every page the nav names, in order."""
    pages: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    result = build(ROOT, folder)
    return folder, result


def test_the_site_builds_strictly_with_no_warning(site):
    folder, result = site
    assert result.returncode == 0, f"make docs fails:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr


def test_every_page_of_the_nav_is_built_and_the_api_reference_has_the_public_names(site):
    folder, _ = site
    for page in nav_pages(yaml.safe_load(CONFIG.read_text())["nav"]):
        assert (folder / page).with_suffix(".html").exists(), page
    reference = (folder / "api" / "gae.html").read_text()
    for name in ("gae.JudgmentMemory", "gae.JudgmentConfig"):
        assert f'id="{name}"' in reference, name
    served = (folder / "api" / "decider.html").read_text()  # what serves a memory: its own page
    for name in ("gae.decider.Decider", "gae.decider.Decision", "gae.decider.refer.Referral"):
        assert f'id="{name}"' in served, name
    assert 'id="gae.river.JudgmentClassifier"' in (folder / "api" / "river.html").read_text()
    assert ":class:`" not in reference and ".. math::" not in reference  # docs/rst_roles.py made them Markdown


def test_the_home_page_is_the_readme_with_its_links_working_from_the_site(site):
    folder, _ = site
    home = (folder / "index.html").read_text()
    assert "<table>" in home and "JudgmentConfig.recommended()" in home  # the headline table
    links = set(re.findall(r'href="([^"#]+\.html)', home))
    assert "rule.html" in links and "head_to_head.html" in links
    assert not any(link.startswith("docs/") for link in links), sorted(links)


def test_every_docs_page_is_in_the_nav():
    pages = set(nav_pages(yaml.safe_load(CONFIG.read_text())["nav"]))
    docs = ROOT / "docs"
    written = {path.relative_to(docs).as_posix() for path in docs.rglob("*.md")
               if path.relative_to(docs).parts[0] != "results"}  # docs/results holds records, not pages
    assert written - pages == set(), f"pages missing from the nav of {CONFIG.name}"
    assert pages - written == set(), "the nav names pages that do not exist"


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("figures"))
    (copy / "docs" / "figures").mkdir()
    for figure in (ROOT / "docs" / "figures").iterdir():  # the pages' images, linked, not copied
        (copy / "docs" / "figures" / figure.name).symlink_to(figure)
    shutil.copyfile(README, copy / "README.md")
    page = copy / "docs" / "usage.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md).\n")
    (copy / "docs" / "orphan.md").write_text("# A page no nav names\n")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "missing.md" in result.stderr and "orphan.md" in result.stderr, result.stderr


def test_the_readme_is_a_short_front_page_with_the_headline():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    headline = sections(text).get("headline", "")
    assert "| public benchmark: mean accuracy" in headline and "| head-to-head:" in headline
    assert "JudgmentConfig.recommended()" in text.split("## Quickstart", 1)[1].split("##", 1)[0]
