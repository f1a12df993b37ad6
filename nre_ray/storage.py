"""Paths that may be URIs: a local file or folder, or an object store that ``pyarrow.fs`` reaches (``s3://``,
``gs://``, ``hdfs://``, ``abfs://`` ...).

Every operation has one code path, through ``pyarrow.fs``: a URI is opened with ``FileSystem.from_uri``, a local path
(``file://`` URIs count as local paths, ``~`` is expanded) with ``LocalFileSystem``. URIs stay strings
(``pathlib.Path("s3://b/x")`` would fold them to ``s3:/b/x``).

Writes are whole or nothing: a file written here (:func:`write_bytes`, :func:`upload`, :func:`download`,
:func:`move_file`) is written under a temporary name in its folder and renamed when complete (a local path, HDFS;
a local file is synced to disk before its rename: :func:`replacing`, the one atomic writer of nre_ray), or straight to
the object in an object store, where an object appears only when its upload completes (and is removed again when the
writing fails). No reader ever sees a partial file.

Where the store is and who you are come only from the environment, as the store's own tools read it: for S3,
``AWS_ENDPOINT_URL`` (an S3-compatible store such as MinIO), ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(or ``AWS_PROFILE``, an instance role), ``AWS_DEFAULT_REGION``. Nothing secret is taken from a URI, a flag or a file,
and no message of this module shows a credential.

A file or store that cannot be read or written raises :class:`StorageError`. Its :attr:`~StorageError.kind` comes
from the error's type (``FileNotFoundError``, ``PermissionError``, ``ConnectionError`` ...) or from the AWS error
code that pyarrow reports (``AWS Error NO_SUCH_BUCKET during ...``), never from words in a path; its message names
the path, what went wrong and what to check. A store that cannot be reached is not a setting to fix: its message says
to check the endpoint and the network, then try again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from nre_ray.core.user_error import ConfigError

PathLike = str | os.PathLike[str]
"""A local path or a URI."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CHUNK = 1 << 20
_RENAMING = ("local", "hdfs")
"""``pyarrow.fs`` filesystems (``type_name``) where a rename is atomic and cheap: files are written under a temporary
name, then renamed. In the others (object stores) an object appears whole when its upload completes."""

# The kinds of StorageError (StorageError.kind).
NOT_FOUND = "not found"
NO_BUCKET = "no bucket"
IS_FOLDER = "is a folder"
REFUSED = "refused"
UNREACHABLE = "unreachable"
BUSY = "busy"
NO_FILESYSTEM = "no filesystem"
OTHER = "other"

_AWS_ERROR = re.compile(r"AWS Error (?P<code>[A-Z_]+|\[code \d+\])(?: \(HTTP status (?P<status>\d+)\))? during "
                        r"(?P<operation>\w+) operation: (?P<message>.*)", re.DOTALL)
"""How pyarrow reports an error of the S3 API (arrow/filesystem/s3_internal.h, ``ErrorToStatus``): the SDK's error
type, the HTTP status for an UNKNOWN one, the operation and the store's message."""
_AWS_KINDS = {
    "NO_SUCH_KEY": NOT_FOUND, "RESOURCE_NOT_FOUND": NOT_FOUND, "NO_SUCH_BUCKET": NO_BUCKET,
    "ACCESS_DENIED": REFUSED, "INVALID_ACCESS_KEY_ID": REFUSED, "SIGNATURE_DOES_NOT_MATCH": REFUSED,
    "INVALID_CLIENT_TOKEN_ID": REFUSED, "UNRECOGNIZED_CLIENT": REFUSED, "MISSING_AUTHENTICATION_TOKEN": REFUSED,
    "INCOMPLETE_SIGNATURE": REFUSED, "INVALID_SIGNATURE": REFUSED, "REQUEST_EXPIRED": REFUSED,
    "REQUEST_TIME_TOO_SKEWED": REFUSED,
    "NETWORK_CONNECTION": UNREACHABLE, "REQUEST_TIMEOUT": UNREACHABLE,
    "SERVICE_UNAVAILABLE": BUSY, "SLOW_DOWN": BUSY, "THROTTLING": BUSY, "INTERNAL_FAILURE": BUSY,
}
_HTTP_KINDS = {401: REFUSED, 403: REFUSED, 404: NOT_FOUND, 408: UNREACHABLE, 429: BUSY, 500: BUSY, 502: BUSY,
               503: BUSY, 504: BUSY}
