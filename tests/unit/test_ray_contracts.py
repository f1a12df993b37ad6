"""Contract tests of the Ray internals nre_ray relies on (issue 36): one test per touchpoint of
nre_ray/cluster/ray_private.py (and the few Ray internals other modules name by value: an environment variable, a
node id), each pinning exactly what nre_ray's code uses (a signature, an attribute, a protobuf field, a template's
text, a message's text), with a message that names the touchpoint and the nre_ray function that depends on it. A
Ray release that changes one fails here, by name, before a run fails somewhere else.

Cheap: imports and source text only; no Ray is started, torch and Ray Serve are not imported (their source is read
as text). The table of touchpoints is ray_private's module docstring ("Touchpoints"); the last tests check that the
table, these tests and ray_private's functions agree, so a new touchpoint without a contract fails.

Where the tested releases differ (Ray 2.59 and 2.60), a test accepts both forms and says which is which.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from nre_ray.cluster import ray_private

RAY_PRIVATE_FILE = Path(ray_private.__file__)


def _package_dir(name: str) -> Path:
    """The folder of the installed top-level package ``name``, found without importing it."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not installed"
    return Path(spec.origin).parent


def _ray_file(relative: str) -> Path:
    return _package_dir("ray") / relative


@cache
def _ray_text(relative: str) -> str:
    """The source of a file of the installed Ray, read without importing it (ray.serve, ray.train.torch import
    Serve's or torch's modules, seconds each)."""
    return _ray_file(relative).read_text(encoding="utf-8")


@cache
def _ray_tree(relative: str) -> ast.Module:
    return ast.parse(_ray_text(relative))


