"""nre_ray.storage against a real S3-compatible server (moto_server) and the local filesystem: every operation through
its one code path on both, writes whole or not at all, errors classified by kind."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nre_ray import storage
from nre_ray.core import buildonce
from nre_ray.storage import StorageError
from tests.objectstore import moto_server

REPO = Path(__file__).resolve().parents[2]


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"alpha\n")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)) * 5000)
    (root / "meta.json").write_text("{}")
    return root


def test_names_and_local_paths_pass_through(tmp_path: Path) -> None:
    assert storage.is_uri("s3://bucket/x") and storage.is_uri("gs://b/x") and storage.is_uri("hdfs://nn:8020/x")
    assert not storage.is_uri("data/train.csv") and not storage.is_uri("/abs") and not storage.is_uri("file:///abs")
    assert not storage.is_uri(tmp_path) and not storage.is_uri("C:/data") and not storage.is_uri("runs:/x/model")
    assert storage.scheme("S3://b/x") == "s3" and storage.scheme("file:///x") == "file"
    assert storage.scheme("sqlite:///m.db") == "sqlite" and storage.scheme("rel/x") == "" == storage.scheme("runs:/x")
    assert storage.join("s3://b/data/", "train.csv") == "s3://b/data/train.csv"
    assert storage.join("s3://b", "x", "/y/") == "s3://b/x/y"
    assert storage.join(tmp_path, "a") == str(tmp_path / "a") and storage.join("file:///d", "a") == "/d/a"
    assert storage.absolute("s3://b/x") == "s3://b/x"
    assert storage.absolute("rel") == str(Path("rel").absolute())
    assert storage.name_of("s3://b/data/train.csv") == "train.csv" and storage.name_of("s3://b/minilm/") == "minilm"
    assert storage.parent("s3://b/data/train.csv") == "s3://b/data" and storage.parent("s3://b/x.csv") == "s3://b"
    assert storage.parent("s3://b") == "s3://b" and storage.parent("out.csv") == "." and storage.parent("/d/o") == "/d"
    tree = make_tree(tmp_path / "tree")
    assert buildonce.local_copy(tree) == tree and buildonce.local_copy(str(tree / "a.txt")) == tree / "a.txt"
    assert buildonce.local_copy(f"file://{tree}") == tree
    assert storage.read_bytes(f"file://{tree}/a.txt") == b"alpha\n"
    assert storage.list_files(tree) == [str(tree / "a.txt"), str(tree / "meta.json")]


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty folder: on this machine's disk, or a prefix in the moto server's bucket."""
    if request.param == "local":
        return str(tmp_path / "root")
    return storage.join(request.getfixturevalue("object_store"), "ops", tmp_path.name)