_UNREACHABLE_ERRNOS = (errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EHOSTDOWN)
"""Network errors that Python raises as a plain OSError (refused, reset, aborted, broken pipe and timed out
connections have OSError subclasses of their own)."""


class StorageError(ConfigError):
    """A path that cannot be read or written. ``str(err)`` is ``PATH: reason. hint``; :attr:`uri`, :attr:`reason`,
    :attr:`hint` and :attr:`kind` (one of the module's ``NOT_FOUND``, ``NO_BUCKET``, ``IS_FOLDER``, ``REFUSED``,
    ``UNREACHABLE``, ``BUSY``, ``NO_FILESYSTEM``, ``OTHER``) are also kept apart (for a ``FILE: message`` report)."""

    def __init__(self, uri: str, reason: str, hint: str = "", kind: str = OTHER) -> None:
        self.uri, self.reason, self.hint, self.kind = uri, reason, hint, kind
        super().__init__(f"{uri}: {reason}" + (f". {hint}" if hint else ""))

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, str, str, str]]:
        return (type(self), (self.uri, self.reason, self.hint, self.kind))


# --------------------------------------------------------------------------------------------------------------------
# names


def scheme(path: PathLike) -> str:
    """The scheme of a ``scheme://`` URI, lower case (``file`` for ``file://``); "" for a plain path."""
    match = _SCHEME.match(os.fspath(path)) if isinstance(path, str | os.PathLike) else None
    return match.group(1).lower() if match else ""


def is_uri(path: PathLike) -> bool:
    """Whether ``path`` is a ``scheme://`` URI of a store (``file://`` is a local path)."""
    return scheme(path) not in ("", "file")


def as_local_path(path: PathLike) -> Path:
    """A local path (``file://`` URIs unwrapped, ``~`` expanded)."""
    text = os.fspath(path)
    if scheme(text) == "file":
        return Path(urllib.parse.unquote(urllib.parse.urlparse(text).path))
    return Path(text).expanduser()


def with_scheme(path: str, base: str) -> str:
    """``path``, a path in the store of ``base`` as Ray and ``pyarrow.fs`` report it (``bucket/key`` for
    ``s3://bucket/key``), with ``base``'s scheme again: a checkpoint's path as the user gave the storage."""
    prefix = scheme(base)
    return f"{prefix}://{path}" if prefix and not scheme(path) else path


def absolute(path: PathLike) -> str:
    """A URI unchanged; a local path made absolute (``~`` expanded): what to hand to Ray workers, which run in
    another working directory."""
    return os.fspath(path) if is_uri(path) else str(as_local_path(path).absolute())


def join(base: PathLike, *parts: str) -> str:
    """``base`` / ``parts``: URIs joined with ``/``, local paths with :class:`pathlib.Path`."""
    if not is_uri(base):
        return str(as_local_path(base).joinpath(*parts))
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return os.fspath(base).rstrip("/") + ("/" + tail if tail else "")


def name_of(path: PathLike) -> str:
    """The last component of ``path`` (``train.csv`` of ``s3://b/data/train.csv``)."""
    return PurePosixPath(os.fspath(path).rstrip("/")).name if is_uri(path) else as_local_path(path).name


def parent(path: PathLike) -> str:
    """The folder that holds ``path`` (``s3://b/data`` of ``s3://b/data/train.csv``; a bucket is its own)."""
    if not is_uri(path):
        return str(as_local_path(path).parent)
    text = os.fspath(path).rstrip("/")
    head = text.rpartition("/")[0]
    return head if len(head) > len(scheme(text)) + len("://") else text