def _ast_def(relative: str, *path: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The definition at ``path`` (a top-level name, then names inside it) in a Ray source file, or None."""
    body: list[ast.stmt] = _ray_tree(relative).body
    found: Any = None
    for name in path:
        found = next((node for node in body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                      and node.name == name), None)
        if found is None:
            return None
        body = found.body
    return found


def _ast_params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _ray_source(relative: str, *path: str) -> str:
    """The source text of the definition at ``path`` in a Ray source file, as Ray ships it: not the live object,
    which an earlier test in this process may have wrapped (ray_private's console filters replace
    ``print_to_stdstream`` for the process once a command has run in it)."""
    node = _ast_def(relative, *path)
    assert node is not None, f"{'.'.join(path)} is not in ray/{relative}"
    return ast.get_source_segment(_ray_text(relative), node) or ""


def _params(function: Callable[..., Any]) -> list[str]:
    """The parameters of ``function``, without the ``_ray_trace_ctx`` that Ray adds to an actor class's methods
    once the class has been made an actor in this process (its tracing hook)."""
    return [name for name in inspect.signature(function).parameters if name != "_ray_trace_ctx"]


@cache
def _binary(relative: str) -> bytes:
    return _ray_file(relative).read_bytes()


def _has_method(cls: type, name: str, params: list[str]) -> bool:
    """``cls`` has the method ``name`` whose parameters start with ``params``."""
    method = getattr(cls, name, None)
    return callable(method) and _params(method)[:len(params)] == params


# ---------------------------------------------------------------- autoscaler_node_groups

def test_contract_state_get_cluster_config() -> None:
    import ray._private.state

    state = getattr(ray._private.state, "state", None)
    assert isinstance(state, ray._private.state.GlobalState), \
        "ray_private.autoscaler_node_groups relies on ray._private.state.state (a GlobalState)"
    assert _has_method(ray._private.state.GlobalState, "get_cluster_config", ["self"]) and \
        len(_params(ray._private.state.GlobalState.get_cluster_config)) == 1, \
        "ray_private.autoscaler_node_groups relies on ray._private.state.GlobalState.get_cluster_config(self)"


def test_contract_cluster_config_node_groups() -> None:
    from ray.core.generated import autoscaler_pb2

    assert "node_group_configs" in autoscaler_pb2.ClusterConfig.DESCRIPTOR.fields_by_name, \
        "ray_private.autoscaler_node_groups relies on autoscaler_pb2.ClusterConfig.node_group_configs"
    fields = autoscaler_pb2.NodeGroupConfig.DESCRIPTOR.fields_by_name
    assert {"name", "resources", "max_count"} <= set(fields), \
        "ray_private.autoscaler_node_groups relies on autoscaler_pb2.NodeGroupConfig's name, resources, max_count"
    assert fields["resources"].message_type.GetOptions().map_entry, \
        "ray_private.autoscaler_node_groups relies on NodeGroupConfig.resources being a map (resource -> amount)"


# ---------------------------------------------------------------- loopback_node

def test_contract_enable_ray_cluster() -> None:
    import ray._private.ray_constants as constants

    assert isinstance(getattr(constants, "ENABLE_RAY_CLUSTER", None), bool), \
        "ray_private.loopback_node relies on ray._private.ray_constants.ENABLE_RAY_CLUSTER (a bool)"
    import ray._private.services as services

    assert "not ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address), \
        ("ray_private.loopback_node relies on ray._private.services.get_node_ip_address reading "
         "ray_constants.ENABLE_RAY_CLUSTER at each call (a module attribute, not a name copied at import)")


def test_contract_resolve_ip_for_localhost() -> None:
    import ray._private.services as services

    assert _params(services.resolve_ip_for_localhost) == ["host"], \
        "ray_private.loopback_node relies on ray._private.services.resolve_ip_for_localhost(host)"
    # In a fresh process: in one that has joined a Ray (the session's ray_cluster), Ray answers with that node's IP.
    code = ("import ray._private.services as s; from nre_ray.cluster import ray_private\n"
            "with ray_private.loopback_node() as a: print(s.resolve_ip_for_localhost(a['_node_ip_address']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    kept = done.stdout.strip()
    assert kept == "127.0.0.1", \
        ("ray_private.loopback_node relies on ray._private.services.resolve_ip_for_localhost keeping 127.0.0.1 "
         f"while ENABLE_RAY_CLUSTER is False (it gave {kept!r})")


def test_contract_init_node_ip_address() -> None:
    import ray

    source = inspect.getsource(ray.init)
    assert "dashboard_host" in inspect.signature(ray.init).parameters and \
        '_node_ip_address: str = kwargs.pop("_node_ip_address", None)' in source, \
        "ray_private.loopback_node relies on ray.init(_node_ip_address=..., dashboard_host=...)"
    assert "services.resolve_ip_for_localhost(_node_ip_address)" in _ray_text("_private/worker.py"), \
        ("ray_private.loopback_node relies on ray.init passing _node_ip_address through "
         "ray._private.services.resolve_ip_for_localhost")


# ---------------------------------------------------------------- open_loopback_store, use_loopback_store

def test_contract_tcpstore_master_listen_fd() -> None:
    stub = (_package_dir("torch") / "_C" / "_distributed_c10d.pyi").read_text(encoding="utf-8")
    tcpstore = stub[stub.index("class TCPStore"):]
    tcpstore = tcpstore[:tcpstore.index("\nclass ", 1)]
    for param in ("wait_for_workers", "master_listen_fd", "timeout"):
        assert f"{param}:" in tcpstore, \
            f"ray_private.open_loopback_store relies on torch.distributed.TCPStore(..., {param}=...)"


def test_contract_torchelastic_use_agent_store() -> None:
    source = (_package_dir("torch") / "distributed" / "rendezvous.py").read_text(encoding="utf-8")
    assert 'os.environ.get("TORCHELASTIC_USE_AGENT_STORE", None) == str(True)' in source, \
        ("ray_private.use_loopback_store relies on torch's env:// rendezvous reading "
         "TORCHELASTIC_USE_AGENT_STORE=True (every rank a client of an existing store)")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        assert f'"{name}"' in source, f"ray_private.use_loopback_store relies on torch's env:// reading {name}"


# ---------------------------------------------------------------- loopback_torch_config (source read: no torch)

def test_contract_torch_backend_on_start() -> None:
    on_start = _ast_def("train/torch/config.py", "_TorchBackend", "on_start")
    assert isinstance(on_start, ast.FunctionDef) and \
        _ast_params(on_start) == ["self", "worker_group", "backend_config"], \
        ("ray_private.loopback_torch_config relies on ray.train.torch.config._TorchBackend.on_start(self, "
         "worker_group, backend_config), the method its backend overrides")
    call = "self._backend.on_start(execution_group, self._backend_config)"
    assert call in _ray_text("train/v2/_internal/callbacks/backend_setup.py"), \
        ("ray_private.loopback_torch_config relies on Ray Train V2 calling backend_cls().on_start(execution group, "
         "backend config) (train/v2/_internal/callbacks/backend_setup.py)")


def test_contract_torch_process_group_setup() -> None:
    setup = _ast_def("train/torch/config.py", "_setup_torch_process_group")
    assert isinstance(setup, ast.FunctionDef) and \
        {"backend", "world_rank", "world_size", "init_method", "timeout_s"} <= set(_ast_params(setup)), \
        ("ray_private.loopback_torch_config relies on ray.train.torch.config._setup_torch_process_group(backend, "
         "world_rank, world_size, init_method, timeout_s)")
    env_vars = _ast_def("train/torch/config.py", "_set_torch_distributed_env_vars")
    assert isinstance(env_vars, ast.FunctionDef) and not env_vars.args.args, \
        "ray_private.loopback_torch_config relies on ray.train.torch.config._set_torch_distributed_env_vars()"


def test_contract_torch_config_backend_cls() -> None:
    config = _ast_def("train/torch/config.py", "TorchConfig")
    assert isinstance(config, ast.ClassDef), "ray_private.loopback_torch_config relies on ray.train.torch.TorchConfig"
    fields = {node.target.id for node in config.body if isinstance(node, ast.AnnAssign)
              and isinstance(node.target, ast.Name)}
    assert {"backend", "timeout_s"} <= fields, \
        "ray_private.loopback_torch_config relies on TorchConfig's fields backend and timeout_s"
    backend_cls = _ast_def("train/torch/config.py", "TorchConfig", "backend_cls")
    assert isinstance(backend_cls, ast.FunctionDef) and \
        any(isinstance(d, ast.Name) and d.id == "property" for d in backend_cls.decorator_list), \
        "ray_private.loopback_torch_config relies on TorchConfig.backend_cls being a property (it overrides it)"


def test_contract_execution_group_methods() -> None:
    from ray.train.v2._internal.execution.worker_group import ExecutionGroup

    for name, params in (("get_resources_per_worker", ["self"]), ("execute_single", ["self", "rank", "fn"]),
                         ("execute", ["self", "fn"]), ("execute_single_async", ["self", "rank", "fn"]),
                         ("__len__", ["self"])):
        assert _has_method(ExecutionGroup, name, params), \
            (f"ray_private.loopback_torch_config relies on the worker group's {name}({', '.join(params[1:])}) "
             "(ray.train.v2._internal.execution.worker_group.ExecutionGroup)")


# ---------------------------------------------------------------- local_gpus

def test_contract_accelerator_manager() -> None:
    from ray._private.accelerators import get_accelerator_manager_for_resource

    assert _params(get_accelerator_manager_for_resource) == ["resource_name"], \
        "ray_private.local_gpus relies on ray._private.accelerators.get_accelerator_manager_for_resource(name)"
    manager = get_accelerator_manager_for_resource("GPU")
    assert manager is not None, "ray_private.local_gpus relies on an accelerator manager for 'GPU'"
    for name in ("get_current_node_num_accelerators", "get_current_process_visible_accelerator_ids"):
        assert callable(getattr(manager, name, None)) and _params(getattr(manager, name)) == [], \
            f"ray_private.local_gpus relies on the GPU accelerator manager's {name}() (a static method)"


# ---------------------------------------------------------------- in_local_train_mode, preemption_notice

def test_contract_local_train_context() -> None:
    import ray.train
    from ray.train.v2.api.context import LocalTrainContext

    assert issubclass(LocalTrainContext, ray.train.TrainContext), \
        ("ray_private.in_local_train_mode relies on ray.train.v2.api.context.LocalTrainContext, the class of "
         "ray.train.get_context() in local mode")
    assert "LocalTrainContext(" in _ray_text("train/v2/_internal/execution/train_fn_utils.py"), \
        "ray_private.in_local_train_mode relies on Ray Train's local mode making a LocalTrainContext"


def test_contract_train_context_preemption_info() -> None:
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.preemption import PreemptionContext

    assert _params(context.get_train_context) == [], \
        "ray_private.preemption_notice relies on ray.train.v2._internal.execution.context.get_train_context()"
    assert "preemption_context" in {f.name for f in dataclasses.fields(context.TrainContext)}, \
        "ray_private.preemption_notice relies on the internal TrainContext's preemption_context"
    assert "preemption_info" in {f.name for f in dataclasses.fields(PreemptionContext)}, \
        "ray_private.preemption_notice relies on PreemptionContext.preemption_info"
    assert "preemption_context.preemption_info" in _ray_text("train/v2/_internal/execution/train_fn_utils.py") or \
        "preemption_context.preemption_info" in _ray_text("train/v2/api/context.py"), \
        "ray_private.preemption_notice relies on get_preemption_info reading preemption_context.preemption_info"


# ---------------------------------------------------------------- function_trainable, trial_statuses

def test_contract_wrap_function() -> None:
    from ray.tune.trainable.function_trainable import FunctionTrainable, wrap_function

    assert _params(wrap_function)[:2] == ["train_func", "name"], \
        "ray_private.function_trainable relies on ray.tune.trainable.function_trainable.wrap_function(train_func, name)"
    assert _has_method(FunctionTrainable, "cleanup", ["self"]) and _has_method(FunctionTrainable, "get_state",
                                                                                ["self"]), \
        "nre_ray.tune.trial.trial_trainable relies on FunctionTrainable.cleanup(self) and get_state(self)"
    assert '"last_result": self._last_result' in _ray_text("tune/trainable/trainable.py"), \
        "nre_ray.tune.trial.trial_trainable relies on Trainable.get_state()['last_result']"


def test_contract_result_grid_experiment_analysis() -> None:
    from ray.tune.experiment import Trial

    assert "self._experiment_analysis = experiment_analysis" in _ray_text("tune/result_grid.py"), \
        "ray_private.trial_statuses relies on ray.tune.ResultGrid._experiment_analysis"
    assert "self.trials" in inspect.getsource(__import__("ray.tune", fromlist=["x"]).ExperimentAnalysis.__init__), \
        "ray_private.trial_statuses relies on ExperimentAnalysis.trials"
    assert "trial_id" in inspect.signature(Trial.__init__).parameters and "self.status" in \
        inspect.getsource(Trial.__init__), "ray_private.trial_statuses relies on Trial.trial_id and Trial.status"
    assert [getattr(Trial, n, None) for n in ("TERMINATED", "ERROR", "PENDING", "RUNNING", "PAUSED")] == \
        ["TERMINATED", "ERROR", "PENDING", "RUNNING", "PAUSED"], \
        "ray_private.trial_statuses (nre_ray.tune.results) relies on Tune's trial status names"


# ---------------------------------------------------------------- train_callback_bases, failure_of, worker_places

def test_contract_train_callback_hooks() -> None:
    from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback

    for cls, name, params in ((WorkerGroupCallback, "after_worker_group_start", ["self", "worker_group"]),
                              (WorkerGroupCallback, "after_worker_group_training_start", ["self", "worker_group"]),
                              (ControllerCallback, "after_controller_state_update",
                               ["self", "previous_state", "current_state"]),
                              (ReportCallback, "after_report", ["self", "training_report", "metrics"])):
        assert _has_method(cls, name, params) and len(_params(getattr(cls, name))) == len(params), \
            (f"ray_private.train_callback_bases (nre_ray.tracking.callback.ConsoleEvents) relies on "
             f"{cls.__name__}.{name}({', '.join(params[1:])})")
    report = inspect.signature(ReportCallback.after_report).parameters["training_report"].annotation
    assert "self.checkpoint = checkpoint" in inspect.getsource(report.__init__), \
        "nre_ray.tracking.callback.ConsoleEvents.after_report relies on the training report's checkpoint"


def test_contract_controller_states() -> None:
    from ray.train.v2._internal.execution.controller import state

    for name in ("ErroredState", "ReschedulingState", "RestartingState"):
        cls = getattr(state, name, None)
        assert cls is not None and _params(cls.__init__) == ["self", "training_failed_error"] and \
            "self.training_failed_error = training_failed_error" in inspect.getsource(cls.__init__), \
            f"ray_private.failure_of relies on controller.state.{name}.training_failed_error"
    shutting = getattr(state, "ShuttingDownState", None)
    assert shutting is not None and _params(shutting.__init__) == ["self", "next_state"] and \
        "self.next_state = next_state" in inspect.getsource(shutting.__init__), \
        "ray_private.failure_of relies on controller.state.ShuttingDownState.next_state"


def test_contract_worker_metadata() -> None:
    from ray.train.v2._internal.execution.worker_group import WorkerGroup
    from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata, DistributedContext, Worker

    assert _has_method(WorkerGroup, "get_workers", ["self"]), \
        "ray_private.worker_places relies on WorkerGroup.get_workers()"
    assert {"metadata", "distributed_context"} <= {f.name for f in dataclasses.fields(Worker)}, \
        "ray_private.worker_places relies on Worker.metadata and Worker.distributed_context"
    assert {"node_id", "node_ip", "pid"} <= {f.name for f in dataclasses.fields(ActorMetadata)}, \
        "ray_private.worker_places relies on ActorMetadata.node_id, node_ip, pid"
    assert "world_rank" in {f.name for f in dataclasses.fields(DistributedContext)}, \
        "ray_private.worker_places relies on DistributedContext.world_rank"


def test_contract_health_check_failure() -> None:
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    assert "self.health_check_failure = failure" in inspect.getsource(WorkerHealthCheckFailedError.__init__), \
        ("ray_private.worker_death relies on ray.train.v2._internal.exceptions.WorkerHealthCheckFailedError"
         ".health_check_failure")


# ---------------------------------------------------------------- the raylets' messages, the driver's console

def test_contract_worker_pool_warning_text() -> None:
    assert ray_private.WORKER_POOL_WARNING.encode() in _binary("core/src/ray/raylet/raylet"), \
        (f"ray_private.keep_ray_notices_off_console relies on the raylet's warning text "
         f"{ray_private.WORKER_POOL_WARNING!r} (WORKER_POOL_WARNING), not found in the raylet binary")


def test_contract_serve_shutdown_retry_text() -> None:
    controller = _ray_text("serve/_private/controller.py")
    assert "class ServeController" in controller and "async def graceful_shutdown(self" in controller, \
        "ray_private.keep_ray_notices_off_console (SERVE_SHUTDOWN_RETRY) relies on ServeController.graceful_shutdown"
    assert "_controller.graceful_shutdown.remote()" in _ray_text("serve/_private/client.py"), \
        "ray_private.keep_ray_notices_off_console (SERVE_SHUTDOWN_RETRY) relies on serve.shutdown() calling it"
    core = _binary("_raylet.so")
    for part in (b" failed. There are ", b" retries remaining, ", b"so the task will be retried. Error: "):
        assert part in core, \
            (f"ray_private.keep_ray_notices_off_console relies on the core worker's retry message "
             f"('Task ServeController.graceful_shutdown failed. There are ... retries remaining, ...': "
             f"SERVE_SHUTDOWN_RETRY); {part!r} is not in ray/_raylet.so")
    assert ray_private.SERVE_SHUTDOWN_RETRY == "Task ServeController.graceful_shutdown failed", \
        "ray_private.SERVE_SHUTDOWN_RETRY is the start of that message"


def test_contract_print_to_stdstream() -> None:
    import ray._private.worker as ray_worker

    shipped = _ast_def("_private/worker.py", "print_to_stdstream")
    assert callable(ray_worker.print_to_stdstream) and shipped is not None and \
        _ast_params(shipped) == ["data", "ignore_prefix"], \
        "ray_private._drop_raylet_messages relies on ray._private.worker.print_to_stdstream(data, ignore_prefix)"
    assert "print_to_stdstream(" in _ray_source("_private/worker.py", "listen_error_messages"), \
        ("ray_private._drop_raylet_messages relies on ray._private.worker.listen_error_messages calling the "
         "module's print_to_stdstream (looked up at each call)")
    assert 'data["is_err"]' in _ray_source("_private/worker.py", "print_to_stdstream"), \
        "ray_private._drop_raylet_messages passes Ray's batches on whole (a dict with 'lines', 'is_err', ...)"


def test_contract_autoscaler_log_fyi_printed() -> None:
    import ray._private.worker as ray_worker

    assert isinstance(getattr(ray_worker, "autoscaler_log_fyi_printed", None), bool), \
        "ray_private._skip_autoscaler_tip relies on ray._private.worker.autoscaler_log_fyi_printed"
    assert "global autoscaler_log_fyi_printed" in inspect.getsource(ray_worker.filter_autoscaler_events), \
        ("ray_private._skip_autoscaler_tip relies on ray._private.worker.filter_autoscaler_events reading "
         "autoscaler_log_fyi_printed")


def test_contract_print_worker_logs() -> None:
    import ray._private.worker as ray_worker

    assert _params(ray_worker.print_worker_logs) == ["data", "print_file", "ignore_prefix"], \
        ("ray_private.ray_output_to relies on ray._private.worker.print_worker_logs(data, print_file, "
         "ignore_prefix)")
    assert "print_worker_logs(batch, sink, ignore_prefix)" in _ray_source("_private/worker.py", "print_to_stdstream"), \
        ("ray_private.ray_output_to relies on print_to_stdstream calling the module's print_worker_logs (looked up "
         "at each call)")
    source = _ray_source("_private/worker.py", "print_worker_logs")
    for key in ("pid", "lines", "actor_name", "task_name", "ip", "localhost"):
        assert f'"{key}"' in source, f"ray_private.ray_output_to (_ray_source) relies on a batch's {key!r}"


# ---------------------------------------------------------------- standin_node_provider

def test_contract_fake_multinode_provider() -> None:
    from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

    assert _params(FakeMultiNodeProvider._create_node_with_resources_and_labels) == \
        ["self", "node_config", "tags", "count", "resources", "labels"], \
        ("ray_private.standin_node_provider relies on FakeMultiNodeProvider._create_node_with_resources_and_labels("
         "node_config, tags, count, resources, labels), which it overrides")
    assert _params(FakeMultiNodeProvider.non_terminated_nodes) == ["self", "tag_filters"], \
        "ray_private.standin_node_provider relies on FakeMultiNodeProvider.non_terminated_nodes(tag_filters)"
    init = inspect.getsource(FakeMultiNodeProvider.__init__)
    assert "self.lock = RLock()" in init and "self._nodes = " in init, \
        "ray_private.standin_node_provider relies on FakeMultiNodeProvider.lock (an RLock) and ._nodes"
    create = inspect.getsource(FakeMultiNodeProvider._create_node_with_resources_and_labels)
    assert "ray._private.parameter.RayParams(" in create, \
        ("ray_private.standin_node_provider relies on _create_node_with_resources_and_labels building RayParams "
         "through the module attribute ray._private.parameter.RayParams (the attribute it swaps)")
    assert '"RAY_OVERRIDE_NODE_ID_FOR_TESTING": next_id' in create and '"node": node' in create, \
        ("ray_private.standin_node_provider (and standin_cluster.worker_nodes) relies on each node's env_vars "
         "RAY_OVERRIDE_NODE_ID_FOR_TESTING and its entry's 'node'")


def test_contract_ray_params() -> None:
    from ray._private.parameter import RayParams

    params = set(inspect.signature(RayParams).parameters)
    assert {"runtime_env_dir_name", "include_log_monitor", "env_vars"} <= params, \
        ("ray_private.standin_node_provider relies on ray._private.parameter.RayParams(runtime_env_dir_name=, "
         "include_log_monitor=, env_vars=)")


def test_contract_node_live_processes() -> None:
    from ray._private.node import Node
    from ray._private.ray_constants import PROCESS_TYPE_RAYLET

    assert _params(Node.live_processes) == ["self"], \
        "ray_private.standin_node_provider relies on ray._private.node.Node.live_processes()"
    assert PROCESS_TYPE_RAYLET == "raylet", \
        "ray_private.standin_node_provider relies on ray._private.ray_constants.PROCESS_TYPE_RAYLET"


# ---------------------------------------------------------------- the GCS client: drains, nodes

def _inner_gcs_client() -> type:
    import ray._raylet

    assert callable(getattr(ray._raylet.GcsClient, "__getattr__", None)), \
        "ray_private's GCS calls rely on ray._raylet.GcsClient passing calls on to InnerGcsClient (__getattr__)"
    return ray._raylet.InnerGcsClient


def test_contract_gcs_client_drain_node() -> None:
    assert _has_method(_inner_gcs_client(), "drain_node",
                       ["self", "node_id", "reason", "reason_message", "deadline_timestamp_ms"]), \
        ("ray_private.drain_for_preemption relies on ray._raylet.GcsClient.drain_node(node_id, reason, "
         "reason_message, deadline_timestamp_ms)")


def test_contract_drain_node_reason_preemption() -> None:
    from ray.core.generated import autoscaler_pb2

    assert "DRAIN_NODE_REASON_PREEMPTION" in autoscaler_pb2.DrainNodeReason.keys(), \
        "ray_private.drain_for_preemption relies on autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION"


def test_contract_global_worker_gcs_client() -> None:
    import ray
    import ray._private.worker as ray_worker

    assert isinstance(getattr(ray_worker, "global_worker", None), ray_worker.Worker), \
        "ray_private.drain_for_preemption relies on ray._private.worker.global_worker"
    assert "worker.gcs_client = " in _ray_text("_private/worker.py"), \
        ("ray_private.drain_for_preemption (draining_nodes, alive_nodes) relies on "
         "ray._private.worker.global_worker.gcs_client, set when Ray connects")
    assert ray.NodeID.size() == 28 and ray.NodeID.nil().hex() == "f" * 56, \
        "ray_private.drain_for_preemption checks node ids against ray.NodeID.size() and ray.NodeID.nil()"


def test_contract_drain_modules_import() -> None:
    import ray._private.worker  # noqa: F401
    from ray._raylet import GcsClient  # noqa: F401
    from ray.core.generated import autoscaler_pb2  # noqa: F401

    ray_private.load_drain_modules()  # what it imports is all there


def test_contract_gcs_client_get_draining_nodes() -> None:
    """Ray 2.60's GCS client lists the draining nodes; Ray 2.59's does not, and its global state accessor does (the
    one Ray Train's preemption watcher reads in both)."""
    import ray._private.state
    from ray._raylet import GcsClientOptions

    if not _has_method(_inner_gcs_client(), "get_draining_nodes", ["self"]):  # Ray 2.59
        assert _has_method(ray._private.state.GlobalState, "get_draining_nodes", ["self"]), \
            ("ray_private.draining_nodes relies on ray._raylet.GcsClient.get_draining_nodes() (Ray 2.60) or "
             "ray._private.state.GlobalState.get_draining_nodes() (Ray 2.59)")
    assert _has_method(ray._private.state.GlobalState, "_initialize_global_state", ["self", "gcs_options"]) and \
        _has_method(ray._private.state.GlobalState, "disconnect", ["self"]), \
        ("ray_private.draining_nodes (on Ray 2.59) relies on GlobalState()._initialize_global_state(gcs_options) "
         "and disconnect()")
    assert "GcsClientOptions.create(\n        gcs_address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil" \
        in _ray_text("_private/services.py") and callable(getattr(GcsClientOptions, "create", None)), \
        ("ray_private.draining_nodes (on Ray 2.59) relies on GcsClientOptions.create(address, None, "
         "allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False), as Ray's services.wait_for_node calls it")


def test_contract_gcs_client_get_all_node_info() -> None:
    from ray.core.generated import gcs_pb2

    assert _has_method(_inner_gcs_client(), "get_all_node_info", ["self"]), \
        "ray_private.alive_nodes relies on ray._raylet.GcsClient.get_all_node_info()"
    assert "ALIVE" in gcs_pb2.GcsNodeInfo.GcsNodeState.keys(), \
        "ray_private.alive_nodes relies on gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE"
    assert {"state", "node_manager_address"} <= set(gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name), \
        "ray_private.alive_nodes relies on gcs_pb2.GcsNodeInfo.state and node_manager_address"


# ---------------------------------------------------------------- elastic_trainer

def test_contract_elastic_scaling_policy() -> None:
    from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, NoopDecision, ResizeDecision
    from ray.train.v2._internal.execution.worker_group.state import WorkerGroupState

    assert _params(ElasticScalingPolicy.__init__) == ["self", "scaling_config"], \
        "ray_private.elastic_trainer relies on ElasticScalingPolicy(scaling_config), which it subclasses"
    assert _params(ElasticScalingPolicy._count_possible_workers) == ["self", "reserved_resources"], \
        "ray_private.elastic_trainer relies on ElasticScalingPolicy._count_possible_workers(reserved_resources)"
    assert _params(ElasticScalingPolicy.make_decision_for_running_worker_group) == \
        ["self", "worker_group_state", "worker_group_status"], \
        ("ray_private.elastic_trainer relies on ElasticScalingPolicy.make_decision_for_running_worker_group("
         "worker_group_state, worker_group_status)")
    assert "self.scaling_config" in _ray_text("train/v2/_internal/execution/scaling_policy/scaling_policy.py"), \
        "ray_private.elastic_trainer relies on a scaling policy's scaling_config"
    assert _params(NoopDecision) == [] and "num_workers" in {f.name for f in dataclasses.fields(ResizeDecision)}, \
        "ray_private.elastic_trainer relies on NoopDecision() and ResizeDecision.num_workers"
    assert isinstance(getattr(WorkerGroupState, "num_workers", None), property), \
        "ray_private.elastic_trainer relies on WorkerGroupState.num_workers"


def test_contract_count_possible_workers_reservation() -> None:
    """Ray 2.60 hands the policy a reservation by node id (a dict), Ray 2.59 a list of per-node reservations:
    both are accepted, and the base class counts the form of the installed Ray."""
    import ray.train
    from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy

    annotation = str(inspect.signature(ElasticScalingPolicy._count_possible_workers)
                     .parameters["reserved_resources"].annotation)
    by_list = annotation.startswith(("typing.List", "list"))  # Ray 2.59: List[ResourceDict]
    by_node = annotation.startswith(("typing.Dict", "dict"))  # Ray 2.60: ReservedResources = Dict[node id, ...]
    assert by_node != by_list, \
        (f"ray_private.elastic_trainer relies on _count_possible_workers taking a dict by node id (Ray 2.60) or a "
         f"list of per-node reservations (Ray 2.59); the installed Ray annotates {annotation!r}")
    policy = ElasticScalingPolicy(ray.train.ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 1}))
    nodes = [{"CPU": 2.0}, {"CPU": 1.0}]
    reservation: Any = {f"n{i}": r for i, r in enumerate(nodes)} if by_node else nodes
    assert policy._count_possible_workers(reservation) == 3, \
        "ray_private.elastic_trainer relies on _count_possible_workers counting workers per node's reservation"


