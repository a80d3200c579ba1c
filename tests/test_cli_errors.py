"""A bad option or value on a script's command line is answered in a few lines, exit status 2, no traceback.

The scripts run as subprocesses, all at once (each import of torch and Lightning costs seconds);
the pieces of training/cli.py (close matches, the reading of jsonargparse's messages, the
refusals) are tested in this process against real argparse and jsonargparse parsers.
"""

from __future__ import annotations

import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from gae import JudgmentConfig
from gae.judgment.config import PATHS
from training import cli

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["scripts/train.py", "fit", "--config", "configs/default.yaml"]
MAX_LINES = 5


def mixed_confirmations(path: Path) -> Path:
    """The example decisions' first 40 rows with one decision confirmed and the others unknown:
    a stream the module refuses inside its first training step, a ValueError of the run itself."""
    rows = list(csv.reader((ROOT / "data" / "example_decisions.csv").open()))
    header, body = rows[0], rows[1:41]
    body[0][header.index("confirmed")] = "1"
    with path.open("w", newline="") as file:
        csv.writer(file).writerows([header, *body])
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every command line of the tests below, run in parallel; by name."""
    folder = tmp_path_factory.mktemp("cli")
    root = ["--trainer.default_root_dir", str(folder / "runs")]  # a run that wrongly starts writes there
    commands = {
        "typo": [*TRAIN, *root, "--model.judgment.drift_mod", "adaptive"],
        "dict typo": [*TRAIN, *root, "--model.judgments.seed.tauu", "3"],
        "unknown": [*TRAIN, *root, "--data.batchsize", "3", "--trainer.max_epoch", "3"],
        "batch size": [*TRAIN, *root, "--data.batch_size", "0"],
        "run error": [*TRAIN, "--config", "configs/file.yaml", "--trainer.default_root_dir", str(folder / "run"),
                      "--trainer.enable_progress_bar", "false",
                      "--data.stream.init_args.path", str(mixed_confirmations(folder / "mixed.csv"))],
        "evaluate seeds": ["scripts/evaluate.py", "--seeds", "0", "--out", str(folder / "report")],
        "evaluate typo": ["scripts/evaluate.py", "--seedz", "3"],
        "inspect events": ["scripts/inspect_memory.py", str(folder / "memory.pt"), "--events", "-1"],
        "bench repeats": ["scripts/bench.py", "--repeats", "0", "--no-readme", "--out", str(folder / "bench.json")],
        "bench prefix": ["scripts/bench.py", "--repeat", "2", "--no-readme", "--out", str(folder / "bench.json")],
    }
    started = {name: subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for name, args in commands.items()}
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=600)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert not (folder / "runs").exists()  # no refused command line started a run
    return done


def refused(result: subprocess.CompletedProcess, *expected: str) -> list[str]:
    """The stderr lines of a refused command line, after checking the status, the length, that
    no traceback is shown, and that every ``expected`` text is there."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) <= MAX_LINES, result.stderr
    for text in expected:
        assert text in result.stderr, (text, result.stderr)
    return lines


def test_a_nested_typo_names_the_option_its_close_match_and_every_accepted_key(runs):
    lines = refused(runs["typo"], "--model.judgment.drift_mod", "'drift_mod'", "did you mean drift_mode?")
    fields = [f.name for f in dataclasses.fields(JudgmentConfig)]  # the groups, learning, judges; then flat names
    assert lines[-2] == "accepted: " + ", ".join([*fields, *(name for name, path in PATHS.items() if len(path) == 2)])
    assert lines[-1] == "run 'python scripts/train.py fit --help' for the options"


def test_a_typo_inside_a_dict_of_judgment_configs_names_the_whole_path(runs):
    refused(runs["dict typo"], "--model.judgments.seed.tauu", "'tauu'", "did you mean tau?")


def test_unknown_options_each_get_a_close_match_and_a_prefix_is_no_option(runs):
    lines = refused(runs["unknown"], "accepted: --data.stream, --data.batch_size, --data.num_workers")
    assert lines[:2] == ["train.py fit: error: unrecognized option --data.batchsize; did you mean --data.batch_size?",
                         "unrecognized option --trainer.max_epoch; did you mean --trainer.max_epochs?"]


def test_a_value_a_constructor_refuses_is_one_line_naming_the_option(runs):
    refused(runs["batch size"], "error: --data.batch_size must be >= 1, got 0", "GAE_TRACEBACK=1")


def test_an_error_of_the_run_itself_keeps_its_traceback(runs):
    result = runs["run error"]
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert "ValueError: a batch mixes known and unknown confirmations" in result.stderr


def test_a_function_run_by_auto_cli_refuses_a_value_in_one_line(runs):
    refused(runs["evaluate seeds"], "evaluate.py: error: --seeds must be an int >= 2, got 0")
    refused(runs["evaluate typo"], "unrecognized option --seedz; did you mean --seeds?")