# --------------------------------------------------------------------------------------------------------------------
# where a path is in pyarrow.fs


def _pafs() -> Any:
    """``pyarrow.fs``, imported when first needed (it takes a moment; ``--help`` does not need it)."""
    import pyarrow.fs

    return pyarrow.fs


@dataclass(frozen=True)
class _Where:
    """A path resolved: its ``pyarrow.fs`` filesystem, the path inside it, and the name the user gave."""

    fs: Any
    path: str
    name: str

    def child(self, rel: str) -> _Where:
        """The entry ``rel`` (a relative path with ``/``) under this folder."""
        if not rel:
            return self
        return _Where(self.fs, f"{self.path.rstrip('/')}/{rel}", join(self.name, rel))

    @property
    def renames(self) -> bool:
        """Whether files are written under a temporary name and renamed here (see :data:`_RENAMING`)."""
        return self.fs.type_name in _RENAMING


def _where(path: PathLike) -> _Where:
    """Resolve ``path``: ``FileSystem.from_uri`` for a URI, ``LocalFileSystem`` (the path made absolute) else."""
    name = os.fspath(path)
    if not is_uri(name):
        return _Where(_pafs().LocalFileSystem(), str(as_local_path(name).absolute()), name)
    import pyarrow as pa

    try:
        filesystem, inner = _pafs().FileSystem.from_uri(name)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:  # no filesystem for it in this pyarrow
        raise StorageError(name, f"pyarrow cannot open this URI ({_first_line(err)})",
                           "Use s3://, gs://, hdfs://, abfs:// or a local path", NO_FILESYSTEM) from None
    except OSError as err:  # e.g. the bucket's region asked of an unreachable store
        raise _error(name, err) from None
    return _Where(filesystem, inner.rstrip("/") or inner, name)


def pyarrow_path(path: PathLike) -> tuple[Any, str]:
    """``(pyarrow filesystem, path in it)`` of a URI or a local path (made absolute): what ``pyarrow.parquet`` and
    ``pyarrow.fs`` calls take."""
    where = _where(path)
    return where.fs, where.path


# --------------------------------------------------------------------------------------------------------------------
# errors


def credentials_hint(uri: str) -> str:
    """What to check when ``uri`` is not found or is refused: the URI and the standard environment variables."""
    kind = scheme(uri)
    if kind in ("s3", "s3a"):
        return ("Check the URI, and the environment of every node: AWS_ENDPOINT_URL (an S3-compatible store), "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role), "
                "AWS_DEFAULT_REGION")
    if kind in ("gs", "gcs"):
        return "Check the URI, and GOOGLE_APPLICATION_CREDENTIALS (or the instance's service account) on every node"
    if kind in ("abfs", "abfss", "az"):
        return "Check the URI, and the Azure credentials in the environment of every node"
    return "Check the URI, and the store's address and credentials in the environment of every node"


def _endpoint() -> str:
    """``AWS_ENDPOINT_URL`` without any user:password part, or "" when unset."""
    raw = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    parts = urllib.parse.urlsplit(raw)
    if not parts.hostname:
        return raw.split("@")[-1]
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()


def _first_line(err: BaseException) -> str:
    """The first line of ``err``'s message without the store's request id (or the error's type name)."""
    text = (err.strerror if isinstance(err, OSError) and err.strerror else str(err)).strip()
    first = re.sub(r"\s*\(Request ID: [^)]*\)", "", text.splitlines()[0]) if text else ""
    return first or type(err).__name__