def test_contract_initialize_and_run_controller() -> None:
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    method = DataParallelTrainer._initialize_and_run_controller
    assert [p.kind for p in inspect.signature(method).parameters.values()][1:] == [inspect.Parameter.VAR_KEYWORD], \
        ("ray_private.elastic_trainer relies on DataParallelTrainer._initialize_and_run_controller("
         "**controller_init_kwargs), which it overrides")
    assert "scaling_policy=create_scaling_policy(self.scaling_config)" in \
        _ray_text("train/v2/api/data_parallel_trainer.py"), \
        ("ray_private.elastic_trainer relies on fit() passing scaling_policy=create_scaling_policy(...) to "
         "_initialize_and_run_controller")
    assert "return ElasticScalingPolicy(scaling_config=scaling_config)" in \
        _ray_text("train/v2/_internal/execution/scaling_policy/factory.py"), \
        "ray_private.elastic_trainer relies on create_scaling_policy making a plain ElasticScalingPolicy"


def test_contract_resources_per_worker_not_none() -> None:
    import ray.train

    assert isinstance(getattr(ray.train.ScalingConfig, "_resources_per_worker_not_none", None), property), \
        "ray_private.elastic_trainer relies on ScalingConfig._resources_per_worker_not_none"


# ---------------------------------------------------------------- serve_setup (source read: no Ray Serve import)

