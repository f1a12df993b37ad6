"""Paths that may be URIs: a local file or folder, or an object store that ``pyarrow.fs`` reaches (``s3://``,
``gs://``, ``hdfs://``, ``abfs://`` ...).

URIs stay strings (``pathlib.Path("s3://b/x")`` would fold them to ``s3:/b/x``) and every access goes through
``pyarrow.fs.FileSystem.from_uri``. Local paths pass through unchanged (``file://`` URIs count as local paths).

Where the store is and who you are come only from the environment, as the store's own tools read it: for S3,
``AWS_ENDPOINT_URL`` (an S3-compatible store such as MinIO), ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(or ``AWS_PROFILE``, an instance role), ``AWS_DEFAULT_REGION``. Nothing secret is taken from a URI, a flag or a file,
and no message of this module shows a credential.

A store that cannot be read or written raises :class:`StorageError`, whose message names the URI, what went wrong
(not found, no such bucket, access refused, store unreachable) and what to check.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from nre_ray.config import ConfigError

PathLike = str | os.PathLike[str]
"""A local path or a URI."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHUNK = 1 << 20
_REFUSED = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "EXPIRED_TOKEN",
            "INVALID_CLIENT_TOKEN_ID", "UNRECOGNIZED_CLIENT", "MISSING_AUTHENTICATION_TOKEN", "ACCESS DENIED",
            "Forbidden", "PermissionDenied", "Permission denied", "403")
_UNREACHABLE = ("NETWORK_CONNECTION", "curlCode", "Could not connect", "Couldn't connect", "Connection refused",
                "Could not resolve host", "Timeout was reached")


class StorageError(ConfigError):
    """A URI that cannot be read or written. ``str(err)`` is ``URI: reason. hint``; :attr:`uri`, :attr:`reason` and
    :attr:`hint` are also kept apart (for a ``FILE: message`` report)."""

    def __init__(self, uri: str, reason: str, hint: str = "") -> None:
        self.uri, self.reason, self.hint = uri, reason, hint
        super().__init__(f"{uri}: {reason}" + (f". {hint}" if hint else ""))

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, str, str]]:
        return (type(self), (self.uri, self.reason, self.hint))


# --------------------------------------------------------------------------------------------------------------------
# names


def is_uri(path: PathLike) -> bool:
    """Whether ``path`` is a ``scheme://`` URI of a store (``file://`` is a local path)."""
    match = _SCHEME.match(os.fspath(path)) if isinstance(path, str | os.PathLike) else None
    return bool(match) and match.group(1).lower() != "file"


def _local(path: PathLike) -> Path:
    """A local path (``file://`` URIs unwrapped, ``~`` expanded)."""
    text = os.fspath(path)
    if text.lower().startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(text).path))
    return Path(text).expanduser()


def absolute(path: PathLike) -> str:
    """A URI unchanged; a local path made absolute (``~`` expanded): what to hand to Ray workers, which run in
    another working directory."""
    return os.fspath(path) if is_uri(path) else str(_local(path).absolute())


def join(base: PathLike, *parts: str) -> str:
    """``base`` / ``parts``: URIs joined with ``/``, local paths with :class:`pathlib.Path`."""
    if not is_uri(base):
        return str(Path(os.fspath(base), *parts))
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return os.fspath(base).rstrip("/") + ("/" + tail if tail else "")


def name_of(path: PathLike) -> str:
    """The last component of ``path`` (``train.csv`` of ``s3://b/data/train.csv``)."""
    return PurePosixPath(os.fspath(path).rstrip("/")).name if is_uri(path) else _local(path).name


# --------------------------------------------------------------------------------------------------------------------
# errors


def credentials_hint(uri: str) -> str:
    """What to check when ``uri`` cannot be reached or is refused: the standard environment variables."""
    scheme = (_SCHEME.match(uri) or _SCHEME.match("x://")).group(1).lower()
    if scheme in ("s3", "s3a"):
        return ("Check the URI, and the environment of every node: AWS_ENDPOINT_URL (an S3-compatible store), "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role), "
                "AWS_DEFAULT_REGION")
    if scheme in ("gs", "gcs"):
        return "Check the URI, and GOOGLE_APPLICATION_CREDENTIALS (or the instance's service account) on every node"
    if scheme in ("abfs", "abfss", "az"):
        return "Check the URI, and the Azure credentials in the environment of every node"
    return "Check the URI, and the store's address and credentials in the environment of every node"


