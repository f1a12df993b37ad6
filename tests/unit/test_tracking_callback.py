"""The Train controller's callback hands the workers' console notes and epochs to the driver's events file."""

from __future__ import annotations

import json

from nre_ray.core.console import NOTES_KEY
from nre_ray.tracking.callback import EpochMetricsLogger


def test_a_report_of_notes_becomes_one_console_event_and_nothing_in_mlflow(tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    callback = EpochMetricsLogger(f"sqlite:///{tmp_path / 'never.db'}", "run-id", str(events), epochs=5)
    notes = ["embeddings: 4 of 9 vocabulary words found in v.txt"]
    callback.after_report(None, [{NOTES_KEY: notes}, {NOTES_KEY: []}], None)  # rank 0's lines, rank 1's none
    assert [json.loads(line) for line in events.read_text().splitlines()] == [{"event": "notes", "lines": notes}]
    assert callback._tracker is None and not (tmp_path / "never.db").exists()

    printed = EpochMetricsLogger(f"sqlite:///{tmp_path / 'never.db'}", "run-id", None)  # no events file (ray://)
    printed.after_report(None, [{NOTES_KEY: ["a", "b"]}], None)
    assert capsys.readouterr().out == "a\nb\n"


# A failure, as the controller hands it over: Ray's own exception objects, Ray's words for how a worker ended.
KILLED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n\tpid: 20062\n"
          "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
          "Worker unexpectedly exits with a connection error code 2. End of file.")
NODE_DIED = "The actor died because its node has died. Node Id: 5e7bc755\n\tthe actor's node was terminated"
GLOO = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:17795: Connection reset by peer")
PLACES = {0: ("aaaa1111bbbb", "10.0.0.1", 100), 1: ("cccc2222dddd", "10.0.0.2", 20062)}


def _group_error(failures: dict) -> Exception:
    import ray.train

    return ray.train.WorkerGroupError("worker errors", failures)


def test_a_killed_worker_a_lost_node_a_preemption_and_an_error_are_told_apart():
    from ray.exceptions import RayActorError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from nre_ray.tracking.callback import describe_failure

    # Ray Train reports a dead worker's RayActorError inside its health check's error
    dead = WorkerHealthCheckFailedError("Worker health check failed.", RayActorError("a1", KILLED))
    killed = describe_failure(_group_error({0: GLOO, 1: dead}), PLACES, {"aaaa1111bbbb", "cccc2222dddd"})
    assert killed == {"kind": "lost a worker", "preemption": False,
                      "what": "rank 1 (pid 20062 on node 10.0.0.2 (id ...2222dddd)) exited unexpectedly (killed, "
                              "e.g. by SIGKILL or the out-of-memory killer, or crashed)"}
    # the node is no longer alive: the same words are a lost node; Ray's own words say so too
    for alive, text in (({"aaaa1111bbbb"}, KILLED), (None, NODE_DIED)):
        lost = describe_failure(_group_error({0: GLOO, 1: RayActorError("a1", text)}), PLACES, alive)
        assert lost == {"kind": "lost a node", "what": "node 10.0.0.2 (id ...2222dddd, rank 1) is gone",
                        "preemption": False}
    preempted = describe_failure(_group_error({1: RayActorError("a1", KILLED, preempted=True)}), PLACES, None)
    assert preempted == {"kind": "preemption", "what": "node 10.0.0.2 (id ...2222dddd, rank 1) was preempted",
                         "preemption": True}
    raised = describe_failure(_group_error({0: OSError(28, "No space left on device")}), PLACES, None)
    assert raised["kind"] == "a worker failed" and "rank 0 raised" in raised["what"] \
        and "No space left on device" in raised["what"]
    term = describe_failure(_group_error({1: RayActorError("a1", "Worker exits: received SIGTERM")}), {}, None)
    assert term["what"] == "rank 1 (its node unknown) was stopped by a SIGTERM"
    assert describe_failure(RuntimeError("not a worker group's failure"), PLACES, None) is None