def test_contract_haproxy_template_text() -> None:
    tree = _ray_tree("serve/_private/haproxy_templates.py")
    template = next((node.value.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "HAPROXY_CONFIG_TEMPLATE" for t in node.targets)
                     and isinstance(node.value, ast.Constant)), None)
    assert isinstance(template, str), \
        ("ray_private.serve_setup (_patch_haproxy_templates) relies on "
         "ray.serve._private.haproxy_templates.HAPROXY_CONFIG_TEMPLATE, a string")
    old = ray_private.HAPROXY_REUSE[0]
    assert old in template, \
        f"ray_private._patch_haproxy_templates relies on HAProxy's template holding {old!r} (HAPROXY_REUSE)"
    for old, _ in ray_private.HAPROXY_BINDS:
        assert template.count(old) == 1, \
            f"ray_private._patch_haproxy_templates relies on HAProxy's template holding {old!r} once (HAPROXY_BINDS)"
    assert "config.frontend_host" in template, \
        "ray_private._patch_haproxy_templates relies on the template's config.frontend_host (HAPROXY_BINDS)"


def test_contract_haproxy_module_copies_template() -> None:
    source = _ray_text("serve/_private/haproxy.py")
    imports = [node for node in ast.parse(source).body if isinstance(node, ast.ImportFrom)
               and node.module == "ray.serve._private.haproxy_templates"]
    assert any(alias.name == "HAPROXY_CONFIG_TEMPLATE" for node in imports for alias in node.names) and \
        "env.from_string(HAPROXY_CONFIG_TEMPLATE)" in source, \
        ("ray_private._patch_haproxy_templates relies on ray.serve._private.haproxy reading its own copy of "
         "HAPROXY_CONFIG_TEMPLATE (imported by name) at each render")


