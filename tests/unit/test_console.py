"""The console: phase lines with times, progress on a terminal and in a file, the epoch table from events."""

from __future__ import annotations

import io
import re
import sys

from nre_ray.core import console
from nre_ray.core.console import Console, EventFollower, TrainingView, append_event, format_epoch


def _epoch(epoch: int, improved: bool, best: int) -> dict[str, float]:
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "valid_loss": 0.5, "valid_macro_f1": 0.1 * epoch,
            "valid_accuracy": 0.2, "lr": 0.001, "examples_per_sec": 1234.0, console.IMPROVED_KEY: epoch * improved,
            "best_epoch": best}


def test_the_improved_key_is_the_loops_selection_rank():
    from nre_ray.run.loop import SELECTION_RANK

    assert console.IMPROVED_KEY == SELECTION_RANK


def test_a_phase_in_a_file_is_a_start_and_an_end_line_with_times_and_no_control_characters(monkeypatch):
    out = io.StringIO()
    con = Console(out, tty=False, started=0.0)
    monkeypatch.setattr(console, "FILE_PROGRESS_EVERY_S", 0.0)  # every update prints a progress line
    with con.phase("preprocess", "reading 3 files") as step:
        bar = step.progress(total=4, unit="rows")
        bar.update(2)
        step.note("nothing cached yet")
        step.done("4 rows")
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\[ *\d+\.\ds\] preprocess: reading 3 files", lines[0])
    assert lines[1].endswith("preprocess: 2/4 rows (50%)")
    assert lines[2].endswith("preprocess: nothing cached yet")
    assert re.search(r"preprocess: 4 rows \(\d+\.\d s\)$", lines[3])
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_in_a_file_a_count_without_total_says_so_far_and_the_final_count_follows(monkeypatch):
    """preprocess printed ``500 rows read`` (the first block's rows, ~10 s in) for a 3,000-row and a 12,000-row file
    alike, and nothing after: a count shown before the end says "so far", and the true total follows."""
    out = io.StringIO()
    con = Console(out, tty=False, started=0.0)
    with con.phase("preprocess", "reading") as step:
        read = step.progress(unit="rows read")
        monkeypatch.setattr(console, "FILE_PROGRESS_EVERY_S", 0.0)
        read.update(500)
        monkeypatch.setattr(console, "FILE_PROGRESS_EVERY_S", 3600.0)
        read.update(11_500)
        encoded = step.progress(total=12_000, unit="rows encoded")  # the next counter: the read one is finished
        encoded.update(12_000)
        step.done("train 12000 rows")
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == ["preprocess: reading", "preprocess: 500 rows read so far", "preprocess: 12000 rows read",
                     lines[-1]] and lines[-1].startswith("preprocess: train 12000 rows (")


def test_a_failing_phase_says_it_stopped_and_the_error_goes_on():
    out = io.StringIO()
    con = Console(out, tty=False)
    try:
        with con.phase("ray", "starting"):
            raise ValueError("boom")
    except ValueError:
        pass
    else:
        raise AssertionError("the error was swallowed")
    assert "ray: stopped after" in out.getvalue()


def test_on_a_terminal_a_tqdm_bar_runs_between_the_lines():
    out = io.StringIO()
    con = Console(out, tty=True)
    with con.phase("preprocess", "reading") as step:
        bar = step.progress(total=10, unit="rows")
        bar.update(10)
    text = out.getvalue()
    assert "/10 [" in text and "\r" in text  # tqdm's bar, redrawn in place
    assert text.rstrip().splitlines()[-1].split("\r")[-1].startswith("[")  # the end line comes last