def test_argparse_scripts_refuse_a_value_and_a_typo_in_a_few_lines(runs):
    refused(runs["inspect events"], "argument --events: must be an int >= 0, got '-1'")
    refused(runs["bench repeats"], "bench.py: error: --repeats must be >= 1, got 0")
    lines = refused(runs["bench prefix"], "unrecognized option --repeat; did you mean --repeats?")
    assert lines[-1] == "run 'python scripts/bench.py --help' for the options"


# -- the pieces, in this process


def test_close_match_prefers_the_group_and_finds_nothing_far():
    options = ["--data.batch_size", "--model.batch_size", "--seeds", "--settings"]
    assert cli.close_match("--data.batchsize", options) == "--data.batch_size"
    assert cli.close_match("--seedz", options) == "--seeds"
    assert cli.close_match("--colour", options) is None
    assert cli.did_you_mean("--colour", options) == ""


def test_unrecognized_reads_every_unknown_option_and_leaves_other_messages():
    lines = cli.unrecognized("unrecognized arguments: --seedz 3 --outt=x", ["--seeds", "--out"])
    assert lines == ["unrecognized option --seedz; did you mean --seeds?",
                     "unrecognized option --outt; did you mean --out?", "accepted: --seeds, --out"]
    assert cli.unrecognized("argument --n: invalid int value: 'x'", ["--n"]) is None


def tiny_parser() -> cli.JsonArgumentParser:
    """A jsonargparse parser with the argument types of DecisionMemoryModule's judgment options."""
    parser = cli.JsonArgumentParser(prog="tiny.py")
    parser.add_argument("--judgments", type=dict[str, JudgmentConfig] | None, default=None)
    parser.add_argument("--judgment", type=JudgmentConfig | None, default=None)
    parser.add_argument("--seed", type=bool | int, default=True)
    parser.add_argument("--rate", type=float, default=0.05)
    return parser


def refused_here(capsys, call) -> list[str]:
    with pytest.raises(SystemExit) as exit_:
        call()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and len(err.splitlines()) <= MAX_LINES, err
    return err.splitlines()


@pytest.mark.parametrize(("args", "first"), [
    (["--judgments", "{seed: {}}", "--judgments.seed.tauu", "3"],
     "--judgments.seed.tauu: JudgmentConfig has no option 'tauu'; did you mean tau?"),
    (["--judgments", "{seed: {tauu: 3}}"], "--judgments: JudgmentConfig has no option 'tauu'; did you mean tau?"),
    (["--judgment.drift_mode", "adaptiv"],
     "--judgment.drift_mode: 'adaptiv' is not one of 'seed', 'adaptive'; did you mean adaptive?"),
    (["--judgments", "{seed: {}}", "--judgments.seed.learning", "lvk"],
     "--judgments.seed.learning: 'lvk' is not one of 'gated', 'lvq'; did you mean lvq?"),
    # an option of a group (JudgmentConfig.rule, .drift): the group's class, the close match among its fields
    (["--judgments", "{seed: {}}", "--judgments.seed.rule.tauu", "3"],
     "--judgments.seed.rule.tauu: Rule has no option 'tauu'; did you mean tau?"),
    (["--judgments", "{seed: {rule: {tauu: 3}}}"], "--judgments: Rule has no option 'tauu'; did you mean tau?"),
    (["--judgment.drift.mod", "adaptive"], "--judgment.drift.mod: Drift has no option 'mod'; did you mean mode?"),
    (["--judgment.drift.mode", "adaptiv"],
     "--judgment.drift.mode: 'adaptiv' is not one of 'seed', 'adaptive'; did you mean adaptive?"),
    (["--seed", "x"], "--seed: expected bool or int, got 'x'"),
    (["--rate", "abc"], "--rate: expected float, got 'abc'"),
])
def test_jsonargparse_errors_read_in_a_few_lines(capsys, args, first):
    lines = refused_here(capsys, lambda: tiny_parser().parse_args(args))
    assert lines[0] == f"tiny.py: error: {first}"
    assert lines[-1] == "run 'tiny.py --help' for the options"


def test_a_dict_value_refused_at_instantiation_names_its_option(capsys):
    parser = tiny_parser()
    args = ["--judgments", "{seed: {}, rec: {}}", "--judgments.rec.tau", "-1"]
    config = parser.parse_args(args)
    with pytest.raises(ValueError, match="tau must be in"):  # the bare error, outside refusals
        parser.instantiate(config)

    def build() -> None:
        with cli.refusals(parser, args):
            parser.instantiate(config)

    lines = refused_here(capsys, build)
    assert lines[0] == "tiny.py: error: --judgments.rec.tau must be in (0.0, inf), got -1.0"


