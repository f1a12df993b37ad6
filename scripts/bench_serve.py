"""Online serving speed: ``python -m nre_ray.serve`` (Ray Serve) against ``mlflow models serve``, serving the same
logged model, under the same bounded load, in one run.

``python -m nre_ray.serve`` runs with its defaults (Ray Serve's HAProxy ingress) and, unless ``--no-proxy-ingress``,
a second time with ``--ingress proxy`` (Serve's Python HTTP proxy), for comparison.

The load: ``--requests`` one-row ``POST /invocations`` requests (rows of the bundled sample's test split, in turn) at
each concurrency of ``--concurrency`` (1, 8, 32), from a client in this process on 127.0.0.1 only (one keep-alive
connection per client thread), after ``--warmup`` requests. For each server and concurrency: throughput (answers per
second, wall clock) and the p50 / p99 latency. The servers run one at a time (the other one stopped), each with its
defaults unless the options below say otherwise; every answer must be HTTP 200.

Without ``--model`` the default CNN is trained for one epoch on the bundled sample first and logged in a scratch
MLflow store (the model both servers serve: ``runs:/<run_id>/model``).

Usage: ``python scripts/bench_serve.py [--model runs:/RUN_ID/model --tracking-uri URI] [--json bench_serve.json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import BENCH_ENV, REPO, machine, table

SAMPLE_TEST = REPO / "nre_ray" / "data" / "sample" / "test.csv"
UP_TIMEOUT_S = 180


def train_model(work: Path) -> tuple[str, str]:
    """One epoch of the default CNN on the bundled sample, logged in a scratch store: (model URI, tracking URI)."""
    from nre_ray.train import main as train_main

    uri = f"sqlite:///{work / 'mlflow.db'}"
    summary = work / "summary.json"
    code = train_main(["--epochs", "1", "--num-workers", "1", "--run-name", "bench-serve", "--experiment-name",
                       "bench_serve", "--tracking-uri", uri, "--storage-path", str(work / "ray_results"),
                       "--cache-dir", str(work / "cache"), "--summary-json", str(summary)])
    if code != 0:
        raise SystemExit(f"training failed (exit {code})")
    return json.loads(summary.read_text())["model_uri"], uri


def bodies(n: int = 64) -> list[bytes]:
    """One-row request bodies (``dataframe_split``) from the sample's test rows."""
    import pandas as pd

    rows = pd.read_csv(SAMPLE_TEST, nrows=n, keep_default_na=False)
    columns = ["sentence", "head", "head_offset", "tail", "tail_offset", "head_type", "tail_type"]
    return [json.dumps({"dataframe_split": json.loads(rows.iloc[i:i + 1][columns].to_json(orient="split",
                                                                                          index=False))}).encode()
            for i in range(len(rows))]


def free_port() -> int:
    from nre_ray.cluster.ports import free_port as product_free_port

    return product_free_port()


