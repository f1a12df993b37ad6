"""The spot watcher in a real Ray: a fake EC2 metadata service on 127.0.0.1 announces an interruption, and the
watcher (``python -m nre_ray.cluster.spot_watch``, a subprocess as on a node) drains the node with reason PREEMPTION
and the notice's deadline within one polling interval.

The cluster is Ray's own two-node test cluster (``ray.cluster_utils.Cluster``: a head and one worker node on this
machine) in a subprocess of its own, so the test session's Ray is neither joined nor touched; an actor keeps the
worker node busy (Ray ends a drained node at once when nothing runs on it). That subprocess reports, every 0.1 s,
what Ray Train itself reads to learn of a preemption: Ray's draining nodes and their deadlines
(``ray._private.state.state.get_draining_nodes``, as ``ray.train.v2._internal.execution.preemption`` reads it), and
the autoscaler's view of the node (``DRAINING``)."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import pytest

from tests.metadata_server import metadata_server
from tests.procs import start, stop_tree, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
INTERVAL_S = 1.0

CLUSTER = """
import json, sys, time
import ray
from ray.autoscaler.v2.sdk import get_cluster_status
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
node = cluster.add_node(num_cpus=1, resources={"spot": 1})
cluster.wait_for_nodes()
ray.init(address=cluster.address, log_to_driver=False)


@ray.remote(num_cpus=0, resources={"spot": 1})
class Busy:
    def node(self):
        return ray.get_runtime_context().get_node_id()


busy = Busy.remote()
assert ray.get(busy.node.remote()) == node.node_id
print(json.dumps({"gcs": cluster.gcs_address, "node": node.node_id}), flush=True)
while True:
    statuses = {n.node_id: n.node_status for n in get_cluster_status(cluster.gcs_address).active_nodes}
    print(json.dumps({"at": time.time(), "draining": ray._private.state.state.get_draining_nodes(),
                      "status": statuses.get(node.node_id)}), flush=True)
    time.sleep(0.1)
"""


def _lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_an_interruption_notice_drains_the_node_with_its_deadline_within_one_poll(tmp_path):
    cluster_log, watch_log = tmp_path / "cluster.log", tmp_path / "watch.log"
    cluster = start([sys.executable, "-c", CLUSTER], cluster_log, tmp_path)
    watcher = None
    try:
        first = wait_for("the two-node cluster", lambda: _lines(cluster_log), 120, proc=cluster, log=cluster_log)[0]
        with metadata_server() as fake:
            watcher = start([sys.executable, "-m", "nre_ray.cluster.spot_watch", "--address", first["gcs"],
                             "--node-id", first["node"], "--endpoint", fake.url, "--interval", str(INTERVAL_S)],
                            watch_log, Path.cwd())
            wait_for("the watcher's polls", lambda: fake.polls() >= 2, 60, proc=watcher, log=watch_log)
            assert not any(line.get("draining") for line in _lines(cluster_log))  # 404: nothing drained

            when = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(minutes=2)
            fake.announce("terminate", when.strftime("%Y-%m-%dT%H:%M:%SZ"))
            announced = time.time()
            drained = wait_for("the drain", lambda: [line for line in _lines(cluster_log)
                                                     if line.get("draining") and line["at"] > announced],
                               30, interval=0.05, proc=cluster, log=cluster_log)[0]
            assert watcher.wait(timeout=30) == 0, watch_log.read_text()
            polls = fake.polls()
        # Seen by Ray within one polling interval (plus the 0.1 s of the cluster's own reports), with AWS's time as
        # the deadline, and the node DRAINING; the watcher drained once and stopped polling.
        assert drained["at"] - announced <= INTERVAL_S + 0.5, drained["at"] - announced
        assert list(drained["draining"]) == [first["node"]]
        assert abs(drained["draining"][first["node"]] - when.timestamp() * 1000) <= 50  # ms
        wait_for("DRAINING", lambda: _lines(cluster_log)[-1]["status"] == "DRAINING", 10, proc=cluster,
                 log=cluster_log)
        assert fake.polls() == polls
        log = watch_log.read_text()
        assert f"draining Ray node {first['node']} for preemption" in log and log.count("draining Ray node") == 1
    finally:
        for proc in (watcher, cluster):
            if proc is not None:
                stop_tree(proc)
