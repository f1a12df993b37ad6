"""Inputs in an object store (a real S3-compatible server, moto_server): --data-dir / --train / --labels URIs read to
exactly what the local files give, problems name the URI, the shared preprocessing cache is published and reused,
--embeddings and --pretrained folders are read from s3://."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nre_ray import storage
from nre_ray.config import ConfigError, DataConfig
from nre_ray.core import buildonce
from nre_ray.data import pipeline, subword
from nre_ray.data.__main__ import main as data_main
from nre_ray.data.errors import DataError
from nre_ray.data.read import detect_format, find_data_files, read_chunks, read_labels, read_table
from nre_ray.models.pretrained import check_dim, load_word_vectors, vector_dim
from tests.objectstore import requests_to_store

HEADER = "sentence,head,head_offset,tail,tail_offset,relation"


@pytest.fixture(scope="module")
def data(object_store: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A slice of the bundled sample (train 300, valid and test 60 rows, relation.txt), locally and uploaded."""
    folder = tmp_path_factory.mktemp("data")
    sample = pipeline.sample_dir()
    for name, rows in (("train", 300), ("valid", 60), ("test", 60)):
        pd.read_csv(sample / f"{name}.csv", keep_default_na=False).head(rows).to_csv(folder / f"{name}.csv",
                                                                                    index=False)
    (folder / "relation.txt").write_bytes((sample / "relation.txt").read_bytes())
    uri = storage.join(object_store, "inputs", "data")
    storage.upload(folder, uri)
    return folder, uri


def assert_same(got: pipeline.Prepared, expected: pipeline.Prepared) -> None:
    assert got.labels == expected.labels and got.vocab.tokens == expected.vocab.tokens
    assert list(got.splits) == list(expected.splits) and got.audit == expected.audit
    for name, split in expected.splits.items():
        for key, array in split.arrays.items():
            assert got.splits[name].arrays[key].dtype == array.dtype
            assert np.array_equal(got.splits[name].arrays[key], array), (name, key)


def test_files_of_a_remote_folder_and_their_problems_without_ray(data: tuple[Path, str]) -> None:
    folder, uri = data
    found = find_data_files(uri)
    assert found == {"train": f"{uri}/train.csv", "valid": f"{uri}/valid.csv", "test": f"{uri}/test.csv",
                     "labels": f"{uri}/relation.txt"}
    assert find_data_files(uri + "/") == found
    assert read_labels(found["labels"]) == read_labels(folder / "relation.txt")
    assert detect_format(found["train"]) == "csv"
    chunks = list(read_chunks(found["train"], rows_per_chunk=100))
    assert len(chunks) == 3 and set(chunks[0]["file"]) == {found["train"]}
    local = read_table(folder / "train.csv")
    remote = pd.concat(chunks, ignore_index=True)
    pd.testing.assert_frame_equal(remote.drop(columns="file"), local.drop(columns="file"))
    files = pipeline.resolve_files(DataConfig(data_dir=uri))
    assert files == found

    with pytest.raises(DataError) as err:
        find_data_files(storage.join(uri, "nothing-here"))
    assert str(err.value).startswith(f"{uri}/nothing-here: data directory not found")
    assert "AWS_ENDPOINT_URL" in str(err.value) and "AWS_ACCESS_KEY_ID" in str(err.value)
    missing = f"{uri}/missing.csv"
    with pytest.raises(DataError) as err:
        pipeline.cache_folder(DataConfig(train=missing), 1)
    assert str(err.value).startswith(f"{missing}: file not found") and "AWS_ENDPOINT_URL" in str(err.value)
    with pytest.raises(DataError, match="the bucket does not exist"):
        list(read_chunks("s3://no-such-bucket-x/train.csv"))
    with pytest.raises(DataError, match="is a directory"):
        read_labels(uri)

    labels = f"{uri}-bad/relation.txt"
    storage.upload(folder / "relation.txt", labels)
    (folder.parent / "dup.txt").write_text("a\nb\na\n")
    storage.upload(folder.parent / "dup.txt", labels)
    with pytest.raises(DataError) as err:
        read_labels(labels)
    assert str(err.value).splitlines()[0] == f"{labels}:3: duplicate label 'a' (first on line 1)"