def test_name_option_takes_the_given_option_with_the_reported_value():
    given = [("--model.judgments.seed.tau", "0.2"), ("--model.judgments.rec.tau", "-1")]
    assert cli.name_option("tau must be > 0, got -1.0", given) == "--model.judgments.rec.tau must be > 0, got -1.0"
    assert cli.name_option("tau must be > 0, got -3.0", given) == "tau must be > 0, got -3.0"  # none says -3
    assert cli.name_option("batch_size must be >= 1, got 0", [], ["--data.batch_size"]) == \
        "--data.batch_size must be >= 1, got 0"
    assert cli.name_option("lr must be > 0", [], ["--model.lr", "--optimizer.lr"]) == "lr must be > 0"  # which?
    nested = [("--model.judgments.seed.trust.rate", "-1")]  # a group's field, named by its flat name
    assert cli.name_option("trust_rate must be >= 0, got -1.0", nested) == \
        "--model.judgments.seed.trust.rate must be >= 0, got -1.0"


def argparse_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="counts.py")
    parser.add_argument("--events", type=cli.int_at_least(0), default=20)
    parser.add_argument("--tau", type=cli.number_in(0, low_open=True))
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def test_validators_refuse_at_parse_time_naming_the_option_the_value_and_the_rule(capsys):
    parser = argparse_parser()
    assert parser.parse_args(["--events", "0", "--tau", "0.5"]).events == 0
    lines = refused_here(capsys, lambda: parser.parse_args(["--events", "-1"]))
    assert lines[0] == "counts.py: error: argument --events: must be an int >= 0, got '-1'"
    lines = refused_here(capsys, lambda: parser.parse_args(["--tau", "nan"]))
    assert lines[0] == "counts.py: error: argument --tau: must be a number in (0, inf], got 'nan'"
    lines = refused_here(capsys, lambda: parser.parse_args(["--repeat", "2"]))  # a prefix is no option
    assert lines[0] == "counts.py: error: unrecognized option --repeat; did you mean --repeats?"


def test_refusals_answer_only_their_errors_and_show_the_traceback_when_asked(capsys, monkeypatch):
    parser = argparse_parser()

    def build() -> None:
        with cli.refusals(parser, ["--repeats", "0"]):
            raise ValueError("repeats must be >= 1, got 0")

    lines = refused_here(capsys, build)
    assert lines[0] == "counts.py: error: --repeats must be >= 1, got 0"
    with pytest.raises(KeyError), cli.refusals(parser):  # not a refusal: raised as it is
        raise KeyError("repeats")
    monkeypatch.setenv(cli.TRACEBACK, "1")
    with pytest.raises(ValueError, match="repeats must be"), cli.refusals(parser):
        raise ValueError("repeats must be >= 1, got 0")


def helper(count: int) -> int:
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")  # a helper's error: a bug of the run
    return count


@cli.argument_check
def checked(count: int) -> int:
    return helper(count)


def refuses_itself(count: int = 1) -> int:
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return count


def fails_deeper(count: int = 1) -> int:
    return helper(count)


def checks_first(count: int = 1) -> int:
    return checked(count)


def test_auto_cli_answers_the_functions_own_refusals_and_keeps_other_tracebacks(capsys):
    assert cli.auto_cli(refuses_itself, ["--count", "2"]) == 2
    assert refused_here(capsys, lambda: cli.auto_cli(refuses_itself, ["--count", "0"]))[0].endswith(
        "error: --count must be >= 1, got 0")
    assert refused_here(capsys, lambda: cli.auto_cli(checks_first, ["--count", "0"]))[0].endswith(
        "error: --count must be >= 1, got 0")
    with pytest.raises(ValueError, match="count must be >= 1"):  # raised deeper than the function: a bug
        cli.auto_cli(fails_deeper, ["--count", "0"])
    with pytest.raises(ValueError, match="count must be >= 1"):  # a call from Python raises as before
        checks_first(0)


def calls_wrongly(count: int = 1) -> int:
    """A script body with a bug: a call with the wrong arguments, and a built-in failing."""
    if count == 0:
        return divmod(count)  # type: ignore[call-arg]  # TypeError raised here, by no raise statement
    return int("x" * count)  # ValueError from a built-in


def test_auto_cli_keeps_the_traceback_of_a_bad_call_or_a_builtin_in_the_body():
    with pytest.raises(TypeError, match="divmod"):
        cli.auto_cli(calls_wrongly, ["--count", "0"])
    with pytest.raises(ValueError, match="invalid literal"):
        cli.auto_cli(calls_wrongly, ["--count", "2"])


def test_close_matches_ignore_the_dashes_every_option_shares():
    assert cli.close_match("--quiet", ["--out", "--seeds"]) is None  # 'out' is no match for 'quiet'
    assert cli.close_match("--seedz", ["--out", "--seeds"]) == "--seeds"


def test_check_only_builds_the_objects_so_a_refused_value_fails():
    script = [sys.executable, "scripts/train.py", "fit", "--config", "configs/default.yaml"]
    environment = {**__import__("os").environ, "GAE_CHECK_ARGS": "1"}
    bad = subprocess.run([*script, "--data.batch_size", "0"], cwd=ROOT, env=environment, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--data.batch_size must be >= 1, got 0" in bad.stderr
