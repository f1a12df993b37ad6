"""What a person sees while a command runs: each phase as it starts and ends, progress, and the epoch table.

One :class:`Console` per process (:func:`get`). A phase prints one line when it starts and one when it ends, each
with the seconds since the command started, the same on a terminal and in a log file; on a terminal a tqdm bar
below shows the phase's progress (or just its running time) in between, and in a log file a progress line is
printed at most every :data:`FILE_PROGRESS_EVERY_S` seconds instead. No colour codes, no carriage returns in a
file. Nothing here imports Ray or torch.

Any driver-side code (the preprocessing pipeline included) reports through it::

    from nre_ray.core import console

    with console.phase("preprocess", "reading and checking 3 files") as step:
        bar = step.progress(total=rows, unit="rows")  # a tqdm bar on a terminal, a line every ~10 s in a file
        for chunk in chunks:
            ...
            bar.update(len(chunk))
        step.note("nothing cached yet for these inputs")  # a line of its own, inside the phase
        step.done("train 3000, valid 500, test 500 rows")  # what the end line says (default: "done")

Code deep inside a command reports into the phase its caller opened, without being handed it::

    step = console.current_phase()  # e.g. the "preprocess" phase train.py opens around prepare(); a silent
    bar = step.progress(total=rows, unit="rows")  # stand-in when no phase runs (a library call, a test)

The training workers run elsewhere: the Ray Train controller (on the driver's node) appends their events (workers
up, training started, each epoch's metrics) as JSON lines to a file (:func:`append_event`), and the driver follows
that file (:class:`EventFollower`) and prints them here (:class:`TrainingView`), so epoch lines come from the
driver, not as ``(RayTrainWorker pid=...)`` lines from a worker's stdout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

#: In a log file (not a terminal), a running phase's progress line at most this often.
FILE_PROGRESS_EVERY_S = 10.0
#: On a terminal, how often a phase's bar is redrawn while nothing else moves it (its running time ticks).
TICK_S = 0.5
#: The epoch metric that is > 0 when the epoch improved the selection metric (``nre_ray.run.loop.SELECTION_RANK``;
#: kept here so that the console does not import torch; tests/unit/test_console.py checks that the two agree).
IMPROVED_KEY = "selection_rank"
#: A worker report that carries only lines for the console (rank 0's list of strings:
#: ``nre_ray.run.loop.tell_console``).
NOTES_KEY = "notes"
#: How rank 0's note on a worker group that starts from a checkpoint begins: ``resuming after epoch 3 from PATH``.
RESUME_NOTE = "resuming after epoch"


class Progress:
    """Progress inside a phase: a tqdm bar on a terminal; in a file, a line at most every FILE_PROGRESS_EVERY_S."""

    def __init__(self, console: Console, name: str, total: float | None, unit: str, bar: Any) -> None:
        self._console, self._name, self.total, self.unit, self._bar = console, name, total, unit, bar
        self.count: float = 0
        self._printed = time.monotonic()
        self._shown: float | None = None  # the count of the last progress line printed (in a file)

    def update(self, n: float = 1) -> None:
        """Count ``n`` more units done."""
        self.count += n
        if self._bar is not None:
            with self._console.lock:
                self._bar.update(n)
        elif time.monotonic() - self._printed >= FILE_PROGRESS_EVERY_S:
            self._printed = time.monotonic()
            self._shown = self.count
            self._console.line(f"{self._name}: {self.describe()}" + ("" if self.total else " so far"))

    def finish(self) -> None:
        """In a file, the final count once a progress line has shown a count short of it (a phase that printed
        ``500 rows read so far`` ends with ``15917 rows read``); nothing on a terminal, where the bar showed it."""
        if self._bar is None and self._shown is not None and self._shown != self.count:
            self._shown = self.count
            self._console.line(f"{self._name}: {self.describe()}")

    def set_total(self, total: float | None) -> None:
        """The total became known (or changed)."""
        self.total = total
        if self._bar is not None:
            with self._console.lock:
                self._bar.total = total
                self._bar.refresh()

    def describe(self) -> str:
        """``1500/3000 rows (50%)``, or ``1500 rows`` without a total."""
        done = f"{self.count:g}"
        if not self.total:
            return f"{done} {self.unit}"
        return f"{done}/{self.total:g} {self.unit} ({100 * self.count / self.total:.0f}%)"


class Phase:
    """A step of the command between its start line and its end line; see the module docstring."""

    def __init__(self, console: Console, name: str, doing: str) -> None:
        self.console, self.name, self.doing = console, name, doing
        self.started = time.monotonic()
        self.summary: str | None = None
        self.ended = False
        self._bar: Any = None
        self._progress: Progress | None = None
        console.running.append(self)
        console.line(f"{name}: {doing}")
        if console.tty:
            self._bar = console.make_bar(name, None, "s", elapsed_only=True)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def progress(self, total: float | None = None, unit: str = "it") -> Progress:
        """A progress counter for this phase (one at a time: a second call replaces the first)."""
        if self._progress is not None:
            self._progress.finish()
        if self.console.tty:
            self.console.close_bar(self._bar)
            self._bar = self.console.make_bar(self.name, total, unit)
        self._progress = Progress(self.console, self.name, total, unit, self._bar)
        return self._progress

    def note(self, text: str) -> None:
        """Print a line inside the phase (above its bar on a terminal)."""
        self.console.line(f"{self.name}: {text}")

    def done(self, summary: str) -> None:
        """What the end line says instead of ``done``."""
        self.summary = summary

    def end(self, summary: str | None = None, failed: bool = False) -> None:
        """Close the bar and print the end line (once)."""
        if self.ended:
            return
        self.ended = True
        if self in self.console.running:
            self.console.running.remove(self)
        self.console.close_bar(self._bar)
        self._bar = None
        if self._progress is not None and not failed:
            self._progress.finish()
        if failed:
            self.console.line(f"{self.name}: stopped after {self.seconds:.1f} s")
        else:
            self.console.line(f"{self.name}: {summary or self.summary or 'done'} ({self.seconds:.1f} s)")


class Console:
    """Where a command's own lines go (default: stdout), with the time since ``started`` on each phase line."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None, started: float | None = None) -> None:
        self._stream = stream  # None: whatever sys.stdout is when a line is written (it may be replaced meanwhile)
        self.tty = _isatty(self.stream) if tty is None else tty
        self.started = started if started is not None else time.time()
        self.lock = threading.RLock()
        self.running: list[Phase] = []  # phases started and not ended yet, innermost last
        self._bars: list[Any] = []
        self._ticker: threading.Thread | None = None

    @property
    def stream(self) -> TextIO:
        """The stream lines go to: the one given, or the current ``sys.stdout``."""
        return self._stream if self._stream is not None else sys.stdout

    def stamp(self) -> str:
        return f"[{time.time() - self.started:6.1f}s]"

    def line(self, text: str, stamp: bool = True) -> None:
        """Print a line (above any bar on a terminal)."""
        text = f"{self.stamp()} {text}" if stamp else text
        with self.lock:
            if self._bars:
                from tqdm import tqdm

                tqdm.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)

    @contextlib.contextmanager
    def phase(self, name: str, doing: str) -> Iterator[Phase]:
        """A phase as a ``with`` block; an exception ends it with ``stopped after N s`` and goes on."""
        step = Phase(self, name, doing)
        try:
            yield step
        except BaseException:
            step.end(failed=True)
            raise
        step.end()

    def make_bar(self, name: str, total: float | None, unit: str, elapsed_only: bool = False) -> Any:
        """A tqdm bar on this console's stream (terminal only); redrawn every TICK_S by one ticker thread."""
        from tqdm import tqdm

        fmt = "{desc}: {elapsed}" if elapsed_only else None
        # A terminal that reports no width (a pty without a size, as under `script`) would get empty bars
        size = shutil.get_terminal_size((0, 0))
        sized = size.columns >= 20 and size.lines >= 2
        with self.lock:
            bar = tqdm(total=total, unit=unit, desc=name, file=self.stream, leave=False, dynamic_ncols=sized,
                       ncols=None if sized else 100, nrows=None if sized else 24, bar_format=fmt,
                       mininterval=TICK_S)
            self._bars.append(bar)
            if self._ticker is None or not self._ticker.is_alive():
                self._ticker = threading.Thread(target=self._tick, name="nre_ray-console", daemon=True)
                self._ticker.start()
        return bar

    def close_bar(self, bar: Any) -> None:
        if bar is None:
            return
        with self.lock:
            if bar in self._bars:
                self._bars.remove(bar)
            bar.close()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self.lock:
                if not self._bars:
                    return
                for bar in self._bars:
                    bar.refresh()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


