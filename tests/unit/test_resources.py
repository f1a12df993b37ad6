"""Worker sizing from the cluster's resources, and clear refusals for what cannot be placed."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nre_ray.cluster.session import (
    Cluster,
    NodeType,
    UsageError,
    check_shared_paths,
    local_cluster,
    local_node,
    local_tracking,
    node_groups,
    placement_timeout,
    plan_resources,
    read_node_types,
    size_workers,
)
from nre_ray.config import MIN_CPUS_PER_WORKER
from nre_ray.tune.sweep import plan_trials
from tests.procs import env


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


# --- mistakes of scale: refused with what the cluster has and how to oversubscribe on purpose ----------------------

def test_more_workers_than_half_a_cpu_each_are_refused():
    """64 workers on 2 CPUs ran at 0.03 CPU each and took 261 s to start; 4 still run (0.5 each)."""
    assert MIN_CPUS_PER_WORKER == 0.5 and plan_resources(4, False, [{"CPU": 2.0}]).per_worker == {"CPU": 0.5}
    with pytest.raises(UsageError) as caught:
        plan_resources(64, False, [{"CPU": 2.0}])
    assert str(caught.value) == (
        "--num-workers 64: this Ray cluster can never hold that many workers at 0.5 CPU or more each (1 node(s), "
        "2 CPUs; room for 4 such workers). Use --num-workers 4 or fewer, or join a larger cluster (--address); to "
        "oversubscribe on purpose, pass --cpus-per-worker 0.03 (64 workers sharing the CPUs start and train slowly).")
    with pytest.raises(UsageError, match=r"--num-workers 5: .* room for 4 such workers.*--cpus-per-worker 0\.4 "):
        plan_resources(5, False, [{"CPU": 2.0}])
    with pytest.raises(UsageError, match=r"\(2 node\(s\), 1.5 CPUs; room for 3 .*not even --cpus-per-worker 0\.01"):
        plan_resources(200, False, [{"CPU": 1.0}, {"CPU": 0.5}])


def test_the_share_the_refusal_suggests_is_accepted_as_oversubscription_on_purpose():
    for workers, nodes in ((64, [{"CPU": 2.0}]), (9, [{"CPU": 3.0}, {"CPU": 1.0}]), (5, [{"CPU": 0.4}])):
        with pytest.raises(UsageError) as caught:
            plan_resources(workers, False, nodes)
        share = float(re.search(r"--cpus-per-worker ([0-9.]+)", str(caught.value)).group(1))
        r = plan_resources(workers, False, nodes, cpus_per_worker=share)
        assert r.per_worker == {"CPU": share} and r.threads == 1 and not r.waits


def test_the_least_share_is_tried_when_uneven_nodes_need_it():
    """7 workers fit on 3.5 + 0.5 CPUs at exactly 0.5 each (7 + 1), not at 0.57 or 0.51."""
    assert plan_resources(7, False, [{"CPU": 3.5}, {"CPU": 0.5}]).per_worker == {"CPU": 0.5}
    with pytest.raises(UsageError, match="room for 8 such workers"):
        plan_resources(9, False, [{"CPU": 3.5}, {"CPU": 0.5}])


#: What Ray adds to the head's resources (and to no other node's).
HEAD_MARK = {"node:__internal_head__": 1.0}


def test_what_the_autoscaler_can_add_counts_and_what_it_never_can_is_refused():
    head = [{"CPU": 1.0, **HEAD_MARK}]
    cpu3 = NodeType("cpu_worker", {"CPU": 1.0}, 3)
    r = plan_resources(8, False, head, node_types=[cpu3])  # 2 on the head, 6 on three new nodes
    assert r.per_worker == {"CPU": 0.5} and r.waits
    with pytest.raises(UsageError, match=r"--num-workers 9: .*\(1 node\(s\), 1 CPUs; the autoscaler may add "
                                         r"cpu_worker \(up to 3 x \{CPU 1\}\); room for 8 such workers\)"):
        plan_resources(9, False, head, node_types=[cpu3])
    tiny = NodeType("tiny", {"CPU": 0.25}, NO_MAXIMUM)  # never holds a worker at half a CPU, however many
    started = time.perf_counter()
    with pytest.raises(UsageError, match=r"room for 2 such workers.*--cpus-per-worker 0\.32 "):
        plan_resources(3, False, head, node_types=[tiny])
    assert plan_resources(1000, False, head, node_types=[NodeType("big", {"CPU": 4.0}, NO_MAXIMUM)]).waits
    assert time.perf_counter() - started < 1.0


def test_the_room_comes_from_the_node_types_not_from_the_nodes_up_now():
    """A node the autoscaler added is one of its type's maximum, not one more: the same cluster holds as many
    workers with none of them up as with two (it once said room for 8, then 12). The head, and a node of no
    type (joined by hand), count once each; a head with no CPUs (the stand-in's, cluster.yaml's) none."""
    cpu3 = NodeType("cpu_worker", {"CPU": 1.0}, 3)
    node = {"CPU": 1.0, "memory": 2e9, "node:10.0.0.7": 1.0}  # Ray's own resources of an added node
    for head in ({"CPU": 1.0, **HEAD_MARK}, {"CPU": 0.0, **HEAD_MARK}):
        rooms = set()
        for alive in ([head], [head, node], [head, node, dict(node)], [head, node, dict(node), dict(node)]):
            groups = node_groups(alive, [cpu3])
            assert sum(count for _, count in groups) == 4, (alive, groups)
            with pytest.raises(UsageError, match=r"room for (\d+) such workers") as caught:
                plan_resources(99, False, alive, node_types=[cpu3])
            rooms.add(re.search(r"room for (\d+)", str(caught.value))[1])
        assert rooms == ({"8"} if head["CPU"] else {"6"}), rooms
    by_hand = {"CPU": 2.0, "node:10.0.0.9": 1.0}  # of no type: one node more
    assert sum(count for _, count in node_groups([{"CPU": 1.0, **HEAD_MARK}, by_hand, node], [cpu3])) == 5


def test_a_gpu_request_where_no_gpu_can_ever_be_is_refused_and_one_that_can_is_not():
    with pytest.raises(UsageError) as caught:
        plan_resources(1, True, [{"CPU": 2.0}])
    assert str(caught.value) == ("--use-gpu: this Ray cluster has no GPU (1 node(s), 2 CPUs). Drop --use-gpu to "
                                 "run on CPUs, or join a cluster with GPUs (--address).")
    with pytest.raises(UsageError, match=r"^--use-gpu: this Ray cluster has no GPU and its autoscaler adds none "
                                         r"\(1 node\(s\), 2 CPUs; the autoscaler may add cpu_worker \(up to "
                                         r"2147483647 x \{CPU 8\}\)\)\. Drop --use-gpu"):
        plan_resources(1, True, [{"CPU": 2.0}], node_types=[NodeType("cpu_worker", {"CPU": 8.0}, NO_MAXIMUM)])
    # GPUs alive, or a node type with GPUs: GPU workers are not held to the CPU workers' least share
    r = plan_resources(8, True, [{"CPU": 2.0, "GPU": 8.0}])
    assert r.per_worker == {"CPU": 0.25, "GPU": 1} and not r.waits
    r = plan_resources(2, True, [{"CPU": 2.0}], node_types=[NodeType("gpu", {"CPU": 8.0, "GPU": 1.0}, NO_MAXIMUM)])
    assert r.per_worker == {"CPU": 4.0, "GPU": 1} and r.waits


def test_tune_and_predict_size_through_the_same_rule():
    """A sweep's trials (workers x trials at once) and predict's actors (plus one share for reading the input)."""
    with pytest.raises(UsageError, match=r"^not even one trial fits beside its driver's 0.01 CPU: --num-workers 64: "
                                         r".*1.99 CPUs.*--cpus-per-worker 0\.03 "):
        plan_trials(64, False, [{"CPU": 2.0}], None, [], None, 8)
    # asked for 8 trials of 2 workers at once: 1 fits at half a CPU or more each (the trial drivers hold 0.01 each)
    plan = plan_trials(2, False, [{"CPU": 2.0}], None, [], 8, 8)
    assert (plan.at_once, plan.per_worker) == (1, {"CPU": 0.99})
    plan = plan_trials(2, False, [{"CPU": 2.0}], 0.2, [], 8, 8)  # on purpose: 4 trials of 2 x 0.2 CPU and 4 drivers
    assert (plan.at_once, plan.per_worker) == (4, {"CPU": 0.2})
    r = size_workers(ONE_NODE, 3, plus=1)  # 3 actors and the reading tasks: 4 shares of half a CPU
    assert r.per_worker == {"CPU": 0.5}
    with pytest.raises(UsageError, match=r"^--num-workers 4: .*room for 3 such workers\)\. Use --num-workers 3 or "
                                         r"fewer.*--cpus-per-worker 0\.4 "):
        size_workers(ONE_NODE, 4, plus=1)
    assert size_workers(ONE_NODE, 4, cpus_per_worker=0.4, plus=1).per_worker == {"CPU": 0.4}


def test_the_local_ray_is_known_before_it_starts(monkeypatch):
    """What ``start_ray`` starts without an address: one node of this machine's CPUs (and GPUs); a cluster to join
    is known only once joined."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    node = local_node()
    assert node["CPU"] == os.cpu_count() and set(node) <= {"CPU", "GPU"}
    assert local_cluster("10.0.0.5:6379") is None and local_cluster("auto") is None
    # this test session may have joined a Ray already (another test's): then that one is sized, once joined
    assert local_cluster(None) == (None if ray.is_initialized() else Cluster([node], addresses={"127.0.0.1"}))


