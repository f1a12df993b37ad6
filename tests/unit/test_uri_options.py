"""Options that name a file take a URI as well as a local path (a real S3-compatible server, moto_server): train's
``--config``, tune's ``--search-space``, and ``python -m nre_ray.data convert INPUT OUTPUT`` on both sides."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nre_ray import storage
from nre_ray.config import Config, ConfigError, build_parser, config_from_args
from nre_ray.data.__main__ import main as data_main
from nre_ray.tune.space import SpaceError, load_space

ROWS = "sentence,head,head_offset,tail,tail_offset,relation\nA likes B,A,0,B,8,likes\nC hates D,C,0,D,8,hates\n"


def test_a_config_file_in_an_object_store(object_store: str, tmp_path: Path) -> None:
    uri = storage.join(object_store, "uri_options", tmp_path.name, "run.toml")
    storage.write_text(uri, '[train]\nepochs = 7\n[data]\nnegative_label = "Other"\n')
    cfg = config_from_args(build_parser().parse_args(["--config", uri, "--lr", "0.5"]))
    assert (cfg.train.epochs, cfg.train.lr, cfg.data.negative_label) == (7, 0.5, "Other")
    missing = storage.join(object_store, "uri_options", tmp_path.name, "nope.toml")
    with pytest.raises(ConfigError, match=f"^{missing}: config file not found$"):
        config_from_args(build_parser().parse_args(["--config", missing]))
    storage.write_text(uri, "[train\n")
    with pytest.raises(ConfigError, match=f"^{uri}: not valid TOML"):
        config_from_args(build_parser().parse_args(["--config", uri]))


def test_a_search_space_in_an_object_store(object_store: str, tmp_path: Path) -> None:
    uri = storage.join(object_store, "uri_options", tmp_path.name, "space.toml")
    storage.write_text(uri, "[train]\nlr = { loguniform = [1e-4, 1e-2] }\n")
    assert [d.key for d in load_space(uri, Config())] == ["train.lr"]
    with pytest.raises(SpaceError, match="search space file not found"):
        load_space(storage.join(object_store, "uri_options", tmp_path.name, "nope.toml"), Config())


def test_convert_reads_and_writes_object_store_uris(object_store: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = storage.join(object_store, "uri_options", tmp_path.name)
    source, target = storage.join(base, "in.csv"), storage.join(base, "out.parquet")
    storage.write_text(source, ROWS)
    assert data_main(["convert", source, target]) == 0
    assert f"wrote 2 rows to {target} (parquet)" in capsys.readouterr().out
    local = tmp_path / "back.jsonl"
    assert data_main(["convert", target, str(local)]) == 0  # the Parquet object read back
    back = pd.read_json(local, lines=True)
    assert back["relation"].tolist() == ["likes", "hates"] and back["tail_offset"].tolist() == [8, 8]

    assert data_main(["convert", source, target]) == 2  # an existing object is never replaced without --force
    assert f"{target} already exists; nothing was written" in capsys.readouterr().err
    assert data_main(["convert", source, target, "--force"]) == 0
    capsys.readouterr()
    assert sorted(storage.list_files(base)) == sorted([source, target])
    assert list(tmp_path.iterdir()) == [local]  # no staging folder left behind

    nowhere = tmp_path / "no" / "such" / "out.csv"
    assert data_main(["convert", source, str(nowhere)]) == 2
    said = capsys.readouterr().err
    assert said == f"error: {nowhere}: the folder {nowhere.parent} does not exist; create it first.\n"
