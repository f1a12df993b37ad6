"""Worker sizing from the cluster's resources, and clear refusals for what cannot be placed."""

import time
from pathlib import Path

import pytest

from nre_ray.cluster.session import (
    Cluster,
    NodeType,
    UsageError,
    check_shared_paths,
    local_tracking,
    placement_timeout,
    plan_resources,
    read_node_types,
    size_workers,
)
from nre_ray.tune.sweep import plan_trials


def test_more_workers_than_cores_get_fractions():
    r = plan_resources(4, False, [{"CPU": 2.0}])
    assert r.per_worker == {"CPU": 0.5} and r.threads == 1
    assert plan_resources(2, False, [{"CPU": 16.0}]).per_worker == {"CPU": 1.0}


def test_uneven_nodes_still_place_every_worker():
    r = plan_resources(5, False, [{"CPU": 3.0}, {"CPU": 1.0}])
    per = r.per_worker["CPU"]
    assert int(3.0 / per) + int(1.0 / per) >= 5


def test_gpu_requests():
    with pytest.raises(UsageError, match="no GPU"):
        plan_resources(2, True, [{"CPU": 2.0}])
    with pytest.raises(UsageError, match="needs 4 GPUs, but the cluster has 2"):
        plan_resources(4, True, [{"CPU": 8.0, "GPU": 2.0}])
    r = plan_resources(2, True, [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 4.0}])
    assert r.per_worker == {"CPU": 4.0, "GPU": 1} and r.threads == 4


def test_cpus_per_worker_sets_cpus_and_threads():
    r = plan_resources(1, False, [{"CPU": 2.0}], cpus_per_worker=2.0)
    assert r.per_worker == {"CPU": 2.0} and r.threads == 2
    r = plan_resources(3, False, [{"CPU": 4.0}, {"CPU": 2.0}], cpus_per_worker=2.0)
    assert r.per_worker == {"CPU": 2.0} and r.threads == 2
    assert plan_resources(2, False, [{"CPU": 2.0}], cpus_per_worker=0.5).threads == 1
    r = plan_resources(2, True, [{"CPU": 16.0, "GPU": 2.0}], cpus_per_worker=6.0)
    assert r.per_worker == {"CPU": 6.0, "GPU": 1} and r.threads == 6


def test_cpus_per_worker_that_does_not_fit_is_refused():
    # 3 + 1 CPUs hold only two 1.5-CPU workers (a worker never spans nodes)
    with pytest.raises(UsageError, match=r"--num-workers 3 with --cpus-per-worker 1.5: .* room for 2 workers"):
        plan_resources(3, False, [{"CPU": 3.0}, {"CPU": 1.0}], cpus_per_worker=1.5)
    with pytest.raises(UsageError, match="room for 1 workers of one GPU and 8 CPUs"):
        plan_resources(2, True, [{"CPU": 12.0, "GPU": 2.0}], cpus_per_worker=8.0)


