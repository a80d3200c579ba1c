"""No command line of gae takes an abbreviated option: every parser is built with ``allow_abbrev=False``.

argparse's default reads ``--ste`` as ``--steps`` and ``--dec 5`` as whichever option starts so, so a
typo or a renamed option silently sets another one. Every parser in scripts/, training/ and gae/ is
found in the source (so a new script cannot slip by): a call of argparse's or jsonargparse's
``ArgumentParser`` must pass ``allow_abbrev=False``; training.cli's own parsers, which every script
uses, set it themselves, and so does every subclass (checked on an instance); ``auto_cli`` keeps
training.cli's parser class. tests/test_scripts.py runs one script with an abbreviation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jsonargparse
import pytest

from training import cli

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(path for folder in ("scripts", "training", "gae") for path in (ROOT / folder).rglob("*.py"))
OWN = {"ArgumentParser", "JsonArgumentParser"}  # training.cli's parsers: allow_abbrev=False unless told otherwise
# every subclass of a parser in the repository, by file and class name: each is built below and checked
SUBCLASSES = {("training/cli.py", "ArgumentParser"), ("training/cli.py", "JsonArgumentParser"),
              ("scripts/train.py", "DecisionMemoryParser")}


def name_of(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def own_names(tree: ast.Module) -> set[str]:
    """How a file may call training.cli's parsers: ``cli.ArgumentParser`` or a name imported from it."""
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "training.cli" for alias in node.names if alias.name in OWN}
    return {f"cli.{name}" for name in OWN} | imported


def parser_calls() -> list[tuple[str, int, str, ast.Call, set[str]]]:
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        own = own_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and name_of(node.func).endswith("ArgumentParser"):
                found.append((str(path.relative_to(ROOT)), node.lineno, ast.unparse(node.func), node, own))
    return found


def test_the_source_builds_parsers_where_it_is_looked_for():
    calls = parser_calls()
    assert len(calls) >= 15 and any(path == "gae/mcp/server.py" for path, *_ in calls)


@pytest.mark.parametrize(("path", "line", "called", "node", "own"), parser_calls(),
                         ids=[f"{path}:{line}" for path, line, *_ in parser_calls()])
def test_every_parser_refuses_abbreviations(path, line, called, node, own):
    keywords = {keyword.arg: keyword.value for keyword in node.keywords}
    if "allow_abbrev" in keywords or called not in own:
        value = keywords.get("allow_abbrev")
        assert isinstance(value, ast.Constant) and value.value is False, (
            f"{path}:{line}: {called}(...) must pass allow_abbrev=False (or be training.cli's parser)")


def test_every_parser_class_of_the_repository_refuses_abbreviations():
    subclasses = {(str(path.relative_to(ROOT)), node.name) for path in SOURCES
                  for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                  and any(name_of(base).endswith("ArgumentParser") for base in node.bases)}
    assert subclasses == SUBCLASSES, "a new parser class: add it to SUBCLASSES, and check it below"
    from scripts.train import DecisionMemoryParser

    for parser in (cli.ArgumentParser(), cli.JsonArgumentParser(), DecisionMemoryParser()):
        assert parser.allow_abbrev is False, type(parser).__name__
        with pytest.raises(SystemExit):  # and it holds: a prefix is no option
            parser.add_argument("--decisions", type=int)
            parser.parse_args(["--decis", "5"])


def test_auto_cli_parses_with_training_clis_parser():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and name_of(node.func) == "auto_cli":
                assert "parser_class" not in {keyword.arg for keyword in node.keywords}, path

    def run(decisions: int = 1) -> int:
        return decisions

    assert jsonargparse.auto_parser(run, parser_class=cli.JsonArgumentParser).allow_abbrev is False
    with pytest.raises(SystemExit):
        cli.auto_cli(run, ["--decis", "5"])
    assert cli.auto_cli(run, ["--decisions", "5"]) == 5