def _endpoint() -> str:
    """``AWS_ENDPOINT_URL`` without any user:password part, or "" when unset."""
    raw = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    parts = urllib.parse.urlsplit(raw)
    if not parts.hostname:
        return raw.split("@")[-1]
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()


def _bucket_missing(uri: str) -> bool:
    """Whether the bucket of an ``s3://`` / ``gs://`` URI does not exist (False when that cannot be told)."""
    scheme = (_SCHEME.match(uri) or _SCHEME.match("x://")).group(1).lower()
    if scheme not in ("s3", "s3a", "gs", "gcs"):
        return False
    try:
        from pyarrow import fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(uri)
        return filesystem.get_file_info(path.split("/", 1)[0]).type == pafs.FileType.NotFound
    except Exception:  # a best-effort refinement of a not-found message
        return False


def _error(uri: str, err: BaseException) -> StorageError:
    """:class:`StorageError` for what pyarrow raised about ``uri``."""
    text = str(err)
    hint = credentials_hint(uri)
    if isinstance(err, FileNotFoundError) or "NO_SUCH_KEY" in text or "NoSuchKey" in text:
        if _bucket_missing(uri):
            return StorageError(uri, "the bucket does not exist", hint)
        return StorageError(uri, "not found (no such object or folder)", hint)
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return StorageError(uri, "the bucket does not exist", hint)
    if any(code in text for code in _REFUSED):
        return StorageError(uri, "access refused: the store did not accept the credentials, or they do not allow "
                                 "this", hint)
    if any(code in text for code in _UNREACHABLE):
        where = f" at {_endpoint()} (AWS_ENDPOINT_URL)" if _endpoint() else ""
        return StorageError(uri, f"cannot reach the store{where}", hint)
    if "Unrecognized filesystem type" in text or ("Unsupported" in text and "scheme" in text.lower()):
        return StorageError(uri, "pyarrow has no filesystem for this URI scheme",
                            "Use s3://, gs://, hdfs://, abfs:// or a local path")
    first = re.sub(r"\s*\(Request ID: [^)]*\)", "", text.strip().splitlines()[0] if text.strip() else "")
    return StorageError(uri, first or type(err).__name__, hint)


@contextlib.contextmanager
def _errors(uri: str) -> Iterator[None]:
    """Turn pyarrow's errors about ``uri`` into :class:`StorageError`."""
    import pyarrow as pa

    try:
        yield
    except StorageError:
        raise
    except (OSError, pa.ArrowException, ValueError) as err:
        raise _error(uri, err) from None


