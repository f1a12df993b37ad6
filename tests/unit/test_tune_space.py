"""The sweep's search space: parsed from TOML, refused with file/key/problem before anything starts, turned into Tune
domains; the trial plan (how many trials fit at once) and the options' checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nre_ray.cluster.session import NodeType, UsageError
from nre_ray.config import MODELS, Config, ConfigError
from nre_ray.tune.__main__ import SWEEP_EPOCHS, options_from_args, sweep_config, sweep_parser
from nre_ray.tune.report import COMPLETED, ERROR, STOPPED_EARLY, UNFINISHED, outcome
from nre_ray.tune.results import close_children, interrupted
from nre_ray.tune.space import DEFAULT_SPACES, Dimension, SpaceError, apply, load_space, parse_space, to_tune
from nre_ray.tune.sweep import SweepOptions, plan_trials


def _space(tmp_path: Path, text: str) -> str:
    path = tmp_path / "space.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_every_kind_is_parsed_and_typed(tmp_path):
    path = _space(tmp_path, """
[train]
lr = { loguniform = [1e-4, 1e-2] }
batch_size = { choice = [32, 64] }
weight_decay = { uniform = [0, 0.001] }
[model]
hidden_size = { int = [128, 320] }
dropout = { choice = [0.1, 0.5] }
""")
    space = load_space(path, Config())
    assert space == [Dimension("train.lr", "loguniform", (1e-4, 1e-2)),
                     Dimension("train.batch_size", "choice", (32, 64)),
                     Dimension("train.weight_decay", "uniform", (0.0, 0.001)),
                     Dimension("model.hidden_size", "int", (128, 320)),
                     Dimension("model.dropout", "choice", (0.1, 0.5))]
    domains = to_tune(space)
    assert domains["model.hidden_size"].upper == 321  # int ranges include their high end; Tune's randint does not
    assert domains["train.batch_size"].categories == [32, 64]
    assert 1e-4 <= domains["train.lr"].sample() <= 1e-2


@pytest.mark.parametrize(("text", "expected"), [
    ("[train]\nlrr = { loguniform = [1e-4, 1e-2] }", "[train] lrr: unknown option (did you mean 'lr'?)"),
    ("[training]\nlr = { choice = [0.1] }", "unknown section [training]"),
    ("[data]\nmax_length = { choice = [64, 128] }", "[data] max_length: cannot be searched: data options are fixed"),
    ("[train]\nseed = { choice = [1, 2] }", "[train] seed: cannot be searched: the seed also draws the validation"),
    ("[train]\nepochs = { choice = [5, 10] }", "[train] epochs: cannot be searched"),
    ("[model]\nmodel = { choice = ['cnn', 'pcnn'] }", "one sweep per model"),
    ("[train]\nlr = 0.001", "give one distribution as an inline table"),
    ("[train]\nlr = { normal = [0, 1] }", "unknown distribution 'normal'"),
    ("[train]\nlr = { loguniform = [0, 0.1] }", "loguniform needs low > 0"),
    ("[train]\nlr = { uniform = [0.1, 0.01] }", "the low end 0.1 must be below the high end 0.01"),
    ("[train]\nlr = { uniform = [0.1] }", "uniform takes [low, high]"),
    ("[train]\nbatch_size = { uniform = [16, 64] }", "batch_size is a int: use int = [low, high] or choice"),
    ("[train]\nlr = { int = [1, 3] }", "int ranges are for whole-number options"),
    ("[train]\nbatch_size = { choice = [32, 'big'] }", "expected int values, found str 'big'"),
    ("[train]\nbatch_size = { choice = [32, 32] }", "choice lists a value twice"),
    ("[model]\ndropout = { uniform = [0.2, 1.5] }", "model.dropout = 1.5 is impossible"),
    ("[model]\nkernel_size = { choice = [3, 4] }", "model.kernel_size = 4 is impossible"),
    ("[train]\nbatch_size = { int = [0, 8] }", "--batch-size must be >= 1"),
    ("", "the search space is empty"),
    ("[train\nlr = 1", "not valid TOML"),
])
def test_bad_spaces_name_the_file_the_key_and_the_problem(tmp_path, text, expected):
    path = _space(tmp_path, text)
    with pytest.raises(SpaceError) as err:
        load_space(path, Config())
    assert str(err.value).startswith(path) and expected in str(err.value)


def test_combinations_are_checked_on_the_fixed_settings():
    base = Config.from_dict({"model": {"model": "transformer", "num_heads": 8, "hidden_size": 128}})
    # hidden_size 100 does not fit the fixed --num-heads 8
    with pytest.raises(SpaceError, match=r"model\.hidden_size = 100 is impossible.*--num-heads 8 must divide"):
        parse_space({"model": {"hidden_size": {"choice": [128, 100]}}}, base, "space.toml")
    # together: num_heads 3 with hidden_size 128 does not divide, though each alone is fine with the other default
    with pytest.raises(SpaceError, match="with"):
        parse_space({"model": {"hidden_size": {"choice": [128, 120]}, "num_heads": {"choice": [8, 3]}}},
                    Config.from_dict({"model": {"model": "transformer", "hidden_size": 120}}), "space.toml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpaceError, match="search space file not found"):
        load_space(str(tmp_path / "nope.toml"), Config())


@pytest.mark.parametrize("model", MODELS)
def test_every_model_has_a_default_space_that_fits_its_defaults(model):
    extra = {"pretrained": "some/folder"} if model == "bert" else {}
    base = Config.from_dict({"model": {"model": model, **extra}})
    space = load_space(None, base)
    assert {d.key for d in space} == {f"{s}.{k}" for s, t in DEFAULT_SPACES[model].items() for k in t}


def test_a_task_with_a_space_of_its_own_is_searched_on_it():
    """Documents search the options their model takes (no --dropout: the document model has none), with a few
    documents a batch; sentences and bags search --model's space; a --search-space file wins over both."""
    from nre_ray.tasks.bag.bag_task import BAG
    from nre_ray.tasks.document.document_task import DOCUMENT, SEARCH_SPACE
    from nre_ray.tasks.sentence.task import SENTENCE

    base = Config.from_dict({"model": {"model": "transformer"}})
    assert SENTENCE.search_space("cnn") is None and BAG.search_space("pcnn") is None
    assert DOCUMENT.search_space("bert") is None  # a pretrained encoder: bert's own space, its learning rates
    space = load_space(None, base, DOCUMENT.search_space("transformer"), DOCUMENT.unit)
    assert {d.key for d in space} == {f"{s}.{k}" for s, t in SEARCH_SPACE.items() for k in t}
    assert "model.dropout" not in {d.key for d in space} and "model.dropout" in {
        d.key for d in load_space(None, base)}
    assert max(next(d for d in space if d.key == "train.batch_size").values) <= 8
    with pytest.raises(SpaceError, match=r"^the default space for --model transformer on documents: "):
        load_space(None, base, {"train": {"lr": {"uniform": [0.1, 0.01]}}}, "documents")


