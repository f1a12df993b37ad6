"""README.md and docs/*.md cannot go stale: every command block in them runs, against the bundled sample, and the
outputs they show are checked.

How a block is treated, by its language and the HTML comment on the line before it:

- ```bash: run as one script (``bash -euo pipefail``); it must succeed.
- ```console: each ``$ command`` runs (a command may span lines); the lines under it are its documented output, and
  each must be found in a line of the real output, numbers, ids and ``...`` matching anything (so a 2-epoch run
  matches a transcript of 10 epochs, line by line).
- ```python: run by the project's Python, with ``frame`` (a few raw rows of the sample) defined.
- ``<!-- docs-test: parse -->``: the ``python -m nre_ray...`` commands are parsed by their own parsers (every flag
  and choice checked) but not run: long trainings, GPUs, data the test does not have.
- ``<!-- docs-test: skip REASON -->``: not run (AWS, a cluster, the test suite itself); its ``python -m nre_ray...``
  commands are still parsed.
- ``<!-- docs-test: server URL -->``: started in the background and waited for until URL answers; the blocks after it
  use it; stopped at the end of its file.
- ``<!-- docs-test: exit N -->``: a console block whose commands end with status N.

Placeholders are filled in: ``make`` uses this checkout's Makefile and .venv in a temporary folder, ``make train``
stops after 2 epochs without improvement (``--patience 2``), ``<run_id>`` and ``ray_results/my-run/checkpoint_...``
name that run, ports are free ones.
docs/benchmarks.md and docs/results.md are written by the benchmark scripts (hours of runs) and are not run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from nre_ray.data.pipeline import sample_dir
from tests.docs_blocks import DOC_FILES, RUNNABLE, Block, doc_blocks
from tests.procs import env, free_port

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


# --- the run: every block against the sample, in one temporary folder ---------------------------------------------


def number_free(line: str) -> str:
    """A documented output line as a regex: numbers, hex ids and ``...`` match anything; runs of spaces any spaces."""
    parts = re.split(r"(\.\.\.|[0-9a-f]{12,}|\d+(?:\.\d+)?(?:e-?\d+)?| +)", line.strip())
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(re.escape(part))
        elif part == "...":
            out.append(".*")
        elif part.startswith(" "):
            out.append(" +")
        else:
            out.append(r"[-+.\w]+")
    return "".join(out)


def console_steps(body: str) -> list[tuple[str, list[str]]]:
    """``(command, documented output lines)`` of a console block; a command continues while it does not parse."""
    steps: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if steps and lines[i].strip():
                steps[-1][1].append(lines[i])
            i += 1
            continue
        command = lines[i][2:]
        while command.endswith("\\") or not _complete(command):
            i += 1
            command += "\n" + lines[i]
        steps.append((command, []))
        i += 1
    return steps


def _complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


class Session:
    """The folder, environment and placeholders the blocks run with."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.servers: list[subprocess.Popen] = []
        # as a user runs them: the local Ray shared by the commands (the test session's NRE_RAY_OWN_RAY cleared),
        # with a registry of their own (RAY_TMPDIR): the first command starts it, as the README's transcript shows
        self.ray_tmpdir = tempfile.mkdtemp(prefix="nrd-", dir="/tmp")  # short: Ray's sockets live under it
        self.env = env(PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(REPO),
                       NRE_RAY_DOCS_TEST="1", RAY_TMPDIR=self.ray_tmpdir)
        for key in ("MLFLOW_TRACKING_URI", "RAY_API_SERVER_ADDRESS", "VIRTUAL_ENV", "NRE_RAY_OWN_RAY",
                    "NRE_RAY_DASHBOARD"):
            self.env.pop(key, None)
        shutil.copytree(sample_dir(), folder / "sample")
        frame = (folder / "sample" / "test.csv").read_text(encoding="utf-8").splitlines()
        (folder / "new.csv").write_text("\n".join(frame[:41]) + "\n", encoding="utf-8")  # 40 raw rows
        bad_rows(folder / "data")

    def fill(self, text: str) -> str:
        """The block with its placeholders filled in."""
        text = re.sub(r"^make ", "nre_make ", text, flags=re.M).replace("$ make ", "$ nre_make ")
        text = text.replace("nre_make train", "nre_make train ARGS='--patience 2'")
        text = text.replace("/home/me/nre_ray", str(self.folder))  # where the README's transcript was made
        text = re.sub(r"PORT=\d+", f"PORT={self.port}", text)
        text = re.sub(r"nre_make ui(?! PORT)", f"nre_make ui PORT={self.port}", text)
        for port in ("5000", "5001"):
            text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{self.port}").replace(f"-p {port}", f"-p {self.port}")
        text = text.replace("source .venv/bin/activate", f"source {VENV}/bin/activate")
        if "<run_id>" in text or "checkpoint_..." in text:
            run_id, checkpoint = self.trained()
            text = text.replace("<run_id>", run_id).replace("ray_results/my-run/checkpoint_...", checkpoint)
        return text

    def trained(self) -> tuple[str, str]:
        """The run `make train` made: its MLflow run id and its best checkpoint."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{self.folder / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("nre_ray").experiment_id])
        checkpoint = sorted(p for p in (self.folder / "ray_results").glob("*/checkpoint_*") if p.is_dir())[-1]
        return run.info.run_id, str(checkpoint)

    #: ``make`` with this checkout's Makefile and .venv (never reinstalled), in the temporary folder.
    PRELUDE = f'nre_make() {{ command make -f "{REPO}/Makefile" -o "{VENV}/.installed" VENV="{VENV}" "$@"; }}\n'

    def shell(self, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", self.PRELUDE + script], cwd=self.folder,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_server(self, script: str, url: str) -> None:
        proc = subprocess.Popen(["bash", "-c", self.PRELUDE + script], cwd=self.folder, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.servers.append(proc)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the server of {script!r} exited with {proc.returncode}"
            try:
                if requests.get(url, timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise AssertionError(f"{url} did not answer within 300 s")

    def stop_servers(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.servers.clear()


def bad_rows(folder: Path) -> None:
    """``data/``: the sample with the three bad rows docs/data.md shows (train.csv:202 and :203, valid.csv:42)."""
    shutil.copytree(sample_dir(), folder)
    train = (folder / "train.csv").read_text(encoding="utf-8").split("\n")
    train[201] = "train-00200,Ann met Bob in Paris.,Ann,1,Bob,8,spouse_of,person,person"
    train[202] = "train-00201,Ann met Bob.,Ann,0,Bob"
    (folder / "train.csv").write_text("\n".join(train), encoding="utf-8")
    valid = (folder / "valid.csv").read_text(encoding="utf-8").split("\n")
    valid[41] = valid[41].replace(",headquartered_in,", ",likes,")
    (folder / "valid.csv").write_text("\n".join(valid), encoding="utf-8")


def run_block(session: Session, block: Block) -> None:
    if block.lang == "python":
        script = session.fill(block.body)
        prelude = f"import pandas as pd\nframe = pd.read_csv({str(session.folder / 'new.csv')!r})\n"
        (session.folder / "block.py").write_text(prelude + script, encoding="utf-8")
        done = session.shell("python block.py")
        assert done.returncode == 0, f"{block}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return
    if block.kind == "server":
        session.start_server(session.fill(block.body), session.fill(block.arg))
        return
    if block.lang == "bash":
        done = session.shell(session.fill(block.body))
        assert done.returncode == 0, f"{block}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return
    expected_status = int(block.arg) if block.kind == "exit" else 0
    for command, documented in console_steps(block.body):
        done = session.shell(session.fill(command))
        out = done.stdout + done.stderr
        assert done.returncode == expected_status, f"{block}: $ {command}\nexit {done.returncode}:\n{out[-4000:]}"
        actual = [" ".join(line.split()) for line in out.splitlines()]
        for line in documented:
            pattern = re.compile(number_free(session.fill(line)))
            assert any(pattern.search(got) for got in actual), \
                f"{block}: $ {command}\ndocumented line not in the output: {line!r}\noutput:\n{out[-4000:]}"


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_every_command_block_runs_and_shows_what_it_prints(tmp_path):
    session = Session(tmp_path)
    ran, timings = 0, []
    try:
        for path in DOC_FILES:
            try:
                for block in doc_blocks(path):
                    if block.lang not in RUNNABLE or block.kind in ("skip", "parse"):
                        continue
                    started = time.monotonic()
                    run_block(session, block)
                    timings.append(f"{time.monotonic() - started:6.1f} s  {block}")
                    ran += 1
            finally:
                session.stop_servers()
    finally:
        session.stop_servers()
        shutil.rmtree(session.ray_tmpdir, ignore_errors=True)
        print("\n".join(["seconds per block:", *timings]))  # shown with -s, or on a failure
    assert ran >= 10