def test_epoch_lines_come_from_events_with_a_legend_and_an_early_stop(tmp_path):
    out = io.StringIO()
    con = Console(out, tty=False)
    events = tmp_path / "events.jsonl"
    view = TrainingView(con, "2 worker(s)", epochs=10, select="macro_f1", patience=2)
    with EventFollower(events, view.handle, every_s=0.01):
        append_event(events, {"event": "workers_started", "count": 2})
        append_event(events, {"event": "training_started"})
        append_event(events, {"event": "notes", "lines": ["embeddings: 4 of 9 vocabulary words found in v.txt"]})
        for metrics in (_epoch(1, True, 1), _epoch(2, False, 1), _epoch(3, False, 1)):
            append_event(events, {"event": "epoch", "metrics": metrics})
    view.close()
    text = out.getvalue()
    assert "workers: starting 2 worker(s)" in text and "workers: 2 up" in text
    assert "valid_macro_f1 selects the best checkpoint; * marks an epoch that improved it" in text
    note = next(line for line in text.splitlines() if "embeddings:" in line)  # a plain line, before the epochs
    assert note.endswith("] embeddings: 4 of 9 vocabulary words found in v.txt") and "pid=" not in note
    assert text.index(note) < text.index("epoch   1/10")
    lines = [line for line in text.splitlines() if line.startswith("epoch ")]
    assert lines == [format_epoch(_epoch(e, e == 1, 1), 10, "macro_f1") for e in (1, 2, 3)]
    assert lines[0].startswith("epoch   1/10  train_loss 1.0000") and lines[0].endswith("1234 ex/s  *")
    assert not lines[1].endswith("*")
    assert ("training: 3 epochs, best epoch 1; early stop: valid_macro_f1 did not improve for 2 epochs after epoch 1 "
            "(--patience 2)") in text


def test_the_follower_hands_on_only_complete_lines(tmp_path):
    events = tmp_path / "events.jsonl"
    seen: list[dict] = []
    follower = EventFollower(events, seen.append)
    follower.poll()  # no file yet: nothing
    events.write_text('{"event": "a"}\n{"event": "b"')
    follower.poll()
    assert seen == [{"event": "a"}]
    with open(events, "a") as fh:
        fh.write('}\n')
    follower.poll()
    assert seen == [{"event": "a"}, {"event": "b"}]


def test_log_records_become_console_lines_while_a_command_runs(caplog):
    import logging

    out = io.StringIO()
    previous = console.get()
    console.use(Console(out, tty=False))
    level = logging.getLogger("nre_ray").level
    try:
        logging.getLogger("nre_ray").setLevel(logging.WARNING)  # as in a command (other tests may have lowered it)
        with console.logs_on_console("nre_ray"):
            logging.getLogger("nre_ray.data.pipeline").warning("cannot read the shared cache")
            logging.getLogger("nre_ray").info("not shown below the logger's level")
        logging.getLogger("nre_ray").warning("after the block: back to the usual handlers")
    finally:
        console.use(previous)
        logging.getLogger("nre_ray").setLevel(level)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"\[ *\d+\.\ds\] warning: cannot read the shared cache", lines[0])
    assert "after the block" in caplog.text and "after the block" not in out.getvalue()


def test_current_phase_is_the_innermost_running_one_or_a_quiet_stand_in():
    out = io.StringIO()
    previous = console.get()
    console.use(Console(out, tty=False))
    try:
        quiet = console.current_phase()
        quiet.progress(total=3, unit="rows").update(3)
        quiet.note("nobody sees this")
        assert out.getvalue() == ""
        with console.phase("preprocess", "reading"):
            console.current_phase().note("from deep inside")  # e.g. nre_ray.data.pipeline
            console.current_phase().done("3 rows")
        assert console.current_phase().name == ""
    finally:
        console.use(previous)
    text = out.getvalue()
    assert "preprocess: from deep inside" in text and re.search(r"preprocess: 3 rows \(\d+\.\d s\)", text)


