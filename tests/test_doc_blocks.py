"""Every code block of README.md and docs/*.md runs as printed, or is checked as far as it can be.

- ``python`` blocks are executed as printed: the blocks of one page in order, in one namespace
  (a later block uses an earlier one's names), in a fresh process whose working directory is
  an empty temporary folder (a block never writes into the checkout); a block in doctest form
  (``>>>``) is checked as a doctest, its printed output compared.
- ``bash`` blocks: each command (``\\`` continuations joined, comments dropped) is checked
  without a run of minutes. ``make X`` must be a target (``make -n X``); a command that runs a
  script of scripts/ (``python scripts/X.py ...``, also after ``torchrun``'s options) is run with
  ``GAE_CHECK_ARGS=1``, so that its own parser reads the exact command line and exits (a renamed
  or removed option, or a bad value, fails here; training/cli.py). Anything else is refused
  unless the page marks the block ``<!-- not-run: reason -->`` on the line before its fence,
  for what this machine cannot run (a GPU, several nodes).
- ``yaml``, ``toml`` and ``json`` blocks are parsed; ``text`` blocks are output or formulas, not
  code. A fence without a language, or with another one, fails: every block is classified.

Generated sections (between ``<!-- name:start -->`` and ``<!-- name:end -->``) are script output,
checked by tests/test_generated_docs.py, and left out here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\s`]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
GENERATED = re.compile(r"<!-- ([a-z0-9-]+):start -->.*?<!-- \1:end -->", re.S)
NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->\s*$")
LANGUAGES = {"python", "bash", "yaml", "toml", "json", "text"}
SLOW_PAGES = {  # pages whose python blocks take minutes: run by `make test-slow`
    "scaling.md": "its DDP block times 2 Gloo processes over three batch sizes up to 5,000 decisions per rank",
}
RUNNER = r"""
import doctest, sys
blocks = __import__("json").loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, source in blocks:
    if source.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(source, namespace, f"block at line {line}", None, line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        if runner.failures:
            sys.exit(f"the doctest block at line {line} failed")
    else:
        exec(compile(source, f"<block at line {line}>", "exec"), namespace)
"""


def blocks(page: Path) -> list[tuple[int, str, str, str | None]]:
    """Every code block of ``page`` outside generated sections: (line, language, source, not-run reason)."""
    text = page.read_text()
    hidden = [match.span() for match in GENERATED.finditer(text)]
    found = []
    for match in FENCE.finditer(text):
        if any(start <= match.start() < end for start, end in hidden):
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2),
                      reason.group(1) if reason else None))
    return found


def commands(source: str) -> list[str]:
    """The commands of a shell block: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", source)
    return [line for line in (shlex.split(raw, comments=True) for raw in joined.splitlines()) if line]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


SHELL = [pytest.param(page, line, command, id=f"{name(page)}:{line}:{' '.join(command)[:60]}")
         for page in PAGES for line, language, source, reason in blocks(page)
         if language == "bash" and reason is None for command in commands(source)]
PYTHON = [pytest.param(page, id=name(page), marks=[pytest.mark.slow] if page.name in SLOW_PAGES else [])
          for page in PAGES if any(language == "python" for _, language, _, _ in blocks(page))]


def test_every_block_has_a_known_language():
    unknown = [f"{name(page)}:{line}: {language or '(none)'}" for page in PAGES
               for line, language, _, _ in blocks(page) if language not in LANGUAGES]
    assert not unknown, f"label these code blocks with one of {sorted(LANGUAGES)}: {unknown}"


def test_the_pages_have_blocks_of_each_kind():  # the collection itself works: a broken regex finds nothing
    assert len(PYTHON) >= 8 and len(SHELL) >= 10


@pytest.mark.parametrize("page", PYTHON)
def test_python_blocks_run_as_printed(page, tmp_path):
    sources = [(line, source) for line, language, source, reason in blocks(page) if language == "python"
               and reason is None]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(sources), cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name(page)}: {done.stderr[-3000:]}"


def script_argv(command: list[str]) -> list[str] | None:
    """The ``scripts/X.py ...`` part of a command that runs a script of the checkout, or None."""
    at = next((i for i, word in enumerate(command) if re.fullmatch(r"(\./)?scripts/[a-z_]+\.py", word)), None)
    return None if at is None else command[at:]


@pytest.mark.parametrize(("page", "line", "command"), SHELL)
def test_shell_commands_are_accepted_as_printed(page, line, command):
    where = f"{name(page)}:{line}: {' '.join(command)}"
    if command[0] == "make":
        done = subprocess.run(["make", "-n", *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{where}: {done.stderr[-1000:]}"
        return
    argv = script_argv(command)
    assert argv is not None, f"{where}: neither make nor a script of scripts/; mark it <!-- not-run: why -->"
    environment = {**os.environ, "GAE_CHECK_ARGS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=120)
    checked = "arguments accepted" in done.stdout or "--print_config" in argv  # that one prints, then exits
    assert done.returncode == 0 and checked, f"{where}: {done.stderr[-1500:]}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_data_blocks_parse(page):
    parse = {"yaml": yaml.safe_load, "toml": tomllib.loads, "json": json.loads}
    for _, language, source, _ in blocks(page):
        if language in parse:
            parse[language](source)  # raises, naming the problem, on a block that does not parse


def test_a_not_run_block_says_why():
    marked = [(page, line, reason) for page in PAGES for line, _, _, reason in blocks(page) if reason is not None]
    assert all(len(reason) > 10 for _, _, reason in marked), marked