def _kind_of(err: BaseException) -> tuple[str, str]:
    """``(kind, detail)`` of an error raised by ``pyarrow.fs`` or the OS: from its type and errno, or from the AWS
    error code (or HTTP status) in pyarrow's structured report of an S3 error; ``detail`` is the store's own words
    (the code and its message) or the OS's."""
    aws = _AWS_ERROR.search(str(err)) if isinstance(err, OSError) else None
    if aws is not None:
        code, status = aws.group("code"), aws.group("status")
        kind = _AWS_KINDS.get(code) or (_HTTP_KINDS.get(int(status), OTHER) if status else OTHER)
        message = re.sub(r"\s*\(Request ID: [^)]*\)", "", aws.group("message").strip().splitlines()[0])
        return kind, f"{code}{f' (HTTP {status})' if status else ''}: {message.split('; Details:')[0]}"
    if isinstance(err, FileNotFoundError | NotADirectoryError):
        return NOT_FOUND, ""
    if isinstance(err, PermissionError):
        return REFUSED, ""
    if isinstance(err, IsADirectoryError):
        return IS_FOLDER, ""
    if isinstance(err, ConnectionError | TimeoutError):
        return UNREACHABLE, err.strerror or _first_line(err)
    if isinstance(err, OSError) and err.errno in _UNREACHABLE_ERRNOS:
        return UNREACHABLE, err.strerror or ""
    return OTHER, _first_line(err)


def _bucket_missing(uri: str) -> bool:
    """Whether the bucket of an ``s3://`` / ``gs://`` URI does not exist (False when that cannot be told)."""
    if scheme(uri) not in ("s3", "s3a", "gs", "gcs"):
        return False
    import pyarrow as pa

    try:
        where = _where(uri)
        return where.fs.get_file_info(where.path.split("/", 1)[0]).type == _pafs().FileType.NotFound
    except (StorageError, OSError, pa.ArrowException):  # a refinement of a not-found message, when it can be had
        return False


def _error(name: str, err: BaseException) -> StorageError:
    """:class:`StorageError` for what ``pyarrow.fs`` (or the OS) raised about the path ``name``."""
    kind, detail = _kind_of(err)
    remote = is_uri(name)
    hint = credentials_hint(name) if remote else ""
    if kind == NOT_FOUND:
        if _bucket_missing(name):
            return StorageError(name, "the bucket does not exist", hint, NO_BUCKET)
        return StorageError(name, "not found (no such object or folder)" if remote else "not found", hint, kind)
    if kind == NO_BUCKET:
        return StorageError(name, "the bucket does not exist", hint, kind)
    if kind == REFUSED:
        if not remote:
            return StorageError(name, "permission denied", "Check the permissions of the file and its folders",
                                kind)
        return StorageError(name, "access refused: the store did not accept the credentials, or they do not allow "
                                  "this", hint, kind)
    if kind == UNREACHABLE:
        where = f" at {_endpoint()} (AWS_ENDPOINT_URL)" if remote and scheme(name) in ("s3", "s3a") and _endpoint() \
            else ""
        return StorageError(name, f"could not reach the store{where}" + (f": {detail}" if detail else ""),
                            "Check the endpoint and the network, then try again", kind)
    if kind == BUSY:
        return StorageError(name, f"the store could not serve the request now: {detail}",
                            "Try again in a while", kind)
    if kind == IS_FOLDER:
        return StorageError(name, "is a folder (expected a file)", hint, kind)
    if _is_folder(name):  # an operation on a file was given a folder
        return StorageError(name, "is a folder (expected a file)", hint, IS_FOLDER)
    return StorageError(name, detail, hint, kind)


def _is_folder(name: str) -> bool:
    """Whether ``name`` is a folder (False when that cannot be told)."""
    import pyarrow as pa

    try:
        where = _where(name)
        return where.fs.get_file_info(where.path).type == _pafs().FileType.Directory
    except (StorageError, OSError, pa.ArrowException):
        return False


@contextlib.contextmanager
def _errors(name: str) -> Iterator[None]:
    """Turn the errors of ``pyarrow.fs`` (and the OS) about the path ``name`` into :class:`StorageError`."""
    import pyarrow as pa

    try:
        yield
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise _error(name, err) from None