def test_each_restart_is_one_failure_event_with_its_count_and_the_checkpoint_it_goes_on_from(tmp_path, monkeypatch):
    """ConsoleEvents hears of the controller's restarts through its real state objects. Both nodes of PLACES count as
    alive (whether a Ray is up in this test process or not: the real check is test_faults' and test_standin's)."""
    from nre_ray.tracking import callback as callback_module

    monkeypatch.setattr(callback_module, "_alive_nodes", lambda ours: set(ours))
    from types import SimpleNamespace

    from ray.exceptions import RayActorError
    from ray.train.v2._internal.execution.controller.state import (
        ErroredState,
        RestartingState,
        RunningState,
        ShuttingDownState,
    )

    from nre_ray.tracking.callback import ConsoleEvents

    events = tmp_path / "events.jsonl"
    callback = ConsoleEvents(str(events), max_failures=1, storage=str(tmp_path), start=(2, 0, "/runs/r/checkpoint_a"))
    callback.places = PLACES
    error = _group_error({0: GLOO, 1: RayActorError("a1", KILLED)})
    callback.after_controller_state_update(RunningState(), RestartingState(training_failed_error=error))
    callback.after_report(SimpleNamespace(checkpoint=SimpleNamespace(path=str(tmp_path / "checkpoint_b"))),
                          [{"epoch": 4}, {"epoch": 4}])
    callback.after_report(SimpleNamespace(checkpoint=None), [{"notes": ["x"]}])  # a report without a checkpoint
    callback.after_controller_state_update(RunningState(), RunningState())  # not a failure
    callback.after_controller_state_update(
        RunningState(), ShuttingDownState(next_state=ErroredState(training_failed_error=error)))
    sent = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["count"], e["limit"], e["goes_on"], e["epoch"], e["checkpoint"]) for e in sent] == [
        (1, 1, True, 2, "/runs/r/checkpoint_a"), (2, 1, False, 4, str(tmp_path / "checkpoint_b"))]
    assert sent[0]["kind"] == "lost a worker" and "rank 1" in sent[0]["what"]


def test_after_a_mid_epoch_checkpoint_the_restart_goes_on_from_its_step(tmp_path, monkeypatch):
    """A preemption notice's checkpoint (reported without ``epoch``, with ``mid_epoch`` and ``mid_epoch_step``, as
    nre_ray.run.loop._report_position reports it) is where the restart goes on from: the failure line says the step."""
    from types import SimpleNamespace

    from ray.exceptions import RayActorError
    from ray.train.v2._internal.execution.controller.state import RestartingState, RunningState

    from nre_ray.core.console import NOTES_KEY, format_failure
    from nre_ray.tracking import callback as callback_module
    from nre_ray.tracking.callback import ConsoleEvents

    monkeypatch.setattr(callback_module, "_alive_nodes", lambda ours: set(ours))
    events = tmp_path / "events.jsonl"
    callback = ConsoleEvents(str(events), max_failures=0, storage=str(tmp_path))
    callback.places = PLACES
    for name, metrics in (("checkpoint_1", {"epoch": 1}), ("checkpoint_mid", {"mid_epoch": 2, "mid_epoch_step": 7})):
        callback.after_report(SimpleNamespace(checkpoint=SimpleNamespace(path=str(tmp_path / name))),
                              [{**metrics, NOTES_KEY: []}, {}])
    preempted = _group_error({1: RayActorError("a1", KILLED, preempted=True)})
    restarting = RestartingState(training_failed_error=preempted)
    callback.after_controller_state_update(RunningState(), restarting)
    # The controller tells the same state again at each turn while it waits for MIN workers: one restart, one line
    callback.after_controller_state_update(restarting, restarting)
    sent = json.loads(events.read_text())
    assert (sent["epoch"], sent["step"], sent["checkpoint"]) == (1, 7, str(tmp_path / "checkpoint_mid"))
    assert format_failure(sent) == (
        "preemption: node 10.0.0.2 (id ...2222dddd, rank 1) was preempted; preemption 1 (preemptions do not count "
        f"against --max-failures); going on from step 7 of epoch 2, checkpoint {tmp_path / 'checkpoint_mid'}")