def test_every_operation_on_a_local_path_and_a_uri(root: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    base = storage.join(root, "round")
    assert not storage.exists(base) and not storage.is_dir(base) and storage.list_folders(base) == []
    storage.upload(tree, base, last="meta.json")
    assert storage.is_dir(base) and storage.exists(base) and not storage.is_file(base)
    assert storage.is_file(storage.join(base, "a.txt")) and storage.size(storage.join(base, "a.txt")) == 6
    assert storage.list_files(base) == [storage.join(base, "a.txt"), storage.join(base, "meta.json")]
    assert storage.list_files(base, recursive=True) == [storage.join(base, n) for n in ("a.txt", "meta.json",
                                                                                        "sub/b.bin")]
    assert storage.list_folders(base) == [storage.join(base, "sub")]
    assert [row[:2] for row in storage.stamp(base)] == [["a.txt", 6], ["meta.json", 2], ["sub/b.bin", 1280000]]
    assert [row[:2] for row in storage.stamp(storage.join(base, "a.txt"))] == [["", 6]]
    assert storage.read_bytes(storage.join(base, "sub", "b.bin")) == (tree / "sub" / "b.bin").read_bytes()
    assert storage.read_range(storage.join(base, "sub", "b.bin"), 254, 4) == bytes([254, 255, 0, 1])
    with storage.open_input(storage.join(base, "a.txt")) as stream:
        assert list(stream) == [b"alpha\n"]  # lines, as a Python file gives them

    back = storage.download(base, tmp_path / "back", skip_suffixes=(".bin",))
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == ["a.txt", "meta.json"]
    assert storage.download(storage.join(base, "a.txt"), tmp_path / "one" / "a.txt").read_bytes() == b"alpha\n"
    with storage.temporary_copy(storage.join(base, "a.txt")) as local:
        assert local.name == "a.txt" and local.read_bytes() == b"alpha\n"

    packed = storage.join(base, "packed.gz")  # bytes as they are: no (de)compression, but gzip on request
    (tree / "packed.gz").write_bytes(gzip.compress(b"x" * 1000))
    storage.upload(tree / "packed.gz", packed)
    assert storage.read_bytes(packed) == (tree / "packed.gz").read_bytes()
    with storage.open_input(packed, compression="gzip") as stream:
        assert stream.read() == b"x" * 1000

    single = storage.join(base, "deep", "er", "single.txt")
    storage.write_bytes(single, b"one")
    storage.write_bytes(single, b"two")
    assert storage.read_bytes(single) == b"two"
    (tmp_path / "done.txt").write_bytes(b"finished")
    storage.move_file(tmp_path / "done.txt", storage.join(base, "done.txt"))
    assert storage.read_bytes(storage.join(base, "done.txt")) == b"finished" and not (tmp_path / "done.txt").exists()
    storage.remove(single)
    storage.remove(single)  # already gone: fine
    assert not storage.exists(single)
    assert not [p for p in storage.list_files(base, recursive=True) if "partial" in p]  # no temporary name left
    storage.remove_tree(base)
    storage.remove_tree(base)
    assert not storage.exists(base)


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_partial_one(tmp_path: Path) -> None:
    """A real failure in the middle of a local write (the file size limit, EFBIG, after 1 MiB of 3): the file keeps
    its old content, and nothing else is left in the folder; the same for an upload and a download."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "f.bin").write_bytes(b"old")
    (tmp_path / "big.bin").write_bytes(b"y" * (3 << 20))
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "from nre_ray import storage\n"
        "for write in (lambda: storage.write_bytes(sys.argv[1], b'y' * (3 << 20)),\n"
        "              lambda: storage.upload(sys.argv[2], sys.argv[1]),\n"
        "              lambda: storage.download(sys.argv[2], sys.argv[1])):\n"
        "    try:\n"
        "        write()\n"
        "    except storage.StorageError as err:\n"
        "        print(err)\n")
    done = subprocess.run([sys.executable, "-c", script, str(folder / "f.bin"), str(tmp_path / "big.bin")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{folder / 'f.bin'}: ") for line in lines), lines
    assert "File too large" in lines[0]
    assert [p.name for p in folder.iterdir()] == ["f.bin"] and (folder / "f.bin").read_bytes() == b"old"


def test_an_object_whose_upload_fails_is_not_left_behind(object_store: str) -> None:
    """In an object store the object appears when its upload completes; a block that fails removes what the
    stream wrote."""
    uri = storage.join(object_store, "storage", "cut.bin")
    with pytest.raises(RuntimeError), storage._output(storage._where(uri)) as out:
        out.write(b"x" * 1000)
        raise RuntimeError("cut")
    assert not storage.exists(uri)


def test_local_copy_downloads_once_and_again_when_the_object_changes(object_store: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    base = storage.join(object_store, "storage", "model")
    storage.upload(tree, base)
    cache = tmp_path / "cache"
    copies: list[Path] = []
    threads = [threading.Thread(target=lambda: copies.append(buildonce.local_copy(base, cache))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(copies)) == 1 and copies[0].name == "model"
    assert (copies[0] / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1  # one download, no partial folders left
    stamp = (copies[0] / "a.txt").stat().st_mtime_ns
    assert buildonce.local_copy(base + "/", cache) == copies[0] and (copies[0] / "a.txt").stat().st_mtime_ns == stamp

    small = buildonce.local_copy(base, cache, skip_suffixes=(".bin",))
    assert small != copies[0] and not (small / "sub" / "b.bin").exists() and (small / "a.txt").exists()

    (tree / "a.txt").write_bytes(b"changed, longer\n")
    storage.upload(tree / "a.txt", f"{base}/a.txt")
    changed = buildonce.local_copy(base, cache)
    assert changed != copies[0] and (changed / "a.txt").read_bytes() == b"changed, longer\n"
    single = buildonce.local_copy(f"{base}/a.txt", cache)
    assert single.name == "a.txt" and single.read_bytes() == b"changed, longer\n"


def test_missing_keys_buckets_and_folders_by_kind(object_store: str, tmp_path: Path) -> None:
    """Not found and no bucket, from pyarrow's error types and AWS error codes: "403" or "404" in a path does not
    change what a message says."""
    missing = storage.join(object_store, "403", "404-NoSuchBucket-Forbidden.csv")
    with pytest.raises(StorageError) as err:
        storage.read_bytes(missing)
    assert str(err.value).startswith(f"{missing}: not found (no such object or folder). Check the URI")
    assert err.value.kind == storage.NOT_FOUND and err.value.uri == missing and "AWS_ENDPOINT_URL" in str(err.value)
    assert pickle.loads(pickle.dumps(err.value)).kind == storage.NOT_FOUND  # it crosses Ray's process boundaries
    for call in (lambda: storage.download("s3://no-such-bucket-403/x.csv", tmp_path / "never"),
                 lambda: storage.write_bytes("s3://no-such-bucket-403/x.csv", b"x"),
                 lambda: storage.list_files("s3://no-such-bucket-403/d")):
        with pytest.raises(StorageError, match=r"^s3://no-such-bucket-403/\S*: the bucket does not exist") as err:
            call()
        assert err.value.kind == storage.NO_BUCKET
    with pytest.raises(StorageError, match="not found"):
        buildonce.local_copy(storage.join(object_store, "storage", "no-folder"))
    assert not storage.exists(missing) and not storage.is_dir(missing)

    with pytest.raises(StorageError) as err:
        storage.check_file(object_store)
    assert err.value.kind == storage.IS_FOLDER and "is a folder (expected a file)" in str(err.value)
    with pytest.raises(StorageError) as err:
        storage.read_bytes(tmp_path / "403")
    assert str(err.value) == f"{tmp_path / '403'}: not found" and err.value.kind == storage.NOT_FOUND
    with pytest.raises(StorageError) as err:
        storage.read_bytes(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a folder (expected a file)" and err.value.kind == storage.IS_FOLDER
    with pytest.raises(StorageError) as err:
        storage.exists("nosuchscheme://b/x")
    assert err.value.kind == storage.NO_FILESYSTEM and "pyarrow cannot open this URI" in str(err.value)


def test_refused_credentials_and_a_stopped_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Access refused is about the credentials; a store that stops answering, at any point of a read, is not a
    setting to fix: check the endpoint and the network, then try again."""
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:  # refuses every key
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
        with pytest.raises(StorageError) as err:
            storage.read_bytes("s3://some-bucket/404/train.csv")
    text = str(err.value)
    assert text.startswith("s3://some-bucket/404/train.csv: access refused") and err.value.kind == storage.REFUSED
    assert "AWS_ACCESS_KEY_ID" in text and "AWS_SECRET_ACCESS_KEY" in text and "s3cr3t-value" not in text
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    import boto3

    with moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bucket-403")
        storage.write_bytes("s3://bucket-403/403/NoSuchBucket/big.bin", b"z" * (3 << 20))
        stream = storage.open_input("s3://bucket-403/403/NoSuchBucket/big.bin")
        assert stream.read(1 << 20) == b"z" * (1 << 20)
    with pytest.raises(StorageError) as err:  # stopped in the middle of the read (pyarrow retries for 6 s)
        stream.read()
    stream.close()
    expected = f"could not reach the store at {endpoint} (AWS_ENDPOINT_URL)"
    assert str(err.value).startswith(f"s3://bucket-403/403/NoSuchBucket/big.bin: {expected}")
    assert err.value.kind == storage.UNREACHABLE
    assert str(err.value).endswith("Check the endpoint and the network, then try again")
    assert "AWS_ACCESS_KEY_ID" not in str(err.value) and "access refused" not in str(err.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:pw@127.0.0.1:9")
    with pytest.raises(StorageError) as err:
        storage.exists("s3://some-bucket/x")
    assert "could not reach the store at http://127.0.0.1:9" in str(err.value) and "pw" not in str(err.value)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"


def test_the_one_atomic_writer_leaves_the_old_or_the_new_content_and_no_temporary(tmp_path: Path) -> None:
    """:func:`storage.replacing` is the atomic writer of the checkpoint's files, the shared Ray's record and every
    local write of storage: a reader in another process, reading all the while, sees only whole old or whole new
    contents; a block that fails leaves the old content; a writer killed half-way (SIGKILL) leaves the old content
    too; and a finished or failed write leaves no temporary beside the file."""
    target = tmp_path / "sub" / "f.bin"
    old, new = b"o" * (1 << 20), b"n" * (1 << 20)
    storage.write_atomic(target, old)  # the folder is made
    assert target.read_bytes() == old and sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]
    reader = subprocess.Popen([sys.executable, "-c", "import sys, time\nseen = set()\nend = time.time() + 2\n"
                               "while time.time() < end:\n    seen.add(open(sys.argv[1], 'rb').read())\n"
                               "print(sorted((len(s), s[:1].decode()) for s in seen))", str(target)],
                              stdout=subprocess.PIPE, text=True)
    for i in range(41):  # the last one writes the old content again
        storage.write_atomic(target, new if i % 2 else old)
    seen = reader.communicate(timeout=30)[0].strip()
    assert seen in ("[(1048576, 'n'), (1048576, 'o')]", "[(1048576, 'o')]"), seen
    with pytest.raises(RuntimeError), storage.replacing(target) as out:
        out.write(b"half of it")
        raise RuntimeError("cut short")
    assert target.read_bytes() == old and sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal, sys\nfrom nre_ray import storage\n"
                               "with storage.replacing(sys.argv[1]) as out:\n    out.write(b'half')\n"
                               "    out.flush()\n    os.kill(os.getpid(), signal.SIGKILL)", str(target)],
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert killed.wait(timeout=30) == -9
    assert target.read_bytes() == old  # what the killed writer had written went to its temporary only


