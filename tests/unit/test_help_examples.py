"""Every command's --help ends with examples, and every example parses with that command's own parser."""

from __future__ import annotations

import shlex

import pytest

from nre_ray.data.__main__ import build_cli as data_parser
from nre_ray.evaluate import build_parser as evaluate_parser
from nre_ray.predict import build_parser as predict_parser
from nre_ray.train import cli_parser as train_parser


def _subcommand(name: str):
    parser = data_parser()
    action = next(a for a in parser._subparsers._group_actions if a.choices)  # the inspect/convert sub-parsers
    return action.choices[name]


COMMANDS = {
    "nre_ray.train": (train_parser, train_parser),
    "nre_ray.predict": (predict_parser, predict_parser),
    "nre_ray.evaluate": (evaluate_parser, evaluate_parser),
    "nre_ray.data inspect": (lambda: _subcommand("inspect"), data_parser),
    "nre_ray.data convert": (lambda: _subcommand("convert"), data_parser),
}


def _examples(epilog: str) -> list[list[str]]:
    """The example command lines of an epilog (continuation lines joined, comments dropped)."""
    text = epilog.split("examples:", 1)[1].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip().startswith("python -m")]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_example_parses(command):
    make_help, make_full = COMMANDS[command]
    epilog = make_help().epilog or ""
    examples = _examples(epilog)
    assert len(examples) >= 3, f"{command}: a few examples at the end of --help"
    prefix = ["python", "-m", *command.split()]
    for argv in examples:
        assert argv[: len(prefix)] == prefix, argv
        full_argv = argv[3:]  # the subcommand stays for `python -m nre_ray.data`
        make_full().parse_args(full_argv)  # an unknown flag or a bad choice exits here


def test_help_shows_the_examples(capsys):
    for make_help, _ in COMMANDS.values():
        with pytest.raises(SystemExit):
            make_help().parse_args(["--help"])
        assert "\nexamples:\n  python -m nre_ray." in capsys.readouterr().out