def test_apply_puts_sampled_values_into_a_copy():
    base = Config().to_dict()
    out = apply(base, {"train.lr": 0.01, "model.dropout": 0.3})
    assert out["train"]["lr"] == 0.01 and out["model"]["dropout"] == 0.3
    assert base["train"]["lr"] == Config().train.lr != 0.01  # untouched


def test_trial_plan_says_how_many_fit():
    two_cores = [{"CPU": 2.0}]
    plan = plan_trials(1, False, two_cores, None, None, None)  # default: one CPU per worker
    assert plan.at_once == 2 and plan.per_worker["CPU"] <= (2 - 2 * 0.01) / 2
    plan = plan_trials(2, False, two_cores, None, None, None)
    assert plan.at_once == 1
    plan = plan_trials(2, False, two_cores, None, None, 2)  # asked: 4 workers at half a CPU and 2 drivers do not fit
    assert plan.at_once == 1 and "does not fit" in plan.describe(2)
    plan = plan_trials(2, False, two_cores, 0.45, None, 2)  # the CPUs shared on purpose
    assert plan.at_once == 2 and 4 * plan.per_worker["CPU"] + 2 * 0.01 <= 2.0
    gpus = [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}]
    plan = plan_trials(2, True, gpus, None, None, None)
    assert plan.at_once == 2 and plan.per_worker["GPU"] == 1
    plan = plan_trials(2, True, gpus, None, None, 5)  # more than the GPUs hold: fewer, and said so
    assert plan.at_once == 2 and "does not fit" in plan.describe(2)
    grows = [NodeType("gpu", {"CPU": 8.0, "GPU": 1.0}, 4)]
    plan = plan_trials(1, True, [{"CPU": 4.0}], None, grows, None)  # an autoscaler adds GPU nodes
    assert plan.at_once == 4 and plan.waits
    with pytest.raises(UsageError, match="not even one trial fits"):
        plan_trials(1, True, two_cores, None, None, None)


def _args(*argv: str) -> tuple[argparse.Namespace, Config]:
    args = sweep_parser().parse_args(list(argv))
    return args, sweep_config(args)