_current: Console | None = None


def get() -> Console:
    """This process's console (stdout until :func:`use` sets another)."""
    global _current
    if _current is None:
        _current = Console()
    return _current


def use(console: Console) -> Console:
    """Make ``console`` the one :func:`get` returns (a command's entry point, or a test); returns it."""
    global _current
    _current = console
    return console


def phase(name: str, doing: str) -> contextlib.AbstractContextManager[Phase]:
    """``with console.phase("preprocess", "reading 3 files") as step:`` on this process's console."""
    return get().phase(name, doing)


class _QuietProgress:
    """Progress nobody shows (no phase is running)."""

    def update(self, n: float = 1) -> None:
        pass

    def set_total(self, total: float | None) -> None:
        pass


class _QuietPhase:
    """What :func:`current_phase` gives when no phase runs: accepts the calls, shows nothing."""

    name = ""

    def progress(self, total: float | None = None, unit: str = "it") -> _QuietProgress:
        return _QuietProgress()

    def note(self, text: str) -> None:
        pass

    def done(self, summary: str) -> None:
        pass


def current_phase() -> Phase | _QuietPhase:
    """The innermost running phase of this process's console (e.g. the ``preprocess`` phase ``train`` opens around
    ``prepare``), or a stand-in that shows nothing when none runs (a library call, a test): code deep in a
    command reports its progress here without being handed the phase."""
    running = get().running
    return running[-1] if running else _QuietPhase()


