"""A saved ``.npy`` array read by rows with ``os.preadv``: what a training worker reads its shard of a split through.

Memory-mapping the cache's files (``np.load(mmap_mode="r")``) reads only what is asked for, but the kernel maps a
whole page, or a whole large folio (up to megabytes on ext4 and xfs with Linux 6.x), for each row touched. With
``DistributedSampler``'s shards, interleaved row by row, the first batches of an epoch then leave most of the split
resident in every worker: measured here, one batch of 32 random rows of a 2M-row split added 130 MB to a process's
RSS. A :class:`RowFile` reads exactly the bytes of the rows asked for, into the caller's arrays: a worker's resident
memory holds its batches, and the file's pages stay in the kernel's page cache, shared by every process on the node.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

#: ``take`` reads one span from the first to the last row asked for when the span has at most this many rows per row
#: asked for (an evaluation shard, rank::world_size, or sorted indices), else each run of consecutive rows apart.
DENSE = 4
#: ... or when the span is at most this many bytes (one read beats many below that).
SMALL_READ = 64 * 1024

CAN_READ_ROWS = hasattr(os, "preadv")


class RowFile:
    """The array saved in the ``.npy`` file ``path`` (C order, any dtype without objects), read by rows on demand.

    Indexing with an integer, a slice or an integer array (``rows[idx]``) reads those rows and returns a new array
    of shape ``(len(idx), *shape[1:])``; ``np.asarray(rows)`` reads the whole array. Nothing is kept between reads but
    the open file. Pickles as its path (reopened by the process that unpickles it): it is for processes on the node
    that holds the file.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            shape, fortran_order, dtype = read_header(f)
            self.data_offset = f.tell()
            # kept open: the rows read later come from this file even if its path is renamed or removed meanwhile
            # (a cache folder published or replaced by another run), as with a memory map
            self._fd: int | None = os.dup(f.fileno())
        if fortran_order and len(shape) > 1:
            self._close()
            raise ValueError(f"{self.path}: a Fortran-order array cannot be read by rows")
        if dtype.hasobject:
            self._close()
            raise ValueError(f"{self.path}: an array of Python objects cannot be read by rows")
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype: np.dtype = dtype
        self.row_bytes = dtype.itemsize * math.prod(self.shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """The array's bytes in the file (without the ``.npy`` header)."""
        return len(self) * self.row_bytes

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __repr__(self) -> str:
        return f"RowFile({self.path!r}, shape={self.shape}, dtype={self.dtype})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None}  # the open file is this process's own: reopened by path

    def __del__(self) -> None:
        self._close()

    def _close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._read(0, len(self)) if self.shape else self._read(0, 1).reshape(())
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self.take(np.arange(*key.indices(len(self))))
        if isinstance(key, (int, np.integer)):
            return self.take(np.asarray([key]))[0]
        return self.take(np.asarray(key))

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The rows ``indices`` (1-D integers, in any order, repeats allowed; negative ones count from the end), as a
        new ``(len(indices), *shape[1:])`` array."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if not len(idx):
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.min() < 0 or idx.max() >= n:
            raise IndexError(f"row {int(idx.max() if idx.max() >= n else idx.min())} is out of range for "
                             f"{n} rows of {self.path}")
        first, last = int(idx.min()), int(idx.max())
        span = last - first + 1
        if span <= DENSE * len(idx) or span * self.row_bytes <= SMALL_READ:
            return self._read(first, last + 1)[idx - first]  # fancy indexing: a new array
        out = np.empty((len(idx), *self.shape[1:]), dtype=self.dtype)
        order = np.argsort(idx, kind="stable")
        ordered = idx[order]
        breaks = np.flatnonzero(np.diff(ordered) > 1) + 1  # runs of consecutive (or repeated) rows
        out_bytes = _bytes(out)
        for lo, hi in zip(np.concatenate(([0], breaks)).tolist(), np.concatenate((breaks, [len(idx)])).tolist(),
                          strict=True):
            start, stop, at = int(ordered[lo]), int(ordered[hi - 1]) + 1, int(order[lo])
            if stop - start == hi - lo and (hi - lo == 1 or _ascending_from(order[lo:hi], at)):
                # the run's rows, once each, go to consecutive places of ``out``: read them there
                self._read_into(out_bytes[at * self.row_bytes:(at + hi - lo) * self.row_bytes], start)
            else:
                out[order[lo:hi]] = self._read(start, stop)[ordered[lo:hi] - start]
        return out

    def _read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` read from the file into a new array."""
        block = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        self._read_into(_bytes(block), start)
        return block

    def _read_into(self, view: memoryview, start: int) -> None:
        """Fill ``view`` (bytes) from the file, from row ``start`` on."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        done, offset = 0, self.data_offset + start * self.row_bytes
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path} ended early at byte {offset + done}: rows from {start} on are past its "
                              "end (was it truncated?)")
            done += got


def _bytes(array: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, writable."""
    return memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(bytearray())


def _ascending_from(places: np.ndarray, first: int) -> bool:
    """Whether ``places`` is ``first, first + 1, ...``."""
    return int(places[-1]) - first == len(places) - 1 and bool((np.diff(places) == 1).all())


def open_rows(path: Path | str) -> np.ndarray | RowFile:
    """The ``.npy`` file ``path`` for reading by rows: a :class:`RowFile` where ``os.preadv`` exists (Linux, the BSDs,
    macOS), else memory-mapped."""
    if CAN_READ_ROWS:
        return RowFile(path)
    return np.load(path, mmap_mode="r", allow_pickle=False)
