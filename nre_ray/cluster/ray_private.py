"""The one module that reaches into Ray's private or developer-only internals (Ray 2.59 and 2.60); the rest of
nre_ray uses Ray's public API. Each function says what it reaches and why no public API serves. Nothing of Ray is
imported until a function is called.

Touchpoints: each line is one thing a function here relies on, and the contract test in
tests/unit/test_ray_contracts.py that pins it (a signature, an attribute, a protobuf field, a template's or a
message's text). A Ray release that changes one fails that test, by name. That test module checks that this table,
its tests and this module's functions agree: a function that reaches a Ray internal needs a line here.

    autoscaler_node_groups -> ray._private.state.state.get_cluster_config() -> test_contract_state_get_cluster_config
    autoscaler_node_groups -> ClusterConfig.node_group_configs: name, resources, max_count -> \
        test_contract_cluster_config_node_groups
    loopback_node -> ray._private.ray_constants.ENABLE_RAY_CLUSTER -> test_contract_enable_ray_cluster
    loopback_node -> ray._private.services.resolve_ip_for_localhost(host) -> test_contract_resolve_ip_for_localhost
    loopback_node -> ray.init(_node_ip_address=, dashboard_host=) -> test_contract_init_node_ip_address
    open_loopback_store -> torch TCPStore(master_listen_fd=, wait_for_workers=) -> \
        test_contract_tcpstore_master_listen_fd
    use_loopback_store -> torch env:// TORCHELASTIC_USE_AGENT_STORE -> test_contract_torchelastic_use_agent_store
    loopback_torch_config -> ray.train.torch.config._TorchBackend.on_start -> test_contract_torch_backend_on_start
    loopback_torch_config -> _setup_torch_process_group, _set_torch_distributed_env_vars -> \
        test_contract_torch_process_group_setup
    loopback_torch_config -> TorchConfig.backend_cls (property), backend, timeout_s -> \
        test_contract_torch_config_backend_cls
    loopback_torch_config -> ExecutionGroup.execute, execute_single(_async), get_resources_per_worker -> \
        test_contract_execution_group_methods
    local_gpus -> ray._private.accelerators.get_accelerator_manager_for_resource -> test_contract_accelerator_manager
    in_local_train_mode -> ray.train.v2.api.context.LocalTrainContext -> test_contract_local_train_context
    preemption_notice -> get_train_context().preemption_context.preemption_info -> \
        test_contract_train_context_preemption_info
    function_trainable -> ray.tune.trainable.function_trainable.wrap_function(name=) -> test_contract_wrap_function
    trial_statuses -> ResultGrid._experiment_analysis.trials: trial_id, status -> \
        test_contract_result_grid_experiment_analysis
    train_callback_bases -> WorkerGroupCallback, ControllerCallback, ReportCallback hooks -> \
        test_contract_train_callback_hooks
    failure_of -> controller.state: training_failed_error, ShuttingDownState.next_state -> \
        test_contract_controller_states
    worker_places -> WorkerGroup.get_workers(), Worker.metadata, distributed_context -> test_contract_worker_metadata
    worker_death -> WorkerHealthCheckFailedError.health_check_failure -> test_contract_health_check_failure
    WORKER_POOL_WARNING -> the raylet's "worker processes have been started" text -> \
        test_contract_worker_pool_warning_text
    SERVE_SHUTDOWN_RETRY -> graceful_shutdown, the core worker's retry text -> \
        test_contract_serve_shutdown_retry_text
    _drop_raylet_messages -> ray._private.worker.print_to_stdstream -> test_contract_print_to_stdstream
    _skip_autoscaler_tip -> ray._private.worker.autoscaler_log_fyi_printed -> \
        test_contract_autoscaler_log_fyi_printed
    ray_output_to -> ray._private.worker.print_worker_logs -> test_contract_print_worker_logs
    standin_node_provider -> FakeMultiNodeProvider._create_node_with_resources_and_labels, lock, _nodes -> \
        test_contract_fake_multinode_provider
    standin_node_provider -> ray._private.parameter.RayParams -> test_contract_ray_params
    standin_node_provider -> ray._private.node.Node.live_processes, PROCESS_TYPE_RAYLET -> \
        test_contract_node_live_processes
    drain_for_preemption -> ray._raylet.GcsClient.drain_node -> test_contract_gcs_client_drain_node
    drain_for_preemption -> autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION -> \
        test_contract_drain_node_reason_preemption
    drain_for_preemption -> ray._private.worker.global_worker.gcs_client -> test_contract_global_worker_gcs_client
    load_drain_modules -> ray._raylet, ray._private.worker, autoscaler_pb2 -> test_contract_drain_modules_import
    draining_nodes -> GcsClient.get_draining_nodes (2.60), GlobalState.get_draining_nodes (2.59) -> \
        test_contract_gcs_client_get_draining_nodes
    alive_nodes -> GcsClient.get_all_node_info, GcsNodeInfo.state, node_manager_address -> \
        test_contract_gcs_client_get_all_node_info
    elastic_trainer -> ElasticScalingPolicy, NoopDecision, ResizeDecision -> test_contract_elastic_scaling_policy
    elastic_trainer -> _count_possible_workers: a dict by node (2.60), a list (2.59) -> \
        test_contract_count_possible_workers_reservation
    elastic_trainer -> DataParallelTrainer._initialize_and_run_controller -> \
        test_contract_initialize_and_run_controller
    elastic_trainer -> ScalingConfig._resources_per_worker_not_none -> test_contract_resources_per_worker_not_none
    _patch_haproxy_templates -> haproxy_templates.HAPROXY_CONFIG_TEMPLATE text -> test_contract_haproxy_template_text
    _patch_haproxy_templates -> ray.serve._private.haproxy's copy of the template -> \
        test_contract_haproxy_module_copies_template
    _bind_replica_grpc_to_node -> replica.add_port_to_grpc_server(server, "[::]:0") -> \
        test_contract_replica_add_port_to_grpc_server
    _bind_replica_grpc_to_node -> ray._common.network_utils.build_address -> test_contract_build_address
    ask_gcs -> grpc_authentication_client_interceptor._get_authentication_metadata_tuple -> \
        test_contract_authentication_metadata
    ask_gcs -> NodeInfoGcsService.GetClusterId(GetClusterIdRequest) -> test_contract_gcs_get_cluster_id

Ray internals other modules name by value (no import of a private name; pinned all the same):

    session.set_placement_timeout -> RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, propagated -> \
        test_contract_placement_timeout_env
    standin_cluster.HEAD_NODE_ID -> fake_multi_node.node_provider.FAKE_HEAD_NODE_ID -> test_contract_fake_head_node_id
    standin_cluster.JOB_SUBMIT_ENV -> RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES -> \
        test_contract_runtime_env_default_excludes
    standin_cluster.RAY_WORKER_PORTS -> ray start --min-worker-port/--max-worker-port defaults -> \
        test_contract_ray_start_worker_ports
    session.of_type -> the head's resource node:__internal_head__ -> test_contract_internal_head_resource
    local_settings.local_train_settings -> RAY_TRAIN_ENABLE_PREEMPTION_WATCHER (propagated), \
        RAY_TRAIN_METRICS_ENABLED (read by the driver) -> test_contract_local_train_switches
    tune.trial.stop_train_run -> the Train controller actor's abort() -> test_contract_train_controller_abort
    tracking.callback.EpochMetricsLogger -> DeveloperAPIs UserCallback, TuneReportCallback, list_nodes -> \
        test_contract_developer_apis
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any


def autoscaler_node_groups() -> list[tuple[str, dict[str, float], int]] | None:
    """The node groups the cluster's autoscaler may start, as Ray's GCS holds them (KubeRay's worker groups, the
    autoscaler v2): ``(name, resources per node, max_count)``, ``max_count`` -1 for no limit. None where the GCS holds
    no cluster config (the autoscaler v1 keeps its config in a file on the head)."""
    # Private: Ray publishes the cluster config only through GlobalState.get_cluster_config (ray._private.state),
    # which Ray Data's own autoscaler reads the same way. The public ray.autoscaler.sdk asks for resources but does
    # not list node types, and the State API (ray.util.state) lists the nodes that exist, not those that may be added.
    import ray._private.state

    try:
        config = ray._private.state.state.get_cluster_config()
    except Exception:  # an older GCS, or a Ray Client driver (no GCS accessor here): no config to read
        return None
    if config is None or not config.node_group_configs:
        return None
    return [(g.name, {k: float(v) for k, v in g.resources.items()}, int(g.max_count))
            for g in config.node_group_configs]


@contextlib.contextmanager
def loopback_node() -> Iterator[dict[str, str]]:
    """While the block runs, a Ray that ``ray.init`` starts on this machine is a node on the loopback address: the
    ``ray.init`` arguments to pass are yielded. Its GCS, raylet, object manager, workers, dashboard and agents
    then listen on 127.0.0.1 only (Ray 2.60 binds a node's servers to 127.0.0.1 when that is its node IP, and to
    every interface otherwise), so nothing of it can be reached from the network."""
    # Private: ray.init(_node_ip_address="127.0.0.1") alone is not enough: ray.init (and `ray start`) turn a loopback
    # node IP into this machine's network address (ray._private.services.resolve_ip_for_localhost) unless Ray runs
    # without multi-node clusters, as on macOS and Windows: ray._private.ray_constants.ENABLE_RAY_CLUSTER, read once
    # from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when Ray is imported (before this runs), so the constant is set for the
    # call. The node's processes get the node IP on their command lines and bind to it; nothing else reads it.
    import ray._private.ray_constants as constants

    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield {"_node_ip_address": "127.0.0.1", "dashboard_host": "127.0.0.1"}
    finally:
        constants.ENABLE_RAY_CLUSTER = before


#: Rank 0's rendezvous store (and its listening socket) of the process group of this worker process, kept for as
#: long as the process lives (:func:`open_loopback_store`).
_LOOPBACK_STORE: list[Any] = []


def open_loopback_store(world_size: int, timeout_s: float) -> int:
    """On rank 0: PyTorch's rendezvous store (a TCPStore server) for a process group of ``world_size`` ranks,
    listening on 127.0.0.1 alone; returns its port. (A TCPStore that PyTorch opens itself listens on every
    interface, whatever host it is given: ``master_listen_fd`` is how it takes a socket bound elsewhere.)"""
    import datetime
    import socket

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False, master_listen_fd=sock.fileno())
    _LOOPBACK_STORE[:] = [store, sock]
    return port


def use_loopback_store(port: int) -> None:
    """On every rank: ``env://`` rendezvous at 127.0.0.1:``port`` as a client of the store
    :func:`open_loopback_store` opened on rank 0 (PyTorch's TORCHELASTIC_USE_AGENT_STORE: every rank a client, no
    rank opens a store of its own)."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"})


