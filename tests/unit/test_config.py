"""The typed config: CLI flags, TOML file, unknown keys and bad values."""

import pytest

from nre_ray.config import Config, ConfigError, build_parser, config_from_args


def test_flags_override_defaults():
    args = build_parser().parse_args(["--epochs", "3", "--no-lowercase", "--model", "pcnn", "--use-gpu"])
    cfg = config_from_args(args)
    assert (cfg.train.epochs, cfg.data.lowercase, cfg.model.model, cfg.train.use_gpu) == (3, False, "pcnn", True)
    assert cfg.select_metric == "macro_f1"


def test_toml_file_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nepochs = 7\nlr = 1\n[data]\nnegative_label = "Other"\n')
    cfg = config_from_args(build_parser().parse_args(["--config", str(path), "--epochs", "2"]))
    assert cfg.train.epochs == 2 and cfg.train.lr == 1.0
    assert cfg.select_metric == "pos_macro_f1"


def test_unknown_key_suggests_the_right_one(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nepoch = 7\n")
    with pytest.raises(ConfigError, match="unknown key 'epoch' \\(did you mean 'epochs'\\?\\)"):
        config_from_args(build_parser().parse_args(["--config", str(path)]))


def test_bad_values():
    with pytest.raises(ConfigError, match="expected int"):
        Config.from_dict({"train": {"epochs": "ten"}})
    with pytest.raises(ConfigError, match="--num-workers must be >= 1"):
        Config.from_dict({"train": {"num_workers": 0}})
    with pytest.raises(ConfigError, match="unknown section"):
        Config.from_dict({"trian": {}})


def test_round_trip():
    cfg = Config.from_dict({"model": {"model": "pcnn"}})
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert cfg.flat()["model.model"] == "pcnn"


def test_the_parser_knows_every_encoder_and_only_those():
    from nre_ray.config import MODELS
    from nre_ray.models import registry

    assert set(MODELS) == set(registry.MODELS)
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--model", "foo"])  # refused before Ray starts
    assert stopped.value.code == 2


def test_help_is_printable_and_says_each_default_once(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "30% slower" in text  # a literal %, not argparse's formatting
    assert "default: None" not in text and "default: False" not in text
    assert "--model {cnn,pcnn,bilstm,transformer,bert}" in text and "--tokenizer {regex,jieba}" in text


def test_version(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.startswith("nre_ray ")


def test_select_metric_choices_are_the_scores_and_are_checked_before_ray(capsys):
    import numpy as np

    from nre_ray.config import METRICS, metric_names
    from nre_ray.tasks.sentence import metrics

    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--select-metric", "f1"])
    assert stopped.value.code == 2
    assert "invalid choice: 'f1'" in capsys.readouterr().err and "macro_f1" in " ".join(METRICS)
    with pytest.raises(ConfigError, match="--select-metric pos_macro_f1 needs --negative-label"):
        Config.from_dict({"train": {"select_metric": "pos_macro_f1"}})
    with pytest.raises(ConfigError, match="is not one of"):
        Config.from_dict({"train": {"select_metric": "f1"}})  # a TOML file is checked the same way
    # metric_names gives exactly the keys nre_ray.tasks.sentence.metrics.scores reports, for each kind of label set
    for labels, negative in ((["a", "b"], None), (["a", "Other"], "Other"), (["a", "Other"], "NA"),
                             (["C-E(e1,e2)", "C-E(e2,e1)", "Other"], "Other"), (["C-E(e1,e2)", "Other"], None)):
        expected = set(metrics.scores(np.eye(len(labels), dtype=np.int64), labels, negative))
        assert set(metric_names(labels, negative)) == expected, (labels, negative)
        assert set(metric_names(labels, negative)) <= set(METRICS)


def test_a_model_has_its_own_defaults_for_what_is_not_given():
    bert = config_from_args(build_parser().parse_args(["--model", "bert", "--pretrained", "m", "--epochs", "3"]))
    assert (bert.train.epochs, bert.train.batch_size, bert.model.dropout, bert.train.weight_decay) == (3, 16, 0.1, 0.01)
    assert (bert.train.patience, bert.train.label_smoothing, bert.train.grad_clip) == (0, 0.0, 1.0)
    cnn = config_from_args(build_parser().parse_args([]))
    assert (cnn.train.epochs, cnn.train.patience, cnn.train.batch_size, cnn.model.dropout) == (100, 10, 32, 0.4)
    assert cnn.train.weight_decay == 1e-4
    assert cnn.model.hidden_size == 320
    transformer = config_from_args(build_parser().parse_args(["--model", "transformer"]))
    assert transformer.model.hidden_size == 256
    given = config_from_args(build_parser().parse_args(["--model", "transformer", "--hidden-size", "128"]))
    assert given.model.hidden_size == 128


def test_a_stored_config_keeps_what_its_run_did():
    """A checkpoint written before entity markers existed predicts without them."""
    raw = Config().to_dict()
    del raw["data"]["entity_markers"]
    assert Config.from_stored(raw).data.entity_markers is False
    assert Config.from_dict(raw).data.entity_markers is True
    raw["data"]["entity_markers"] = True
    assert Config.from_stored(raw).data.entity_markers is True


def test_why_training_stopped():
    from nre_ray.core.console import stop_reason

    assert stop_reason(13, 3, 100, 10, "macro_f1") == ("early stop: valid_macro_f1 did not improve for 10 epochs after "
                                                       "epoch 3 (--patience 10)")
    assert stop_reason(5, 5, 5, 0, "macro_f1") == ("the epoch budget ran out (--epochs 5) while valid_macro_f1 was "
                                                   "still improving: more --epochs may help")
    assert stop_reason(5, 3, 5, 0, "macro_f1") == "the epoch budget ran out (--epochs 5)"
    assert stop_reason(4, 3, 5, 0, "macro_f1") == "stopped after epoch 4 of 5"


def _parsers() -> dict[str, object]:
    """Every command's parser builder, by the command line it answers."""
    from nre_ray import evaluate, predict, standin, train
    from nre_ray.cluster import spot_watch
    from nre_ray.data.__main__ import build_cli
    from nre_ray.serve.__main__ import build_parser as serve_parser
    from nre_ray.tune.__main__ import sweep_parser

    return {"nre_ray.train": train.cli_parser, "nre_ray.tune": sweep_parser, "nre_ray.evaluate": evaluate.build_parser,
            "nre_ray.predict": predict.build_parser, "nre_ray.serve": serve_parser, "nre_ray.data": build_cli,
            "nre_ray.standin": standin.build_parser, "nre_ray.cluster.spot_watch": spot_watch.build_parser}


@pytest.mark.parametrize(("command", "argv", "says"), [
    ("nre_ray.train", ["--model", "cnnn"], "argument --model: invalid choice: 'cnnn' (choose from 'cnn', 'pcnn', "
                                           "'bilstm', 'transformer', 'bert'); did you mean 'cnn'?"),
    ("nre_ray.tune", ["--searcher", "optuan"], "argument --searcher: invalid choice: 'optuan'"),
    ("nre_ray.evaluate", ["--model", "m"], "the following arguments are required: --data."),
    ("nre_ray.predict", ["--model", "m", "--input", "i", "--output", "o", "--top-k", "x"],
     "argument --top-k: invalid int value: 'x'."),
    ("nre_ray.serve", ["--model", "m", "--bogus"], "unrecognized arguments: --bogus."),
    ("nre_ray.data", ["inspect", "--format", "csvv"], "argument --format: invalid choice: 'csvv'"),
    ("nre_ray.standin", ["upp"], "did you mean 'up'?"),
    ("nre_ray.cluster.spot_watch", [], "the following arguments are required: --address."),
])
def test_a_usage_error_is_one_line_for_every_command(command, argv, says, capsys):
    """argparse prints the whole usage before its error (52 lines for train); every command prints the one line
    that matters, with where to read the options."""
    with pytest.raises(SystemExit) as stopped:
        _parsers()[command]().parse_args(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    prog = f"python -m {command}" + (" inspect" if command == "nre_ray.data" else "")
    assert lines[0].endswith(f" See {prog} --help"), lines


#: Where the flags of one parser come from: by dest prefix ("" for a command's own options, "section." for train's
#: sections), the options class, or the class and the only fields the parser takes.
Sources = dict[str, "type | tuple[type, tuple[str, ...] | None]"]


def _typed_commands() -> dict[str, tuple[object, dict[str, Sources], dict[str, str]]]:
    """Every command, each with its parser builder; for each of its parsers ("" for its own, a subcommand's name for
    that subcommand's), the options classes its flags come from (:data:`Sources`); and the helps it gives its own
    way, by dest (a training flag that means something else in this command)."""
    from nre_ray import evaluate, predict, standin, train
    from nre_ray.cluster import s3_store, spot_watch
    from nre_ray.config import SECTIONS
    from nre_ray.data import __main__ as data_cli
    from nre_ray.serve.cli import ServeOptions, build_parser
    from nre_ray.tune import __main__ as tune_cli
    from nre_ray.tune.sweep import SweepOptions

    sections: Sources = {f"{name}.": cls for name, cls in SECTIONS.items()}
    inspect: Sources = {f"{name}.": (SECTIONS[name], fields) for name, fields in data_cli.INSPECT_SECTIONS.items()}
    return {"nre_ray.train": (train.cli_parser, {"": sections}, {}),
            "nre_ray.tune": (tune_cli.sweep_parser, {"": {**sections, "": SweepOptions}}, tune_cli.HELPS),
            "nre_ray.predict": (predict.build_parser, {"": {"": predict.PredictOptions}}, {}),
            "nre_ray.evaluate": (evaluate.build_parser, {"": {"": evaluate.EvaluateOptions}}, {}),
            "nre_ray.serve": (build_parser, {"": {"": ServeOptions}}, {}),
            "nre_ray.data": (data_cli.build_cli, {"": {}, "inspect": {**inspect, "": data_cli.InspectOptions},
                                                  "convert": {"": data_cli.ConvertOptions}}, data_cli.INSPECT_HELPS),
            "nre_ray.standin": (standin.build_parser, {name: {"": standin.StandinOptions}
                                                       for name in ("", *standin.COMMANDS)}, {}),
            "nre_ray.cluster.spot_watch": (spot_watch.build_parser, {"": {"": spot_watch.SpotWatchOptions}}, {}),
            "nre_ray.cluster.s3_store": (s3_store.build_parser, {"": {"": s3_store.S3StoreOptions}}, {})}


#: Flags the config layer adds itself, not from a field: argparse's --help, train's --version and --config.
_NOT_FIELDS = {"-h", "--help", "--version", "--config"}


def _parsers_of(parser: object) -> dict[str, object]:
    """A command's parser ("") and its subcommands' parsers, by name."""
    import argparse

    found = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _arguments(parser: object) -> list:
    """The flags and positional arguments of one parser, less those of :data:`_NOT_FIELDS` and the subcommand."""
    import argparse

    return [a for a in parser._actions if not set(a.option_strings) & _NOT_FIELDS
            and not isinstance(a, argparse._SubParsersAction)]


@pytest.mark.parametrize("command", ["nre_ray.train", "nre_ray.tune", "nre_ray.predict", "nre_ray.evaluate",
                                     "nre_ray.serve", "nre_ray.data", "nre_ray.standin", "nre_ray.cluster.spot_watch",
                                     "nre_ray.cluster.s3_store"])
def test_every_flag_of_a_command_is_a_field_of_its_typed_options(command):
    """Each flag and positional argument, of the command and of its subcommands, is made from one config field (its
    name, help, choices, and for a positional argument its name), and each field with a flag has one."""
    import dataclasses

    make_parser, sources, own_helps = _typed_commands()[command]
    parsers = _parsers_of(make_parser())
    assert set(parsers) == set(sources), f"{command}: the subcommands' parsers"
    made, wanted = set(), set()
    for name, parser in parsers.items():
        classes = {prefix: source if isinstance(source, tuple) else (source, None)
                   for prefix, source in sources[name].items()}
        for action in _arguments(parser):
            where = f"{command} {name} {action.option_strings or action.dest}"
            prefix = action.dest.rpartition(".")[0] + "." if "." in action.dest else ""
            field_name = action.dest.rpartition(".")[2]
            assert prefix in classes, f"{where}: no options class for {prefix!r}"
            cls = classes[prefix][0]
            fields = {f.name: f for f in dataclasses.fields(cls)}
            assert field_name in fields, f"{where}: not a field of {cls.__name__}"
            field = fields[field_name]
            if action.option_strings:
                assert action.option_strings[0] == "--" + field_name.replace("_", "-"), where
                assert field.metadata["flag"] is None, where
            else:
                assert action.metavar == field.metadata["flag"], where
            if action.dest in own_helps:
                assert action.help == own_helps[action.dest], where
            else:
                assert action.help.startswith(field.metadata["help"].replace("%", "%%")), where
            assert action.choices == field.metadata["choices"], where
            made.add((cls, field_name))
        wanted |= {(cls, f.name) for cls, names in classes.values() for f in dataclasses.fields(cls)
                   if f.metadata.get("cli", True) and (names is None or f.name in names)}
    assert made == wanted, f"{command}: fields without a flag {sorted(f for _, f in wanted - made)}"


def test_every_command_is_one_of_typed_options():
    """Each ``python -m`` module of nre_ray (one with a ``__main__`` block) is in :func:`_typed_commands`, but the two
    helper processes our own code starts with plain positional arguments and no flags (cluster.watchdog PID,
    cluster.shared_ray's host)."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "nre_ray"
    modules = {".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__main__")
               for path in package.rglob("*.py") if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")}
    internal = {"nre_ray.cluster.watchdog", "nre_ray.cluster.shared_ray"}
    assert modules - internal == set(_typed_commands())


def test_no_command_writes_its_flags_by_hand():
    """Flags and argument groups are made in the config layer (nre_ray/config.py) only, and every parser is its
    CommandParser (one error line). What remains elsewhere: ``add_subparsers`` and ``add_parser`` of the two commands
    with subcommands (``nre_ray.data`` inspect/convert, ``nre_ray.standin`` up/status/...), which argparse makes no
    other way; their flags come from config.add_options too."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "nre_ray"
    made_by_hand = ("add_argument", "add_argument_group", "add_mutually_exclusive_group", "set_defaults",
                    "ArgumentParser")
    checked = 0
    for path in sorted(package.rglob("*.py")):
        if path == package / "config.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        called = [(node.lineno, getattr(node.func, "attr", getattr(node.func, "id", None)))
                  for node in ast.walk(tree) if isinstance(node, ast.Call)]
        calls = [f"{line} {name}" for line, name in called if name in made_by_hand]
        assert not calls, f"{path.relative_to(package.parent)}: flags made by hand at {calls}"
        checked += 1
    assert checked > 50  # (the whole package)


@pytest.mark.parametrize("command", ["nre_ray.predict", "nre_ray.evaluate", "nre_ray.serve",
                                     "nre_ray.cluster.spot_watch", "nre_ray.cluster.s3_store"])
def test_the_defaults_of_a_command_are_its_options_defaults(command, monkeypatch):
    """What a command does without a flag is its options class's default (required: --model and the files,
    spot_watch's --address, s3_store's --port)."""
    import dataclasses

    from nre_ray.cluster.spot_watch import ENDPOINT_ENV, INTERVAL_ENV
    from nre_ray.config import field_types

    for name in (ENDPOINT_ENV, INTERVAL_ENV):  # (spot_watch's defaults when these are not set)
        monkeypatch.delenv(name, raising=False)
    make_parser, sources, _ = _typed_commands()[command]
    options_cls = sources[""][""]
    types = field_types(options_cls)
    required = {f.name: types[f.name]("1") for f in dataclasses.fields(options_cls) if f.default is dataclasses.MISSING}
    argv = [arg for name, value in required.items() for arg in ("--" + name.replace("_", "-"), str(value))]
    assert options_cls(**vars(make_parser().parse_args(argv))) == options_cls(**required)
    with pytest.raises(SystemExit):  # each of them is required
        make_parser().parse_args(argv[2:])


def test_a_flag_several_commands_share_says_the_same_in_each():
    """--tracking-uri, --address, --cpus-per-worker, --format, --columns, and predict/evaluate/serve's --model:
    one help text (config.SHARED), wherever the flag is (subcommands' too). spot_watch's --address is another
    option: the GCS to drain a node through, required (no auto, no local Ray)."""
    from nre_ray.config import SHARED

    said: dict[str, set[str]] = {}
    for command, (make_parser, _, _) in _typed_commands().items():
        for parser in _parsers_of(make_parser()).values():
            for action in _arguments(parser):
                name = action.dest.rpartition(".")[2]
                key = "trained_model" if action.dest == "model" else name  # train's is model.model, the encoder
                if key in SHARED and action.option_strings and (command, key) != ("nre_ray.cluster.spot_watch",
                                                                                    "address"):
                    said.setdefault(key, set()).add(action.help)
    assert set(said) == set(SHARED)
    assert all(len(helps) == 1 for helps in said.values()), said
