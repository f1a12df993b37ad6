"""The options of ``python -m nre_ray.serve`` (:mod:`nre_ray.serve.__main__`), which are also the arguments of the
Serve application builder (:func:`nre_ray.serve.app.build`): both read them from here."""

from __future__ import annotations

import argparse

from nre_ray.config import ADDRESS_HELP, CommandParser

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


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.serve`` options (also the arguments of :func:`nre_ray.serve.app.build`)."""
    parser = CommandParser(
        prog="python -m nre_ray.serve",
        description="Serve a trained relation classifier over HTTP on Ray Serve, with the API of `mlflow models "
                    "serve` (POST /invocations with dataframe_split, dataframe_records or instances; GET /ping, "
                    "/health). Each replica holds the model once and labels the rows of concurrent requests in one "
                    "batch; replicas are added and removed with the load. Serves until Ctrl-C, then shuts the "
                    "application down.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    parser.add_argument("--model", required=True, help="A checkpoint folder (a local path or a URI such as "
                        "s3://BUCKET/runs/RUN/checkpoint_...), an MLflow model URI runs:/<run_id>/model, or a "
                        "registered model models:/<name>/<version> or models:/<name>@<alias> (an alias is pinned to "
                        "the version it names when the application starts).")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for runs:/ and models:/ (default: "
                        "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory).")
    parser.add_argument("--address", help=ADDRESS_HELP)
    parser.add_argument("--host", default="127.0.0.1", help="Address the HTTP server listens on (default: "
                        "127.0.0.1, this machine only; 0.0.0.0 for every interface).")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000).")
    parser.add_argument("--name", default="nre_ray", help="The Serve application's name (default: nre_ray).")
    parser.add_argument("--max-batch-size", type=int, default=32, help="Most requests a replica labels in one "
                        "batch (default: 32).")
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.005, help="How long a replica waits for "
                        "more requests before it labels a batch that is not full (default: 0.005).")
    parser.add_argument("--min-replicas", type=int, default=1, help="Fewest replicas (default: 1).")
    parser.add_argument("--max-replicas", type=int, help="Most replicas; more than --min-replicas turns on "
                        "autoscaling on ongoing requests (default: --min-replicas).")
    parser.add_argument("--target-ongoing-requests", type=float, default=8.0, help="Autoscaling target: requests "
                        "in flight per replica (default: 8).")
    parser.add_argument("--max-ongoing-requests", type=int, help="Most requests in flight per replica; more wait "
                        "at the proxy (default: twice --max-batch-size).")
    parser.add_argument("--cpus-per-replica", type=float, help="CPUs reserved for each replica; its torch threads "
                        "are the whole CPUs of it. Default: --max-replicas replicas share the cluster's CPUs evenly, "
                        "at most 1 each, as train sizes its workers.")
    parser.add_argument("--use-gpu", action="store_true", help="One GPU per replica (refused where the cluster has "
                        "none).")
    parser.add_argument("--ingress", choices=("haproxy", "proxy"), help="How requests reach the replicas of the "
                        "Ray this command starts: haproxy (the default), Ray Serve's HAProxy ingress, which hands each "
                        "connection to a replica's own HTTP server (several times the requests per second on 2 cores: "
                        "docs/benchmarks.md); proxy, Serve's Python HTTP proxy. On a cluster (--address) the "
                        "cluster's own setting applies.")
    return parser
