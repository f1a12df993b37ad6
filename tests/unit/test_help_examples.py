"""Every command's --help ends with examples, and every example parses with that command's own parser; the help
says what the command does, and answers without importing torch, Ray, MLflow or pandas."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nre_ray.config import ConfigError, choices
from nre_ray.data.__main__ import build_cli as data_parser
from nre_ray.evaluate import build_parser as evaluate_parser
from nre_ray.predict import build_parser as predict_parser
from nre_ray.serve.cli import build_parser as serve_parser
from nre_ray.standin import build_parser as standin_parser
from nre_ray.standin import main as standin_main
from nre_ray.train import cli_parser as train_parser
from nre_ray.tune.__main__ import sweep_config, sweep_parser

REPO = Path(__file__).resolve().parents[2]


def _subcommand(name: str):
    parser = data_parser()
    action = next(a for a in parser._subparsers._group_actions if a.choices)  # the inspect/convert sub-parsers
    return action.choices[name]


COMMANDS = {
    "nre_ray.train": (train_parser, train_parser),
    "nre_ray.predict": (predict_parser, predict_parser),
    "nre_ray.evaluate": (evaluate_parser, evaluate_parser),
    "nre_ray.serve": (serve_parser, serve_parser),
    "nre_ray.tune": (sweep_parser, sweep_parser),
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


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_tune_says_the_epochs_a_trial_trains_as_it_trains_them():
    text = _flat(sweep_parser().format_help())
    in_description = re.search(r"--epochs is the most a trial trains \(default here: (\d+)\)", text)
    in_option = re.search(r"--epochs EPOCHS The most epochs a trial trains;[^(]*\(default: (\d+)", text)
    assert in_description and in_option, text
    for model in (["--model", "cnn"], ["--model", "bert", "--pretrained", "MODEL_DIR"]):  # train's bert default: 6
        actual = sweep_config(sweep_parser().parse_args(model)).train.epochs
        assert int(in_description[1]) == int(in_option[1]) == actual


def test_tune_does_not_list_patience_and_says_why_it_refuses_one():
    assert "--patience" not in sweep_parser().format_help()
    assert sweep_config(sweep_parser().parse_args([])).train.patience == 0  # the trials never stop by themselves
    with pytest.raises(ConfigError, match="--patience: ASHA stops weak trials in a sweep"):
        sweep_config(sweep_parser().parse_args(["--patience", "3"]))


def test_standin_options_come_before_or_after_the_command(tmp_path, capsys):
    parser = standin_parser()
    after = parser.parse_args(["upload", "--dir", "D", "data", "s3://b/k"])
    before = parser.parse_args(["--dir", "D", "upload", "data", "s3://b/k"])
    assert vars(after) == vars(before)
    assert (after.command, after.dir, after.local, after.uri) == ("upload", "D", "data", "s3://b/k")
    assert parser.parse_args(["upload", "data", "s3://b/k"]).dir == ".standin"
    ports = parser.parse_args(["--dir", "D", "up", "--s3-port", "9100", "--mlflow-port", "5100"])
    assert (ports.dir, ports.s3_port, ports.mlflow_port, ports.gcs_port) == ("D", 9100, 5100, 6379)
    # the command reads the folder given after it: there is no stand-in there
    assert standin_main(["upload", "--dir", str(tmp_path), "data", "s3://b/k"]) == 2
    assert capsys.readouterr().err.startswith(f"error: no stand-in in {tmp_path.absolute()} ")


def test_every_standin_option_says_what_it_is():
    for action in standin_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 20, action.option_strings


def test_the_commands_take_the_formats_and_bad_row_policies_the_library_knows():
    from nre_ray.config import BAG_ONLY_FORMATS
    from nre_ray.data.formats import FORMATS
    from nre_ray.inference.predictor import ON_BAD_ROWS

    # (predict's and evaluate's --format, without importing the readers; NYT10's TSV is read by the bag task alone)
    assert choices("data.format") == FORMATS + BAG_ONLY_FORMATS
    assert choices("data.on_bad_rows") == ON_BAD_ROWS


HEAVY = ("torch", "ray", "mlflow", "pandas", "pyarrow")


@pytest.mark.parametrize("command", ["train", "tune", "evaluate", "predict", "serve", "data", "standin"])
def test_help_imports_no_torch_ray_mlflow_or_pandas(command):
    script = (f"import runpy, sys\nsys.argv = ['nre_ray.{command}', '--help']\ntry:\n"
              f"    runpy.run_module('nre_ray.{command}', run_name='__main__')\nexcept SystemExit as err:\n"
              f"    assert err.code == 0, err.code\n"
              f"print('imported:', sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m nre_ray." in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == "imported: []"
