"""docs/cluster.md cannot go stale: the commands of its rehearsal section ("### 0. Rehearse on this machine first")
run as written, in one shell, against the stand-in they start. The only changes: free ports for ``up`` and a
temporary ``--dir`` (the defaults may be taken on a test machine).

It starts a stand-in of its own, not the session's (tests/standin_session.py): ``standin up`` and ``down`` as the
section has them are part of what it checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nre_ray.cluster import standin_cluster as standin
from tests.procs import alive, env, free_port, with_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "cluster.md"
SECTION = "### 0. Rehearse on this machine first"


def rehearsal_commands(text: str) -> list[str]:
    """The ```bash blocks of the rehearsal section, in order."""
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))
    return re.findall(r"```bash\n(.*?)```", text[start:end], flags=re.S)


def test_the_rehearsal_section_has_the_commands_a_user_runs():
    blocks = rehearsal_commands(DOC.read_text())
    script = "\n".join(blocks)
    for needed in ("python -m nre_ray.standin up", "source .standin/env.sh",
                   "ray job submit --submission-id rehearsal-1 --working-dir .",
                   "s3://$BUCKET/nre_ray/checkpoints", "--tracking-uri $TRACKING_URI",
                   "python -m nre_ray.standin down"):
        assert needed in script, needed


def test_the_rehearsal_commands_run_as_written(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="nrd_", dir="/tmp"))
    s3_port = free_port()
    ports = f"--s3-port {s3_port} --gcs-port {free_port()} --dashboard-port {free_port()} " \
            f"--mlflow-port {free_port()}"
    script = "\n".join(rehearsal_commands(DOC.read_text()))
    script = re.sub(r"python -m nre_ray\.standin up(?=\s)", f"python -m nre_ray.standin up {ports}", script)
    script = script.replace("python -m nre_ray.standin", f"python -m nre_ray.standin --dir {folder}")
    script = script.replace("source .standin/env.sh", f"source {folder}/env.sh")
    shell_env = env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for key in ("RAY_API_SERVER_ADDRESS", "AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI"):  # as in a fresh shell
        shell_env.pop(key, None)
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=shell_env,
                              capture_output=True, text=True, timeout=400)
    finally:
        if (folder / standin.STATE_FILE).exists():  # the script stopped before its `down`
            standin.down(folder)
    out = done.stdout + done.stderr
    (tmp_path / "rehearsal.log").write_text(out)
    assert done.returncode == 0, out[-4000:]
    assert "Adding 1 node(s) of type cpu_worker" in out and "succeeded" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # Ray's CLI colours its lines
    assert plain.count("Job 'rehearsal-1' succeeded") == 2, plain[-3000:]  # `ray job submit`, then `ray job status`
    assert plain.count("look at it: open http://127.0.0.1:") == 2  # the summary, streamed then from `ray job logs`
    assert re.search(r"head \+ [1-9] autoscaled worker node", out), out[-2000:]  # `status` after the job
    assert "stopped" in out and "processes of the stand-in" in out  # `down`
    # Nothing of this stand-in is left: every process of it has its object store's endpoint in its environment (the
    # session's stand-in may run beside it: tests/standin_session.py)
    endpoint = f"http://127.0.0.1:{s3_port}"
    assert not [p for p in with_env("AWS_ENDPOINT_URL", endpoint) if alive(p)]
