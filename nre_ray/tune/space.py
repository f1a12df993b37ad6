"""The search space of ``python -m nre_ray.tune``: read from TOML, checked against the config, turned into Ray Tune
domains.

A space file has the config's sections and keys, and a distribution as each value::

    [train]
    lr = { loguniform = [1e-4, 1e-2] }
    batch_size = { choice = [32, 64] }
    [model]
    dropout = { uniform = [0.2, 0.6] }
    hidden_size = { int = [128, 320] }      # whole numbers from 128 to 320, both included

Only options that change a trial's training can be searched: the model's sizes and the optimiser's settings. Data
options are fixed (the data is preprocessed once for the whole sweep), and so are the run's resources and places.
Everything is checked before anything starts: unknown keys, a distribution an option's type cannot take, and values
the config refuses (each choice and each range end is tried, alone and together with the others, on the fixed
settings). The messages name the file, the key and what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass
from typing import Any

from nre_ray.config import SECTIONS, Config, ConfigError, field_types, read_toml

#: The distributions a space may use and what each takes.
KINDS = {"choice": "a list of values", "uniform": "[low, high]", "loguniform": "[low, high] with low > 0",
         "int": "[low, high] of whole numbers, both included"}
#: Options that can be searched: they change how a trial trains, not what data it sees or where it runs.
SEARCHABLE = {
    "model": ("word_dim", "pos_dim", "hidden_size", "kernel_size", "dropout", "embedding_dropout", "num_layers",
              "num_heads", "with_cls"),
    "train": ("batch_size", "lr", "weight_decay", "grad_clip", "label_smoothing", "lr_factor", "lr_patience",
              "encoder_lr", "warmup_ratio", "grad_accum"),
}
#: Why an option that exists cannot be searched.
FIXED_BECAUSE = {
    "data": "data options are fixed for a sweep (the data is preprocessed once and shared by every trial); give it "
            "as a flag or in --config",
    "run": "run options (names, storage, tracking) belong to the sweep, not to a trial",
    "model.model": "a sweep trains one --model; run one sweep per model",
    "train.seed": "the seed also draws the validation split, which is preprocessed once for the sweep",
    "train.epochs": "every trial trains up to --epochs (ASHA stops the weak ones earlier)",
    "train.patience": "ASHA stops weak trials; use --grace-period and --reduction-factor",
}
#: At most this many combinations of choices and range ends are checked together.
MAX_COMBINATIONS = 4096


@dataclass(frozen=True)
class Dimension:
    """One searched option: ``key`` as ``section.field``, ``kind`` (one of :data:`KINDS`) and its ``values``
    (the choices, or ``[low, high]``)."""

    key: str
    kind: str
    values: tuple[Any, ...]

    def ends(self) -> tuple[Any, ...]:
        """The values checked against the config: every choice, or both ends of a range."""
        return self.values

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.key}: choice of {list(self.values)}"
        return f"{self.key}: {self.kind} from {self.values[0]} to {self.values[1]}"

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "values": list(self.values)}


Space = list[Dimension]

#: The space searched without ``--search-space``, per ``--model``: the settings that matter most for each encoder.
DEFAULT_SPACES: dict[str, dict[str, dict[str, dict[str, list[Any]]]]] = {
    "cnn": {"train": {"lr": {"loguniform": [3e-4, 3e-3]}, "batch_size": {"choice": [32, 64]},
                      "weight_decay": {"choice": [0.0, 1e-5, 1e-4]}},
            "model": {"dropout": {"uniform": [0.2, 0.6]}, "hidden_size": {"choice": [128, 230, 320]},
                      "kernel_size": {"choice": [3, 5]}}},
    "bilstm": {"train": {"lr": {"loguniform": [3e-4, 3e-3]}, "batch_size": {"choice": [32, 64]}},
               "model": {"dropout": {"uniform": [0.2, 0.6]}, "hidden_size": {"choice": [128, 256]},
                         "num_layers": {"choice": [1, 2]}}},
    "transformer": {"train": {"lr": {"loguniform": [1e-4, 1e-3]}, "batch_size": {"choice": [32, 64]}},
                    "model": {"dropout": {"uniform": [0.1, 0.4]}, "hidden_size": {"choice": [128, 256]},
                              "num_layers": {"choice": [1, 2, 3]}}},
    "bert": {"train": {"encoder_lr": {"loguniform": [1e-5, 1e-4]}, "lr": {"loguniform": [1e-4, 3e-3]},
                       "warmup_ratio": {"choice": [0.0, 0.1]}, "batch_size": {"choice": [16, 32]}},
             "model": {"dropout": {"uniform": [0.0, 0.3]}}},
}
DEFAULT_SPACES["pcnn"] = DEFAULT_SPACES["cnn"]


class SpaceError(ConfigError):
    """A search space that cannot be used; the message names the file, the key and the problem."""


def load_space(path: str | None, base: Config, task_space: dict[str, Any] | None = None, unit: str = "") -> Space:
    """The search space of ``path`` (a TOML file); when None, ``task_space`` (the data's task's own default:
    :meth:`nre_ray.tasks.base.Task.search_space`, ``unit`` naming its examples), else :data:`DEFAULT_SPACES` for
    ``base``'s model; checked against ``base`` (the sweep's fixed settings). Raises SpaceError."""
    if path is None:
        where = f" on {unit}" if task_space is not None and unit else ""
        return parse_space(task_space if task_space is not None else DEFAULT_SPACES[base.model.model], base,
                           f"the default space for --model {base.model.model}{where}")
    return parse_space(read_toml(path, "search space file", SpaceError), base, path)  # a local path or a URI


def parse_space(raw: dict[str, Any], base: Config, source: str) -> Space:
    """Parse and check a space given as ``{section: {field: {kind: values}}}`` (see the module's docstring)."""
    space: Space = []
    for section, table in raw.items():
        if section not in SECTIONS:
            raise SpaceError(f"{source}: unknown section [{section}]; a search space has [model] and [train] "
                             "tables")
        if not isinstance(table, dict):
            raise SpaceError(f"{source}: {section!r} must be a table such as [{section}]")
        for name, spec in table.items():
            space.append(_dimension(section, name, spec, source))
    if not space:
        raise SpaceError(f"{source}: the search space is empty; give at least one option to search, e.g. "
                         "[train] lr = { loguniform = [1e-4, 1e-2] }")
    check_against(space, base, source)
    return space


def _dimension(section: str, name: str, spec: Any, source: str) -> Dimension:
    key = f"{section}.{name}"
    where = f"{source}: [{section}] {name}"
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    if name not in fields:
        close = difflib.get_close_matches(name, fields, n=1)
        raise SpaceError(f"{where}: unknown option" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f"; searchable in [{section}]: {', '.join(SEARCHABLE.get(section, ())) or 'nothing'}")
    if name not in SEARCHABLE.get(section, ()):
        why = FIXED_BECAUSE.get(key) or FIXED_BECAUSE.get(section) or "it does not change how a trial trains"
        raise SpaceError(f"{where}: cannot be searched: {why}")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise SpaceError(f"{where}: give one distribution as an inline table, e.g. {name} = {{ choice = [...] }}; "
                         f"distributions: {', '.join(f'{k} = {v}' for k, v in KINDS.items())}. A fixed value "
                         "goes in a flag or --config instead")
    kind, values = next(iter(spec.items()))
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1)
        raise SpaceError(f"{where}: unknown distribution {kind!r}" + (f" (did you mean {close[0]!r}?)" if close
                                                                       else "")
                         + f"; use one of {', '.join(KINDS)}")
    tp = field_types(SECTIONS[section])[name]
    if not isinstance(values, list) or not values:
        raise SpaceError(f"{where}: {kind} takes {KINDS[kind]}, found {values!r}")
    if kind == "choice":
        checked = tuple(_typed(v, tp, where) for v in values)
        if len(set(checked)) != len(checked):
            raise SpaceError(f"{where}: choice lists a value twice: {values!r}")
        return Dimension(key, kind, checked)
    if len(values) != 2:
        raise SpaceError(f"{where}: {kind} takes {KINDS[kind]}, found {values!r}")
    if kind == "int":
        if tp is not int:
            raise SpaceError(f"{where}: int ranges are for whole-number options; {name} is a {tp.__name__}: use "
                             "uniform or loguniform")
        low, high = (_typed(v, int, where) for v in values)
    else:
        if tp is not float:
            raise SpaceError(f"{where}: {kind} is for decimal options; {name} is a {tp.__name__}: use "
                             + ("int = [low, high] or choice" if tp is int else "choice"))
        low, high = (_typed(v, float, where) for v in values)
    if not low < high if kind != "int" else not low <= high:
        raise SpaceError(f"{where}: the low end {low!r} must be below the high end {high!r}")
    if kind == "loguniform" and low <= 0:
        raise SpaceError(f"{where}: loguniform needs low > 0 (found {low!r}); use uniform for a range from 0")
    return Dimension(key, kind, (low, high))