def loopback_torch_config() -> Any:
    """A ``ray.train.torch.TorchConfig`` for a Ray whose nodes are all on the loopback address (the local Ray a
    command starts, :func:`loopback_node`): the workers' process group meets through a rendezvous store that
    listens on 127.0.0.1 only (:func:`open_loopback_store`), so nothing of a training run can be reached from the
    network. The backend (gloo, or NCCL on GPUs) and the rest of the setup are Ray Train's own."""
    # Private: Ray Train's torch backend (ray.train.torch.config._TorchBackend) has rank 0 pick an address and port
    # and every rank call torch.distributed.init_process_group, where rank 0's TCPStore binds every interface; no
    # setting of Ray's or PyTorch's binds it elsewhere. TorchConfig.backend_cls is the one place to put another
    # setup; it reuses Ray's _setup_torch_process_group (NCCL's error handling) and _set_torch_distributed_env_vars.
    import ray
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group, _TorchBackend

    class LoopbackTorchBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            gpus = worker_group.get_resources_per_worker().get("GPU", 0)
            backend = backend_config.backend or ("nccl" if gpus > 0 else "gloo")
            size, timeout_s = len(worker_group), backend_config.timeout_s
            port = worker_group.execute_single(0, open_loopback_store, size, timeout_s)
            worker_group.execute(use_loopback_store, port)
            worker_group.execute(_set_torch_distributed_env_vars)
            ray.get([worker_group.execute_single_async(rank, _setup_torch_process_group, backend=backend,
                                                       world_rank=rank, world_size=size, init_method="env://",
                                                       timeout_s=timeout_s)
                     for rank in range(size)])

    class LoopbackTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> type:
            return LoopbackTorchBackend

    return LoopbackTorchConfig()