def _resolve(uri: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` of a URI."""
    from pyarrow import fs as pafs

    with _errors(uri):
        return pafs.FileSystem.from_uri(uri)


def _info(uri: str) -> Any:
    """pyarrow's ``FileInfo`` of a URI."""
    filesystem, path = _resolve(uri)
    with _errors(uri):
        return filesystem.get_file_info(path)


def pyarrow_path(path: PathLike) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` of a URI or a local path (made absolute): what ``pyarrow.parquet`` and
    ``pyarrow.fs`` calls take, the same code for both."""
    if is_uri(path):
        return _resolve(os.fspath(path))
    from pyarrow import fs as pafs

    return pafs.LocalFileSystem(), str(_local(path).absolute())


def _remote_entries(uri: str, kind: Any, recursive: bool, allow_not_found: bool = False) -> list[tuple[str, Any]]:
    """``(path relative to uri, FileInfo)`` of the entries of type ``kind`` (a ``pyarrow.fs.FileType``) in the
    folder ``uri``, sorted."""
    from pyarrow import fs as pafs

    filesystem, path = _resolve(uri)
    base = path.rstrip("/")
    with _errors(uri):
        infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=recursive, allow_not_found=allow_not_found))
    return sorted((info.path[len(base):].lstrip("/"), info) for info in infos if info.type == kind)


def _remote_files(uri: str, recursive: bool) -> list[tuple[str, Any]]:
    """``(path relative to uri, FileInfo)`` of the files in the folder ``uri``, sorted."""
    from pyarrow import fs as pafs

    return _remote_entries(uri, pafs.FileType.File, recursive)


# --------------------------------------------------------------------------------------------------------------------
# queries


def exists(path: PathLike) -> bool:
    """Whether ``path`` is an existing file or folder (a URI: an object, or a prefix with objects under it)."""
    if not is_uri(path):
        return _local(path).exists()
    from pyarrow import fs as pafs

    return _info(os.fspath(path)).type != pafs.FileType.NotFound


def is_dir(path: PathLike) -> bool:
    """Whether ``path`` is a folder (a URI: a bucket, or a prefix with objects under it)."""
    if not is_uri(path):
        return _local(path).is_dir()
    from pyarrow import fs as pafs

    return _info(os.fspath(path)).type == pafs.FileType.Directory


def is_file(path: PathLike) -> bool:
    """Whether ``path`` is a file (a URI: an object)."""
    if not is_uri(path):
        return _local(path).is_file()
    from pyarrow import fs as pafs

    return _info(os.fspath(path)).type == pafs.FileType.File


def check_file(path: PathLike) -> None:
    """Raise :class:`StorageError` unless ``path`` is a file (reasons: ``not found ...``, ``is a folder ...``)."""
    if is_file(path):
        return
    text = os.fspath(path)
    if is_dir(path):
        raise StorageError(text, "is a folder (expected a file)", credentials_hint(text) if is_uri(path) else "")
    if not is_uri(path):
        raise StorageError(text, "not found")
    raise _error(text, FileNotFoundError(text))


def size(path: PathLike) -> int:
    """The size of a file in bytes; :class:`StorageError` (not found) when it is none."""
    if not is_uri(path):
        try:
            return _local(path).stat().st_size
        except OSError as err:
            raise StorageError(os.fspath(path), err.strerror or str(err)) from None
    info = _info(os.fspath(path))
    if info.size is None:
        raise _error(os.fspath(path), FileNotFoundError(os.fspath(path)))
    return int(info.size)


def list_files(path: PathLike, recursive: bool = False) -> list[str]:
    """The files in the folder ``path`` (in its subfolders too when ``recursive``), sorted: URIs under a URI, paths
    under a local path."""
    if not is_uri(path):
        folder = _local(path)
        found = folder.rglob("*") if recursive else folder.iterdir()
        return sorted(str(p) for p in found if p.is_file())
    return [join(path, rel) for rel, _ in _remote_files(os.fspath(path), recursive)]


def list_folders(path: PathLike) -> list[str]:
    """The folders directly in the folder ``path``, sorted (none when it does not exist): URIs under a URI, paths
    under a local path."""
    if not is_uri(path):
        folder = _local(path)
        return sorted(str(p) for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    from pyarrow import fs as pafs

    return [join(path, rel) for rel, _ in _remote_entries(os.fspath(path), pafs.FileType.Directory, recursive=False,
                                                          allow_not_found=True)]


def stamp(path: PathLike) -> list[Any]:
    """What changes when the file or folder ``path`` changes, cheaply (no content read): ``[relative path, size,
    mtime in ns]`` of the file, or of every file in the folder."""
    from pyarrow import fs as pafs

    if not is_uri(path):
        local = _local(path)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        return [[p.relative_to(local).as_posix() if p != local else "", p.stat().st_size, p.stat().st_mtime_ns]
                for p in files]
    uri = os.fspath(path)
    info = _info(uri)
    if info.type == pafs.FileType.File:
        return [["", info.size, info.mtime_ns]]
    if info.type == pafs.FileType.NotFound:
        raise _error(uri, FileNotFoundError(uri))
    return [[rel, i.size, i.mtime_ns] for rel, i in _remote_files(uri, recursive=True)]


def object_version(uri: str) -> list[Any]:
    """What identifies the content of the file ``uri`` in an object store, from its metadata alone (one request, a
    HEAD for S3; no byte of the object is read): ``[size, "etag:<ETag>"]`` where the store gives an ETag (S3 and the
    S3-compatible stores: a new one whenever the object is written), else ``[size, "mtime:<ns>"]``. The same bytes
    under another name or written again may get another version (a multipart upload's ETag is not a content hash);
    other bytes always do."""
    from pyarrow import fs as pafs

    filesystem, inner = _resolve(uri)
    with _errors(uri):
        info = filesystem.get_file_info(inner)
        if info.type != pafs.FileType.File:
            raise _error(uri, FileNotFoundError(uri))
        with filesystem.open_input_file(inner) as handle:  # S3: a HEAD request; reads start only on read()
            metadata = {(k.decode() if isinstance(k, bytes) else k).lower(): v
                        for k, v in (handle.metadata() or {}).items()}
    etag = metadata.get("etag")
    if etag:
        return [info.size, "etag:" + (etag.decode() if isinstance(etag, bytes) else etag)]
    return [info.size, f"mtime:{info.mtime_ns}"]


# --------------------------------------------------------------------------------------------------------------------
# reading


def open_input(path: PathLike, compression: str | None = None) -> IO[bytes]:
    """A binary stream of the file ``path`` (close it, or use it in a ``with``); ``compression="gzip"``: of its
    decompressed content. Errors when it is opened are :class:`StorageError`; a stream cut while reading, or bad
    compressed data, raises OSError."""
    if not is_uri(path):
        try:
            return gzip.open(_local(path), "rb") if compression == "gzip" else _local(path).open("rb")  # type: ignore[return-value]
        except OSError as err:
            raise StorageError(os.fspath(path), "not found" if isinstance(err, FileNotFoundError)
                               else err.strerror or str(err)) from None
    uri = os.fspath(path)
    filesystem, inner = _resolve(uri)
    with _errors(uri):
        return filesystem.open_input_stream(inner, compression=compression)


def read_bytes(path: PathLike) -> bytes:
    """The whole file ``path``."""
    with open_input(path) as stream, _errors(os.fspath(path)):
        return stream.read()


def _copy_stream(uri: str, dest: Path) -> None:
    """Write the file ``uri`` to ``dest`` (through a temporary name, so ``dest`` is whole or absent)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        with open_input(uri) as stream, partial.open("wb") as out, _errors(uri):
            shutil.copyfileobj(stream, out, _CHUNK)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)


def download(path: PathLike, local_path: PathLike, skip_suffixes: tuple[str, ...] = (),
             last: str | None = None) -> Path:
    """Copy the file or folder ``path`` (a URI, or a local path) to ``local_path``; return ``local_path``.

    A folder is copied with its subfolders, each file whole or not at all; files whose names end with one of
    ``skip_suffixes`` are left out; ``last`` (a path relative to the folder, e.g. a completion marker) is copied after
    every other file."""
    dest = Path(local_path)
    if not is_uri(path):
        source = _local(path)
        if source.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
            return dest
        if not source.is_dir():
            raise StorageError(os.fspath(path), "not found")
        files = [(p.relative_to(source).as_posix(), str(p)) for p in sorted(source.rglob("*")) if p.is_file()]
    else:
        from pyarrow import fs as pafs

        uri = os.fspath(path)
        info = _info(uri)
        if info.type == pafs.FileType.File:
            _copy_stream(uri, dest)
            return dest
        if info.type == pafs.FileType.NotFound:
            raise _error(uri, FileNotFoundError(uri))
        files = [(rel, join(uri, rel)) for rel, _ in _remote_files(uri, recursive=True)]
    files = [(rel, src) for rel, src in files if not rel.endswith(skip_suffixes)]
    files.sort(key=lambda item: item[0] == last)
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in files:
        if is_uri(src):
            _copy_stream(src, dest / rel)
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)
    return dest