def test_on_a_terminal_the_epoch_bar_follows_the_epochs_even_after_a_resume():
    out = io.StringIO()
    view = TrainingView(Console(out, tty=True), "1 worker(s)", epochs=5, select="macro_f1")
    view.handle({"event": "workers_started", "count": 1})
    view.handle({"event": "training_started"})
    view.handle({"event": "epoch", "metrics": _epoch(4, True, 4)})  # resumed after epoch 3
    assert view._bar.count == 4 and view._bar.total == 5
    view.handle({"event": "epoch", "metrics": _epoch(5, False, 4)})
    assert view._bar.count == 5
    view.close()
    assert "training: 5 epochs, best epoch 4" in out.getvalue()


def test_epochs_without_worker_events_still_get_the_legend_and_end_line():
    out = io.StringIO()
    view = TrainingView(Console(out, tty=False), "2 worker(s)", epochs=2, select="accuracy")
    view.add(_epoch(1, True, 1))  # only epoch events (a Ray without the worker-group hooks)
    view.close()
    text = out.getvalue()
    assert "workers: up" in text and "valid_accuracy selects the best checkpoint" in text
    assert text.index("selects the best checkpoint") < text.index("epoch   1/2")
    assert "training: 1 epoch, best epoch 1" in text


def test_a_failure_is_one_plain_line_and_the_restart_says_no_more():
    out = io.StringIO()
    view = TrainingView(Console(out, tty=False), "2 worker(s)", epochs=4, select="macro_f1")
    view.handle({"event": "workers_started", "count": 2})
    view.handle({"event": "epoch", "metrics": _epoch(1, True, 1)})
    view.handle({"event": "failure", "kind": "lost a worker",
                 "what": "rank 1 (pid 7 on node 10.0.0.2 (id ...2222dddd)) exited unexpectedly", "count": 1,
                 "limit": 2, "goes_on": True, "epoch": 1, "checkpoint": "/runs/r/checkpoint_1"})
    view.handle({"event": "workers_started", "count": 2})
    view.handle({"event": "notes", "lines": ["resuming after epoch 1 from /runs/r/checkpoint_1"]})  # said above
    view.handle({"event": "epoch", "metrics": _epoch(2, True, 2)})
    view.close()
    lines = [line.split("] ", 1)[-1] for line in out.getvalue().splitlines()]
    assert ("lost a worker: rank 1 (pid 7 on node 10.0.0.2 (id ...2222dddd)) exited unexpectedly; failure 1 of "
            "--max-failures 2; going on from epoch 1, checkpoint /runs/r/checkpoint_1") in lines
    assert "workers: 2 started again" in lines and not any("resuming after" in line for line in lines)
    assert not view.stopped  # it went on: the run's error, if any, is not this failure's
    last = TrainingView(Console(io.StringIO(), tty=False), "2 worker(s)", epochs=4, select="macro_f1")
    last.handle({"event": "failure", "kind": "lost a worker", "what": "rank 1", "count": 2, "limit": 1})
    assert last.stopped  # the run's error then points at this line


def test_the_failure_line_counts_against_the_limit_or_says_the_run_stops():
    from nre_ray.core.console import format_failure

    event = {"kind": "lost a node", "what": "node 10.0.0.2 (id ...2222dddd, ranks 1, 2) is gone", "count": 2,
             "limit": 1, "goes_on": False, "epoch": 3, "checkpoint": "s3://b/r/checkpoint_3"}
    assert format_failure(event) == ("lost a node: node 10.0.0.2 (id ...2222dddd, ranks 1, 2) is gone; failure 2, "
                                     "more than --max-failures 1 allows; the run stops; continue it from epoch 3 with "
                                     "--resume")
    assert format_failure({**event, "goes_on": True, "limit": -1, "count": 3, "checkpoint": None}).endswith(
        "failure 3 (--max-failures -1: no limit); going on from the start (no checkpoint yet)")
    assert "preemption 1 (preemptions do not count against --max-failures); going on from epoch 3" in \
        format_failure({**event, "kind": "preemption", "preemption": True, "count": 1, "goes_on": True})
    assert format_failure({**event, "step": 4}).endswith(
        "the run stops; continue it from step 4 of epoch 4 with --resume")