def _typed(value: Any, tp: type, where: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise SpaceError(f"{where}: expected {tp.__name__} values, found {type(value).__name__} {value!r}")
    return value


def apply(base: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``base`` (``Config.to_dict()``) with ``values`` (``{"section.field": value}``) put in."""
    out = {section: dict(fields) for section, fields in base.items()}
    for key, value in values.items():
        section, name = key.split(".", 1)
        out[section][name] = value
    return out


def check_against(space: Space, base: Config, source: str) -> None:
    """Every choice and range end, alone and in combination with the other dimensions' (up to
    :data:`MAX_COMBINATIONS`), must make a valid config with ``base``'s fixed settings; SpaceError otherwise."""
    fixed = base.to_dict()
    for dim in space:  # alone first: the message names one key
        for value in dim.ends():
            _try(fixed, {dim.key: value}, source, f"{dim.key} = {value!r}")
    combinations = math.prod(len(d.ends()) for d in space)
    if combinations > MAX_COMBINATIONS:
        return
    for values in itertools.product(*(d.ends() for d in space)):
        chosen = dict(zip((d.key for d in space), values, strict=True))
        _try(fixed, chosen, source, " with ".join(f"{k} = {v!r}" for k, v in chosen.items()))


def _try(fixed: dict[str, dict[str, Any]], values: dict[str, Any], source: str, what: str) -> None:
    try:
        Config.from_dict(apply(fixed, values), source=source)
    except ConfigError as err:
        raise SpaceError(f"{source}: {what} is impossible with the sweep's fixed settings: {_plain(err)}") from None


def _plain(err: ConfigError) -> str:
    return str(err).split(": ", 1)[-1] if str(err).startswith(("command line", "config")) else str(err)


def to_tune(space: Space) -> dict[str, Any]:
    """Ray Tune's ``param_space``: ``{"section.field": domain}``."""
    from ray import tune

    out: dict[str, Any] = {}
    for dim in space:
        if dim.kind == "choice":
            out[dim.key] = tune.choice(list(dim.values))
        elif dim.kind == "uniform":
            out[dim.key] = tune.uniform(*dim.values)
        elif dim.kind == "loguniform":
            out[dim.key] = tune.loguniform(*dim.values)
        else:
            out[dim.key] = tune.randint(dim.values[0], dim.values[1] + 1)  # randint excludes its upper end
    return out


def describe(space: Space) -> str:
    """One line per dimension, for the console and the parent run."""
    return "\n".join(f"  {dim.describe()}" for dim in space)
