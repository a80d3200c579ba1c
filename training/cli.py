"""The scripts' command lines: a bad option or value is answered in a few lines, with exit status 2.

Every script under scripts/ parses its command line with this module, so a mistake reads the
same everywhere: at most five lines of stderr naming the option, the value, what is accepted and
the closest option to a typo (``unrecognized option --seedz; did you mean --seeds?``), then the
command that lists the options; exit status 2, no traceback. A prefix of an option is a typo,
not the option (``--trainer.max_epoch``), as in jsonargparse 5. A simple rule on a value is
checked at parse time (:func:`int_at_least`, :func:`number_in` as argparse ``type=``: nothing has
run yet and ``--help`` can say the rule); a value only the object built from it can judge (a
:class:`~gae.JudgmentConfig` option, a data module's ``batch_size``) is refused by that object's
ValueError or TypeError, answered the same way by :func:`refusals`, which a script puts around
the building only: an error raised later, while the run works, is a bug and keeps its traceback
(``GAE_TRACEBACK=1`` shows a refusal's traceback too).

- :class:`ArgumentParser`: ``argparse.ArgumentParser`` with these errors, a drop-in.
- :class:`JsonArgumentParser`: ``jsonargparse.ArgumentParser`` with these errors, nested options
  included (``--model.judgments.seed.tauu``: the option path, the bad key, its close match among
  the class's parameters); ``scripts/train.py`` puts it under LightningCLI's parser.
- :func:`auto_cli`: ``jsonargparse.auto_cli`` with that parser, and the refusal of a value by the
  function it runs (a ValueError or TypeError raised by the function's own code, or by a check of
  its arguments marked :func:`argument_check`) answered in one line too.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import linecache
import math
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import jsonargparse

TRACEBACK = "GAE_TRACEBACK"  # set to 1: a refused value shows its traceback instead of one line
ACCEPTED_SHOWN = 40  # an unknown option lists the accepted ones when there are at most this many

_Function = TypeVar("_Function", bound=Callable[..., Any])
_CHECKS: set[types.CodeType] = set()  # the code of the functions marked argument_check

_KEY = re.compile(r'Parser key "([^"]+)"')
_NESTED = re.compile(r"NestedArg\(key='([^']+)'")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
# an unknown option of a nested group (a dataclass field of a dataclass: JudgmentConfig's rule.tauu), in a
# mapping (``{rule: {tauu: 3}}``) or on the command line (``--judgment.rule.tauu 3``)
_GROUP_NOT_ACCEPTED = re.compile(r"Group '([^']+)' does not accept option '([^']+)'")
_GROUP_UNRECOGNIZED = re.compile(r"unrecognized arguments: --([\w.]+)\.(\w+)\b")
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_EXPECTED = re.compile(r"Expected an? (.+?)\. Got value: (.*)")
_LITERAL = re.compile(r"Literal(\[.*\])")
_CLASS = re.compile(r"<class '(?:builtins\.)?([\w.]+)'>")
_NAME = re.compile(r"`?([A-Za-z_]\w*)`?")
_GOT = re.compile(r"\bgot (\S+)$")
_UNION = "Does not validate against any of the Union subtypes"
_UNRECOGNIZED = "unrecognized arguments: "


def close_match(word: str, choices: Sequence[str]) -> str | None:
    """The choice closest to ``word`` (difflib's ratio, at least 0.6), or None.

    A dotted option is matched first among the options of its own group: ``--data.batchsize``
    finds ``--data.batch_size`` before ``--model.batch_size`` could be considered."""
    group = word.rpartition(".")[0]
    siblings = [choice for choice in choices if group and choice.rpartition(".")[0] == group]
    for pool in (siblings, list(choices)):  # compared without the leading dashes every option shares
        bare = {choice.lstrip("-"): choice for choice in pool}
        found = difflib.get_close_matches(word.lstrip("-"), list(bare), n=1, cutoff=0.6)
        if found:
            return bare[found[0]]
    return None


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean X?"`` for the close match of ``word``, or ``""`` when there is none."""
    match = close_match(word, choices)
    return f"; did you mean {match}?" if match is not None else ""


def accepted_line(names: Sequence[str]) -> list[str]:
    """``["accepted: a, b, c"]``, or nothing when there are none or more than :data:`ACCEPTED_SHOWN`."""
    return [f"accepted: {', '.join(names)}"] if 0 < len(names) <= ACCEPTED_SHOWN else []


def command(prog: str) -> str:
    """How the user runs ``prog``: ``python scripts/train.py fit`` for the ``train.py fit`` of a
    jsonargparse subcommand started as ``python scripts/train.py``."""
    prog = prog.replace(" [options]", "")
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
    if script and prog.split(" ", 1)[0] == os.path.basename(script):
        return " ".join(["python", script, *prog.split(" ")[1:]])
    return prog


def fail(prog: str, lines: Sequence[str], hint: str = "") -> NoReturn:
    """Print ``prog: error: <first line>``, the other lines, and the line that says where the
    options are listed, on stderr; exit with status 2, argparse's status for a bad command line."""
    first, *rest = [*lines] or ["bad command line"]
    text = [f"{prog.replace(' [options]', '')}: error: {first}", *rest,
            f"run '{command(prog)} --help' for the options{hint}"]
    sys.stderr.write("\n".join(text) + "\n")
    raise SystemExit(2)


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option a parser shows, help options, hidden ones (``help=SUPPRESS``) and
    jsonargparse's ``.help`` and ``+`` (append) forms aside."""
    return [option for option, action in parser._option_string_actions.items()
            if option.startswith("--") and option != "--help" and not option.endswith((".help", "+"))
            and action.help != argparse.SUPPRESS]


def unrecognized(message: str, options: Sequence[str]) -> list[str] | None:
    """argparse's ``unrecognized arguments: --seedz 3`` as one line per unknown option with its
    close match, and the accepted options when they are few; None for another message."""
    if not message.startswith(_UNRECOGNIZED):
        return None
    words = [token.split("=", 1)[0] for token in message[len(_UNRECOGNIZED):].split() if token.startswith("-")]
    if not words:
        return [message]
    lines = [f"unrecognized option {word}{did_you_mean(word, options)}" for word in words[:3]]
    group = words[0].rpartition(".")[0]
    return lines + accepted_line([option for option in options if option.rpartition(".")[0] == group])


def parameters(class_path: str, group: str = "") -> list[str]:
    """The keyword parameters of the class at ``class_path`` (``gae.JudgmentConfig``: its
    options), or of the class of its nested ``group`` (``'rule'``: the fields of
    ``JudgmentConfig.rule``'s type); none when it cannot be imported."""
    found = nested_class(class_path, group)
    try:
        signature = inspect.signature(found) if found is not None else None
    except (TypeError, ValueError):
        signature = None
    if signature is None:
        return []
    return [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def nested_class(class_path: str, group: str = "") -> Any:
    """The class at ``class_path``, or the type of its (dotted) nested ``group``; None when either
    cannot be found."""
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
        for part in filter(None, group.split(".")):
            found = typing.get_type_hints(found)[part]
    except (ImportError, AttributeError, KeyError, NameError, TypeError):
        return None
    return found if inspect.isclass(found) else None


def first_error(message: str) -> str:
    """The error that matters in a message of jsonargparse: past a union's dump (``Does not
    validate against any of the Union subtypes ... Errors: - ...``), the first error of a subtype
    other than None; otherwise the message's last line that says something."""
    if _UNION in message and "Errors:" in message:
        block, _, given = message.split("Errors:", 1)[1].partition("Given value type:")
        errors = [" ".join(item.split()) for item in re.split(r"\n\s*- ", "\n" + block.strip())]
        errors = [error for error in errors if error and error != "Expected a <class 'NoneType'>"]
        kinds = [_CLASS.sub(lambda m: m.group(1), error[len("Expected a "):].split(". Got value")[0])
                 for error in errors if error.startswith("Expected a ")]
        value = given.partition("Given value: ")[2].strip()
        if errors and len(kinds) == len(errors):  # none of the types takes the value: say them all
            return f"expected {' or '.join(kinds)}, got {value!r}"
        if errors:
            return errors[0]
    lines = [_KEY.sub("", line).strip(" :") for line in message.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else message


def explain(message: str) -> list[str]:
    """The lines that say what is wrong in a parse error of jsonargparse (other than an unknown
    option of the command line itself, see :func:`unrecognized`): the option path, the bad key
    with its close match among the class's parameters, or the value with what is accepted."""
    keys = _KEY.findall(message)
    nested = _NESTED.search(message)
    option = "--" + ".".join([keys[0], nested.group(1)] if keys and nested else keys[:1])
    unknown = _NOT_ACCEPTED.search(message) or _GROUP_NOT_ACCEPTED.search(message) \
        or _GROUP_UNRECOGNIZED.search(message)
    if keys and unknown is not None:
        group, bad = unknown.groups() if unknown.re is not _NOT_ACCEPTED else ("", unknown.group(1))
        owners = _CLASS_PATH.findall(message[:unknown.start()])
        accepted = parameters(owners[-1], group) if owners else []
        found = nested_class(owners[-1], group) if owners else None
        owner = found.__name__ if found is not None else keys[0]
        return [f"{option}: {owner} has no option '{bad}'{did_you_mean(bad, accepted)}", *accepted_line(accepted)]
    expected = _EXPECTED.findall(message)
    if keys and expected:
        kind, value = expected[-1]
        if not nested and len(keys) > 1:
            option += "." + keys[-1]
        choices = _literal_choices(kind)
        if choices:
            return [f"{option}: {value!r} is not one of {', '.join(map(repr, choices))}"
                    + did_you_mean(value, choices)]
        return [f"{option}: expected {_CLASS.sub(lambda m: m.group(1), kind)}, got {value!r}"]
    if keys:
        return [f"{option}: {first_error(message)}"]
    return [first_error(message)]


def _literal_choices(kind: str) -> list[str]:
    """The values of a ``typing.Literal[...]`` as jsonargparse writes it; none for another type."""
    literal = _LITERAL.search(kind)
    try:
        return [str(choice) for choice in ast.literal_eval(literal.group(1))] if literal is not None else []
    except (ValueError, SyntaxError):  # a value Python cannot read back (an enum member): no list
        return []


def name_option(message: str, given: Sequence[tuple[str, str | None]], known: Sequence[str] = ()) -> str:
    """``message`` with its first word, a parameter's name (``batch_size must be >= 1, got 0``),
    replaced by the option that sets it (``--data.batch_size must be ...``): the one option of
    the command line ``given`` (pairs of option and value) that ends with that name (or with a
    group and a field that make it: ``--model.judgments.seed.trust.rate`` for ``trust_rate``) and
    whose value is the one the message reports, else the one option among ``known`` that ends
    with it; ``message`` as it is when none or several do."""
    found = _NAME.match(message)
    if found is None:
        return message
    name, reported = found.group(1), _GOT.search(message)

    def ends(option: str) -> bool:
        parts = option.lstrip("-").replace("-", "_").split(".")
        return name in (parts[-1], "_".join(parts[-2:]))

    def same(value: str | None) -> bool:
        return reported is None or value is None or _same_value(value, reported.group(1))

    for candidates in ([o for o, v in given if ends(o) and same(v)], [o for o in known if ends(o)]):
        unique = list(dict.fromkeys(candidates))
        if unique:
            return f"{unique[0]}{message[found.end():]}" if len(unique) == 1 else message
    return message


def _same_value(given: str, reported: str) -> bool:
    reported = reported.strip().strip("'\"")
    try:
        return given == reported or float(given) == float(reported)
    except ValueError:
        return False


def given_options(args: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """The long options of a command line (``args``, or ``sys.argv[1:]``) with their values
    (``--a=1`` or ``--a 1``; None for a flag)."""
    args = list(sys.argv[1:] if args is None else args)
    pairs: list[tuple[str, str | None]] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            option, equals, value = arg.partition("=")
            following = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            pairs.append((option, value if equals else following))
    return pairs


def refuse(error: BaseException, prog: str, given: Sequence[tuple[str, str | None]], known: Sequence[str]) -> NoReturn:
    """Answer ``error``, a value refused by what was built from it, in one line naming the option
    (or, when the message names none, the class whose constructor refused it)."""
    message = first_error(str(error))
    named = name_option(message, given, known)
    builder = next((type(frame.f_locals["self"]).__name__ for frame, _ in _walk(error.__traceback__)
                    if frame.f_code.co_name == "__init__" and "self" in frame.f_locals), None)
    if named == message and builder is not None:
        named += f" (refused by {builder})"
    fail(prog, [named], hint=f" ({TRACEBACK}=1 shows the traceback)")


def _traceback_asked() -> bool:
    return os.environ.get(TRACEBACK, "") not in ("", "0")


@contextmanager
def refusals(parser: argparse.ArgumentParser | None = None, args: Sequence[str] | None = None,
             errors: tuple[type[BaseException], ...] = (ValueError, TypeError)) -> Iterator[None]:
    """Around the code that builds objects from parsed arguments: ``errors`` raised inside are
    the refusal of a value given on the command line, answered in one line (the option named
    when one of ``parser``'s options, or of the command line ``args``, ends with the name the
    message starts with) and exit status 2, without a traceback (unless ``GAE_TRACEBACK=1``).

    Put it around the building only, never around the run: an error raised while the run works
    is a bug, and its traceback is what finds it.

    Args:
        parser: the parser of the command line (its options, and its ``prog`` for the hint).
            Default: None (the script's name).
        args: the command line parsed. Default: None (``sys.argv[1:]``).
        errors: the exception types that are refusals. Default: ValueError and TypeError.
    """
    try:
        yield
    except errors as error:
        if _traceback_asked():
            raise
        refuse(error, parser.prog if parser is not None else os.path.basename(sys.argv[0]), given_options(args),
               long_options(parser) if parser is not None else [])


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type=`` for an int >= ``low``: ``--events -1`` is refused at parse time as
    ``argument --events: must be an int >= 0, got '-1'``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {text!r}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def number_in(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
              high_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in ``low..high`` (ends open or closed as given):
    ``--tau 0`` with ``number_in(0, low_open=True)`` is refused as ``argument --tau: must be a
    number in (0, inf], got '0'``."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be a number in {interval}, got {text!r}")
        return value

    parse.__name__ = f"number in {interval}"
    return parse


CHECK_ARGS = "GAE_CHECK_ARGS"  # 1: a script parses its command line, says so, exits 0 (tests/test_doc_blocks.py)


def check_only() -> bool:
    """Whether this run only checks its command line (:data:`CHECK_ARGS` set): the docs' long
    commands are tested that way, so a renamed or removed option fails without a run of minutes."""
    return os.environ.get(CHECK_ARGS, "") not in ("", "0")


def arguments_checked(prog: str) -> NoReturn:
    print(f"{prog}: arguments accepted ({CHECK_ARGS} is set: nothing run)")
    raise SystemExit(0)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors take a few lines: an unknown option with its close
    match (and the accepted options when they are few), any other error as argparse words it,
    then where the options are listed; exit status 2. A prefix of an option is not the option
    (``allow_abbrev=False``), so a typo never silently sets another option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(self.prog, unrecognized(message, long_options(self)) or [message])

    def parse_args(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        parsed = super().parse_args(*args, **kwargs)
        if check_only():
            arguments_checked(self.prog)
        return parsed


class JsonArgumentParser(jsonargparse.ArgumentParser):
    """``jsonargparse.ArgumentParser`` whose errors take a few lines: an unknown option, nested
    anywhere (``--trainer.max_epoch``, ``--model.judgment.drift_mod``, ``--model.judgments.seed.tauu``
    in a ``dict[str, JudgmentConfig]``), with the option path, the bad key, its close match and the
    accepted keys; a bad value with the option, the value and what is accepted; exit status 2.
    Parsers that raise instead of exiting (``exit_on_error=False``, ``JSONARGPARSE_DEBUG``) behave
    as jsonargparse's own. A prefix of an option is not the option (``allow_abbrev=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        fail(parser.prog, unrecognized(message, long_options(parser)) or explain(message))


def argument_check(function: _Function) -> _Function:
    """Mark ``function`` as a check of the arguments of a function that :func:`auto_cli` runs:
    its ValueError and TypeError are then answered in one line when it runs from the command
    line. ``function`` itself is returned unchanged (a call from Python raises as before)."""
    _CHECKS.add(function.__code__)
    return function


def _refused_by(error: BaseException, component: Callable[..., Any]) -> bool:
    """Whether ``error`` was raised by ``component``'s own code or by a check it called."""
    code = getattr(inspect.unwrap(component), "__code__", None)
    walked = list(_walk(error.__traceback__))
    frames = [frame.f_code for frame, _ in walked]
    if code not in frames:
        return False
    at = frames.index(code)
    below = frames[at + 1:]
    if below:
        return below[0] in _CHECKS
    # raised in the component's own body: a refusal only by its own raise statement, not a bad call or a
    # built-in failing there (a bug of the run keeps its traceback)
    frame, line = walked[at]
    return linecache.getline(frame.f_code.co_filename, line).lstrip().startswith("raise ")


def _walk(tb: types.TracebackType | None) -> Iterator[tuple[types.FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def auto_cli(component: Callable[..., Any], args: list[str] | None = None, **kwargs: Any) -> Any:
    """``jsonargparse.auto_cli(component, args, **kwargs)`` with :class:`JsonArgumentParser`: a bad
    option or value in a few lines; and a ValueError or TypeError that ``component`` raises from
    its own code, or from a check marked :func:`argument_check` that it calls, is the refusal of
    an argument, answered in one line with the option named. An error raised deeper, while the
    function works, keeps its traceback."""
    kwargs.setdefault("parser_class", JsonArgumentParser)
    if check_only():
        parser = jsonargparse.auto_parser(component, **kwargs)
        parser.parse_args(args)
        arguments_checked(os.path.basename(sys.argv[0]))
    try:
        return jsonargparse.auto_cli(component, args, **kwargs)
    except (ValueError, TypeError) as error:
        if _traceback_asked() or not _refused_by(error, component):
            raise
        refuse(error, os.path.basename(sys.argv[0]), given_options(args),
               [f"--{name}" for name in inspect.signature(component).parameters])