def test_contract_replica_add_port_to_grpc_server() -> None:
    source = _ray_text("serve/_private/replica.py")
    assert "from ray._common.tls_utils import add_port_to_grpc_server" in source and \
        'add_port_to_grpc_server(self._server, "[::]:0")' in source, \
        ("ray_private._bind_replica_grpc_to_node relies on ray.serve._private.replica calling its module name "
         "add_port_to_grpc_server(server, '[::]:0')")
    from ray._common.tls_utils import add_port_to_grpc_server

    assert _params(add_port_to_grpc_server) == ["server", "address"], \
        "ray_private._bind_replica_grpc_to_node relies on add_port_to_grpc_server(server, address)"


def test_contract_build_address() -> None:
    from ray._common.network_utils import build_address

    assert _params(build_address) == ["host", "port"] and build_address("127.0.0.1", 5) == "127.0.0.1:5", \
        "ray_private._bind_replica_grpc_to_node relies on ray._common.network_utils.build_address(host, port)"


# ---------------------------------------------------------------- ask_gcs

def test_contract_authentication_metadata() -> None:
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        _get_authentication_metadata_tuple,
    )

    assert _params(_get_authentication_metadata_tuple) == [], \
        ("ray_private.ask_gcs relies on ray._private.authentication.grpc_authentication_client_interceptor"
         "._get_authentication_metadata_tuple()")


