"""A real two-node Ray (``ray.cluster_utils.Cluster``: a head and a second raylet on this machine) run by a process of
its own, for the preemption tests: nothing of the test session's own Ray state (a driver connected in this process,
the node address Ray takes from it) reaches it. ``python tests/two_nodes.py ARGS_JSON`` starts it and prints one
JSON line (the GCS address and the node ids); SIGUSR1 removes the second node at once (as when a cloud takes the
machine), SIGTERM shuts the cluster down."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()


@dataclass
class TwoNodes:
    """The running cluster, as the tests use it."""

    gcs_address: str
    head_id: str
    node_id: str  #: the second node's
    proc: subprocess.Popen
    log: Path

    @property
    def address(self) -> str:
        return self.gcs_address

    def remove_node(self, timeout: float = 60) -> None:
        """Kill the second node's processes (no graceful drain) and wait until they are gone."""
        from tests.procs import wait_for

        self.proc.send_signal(signal.SIGUSR1)
        wait_for("the node's removal", lambda: "removed" in self.log.read_text(), timeout, proc=self.proc,
                 log=self.log)


@contextmanager
def two_nodes(folder: Path, node_resources: dict[str, float] | None = None,
              system_config: dict | None = None) -> Iterator[TwoNodes]:
    """A head and a second node of one CPU each (the second with ``node_resources`` too), without dashboards; stopped
    (every process of it) when the block ends."""
    from tests.procs import start, stop_tree, wait_for

    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "two_nodes.log"
    args = json.dumps({"resources": node_resources or {}, "system_config": system_config or {}})
    for attempt in (1, 2):
        proc = start([sys.executable, str(HERE), args], log, folder)
        wait_for("the two-node cluster", lambda p=proc: p.poll() is not None or any(
            x.startswith('{"gcs"') for x in log.read_text().splitlines()), 120, log=log)
        if proc.poll() is None or attempt == 2 or "timed out during startup" not in log.read_text():
            break
        # Ray's fixed registration wait ran out under the suite's load (seen once in a full run, load ~40 on 2
        # cores): these tests are about preemption, not Ray's start, so that refusal (and only it) gets one more try
        stop_tree(proc, grace=15)
        log.write_text(f"(the first try timed out at the head's start: {log.read_text()})\n")
    try:
        line = wait_for("the two-node cluster", lambda: next(
            (x for x in log.read_text().splitlines() if x.startswith('{"gcs"')), None), 1, proc=proc, log=log)
        info = json.loads(line)
        yield TwoNodes(info["gcs"], info["head"], info["node"], proc, log)
    finally:
        stop_tree(proc, grace=15)


def main(args: dict) -> None:
    from ray.cluster_utils import Cluster

    removal: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda *_: removal.append(True))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    head_args = {"num_cpus": 1, "include_dashboard": False}
    if args["system_config"]:
        head_args["_system_config"] = args["system_config"]
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        node = cluster.add_node(num_cpus=1, resources=args["resources"])
        cluster.wait_for_nodes()
        print(json.dumps({"gcs": cluster.gcs_address, "head": cluster.head_node.node_id, "node": node.node_id}),
              flush=True)
        while not removal:
            time.sleep(0.1)
        cluster.remove_node(node, allow_graceful=False)
        print("removed", flush=True)
        while True:
            time.sleep(1)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
