"""The options of ``python -m nre_ray.serve`` (:mod:`nre_ray.serve.__main__`), which are also the arguments of the
Serve application builder (:func:`nre_ray.serve.app.build`): both read them from here."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nre_ray.cluster.session import UsageError
from nre_ray.config import command_parser, option, shared

EXAMPLES = """\
examples:
  python -m nre_ray.serve --model runs:/RUN_ID/model
  python -m nre_ray.serve --model models:/NAME@champion --min-replicas 1 --max-replicas 4 --port 8080
  python -m nre_ray.serve --model ray_results/RUN/checkpoint_DIR --max-batch-size 64 --batch-wait-timeout-s 0.01
  python -m nre_ray.serve --model models:/NAME/3 --address HEAD_IP:6379 --host 0.0.0.0 --use-gpu

then, from another shell (send the entity types when the training data had them, as the bundled sample does):
  curl -s http://127.0.0.1:8000/health
  curl -s http://127.0.0.1:8000/invocations -H 'Content-Type: application/json' -d '{"dataframe_records":
    [{"sentence": "Acme was founded by Ann .", "head": "Acme", "head_offset": 0, "tail": "Ann",
      "tail_offset": 20, "head_type": "org", "tail_type": "person"}], "params": {"top_k": 2}}'
"""


#: How requests reach the replicas of a Ray that ``python -m nre_ray.serve`` starts: Ray Serve's HAProxy ingress
#: (the default: one HAProxy process forwards each connection to a replica's own HTTP server) or its Python HTTP
#: proxy (each request crosses a proxy actor and two Ray calls into the replica). See
#: :func:`nre_ray.serve.app.ingress_env`.
INGRESSES = ("haproxy", "proxy")


@dataclass(frozen=True)
class ServeOptions:
    """The settings of one application: the options of ``python -m nre_ray.serve``, one flag each."""

    model: str = shared("trained_model")
    tracking_uri: str | None = shared("tracking_uri")
    address: str | None = shared("address")
    host: str = option("127.0.0.1", "Address the HTTP server listens on (default: 127.0.0.1, this machine only; "
                                    "0.0.0.0 for every interface).")
    port: int = option(8000, "HTTP port (default: 8000).")
    name: str = option("nre_ray", "The Serve application's name (default: nre_ray).")
    max_batch_size: int = option(32, "Most requests a replica labels in one batch (default: 32).")
    batch_wait_timeout_s: float = option(0.005, "How long a replica waits for more requests before it labels a batch "
                                                "that is not full (default: 0.005).")
    min_replicas: int = option(1, "Fewest replicas (default: 1).")
    max_replicas: int | None = option(None, "Most replicas; more than --min-replicas turns on autoscaling on ongoing "
                                            "requests (default: --min-replicas).")
    target_ongoing_requests: float = option(8.0, "Autoscaling target: requests in flight per replica (default: 8).")
    max_ongoing_requests: int | None = option(None, "Most requests in flight per replica; more wait at the proxy "
                                                    "(default: twice --max-batch-size).")
    cpus_per_replica: float | None = option(None, "CPUs reserved for each replica; its torch threads are the whole "
                                                  "CPUs of it. Default: --max-replicas replicas share the cluster's "
                                                  "CPUs evenly, at most 1 each, as train sizes its workers.")
    use_gpu: bool = option(False, "One GPU per replica (refused where the cluster has none).")
    ingress: str | None = option(None, "How requests reach the replicas of the Ray this command starts: haproxy (the "
                                       "default), Ray Serve's HAProxy ingress, which hands each connection to a "
                                       "replica's own HTTP server (several times the requests per second on 2 cores: "
                                       "docs/benchmarks.md); proxy, Serve's Python HTTP proxy. On a cluster "
                                       "(--address) the cluster's own setting applies.", choices=INGRESSES)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """The options of parsed command-line arguments; UsageError for values that cannot work."""
        options = cls(**vars(args))
        if options.max_batch_size < 1 or options.min_replicas < 0 or options.replicas[1] < 1:
            raise UsageError("--max-batch-size and --max-replicas must be >= 1, --min-replicas >= 0")
        if options.replicas[1] < options.min_replicas:
            raise UsageError(f"--max-replicas {options.max_replicas} is below --min-replicas {options.min_replicas}")
        if options.batch_wait_timeout_s < 0 or options.target_ongoing_requests <= 0:
            raise UsageError("--batch-wait-timeout-s must be >= 0 and --target-ongoing-requests > 0")
        if options.ongoing < options.max_batch_size:
            raise UsageError(f"--max-ongoing-requests {options.ongoing} is below --max-batch-size "
                             f"{options.max_batch_size}: a batch could never fill")
        if options.cpus_per_replica is not None and options.cpus_per_replica < 0.01:
            raise UsageError("--cpus-per-replica must be >= 0.01")
        if not 0 < options.port < 65536:
            raise UsageError(f"--port {options.port}: not a TCP port")
        if options.ingress not in (None, *INGRESSES):
            raise UsageError(f"--ingress {options.ingress}: one of {', '.join(INGRESSES)}")
        return options

    @property
    def replicas(self) -> tuple[int, int]:
        """Fewest and most replicas."""
        return self.min_replicas, self.min_replicas if self.max_replicas is None else self.max_replicas

    @property
    def ongoing(self) -> int:
        """Most requests in flight per replica."""
        return self.max_ongoing_requests or 2 * self.max_batch_size


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.serve`` options, the fields of :class:`ServeOptions` (also the arguments of
    :func:`nre_ray.serve.app.build`)."""
    return command_parser(
        "python -m nre_ray.serve", ServeOptions, epilog=EXAMPLES,
        description="Serve a trained relation classifier over HTTP on Ray Serve, with the API of `mlflow models "
                    "serve` (POST /invocations with dataframe_split, dataframe_records or instances; GET /ping, "
                    "/health). Each replica holds the model once and labels the rows of concurrent requests in one "
                    "batch; replicas are added and removed with the load. Serves until Ctrl-C, then shuts the "
                    "application down.")