def test_contract_gcs_get_cluster_id() -> None:
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    assert hasattr(gcs_service_pb2_grpc, "NodeInfoGcsServiceStub"), \
        "ray_private.ask_gcs relies on gcs_service_pb2_grpc.NodeInfoGcsServiceStub"
    methods = gcs_service_pb2.DESCRIPTOR.services_by_name["NodeInfoGcsService"].methods_by_name
    assert "GetClusterId" in methods and methods["GetClusterId"].input_type.name == "GetClusterIdRequest", \
        "ray_private.ask_gcs relies on NodeInfoGcsService.GetClusterId(GetClusterIdRequest)"
    assert not gcs_service_pb2.GetClusterIdRequest.DESCRIPTOR.fields, \
        "ray_private.ask_gcs sends an empty GetClusterIdRequest"


# ---------------------------------------------------------------- Ray internals named by value outside ray_private

def test_contract_placement_timeout_env() -> None:
    from ray.train.v2._internal import constants

    from nre_ray.cluster import session

    assert constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR == session.PLACEMENT_TIMEOUT_ENV, \
        ("session.set_placement_timeout relies on Ray Train reading "
         f"{session.PLACEMENT_TIMEOUT_ENV} (ray.train.v2._internal.constants)")
    assert session.PLACEMENT_TIMEOUT_ENV in constants.ENV_VARS_TO_PROPAGATE, \
        ("session.set_placement_timeout relies on fit() propagating "
         f"{session.PLACEMENT_TIMEOUT_ENV} to the controller (get_env_vars_to_propagate)")