def _not_found(where: _Where) -> StorageError:
    """:class:`StorageError` for a path that is not there."""
    return _error(where.name, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), where.name))


def _info(where: _Where) -> Any:
    """pyarrow's ``FileInfo`` of a path."""
    with _errors(where.name):
        return where.fs.get_file_info(where.path)


def _entries(where: _Where, kind: Any, recursive: bool, allow_not_found: bool = False) -> list[tuple[str, Any]]:
    """``(path relative to the folder, FileInfo)`` of its entries of type ``kind`` (a ``pyarrow.fs.FileType``),
    sorted."""
    base = where.path.rstrip("/")
    with _errors(where.name):
        infos = where.fs.get_file_info(_pafs().FileSelector(base, recursive=recursive,
                                                            allow_not_found=allow_not_found))
    return sorted((info.path[len(base):].lstrip("/"), info) for info in infos if info.type == kind)


def _files(where: _Where) -> list[tuple[str, Any]]:
    """``(path relative to where, FileInfo)`` of the file ``where`` (``""``), or of every file in the folder and
    its subfolders; :class:`StorageError` (not found) when it is neither."""
    info = _info(where)
    kinds = _pafs().FileType
    if info.type == kinds.NotFound:
        raise _not_found(where)
    return [("", info)] if info.type == kinds.File else _entries(where, kinds.File, recursive=True)


# --------------------------------------------------------------------------------------------------------------------
# queries


def exists(path: PathLike) -> bool:
    """Whether ``path`` is an existing file or folder (a URI: an object, or a prefix with objects under it)."""
    return _info(_where(path)).type != _pafs().FileType.NotFound


def is_dir(path: PathLike) -> bool:
    """Whether ``path`` is a folder (a URI: a bucket, or a prefix with objects under it)."""
    return _info(_where(path)).type == _pafs().FileType.Directory


def is_file(path: PathLike) -> bool:
    """Whether ``path`` is a file (a URI: an object)."""
    return _info(_where(path)).type == _pafs().FileType.File


def _file_info(where: _Where) -> Any:
    """The ``FileInfo`` of the file ``where``; :class:`StorageError` (not found, is a folder) when it is none."""
    info = _info(where)
    kinds = _pafs().FileType
    if info.type == kinds.Directory:
        raise StorageError(where.name, "is a folder (expected a file)",
                           credentials_hint(where.name) if is_uri(where.name) else "", IS_FOLDER)
    if info.type != kinds.File:
        raise _not_found(where)
    return info


def check_file(path: PathLike) -> None:
    """Raise :class:`StorageError` unless ``path`` is a file (reasons: ``not found ...``, ``is a folder ...``)."""
    _file_info(_where(path))


def size(path: PathLike) -> int:
    """The size of a file in bytes; :class:`StorageError` (not found, is a folder) when it is none."""
    return int(_file_info(_where(path)).size)


def list_files(path: PathLike, recursive: bool = False) -> list[str]:
    """The files in the folder ``path`` (in its subfolders too when ``recursive``), sorted: URIs under a URI, paths
    under a local path."""
    return [join(path, rel) for rel, _ in _entries(_where(path), _pafs().FileType.File, recursive)]


def list_folders(path: PathLike) -> list[str]:
    """The folders directly in the folder ``path``, sorted (none when it does not exist): URIs under a URI, paths
    under a local path."""
    return [join(path, rel) for rel, _ in _entries(_where(path), _pafs().FileType.Directory, recursive=False,
                                                   allow_not_found=True)]


def stamp(path: PathLike) -> list[Any]:
    """What changes when the file or folder ``path`` changes, cheaply (no content read): ``[relative path, size,
    mtime in ns]`` of the file, or of every file in the folder."""
    return [[rel, info.size, info.mtime_ns] for rel, info in _files(_where(path))]


