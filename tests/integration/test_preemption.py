"""Preemption notices on a real multi-node Ray (``ray.cluster_utils.Cluster``: several raylets on this machine). The
Ray work runs in subprocesses that join that cluster, so the test session's own Ray is neither joined nor touched."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from nre_ray.cluster.ray_private import drain_for_preemption, draining_nodes
from tests.procs import start, stop_tree, wait_for

pytestmark = pytest.mark.integration

#: A driver that keeps an actor on the node with the ``spot`` resource (a drained node with nothing on it stops at
#: once: the raylet exits when it is idle and draining).
HOLD = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
holder = ray.remote(num_cpus=0, resources={"spot": 1})(type("Holder", (), {"ready": lambda self: True})).remote()
ray.get(holder.ready.remote())
print("holding", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def two_nodes():
    """A head and one more node with the resource ``spot`` (one CPU each), shut down (exactly its processes)
    afterwards."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node = cluster.add_node(num_cpus=1, resources={"spot": 1})
    cluster.wait_for_nodes()
    yield cluster, node
    cluster.shutdown()


def test_a_preemption_drain_reaches_the_gcs_with_its_deadline(two_nodes, tmp_path: Path):
    cluster, node = two_nodes
    log = tmp_path / "hold.log"
    holder = start([sys.executable, "-c", HOLD, cluster.address], log, tmp_path)
    try:
        wait_for("an actor on the node", lambda: "holding" in log.read_text(), 60, proc=holder, log=log)
        assert node.node_id not in draining_nodes(cluster.gcs_address)
        before = time.time()
        drain_for_preemption(node.node_id, 20, address=cluster.gcs_address, message="spot interruption")
        deadline = draining_nodes(cluster.gcs_address)[node.node_id]
        assert before + 20 - 1 <= deadline <= time.time() + 20 + 1
    finally:
        stop_tree(holder)


def test_a_drain_for_no_node_or_a_past_deadline_is_refused(two_nodes):
    cluster, _ = two_nodes
    with pytest.raises(ValueError, match="not a Ray node id"):
        drain_for_preemption("nonsense", 20, address=cluster.gcs_address)
    with pytest.raises(ValueError, match="0 or more seconds"):
        drain_for_preemption(cluster.head_node.node_id, -1, address=cluster.gcs_address)
    with pytest.raises(ValueError, match="not a Ray node id"):
        drain_for_preemption("ff" * 28, 20, address=cluster.gcs_address)
