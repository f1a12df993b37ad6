"""``python -m nre_ray.standin up|status|upload|kill-node|preempt-node|down``: the command line of the cluster stand-in
(:mod:`nre_ray.cluster.standin_cluster`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nre_ray.cluster.session import TELEMETRY_ENV, UsageError, quiet_environ
from nre_ray.cluster.standin_cluster import STATE_FILE, Standin, down, kill_node, preempt_node, status, up, upload
from nre_ray.config import CommandParser

#: The commands and what each does.
COMMANDS = {
    "up": "start it and write <dir>/env.sh",
    "status": "say what runs",
    "upload": "copy a local file or folder into the object store",
    "kill-node": "lose a worker node (by default one that runs a training worker)",
    "preempt-node": "take a worker node back as AWS takes a spot instance: a preemption notice (a Ray drain with a "
                    "deadline) to a node that runs a training worker, then lose the node at the deadline",
    "down": "stop every process it started, nothing else",
}
#: The options: the commands each applies to, its flag, and its argparse settings.
OPTIONS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (tuple(COMMANDS), "--dir", {"default": ".standin", "help": "Folder for the stand-in's state, logs and MLflow "
                                                               "database (default: .standin)."}),
    (("up",), "--bucket", {"default": "nre-ray", "help": "Bucket created in the object store (default: nre-ray)."}),
    (("up",), "--max-workers", {"type": int, "default": 3, "help": "Worker nodes the autoscaler may add (default 3)."}),
    (("up",), "--cpus-per-node", {"type": float, "default": 1.0, "help": "CPUs of each worker node (default 1)."}),
    (("up",), "--idle-minutes", {"type": float, "default": 1.0,
                                 "help": "Minutes before the autoscaler removes an idle node (default 1)."}),
    (("up",), "--s3-port", {"type": int, "default": 9000,
                            "help": "Port of the object store's S3 API on 127.0.0.1: AWS_ENDPOINT_URL in env.sh "
                                    "(default 9000)."}),
    (("up",), "--gcs-port", {"type": int, "default": 6379,
                             "help": "Port of the Ray head (its GCS), the address nodes and `ray start --address` "
                                     "join (default 6379)."}),
    (("up",), "--dashboard-port", {"type": int, "default": 8265,
                                   "help": "Port of the Ray dashboard, where `ray job submit` sends jobs: RAY_ADDRESS "
                                           "in env.sh (default 8265)."}),
    (("up",), "--mlflow-port", {"type": int, "default": 5000,
                                "help": "Port of the MLflow tracking server: TRACKING_URI in env.sh (default 5000)."}),
    (("up",), "--no-auth", {"dest": "auth", "action": "store_false",
                            "help": "Start Ray without token authentication and MLflow without a password, as "
                                    "before (default: a new Ray token and MLflow password in <dir>/secrets)."}),
    (("kill-node", "preempt-node"), "--node",
     {"help": "The id of the worker node to lose (default: one that runs a training worker)."}),
    (("preempt-node",), "--deadline", {"type": float, "default": 120.0,
                                       "help": "Seconds from the notice to the node's end (default 120, what AWS "
                                               "gives a spot instance)."}),
]


def build_parser() -> argparse.ArgumentParser:
    """``COMMAND`` and its options; each option is taken after the command and, as before, also before it."""
    parser = CommandParser(
        prog="python -m nre_ray.standin",
        description="A local stand-in for the AWS cluster of cluster.yaml, to rehearse on before paying for it: a Ray "
                    "head whose autoscaler adds worker nodes (processes on this machine) when a run asks, an "
                    "S3-compatible object store on 127.0.0.1, and an MLflow server with its artifacts in that store. "
                    "See docs/cluster.md. `python -m nre_ray.standin COMMAND --help` lists a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m nre_ray.standin up && source .standin/env.sh\n"
               "  python -m nre_ray.standin upload nre_ray/data/sample s3://nre-ray/nre_ray/data\n"
               "  python -m nre_ray.standin status\n  python -m nre_ray.standin kill-node\n"
               "  python -m nre_ray.standin preempt-node --deadline 20\n"
               "  python -m nre_ray.standin down\n"
               "  python -m nre_ray.standin up --dir /tmp/second --s3-port 9100 --gcs-port 6400 --dashboard-port 8300 "
               "--mlflow-port 5100")
    groups: dict[tuple[str, ...], Any] = {tuple(COMMANDS): parser}
    for applies, flag, settings in OPTIONS:
        if applies not in groups:
            groups[applies] = parser.add_argument_group(f"options of {' and '.join(applies)}")
        groups[applies].add_argument(flag, **settings)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, what in COMMANDS.items():
        command = commands.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]}.")
        if name == "upload":
            command.add_argument("local", metavar="LOCAL", help="A local file or folder.")
            command.add_argument("uri", metavar="URI", help="Where it goes: s3://BUCKET/KEY.")
        for applies, flag, settings in OPTIONS:
            if name in applies:  # given here, it wins; not given, the value before the command (or its default) stays
                command.add_argument(flag, **{**settings, "default": argparse.SUPPRESS})
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The stand-in's processes inherit this environment: its MLflow server and Ray nodes (whose workers import
    # MLflow) keep MLflow's telemetry off unless the user chose otherwise.
    quiet_environ((TELEMETRY_ENV,))
    try:
        run(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `up` has stopped what it had started
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def run(args: argparse.Namespace) -> None:
    """Do the command of ``args`` and say what it did."""
    folder = Path(args.dir)
    if args.command == "up":
        state = up(folder, args.bucket, args.max_workers, args.cpus_per_node, idle_minutes=args.idle_minutes,
                   ports={"s3": args.s3_port, "gcs": args.gcs_port, "dashboard": args.dashboard_port,
                          "mlflow": args.mlflow_port}, auth=args.auth, say=print)
        print(status(state))
        print(f"\nnext: source {folder}/env.sh, then submit a job as docs/cluster.md says; "
              f"`python -m nre_ray.standin down --dir {args.dir}` stops it all.")
    elif args.command == "status":
        print(status(Standin.load(folder)))
    elif args.command == "upload":
        upload(Standin.load(folder), Path(args.local), args.uri)
        print(f"uploaded {args.local} to {args.uri}")
    elif args.command == "kill-node":
        print(f"killed worker node {kill_node(Standin.load(folder), args.node, 'RayTrainWorker')}")
    elif args.command == "preempt-node":
        if not args.deadline >= 0:
            raise UsageError(f"--deadline {args.deadline:g}: the seconds from the notice to the node's end cannot be "
                             "negative; pass 0 or more (AWS gives 120)")
        preempt_node(Standin.load(folder), args.node, args.deadline, lambda line: print(line, flush=True))
    elif not (folder / STATE_FILE).is_file() and (folder / "logs").is_dir():  # a stand-in was here, and stopped
        print(f"the stand-in in {folder} is already down: nothing of it runs")
    else:
        done = down(folder)
        print(f"stopped {len(done.stopped)} processes of the stand-in in {folder}")
        if done.strangers:
            print(f"left alone {len(done.strangers)} recorded process id(s) that now belong to other programs "
                  "(their start time or command line differ from the record): "
                  + "; ".join(f"{now.describe()}, recorded as `{was.cmdline[:60]}`" for was, now in done.strangers))


if __name__ == "__main__":
    from nre_ray.console import exit_status

    sys.exit(exit_status(main))
