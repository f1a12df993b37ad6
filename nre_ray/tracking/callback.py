"""Ray Train controller callbacks: each epoch's metrics to MLflow, and the run's events to the driver's console.

Ray Train keeps an epoch only once its checkpoint is registered: the controller picks up the workers' reports at its
next poll (every 2 s) and writes its checkpoint list to storage, which is what a restart (``--max-failures``) or a
``--resume`` starts from. A report that is not picked up (Ctrl-C, a worker or the driver killed in those seconds) is
lost and the epoch is trained again. Logging the epoch's metrics here, right after that registration, instead of in
the worker, gives each epoch in MLflow exactly once, and only epochs a continuation starts after.

The controller runs on the driver's node (Ray Train pins it there), so it hands the driver what to print through a
file of events (:func:`nre_ray.core.console.append_event`): the workers up, training started, each epoch, and each
failure it handled: what was lost (a worker process, a node, a node preempted), which failure of how many, and the epoch
(or the step in an epoch, from a mid-epoch checkpoint) and checkpoint the run goes on from (:func:`describe_failure`;
the console prints it in one line). Where the driver is not on a node (a Ray Client ``ray://`` address) there is no such
file and the controller prints the epoch lines itself (Ray forwards them to the driver with its
``(TrainController pid=...)`` prefix).
"""

from __future__ import annotations

import logging
from typing import Any

import ray.train

from nre_ray import storage
from nre_ray.cluster.ray_private import failure_of, train_callback_bases, worker_death, worker_places
from nre_ray.cluster.session import root_cause
from nre_ray.core.console import EPOCH_ALSO, NOTES_KEY, append_event, format_epoch

log = logging.getLogger(__name__)

# Ray Train's controller hooks: the console's "workers up", "training started" and failure lines. On a Ray without
# them, the console learns of the training from the first epoch only.
TRAIN_CALLBACK_BASES = train_callback_bases()
HAS_WORKER_GROUP_HOOKS = bool(TRAIN_CALLBACK_BASES)
#: What Ray says of an actor whose node died (lost, its raylet gone, marked dead) or was preempted.
NODE_DIED = ("its node has died", "node it was running on is dead", "node is dead")
NODE_PREEMPTED = "node was preempted"


