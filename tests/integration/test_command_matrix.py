"""Every command on the stand-in (issue 24): {train, tune, evaluate, predict, ``data inspect``} x {local path,
``s3://`` URI} x {no address, ``RAY_ADDRESS`` as the stand-in's ``env.sh`` writes it, ``--address HOST:PORT``}.

Each cell is one test. A cell either works (what that means is checked per command: a FINISHED run with test scores
on the stand-in's MLflow server, a scores file, a labelled file, an audit) or exits 2 with a single ``error: ...``
line on stderr; never a traceback, never another exit status. Where a refusal is allowed:

- ``RAY_ADDRESS=http://...`` (the dashboard, which ``ray job`` needs): the command works, or says in one line what to
  do instead (``ray job submit`` or ``--address HOST:PORT``);
- local paths on the cluster (``RAY_ADDRESS`` or ``--address``): the stand-in's nodes share this disk, a cloud
  cluster's do not, so a command may refuse a local path there in one line (train and tune refuse a local
  ``--storage-path`` on a cluster that can grow, as docs/cluster.md says).

With no address, and with ``s3://`` paths joined by ``--address`` (the path docs/cluster.md documents), every command
must work. "No address" is a user who exported the object store's variables but did not source ``env.sh``: the local
Ray that a user's commands share, kept warm for the cells (tests/session_ray.py). ``--address`` is the stand-in's GCS
address, which ``standin status`` prints.

The paths of a cell: the data (``--data-dir``, ``--data``, ``--input``), the checkpoints (``--storage-path``), the
model (a checkpoint folder or an ``s3://`` checkpoint) and the output (``--output``, ``--json``). ``--summary-json``
and ``--search-space`` stay local: they are this test's record and fixture, not the subject.

Cost (about 8 minutes on 2 cores): the session's stand-in (tests/standin_session.py, shared with
tests/integration/test_standin.py, which runs ``standin down`` and ``up`` as a user types them) for every cell, the
data uploaded to it with ``python -m nre_ray.standin upload``; a few hundred rows of the bundled sample, on this
disk and in the bucket; one epoch, one worker, a tiny CNN, a sweep of one trial. The commands run in two lanes at
once, each in order (:attr:`Cell.lane`); a test waits for its own cell's command and checks it. evaluate and
predict use the checkpoints of ``train-local-none`` and ``train-s3-none``. predict always takes the Ray path
(``--local-max-rows 0``) and ``data inspect`` always preprocesses (``--no-cache``): otherwise neither would start or
join Ray, and the address would not matter.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from nre_ray.cluster import standin_cluster as standin
from nre_ray.cluster.processes import cmdline
from tests import session_ray
from tests.procs import RAY_ENV, environ, kill_all, stop_tree, with_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "nre_ray" / "data" / "sample"
#: Rows of each split taken from the sample (every k-th row, so that every label is in each).
ROWS = {"train": 300, "valid": 60, "test": 60}
#: The smallest run: one epoch, one worker, a tiny CNN on short sentences, no model logged (a checkpoint suffices).
TINY = ["--epochs", "1", "--num-workers", "1", "--model", "cnn", "--word-dim", "16", "--pos-dim", "4",
        "--hidden-size", "16", "--max-length", "48", "--batch-size", "64", "--keep-checkpoints", "1",
        "--no-log-model"]
#: tune's cheapest sweep: one one-epoch trial, small enough for the stand-in's head (1 CPU) with its trial driver, so
#: that no autoscaled node is started for it (test_standin covers that).
SPACE = "[train]\nlr = { choice = [3e-3, 1e-3] }\n"
TUNE = ["--num-samples", "1", "--max-concurrent-trials", "1", "--cpus-per-worker", "0.5"]
COMMANDS = ("train", "tune", "evaluate", "predict", "inspect")
PATHS = ("local", "s3")
ADDRESSES = ("none", "env", "flag")
#: Variables a fresh shell does not have (the test session's own Ray, object store and MLflow settings).
SESSION_ONLY = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_PROFILE",
                "AWS_SESSION_TOKEN")
CELL_TIMEOUT_S = 420


@dataclass(frozen=True)
class Cell:
    """One command, with its paths on this disk or in the bucket, and one way of naming the cluster."""

    command: str
    path: str  # local | s3
    address: str  # none | env | flag

    @property
    def name(self) -> str:
        return f"{self.command}-{self.path}-{self.address}"

    @property
    def must_work(self) -> bool:
        """No address, or the documented cluster path (``s3://`` and ``--address``): no refusal is acceptable."""
        return self.address == "none" or (self.path == "s3" and self.address == "flag")

    @property
    def lane(self) -> str:
        """Cells of one lane run one after the other, the two lanes at once: ``private`` (the cells on a local
        Ray), ``standin`` (jobs on the stand-in, one at a time: its head has one CPU). train and tune
        with local paths stop at their checks on the stand-in (a local ``--storage-path`` on a cluster that can
        grow), before any job: they go in the private lane, which has less to do."""
        if self.address == "none" or (self.command in ("train", "tune") and self.path == "local"):
            return "private"
        return "standin"


#: In order: train first (evaluate and predict use its checkpoints), then the others.
CELLS = [Cell(c, p, a) for c in COMMANDS for p in PATHS for a in ADDRESSES]
#: The cell whose checkpoint evaluate and predict use, per kind of path.
MODEL_FROM = {path: Cell("train", path, "none") for path in PATHS}


@dataclass
class Matrix:
    """The running stand-in and the places every cell shares."""

    state: standin.Standin
    folder: Path  # the stand-in's --dir (env.sh, standin.json)
    work: Path  # the local data (work/data), each lane's working directory, each local cell's outputs
    env: dict[str, str]  # every cell's shell (:func:`shell_env`), sharing one local Ray (tests/session_ray.py)

    def data(self, path: str) -> str:
        return str(self.work / "data") if path == "local" else f"s3://{self.state.bucket}/matrix/data"

    def out(self, cell: Cell) -> str:
        """The cell's own folder for what it writes, on this disk or in the bucket."""
        if cell.path == "local":
            (self.work / cell.name).mkdir(exist_ok=True)
            return str(self.work / cell.name)
        return f"s3://{self.state.bucket}/matrix/{cell.name}"

    def summary(self, cell: Cell) -> Path:
        return self.work / f"{cell.name}.summary.json"

    def read(self, uri: str) -> bytes:
        """A file a command wrote: a local path or an s3:// URI in the stand-in's bucket."""
        if uri.startswith("s3://"):
            with self.state.filesystem().open_input_stream(uri[len("s3://"):]) as stream:
                return stream.read()
        return Path(uri).read_bytes()


def shell_env(state: standin.Standin | None) -> dict[str, str]:
    """A fresh shell's environment with this checkout importable, Ray quiet, and (``state``) the object store's
    endpoint and keys exported, as a user of the bucket has them; no Ray address, no tracking URI."""
    out = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    out.update({k: v for k, v in RAY_ENV.items() if k != "RAY_API_SERVER_ADDRESS"})
    out["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if state is not None:  # and the stand-in's credentials, as docs/cluster.md has a user export them
        out.update({"AWS_ENDPOINT_URL": state.endpoint, **state.store_credentials(), **state.credentials()})
    return out


def standin_cli(folder: Path, *args: str, cwd: Path) -> None:
    """``python -m nre_ray.standin --dir FOLDER ARGS`` as a user types it (output to a file: the stand-in's daemons
    must not hold a pipe of this process open)."""
    with tempfile.TemporaryFile() as log:
        done = subprocess.run([sys.executable, "-m", "nre_ray.standin", "--dir", str(folder), *args], cwd=cwd,
                              env=shell_env(None), stdout=log, stderr=subprocess.STDOUT, timeout=300)
        log.seek(0)
        text = log.read().decode(errors="replace")
    assert done.returncode == 0, f"standin {' '.join(args)}: exit {done.returncode}\n{text[-3000:]}"


@pytest.fixture(scope="module")
def matrix(standin_cluster):
    """The session's stand-in (tests/standin_session.py) for every cell, and the tiny data set on this disk and in
    its bucket (uploaded with ``standin upload``). At the end, no process of a cell is left: none that has the
    store's endpoint in its environment (as every cell's command has) and is not the stand-in's."""
    state = standin_cluster.state
    base = Path(tempfile.mkdtemp(prefix="nrm_", dir="/tmp"))
    work = base / "work"
    (work / "data").mkdir(parents=True)
    for split, rows in ROWS.items():
        frame = pd.read_csv(SAMPLE / f"{split}.csv")
        frame.iloc[:: len(frame) // rows].head(rows).to_csv(work / "data" / f"{split}.csv", index=False)
    (work / "data" / "relation.txt").write_bytes((SAMPLE / "relation.txt").read_bytes())
    (work / "space.toml").write_text(SPACE, encoding="utf-8")
    folder = Path(state.folder)
    try:
        with environ(state.mlflow_login()), session_ray.kept(shell_env(state), "m") as cells_env:
            standin_cli(folder, "upload", str(work / "data"), f"s3://{state.bucket}/matrix/data", cwd=work)
            yield Matrix(state, folder, work, cells_env)
    finally:
        left = _cells_left(state)
        deadline = time.monotonic() + 15  # (a command's own Ray may still be on its way out)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _cells_left(state)
        kill_all(left)
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the cells left behind: {left}"


def _cells_left(state: standin.Standin) -> dict[int, str]:
    """Processes with the store's endpoint in their environment that are not the stand-in's."""
    own = {p.pid for p in standin.own_processes(state)}
    return {pid: cmdline(pid) for pid in with_env("AWS_ENDPOINT_URL", state.endpoint) if pid not in own}


@dataclass
class Ran:
    """A cell's command and what it did."""

    argv: list[str]
    files: dict[str, str]  # what it writes, by role (summary, scores, labelled, audit)
    returncode: int = -1
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    def transcript(self, name: str) -> str:
        return (f"$ {shlex.join(self.argv)}\n[{name}: exit {self.returncode} after {self.seconds:.1f} s]\n"
                f"{self.stdout}\n{self.stderr}")


@dataclass
class Runner:
    """Runs the cells' commands in two lanes at once (threads), each lane in the order of :data:`CELLS`."""

    matrix: Matrix
    cells: list[Cell]
    results: dict[Cell, Future] = field(default_factory=dict)
    running: dict[str, subprocess.Popen] = field(default_factory=dict)  # lane -> its command now
    stopping: bool = False

    def start(self) -> list[threading.Thread]:
        self.results = {cell: Future() for cell in self.cells}
        lanes = [[c for c in CELLS if c in self.results and c.lane == lane] for lane in ("private", "standin")]
        threads = [threading.Thread(target=self._lane, args=(cells,), daemon=True) for cells in lanes if cells]
        for thread in threads:
            thread.start()
        return threads

    def stop(self) -> None:
        """Skip the cells not started yet, and stop the commands still running (with their process trees)."""
        self.stopping = True
        for proc in list(self.running.values()):
            stop_tree(proc)

    def _lane(self, cells: list[Cell]) -> None:
        for cell in cells:
            if self.stopping:
                self.results[cell].set_exception(RuntimeError("not run: the module's tests were stopped"))
                continue
            try:
                self.results[cell].set_result(self._run(cell))
            except Exception as err:  # told to the cell's test
                self.results[cell].set_exception(err)

    def result(self, cell: Cell) -> Ran:
        return self.results[cell].result(timeout=900)

    def model(self, path: str) -> str:
        """The checkpoint evaluate and predict use for ``path`` cells (a local folder, an s3:// URI)."""
        source = MODEL_FROM[path]
        ran = self.result(source)
        if ran.returncode != 0:
            raise RuntimeError(f"no {path} model to use: {source.name} exited {ran.returncode}")
        return json.loads(Path(ran.files["summary"]).read_text())["best_checkpoint"]

    def command(self, cell: Cell) -> Ran:
        """The cell's command line (``python -m ...``) and the files it writes."""
        m = self.matrix
        data, out = m.data(cell.path), m.out(cell)
        # An experiment per lane: the first runs of two lanes would otherwise create the same experiment at the
        # same moment, and one of them fail on it (RESOURCE_ALREADY_EXISTS), which is not this test's subject.
        run = ["--tracking-uri", m.state.tracking_uri, "--experiment-name", f"matrix-{cell.lane}",
               "--run-name", f"matrix-{cell.name}", "--storage-path", f"{out}/ray_results",
               "--summary-json", str(m.summary(cell))]
        files = {"summary": str(m.summary(cell))}
        if cell.command == "train":
            args = ["nre_ray.train", "--data-dir", data, *TINY, *run]
        elif cell.command == "tune":
            args = ["nre_ray.tune", "--data-dir", data, *TINY, *TUNE, "--search-space", str(m.work / "space.toml"),
                    *run]
        elif cell.command == "evaluate":
            files["scores"] = f"{out}/scores.json"
            args = ["nre_ray.evaluate", "--model", self.model(cell.path), "--data", f"{data}/test.csv",
                    "--num-workers", "1", "--output", files["scores"]]
        elif cell.command == "predict":
            files["labelled"] = f"{out}/labelled.csv"
            args = ["nre_ray.predict", "--model", self.model(cell.path), "--input", f"{data}/test.csv",
                    "--output", files["labelled"], "--num-workers", "1", "--local-max-rows", "0", "--no-progress"]
        else:
            files["audit"] = f"{out}/audit.json"
            args = ["nre_ray.data", "inspect", "--data-dir", data, "--no-cache", "--json", files["audit"]]
            if cell.path == "s3" and cell.address != "none":  # on the cluster its preprocessing builds in the
                args += ["--storage-path", f"{out}/ray_results"]  # store: the head has no CPU (docs/cluster.md)
        if cell.address == "flag":
            args += ["--address", m.state.gcs_address]
        if cell.address == "env":  # the file `standin up` wrote, sourced as docs/cluster.md says
            argv = ["bash", "-c", f'source {m.folder / "env.sh"} && exec "$0" -m "$@"', sys.executable, *args]
        else:
            argv = [sys.executable, "-m", *args]
        return Ran(argv, files)

    def _run(self, cell: Cell) -> Ran:
        """Run the cell's command in a fresh shell, in its lane's working directory (each lane its own cache)."""
        ran = self.command(cell)
        cwd = self.matrix.work / cell.lane
        cwd.mkdir(exist_ok=True)
        started = time.monotonic()
        proc = subprocess.Popen(ran.argv, cwd=cwd, env=self.matrix.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.running[cell.lane] = proc
        try:
            ran.stdout, ran.stderr = proc.communicate(timeout=CELL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            ran.stdout, ran.stderr = proc.communicate()
            ran.stderr += f"\n[stopped after {CELL_TIMEOUT_S} s]"
        finally:
            self.running.pop(cell.lane, None)
        ran.returncode, ran.seconds = proc.returncode, time.monotonic() - started
        return ran


@pytest.fixture(scope="module")
def runner(matrix, request):
    """Starts the commands of the cells this session runs (and of the train cells that give their models)."""
    here = [item.callspec.params["cell"] for item in request.session.items
            if item.module.__name__ == __name__ and hasattr(item, "callspec")]
    needed = set(here) | {MODEL_FROM[c.path] for c in here if c.command in ("evaluate", "predict")}
    run = Runner(matrix, [c for c in CELLS if c in needed])
    threads = run.start()
    yield run
    run.stop()
    for thread in threads:
        thread.join(timeout=60)


def check_contract(cell: Cell, ran: Ran) -> bool:
    """True if the command says it worked (exit 0); else it must have refused in one line (exit 2), where the cell
    allows that. Never a traceback."""
    said = f"[{cell.name}] exit {ran.returncode}; stderr ends:\n{ran.stderr[-1500:]}"
    if "Traceback" in ran.stdout + ran.stderr:
        pytest.fail(f"a traceback: {said}")
    if ran.returncode == 0:
        return True
    if ran.returncode != 2:
        pytest.fail(f"neither 0 nor 2: {said}")
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if len(errors) != 1 or lines[-1] != errors[0]:
        pytest.fail(f"not one error line: {said}")
    if cell.must_work:
        pytest.fail(f"refused, but this cell must work: {said}")
    if cell.address == "env" and cell.path == "s3" and "ray job submit" not in errors[0] \
            and "--address" not in errors[0]:  # the dashboard address is the one thing a user may have wrong here
        pytest.fail(f"refused without saying what to do instead (`ray job submit` or --address): {said}")
    return False


def check_works(matrix: Matrix, cell: Cell, ran: Ran) -> None:
    """What each command leaves when it works."""
    said = f"[{cell.name}] stdout ends:\n{ran.stdout[-2000:]}"
    if cell.command in ("train", "tune"):
        summary = json.loads(Path(ran.files["summary"]).read_text())
        client = MlflowClient(matrix.state.tracking_uri)
        run = client.get_run(summary["run_id"])
        assert run.info.status == "FINISHED" and "test/macro_f1" in run.data.metrics, said
        assert summary["test"]["macro_f1"] == pytest.approx(run.data.metrics["test/macro_f1"])
        checkpoint = summary["best_checkpoint"]
        assert checkpoint.startswith("s3://" if cell.path == "s3" else matrix.out(cell)), checkpoint
        if cell.command == "tune":  # the sweep's parent run, with its trial's run below it
            children = client.search_runs([run.info.experiment_id],
                                          f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
            assert [r.info.status for r in children] == ["FINISHED"], said
            # the final test names the checkpoint the sweep chose (s3://...), not the local copy it scores
            assert f"model: loading {summary['best_checkpoint']}\n" in ran.stdout, said
    elif cell.command == "evaluate":
        scores = json.loads(matrix.read(ran.files["scores"]))
        # The same checkpoint on the same test file: exactly what its training run reported for test.
        trained = json.loads(matrix.summary(MODEL_FROM[cell.path]).read_text())["test"]
        assert scores["rows"] == ROWS["test"], scores
        assert {k: scores["metrics"][k] for k in ("accuracy", "macro_f1")} == \
            pytest.approx({k: trained[k] for k in ("accuracy", "macro_f1")}, abs=1e-9), (scores, trained)
        assert "accuracy" in ran.stdout, said
    elif cell.command == "predict":
        labelled = pd.read_csv(io.BytesIO(matrix.read(ran.files["labelled"])))
        assert len(labelled) == ROWS["test"] and labelled["predicted_relation"].notna().all(), said
        assert f"predicted {ROWS['test']} rows" in ran.stdout, said
    else:
        audit = json.loads(matrix.read(ran.files["audit"]))
        assert {split: s["rows"] for split, s in audit["splits"].items()} == ROWS, audit["splits"]
        assert f"| train | {ROWS['train']} |" in ran.stdout, said  # the audit's table of rows


@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_cell(runner, cell):
    ran = runner.result(cell)
    print(ran.transcript(cell.name))  # shown by pytest for a failed cell (and with -rA for every cell)
    if check_contract(cell, ran):
        check_works(runner.matrix, cell, ran)
