"""``python -m nre_ray.standin up|status|upload|kill-node|down``: the command line of the cluster stand-in
(:mod:`nre_ray.cluster.standin`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nre_ray.cluster.standin import Standin, down, kill_node, status, up, upload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nre_ray.standin",
        description="A local stand-in for the AWS cluster of cluster.yaml, to rehearse on before paying for it: a Ray "
                    "head whose autoscaler adds worker nodes (processes on this machine) when a run asks, an "
                    "S3-compatible object store on 127.0.0.1, and an MLflow server with its artifacts in that store. "
                    "See docs/cluster.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m nre_ray.standin up && source .standin/env.sh\n"
               "  python -m nre_ray.standin upload nre_ray/data/sample s3://nre-ray/nre_ray/data\n"
               "  python -m nre_ray.standin status\n  python -m nre_ray.standin kill-node\n"
               "  python -m nre_ray.standin down")
    parser.add_argument("command", choices=["up", "status", "upload", "kill-node", "down"],
                        help="up: start it and write <dir>/env.sh; status: what runs; upload LOCAL s3://...: copy "
                             "data into the store; kill-node: lose a worker node (one running a training worker); "
                             "down: stop every process it started")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="upload: a local file or folder, then where it goes (s3://BUCKET/...)")
    parser.add_argument("--dir", default=".standin", help="Folder for the stand-in's state, logs and MLflow database "
                                                         "(default: .standin).")
    parser.add_argument("--bucket", default="nre-ray", help="Bucket created in the object store (default: nre-ray).")
    parser.add_argument("--max-workers", type=int, default=3, help="Worker nodes the autoscaler may add (default 3).")
    parser.add_argument("--cpus-per-node", type=float, default=1.0, help="CPUs of each worker node (default 1).")
    parser.add_argument("--idle-minutes", type=float, default=1.0,
                        help="Minutes before the autoscaler removes an idle node (default 1).")
    for name, default in (("s3", 9000), ("gcs", 6379), ("dashboard", 8265), ("mlflow", 5000)):
        parser.add_argument(f"--{name}-port", type=int, default=default, help=f"(default {default})")
    parser.add_argument("--node", help="kill-node: the node id to lose (default: one that runs a training worker).")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = Path(args.dir)
    if args.command == "up":
        state = up(folder, args.bucket, args.max_workers, args.cpus_per_node, idle_minutes=args.idle_minutes,
                   ports={"s3": args.s3_port, "gcs": args.gcs_port, "dashboard": args.dashboard_port,
                          "mlflow": args.mlflow_port})
        print(status(state))
        print(f"\nnext: source {folder}/env.sh, then submit a job as docs/cluster.md says; "
              f"`python -m nre_ray.standin down --dir {args.dir}` stops it all.")
    elif args.command == "status":
        print(status(Standin.load(folder)))
    elif args.command == "upload":
        if len(args.paths) != 2:
            raise SystemExit("error: upload takes two paths: LOCAL s3://BUCKET/KEY")
        upload(Standin.load(folder), Path(args.paths[0]), args.paths[1])
        print(f"uploaded {args.paths[0]} to {args.paths[1]}")
    elif args.command == "kill-node":
        print(f"killed worker node {kill_node(Standin.load(folder), args.node, 'RayTrainWorker')}")
    else:
        print(f"stopped {down(folder)} processes of the stand-in in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