class Server:
    """A server subprocess in its own process group, stopped with everything it started."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, env: dict[str, str]) -> None:
        self.name, self.port, self.log = name, port, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                         start_new_session=True)

    def wait_up(self) -> float:
        """Seconds until ``GET /ping`` answers 200."""
        start = time.perf_counter()
        while time.perf_counter() - start < UP_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/ping")
                if conn.getresponse().status == 200:
                    return time.perf_counter() - start
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer /ping within {UP_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGINT (a clean shutdown), then SIGKILL to the process group after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # what is left in its group
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def load(port: int, payloads: list[bytes], requests: int, concurrency: int) -> dict[str, float]:
    """``requests`` one-row requests from ``concurrency`` threads: throughput and latency percentiles (ms)."""
    latencies: list[float] = []
    errors: list[str] = []
    counter = iter(range(requests))
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            start = time.perf_counter()
            conn.request("POST", "/invocations", body=payloads[i % len(payloads)],
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            mine.append(time.perf_counter() - start)
            if response.status != 200:
                errors.append(f"{response.status}: {text[:300]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
    ordered = sorted(latencies)
    return {"requests": requests, "concurrency": concurrency, "seconds": wall, "rps": requests / wall,
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def cpu_seconds(session: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of each process of ``session`` (a server and all it started; Ray's
    processes by their title, e.g. ``ray::ServeReplica:...``, the others by their program) and of this process
    (the client)."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {"client": sum(os.times()[:2])}
    for folder in Path("/proc").iterdir():
        if not folder.name.isdigit():
            continue
        try:
            stat = (folder / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) != session:
                continue
            argv = (folder / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # ended meanwhile
        name = argv[0].decode(errors="replace").split(" ")[0]
        name = name if name.startswith("ray::") else Path(name).name
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return seconds


def measure(server: Server, payloads: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """Start-up time, then the load at each concurrency (after a warm-up), then a clean stop. Each level also says
    the CPU milliseconds per request of the client and of each of the server's processes."""
    try:
        up = server.wait_up()
        load(server.port, payloads, args.warmup, max(args.concurrency))
        levels = []
        for concurrency in args.concurrency:
            before = cpu_seconds(server.proc.pid)
            levels.append(load(server.port, payloads, args.requests, concurrency))
            after = cpu_seconds(server.proc.pid)
            spent = {k: 1000 * (v - before.get(k, 0.0)) / args.requests for k, v in after.items()}
            levels[-1]["cpu_ms_per_request"] = {k: round(v, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
                                                if v >= 0.05}
            print(f"{server.name}: {levels[-1]}", flush=True)
        return {"startup_s": up, "levels": levels, "loadavg": os.getloadavg()}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--model", help="An MLflow model URI (runs:/<id>/model, models:/<name>/<version>) both "
                        "servers serve (default: train one epoch on the bundled sample).")
    parser.add_argument("--tracking-uri", help="The MLflow store of --model.")
    parser.add_argument("--requests", type=int, default=1000, help="Requests per concurrency (default: 1000).")
    parser.add_argument("--warmup", type=int, default=100, help="Requests before measuring (default: 100).")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8, 32],
                        help="Concurrent clients, comma-separated (default: 1,8,32).")
    parser.add_argument("--serve-args", default="", help="More options for python -m nre_ray.serve, e.g. "
                        "'--max-replicas 2' (default: none, its defaults).")
    parser.add_argument("--no-proxy-ingress", action="store_true", help="Do not also measure nre_ray.serve with "
                        "--ingress proxy.")
    parser.add_argument("--mlflow-workers", type=int, default=1, help="mlflow models serve --workers "
                        "(default: 1, its default).")
    parser.add_argument("--json", type=Path, default=Path("bench_serve.json"), help="Results (default: %(default)s).")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0 or min(args.concurrency) < 1:
        parser.error("--requests and --concurrency must be >= 1, --warmup >= 0")

    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        work = Path(tmp)
        model, tracking_uri = (args.model, args.tracking_uri) if args.model else train_model(work)
        env = {**os.environ, **BENCH_ENV, "MLFLOW_TRACKING_URI": tracking_uri or os.environ.get(
            "MLFLOW_TRACKING_URI", ""), "PYTHONPATH": str(REPO),
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # mlflow starts uvicorn from PATH
        payloads = bodies()
        result: dict[str, Any] = {"machine": machine(), "model": model, "requests": args.requests,
                                  "serve_args": args.serve_args, "mlflow_workers": args.mlflow_workers}
        port = free_port()
        mlflow = Server("mlflow models serve", [sys.executable, "-m", "mlflow", "models", "serve", "-m", model,
                                                "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port),
                                                "-w", str(args.mlflow_workers)], port, work / "mlflow.log", env)
        result["mlflow"] = measure(mlflow, payloads, args)
        port = free_port()
        ours = Server("nre_ray.serve", [sys.executable, "-m", "nre_ray.serve", "--model", model, "--port", str(port),
                                        *args.serve_args.split()], port, work / "serve.log", env)
        result["nre_ray_serve"] = measure(ours, payloads, args)
        if not args.no_proxy_ingress:
            port = free_port()
            proxied = Server("nre_ray.serve --ingress proxy", [sys.executable, "-m", "nre_ray.serve", "--model", model,
                                                               "--port", str(port), *args.serve_args.split(),
                                                               "--ingress", "proxy"], port, work / "proxy.log", env)
            result["nre_ray_serve_proxy"] = measure(proxied, payloads, args)

    rows = []
    proxied_levels = result.get("nre_ray_serve_proxy", {}).get("levels") or [None] * len(args.concurrency)
    for theirs, mine, proxied in zip(result["mlflow"]["levels"], result["nre_ray_serve"]["levels"], proxied_levels,
                                     strict=True):
        rows.append([theirs["concurrency"], f"{theirs['rps']:.0f}", f"{theirs['p50_ms']:.1f}",
                     f"{theirs['p99_ms']:.1f}", f"{mine['rps']:.0f}", f"{mine['p50_ms']:.1f}", f"{mine['p99_ms']:.1f}",
                     f"{mine['rps'] / theirs['rps']:.2f}x"]
                    + ([f"{proxied['rps']:.0f}", f"{proxied['p99_ms']:.1f}", f"{proxied['rps'] / theirs['rps']:.2f}x"]
                       if proxied else []))
    result["table"] = table(["concurrency", "mlflow req/s", "mlflow p50 ms", "mlflow p99 ms", "nre_ray.serve req/s",
                             "p50 ms", "p99 ms", "throughput ratio"]
                            + (["--ingress proxy req/s", "p99 ms", "ratio"] if proxied_levels[0] else []), rows)
    args.json.write_text(json.dumps(result, indent=2, default=str))
    print(result["table"])
    print(f"machine: {result['machine']['nproc']} CPUs, load average at start {result['machine']['loadavg_at_start']}"
          f"; results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