def local_gpus() -> int:
    """How many GPUs a Ray started on this machine would have: those Ray detects, at most those
    CUDA_VISIBLE_DEVICES (or the like) shows this process."""
    # Private: Ray counts a new node's GPUs with its accelerator managers (ray._private.accelerators, as
    # ray._private.resource_and_label_spec does when ray.init starts a node); no public API says what a Ray not yet
    # started would find, and asking torch means importing it (seconds) before a refusal.
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource("GPU")
    if manager is None:
        return 0
    count = manager.get_current_node_num_accelerators()
    visible = manager.get_current_process_visible_accelerator_ids()
    return min(count, len(visible)) if visible is not None else count


def in_local_train_mode() -> bool:
    """True inside a Ray Train loop that runs in local mode (``ScalingConfig(num_workers=0)``: in this process, with
    no workers and no controller)."""
    # DeveloperAPI outside ray.train: local mode shows only in the class of ray.train.get_context(), LocalTrainContext
    # (ray.train.v2.api.context), which ray.train does not export; every public TrainContext method answers the same
    # in local mode as for one real worker (world size 1, rank 0).
    import ray.train
    from ray.train.v2.api.context import LocalTrainContext

    return isinstance(ray.train.get_context(), LocalTrainContext)


def preemption_notice() -> Any:
    """This Ray Train worker's own view of a preemption notice: Ray's ``PreemptionInfo`` (``deadline_ms``,
    ``preempted_node_to_ranks``) once a node of the worker group is being drained for preemption, else None; None in
    local mode. Unlike ``ray.train.get_preemption_info()`` it is no barrier: each rank reads its own copy, and the
    caller agrees on it with the others in a collective it runs anyway (:mod:`nre_ray.run.elastic`)."""
    # Private: ray.train.get_preemption_info() is the public reading, but it is a barrier through Ray Train's
    # synchronization actor (a Ray call from every rank) each time it is asked, which costs more than a small step of
    # training if asked at every step. Ray's preemption watcher hands the same PreemptionInfo to every worker
    # (RayTrainWorker.mark_preempt), which keeps it in the internal train context's preemption_context
    # (ray.train.v2._internal.execution.context), where get_preemption_info reads it before broadcasting rank 0's.
    if in_local_train_mode():
        return None
    from ray.train.v2._internal.execution.context import get_train_context

    return get_train_context().preemption_context.preemption_info


def function_trainable(function: Callable[..., Any], name: str) -> type:
    """The trainable class Tune makes of ``function``, to subclass: its ``cleanup`` runs in the trial's process when
    Tune stops the trial."""
    # DeveloperAPI: Tune turns a function into its FunctionTrainable class inside the Tuner; wrap_function
    # (ray.tune.trainable.function_trainable) is the only way to that class, and a function trainable has no public
    # hook that runs in the trial's process when Tune stops it.
    from ray.tune.trainable.function_trainable import wrap_function

    return wrap_function(function, name=name)


def trial_statuses(grid: Any) -> dict[str, str]:
    """Tune's status of each trial of the ``ResultGrid`` a ``Tuner.fit()`` returned (``TERMINATED``, ``ERROR``,
    ``PENDING``, ``RUNNING``, ``PAUSED``), by trial id."""
    # Private: a ResultGrid gives each trial's result and error but not its status, so an interrupted sweep's
    # unfinished trials cannot be told from finished ones; the Tuner's own trials sit in grid._experiment_analysis.
    # The public tune.ExperimentAnalysis(grid.experiment_path) would read them back from storage (an object store on
    # a cluster), not from the run that just ended.
    return {t.trial_id: t.status for t in grid._experiment_analysis.trials}