def test_what_ray_forwards_goes_to_the_run_log(tmp_path, capsys):
    """The driver's printer of Ray's forwarded batches (the workers' output, the raylets' messages) writes into the
    run's log file while the block runs, and is Ray's own again afterwards. (The autoscaler's events, which Ray
    formats only when connected, stay on the console: tests/integration/test_standin.py sees them there.)"""
    import ray._private.worker as ray_worker

    from nre_ray.cluster.ray_private import ray_output_to
    from nre_ray.core.console import RunLog

    log = RunLog(tmp_path / "run" / "ray_output.log")
    original = ray_worker.print_worker_logs
    worker = {"lines": ["Traceback (most recent call last):", "RuntimeError: Connection reset by peer"],
              "pid": 4242, "actor_name": "RayTrainWorker", "ip": "10.0.0.2", "localhost": "10.0.0.1", "is_err": True}
    with ray_output_to(log):
        ray_worker.print_worker_logs(worker, sys.stderr)
        ray_worker.print_worker_logs({"lines": ["A worker died or was killed"], "pid": "raylet"}, sys.stdout)
    assert ray_worker.print_worker_logs is original
    log.close()
    printed = capsys.readouterr()
    assert printed.out == printed.err == ""
    lines = (tmp_path / "run" / "ray_output.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "(RayTrainWorker pid=4242, ip=10.0.0.2) Traceback (most recent call last):",
        "(RayTrainWorker pid=4242, ip=10.0.0.2) RuntimeError: Connection reset by peer",
        "(raylet) A worker died or was killed"]


def test_the_autoscaler_tip_stays_off_the_console_and_its_events_stay_on(ray_cluster, monkeypatch):
    """A command that starts or joins Ray prints the autoscaler's events (``Adding 1 node(s) ...``) as Ray formats
    them, without Ray's once-per-process "Tip: use `ray status` ..." before the first one (it went into every job's
    log)."""
    import ray._private.worker as ray_worker

    from nre_ray.cluster.session import start_ray

    monkeypatch.setattr(ray_worker, "autoscaler_log_fyi_printed", False)  # as in a new driver process
    start_ray(None)
    event = "2026-12-03 12:00:00,000 INFO monitor.py:1 -- :event_summary:Adding 1 node(s) of type cpu_worker."
    shown = list(ray_worker.filter_autoscaler_events([event]))
    assert shown == ["Adding 1 node(s) of type cpu_worker."], shown


def test_the_raylets_known_notices_stay_off_the_console_and_the_others_show(monkeypatch, capsys):
    """The raylet's messages a driver prints whatever log_to_driver says: Serve's shutdown retry (``(raylet) Task
    ServeController.graceful_shutdown failed ...`` on every Ctrl-C of serve) and the worker-pool warning are dropped;
    anything else still shows."""
    import ray._private.worker as ray_worker

    from nre_ray.cluster.ray_private import keep_ray_notices_off_console

    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # unwrapped afterwards
    keep_ray_notices_off_console()
    lines = ["Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task will "
             "be retried. Error: The actor is dead because it was killed by `ray.kill`.",
             "WARNING: 8 PYTHON worker processes have been started on node: 1a2b with address: 127.0.0.1.",
             "A worker died or was killed while executing a task by an unexpected system error."]
    ray_worker.print_to_stdstream({"lines": lines, "pid": "raylet", "ip": "127.0.0.1", "localhost": "127.0.0.1",
                                   "is_err": True, "job": "01000000", "actor_name": None, "task_name": None}, False)
    printed = capsys.readouterr()
    assert "graceful_shutdown" not in printed.err and "worker processes have been started" not in printed.err
    assert "A worker died or was killed" in printed.err, printed