def check_bucket(path: PathLike) -> None:
    """Raise :class:`StorageError` unless the store of ``path``, a folder that will be written (created where
    missing), can take it: for an ``s3://`` or ``gs://`` URI, the bucket exists, and the store answers and accepts the
    credentials (reasons: ``the bucket does not exist``, ``could not reach the store``, ``access refused``). One
    request; nothing is written. A local path and other stores' URIs pass (a local folder is made as needed)."""
    if scheme(path) not in ("s3", "s3a", "gs", "gcs"):
        return
    where = _where(path)
    bucket = _Where(where.fs, where.path.split("/", 1)[0], os.fspath(path))
    if _info(bucket).type == _pafs().FileType.NotFound:
        raise StorageError(os.fspath(path), "the bucket does not exist", credentials_hint(os.fspath(path)), NO_BUCKET)


def object_version(uri: str) -> list[Any]:
    """What identifies the content of the file ``uri`` in an object store, from its metadata alone (one request, a
    HEAD for S3; no byte of the object is read): ``[size, "etag:<ETag>"]`` where the store gives an ETag (S3 and the
    S3-compatible stores: a new one whenever the object is written), else ``[size, "mtime:<ns>"]``. The same bytes
    under another name or written again may get another version (a multipart upload's ETag is not a content hash);
    other bytes always do."""
    where = _where(uri)
    info = _file_info(where)
    with _errors(where.name), where.fs.open_input_file(where.path) as handle:  # S3: a HEAD; reads start on read()
        metadata = {(k.decode() if isinstance(k, bytes) else k).lower(): v
                    for k, v in (handle.metadata() or {}).items()}
    etag = metadata.get("etag")
    if etag:
        return [info.size, "etag:" + (etag.decode() if isinstance(etag, bytes) else etag)]
    return [info.size, f"mtime:{info.mtime_ns}"]


# --------------------------------------------------------------------------------------------------------------------
# reading


class _Reader(io.RawIOBase):
    """A ``pyarrow.fs`` input stream as a Python raw stream (buffered by :func:`open_input`: lines, ``readline``,
    text). An error of the store while reading (unreachable, refused ...) becomes :class:`StorageError`; other
    errors (bad compressed data) stay OSError."""

    def __init__(self, stream: Any, name: str) -> None:
        super().__init__()
        self._stream, self._name = stream, name

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._stream.read(len(buffer))
        except OSError as err:
            if _kind_of(err)[0] == OTHER:
                raise
            raise _error(self._name, err) from None
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def open_input(path: PathLike, compression: str | None = None) -> IO[bytes]:
    """A buffered binary stream of the file ``path`` (close it, or use it in a ``with``); ``compression="gzip"``: of
    its decompressed content. Errors when it is opened, and errors of the store while reading, are
    :class:`StorageError`; bad compressed data raises OSError."""
    where = _where(path)
    with _errors(where.name):
        stream = where.fs.open_input_stream(where.path, compression=compression)
    return io.BufferedReader(_Reader(stream, where.name), _CHUNK)


def read_bytes(path: PathLike) -> bytes:
    """The whole file ``path``."""
    with open_input(path) as stream:
        return stream.read()


def read_range(path: PathLike, start: int, length: int) -> bytes:
    """``length`` bytes of the file ``path`` from byte ``start`` on (fewer at its end)."""
    where = _where(path)
    with _errors(where.name), where.fs.open_input_file(where.path) as stream:
        return stream.read_at(length, start)


# --------------------------------------------------------------------------------------------------------------------
# writing


@contextlib.contextmanager
def _output(where: _Where) -> Iterator[Any]:
    """A stream that writes the file ``where`` whole or not at all (see the module docstring): a local file through
    :func:`replacing` (a temporary beside it, synced to disk, renamed when the block ends); on HDFS, under a
    temporary name in its folder, renamed when the block ends; in an object store, straight to the object, which is
    removed again when the block fails."""
    if where.fs.type_name == "local":
        with _errors(where.name), replacing(where.path) as out:
            yield out
        return
    target = where.path
    if where.renames:
        folder, _, base = where.path.rpartition("/")
        with _errors(where.name):
            where.fs.create_dir(folder or "/", recursive=True)
        target = f"{folder}/{_partial_name(base)}"
    with _errors(where.name):
        stream = where.fs.open_output_stream(target, compression=None)
    try:
        with _errors(where.name), stream as out:
            yield out
        if where.renames:
            with _errors(where.name):
                where.fs.move(target, where.path)
    except BaseException:
        import pyarrow as pa

        with contextlib.suppress(OSError, pa.ArrowException):  # closing the stream has written what it had
            where.fs.delete_file(target)
        raise