def train_callback_bases() -> tuple[type, ...]:
    """Ray Train's controller callback classes with hooks for the worker group (its start, the training function's
    start on it), for the controller's state changes (a failure, a restart) and for each registered report; () on a
    Ray without them."""
    # Private: the public ray.train.UserCallback hears only of reports and errors, not of the worker group or of what
    # the controller decides after a failure. These are the DeveloperAPI classes of
    # ray.train.v2._internal.execution.callback, which Ray Train does not export.
    try:
        from ray.train.v2._internal.execution.callback import (
            ControllerCallback,
            ReportCallback,
            WorkerGroupCallback,
        )
    except ImportError:
        return ()
    return (WorkerGroupCallback, ControllerCallback, ReportCallback)


def failure_of(state: Any) -> tuple[Exception, bool] | None:
    """The training failure a Ray Train controller state follows, and whether the run goes on after it: ``(error,
    True)`` when the controller starts the worker group again, ``(error, False)`` when it stops the run; None for
    every other state."""
    # Private: the controller's states (ray.train.v2._internal.execution.controller.state) are what
    # ControllerCallback.after_controller_state_update hands over; a restart carries its error only there.
    from ray.train.v2._internal.execution.controller.state import (
        ErroredState,
        ReschedulingState,
        RestartingState,
        ShuttingDownState,
    )

    if isinstance(state, RestartingState | ReschedulingState):
        return state.training_failed_error, True
    if isinstance(state, ShuttingDownState) and isinstance(state.next_state, ErroredState):
        return state.next_state.training_failed_error, False
    return None


def worker_places(worker_group: Any) -> dict[int, tuple[str, str, int]]:
    """Where each worker of a started Ray Train worker group runs: ``{world rank: (node id, node IP, pid)}``."""
    # Private: the worker group's Worker objects (ray.train.v2._internal.execution.worker_group) are what
    # WorkerGroupCallback.after_worker_group_start hands over; their metadata is the only record of where each rank
    # runs once a worker has died.
    places = {}
    for index, worker in enumerate(worker_group.get_workers()):
        context = worker.distributed_context
        rank = context.world_rank if context is not None else index
        places[rank] = (worker.metadata.node_id, worker.metadata.node_ip, int(worker.metadata.pid))
    return places


#: The raylet's warning that a node has started many Python worker processes ("which is 4x the maximum expected
#: startup concurrency"). A sweep's trial drivers and Train controllers are many small actors by design, so it comes
#: with every sweep; it stays in Ray's log of that raylet (``logs/raylet.out`` in Ray's session folder).
WORKER_POOL_WARNING = "worker processes have been started on node"
#: What ``serve.shutdown()`` makes Ray report to its caller (``(raylet) Task ServeController.graceful_shutdown failed.
#: There are infinite retries remaining, so the task will be retried. Error: The actor is dead because it was killed
#: by `ray.kill`.``): Serve's graceful_shutdown waits until its controller is killed, by design, and Serve then
#: takes the controller's death as the end of the shutdown (ray.serve._private.client.ServeControllerClient.shutdown).
#: ``python -m nre_ray.serve`` printed it on every Ctrl-C.
SERVE_SHUTDOWN_RETRY = "Task ServeController.graceful_shutdown failed"
#: The raylets' messages kept off a driver's console (:func:`keep_ray_notices_off_console`).
OFF_CONSOLE = (WORKER_POOL_WARNING, SERVE_SHUTDOWN_RETRY)


def keep_ray_notices_off_console() -> None:
    """Keep the raylets' :data:`OFF_CONSOLE` messages and Ray's autoscaler tip off this driver's console (and so out
    of a job's log); the raylets' other messages and the autoscaler's events still show."""
    _drop_raylet_messages()
    _skip_autoscaler_tip()


def _drop_raylet_messages() -> None:
    # Private: the driver prints what the raylets report to it (GCS error messages) from the thread of
    # ray._private.worker.listen_error_messages, through that module's print_to_stdstream, whatever log_to_driver
    # says, and Ray has no setting to leave one message out (ray-project/ray#63800). The workers' own output goes
    # through a reference taken when Ray connects, so wrapping the module's function touches only these messages.
    import ray._private.worker as ray_worker

    show = ray_worker.print_to_stdstream
    if getattr(show, "drops", None) == OFF_CONSOLE:
        return

    def show_but_these(data: dict, ignore_prefix: bool) -> None:
        lines = [line for line in data.get("lines", []) if not any(known in line for known in OFF_CONSOLE)]
        if lines:
            show({**data, "lines": lines}, ignore_prefix)

    show_but_these.drops = OFF_CONSOLE  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = show_but_these


def _skip_autoscaler_tip() -> None:
    # Private: the driver prints "Tip: use `ray status` to view detailed cluster status. To disable these messages,
    # set RAY_SCHEDULER_EVENTS=0." before the first autoscaler event it forwards, once per process, unless
    # ray._private.worker.autoscaler_log_fyi_printed says it has (filter_autoscaler_events). The setting the tip
    # names drops the events themselves, which the console keeps on purpose.
    import ray._private.worker as ray_worker

    ray_worker.autoscaler_log_fyi_printed = True


