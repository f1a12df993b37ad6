"""The stand-in's node provider: Ray's ``fake_multinode`` provider, with one change that makes its nodes behave like
separate machines in one respect that matters to jobs.

The fake nodes are raylet processes on this host that share the head's Ray session folder. Ray keeps each node's
runtime environments (a job's ``--working-dir``) in ``<session>/runtime_resources`` and *replaces* a working
directory whenever a node sets it up, so a node joining mid-job deleted the files the job's driver was running from.
Here every autoscaled node gets a runtime-environment folder of its own, as every machine of a real cluster has, and
no log monitor of its own (the head's follows the shared log folder already; two would print each line twice).

Loaded by the stand-in's autoscaler (``provider: {type: external, module: nre_ray.cluster.provider.
StandinNodeProvider}``); see :mod:`nre_ray.cluster.standin`.
"""

from __future__ import annotations

from typing import Any

import ray._private.parameter as parameter
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


class StandinNodeProvider(FakeMultiNodeProvider):
    """``FakeMultiNodeProvider`` whose nodes keep their runtime environments in ``runtime_resources_<node>`` and
    leave log forwarding to the head."""

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

        with self.lock:  # the parent builds RayParams through the module attribute: swap it for this call only
            parameter.RayParams = ray_params
            try:
                super()._create_node_with_resources_and_labels(node_config, tags, count, resources, labels)
            finally:
                parameter.RayParams = original