def test_a_local_ray_that_does_not_start_in_time_is_a_clear_error(monkeypatch):
    """Ray's raylet must register within a fixed 30 s; on an overloaded machine it does not, and Ray raises a bare
    Exception. That cannot be produced on demand, so ray.init is replaced by one that raises Ray's message."""
    import ray

    from nre_ray.cluster.session import start_ray

    def times_out(**kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", times_out)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match=r"the local Ray did not start: .* load average .* --address auto"):
        start_ray(None)


# --- clusters that an autoscaler grows -----------------------------------------------------------------------------

GPU_TYPE = NodeType("gpu_worker", {"CPU": 4.0, "GPU": 1.0}, max_count=4)


def test_gpus_the_autoscaler_can_add_are_not_refused():
    """cluster.yaml keeps GPU workers at min_workers 0: a CPU-only head must not refuse --use-gpu."""
    head = [{"CPU": 8.0}]
    r = plan_resources(2, True, head, node_types=[GPU_TYPE])
    assert r.per_worker == {"CPU": 4.0, "GPU": 1} and r.waits
    assert not plan_resources(1, True, [*head, {"CPU": 4.0, "GPU": 1.0}], node_types=[GPU_TYPE]).waits


def test_a_request_no_node_type_can_ever_hold_names_the_types():
    with pytest.raises(UsageError,
                       match=r"needs 5 GPUs, but the cluster has 4 .*gpu_worker \(up to 4 x \{CPU 4, GPU 1\}"):
        plan_resources(5, True, [{"CPU": 8.0}], node_types=[GPU_TYPE])
    with pytest.raises(UsageError, match=r"no GPU .*cpu_worker"):
        plan_resources(1, True, [{"CPU": 1.0}], node_types=[NodeType("cpu_worker", {"CPU": 1.0}, 3)])


def test_cpu_workers_sized_for_the_nodes_the_autoscaler_adds():
    r = plan_resources(2, False, [{"CPU": 1.0}], node_types=[NodeType("cpu_worker", {"CPU": 1.0}, 3)])
    assert r.per_worker == {"CPU": 1.0} and r.waits  # one fits on the head now; the second needs a new node


def test_node_types_with_resources_left_to_the_instance_type_are_trusted():
    """On AWS, `resources: {}` is filled in from the instance type by the autoscaler; not knowing them, nre_ray
    asks for one GPU per worker and lets Ray wait for the nodes."""
    r = plan_resources(2, True, [{"CPU": 8.0}], node_types=[NodeType("gpu_worker", {}, 4)])
    assert r.per_worker == {"CPU": 1.0, "GPU": 1} and r.waits


#: KubeRay's maxReplicas of a worker group that sets none.
NO_MAXIMUM = 2147483647


def test_a_node_type_without_a_maximum_is_sized_at_once():
    """Counted by arithmetic: one dict per possible node was a MemoryError at 4 GB, and a hang without a limit."""
    cpus = NodeType("cpu_worker", {"CPU": 4.0}, NO_MAXIMUM)
    gpus = NodeType("gpu_worker", {"CPU": 8.0, "GPU": 8.0}, NO_MAXIMUM)
    head = [{"CPU": 2.0}]
    started = time.perf_counter()
    r = plan_resources(64, False, head, node_types=[cpus])
    assert r.per_worker == {"CPU": 1.0} and r.threads == 1 and r.waits
    r = plan_resources(3, False, head, cpus_per_worker=3.0, node_types=[cpus])
    assert r.per_worker == {"CPU": 3.0} and r.threads == 3 and r.waits
    r = plan_resources(16, True, head, node_types=[gpus])
    assert r.per_worker == {"CPU": 1.0, "GPU": 1} and r.waits  # 8 CPUs shared by a node's 8 GPUs
    with pytest.raises(UsageError, match=r"room for 2 workers of 1 CPUs \(node types it may add: small \(up to "
                                         r"2147483647 x \{CPU 0.5\}\)\)"):
        plan_resources(3, False, head, cpus_per_worker=1.0, node_types=[NodeType("small", {"CPU": 0.5}, NO_MAXIMUM)])
    # a sweep: as many trials at once as --num-samples by default, each of one worker with one CPU
    plan = plan_trials(1, False, head, None, [cpus], None, 8)
    assert (plan.at_once, plan.per_worker, plan.waits) == (8, {"CPU": 1.0}, True)
    # 4 CPUs per GPU worker: 2 of a gpu_worker's 8 GPUs are usable, so the most that fit at once is one per node
    plan = plan_trials(2, True, head, 4.0, [gpus], None)
    assert (plan.at_once, plan.per_worker) == (NO_MAXIMUM, {"CPU": 4.0, "GPU": 1})
    assert time.perf_counter() - started < 1.0


def test_evaluate_and_predict_size_from_the_nodes_the_autoscaler_may_add():
    """``size_workers``, which train, evaluate and predict call: a CPU-only head whose autoscaler adds GPU nodes
    takes GPU workers (sizing from the alive nodes only refused them), and the wait is the autoscaler's."""
    head = [{"CPU": 8.0}]
    with pytest.raises(UsageError, match="no GPU"):
        plan_resources(2, True, head)
    r = size_workers(Cluster(head, [GPU_TYPE], "aws", {"10.0.0.1"}), 2, use_gpu=True)
    assert r.per_worker == {"CPU": 4.0, "GPU": 1} and r.waits and r.placement_timeout == 900
    r = size_workers(ONE_NODE, 4)
    assert r.per_worker == {"CPU": 0.5} and not r.waits and r.placement_timeout == 60
    assert size_workers(ONE_NODE, 1, wait=30.0).placement_timeout == 30.0


def test_node_types_from_an_autoscaler_yaml(tmp_path):
    config = tmp_path / "autoscaler.yaml"
    config.write_text("max_workers: 3\nhead_node_type: head\nprovider: {type: fake_multinode}\n"
                      "available_node_types:\n"
                      "  head: {resources: {CPU: 1}, node_config: {}, max_workers: 0}\n"
                      "  cpu_worker: {resources: {CPU: 1}, node_config: {}, min_workers: 0, max_workers: 5}\n"
                      "  off: {resources: {CPU: 8}, node_config: {}, max_workers: 0}\n")
    types, provider = read_node_types(config)
    assert provider == "fake_multinode"
    assert types == [NodeType("cpu_worker", {"CPU": 1.0}, 3)]  # capped by the cluster's max_workers


def test_the_real_cluster_yaml_lists_its_gpu_workers():
    types, provider = read_node_types(Path(__file__).resolve().parents[2] / "cluster.yaml")
    assert provider == "aws" and [t.name for t in types] and all(t.max_count > 0 for t in types)


# --- paths every node must reach --------------------------------------------------------------------------------

ONE_NODE = Cluster([{"CPU": 2.0}], addresses={"10.0.0.1"})
AWS = Cluster([{"CPU": 8.0}], [GPU_TYPE], "aws", {"10.0.0.1"})
STANDIN = Cluster([{"CPU": 1.0}, {"CPU": 1.0}], [NodeType("cpu_worker", {"CPU": 1.0}, 3)], "fake_multinode",
                  {"192.0.2.2"})


def test_local_paths_are_fine_on_one_node():
    assert check_shared_paths(ONE_NODE, "/home/me/ray_results", "sqlite:///mlflow.db", False) == []


def test_a_local_storage_path_on_a_cluster_is_refused():
    with pytest.raises(UsageError, match=r"--storage-path /home/ubuntu/ray_results is a folder on this machine.*"
                                         r"gpu_worker.*s3://BUCKET.*--allow-local-storage"):
        check_shared_paths(AWS, "/home/ubuntu/ray_results", "http://10.0.0.1:5000", False)
    warnings = check_shared_paths(AWS, "/mnt/nfs/runs", "http://10.0.0.1:5000", True)
    assert len(warnings) == 1 and "/mnt/nfs/runs" in warnings[0]


def test_a_tracking_uri_only_the_driver_reaches_is_refused_on_a_cluster():
    for uri in ("sqlite:////home/ubuntu/mlflow.db", "http://127.0.0.1:5000", "http://localhost:5000"):
        with pytest.raises(UsageError, match="only reachable from this machine"):
            check_shared_paths(AWS, "s3://b/runs", uri, False)
    assert check_shared_paths(AWS, "s3://b/runs", "http://10.0.0.1:5000", False) == []
    # the stand-in's nodes are processes on this host: its loopback MLflow server reaches them all
    assert check_shared_paths(STANDIN, "s3://b/runs", "http://127.0.0.1:5000", False) == []
    with pytest.raises(UsageError, match="sqlite"):
        check_shared_paths(STANDIN, "s3://b/runs", "sqlite:///mlflow.db", False)


def test_local_tracking_uris():
    assert local_tracking("sqlite:///x.db") and local_tracking("/tmp/mlruns") and local_tracking("http://[::1]:5000")
    assert not local_tracking("http://172.31.12.34:5000") and not local_tracking("databricks")


def test_placement_waits_longer_where_nodes_are_added():
    assert placement_timeout(None, ONE_NODE) == 60 and placement_timeout(None, AWS) == 900
    assert placement_timeout(30.0, AWS) == 30.0
