"""The shared local Ray's registry (nre_ray.cluster.shared_ray) without Ray: the folder, the record, who counts as
alive, the environment fingerprint and the lock."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nre_ray.cluster import shared_ray


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    return shared_ray.registry()


def ended_process() -> list[int]:
    """``[pid, start]`` of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE)
    proc.wait()
    return [proc.pid, 1]


def test_the_registry_is_the_users_alone(tmp_path: Path, folder: Path) -> None:
    assert folder == tmp_path / f"nre_ray-{os.getuid()}" / "local-ray"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    folder.chmod(0o755)  # widened by hand: narrowed again
    assert stat.S_IMODE(shared_ray.registry().stat().st_mode) == 0o700


def test_a_file_in_the_registrys_place_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / f"nre_ray-{os.getuid()}").write_text("not a folder")
    with pytest.raises(OSError, match="not a folder of this user's"):
        shared_ray.registry()


def test_a_record_is_written_whole_and_read_back(folder: Path) -> None:
    assert shared_ray.read(folder) is None
    shared_ray.write(folder, {"gcs": "127.0.0.1:1", "runs": [shared_ray.me()]})
    assert shared_ray.read(folder) == {"gcs": "127.0.0.1:1", "runs": [shared_ray.me()]}
    assert sorted(p.name for p in folder.iterdir()) == ["record.json"]  # no part file left
    (folder / "record.json").write_text("{half")
    assert shared_ray.read(folder) is None
    shared_ray.remove(folder)
    shared_ray.remove(folder)  # twice: nothing to remove is fine


def test_a_process_counts_while_it_runs_and_only_itself() -> None:
    assert shared_ray.running(shared_ray.me())
    pid, start = shared_ray.me()
    assert not shared_ray.running([pid, start + 1])  # another program under this id
    assert not shared_ray.running(ended_process())
    assert not shared_ray.running(None) and not shared_ray.running([])
    assert shared_ray.host_of({"host": shared_ray.me()}).pid == os.getpid()
    assert shared_ray.host_of({"host": ended_process()}) is None and shared_ray.host_of({"host": None}) is None


def test_the_host_drops_ended_runs_and_stops_after_the_last(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # this test process plays the host; one run has ended, one (this process too) still runs
    dead = ended_process()
    shared_ray.write(folder, {"host": shared_ray.me(), "runs": [dead, shared_ray.me()]})
    assert shared_ray._still_used(folder)
    assert shared_ray.read(folder)["runs"] == [shared_ray.me()]
    shared_ray.write(folder, {"host": shared_ray.me(), "runs": [dead]})
    assert not shared_ray._still_used(folder)
    assert shared_ray.read(folder) is None  # removed under the lock: the next run starts a new host
    shared_ray.write(folder, {"host": ended_process(), "runs": [shared_ray.me()]})
    assert not shared_ray._still_used(folder)  # the record is another host's: this one stops, leaving it
    assert shared_ray.read(folder) is not None


def test_the_fingerprint_ignores_volatile_variables_only() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/home/u", "RAY_AUTH_MODE": "disabled"}
    base = shared_ray.fingerprint(env)
    volatile = {**env, "PWD": "/elsewhere", "OLDPWD": "/x", "SHLVL": "3", "_": "/bin/python", "TERM": "xterm",
                "TERM_PROGRAM": "tmux", "PYTEST_CURRENT_TEST": "t.py::x (call)", "COLUMNS": "80",
                "RAY_COLOR_PREFIX": "1"}
    assert shared_ray.fingerprint(volatile) == base
    for key, value in {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/opt/bin:/usr/bin", "OMP_NUM_THREADS": "1",
                       "RAY_AUTH_MODE": "token"}.items():
        assert shared_ray.fingerprint({**env, key: value}) != base, key


def test_the_lock_is_held_by_one_at_a_time(folder: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from nre_ray.cluster import shared_ray\n"
                               f"with shared_ray.locked(Path({str(folder)!r})):\n"
                               "    print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="held for more than"), shared_ray.locked(folder, wait=0.3):
            pass
    finally:
        holder.communicate("")
    with shared_ray.locked(folder, wait=1):  # free again once the holder is gone
        pass


def test_the_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, shared in (("", True), ("0", True), ("1", False), ("true", False), ("YES", False)):
        monkeypatch.setenv(shared_ray.OWN_RAY_ENV, value)
        assert shared_ray.wanted() is shared


def test_variables_set_after_start_up_do_not_count_but_nre_rays_own_do(monkeypatch: pytest.MonkeyPatch) -> None:
    before = shared_ray.fingerprint()
    monkeypatch.setenv("SET_BY_SOME_IMPORT", "1")  # not in this process's initial environment
    assert "SET_BY_SOME_IMPORT" not in shared_ray.ray_environ() and shared_ray.fingerprint() == before
    monkeypatch.setenv("RAY_AUTH_MODE", "token-or-whatever")  # nre_ray's own setting before Ray starts
    assert shared_ray.ray_environ()["RAY_AUTH_MODE"] == "token-or-whatever" and shared_ray.fingerprint() != before


def test_a_joined_commands_workers_start_in_its_folder_and_its_own_hook_runs_after(tmp_path, monkeypatch):
    """The shared Ray's raylet runs where the first command started; a later command's workers must read its relative
    paths (``--data-dir data``) from its own folder, as a private Ray's would (docs/data.md's inspect block)."""
    env = shared_ray.job_runtime_env({"env_vars": {"A": "1"}, "worker_process_setup_hook": "os.getpid"}, str(tmp_path))
    assert env["worker_process_setup_hook"] == "nre_ray.cluster.shared_ray.enter_command_folder"
    assert env["env_vars"] == {"A": "1", shared_ray.FOLDER_ENV: str(tmp_path), shared_ray.NEXT_HOOK_ENV: "os.getpid"}
    assert shared_ray.job_runtime_env(None, "/x") == {
        "env_vars": {shared_ray.FOLDER_ENV: "/x"},
        "worker_process_setup_hook": "nre_ray.cluster.shared_ray.enter_command_folder"}
    monkeypatch.chdir("/")
    for key, value in env["env_vars"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(shared_ray.NEXT_HOOK_ENV, "os.getcwd")  # (a function the hook then runs)
    shared_ray.enter_command_folder()
    assert os.getcwd() == str(tmp_path)