def test_every_command_finds_its_cache_by_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cache_places: train, tune and data inspect share it (runner.resolve_target, data.__main__.inspect)."""
    import tempfile

    monkeypatch.chdir(tmp_path)
    private = str(Path(tempfile.gettempdir()).absolute() / f"nre_ray-{os.getuid()}" / "cache")
    assert pipeline.cache_places(None, None) == (str(tmp_path / ".nre_ray_cache"), None)
    assert pipeline.cache_places(None, "s3://b/runs") == (private, "s3://b/runs/.nre_ray_cache")
    assert pipeline.cache_places("c", "s3://b/runs") == (str(tmp_path / "c"), "s3://b/runs/.nre_ray_cache")
    assert pipeline.cache_places(None, "/nfs/runs", allow_local_storage=True) == ("/nfs/runs/.nre_ray_cache", None)
    assert pipeline.cache_places(None, "/nfs/runs") == (str(tmp_path / ".nre_ray_cache"), None)


def test_the_cache_key_of_an_object_comes_from_its_metadata_not_its_bytes(object_store: str, tmp_path: Path) -> None:
    """No GET of an object's content: the key is its URI and version (ETag, size) from one metadata request; it
    changes when the object changes (even to bytes of the same size), and the same bytes under another URI get a
    key of their own."""
    local = tmp_path / "train.csv"
    local.write_text(HEADER + "\n" + "Ann Lee founded Acme .,Acme,16,Ann Lee,0,founded_by\n" * 2000, encoding="utf-8")
    first, other = (storage.join(object_store, "keys", prefix, "train.csv") for prefix in ("a", "b"))
    storage.upload(local, first)
    storage.upload(local, other)
    inputs = {"train": first}
    with requests_to_store() as seen:
        key = pipeline.cache_key(inputs, {"s": 1})
    path = "/" + first.split("://", 1)[1]
    assert ("HEAD", path) in seen and ("GET", path) not in seen, seen
    with requests_to_store() as control:  # the recorder does see a read
        storage.read_bytes(first)
    assert ("GET", path) in control

    assert pipeline.cache_key(inputs, {"s": 1}) == key and pipeline.cache_key(inputs, {"s": 2}) != key
    assert pipeline.cache_key({"train": other}, {"s": 1}) != key  # same bytes, another URI
    local.write_text(local.read_text(encoding="utf-8").replace("Ann Lee founded", "Ann Lee funded ", 1),
                     encoding="utf-8")
    storage.upload(local, first)  # one row changed, the same size
    assert storage.size(first) == storage.size(other)
    assert pipeline.cache_key(inputs, {"s": 1}) != key


def test_read_tasks_leave_the_driver_node_only_when_every_split_file_is_remote() -> None:
    pinned = {"scheduling_strategy": "the driver's node"}
    remote = {"train": "s3://b/d/train.csv", "valid": "s3://b/d/valid.csv", "labels": Path("relation.txt")}
    assert pipeline._reader_args(remote, ["train", "valid"], pinned) == {}
    mixed = {**remote, "test": Path("test.csv")}
    assert pipeline._reader_args(mixed, ["train", "valid", "test"], pinned) == pinned


def test_remote_folder_prepares_to_the_local_result_and_the_shared_cache_is_reused(
        ray_cluster, data: tuple[Path, str], object_store: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    folder, uri = data
    local = pipeline.prepare(DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "local")), 1)
    shared = storage.join(object_store, "runs", ".nre_ray_cache")
    remote_cfg = DataConfig(data_dir=uri, cache_dir=str(tmp_path / "first"))
    first = pipeline.prepare(remote_cfg, 1, shared_cache=shared)
    assert not first.cache_hit and first.sources["train"] == f"{uri}/train.csv"
    assert_same(first, local)
    key = Path(first.cache_dir).name
    assert first.shared_cache_dir == f"{shared}/{key}" and storage.is_file(f"{shared}/{key}/meta.json")
    assert storage.is_file(f"{shared}/{key}/train.tokens.npy") and not storage.exists(f"{shared}/{key}/staging")

    empty = tmp_path / "second"  # another machine: nothing cached locally
    second_cfg = DataConfig(data_dir=uri, cache_dir=str(empty))
    assert pipeline.is_cached(second_cfg, 1, shared_cache=shared)
    assert not pipeline.is_cached(second_cfg, 1)
    with caplog.at_level(logging.INFO, logger="nre_ray"):
        second = pipeline.prepare(second_cfg, 1, shared_cache=shared)
    assert second.cache_hit and "reused the shared cache" in caplog.text
    assert second.cache_dir == str(empty / key) and (empty / key / "meta.json").is_file()
    assert second.shared_cache_dir == f"{shared}/{key}"
    assert_same(second, local)

    # data inspect given the run's --storage-path finds that cache (it said "nothing cached yet" and built
    # ./.nre_ray_cache); the rule is train's (cache_places)
    assert pipeline.cache_places(None, storage.join(object_store, "runs"))[1] == shared
    third = tmp_path / "third"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nre_ray"):
        assert data_main(["inspect", "--data-dir", uri, "--storage-path", storage.join(object_store, "runs"),
                          "--cache-dir", str(third)]) == 0
    assert "reused the shared cache" in caplog.text and (third / key / "meta.json").is_file()


def test_on_a_cluster_the_tasks_build_in_the_object_store_and_give_the_same_result(
        ray_cluster, data: tuple[Path, str], object_store: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``multi_node`` with a shared cache in the store (what ``train`` passes on a cluster): the tasks write their
    files to a private folder in the store and the splits straight to the shared cache, so they may run on any node.
    The result is the local build's, bad rows and their CSV included; nothing but the published folder is left."""
    folder, _ = data
    inputs = tmp_path / "inputs"  # the sample slice with two bad rows, read on the driver's node (local files)
    inputs.mkdir()
    for path in folder.iterdir():
        (inputs / path.name).write_bytes(path.read_bytes())
    with open(inputs / "train.csv", "a", encoding="utf-8") as fh:
        fh.write("Ann Lee founded Acme .,Acme,3,Ann Lee,0,founded_by\nA b .,A,0,b,2,no_such_label\n")
    local = pipeline.prepare(DataConfig(data_dir=str(inputs), cache_dir=str(tmp_path / "local"), on_bad_rows="skip"),
                             1)
    assert local.rejected_count == 2
    shared = storage.join(object_store, "cluster", ".nre_ray_cache")
    cfg = DataConfig(data_dir=str(inputs), cache_dir=str(tmp_path / "driver"), on_bad_rows="skip")
    with caplog.at_level(logging.INFO, logger="nre_ray"):
        built = pipeline.prepare(cfg, 1, shared_cache=shared, multi_node=True)
    assert f"preprocess: building in the object store: {shared}/" in caplog.text
    assert_same(built, local)
    assert built.rejected_count == 2
    assert Path(built.rejected_csv).read_text() == Path(local.rejected_csv).read_text()
    key = Path(built.cache_dir).name
    assert built.shared_cache_dir == f"{shared}/{key}"
    published = {storage.name_of(p) for p in storage.list_files(f"{shared}/{key}")}
    assert published == {p.name for p in Path(built.cache_dir).iterdir()}
    assert {p.split("/")[-2] for p in storage.list_files(shared, recursive=True)} == {key}  # no build folder left

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nre_ray"):  # another machine of the cluster
        again = pipeline.prepare(DataConfig(data_dir=str(inputs), cache_dir=str(tmp_path / "other"),
                                            on_bad_rows="skip"), 1, shared_cache=shared, multi_node=True)
    assert again.cache_hit and "reused the shared cache" in caplog.text
    assert_same(again, local)