def test_contract_local_train_switches() -> None:
    import importlib.util
    import inspect

    from ray.train.v2._internal import constants
    from ray.train.v2.api import data_parallel_trainer

    from nre_ray.cluster import local_settings

    if hasattr(constants, "ENABLE_PREEMPTION_WATCHER_ENV_VAR"):
        assert constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR == local_settings.PREEMPTION_WATCHER_ENV, \
            "local_settings.local_train_settings relies on Ray Train's preemption watcher switch by that name"
        assert local_settings.PREEMPTION_WATCHER_ENV in constants.ENV_VARS_TO_PROPAGATE, \
            "local_settings.local_train_settings relies on fit() passing the switch on to the controller"
    else:  # a release before the watcher: the variable is read by nothing
        assert importlib.util.find_spec("ray.train.v2._internal.callbacks.preemption_callback") is None
    assert constants.METRICS_ENABLED_ENV_VAR == local_settings.TRAIN_METRICS_ENV
    assert "env_bool(METRICS_ENABLED_ENV_VAR" in inspect.getsource(data_parallel_trainer), \
        "local_settings.local_train_settings relies on the trainer reading RAY_TRAIN_METRICS_ENABLED in the driver"


def test_contract_fake_head_node_id() -> None:
    from ray.autoscaler._private.fake_multi_node import node_provider

    from nre_ray.cluster import standin_cluster

    assert node_provider.FAKE_HEAD_NODE_ID == standin_cluster.HEAD_NODE_ID, \
        "standin_cluster.HEAD_NODE_ID relies on fake_multi_node.node_provider.FAKE_HEAD_NODE_ID"


