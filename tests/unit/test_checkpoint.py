"""Checkpoints are complete or refused: a crash during a save, a copy cut short, foreign pickles, another model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from nre_ray.config import Config
from nre_ray.data.vocab import Vocab
from nre_ray.models.registry import ModelSpec
from nre_ray.run import checkpoint as ckpt
from nre_ray.run.checkpoint import CheckpointError, changed_settings, check_compatible, load_checkpoint, save_checkpoint
from nre_ray.tasks.sentence.classifier import build_model

LABELS = ["born_in", "founded_by", "no_relation"]
VOCAB = Vocab(["<pad>", "<unk>", "acme", "was", "founded", "by"])


def _config(**model) -> Config:
    return Config.from_dict({"model": {"word_dim": 8, "pos_dim": 2, "hidden_size": 8, **model}})


def _save(folder: Path, cfg: Config | None = None, epoch: int = 1) -> Path:
    cfg = cfg or _config()
    model = build_model(cfg.model, ModelSpec(len(VOCAB), len(LABELS), 22))
    state = {"model": model.state_dict(), "epoch": epoch, "best_score": 0.5, "best_epoch": epoch, "metrics": {}}
    meta = {"model": cfg.model.model, "epoch": epoch, "vocab_size": len(VOCAB), "num_classes": len(LABELS)}
    return save_checkpoint(folder, state, cfg, VOCAB, LABELS, meta)


def test_round_trip_records_every_file(tmp_path):
    folder = _save(tmp_path / "c")
    meta = json.loads((folder / "meta.json").read_text())
    assert set(meta["files"]) == set(ckpt.FILES)
    assert meta["files"]["state.pt"]["bytes"] == (folder / "state.pt").stat().st_size
    loaded = load_checkpoint(folder)
    assert loaded.state["epoch"] == 1 and loaded.labels == LABELS and loaded.vocab.tokens == VOCAB.tokens
    assert load_checkpoint(folder, weights=False).state == {}
    assert not [p for p in folder.iterdir() if p.name.endswith((".tmp", ".partial"))]  # no temporary left


def test_crash_before_meta_json_leaves_a_refused_folder(tmp_path, monkeypatch):
    """A save that dies after state.pt and the JSON files but before meta.json: not a checkpoint."""
    real = ckpt._write_atomic

    def dies_at_meta(path: Path, data: bytes) -> None:
        if path.name == "meta.json":
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_atomic", dies_at_meta)
    with pytest.raises(OSError):
        _save(tmp_path / "c")
    folder = tmp_path / "c"
    assert (folder / "state.pt").exists() and not (folder / "meta.json").exists()
    with pytest.raises(CheckpointError, match=r"not a complete nre_ray checkpoint \(missing meta.json\)"):
        load_checkpoint(folder)


def test_crash_inside_torch_save_leaves_no_file(tmp_path, monkeypatch):
    """state.pt goes through the one atomic writer (:func:`nre_ray.storage.replacing`): a save that fails inside
    torch.save leaves neither a state.pt nor its temporary."""
    def dies_half_way(obj, fh) -> None:
        fh.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir()] == []
    with pytest.raises(CheckpointError, match=re.escape("missing meta.json, state.pt, config.json")):
        load_checkpoint(tmp_path / "c")


def test_a_copy_cut_short_is_refused_by_size_and_checksum(tmp_path):
    """Ray copies a saved folder file by file; a copy that stops half-way can hold meta.json and part of state.pt."""
    folder = _save(tmp_path / "c")
    data = (folder / "state.pt").read_bytes()
    (folder / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape("state.pt does not match the size and checksum")):
        load_checkpoint(folder)
    load_checkpoint(folder, weights=False)  # vocabulary and labels are still intact and checked
    (folder / "labels.json").write_text('["x"]')
    with pytest.raises(CheckpointError, match=re.escape("labels.json does not match")):
        load_checkpoint(folder, weights=False)


def test_state_with_arbitrary_pickles_is_not_loaded(tmp_path):
    """weights_only=True: a state.pt that would run pickle code (here: any non-tensor object) is refused."""
    folder = _save(tmp_path / "c")
    torch.save({"model": {}, "payload": Path("/etc/passwd")}, folder / "state.pt")
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]  # an older checkpoint, or one whose meta.json was rewritten to match
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="holds more than tensors"):
        load_checkpoint(folder)


def test_missing_folder_and_other_format(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        load_checkpoint(tmp_path / "nope")
    folder = _save(tmp_path / "c")
    (folder / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(CheckpointError, match="format 99 is not supported"):
        load_checkpoint(folder)


def test_check_compatible_names_what_differs(tmp_path):
    loaded = load_checkpoint(_save(tmp_path / "c"))
    check_compatible(loaded, "cnn", VOCAB, LABELS)
    check_compatible(loaded, "cnn", VOCAB, LABELS, _config())
    with pytest.raises(CheckpointError, match="model 'cnn' \\(this run: 'pcnn'\\)"):
        check_compatible(loaded, "pcnn", VOCAB, LABELS)
    with pytest.raises(CheckpointError, match="a different vocabulary \\(6 tokens; this run: 7\\)"):
        check_compatible(loaded, "cnn", Vocab([*VOCAB.tokens, "new"]), LABELS)
    with pytest.raises(CheckpointError, match="different labels"):
        check_compatible(loaded, "cnn", VOCAB, [*LABELS, "works_for"])
    with pytest.raises(CheckpointError, match="--hidden-size 8 \\(this run: 16\\)"):
        check_compatible(loaded, "cnn", VOCAB, LABELS, _config(hidden_size=16))
    changed = Config.from_dict({**_config().to_dict(), "data": {"max_length": 64}, "train": {"seed": 2}})
    with pytest.raises(CheckpointError, match="--max-length 128 \\(this run: 64\\); --seed 1 \\(this run: 2\\)"):
        check_compatible(loaded, "cnn", VOCAB, LABELS, changed)


def test_settings_that_may_change_on_resume(tmp_path):
    loaded = load_checkpoint(_save(tmp_path / "c"))
    longer = Config.from_dict({**_config().to_dict(), "train": {"epochs": 20, "num_workers": 4},
                               "run": {"resume": True, "run_name": "r"}})
    check_compatible(loaded, "cnn", VOCAB, LABELS, longer)
    assert changed_settings(loaded.config, longer) == {"train.epochs": (100, 20), "train.num_workers": (2, 4)}


def test_fp16_loss_scale_survives_a_checkpoint(tmp_path):
    """The loss scaler's state (scale, growth tracker) is plain values: saved and loaded with weights_only."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler.scale((weight * float("inf")).sum()).backward()  # an overflow: the step is skipped, the scale halves
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 2.0**9
    cfg = _config()
    model = build_model(cfg.model, ModelSpec(len(VOCAB), len(LABELS), 22))
    state = {"model": model.state_dict(), "scaler": scaler.state_dict(), "epoch": 1, "best_score": 0.5,
             "best_epoch": 1, "metrics": {}}
    folder = save_checkpoint(tmp_path / "c", state, cfg, VOCAB, LABELS, {"model": "cnn", "epoch": 1,
                                                                        "vocab_size": len(VOCAB),
                                                                        "num_classes": len(LABELS)})
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(load_checkpoint(folder).state["scaler"])
    assert restored.get_scale() == 2.0**9