def test_sizing_cpu_workers_before_ray_starts_does_not_import_ray():
    """A command without --use-gpu checks its workers against the machine's CPUs without importing Ray (a second of
    its start-up that otherwise overlaps with the other imports: startup_* in docs/benchmarks.md)."""
    code = ("import sys; from nre_ray.cluster.session import local_cluster; "
            "c = local_cluster(None, use_gpu=False); print(c.nodes, 'ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{{'CPU': {float(os.cpu_count())}}}] False"


def _command(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m ARGS`` in ``tmp_path`` with its own Ray temporary folder (``RAY_TMPDIR``): a Ray started by the
    command would leave its session folder there."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=env(RAY_TMPDIR=str(tmp_path / "ray")))
    return done, time.perf_counter() - started


def test_train_refuses_too_many_workers_before_ray_starts(tmp_path):
    """``--num-workers 64`` on a 2-CPU machine (32 per CPU wherever this runs): one line, exit 2, in seconds, no
    Ray started; with ``--cpus-per-worker`` the same request passes the check (and fails on the next one here,
    a missing data folder, still before Ray)."""
    workers = str(32 * (os.cpu_count() or 1))
    done, seconds = _command(tmp_path, "nre_ray.train", "--num-workers", workers, "--epochs", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --num-workers {workers}: this Ray cluster can never hold "
                                                   f"that many workers at 0.5 CPU or more each (1 node(s), "
                                                   f"{os.cpu_count()} CPUs; room for {2 * os.cpu_count()} such"), lines
    assert "--cpus-per-worker 0.03 " in lines[0] and "Traceback" not in done.stdout
    assert " ray: " not in done.stdout and not (tmp_path / "ray").exists(), done.stdout  # no Ray started
    assert seconds < 30  # (about 3 s on an idle 2-core machine; 261 s to start the workers before)
    on_purpose, _ = _command(tmp_path, "nre_ray.train", "--num-workers", workers, "--cpus-per-worker", "0.03",
                             "--epochs", "1", "--data-dir", str(tmp_path / "missing"))
    assert on_purpose.returncode == 2 and "--num-workers" not in on_purpose.stderr
    assert str(tmp_path / "missing") in on_purpose.stderr and not (tmp_path / "ray").exists()


@pytest.mark.skipif(bool(local_node().get("GPU")), reason="this machine has a GPU")
def test_use_gpu_without_a_gpu_is_refused_before_ray_starts(tmp_path):
    done, seconds = _command(tmp_path, "nre_ray.train", "--use-gpu", "--epochs", "1")
    assert done.returncode == 2 and done.stderr == (
        f"error: --use-gpu: this Ray cluster has no GPU (1 node(s), {os.cpu_count()} CPUs). Drop --use-gpu to run on "
        "CPUs, or join a cluster with GPUs (--address).\n")
    assert " ray: " not in done.stdout and not (tmp_path / "ray").exists() and seconds < 30


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