@contextlib.contextmanager
def temporary_copy(path: PathLike) -> Iterator[Path]:
    """A local copy of the file ``path`` with the same name, in a temporary folder removed on exit (a local path is
    yielded as it is)."""
    if not is_uri(path):
        yield _local(path)
        return
    folder = Path(tempfile.mkdtemp(prefix="nre_ray_input_"))
    try:
        yield download(path, folder / (name_of(path) or "file"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def default_cache_root() -> Path:
    """Where :func:`local_copy` keeps its copies: ``<tmp>/nre_ray-<uid>/remote``."""
    return Path(tempfile.gettempdir()) / f"nre_ray-{os.getuid()}" / "remote"


def local_copy(path: PathLike, cache_root: PathLike | None = None, skip_suffixes: tuple[str, ...] = ()) -> Path:
    """A local copy of the file or folder ``path``, downloaded once per machine; a local path is returned as it is.

    The copy lives in ``cache_root`` (default :func:`default_cache_root`) under a key made of the URI, the size and
    modification time of every file (a changed object is downloaded again) and ``skip_suffixes`` (files left out,
    e.g. the weights when only a tokenizer is needed); its name is the URI's last component. It is made by the
    protocol of :mod:`nre_ray.buildonce`: downloaded into a private folder and renamed into place, processes of one
    machine that ask at the same time waiting for one download."""
    from nre_ray import buildonce

    if not is_uri(path):
        return _local(path)
    uri = os.fspath(path).rstrip("/")
    listing = [row for row in stamp(uri) if not str(row[0]).endswith(skip_suffixes)]
    key = hashlib.sha256(json.dumps([uri, listing, sorted(skip_suffixes)]).encode()).hexdigest()[:24]
    done = Path(cache_root if cache_root is not None else default_cache_root()) / key
    target = done / (name_of(uri) or "copy")
    if done.is_dir():
        return target
    with buildonce.turn(done):
        if not done.is_dir():  # else another process finished it while this one waited
            with buildonce.private_folder(done) as private:
                download(uri, private / target.name, skip_suffixes=skip_suffixes)
                buildonce.publish(private, done, complete=Path.is_dir)
    return target


# --------------------------------------------------------------------------------------------------------------------
# writing


def remove(path: PathLike) -> None:
    """Delete the file ``path`` if it exists."""
    if not is_uri(path):
        _local(path).unlink(missing_ok=True)
        return
    uri = os.fspath(path)
    filesystem, inner = _resolve(uri)
    with _errors(uri), contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(inner)


def write_bytes(path: PathLike, data: bytes) -> None:
    """Write the file ``path`` (a URI, or a local path whose folders are made) with ``data``."""
    if not is_uri(path):
        _local(path).parent.mkdir(parents=True, exist_ok=True)
        _local(path).write_bytes(data)
        return
    uri = os.fspath(path)
    store, inner = _resolve(uri)
    with _errors(uri), store.open_output_stream(inner, compression=None) as out:
        out.write(data)


def write_text(path: PathLike, text: str) -> None:
    """Write the UTF-8 text file ``path`` (a URI, or a local path whose folders are made): a command's report."""
    write_bytes(path, text.encode("utf-8"))


def remove_tree(path: PathLike) -> None:
    """Delete the folder ``path`` and everything under it, if it exists."""
    if not is_uri(path):
        shutil.rmtree(_local(path), ignore_errors=True)
        return
    uri = os.fspath(path)
    store, inner = _resolve(uri)
    with _errors(uri), contextlib.suppress(FileNotFoundError):
        store.delete_dir(inner)


def upload(local_path: PathLike, path: PathLike, last: str | None = None, skip: frozenset[str] = frozenset()) -> None:
    """Copy the local file or folder ``local_path`` to ``path`` (a URI, or a local path).

    A folder is copied with its subfolders, except the files named in ``skip`` (paths relative to the folder:
    already there); ``last`` (a path relative to the folder, e.g. a completion marker) is written after every other
    file, so whoever sees it sees a complete copy."""
    source = _local(local_path)
    if source.is_file():
        files = [("", source)]
    elif source.is_dir():
        files = [(p.relative_to(source).as_posix(), p) for p in sorted(source.rglob("*")) if p.is_file()]
        files = [(rel, p) for rel, p in files if rel not in skip]
        files.sort(key=lambda item: item[0] == last)
    else:
        raise StorageError(str(local_path), "not found")
    if not is_uri(path):
        for rel, file in files:
            dest = _local(path) / rel if rel else _local(path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, dest)
        return
    uri = os.fspath(path)
    filesystem, base = _resolve(uri)
    for rel, file in files:
        target = join(uri, rel) if rel else uri
        inner = f"{base.rstrip('/')}/{rel}" if rel else base
        with (_errors(target), file.open("rb") as stream,
              filesystem.open_output_stream(inner, compression=None) as out):  # bytes as they are, even a .gz
            shutil.copyfileobj(stream, out, _CHUNK)