def test_build_folders_in_the_store_left_by_gone_drivers_are_removed(object_store: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver killed during a build in the store leaves its private folder there: the next build removes the
    folders whose builder is gone (a dead process on this machine; another machine's after PRIVATE_MAX_AGE without
    a change), and never a live builder's, a published cache or a folder not named like a build."""
    import os
    import subprocess
    import sys

    root = storage.join(object_store, "stale", ".nre_ray_cache")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    key, host = "ab" * 10, buildonce.HOST
    folders = {"dead": f"{key}.tmp-{dead.pid}-0badc0de-{host}", "live": f"{key}.tmp-{os.getpid()}-0badc0de-{host}",
               "elsewhere": f"{key}.tmp-1-0badc0de-{'e' * 8}", "published": key, "not ours": "notes.tmp-1-x"}
    for name in folders.values():
        storage.write_bytes(storage.join(root, name, "work", "parts", "train", "0-000000000002.npz"), b"x")
    names = lambda: {storage.name_of(p) for p in storage.list_folders(root)}  # noqa: E731
    buildonce.remove_stale(root)
    assert names() == {folders[k] for k in ("live", "elsewhere", "published", "not ours")}
    monkeypatch.setattr(buildonce, "PRIVATE_MAX_AGE", -1)  # another machine's folder, unchanged for long enough
    buildonce.remove_stale(root)
    assert names() == {folders[k] for k in ("live", "published", "not ours")}
    assert storage.list_files(storage.join(root, key), recursive=True)  # the published cache keeps its files
    buildonce.remove_stale(storage.join(object_store, "no", "such", "folder"))  # nothing there: nothing to do


def test_subwords_built_in_the_object_store_match_the_local_build(
        ray_cluster, data: tuple[Path, str], object_store: str, tmp_path: Path) -> None:
    """``--model bert`` on a cluster: the tokenizer with its entity markers goes to the store, and each encoding
    task's node copies it from there."""
    pytest.importorskip("transformers")
    from tests.tiny_bert import make_tiny_bert

    folder, _ = data
    tiny = str(make_tiny_bert(tmp_path / "tiny", words=["acme", "founded"]))
    local = pipeline.prepare(DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "local")), 1, tiny)
    shared = storage.join(object_store, "bert", ".nre_ray_cache")
    built = pipeline.prepare(DataConfig(data_dir=str(folder), cache_dir=str(tmp_path / "driver")), 1, tiny,
                             shared_cache=shared, multi_node=True)
    assert_same(built, local)
    key = Path(built.cache_dir).name
    assert storage.is_file(f"{shared}/{key}/pretrained/tokenizer.json")
    assert {p[len(shared) + 1:].split("/")[0] for p in storage.list_files(shared, recursive=True)} == {key}