def worker_death(error: Exception) -> Exception:
    """The error of a Ray Train worker's own death (a ``RayActorError``: the process or its node gone) inside the
    error Ray Train reports for that worker; ``error`` itself when it wraps none."""
    # Private: Ray Train reports a dead worker as a WorkerHealthCheckFailedError
    # (ray.train.v2._internal.exceptions) that holds Ray's RayActorError in health_check_failure, as Ray Train's own
    # failure policy reads it (ray.train.v2._internal.execution.worker_group.poll._is_preempted_actor).
    return getattr(error, "health_check_failure", None) or error


@contextlib.contextmanager
def ray_output_to(log: Any) -> Iterator[None]:
    """While the block runs, what Ray forwards to this driver from its processes (the workers' and actors' output and
    tracebacks, the raylets' and the GCS's messages) goes to ``log`` (``log.write(text, source)``: a
    :class:`nre_ray.core.console.RunLog`) instead of the console; the autoscaler's events (nodes added or removed) stay
    on the console."""
    # Private: the driver prints every forwarded batch through ray._private.worker.print_worker_logs (from the
    # log_to_driver thread and from listen_error_messages), looked up at each call. Ray has no setting that sends
    # them elsewhere: log_to_driver=False drops the workers' output and still prints the raylets' messages.
    import ray._private.worker as ray_worker

    show = ray_worker.print_worker_logs

    def to_log(data: dict, print_file: Any, ignore_prefix: bool = False) -> None:
        if data.get("pid") == "autoscaler":
            show(data, print_file, ignore_prefix)
        else:
            log.write("\n".join(data.get("lines", [])), _ray_source(data))

    ray_worker.print_worker_logs = to_log
    try:
        yield
    finally:
        ray_worker.print_worker_logs = show


def _ray_source(data: dict) -> str:
    """Where a forwarded batch comes from, as Ray prefixes it on a console: ``RayTrainWorker pid=123, ip=10.0.0.2``,
    ``raylet``."""
    pid = data.get("pid")
    name = data.get("actor_name") or data.get("task_name")
    where = f"{name} pid={pid}" if name else (f"pid={pid}" if str(pid).isdigit() else str(pid))
    ip = data.get("ip")
    return where + (f", ip={ip}" if ip and ip != data.get("localhost") else "")


def standin_node_provider() -> type:
    """Ray's ``fake_multinode`` node provider (each node a set of raylet processes on this host) whose nodes keep
    their runtime environments in a folder of their own, leave log forwarding to the head's log monitor, and are no
    longer listed once their raylet is gone (see :mod:`nre_ray.cluster.provider`)."""
    # Private: node providers are the autoscaler's private interface (ray.autoscaler._private), and the fake_multinode
    # provider builds each node's RayParams itself, in _create_node_with_resources_and_labels, through the module
    # attribute ray._private.parameter.RayParams: no argument reaches them, so the attribute is swapped for that call.
    import ray._private.parameter as parameter
    from ray._private.ray_constants import PROCESS_TYPE_RAYLET
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    class StandinNodeProvider(FakeMultiNodeProvider):
        """``FakeMultiNodeProvider`` whose nodes keep their runtime environments in ``runtime_resources_<node>`` and
        start no log monitor of their own."""

        def _create_node_with_resources_and_labels(self, node_config: dict, tags: dict, count: int,
                                                   resources: dict, labels: dict) -> None:
            original = parameter.RayParams

            def ray_params(*args: Any, **kwargs: Any) -> Any:
                node_id = kwargs.get("env_vars", {}).get("RAY_OVERRIDE_NODE_ID_FOR_TESTING", "node")
                kwargs.setdefault("runtime_env_dir_name", f"runtime_resources_{node_id[-5:]}")
                # The head's log monitor already follows every log file of the shared session folder: a second one
                # per node would print each worker line again.
                kwargs.setdefault("include_log_monitor", False)
                return original(*args, **kwargs)

            with self.lock:  # the swap holds for this call only
                parameter.RayParams = ray_params
                try:
                    super()._create_node_with_resources_and_labels(node_config, tags, count, resources, labels)
                finally:
                    parameter.RayParams = original

        def non_terminated_nodes(self, tag_filters: dict) -> list[str]:
            # A node whose raylet is gone (kill-node, preempt-node: the machine lost) is listed no more, as a cloud
            # lists a reclaimed instance as terminated. Ray's provider kept it: the autoscaler counted its CPUs
            # towards a resource request (an elastic run's, which asks for MAX workers) and never replaced it.
            with self.lock:
                for node_id, entry in list(self._nodes.items()):
                    if "node" in entry and not any(kind == PROCESS_TYPE_RAYLET
                                                   for kind, _ in entry["node"].live_processes()):
                        del self._nodes[node_id]
            return super().non_terminated_nodes(tag_filters)

    return StandinNodeProvider