def _copy(source: _Where, dest: _Where) -> None:
    """Copy the file ``source`` to ``dest``, bytes as they are (even a ``.gz``), whole or not at all."""
    with _errors(source.name):
        stream = source.fs.open_input_stream(source.path, compression=None)
    with stream, _output(dest) as out:
        while True:
            with _errors(source.name):
                chunk = stream.read(_CHUNK)
            if not chunk:
                break
            out.write(chunk)


def _copy_tree(source: _Where, dest: _Where, skip: Callable[[str], bool] = lambda rel: False,
               last: str | None = None) -> None:
    """Copy the file or folder ``source`` to ``dest``: a folder with its subfolders (made even when empty, where
    there are folders), each file whole or not at all, except the files for which ``skip(relative path)``; ``last``
    (a relative path) is copied after every other file, so whoever sees it sees a complete copy."""
    entries = _files(source)
    files = [rel for rel, _ in entries if not (rel and skip(rel))]
    files.sort(key=lambda rel: rel == last)
    if [rel for rel, _ in entries] != [""] and dest.renames:  # a folder
        with _errors(dest.name):
            dest.fs.create_dir(dest.path, recursive=True)
    for rel in files:
        _copy(source.child(rel), dest.child(rel))


def write_bytes(path: PathLike, data: bytes) -> None:
    """Write the file ``path`` with ``data`` (the folders of a local path are made), whole or not at all."""
    with _output(_where(path)) as out:
        out.write(data)


def upload(local_path: PathLike, path: PathLike, last: str | None = None, skip: frozenset[str] = frozenset()) -> None:
    """Copy the local file or folder ``local_path`` to ``path`` (a URI, or a local path).

    A folder is copied with its subfolders, each file whole or not at all, except the files named in ``skip`` (paths
    relative to the folder: already there); ``last`` (a path relative to the folder, e.g. a completion marker) is
    written after every other file, so whoever sees it sees a complete copy."""
    _copy_tree(_where(local_path), _where(path), lambda rel: rel in skip, last)


def download(path: PathLike, local_path: PathLike, skip_suffixes: tuple[str, ...] = (),
             last: str | None = None) -> Path:
    """Copy the file or folder ``path`` (a URI, or a local path) to ``local_path``; return ``local_path``.

    A folder is copied with its subfolders, each file whole or not at all; files whose names end with one of
    ``skip_suffixes`` are left out; ``last`` (a path relative to the folder, e.g. a completion marker) is copied after
    every other file."""
    dest = Path(local_path)
    _copy_tree(_where(path), _where(dest), lambda rel: rel.endswith(skip_suffixes), last)
    return dest


def move_file(local_file: PathLike, path: PathLike) -> None:
    """Put the finished local file ``local_file`` at ``path`` (a URI, or a local path), whole or not at all, and
    remove ``local_file``: a rename when both are on this machine's disk (no copy when they are on one filesystem),
    else an upload."""
    if not is_uri(path):
        try:
            os.replace(as_local_path(local_file), as_local_path(path))  # local only: one rename
            return
        except OSError as err:
            if err.errno != errno.EXDEV:  # another filesystem of this machine: copied below
                raise _error(os.fspath(path), err) from None
    _copy(_where(local_file), _where(path))
    as_local_path(local_file).unlink()


