"""RowFile: a saved ``.npy`` array read by rows with ``os.preadv`` gives exactly what numpy's own load gives, for any
index, and keeps nothing of the file resident."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from nre_ray.data import rowfile
from nre_ray.data.rowfile import RowFile


@pytest.fixture
def saved(tmp_path: Path) -> dict[str, tuple[Path, np.ndarray]]:
    rng = np.random.default_rng(0)
    arrays = {"flat": rng.integers(0, 50_000, 30_000).astype(np.int32),
              "spans": rng.integers(0, 60, (5_000, 2)).astype(np.int32),
              "labels": rng.integers(0, 9, 5_000).astype(np.int64),
              "empty": np.zeros((0, 2), dtype=np.int32)}
    out = {}
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
        out[name] = (tmp_path / f"{name}.npy", array)
    return out


def test_any_index_reads_the_same_rows_as_numpy(saved: dict[str, tuple[Path, np.ndarray]]) -> None:
    rng = np.random.default_rng(1)
    for name in ("flat", "spans", "labels"):
        path, array = saved[name]
        rows = RowFile(path)
        n = len(array)
        assert (len(rows), rows.shape, rows.dtype, rows.ndim) == (n, array.shape, array.dtype, array.ndim)
        assert rows.nbytes == array.nbytes
        cases = [
            rng.integers(0, n, 32),  # a training batch: far apart, one read per row
            np.arange(1, n, 3),  # an evaluation shard (rank 1 of 3): one read of the span
            np.sort(rng.choice(n, 40, replace=False)),  # ascending, some neighbours
            np.array([5, 6, 7, 7, 6, n - 1, 0, 1]),  # runs, repeats, both ends
            np.array([-1, -n]),  # counted from the end
            np.zeros(0, dtype=np.int64),
            rng.permutation(n)[:200],
            (np.arange(0, n - 3, n // 7)[:, None] + np.arange(3)).reshape(-1),  # row-like runs far apart (token ids)
        ]
        for idx in cases:
            got = rows[idx]
            assert got.dtype == array.dtype and np.array_equal(got, array[idx]), (name, idx[:8])
            got[...] = 0  # a new array of the caller's, writable
        assert np.array_equal(rows[10:20], array[10:20]) and np.array_equal(rows[::97], array[::97])
        assert np.array_equal(rows[3], array[3]) and np.array_equal(np.asarray(rows), array)
        assert np.asarray(rows, dtype=np.int64).dtype == np.int64
    path, array = saved["empty"]
    assert np.asarray(RowFile(path)).shape == (0, 2) and RowFile(path)[np.zeros(0, dtype=int)].shape == (0, 2)


def test_a_row_past_the_end_or_a_cut_file_is_a_clear_error(saved: dict[str, tuple[Path, np.ndarray]],
                                                          tmp_path: Path) -> None:
    path, array = saved["labels"]
    with pytest.raises(IndexError, match=r"row 5000 is out of range for 5000 rows of .*labels\.npy"):
        RowFile(path)[[1, len(array)]]
    cut = tmp_path / "cut.npy"
    cut.write_bytes(path.read_bytes()[:-800])  # the last 100 rows lost
    with pytest.raises(OSError, match="ended early"):
        RowFile(cut)[[0, len(array) - 1]]
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="objects"):
        RowFile(tmp_path / "objects.npy")


def test_it_pickles_as_its_path_and_reopens_the_file(saved: dict[str, tuple[Path, np.ndarray]]) -> None:
    path, array = saved["spans"]
    copy = pickle.loads(pickle.dumps(RowFile(path)))
    assert copy._fd is None and np.array_equal(copy[[4000, 3]], array[[4000, 3]])


def test_an_opened_file_reads_the_same_rows_after_its_path_is_renamed_or_removed(
        saved: dict[str, tuple[Path, np.ndarray]], tmp_path: Path) -> None:
    """As a memory map does: a cache folder published (renamed) or replaced by another run under a reader."""
    path, array = saved["labels"]
    rows = RowFile(path)
    path.rename(tmp_path / "moved.npy")
    assert np.array_equal(rows[[7, 4999]], array[[7, 4999]])
    (tmp_path / "moved.npy").unlink()
    np.save(path, np.zeros(3, dtype=np.int64))  # another file at the old path
    assert np.array_equal(rows[[1, 2]], array[[1, 2]]) and len(rows) == len(array)


def test_random_batches_leave_the_file_out_of_the_resident_memory(tmp_path: Path) -> None:
    """What it is for: a memory-mapped file's pages stay resident once touched (a whole large folio per row on Linux
    6.x), a RowFile's never are."""
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.skip("reads /proc/self/status (Linux)")

    def resident_file_kib() -> int:
        line = next(line for line in status.read_text().splitlines() if line.startswith("RssFile:"))
        return int(line.split()[1])

    array = np.arange(16_000_000, dtype=np.int32)  # 64 MB
    np.save(tmp_path / "big.npy", array)
    del array
    rows, rng = RowFile(tmp_path / "big.npy"), np.random.default_rng(0)
    before = resident_file_kib()
    for _ in range(500):
        idx = rng.integers(0, len(rows), 32)
        assert np.array_equal(rows[idx], idx.astype(np.int32))
    assert resident_file_kib() - before < 4_000  # KiB: libraries' pages at most, not the 64 MB file


def test_without_preadv_the_file_is_memory_mapped(saved: dict[str, tuple[Path, np.ndarray]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, array = saved["spans"]
    assert isinstance(rowfile.open_rows(path), RowFile) == rowfile.CAN_READ_ROWS
    monkeypatch.setattr(rowfile, "CAN_READ_ROWS", False)
    mapped = rowfile.open_rows(path)
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped[[3, 1]], array[[3, 1]])