def test_sweep_options_are_checked():
    args, cfg = _args("--epochs", "3", "--num-samples", "4", "--grace-period", "2")
    assert options_from_args(args, cfg) == SweepOptions(None, 4, None, 2, 2, "auto", None)
    assert (cfg.train.epochs, cfg.train.patience) == (3, 0)
    _, cfg = _args()  # trials train up to SWEEP_EPOCHS, without early stopping: ASHA stops them
    assert (cfg.train.epochs, cfg.train.patience) == (SWEEP_EPOCHS, 0)
    for argv, message in ((["--grace-period", "4", "--epochs", "3"], "--grace-period must be between 1 and"),
                          (["--num-samples", "0"], "--num-samples must be >= 1"),
                          (["--reduction-factor", "1"], "--reduction-factor must be >= 2")):
        args, cfg = _args(*argv)
        with pytest.raises(ConfigError, match=message):
            options_from_args(args, cfg)
    with pytest.raises(ConfigError, match="ASHA stops weak trials"):
        _args("--patience", "2")


def test_a_sweep_trains_its_tasks_model_and_shows_its_tasks_scores(tmp_path, capsys):
    from nre_ray.tasks.document.sample import write_sample
    from nre_ray.tune.__main__ import print_summary

    write_sample(tmp_path / "docs", seed=0, sizes={"train": 2, "valid": 1, "test": 1})
    assert _args("--data-dir", str(tmp_path / "docs"))[1].model.model == "transformer"  # documents' only model
    assert _args("--data-dir", str(tmp_path / "docs"), "--model", "cnn")[1].model.model == "cnn"  # (refused later)
    assert _args()[1].model.model == Config().model.model
    trial = {"trial_id": "t0", "outcome": COMPLETED, "epochs": 2, "best_valid_auc": 0.5, "train.lr": 1e-3}
    print_summary({"sweep": "s", "run_id": "r", "experiment": "e", "select_metric": "valid_auc", "trials": [trial],
                   "best_params": {"train.lr": 1e-3}, "best_trial": "t0", "best_epoch": 2, "best_valid": 0.5,
                   "task": "bag", "test": {"auc": 0.25, "p_at_100": 0.5, "micro_f1": 0.75, "threshold": 0.1},
                   "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    assert "  test  auc 0.2500  p_at_100 0.5000  micro_f1 0.7500\n" in capsys.readouterr().out


def test_outcome_of_a_trial():
    assert outcome("TERMINATED", 3, 3) == COMPLETED
    assert outcome("TERMINATED", 1, 3) == STOPPED_EARLY
    assert outcome("ERROR", 1, 3) == ERROR
    assert outcome("RUNNING", 1, 3) == UNFINISHED and outcome("PENDING", 0, 3) == UNFINISHED


def _trial(trial_id: str, outcome_: str, run_id: str | None = None) -> dict:
    return {"trial_id": trial_id, "outcome": outcome_, "mlflow_run_id": run_id}


def test_an_interrupted_sweep_is_told_from_a_finished_one():
    done = [_trial("a", COMPLETED), _trial("b", STOPPED_EARLY), _trial("c", ERROR)]
    assert interrupted(done, 3, set()) is None  # every trial drawn and ended: nothing to resume
    # Ctrl-C: one trial not yet drawn, and Tune marked the running one TERMINATED like the others
    cut = [_trial("a", COMPLETED), _trial("b", STOPPED_EARLY)]
    assert interrupted(cut, 3, ended={"a"}) == {"b"}
    assert interrupted([_trial("a", COMPLETED), _trial("b", UNFINISHED)], 2, ended={"a", "b"}) == set()


def test_closing_the_child_runs_of_an_interrupted_sweep(tmp_path):
    from mlflow.tracking import MlflowClient

    from nre_ray.tracking import store as tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = {name: tracking.start_run(uri, "e", name, {}) for name in ("done", "asha", "cut", "failed")}
    tracking.end_run(uri, runs["done"], "FINISHED")  # a trial that ended on its own closes its run
    trials = [_trial("done", COMPLETED, runs["done"]), _trial("asha", STOPPED_EARLY, runs["asha"]),
              _trial("cut", STOPPED_EARLY, runs["cut"]), _trial("failed", ERROR, runs["failed"]),
              _trial("never", UNFINISHED, None)]
    close_children(uri, trials, cut={"cut", "done"})
    client = MlflowClient(uri)
    got = {name: (client.get_run(r).info.status, client.get_run(r).data.tags["nre_ray.tune.outcome"])
           for name, r in runs.items()}
    assert got == {"done": ("FINISHED", COMPLETED),  # closed before the Ctrl-C: kept as it is
                   "asha": ("FINISHED", STOPPED_EARLY), "cut": ("KILLED", UNFINISHED),
                   "failed": ("FAILED", ERROR)}
