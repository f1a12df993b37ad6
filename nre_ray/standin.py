"""``python -m nre_ray.standin up|status|upload|kill-node|preempt-node|down``: the command line of the cluster stand-in
(:mod:`nre_ray.cluster.standin_cluster`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from nre_ray.cluster.session import TELEMETRY_ENV, UsageError, quiet_environ
from nre_ray.cluster.standin_cluster import STATE_FILE, Standin, down, kill_node, preempt_node, status, up, upload
from nre_ray.config import REQUIRED, CommandParser, add_options, option, options_from

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


@dataclass
class StandinOptions:
    """The command and the options of ``python -m nre_ray.standin``, one flag each (:data:`TAKEN_BY` says which
    commands take which)."""

    command: str = option(REQUIRED, "The command, one of COMMANDS.", cli=False)
    dir: str = option(".standin", "Folder for the stand-in's state, logs and MLflow database (default: .standin).")
    bucket: str = option("nre-ray", "Bucket created in the object store (default: nre-ray).")
    max_workers: int = option(3, "Worker nodes the autoscaler may add (default 3).")
    cpus_per_node: float = option(1.0, "CPUs of each worker node (default 1).")
    idle_minutes: float = option(1.0, "Minutes before the autoscaler removes an idle node (default 1).")
    s3_port: int = option(9000, "Port of the object store's S3 API on 127.0.0.1: AWS_ENDPOINT_URL in env.sh "
                                "(default 9000).")
    gcs_port: int = option(6379, "Port of the Ray head (its GCS), the address nodes and `ray start --address` join "
                                 "(default 6379).")
    dashboard_port: int = option(8265, "Port of the Ray dashboard, where `ray job submit` sends jobs: RAY_ADDRESS in "
                                       "env.sh (default 8265).")
    mlflow_port: int = option(5000, "Port of the MLflow tracking server: TRACKING_URI in env.sh (default 5000).")
    no_auth: bool = option(False, "Start Ray without token authentication and MLflow without a password, as before "
                                  "(default: a new Ray token and MLflow password in <dir>/secrets).")
    node: str | None = option(None, "The id of the worker node to lose (default: one that runs a training worker).")
    deadline: float = option(120.0, "Seconds from the notice to the node's end (default 120, what AWS gives a spot "
                                    "instance).")
    local: str | None = option(None, "A local file or folder.", flag="LOCAL")
    uri: str | None = option(None, "Where it goes: s3://BUCKET/KEY.", flag="URI")


#: The options (fields of :class:`StandinOptions`) by the commands that take them; each is taken after its command
#: and, as before, also before it.
TAKEN_BY: dict[tuple[str, ...], tuple[str, ...]] = {
    tuple(COMMANDS): ("dir",),
    ("up",): ("bucket", "max_workers", "cpus_per_node", "idle_minutes", "s3_port", "gcs_port", "dashboard_port",
              "mlflow_port", "no_auth"),
    ("kill-node", "preempt-node"): ("node",),
    ("preempt-node",): ("deadline",),
}
#: The positional arguments of a command (fields of :class:`StandinOptions`), taken after it only.
ARGUMENTS: dict[str, tuple[str, ...]] = {"upload": ("local", "uri")}


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
    for applies, names in TAKEN_BY.items():
        add_options(parser, StandinOptions, names=names,
                    group=None if applies == tuple(COMMANDS) else f"options of {' and '.join(applies)}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, what in COMMANDS.items():
        command = commands.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]}.")
        add_options(command, StandinOptions, names=ARGUMENTS.get(name, ()))
        for applies, names in TAKEN_BY.items():
            if name in applies:  # given here, it wins; not given, the value before the command (or its default) stays
                add_options(command, StandinOptions, names=names, suppress=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 done, 2 a usage error, 130 interrupted)."""
    args = options_from(build_parser().parse_args(argv), StandinOptions)
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


def run(args: StandinOptions) -> None:
    """Do the command of ``args`` and say what it did."""
    folder = Path(args.dir)
    if args.command == "up":
        state = up(folder, args.bucket, args.max_workers, args.cpus_per_node, idle_minutes=args.idle_minutes,
                   ports={"s3": args.s3_port, "gcs": args.gcs_port, "dashboard": args.dashboard_port,
                          "mlflow": args.mlflow_port}, auth=not args.no_auth, say=print)
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
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))