class LogHandler(logging.Handler):
    """Log records as console lines (stamped, above any bar), e.g. the preprocessing's ``log.info`` messages."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            get().line(text if record.levelno < logging.WARNING else f"warning: {text}")
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logs_on_console(name: str = "nre_ray") -> Iterator[None]:
    """While the block runs, the ``name`` logger's records are console lines instead of bare stderr lines (so they
    keep their place among the phase lines, in a log file and above a terminal's bar alike)."""
    logger = logging.getLogger(name)
    handler, propagate = LogHandler(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


# --------------------------------------------------------------------------------------------------------------------
# training: events from the Ray Train controller, printed by the driver


class RunLog:
    """The run's log file: what Ray forwards from its processes (the workers' output and tracebacks, the raylets' and
    the GCS's messages: :func:`nre_ray.cluster.ray_private.ray_output_to`) and the driver's details of a failure,
    each line stamped with the time and where it comes from. Appended to: a ``--resume`` continues it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")  # for the run: close() closes it
        self._lock = threading.Lock()

    def write(self, text: str, source: str = "driver") -> None:
        """Append ``text``, each line stamped ``2026-12-02 01:45:00 (source)``."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._lock:
            if self._fh.closed:
                return
            self._fh.writelines(f"{stamp} ({source}) {line}\n" for line in text.splitlines() or [""])
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def append_event(path: str | Path, event: dict[str, Any]) -> None:
    """Append one event (a JSON object on one line) to ``path``; called by the controller's callbacks."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event, default=float) + "\n")


class EventFollower:
    """Follows an events file in a thread, handing each complete line's event to ``handle`` (in order, once)."""

    def __init__(self, path: str | Path, handle: Callable[[dict[str, Any]], None], every_s: float = 0.2) -> None:
        self.path, self.handle, self.every_s = Path(path), handle, every_s
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nre_ray-events", daemon=True)

    def __enter__(self) -> EventFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()  # what arrived after the last poll

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def poll(self) -> None:
        """Hand on the events appended since the last call."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]  # a line still being written waits for the next poll
        self._offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            if line.strip():
                try:
                    self.handle(json.loads(line))
                except Exception as err:  # a display problem must never stop training
                    print(f"console: could not show an event: {err}", file=sys.stderr)


#: The score an epoch line shows besides the selection metric, (short name, score name): the sentence task's.
EPOCH_ALSO = ("acc", "accuracy")


def format_epoch(metrics: dict[str, Any], epochs: int, select: str, also: tuple[str, str] = EPOCH_ALSO) -> str:
    """One epoch's line: ``epoch   2/10  train_loss ...  valid_macro_f1 0.9066 ...  10084 ex/s  *``. ``also``:
    the other validation score it shows (the task's :attr:`~nre_ray.tasks.base.Task.epoch_metric`)."""
    def num(key: str, fmt: str) -> str:
        value = metrics.get(key)
        return format(float(value), fmt) if isinstance(value, int | float) and math.isfinite(value) else "-"

    improved = float(metrics.get(IMPROVED_KEY, 0) or 0) > 0
    return (f"epoch {int(metrics.get('epoch', 0)):3d}/{epochs}  train_loss {num('train_loss', '.4f')}  "
            f"valid_loss {num('valid_loss', '.4f')}  valid_{select} {num(f'valid_{select}', '.4f')}  "
            f"valid_{also[0]} {num(f'valid_{also[1]}', '.4f')}  lr {num('lr', '.2g')}  "
            f"{num('examples_per_sec', '.0f')} ex/s" + ("  *" if improved else ""))


def epoch_legend(epochs: int, select: str, first: int = 1) -> str:
    """The line above the epoch table that says what the columns and the ``*`` mean."""
    which = f"epochs {first}-{epochs}" if first > 1 else f"{epochs} epoch{'s' if epochs != 1 else ''}"
    return (f"{which}; valid_{select} selects the best checkpoint; "
            f"* marks an epoch that improved it (the best so far)")


def format_failure(event: dict[str, Any]) -> str:
    """The one line for a failure the Ray Train controller handled (an event of
    :class:`nre_ray.tracking.callback.ConsoleEvents`): what was lost, which failure of how many, and the epoch and
    checkpoint the run goes on from, after an epoch or at a step in one (or that it stops)::

        lost a worker: rank 1 (pid 2731 on node 10.0.0.2 (id ...5e7bc755)) exited unexpectedly (killed, e.g. by
        SIGKILL or the out-of-memory killer, or crashed); failure 1 of --max-failures 2; going on from epoch 3,
        checkpoint PATH
    """
    count, limit, goes_on = int(event.get("count") or 1), int(event.get("limit") or 0), bool(event.get("goes_on"))
    if event.get("preemption"):
        tally = f"preemption {count} (preemptions do not count against --max-failures)"
    elif limit < 0:
        tally = f"failure {count} (--max-failures {limit}: no limit)"
    elif goes_on:
        tally = f"failure {count} of --max-failures {limit}"
    else:
        tally = f"failure {count}, more than --max-failures {limit} allows"
    epoch, step, checkpoint = int(event.get("epoch") or 0), int(event.get("step") or 0), event.get("checkpoint")
    where = f"step {step} of epoch {epoch + 1}" if step else f"epoch {epoch}"  # a mid-epoch checkpoint: the step
    if goes_on:
        then = f"going on from {where}, checkpoint {checkpoint}" if checkpoint else \
            "going on from the start (no checkpoint yet)"
    else:
        then = "the run stops" + (f"; continue it from {where} with --resume" if checkpoint else "")
    return f"{event.get('kind', 'a failure')}: {event.get('what', 'unknown')}; {tally}; {then}"


def stop_reason(epoch: int, best: int, epochs: int, patience: int, select: str) -> str:
    """Why training ended after ``epoch`` (best epoch ``best``) with ``--epochs epochs --patience patience``."""
    if patience and epoch - best >= patience:
        return (f"early stop: valid_{select} did not improve for {epoch - best} epochs after epoch {best} "
                f"(--patience {patience})")
    if epoch >= epochs:
        return (f"the epoch budget ran out (--epochs {epochs})"
                + (f" while valid_{select} was still improving: more --epochs may help" if best == epoch else ""))
    return f"stopped after epoch {epoch} of {epochs}"


class TrainingView:
    """Shows a training run from the controller's events: the workers starting, the legend, one line per epoch
    (a bar over the epochs on a terminal), a failure in one line (:func:`format_failure`), an early stop.
    ``handle`` is an :class:`EventFollower` handler."""

    def __init__(self, console: Console, workers: str, epochs: int, select: str, patience: int = 0,
                 first_epoch: int = 1, also: tuple[str, str] = EPOCH_ALSO) -> None:
        self.console, self.epochs, self.select, self.patience = console, epochs, select, patience
        self.also = also
        self.first_epoch = first_epoch
        self.last: dict[str, Any] | None = None
        self.starts = 0
        self._restarted = False  # a failure line said where the next worker group starts from
        self.stopped = False  # a failure line said the run stops
        self._phase: Phase | None = Phase(console, "workers", f"starting {workers}")
        self._bar: Progress | None = None

    def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "workers_started":
            self.starts += 1
            if self._phase is not None and self._phase.name == "workers":
                self._phase.end(f"{event.get('count', '?')} up" + (" again" if self.starts > 1 else ""))
                self._phase = None
            elif self.starts > 1:
                self.console.line(f"workers: {event.get('count', '?')} started again")
        elif kind == "training_started":
            if self._phase is not None and self._phase.name == "workers":  # no "workers_started" came (another Ray)
                self._phase.end("up")
                self._phase = None
            if self._phase is None:
                self._phase = Phase(self.console, "training", epoch_legend(self.epochs, self.select,
                                                                           self.first_epoch))
                if self.console.tty:  # in a log file the epoch lines are the progress
                    self._bar = self._phase.progress(total=self.epochs - self.first_epoch + 1, unit="epoch")
        elif kind == "epoch":
            self._restarted = False
            self.add(event.get("metrics", {}))
        elif kind == "failure":
            self.console.line(format_failure(event))
            self._restarted, self.stopped = bool(event.get("goes_on")), not event.get("goes_on")
        elif kind == "notes":
            for text in event.get("lines", []):
                if not (self._restarted and str(text).startswith(RESUME_NOTE)):  # the failure line said it
                    self.console.line(str(text))

    def add(self, metrics: dict[str, Any]) -> None:
        """Print one epoch's line."""
        if self._phase is None or self._phase.name != "training":
            self.handle({"event": "training_started"})
        self.console.line(format_epoch(metrics, self.epochs, self.select, self.also), stamp=False)
        if self._bar is not None:  # to the epoch reached (a resumed run starts after its checkpoint's epoch)
            self._bar.update(max(0, int(metrics.get("epoch", 0)) - self.first_epoch + 1 - int(self._bar.count)))
        self.last = metrics

    def close(self, failed: bool = False) -> None:
        """End the running phase: the run finished (or ``failed``)."""
        if self._phase is None:
            return
        if failed:
            self._phase.end(failed=True)
        elif self.last is not None:
            epoch, best = int(self.last.get("epoch", 0)), int(self.last.get("best_epoch", 0))
            stop = stop_reason(epoch, best, self.epochs, self.patience, self.select)
            self._phase.end(f"{epoch} epoch{'s' if epoch != 1 else ''}, best epoch {best}; {stop}")
        else:
            self._phase.end()
        self._phase = None


def exit_status(main: Callable[[], int]) -> int:
    """Run a command's ``main`` and return its exit status; a reader that stops reading its output (``| head``)
    ends it quietly, with the status of a process that a broken pipe ends (141), not with a ``BrokenPipeError``
    traceback (Python ignores SIGPIPE, so a write to a closed pipe raises: and raises again when stdout is flushed
    at exit). Every ``python -m nre_ray...`` command ends with ``sys.exit(console.exit_status(main))``."""
    import os
    import signal

    try:
        status = main()
        sys.stdout.flush()  # what is still buffered, while the error can be caught here
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit writes nowhere instead of failing again
        return 128 + signal.SIGPIPE