def test_a_bad_row_of_a_remote_csv_names_the_uri_and_line(ray_cluster, object_store: str, tmp_path: Path) -> None:
    rows = [f"Ann Lee founded Acme in {year} .,Acme,{len('Ann Lee founded ')},Ann Lee,0,founded_by"
            for year in range(1900, 1930)]
    rows[15] = "Ann Lee founded Acme .,Acme,3,Ann Lee,0,founded_by"  # line 17 (the header is line 1)
    local = tmp_path / "train.csv"
    local.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    uri = storage.join(object_store, "inputs", "bad", "train.csv")
    storage.upload(local, uri)
    with pytest.raises(DataError) as err:
        pipeline.prepare(DataConfig(train=uri, cache_dir=str(tmp_path / "cache")), 1)
    first = str(err.value).splitlines()[0]
    assert first.startswith(f"{uri}:17: head_offset: ") and "nre_ray_input_" not in str(err.value)

    broken = storage.join(object_store, "inputs", "bad", "noheader.csv")
    storage.upload(tmp_path / "train.csv", broken)
    (tmp_path / "x.csv").write_text("just,some,words\n1,2,3\n", encoding="utf-8")
    storage.upload(tmp_path / "x.csv", broken)
    with pytest.raises(DataError) as err:  # found by the read task (the driver does not download remote inputs)
        pipeline.prepare(DataConfig(train=broken, cache_dir=str(tmp_path / "cache")), 1)
    assert str(err.value).startswith(f"{broken}:1: no header row") and "nre_ray_input_" not in str(err.value)


