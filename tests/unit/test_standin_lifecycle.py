"""The stand-in's life cycle without Ray: ``up`` refuses its ports before it starts anything, and ``down`` signals a
recorded process only while it is still the same process (start time and command line), as after a reboot another
program may run under a recorded id. The full cycle on a real stand-in is in tests/integration/test_standin.py."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import threading

import pytest

from nre_ray.cluster import processes, standin_cluster
from nre_ray.standin import main as standin_main
from tests.procs import alive, free_port, kill_all, wait_for


@pytest.fixture
def listening():
    """A port something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_up_refuses_a_bad_port_in_one_line_and_starts_nothing(tmp_path, capsys, listening):
    folder = tmp_path / "standin"
    free = [str(free_port()) for _ in range(3)]
    cases = {
        f"port(s) in use on this machine: --s3-port {listening}; pass free ones": ["--s3-port", str(listening)],
        "--gcs-port 80: the stand-in's ports are from 1024 to 65535": ["--gcs-port", "80"],
        "--mlflow-port 70000: the stand-in's ports are from 1024 to 65535": ["--mlflow-port", "70000"],
        f"--s3-port and --mlflow-port are both {free[0]}; give each its own port": ["--mlflow-port", free[0]],
    }
    for message, args in cases.items():
        ports = dict(zip(["--s3-port", "--gcs-port", "--dashboard-port"], free, strict=True))
        ports["--mlflow-port"] = str(free_port())
        ports.update(dict(zip(args[::2], args[1::2], strict=True)))
        assert standin_main(["up", "--dir", str(folder), *[x for kv in ports.items() for x in kv]]) == 2, message
        out = capsys.readouterr()
        assert out.out == "" and out.err.startswith(f"error: {message}") and out.err.count("\n") == 1, out
        assert not folder.exists()  # no state file, no logs: nothing was started


def test_the_head_workers_ports_leave_out_the_standins_ports():
    low, high = standin_cluster.RAY_WORKER_PORTS
    assert (low, high) == (10002, 19999)  # ray start's own defaults
    assert standin_cluster.worker_ports([9000, 6379, 8265, 5000]) == (low, high)
    assert standin_cluster.worker_ports([12345, 9000]) == (12346, high)
    assert standin_cluster.worker_ports([18000, 11000, 40000]) == (11001, 17999)
    assert standin_cluster.worker_ports([low, high]) == (low + 1, high - 1)


def _sleep(**env: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin", **env}, start_new_session=True)


def _identity(proc: subprocess.Popen, program: str = "sleep") -> processes.Process:
    return wait_for("the process to start", lambda: (p := processes.identify(proc.pid)) and program in p.cmdline
                    and p, 10)


def test_down_stops_only_what_is_still_the_standins(tmp_path, capsys):
    session = secrets.token_hex(8)
    recorded, shell = _sleep(), subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    marked = _sleep(**{standin_cluster.SESSION_ENV: session})  # not recorded (as a worker node Ray started later)
    restarted, renamed = _sleep(), _sleep()  # ids now held by other programs: another start time, command line
    others = [restarted, renamed]
    try:
        # (as its command line: read between fork and exec, it is empty, and that record would not match it later)
        ours = [_identity(recorded), _identity(shell, "sh -c")]
        child = wait_for("the shell's sleep", lambda: processes.descendants([shell.pid], processes.parents())
                         - {shell.pid}, 10).pop()
        was = _identity(restarted)
        strangers = [processes.Process(was.pid, was.start + 1, was.cmdline),
                     processes.Process(renamed.pid, _identity(renamed).start, "moto_server -H 127.0.0.1 -p 9000")]
        state = standin_cluster.Standin(str(tmp_path), "b", 1, 2, 3, 4, str(tmp_path / "ray"), session, (10002, 19999),
                                [*ours, *strangers])
        state.save()
        (tmp_path / "logs").mkdir()  # (as `up` leaves it)

        assert standin_main(["down", "--dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"stopped 4 processes of the stand-in in {tmp_path}", out  # recorded, sh, its sleep, marked
        assert len(out) == 2 and out[1].startswith("left alone 2 recorded process id(s) that now belong to other "
                                                   "programs"), out
        assert f"{restarted.pid} (`sleep 300`), recorded as `sleep 300`" in out[1]
        assert f"{renamed.pid} (`sleep 300`), recorded as `moto_server -H 127.0.0.1 -p 9000`" in out[1]
        for proc in (recorded, shell, marked):
            assert proc.wait(timeout=10) is not None
        assert not alive(child)
        assert all(alive(p.pid) for p in others)
        assert not (tmp_path / standin_cluster.STATE_FILE).exists()
        # Run again, it says so, and succeeds (it once failed with "no stand-in in ..." and exit 2); a folder where no
        # stand-in ever was is still an error.
        assert standin_main(["down", "--dir", str(tmp_path)]) == 0
        assert capsys.readouterr().out == f"the stand-in in {tmp_path} is already down: nothing of it runs\n"
        assert standin_main(["down", "--dir", str(tmp_path / "never")]) == 2
    finally:
        kill_all([p.pid for p in (recorded, shell, marked, *others)])
        for proc in (recorded, shell, marked, *others):
            proc.wait(timeout=10)


def test_a_wait_takes_a_program_that_is_not_http_for_not_up_yet_and_stops_when_its_server_exits(tmp_path):
    """A port held by another program that answers in binary (as Ray's gRPC servers do) is not the server waited
    for: the wait goes on, and ends at its timeout with the server's log line; a server that has exited ends it at
    once, with its status and the log's error."""
    log = tmp_path / "server.log"
    log.write_text("starting\nOSError: [Errno 98] Address already in use\n", encoding="utf-8")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]

        def answer_in_binary() -> None:
            conn, _ = sock.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x04\x00@\x00\x00")

        threading.Thread(target=answer_in_binary, daemon=True).start()
        with pytest.raises(standin_cluster.UsageError,
                           match=r"did not come up within 2 s: OSError: .*Address already in use"):
            standin_cluster._wait("the server", lambda: standin_cluster._http_ok(f"http://127.0.0.1:{port}/health"),
                                  2, log)

    gone = subprocess.Popen(["false"])
    gone.wait()
    checks: list[None] = []
    with pytest.raises(standin_cluster.UsageError, match=r"the server exited \(status 1\) before it answered: OSError"):
        standin_cluster._wait("the server", lambda: checks.append(None), 60, log, gone)
    assert len(checks) == 1  # it stopped at the first look that found the server gone, not at the 60 s timeout


def test_a_reader_that_stops_early_ends_a_command_quietly(tmp_path):
    """``python -m nre_ray.standin status | head -3`` once ended in a BrokenPipeError traceback. Every command ends
    through :func:`nre_ray.core.console.exit_status`: here a command whose output fills the pipe (more than its 64 KiB
    buffer, so that the write is certain to meet the closed end) into ``head -c 10``."""
    script = ("import sys\nfrom nre_ray.core.console import exit_status\n"
              "sys.exit(exit_status(lambda: print('x' * 200_000) or 0))\n")
    done = subprocess.run(["bash", "-c", f'{sys.executable} -c "$0" 2>{tmp_path}/err | head -c 10; '
                           'echo "${PIPESTATUS[0]}"', script], capture_output=True, text=True, timeout=60)
    assert done.stdout == "x" * 10 + "141\n", done
    assert (tmp_path / "err").read_text() == ""