def remove(path: PathLike) -> None:
    """Delete the file ``path`` if it exists."""
    where = _where(path)
    with _errors(where.name), contextlib.suppress(FileNotFoundError):
        where.fs.delete_file(where.path)


def write_text(path: PathLike, text: str) -> None:
    """Write the UTF-8 text file ``path`` (a URI, or a local path whose folders are made): a command's report."""
    write_bytes(path, text.encode("utf-8"))


def remove_tree(path: PathLike) -> None:
    """Delete the folder ``path`` and everything under it, if it exists."""
    where = _where(path)
    with _errors(where.name), contextlib.suppress(FileNotFoundError):
        where.fs.delete_dir(where.path)


# --------------------------------------------------------------------------------------------------------------------
# this machine's disk only: files replaced at once, locks


def _partial_name(name: str) -> str:
    """The temporary name a write of the file ``name`` goes to before its rename: ``.<name>.<pid>-<random>.partial``
    (hidden, this process's own, and never taken for a finished file)."""
    return f".{name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"


@contextlib.contextmanager
def replacing(path: PathLike) -> Iterator[IO[bytes]]:
    """A binary file to write that replaces the local file ``path`` at once when the block ends (the one atomic
    writer of nre_ray). It is written under a temporary name beside ``path`` (:func:`_partial_name`; its folders are
    made), flushed to disk (``fsync``), renamed onto ``path``, and then the folder is synced, so that the rename
    outlives a crash of the machine too. A reader sees the old content or the new, never a part of it; when the block
    fails, the old file (or none) stays and the temporary is removed. Errors are the OS's (OSError)."""
    target = as_local_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(_partial_name(target.name))
    try:
        with open(temporary, "xb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    _sync_folder(target.parent)


def write_atomic(path: PathLike, data: bytes) -> None:
    """Replace the local file ``path`` with ``data`` at once (:func:`replacing`); OSError as the OS raises it. (For a
    path that may be a URI, with :class:`StorageError`: :func:`write_bytes`.)"""
    with replacing(path) as out:
        out.write(data)


def _sync_folder(folder: Path) -> None:
    """Flush the entries of ``folder`` (a rename in it) to disk, where the system allows a folder to be synced."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a folder (some network ones): the rename is done all the same
        pass
    finally:
        os.close(fd)


class LockTimeout(TimeoutError):
    """The lock was held by another process for longer than the caller would wait (:func:`locked`)."""


@contextlib.contextmanager
def locked(path: PathLike, wait: float | None = None, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the local file ``path`` (``fcntl.flock``; the file is made, mode 0600, where missing)
    while the block runs: one process of this machine at a time. ``wait``: None waits as long as the lock is held;
    a number of seconds, :class:`LockTimeout` after that long (0: at once). ``waiting`` is called once when this
    process has to wait. The lock goes with the process that holds it, killed or not."""
    import fcntl

    fd = os.open(as_local_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            if wait is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                _wait_for_lock(fd, path, wait)
        yield
    finally:
        os.close(fd)  # releases the lock


def _wait_for_lock(fd: int, path: PathLike, wait: float) -> None:
    """Take the lock of ``fd`` within ``wait`` s, trying every 0.1 s; :class:`LockTimeout` when it is not free by
    then."""
    import fcntl
    import time

    deadline = time.monotonic() + wait
    while True:
        if time.monotonic() >= deadline:
            raise LockTimeout(f"the lock {os.fspath(path)} was held for more than {wait:g} s")
        time.sleep(0.1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue


# --------------------------------------------------------------------------------------------------------------------
# local copies (this machine's disk only)


@contextlib.contextmanager
def temporary_copy(path: PathLike) -> Iterator[Path]:
    """A local copy of the file ``path`` with the same name, in a temporary folder removed on exit (a local path is
    yielded as it is)."""
    if not is_uri(path):
        yield as_local_path(path)
        return
    folder = Path(tempfile.mkdtemp(prefix="nre_ray_input_"))
    try:
        yield download(path, folder / (name_of(path) or "file"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