def test_word_vectors_from_the_store(object_store: str, tmp_path: Path) -> None:
    text = "3 4\nthe 0.1 0.2 0.3 0.4\nNew York 1 2 3 4\ncat 5 6 7 8\n"
    (tmp_path / "vectors.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "vectors.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write(text)
    vocab = ["<pad>", "<unk>", "the", "new york", "dog"]
    expected = torch.nn.Embedding(len(vocab), 4)
    hits = load_word_vectors(tmp_path / "vectors.txt", vocab, expected, lowercase=True)
    for name in ("vectors.txt", "vectors.txt.gz"):
        uri = storage.join(object_store, "vectors", name)
        storage.upload(tmp_path / name, uri)
        assert vector_dim(uri) == 4
        check_dim(uri, 4)
        with pytest.raises(ValueError, match=rf"^{uri}: line 1: the word vectors have dimension 4, but --word-dim"):
            check_dim(uri, 8)
        got = torch.nn.Embedding(len(vocab), 4)
        with torch.no_grad():
            got.weight.copy_(expected.weight)
            got.weight[2:4] = 0
        assert load_word_vectors(uri, vocab, got, lowercase=True) == hits == 2
        assert torch.equal(got.weight, expected.weight)
    missing = storage.join(object_store, "vectors", "none.txt")
    with pytest.raises(ValueError, match=rf"^{missing}: word vector file not found \(--embeddings\)\. Check"):
        check_dim(missing, 4)
    storage.upload(tmp_path / "vectors.txt", storage.join(object_store, "vectors", "plain.gz"))
    with pytest.raises(ValueError, match="cannot read word vectors"):
        vector_dim(storage.join(object_store, "vectors", "plain.gz"))


def test_pretrained_folder_from_the_store(object_store: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from nre_ray.models.bert import load_transformer
    from tests.tiny_bert import make_tiny_bert

    monkeypatch.setattr(buildonce, "default_cache_root", lambda: tmp_path / "copies")
    local = make_tiny_bert(tmp_path / "tiny", words=["acme", "founded"])
    (local / "model.onnx").write_bytes(b"not for torch")
    uri = storage.join(object_store, "models", "tiny")
    storage.upload(local, uri)
    assert subword.fingerprint(uri) == subword.fingerprint(str(local))
    markers = subword.marker_vocabulary()
    built = subword.build_tokenizer(uri, tmp_path / "tok", markers, 64)
    assert subword.MarkerTokenizer.load(built).vocabulary() == subword.MarkerTokenizer.load(
        subword.build_tokenizer(str(local), tmp_path / "tok2", markers, 64)).vocabulary()
    copies = sorted(p for p in (tmp_path / "copies").iterdir() if p.is_dir())
    assert len(copies) == 1 and not list(copies[0].rglob("*.safetensors"))  # the driver: no weights

    size = json.loads((local / "config.json").read_text())["vocab_size"]  # no resize: no random new rows
    model = load_transformer(uri, size)
    reference = load_transformer(str(local), size)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(),
                                                 strict=True))
    with_weights = [p for p in (tmp_path / "copies").iterdir() if p.is_dir() and p not in copies]
    assert len(with_weights) == 1 and list(with_weights[0].rglob("*.safetensors"))
    assert not list(with_weights[0].rglob("*.onnx"))

    with pytest.raises(ConfigError, match=r"^--pretrained s3://nre-ray-tests/models/none: not found .*AWS_ENDPOINT"):
        subword.fingerprint(storage.join(object_store, "models", "none"))