def drain_for_preemption(node_id: str, deadline_s: float, address: str | None = None,
                         message: str = "preempted") -> None:
    """Tell Ray that node ``node_id`` (hex) will be taken away in ``deadline_s`` seconds, as a cloud takes back a
    spot instance: a drain with reason ``DRAIN_NODE_REASON_PREEMPTION`` and that deadline. Ray schedules nothing new
    there, and Ray Train's preemption watcher passes the notice to the run's workers
    (``ray.train.get_preemption_info()``), which save a just-in-time checkpoint. The node is not stopped: the caller
    stops it (or the cloud does) at the deadline. ``address``: the GCS (``host:port``); default the Ray this process
    is connected to. Raises ``ValueError`` for a bad node id or deadline, ``RuntimeError`` when Ray refuses the
    drain.
    """
    # Private: Ray's only ways to send a preemption drain are the hidden CLI `ray drain-node` (its interface outside
    # Ray's stability guarantees, and a process per call) and what that CLI calls, the GCS client's drain_node
    # (ray._raylet.GcsClient) with the DrainNodeReason enum of ray.core.generated.autoscaler_pb2. The public
    # ray.autoscaler.sdk drains nothing. The GCS accepts a drain of a node it does not know (taken for one gone).
    import re
    import time

    import ray
    import ray._private.worker
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    if deadline_s < 0:
        raise ValueError(f"the drain deadline must be 0 or more seconds, not {deadline_s}")
    if not re.fullmatch(f"[0-9a-f]{{{2 * ray.NodeID.size()}}}", node_id) or node_id == ray.NodeID.nil().hex():
        raise ValueError(f"not a Ray node id: {node_id!r} (the hex id `ray list nodes` shows)")
    if address is None:
        if not ray.is_initialized():
            raise RuntimeError("drain_for_preemption needs the GCS address, or a connected Ray (ray.init)")
        client = ray._private.worker.global_worker.gcs_client
    else:
        client = GcsClient(address=address)
    deadline_ms = time.time_ns() // 1_000_000 + int(deadline_s * 1000)
    accepted, refusal = client.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                          message, deadline_ms)
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id}: {refusal}")


def load_drain_modules() -> None:
    """Import now what :func:`drain_for_preemption` imports (Ray's GCS client, its protobufs), so that a drain asked
    for later (a spot interruption notice, with its deadline running) does not first wait for Ray's modules to load."""
    # Private: the modules are ray._raylet (GcsClient) and ray._private.worker, which drain_for_preemption uses.
    import ray._private.worker  # noqa: F401
    from ray._raylet import GcsClient  # noqa: F401
    from ray.core.generated import autoscaler_pb2  # noqa: F401


def draining_nodes(address: str | None = None) -> dict[str, float]:
    """The nodes being drained, as the GCS at ``address`` (default: of the Ray this process is connected to) says:
    ``{node id (hex): deadline (Unix seconds), or 0.0 for a drain without one}``."""
    # Private: the GCS lists draining nodes only through its client (ray._raylet.GcsClient.get_draining_nodes, Ray
    # 2.60) and its global state accessor (ray._private.state.GlobalState.get_draining_nodes, which Ray Train's own
    # preemption watcher reads); no public API shows a drain. Ray 2.59's GcsClient has no get_draining_nodes: there
    # the accessor is asked, the connected Ray's (ray._private.state.state) or one made for ``address`` as Ray's
    # services.wait_for_node makes it.
    import ray._private.state
    import ray._private.worker
    from ray._raylet import GcsClient, GcsClientOptions

    client = GcsClient(address=address) if address else ray._private.worker.global_worker.gcs_client
    ask = getattr(client, "get_draining_nodes", None)
    if ask is not None:
        drains = ask()
    elif address is None:
        drains = ray._private.state.state.get_draining_nodes()
    else:
        state = ray._private.state.GlobalState()
        state._initialize_global_state(GcsClientOptions.create(address, None, allow_cluster_id_nil=True,
                                                               fetch_cluster_id_if_nil=False))
        try:
            drains = state.get_draining_nodes()
        finally:
            state.disconnect()
    return {node.hex() if isinstance(node, bytes) else str(node): deadline_ms / 1000
            for node, deadline_ms in drains.items()}


def alive_nodes(gcs_address: str | None = None) -> dict[str, str]:
    """The nodes now alive in the Ray cluster of ``gcs_address`` (default: the Ray this process is connected to):
    node id (hex) -> its IP address."""
    # Private: the public State API (ray.util.state.list_nodes) asks the dashboard, which a node's own processes
    # cannot count on (it may be disabled or unreachable); the GCS client is what Ray's CLI uses to reach the GCS.
    import ray._private.worker
    import ray._raylet
    from ray.core.generated import gcs_pb2

    client = ray._raylet.GcsClient(address=gcs_address) if gcs_address else ray._private.worker.global_worker.gcs_client
    nodes = client.get_all_node_info()
    return {node_id.hex(): info.node_manager_address for node_id, info in nodes.items()
            if info.state == gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE}


def schedulable_nodes(gcs_address: str | None = None) -> set[str]:
    """The nodes that can take new work now: alive and not being drained (hex ids), as the GCS at ``gcs_address``
    (default: of the Ray this process is connected to) says."""
    # Private: through draining_nodes and alive_nodes (the GCS client), for the reasons they give.
    return set(alive_nodes(gcs_address)) - set(draining_nodes(gcs_address))


