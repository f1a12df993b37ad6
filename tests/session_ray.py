"""A shared local Ray kept warm for a test that runs many commands: what a user's commands on one machine share
(:mod:`nre_ray.cluster.shared_ray`).

A user's commands given no Ray address join the local Ray that nre_ray commands of this user share, and its host
stops it when the last of them ends. Tests start their commands one after the other, so without help each would
find the Ray just stopped and start it again (4-6 s quiet, 10-25 s on a loaded 2-core machine). An *anchor*
(``python -m tests.session_ray``) is a command that registers with the shared Ray and then only waits: while it runs,
the host keeps the Ray, and every command started with the same environment joins it.

:func:`kept` does this for one environment: a Ray temporary folder of its own (``RAY_TMPDIR``: its own registry, so
that Ray never meets a user's or another test's), the anchor, and at the end the anchor stopped, the host's Ray gone
(checked: no process with that ``RAY_TMPDIR`` is left) and the folder removed. The command matrix's cells with no
address use it (tests/integration/test_command_matrix.py): ten commands on one warm Ray, as a user's would be.

Tried and not kept: one such Ray for every command of the session (through tests/procs.env()). Few tests start
commands that need a local Ray as subprocesses (the rest use the session's ``ray_cluster`` in process), and an idle
local Ray costs about 5% of a core (21 processes) for the whole session: about what the starts it spares save. The
one CI-style run with it took 1744 s of tests against 1611 s before (with other work beside it: not a clean
figure, but no saving either).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from nre_ray.cluster import processes, shared_ray

#: How long the end waits for the host's Ray to stop once its last command (the anchor) has ended.
STOP_WAIT_S = 60.0


def _short_folder(tag: str) -> Path:
    """A new folder for ``RAY_TMPDIR`` with a short path: Ray's unix sockets live under it (at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=f"nr{tag}-", dir="/tmp"))


def anchor(env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the anchor with ``env`` (its Ray temporary folder, no NRE_RAY_OWN_RAY); it joins the shared Ray, or
    starts it, and waits while this process runs."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tests.session_ray", str(os.getpid())], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=env["RAY_TMPDIR"])


def stop(proc: subprocess.Popen, ray_tmpdir: str, remove: bool = True) -> list[str]:
    """Stop the anchor ``proc``; once no command uses the shared Ray of ``ray_tmpdir`` any more, wait for its host to
    stop it and remove the folder (``remove``). Returns what was left and had to be killed (empty when all is
    well); while another process's commands still use the Ray, nothing is waited for."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    record = Path(ray_tmpdir) / f"nre_ray-{os.getuid()}" / "local-ray" / "record.json"
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        others = _still_used(record)
        if others:
            return []  # another test process's commands (its anchor) still use it: the last one cleans up
        if not record.exists() and not _with_tmpdir(ray_tmpdir):
            break
        time.sleep(0.5)
    left = {pid: processes.cmdline(pid) for pid in _with_tmpdir(ray_tmpdir)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if remove:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
    return [f"{pid} {line[:120]}" for pid, line in left.items()]


def _still_used(record: Path) -> bool:
    """Whether the record names a command other than a stopped one that still runs."""
    import json

    try:
        runs = json.loads(record.read_text()).get("runs", [])
    except (OSError, ValueError):
        return False
    return any(shared_ray.running(r) for r in runs)


def _with_tmpdir(ray_tmpdir: str) -> list[int]:
    from tests.procs import with_env

    return with_env("RAY_TMPDIR", ray_tmpdir)


@contextlib.contextmanager
def kept(env: dict[str, str], tag: str = "k") -> Iterator[dict[str, str]]:
    """``env`` for commands that share one warm local Ray while the block runs: a ``RAY_TMPDIR`` of its own, the
    session's opt-out (NRE_RAY_OWN_RAY) cleared, an anchor holding the Ray. At the end nothing of that Ray is left
    (an assertion lists what had to be killed)."""
    folder = _short_folder(tag)
    shared = {**{k: v for k, v in env.items() if k != shared_ray.OWN_RAY_ENV}, "RAY_TMPDIR": str(folder)}
    proc = anchor(shared, folder / "anchor.log")
    try:
        yield shared
    finally:
        left = stop(proc, str(folder))
        assert not left, f"processes of the shared local Ray left behind: {left}"


def main(parent: int) -> int:
    """``python -m tests.session_ray PARENT``: join (or start) the shared local Ray as a command does, then wait until
    SIGTERM or until ``PARENT`` (the test process) has ended."""
    from nre_ray.cluster.session import start_ray

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    start_ray(None)
    while processes.alive(parent):
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
