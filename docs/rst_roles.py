"""A griffe extension of the docs site (docs/mkdocs.yml): the docstrings' reStructuredText as Markdown.

gae's docstrings follow torch.nn: Google sections (``Args:``) with Sphinx roles (``:class:`~gae.KNNMemory```,
``:math:`x```), ``.. math::`` blocks and ``Examples::`` doctests, which mkdocstrings would show as
written. In the site only (the sources stay as they are), each role becomes a code span of its
target (the last part of a ``~`` target), each math block a fenced block, and ``Examples::`` a
Google ``Examples:`` section, so the doctests render as code.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|obj|exc|math):`([^`]+)`")
MATH_BLOCK = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)\n"  # the directive, its first line
                        r"(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)*)", flags=re.M)  # the indented block


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _math_block(match: re.Match[str]) -> str:
    indent = match.group("indent")
    lines = [match.group("first")] if match.group("first").strip() else []
    body = [line.strip() for line in match.group("body").splitlines()]
    lines += [line for line in body if line]
    fence = f"{indent}```text"
    return "\n".join([fence, *(f"{indent}{line}" for line in lines), f"{indent}```", "", ""])


def markdown(text: str) -> str:
    """``text``, a docstring, with its reStructuredText roles, math blocks and ``Examples::`` as Markdown."""
    text = MATH_BLOCK.sub(_math_block, text + "\n").rstrip("\n")
    text = re.sub(r"^([ \t]*)Examples::[ \t]*$", r"\1Examples:", text, flags=re.M)
    return ROLE.sub(_role, text)


class RstRoles(Extension):
    """Rewrite every docstring griffe loads with :func:`markdown`."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