def test_the_one_lock_is_held_by_one_process_at_a_time(tmp_path: Path) -> None:
    """:func:`storage.locked` (the registry lock of the shared Ray, buildonce's turn): while another process holds
    it, ``wait=0`` gives up at once and a number of seconds after that long (LockTimeout, a TimeoutError), the
    ``waiting`` callback is told once, and ``wait=None`` waits until the holder lets go; the file is the user's
    alone (0600)."""
    lock = tmp_path / "the.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom nre_ray import storage\n"
                               f"with storage.locked({str(lock)!r}):\n    print('held', flush=True)\n"
                               "    sys.stdin.readline()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock.stat().st_mode & 0o777 == 0o600
        told: list[str] = []
        with pytest.raises(storage.LockTimeout, match="held for more than 0 s"), storage.locked(lock, wait=0):
            pass
        with pytest.raises(TimeoutError), storage.locked(lock, wait=0.3, waiting=lambda: told.append("wait")):
            pass
        assert told == ["wait"]
        threading.Timer(0.5, holder.stdin.close).start()  # the holder reads its end, and lets go
        with storage.locked(lock, waiting=lambda: told.append("wait")):  # waits for the holder to let go
            assert holder.wait(timeout=30) == 0
        assert told == ["wait", "wait"]
    finally:
        holder.kill()
        holder.wait()