class EpochMetricsLogger(ray.train.UserCallback):
    """Logs rank 0's reported metrics at step ``metrics["epoch"]`` into an existing MLflow run (by id), and passes
    them on to the driver's console: appended to ``events`` (a file on the driver's node), else printed."""

    def __init__(self, tracking_uri: str, run_id: str, events: str | None = None, epochs: int = 0,
                 select: str = "macro_f1", also: tuple[str, str] = EPOCH_ALSO) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.events, self.epochs, self.select, self.also = events, epochs, select, also
        self._tracker: Any = None  # an nre_ray.tracking.store.MlflowTracker from the first epoch on

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Called by the controller after the checkpoint manager registered the report (``checkpoint`` persisted)."""
        if metrics and NOTES_KEY in metrics[0]:  # lines for the console (nre_ray.run.loop.tell_console)
            lines = [str(line) for line in metrics[0][NOTES_KEY]]
            _tell(self.events, {"event": "notes", "lines": lines}, lambda: "\n".join(lines))
            return
        if checkpoint is None or not metrics or "epoch" not in metrics[0]:
            return
        try:
            if self._tracker is None:
                # imported here: the controller starts the workers without waiting for mlflow's import
                from nre_ray.tracking.store import MlflowTracker

                self._tracker = MlflowTracker(self.tracking_uri, self.run_id)
            self._tracker.log_metrics(metrics[0], step=int(metrics[0]["epoch"]))
        except Exception as err:  # tracking trouble must not stop training: the checkpoint holds the metrics too
            log.warning("MLflow: could not log the metrics of epoch %s: %s", metrics[0].get("epoch"), err)
        _tell(self.events, {"event": "epoch", "metrics": dict(metrics[0])},
              lambda: format_epoch(metrics[0], self.epochs, self.select, self.also))


class ConsoleEvents(*(TRAIN_CALLBACK_BASES or (object,))):  # type: ignore[misc]
    """Tells the driver's console when the worker group is up, when the training function started on it, and of
    each failure the controller handles (with ``--max-failures``, the run's limit, counted as Ray Train counts).
    ``storage``: the run's storage path; ``start``: where the run starts from (a ``--resume``), until a checkpoint is
    registered: epochs done, steps done of the next epoch (:func:`resume_point`) and the checkpoint's path."""

    def __init__(self, events: str | None, max_failures: int = 0, storage: str = "",
                 start: tuple[int, int, str] | None = None) -> None:
        self.events, self.max_failures, self.storage = events, max_failures, storage
        # the latest registered checkpoint: epochs done, steps done of the next epoch, path
        self.latest: tuple[int, int, str | None] = start or (0, 0, None)
        self.places: dict[int, tuple[str, str, int]] = {}  # where each rank of the worker group runs
        self.failures = self.preemptions = 0

    def after_worker_group_start(self, worker_group: Any) -> None:
        count = len(worker_group.get_workers()) if hasattr(worker_group, "get_workers") else None
        try:
            self.places = worker_places(worker_group)
        except Exception as err:  # the failure line then says less
            log.warning("console: could not tell where the workers run: %s", err)
        _tell(self.events, {"event": "workers_started", "count": count}, None)

    def after_worker_group_training_start(self, worker_group: Any) -> None:
        _tell(self.events, {"event": "training_started"}, None)

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        """After Ray Train registered a report: an epoch's checkpoint, or a mid-epoch one saved on a preemption
        notice, is the one a restart goes on from."""
        checkpoint = getattr(training_report, "checkpoint", None)
        point = resume_point(metrics[0]) if checkpoint is not None and metrics else None
        if point is not None:
            self.latest = (*point, storage.with_scheme(checkpoint.path, self.storage))

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        """A restart (or a stop) after a failure: one event with what was lost and where the run goes on from."""
        if current_state is previous_state:
            # The controller stays in its restarting state, telling each turn of its loop, while the cluster has
            # too few workers for MIN (an elastic run waiting for a replacement): still the same restart.
            return
        try:  # an error raised here would count as a failure of the run itself
            found = failure_of(current_state)
            if found is None:
                return
            error, goes_on = found
            failure = describe_failure(error, self.places, _alive_nodes({node for node, _, _ in self.places.values()}))
            if failure is None:  # not a worker's failure (the worker group could not be placed: reported by fit)
                return
            if failure["preemption"]:
                self.preemptions += 1
            else:
                self.failures += 1
            epoch, step, checkpoint = self.latest
            _tell(self.events, {"event": "failure", **failure, "goes_on": goes_on, "limit": self.max_failures,
                                "count": self.preemptions if failure["preemption"] else self.failures,
                                "epoch": epoch, "step": step, "checkpoint": checkpoint}, None)
        except Exception as err:
            log.warning("console: could not describe a failure: %s", err)


def resume_point(metrics: dict[str, Any]) -> tuple[int, int] | None:
    """Where a run goes on from the checkpoint reported with ``metrics``: (epochs done, steps done of the next epoch),
    from an epoch's checkpoint (``epoch``: 0 steps) or a mid-epoch one saved on a preemption notice (``mid_epoch``,
    ``mid_epoch_step``: :func:`nre_ray.run.loop._report_position`); None for a report that is neither."""
    if "epoch" in metrics:
        return int(metrics["epoch"]), 0
    if "mid_epoch" in metrics:
        return int(metrics["mid_epoch"]) - 1, int(metrics.get("mid_epoch_step", 0))
    return None


def describe_failure(error: Exception, places: dict[int, tuple[str, str, int]],
                     alive: set[str] | None = None) -> dict[str, Any] | None:
    """What a Ray Train failure lost, in words: ``{"kind": "lost a worker" | "lost a node" | "preemption" |
    "a worker failed", "what": ..., "preemption": bool}``; None for a failure that is not the workers' (the worker
    group not placed in time). ``places``: where each rank ran (:func:`nre_ray.cluster.ray_private.worker_places`);
    ``alive``: the ids of the nodes alive now (None: unknown). A preemption is told apart as Ray Train's failure
    policy does (it counts against its own limit, not ``--max-failures``)."""
    import ray.train
    from ray.exceptions import RayActorError

    if isinstance(error, ray.train.PreemptionError):
        nodes = error.preemption_info.preempted_node_to_ranks
        what = "; ".join(f"node {_node(node_id, places, ranks, _ranks(ranks))} was preempted"
                         for node_id, ranks in sorted(nodes.items()))
        return {"kind": "preemption", "what": what or "a node was preempted", "preemption": True}
    if not isinstance(error, ray.train.WorkerGroupError):
        return None
    failures = {rank: worker_death(err) for rank, err in error.worker_failures.items()}
    dead = {rank: err for rank, err in sorted(failures.items()) if isinstance(err, RayActorError)}
    if not dead:  # the training function raised: the first rank's error (the others' follow from it)
        rank, err = min(failures.items()) if failures else (0, error)
        return {"kind": "a worker failed", "what": f"rank {rank} raised {_one_line(err)}", "preemption": False}
    preempted = any(err.preempted or NODE_PREEMPTED in str(err) for err in dead.values())
    by_node: dict[str, list[int]] = {}
    for rank in dead:
        by_node.setdefault(places.get(rank, ("", "", 0))[0], []).append(rank)
    gone = [node_id for node_id, ranks in by_node.items()
            if (alive is not None and node_id and node_id not in alive)
            or any(text in str(dead[rank]) for rank in ranks for text in NODE_DIED)]
    if preempted or gone:
        verb = "was preempted" if preempted else "is gone"
        what = "; ".join(f"node {_node(node_id, places, by_node[node_id], _ranks(by_node[node_id]))} {verb}"
                         for node_id in (by_node if preempted else gone))
        return {"kind": "preemption" if preempted else "lost a node", "what": what, "preemption": preempted}
    what = "; ".join(f"rank {rank} ({_process(rank, places)}) {_how_it_ended(err)}" for rank, err in dead.items())
    return {"kind": "lost a worker", "what": what, "preemption": False}


def _how_it_ended(err: Exception) -> str:
    """How a worker process ended, from Ray's words for it."""
    text = str(err)
    if "ActorUnavailableError" in type(err).__name__ or "is unavailable" in text:
        return "stopped answering (its process or its node may be gone)"
    if "low on memory" in text or "memory monitor" in text:
        return "was killed by Ray's memory monitor (its node ran low on memory)"
    if "SIGTERM" in text:
        return "was stopped by a SIGTERM"
    return "exited unexpectedly (killed, e.g. by SIGKILL or the out-of-memory killer, or crashed)"


def _process(rank: int, places: dict[int, tuple[str, str, int]]) -> str:
    """``pid 20062 on node 10.0.0.2 (id ...5e7bc755)``."""
    node_id, _, pid = places.get(rank, ("", "", 0))
    return f"pid {pid} on node {_node(node_id, places, [rank])}" if pid else "its node unknown"


def _node(node_id: str, places: dict[int, tuple[str, str, int]], ranks: list[int], *more: str) -> str:
    """``10.0.0.2 (id ...5e7bc755, MORE)``: the node's IP and the end of its id (nodes on one host share an IP)."""
    ip = next((places[r][1] for r in ranks if r in places), "") or "unknown"
    details = [f"id ...{node_id[-8:]}"] if node_id else []
    return f"{ip} ({', '.join([*details, *more])})" if details or more else ip


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


#: At most this many characters of a worker's error on the console (the run's log file has all of it).
ERROR_CHARS = 200


def _one_line(err: Exception) -> str:
    """``TypeName: the innermost message`` of a worker's error, cut at :data:`ERROR_CHARS`."""
    cause = root_cause(err)
    name = type(err).__name__
    line = cause if cause.startswith(name) or ":" in cause.split(" ", 1)[0] else f"{name}: {cause}"
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 3] + "..."


#: How long the check of a node's raylet waits for it to answer (a node that vanished does not refuse, it is silent).
RAYLET_ANSWER_S = 2.0


def _alive_nodes(ours: set[str]) -> set[str] | None:
    """The ids of the cluster's nodes alive now (None when Ray cannot say). Of ``ours`` (the nodes the worker group
    ran on), a node counts as alive only while its raylet answers: Ray marks a lost node dead only after its health
    checks have failed for a while, and a worker's death is seen before that."""
    import socket

    import ray

    try:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
    except Exception:
        return None
    alive = set()
    for node in nodes:
        if node["NodeID"] in ours:
            try:
                with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])),
                                              timeout=RAYLET_ANSWER_S):
                    pass
            except (OSError, KeyError, ValueError):
                continue
        alive.add(node["NodeID"])
    return alive


def _tell(events: str | None, event: dict[str, Any], text: Any) -> None:
    """Append ``event`` to the driver's events file; without one, print ``text()`` (if given)."""
    try:
        if events:
            append_event(events, event)
        elif text is not None:
            print(text(), flush=True)
    except Exception as err:  # the console must not stop training
        log.warning("console: could not pass on %s: %s", event.get("event"), err)
