"""The stand-in's node provider: Ray's ``fake_multinode`` provider, with one change that makes its nodes behave like
separate machines in one respect that matters to jobs.

The fake nodes are raylet processes on this host that share the head's Ray session folder. Ray keeps each node's
runtime environments (a job's ``--working-dir``) in ``<session>/runtime_resources`` and *replaces* a working
directory whenever a node sets it up, so a node joining mid-job deleted the files the job's driver was running from.
Here every autoscaled node gets a runtime-environment folder of its own, as every machine of a real cluster has, and
no log monitor of its own (the head's follows the shared log folder already; two would print each line twice). A
node whose raylet is gone (``kill-node``, ``preempt-node``) is listed no more, as a cloud lists a reclaimed instance
as terminated, so that the autoscaler replaces it for a resource request too (an elastic run's).

Loaded by the stand-in's autoscaler (``provider: {type: external, module: nre_ray.cluster.provider.
StandinNodeProvider}``); see :mod:`nre_ray.cluster.standin_cluster`. The class is built on Ray's private provider
interface, so it lives in :mod:`nre_ray.cluster.ray_private`.
"""

from __future__ import annotations

from nre_ray.cluster.ray_private import standin_node_provider

StandinNodeProvider = standin_node_provider()
