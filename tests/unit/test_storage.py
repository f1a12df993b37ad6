"""nre_ray.storage against a real S3-compatible server (moto_server) and the local filesystem."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from nre_ray import storage
from nre_ray.storage import StorageError
from tests.objectstore import moto_server


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"alpha\n")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)) * 5000)
    (root / "meta.json").write_text("{}")
    return root


def test_names_and_local_paths_pass_through(tmp_path: Path) -> None:
    assert storage.is_uri("s3://bucket/x") and storage.is_uri("gs://b/x") and storage.is_uri("hdfs://nn:8020/x")
    assert not storage.is_uri("data/train.csv") and not storage.is_uri("/abs") and not storage.is_uri("file:///abs")
    assert not storage.is_uri(tmp_path) and not storage.is_uri("C:/data")
    assert storage.join("s3://b/data/", "train.csv") == "s3://b/data/train.csv"
    assert storage.join("s3://b", "x", "/y/") == "s3://b/x/y"
    assert storage.join(tmp_path, "a") == str(tmp_path / "a")
    assert storage.absolute("s3://b/x") == "s3://b/x"
    assert storage.absolute("rel") == str(Path("rel").absolute())
    assert storage.name_of("s3://b/data/train.csv") == "train.csv" and storage.name_of("s3://b/minilm/") == "minilm"
    tree = make_tree(tmp_path / "tree")
    assert storage.local_copy(tree) == tree and storage.local_copy(str(tree / "a.txt")) == tree / "a.txt"
    assert storage.local_copy(f"file://{tree}") == tree
    assert storage.read_bytes(tree / "a.txt") == b"alpha\n"
    assert storage.list_files(tree) == [str(tree / "a.txt"), str(tree / "meta.json")]
    with pytest.raises(StorageError, match="not found"):
        storage.read_bytes(tmp_path / "nope")


def test_round_trip_of_files_and_folders(object_store: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    base = storage.join(object_store, "storage", "round")
    storage.upload(tree, base, last="meta.json")
    assert storage.is_dir(base) and storage.exists(base) and not storage.is_file(base)
    assert storage.is_file(storage.join(base, "a.txt")) and storage.size(storage.join(base, "a.txt")) == 6
    assert storage.list_files(base) == [f"{base}/a.txt", f"{base}/meta.json"]
    assert storage.list_files(base, recursive=True) == [f"{base}/a.txt", f"{base}/meta.json", f"{base}/sub/b.bin"]
    assert storage.read_bytes(f"{base}/sub/b.bin") == (tree / "sub" / "b.bin").read_bytes()
    with storage.open_input(f"{base}/a.txt") as stream:
        assert stream.read() == b"alpha\n"

    back = storage.download(base, tmp_path / "back")
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == [
        "a.txt", "meta.json", "sub/b.bin"]
    assert (back / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
    one = storage.download(f"{base}/a.txt", tmp_path / "one" / "a.txt")
    assert one.read_bytes() == b"alpha\n"
    with storage.temporary_copy(f"{base}/a.txt") as local:
        assert local.name == "a.txt" and local.read_bytes() == b"alpha\n"
    assert not local.exists()

    (tree / "packed.gz").write_bytes(gzip.compress(b"x" * 1000))  # bytes as they are: no (de)compression
    storage.upload(tree / "packed.gz", f"{base}/packed.gz")
    assert storage.read_bytes(f"{base}/packed.gz") == (tree / "packed.gz").read_bytes()
    assert storage.download(f"{base}/packed.gz", tmp_path / "p.gz").read_bytes() == (tree / "packed.gz").read_bytes()
    with storage.open_input(f"{base}/packed.gz", compression="gzip") as stream:
        assert stream.read() == b"x" * 1000
    storage.upload(tree / "a.txt", f"{base}/single.txt")
    assert storage.read_bytes(f"{base}/single.txt") == b"alpha\n"
    storage.remove(f"{base}/single.txt")
    storage.remove(f"{base}/single.txt")  # already gone: fine
    assert not storage.exists(f"{base}/single.txt")


def test_local_copy_downloads_once_and_again_when_the_object_changes(object_store: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    base = storage.join(object_store, "storage", "model")
    storage.upload(tree, base)
    cache = tmp_path / "cache"
    copies: list[Path] = []
    threads = [threading.Thread(target=lambda: copies.append(storage.local_copy(base, cache))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(copies)) == 1 and copies[0].name == "model"
    assert (copies[0] / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1  # one download, no partial folders left
    stamp = (copies[0] / "a.txt").stat().st_mtime_ns
    assert storage.local_copy(base + "/", cache) == copies[0] and (copies[0] / "a.txt").stat().st_mtime_ns == stamp

    small = storage.local_copy(base, cache, skip_suffixes=(".bin",))
    assert small != copies[0] and not (small / "sub" / "b.bin").exists() and (small / "a.txt").exists()

    (tree / "a.txt").write_bytes(b"changed, longer\n")
    storage.upload(tree / "a.txt", f"{base}/a.txt")
    changed = storage.local_copy(base, cache)
    assert changed != copies[0] and (changed / "a.txt").read_bytes() == b"changed, longer\n"
    single = storage.local_copy(f"{base}/a.txt", cache)
    assert single.name == "a.txt" and single.read_bytes() == b"changed, longer\n"


def test_errors_name_the_uri_and_what_to_check(object_store: str) -> None:
    missing = storage.join(object_store, "storage", "missing.csv")
    with pytest.raises(StorageError) as err:
        storage.read_bytes(missing)
    assert str(err.value).startswith(f"{missing}: not found") and "AWS_ENDPOINT_URL" in str(err.value)
    assert err.value.uri == missing and "Traceback" not in str(err.value)
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/x\.csv: the bucket does not exist"):
        storage.download("s3://no-such-bucket-here/x.csv", "/tmp/never-written")
    with pytest.raises(StorageError, match="not found"):
        storage.local_copy(storage.join(object_store, "storage", "no-folder"))
    assert not storage.exists(missing) and not storage.is_dir(missing)


def test_refused_credentials_and_an_unreachable_store(monkeypatch: pytest.MonkeyPatch) -> None:
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:  # refuses every key
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
        with pytest.raises(StorageError) as err:
            storage.read_bytes("s3://some-bucket/data/train.csv")
    text = str(err.value)
    assert text.startswith("s3://some-bucket/data/train.csv: access refused")
    assert "AWS_ACCESS_KEY_ID" in text and "AWS_SECRET_ACCESS_KEY" in text and "s3cr3t-value" not in text
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:pw@127.0.0.1:9")
    with pytest.raises(StorageError) as err:
        storage.exists("s3://some-bucket/x")
    assert "cannot reach the store at http://127.0.0.1:9" in str(err.value) and "pw" not in str(err.value)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