@functools.cache
def elastic_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` (``TorchTrainer``) whose elastic runs size a worker group from the nodes that can take it:
    alive and not being drained (:func:`schedulable_nodes`). Ray Train's own elastic policy counts every node its
    autoscaling coordinator has reserved for the run; after a preemption that includes the node being taken back,
    which is still alive until its deadline (and counted up to the coordinator's next refresh, 20 s, after it is
    gone), so the restart asks for a worker on a node that takes no new work and waits out a whole placement timeout
    before it tries with fewer. Sized without it, the run goes on at once with the workers the other nodes hold, and
    grows back when a node arrives. Fractional shares are counted without Ray's float error (see below). A running
    group is never shrunk for a drain: Ray Train's preemption path stops it once the workers have heard of the
    notice (and saved their just-in-time checkpoint). Fixed-size runs are left as they are."""
    # Private: the scaling policy (ray.train.v2._internal.execution.scaling_policy.ElasticScalingPolicy) has no
    # public setting for which nodes count: the trainer makes it (create_scaling_policy) in fit() and hands it to
    # the controller actor through DataParallelTrainer._initialize_and_run_controller, the one place to swap it.
    # Its _count_possible_workers turns the coordinator's per-node reservation into a worker count. Ray 2.60 keeps
    # the reservation by node id (a dict), so the nodes that cannot take work are left out before counting; Ray 2.59
    # passes a list of per-node reservations without their ids (its coordinator's get_reserved_resources), which is
    # counted as Ray counts it, every node in, with only the float correction below. The classes are made here
    # so that Ray is imported only when a trainer is built; the controller receives the policy by value
    # (cloudpickle), and schedulable_nodes by reference to this module.
    import logging
    import time

    from ray.train.v2._internal.execution.scaling_policy import (
        ElasticScalingPolicy,
        NoopDecision,
        ResizeDecision,
    )

    logger = logging.getLogger("ray.train")

    class SchedulableNodesPolicy(ElasticScalingPolicy):
        """Ray Train's elastic policy, counting only the nodes that can take new work."""

        #: Seconds a reading of the nodes is reused: the controller asks at every turn of its loop while it waits.
        NODES_INTERVAL_S = 1.0
        #: The GCS to ask (None: the Ray of the controller's process).
        gcs_address: str | None = None

        def __init__(self, scaling_config: Any) -> None:
            super().__init__(scaling_config)
            self._nodes: set[str] | None = None
            self._nodes_read = float("-inf")

        def _schedulable(self) -> set[str] | None:
            if time.monotonic() - self._nodes_read >= self.NODES_INTERVAL_S:
                try:
                    self._nodes = schedulable_nodes(self.gcs_address)
                except Exception:  # the GCS did not answer: count as Ray would, with every reserved node
                    logger.warning("could not read the cluster's nodes; counting every reserved node", exc_info=True)
                    self._nodes = None
                self._nodes_read = time.monotonic()
            return self._nodes

        def _count_possible_workers(self, reserved_resources: dict | list) -> int:
            # Ray floors each node's reservation over a worker's share, in floats: 3 workers of 0.66 CPU reserve
            # 1.98 CPUs, which count as 2 workers (1.98 // 0.66), and a run of 3-3 workers waited forever. A
            # millionth of a worker's share more counts them as 3.
            per_worker = self.scaling_config._resources_per_worker_not_none

            def nudge(r: dict) -> dict:
                return {k: v + 1e-6 * per_worker.get(k, 0.0) for k, v in r.items()}

            if not isinstance(reserved_resources, dict):  # Ray 2.59: a list, no node ids to leave a node out by
                return super()._count_possible_workers([nudge(r) for r in reserved_resources])
            usable = self._schedulable()
            if usable is not None:
                reserved_resources = {node: r for node, r in reserved_resources.items() if node in usable}
            return super()._count_possible_workers({node: nudge(r) for node, r in reserved_resources.items()})

        def make_decision_for_running_worker_group(self, worker_group_state: Any, worker_group_status: Any) -> Any:
            decision = super().make_decision_for_running_worker_group(worker_group_state, worker_group_status)
            if isinstance(decision, ResizeDecision) and decision.num_workers < worker_group_state.num_workers:
                return NoopDecision()  # a node of the group being drained: the preemption path restarts it
            return decision

    class Trainer(trainer_cls):
        """The trainer, its elastic runs sized on the nodes that can take new work."""

        scaling_policy = SchedulableNodesPolicy

        def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
            policy = controller_init_kwargs.get("scaling_policy")
            if type(policy) is ElasticScalingPolicy:
                controller_init_kwargs["scaling_policy"] = SchedulableNodesPolicy(policy.scaling_config)
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    return Trainer


#: How Ray Serve 2.60's HAProxy reuses connections to replicas, and what the ingress of ``python -m nre_ray.serve``
#: puts in its place (:func:`serve_setup`): "safe" reuse, and a replica's answer held until its body is whole (at
#: most 10 s), so that a replica killed between its headers and its body gives HAProxy's clean 500, not a 200's
#: headers with no body after them (a client got the headers of an 84-byte answer and no body).
#:
#: Why: with Serve's ``http-reuse always`` a client's first request may go out on a connection another client left
#: idle, and when the server fails on a reused connection HAProxy closes the client's connection silently, as a
#: keep-alive server does, leaving the retry to the client (measured: 2 of 160 one-request connections closed
#: without an answer when a replica of two was SIGKILLed under 4 clients, in each of 9 runs; with ``safe``, 2 clean
#: 500s and no close in each of 2 runs). ``retry-on empty-response`` (``RAY_SERVE_HAPROXY_RETRY_ON``) did not change
#: that, and Serve has no setting for the reuse mode (ray 2.60).
HAPROXY_REUSE = ("http-reuse always", "http-reuse safe\n    http-response wait-for-body time 10s")
#: Where Ray Serve 2.60's HAProxy serves its Prometheus metrics and its statistics page (every interface), and where
#: :func:`serve_setup` puts them: on the address of Serve's HTTP frontend, the ``--host`` the user chose.
HAPROXY_BINDS = (("bind :{{ config.metrics_port }}", "bind {{ config.frontend_host }}:{{ config.metrics_port }}"),
                 ("bind *:{{ config.stats_port }}", "bind {{ config.frontend_host }}:{{ config.stats_port }}"))
_HAPROXY_TEMPLATES = "ray.serve._private.haproxy_templates"
_REPLICA = "ray.serve._private.replica"


def serve_setup() -> None:
    """The worker process setup hook (``runtime_env={"worker_process_setup_hook": ...}``) of ``python -m
    nre_ray.serve`` on a local Ray it starts: it runs in every worker of the job, Serve's controller, proxies and
    replicas included, and costs nothing there until Serve loads the modules it changes.

    - HAProxy's statistics page and Prometheus metrics listen on the address the user chose (``--host``, Serve's
      HTTP frontend), not on every interface (:data:`HAPROXY_BINDS`);
    - each replica's gRPC server for calls between deployments listens on the node's address (127.0.0.1 on a local
      Ray: :func:`loopback_node`), not on every interface;
    - HAProxy opens a connection of its own to a replica for the first request of each client connection
      (``http-reuse safe``), so that a replica that dies under a request gives that client a clean HTTP 500, not a
      connection closed without an answer, and forwards a replica's answer only once its body has come
      (:data:`HAPROXY_REUSE`).

    Private: the HAProxy configuration comes from a module constant of ``ray.serve._private`` (a Jinja template),
    and the replica binds ``[::]:0`` in its code (``ray.serve._private.replica``, through the module's name
    ``add_port_to_grpc_server``); Serve 2.60 has no setting for any of these. When another Ray no longer has what is
    replaced, nothing is changed."""
    _when_loaded(_HAPROXY_TEMPLATES, _patch_haproxy_templates)
    _when_loaded(_REPLICA, _bind_replica_grpc_to_node)


def _patch_haproxy_templates(module: Any) -> None:
    """Rewrite the HAProxy template of ``module`` (the templates module, and Serve's HAProxy module, which copied
    it when imported): :data:`HAPROXY_REUSE` and :data:`HAPROXY_BINDS`."""
    import sys

    for target in (module, sys.modules.get("ray.serve._private.haproxy")):
        template = getattr(target, "HAPROXY_CONFIG_TEMPLATE", None)
        if isinstance(template, str):
            for old, new in (HAPROXY_REUSE, *HAPROXY_BINDS):
                template = template.replace(old, new)
            target.HAPROXY_CONFIG_TEMPLATE = template


def _bind_replica_grpc_to_node(module: Any) -> None:
    """Make the replica module bind its gRPC server for calls between deployments to the node's address instead of
    every interface (``[::]:0``)."""
    original = getattr(module, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "on_node_address", False):
        return

    def add_port_on_node_address(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            import ray
            from ray._common.network_utils import build_address

            address = build_address(ray.util.get_node_ip_address(), int(address[len("[::]:"):]))
        return original(server, address)

    add_port_on_node_address.on_node_address = True  # type: ignore[attr-defined]
    module.add_port_to_grpc_server = add_port_on_node_address


def _when_loaded(name: str, patch: Callable[[Any], None]) -> None:
    """Run ``patch(module)`` on the module ``name`` now if it is loaded, else as soon as it is: an import hook that
    finds nothing itself and wraps the module's loader once."""
    import importlib.abc
    import importlib.util
    import sys

    if name in sys.modules:
        patch(sys.modules[name])
        return

    class PatchOnLoad(importlib.abc.MetaPathFinder):
        """Finds nothing itself; wraps the loader of the module ``name`` so that it is patched once loaded."""

        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)  # once, and not for the lookup below
            spec = importlib.util.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module: Any) -> None:
                    run(module)
                    patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, PatchOnLoad())


def ask_gcs(host: str, port: int, timeout: float) -> tuple[str, str]:
    """Ask the Ray GCS at ``host``:``port`` for its cluster id: one gRPC call with a deadline of ``timeout`` seconds,
    carrying this process's Ray token as ``ray.init`` would send it (none in ``RAY_AUTH_MODE=disabled``). Returns the
    gRPC status code's name and the server's details: ``("OK", "")``; ``("UNAUTHENTICATED", "InvalidAuthToken:
    ...")`` where the GCS refuses this client's token; ``("UNAVAILABLE", "... Failed parsing HTTP/2 ...")`` where an
    HTTP/1 server answers; ``("DEADLINE_EXCEEDED", ...)`` where something accepts the connection but never answers;
    ``("UNIMPLEMENTED", ...)`` from a gRPC server that is not a GCS (a Ray Client server). Raises Ray's
    ``AuthenticationError`` when this process is in token mode and has no token to send."""
    # Private: ray.init asks the same (NodeInfoGcsService.GetClusterId, from ray.core.generated) through its C++ GCS
    # client, which retries for about 20 s and logs every failure from C++ to the console (gcs_client.cc: "Failed to
    # get cluster ID", InvalidAuthToken), and waits for minutes where the port is not a GCS. No public API asks a GCS
    # with a deadline. The token header is what Ray's own gRPC clients send (its client interceptor's metadata).
    import grpc
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        _get_authentication_metadata_tuple,
    )
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = _get_authentication_metadata_tuple()
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout, metadata=metadata or None)
        except grpc.RpcError as err:
            return err.code().name, err.details() or ""
    return "OK", ""