def test_contract_runtime_env_default_excludes() -> None:
    import ray._private.ray_constants as constants

    from nre_ray.cluster import standin_cluster

    (name,) = standin_cluster.JOB_SUBMIT_ENV
    assert f'os.environ.get(\n        "{name}"' in inspect.getsource(constants.get_runtime_env_default_excludes), \
        f"standin_cluster.JOB_SUBMIT_ENV relies on Ray reading {name} (ray_constants.get_runtime_env_default_excludes)"


def test_contract_ray_start_worker_ports() -> None:
    from nre_ray.cluster import standin_cluster

    source = _ray_text("scripts/scripts.py")
    for option, default in zip(("--min-worker-port", "--max-worker-port"), standin_cluster.RAY_WORKER_PORTS,
                               strict=True):
        assert re.search(rf'"{option}",\s*required=False,\s*type=int,\s*default={default},', source), \
            f"standin_cluster.RAY_WORKER_PORTS relies on `ray start {option}` defaulting to {default}"


def test_contract_internal_head_resource() -> None:
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    assert HEAD_NODE_RESOURCE_NAME == "node:__internal_head__", \
        "session (the head node's resource, node:__internal_head__) relies on ray._common.constants"


def test_contract_train_controller_abort() -> None:
    from ray.train.v2._internal.execution.controller.controller import TrainController

    assert _has_method(TrainController, "abort", ["self"]) and len(_params(TrainController.abort)) == 1, \
        "nre_ray.tune.trial.stop_train_run relies on the Train controller actor's abort()"


def test_contract_developer_apis() -> None:
    import ray.train
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.util.state import list_actors, list_nodes

    user_hook = ["self", "run_context", "metrics", "checkpoint"]
    assert _has_method(ray.train.UserCallback, "after_report", user_hook), \
        ("nre_ray.tracking.callback.EpochMetricsLogger and tune.trial.ControllerHandle rely on the DeveloperAPI "
         "ray.train.UserCallback.after_report(run_context, metrics, checkpoint)")
    assert _has_method(TuneReportCallback, "after_report", user_hook), \
        ("nre_ray.tune.trial._without_notes relies on the DeveloperAPI "
         "ray.tune.integration.ray_train.TuneReportCallback.after_report(run_context, metrics, checkpoint)")
    for function in (list_actors, list_nodes):
        assert {"address", "filters", "limit"} <= set(_params(function)), \
            f"standin_cluster relies on the DeveloperAPI ray.util.state.{function.__name__}(address, filters, limit)"


# ---------------------------------------------------------------- the table, the tests and the functions agree

TABLE_LINE = re.compile(r"^\s*([\w.]+) -> (\S.*?)\s+->\s+(test_contract_\w+)\s*$")
#: ray_private's functions that reach no Ray or torch internal themselves (they call ray_private's functions that do).
NO_TOUCHPOINT = {"schedulable_nodes", "keep_ray_notices_off_console", "serve_setup", "_when_loaded", "_ray_source"}


def _table() -> list[tuple[str, str, str]]:
    doc = ray_private.__doc__ or ""
    return [match.groups() for match in map(TABLE_LINE.match, doc.splitlines()) if match]  # type: ignore[misc]


def _reaches_internals(function: ast.FunctionDef) -> bool:
    """A function of ray_private that imports Ray or torch, reads a private attribute, or a touchpoint constant."""
    for node in ast.walk(function):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.split(".")[0] in ("ray", "torch") for n in names):
                return True
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and \
                not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            return True
        if isinstance(node, ast.Name) and node.id in ("HAPROXY_REUSE", "HAPROXY_BINDS", "OFF_CONSOLE"):
            return True
    return False


def test_every_touchpoint_has_a_contract_test() -> None:
    """Every function of ray_private that reaches a Ray internal is in the table with at least one contract test;
    every test in the table exists here, and every contract test here is in the table."""
    table = _table()
    assert len(table) >= 40, "ray_private's docstring lost its table of touchpoints"
    tree = ast.parse(RAY_PRIVATE_FILE.read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    in_table = {function for function, _, _ in table}
    missing = sorted(name for name, node in functions.items() if _reaches_internals(node)
                     and name not in in_table and name not in NO_TOUCHPOINT)
    assert not missing, f"ray_private functions reaching Ray internals with no contract test in the table: {missing}"
    unknown = sorted(f for f in in_table if "." not in f and f not in functions and not hasattr(ray_private, f))
    assert not unknown, f"the touchpoint table names what ray_private does not have: {unknown}"
    tests = {name for name in globals() if name.startswith("test_contract_")}
    listed = {test for _, _, test in table}
    assert listed <= tests, f"the touchpoint table names contract tests that do not exist: {sorted(listed - tests)}"
    assert tests <= listed, f"contract tests missing from ray_private's touchpoint table: {sorted(tests - listed)}"
    assert not (NO_TOUCHPOINT - set(functions)), "NO_TOUCHPOINT names functions ray_private no longer has"


@pytest.mark.parametrize("function", sorted(NO_TOUCHPOINT))
def test_functions_without_a_touchpoint_reach_no_internals(function: str) -> None:
    """What NO_TOUCHPOINT excuses imports nothing of Ray and reads no private attribute: once it does, it needs a
    line in the table and a contract test."""
    tree = ast.parse(RAY_PRIVATE_FILE.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    assert not _reaches_internals(node), f"ray_private.{function} reaches a Ray internal: give it a contract test"
