"""A local Ray started by nre_ray answers Ray's State API itself, even with another Ray instance on the machine.

Ray Train's placement-group cleaner asks the State API (from an actor) whether the run's controller is alive. Without
a pinned address, Ray looks for a cluster on this machine and, with two of them, fails ("Found multiple active Ray
instances", a traceback in the middle of a good run) or asks the wrong one. The test session's own Ray (the
``ray_cluster`` fixture) is the other instance here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.procs import env, free_port, loopback, start, stop_tree, wait_for

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = """
import os, ray
from nre_ray.cluster.session import start_ray
start_ray(None)

@ray.remote(num_cpus=0)
def ask():  # what the placement-group cleaner does, from a process of the cluster
    from ray.util.state import list_nodes
    return [n.node_id for n in list_nodes()], os.environ.get("RAY_API_SERVER_ADDRESS")

nodes, address = ray.get(ask.remote())
assert nodes == [ray.get_runtime_context().get_node_id()], (nodes, address)
assert address == os.environ["RAY_API_SERVER_ADDRESS"] and address.startswith("http://127.0.0.1:")
print("pinned", address)
import json, sys
sys.path.insert(0, {repo!r})
from tests.procs import descendants, listening
print("listening", json.dumps(listening([os.getpid(), *descendants(os.getpid())])))

# Two training workers with the run's torch config: their process group meets on 127.0.0.1 alone.
import ray.train
import torch
import torch.distributed as dist
from ray.train.torch import TorchTrainer
from nre_ray.cluster.session import torch_config

def rank_sockets(config):
    total = torch.ones(1)
    dist.all_reduce(total)  # the process group is up and works
    rank = ray.train.get_context().get_world_rank()
    sys.path.insert(0, config["repo"])
    from tests.procs import listening
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as out:
        json.dump({"sum": float(total), "sockets": listening([os.getpid()])}, out)

TorchTrainer(rank_sockets, train_loop_config={"repo": {repo!r}, "out": os.getcwd()}, torch_config=torch_config(),
             scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
             run_config=ray.train.RunConfig(name="sockets", storage_path=os.getcwd())).fit()
ray.shutdown()
"""


def test_the_state_api_answers_from_this_runs_own_cluster(ray_cluster, tmp_path):
    """And every process of that Ray (GCS, raylet, workers, dashboard, agents, the driver) listens on the loopback
    address only, and so do two training workers' PyTorch rendezvous and process group: nothing of a command's
    local Ray can be reached from the network."""
    assert ray_cluster.is_initialized()  # another Ray instance on this machine
    # as a user's shell has it: the State API not pinned, the local Ray with its dashboard
    child_env = {k: v for k, v in env().items() if k not in ("RAY_API_SERVER_ADDRESS", "NRE_RAY_DASHBOARD")}
    done = subprocess.run([sys.executable, "-c", SCRIPT.replace("{repo!r}", repr(str(REPO)))], env=child_env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "pinned http://127.0.0.1:" in done.stdout
    assert "multiple active Ray instances" not in done.stdout + done.stderr
    sockets = json.loads(done.stdout.split("listening ", 1)[1].splitlines()[0])
    assert any("gcs_server" in command for _, command, _, _ in sockets), sockets
    assert any("raylet" in command for _, command, _, _ in sockets), sockets
    assert [s for s in sockets if not loopback(s[2])] == []
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["sum"] for r in ranks] == [2.0, 2.0], ranks
    assert ranks[0]["sockets"], ranks  # rank 0 holds the rendezvous store (and gloo's own sockets)
    assert [s for r in ranks for s in r["sockets"] if not loopback(s[2])] == [], ranks


OWN = """
import ray
from nre_ray.cluster.session import start_ray
start_ray(None)
print("own", ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


def test_no_address_starts_a_private_ray_even_with_a_ray_start_cluster_on_the_machine(tmp_path):
    """``ray start --head`` records its address (RAY_TMPDIR/ray/ray_current_cluster), and a bare ``ray.init()`` joins
    it: a plain command would then have landed on the user's cluster, with Ray's ValueError ("When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided") as a traceback. No address means a Ray of its
    own (``--address auto`` joins that cluster)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="nre-rt-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    port = free_port()
    extra = {"RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled"}
    child_env = {k: v for k, v in env(**extra).items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    head = start([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
                  "--num-cpus=1", "--include-dashboard=false"], tmp_path / "head.log", tmp_path, extra)
    try:
        wait_for("the ray start head", lambda: (ray_tmp / "ray" / "ray_current_cluster").exists(), timeout=90)
        done = subprocess.run([sys.executable, "-c", OWN], env=child_env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        own = done.stdout.split("own ", 1)[1].strip()
        assert own and not own.endswith(f":{port}"), (own, port)
    finally:
        stop_tree(head)
        shutil.rmtree(ray_tmp, ignore_errors=True)
