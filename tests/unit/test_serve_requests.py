"""Which requests ``python -m nre_ray.serve`` reads itself (plain JSON of the signature's columns) and which it leaves
to MLflow's scoring code, and the answer text it writes (MLflow's)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest
from mlflow.pyfunc.scoring_server import predictions_to_json

from nre_ray.cluster.ray_private import HAPROXY_BINDS, HAPROXY_REUSE
from nre_ray.serve.app import _frame, answer_json, ingress_env, plain_request, serve_runtime_env

ROW = {"sentence": "Acme was founded by Ann .", "head": "Acme", "head_offset": 0, "tail": "Ann", "tail_offset": 20}
JSON = "application/json"


def body(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def test_plain_requests_in_each_format_are_read_alike():
    split = {"columns": list(ROW), "data": [list(ROW.values())]}
    got = [plain_request(body({"dataframe_split": split, "params": {"top_k": 2}}), JSON),
           plain_request(body({"dataframe_records": [ROW], "params": {"top_k": 2}}), "application/json; charset=utf-8"),
           plain_request(body({"instances": [ROW], "params": {"top_k": 2}}), JSON)]
    assert got[0] == got[1] == got[2] == ((tuple(ROW), [list(ROW.values())]), 2)
    typed = plain_request(body({"dataframe_records": [{**ROW, "head_type": "ORG", "tail_type": "PER"}]}), JSON)
    frame = _frame([typed[0], got[0][0]], list(ROW))
    assert frame.to_dict("records") == [ROW, ROW] and frame["head_offset"].dtype == "int64"


@pytest.mark.parametrize("payload", [
    {"dataframe_records": [{**ROW, "head_offset": "0"}]},        # text where the signature says long
    {"dataframe_records": [{**ROW, "head_offset": 0.0}]},        # MLflow converts it: its code reads it
    {"dataframe_records": [{**ROW, "head_offset": True}]},
    {"dataframe_records": [{k: v for k, v in ROW.items() if k != "tail"}]},  # MLflow's error for a missing column
    {"dataframe_records": [{**ROW, "note": "x"}]},                # a column the signature does not have
    {"dataframe_records": [ROW, {**ROW, "head_type": "ORG"}]},   # rows of different columns
    {"dataframe_records": []},
    {"dataframe_split": {"columns": list(ROW), "data": [list(ROW.values())], "index": [0]}},
    {"inputs": [ROW]},
    {"dataframe_records": [ROW], "instances": [ROW]},
    {"dataframe_records": [ROW], "params": {"top_k": -1}},
    {"dataframe_records": [ROW], "params": {"top_k": 1, "other": 2}},
])
def test_anything_else_is_left_to_mlflow(payload):
    assert plain_request(body(payload), JSON) is None


def test_other_content_types_and_bad_json_are_left_to_mlflow():
    assert plain_request(b"sentence,head\n", "text/csv") is None
    assert plain_request(b"{not json", JSON) is None
    assert plain_request(body({"dataframe_records": [ROW]}), "application/json; charset=latin-1") is None


def test_the_answer_is_mlflows_text():
    predictions = pd.DataFrame({"predicted_relation": ["born_in"], "score": [0.42210930585861206],
                                "top_k_labels": [["born_in", "no_relation"]], "top_k_scores": [[0.42, 0.29]]})
    theirs = io.StringIO()
    predictions_to_json(predictions, theirs)
    assert answer_json(predictions, []) == theirs.getvalue()
    assert json.loads(answer_json(predictions, ["w"]))["warnings"] == ["w"]


def test_haproxy_ingress_keeps_its_files_and_ports_to_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "18404")  # the user's own setting is kept
    env = ingress_env("haproxy", str(tmp_path))
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
    paths = [v for k, v in env.items() if k.endswith(("_LOC", "_PATH", "_BASE", "_FILE"))]
    assert len(paths) == 5 and all(v.startswith(str(tmp_path)) for v in paths)
    assert env["RAY_SERVE_HAPROXY_METRICS_PORT"] != "9101"
    # either ingress: a proxy gets 30 s to start, not Serve's 5 (a loaded machine's worker start is slower)
    assert ingress_env("proxy", str(tmp_path)) == {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}
    assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "30"


def test_haproxy_connection_limit_is_one_serve_reads_and_fits_this_machines_file_limit(tmp_path):
    """Ray 2.59's HAProxy default (maxconn 20000) asks for 50036 file descriptors and crashed at start here (limit
    20000); ingress_env gives Ray 2.60's 4096, through the variable the installed Serve reads."""
    import resource
    from pathlib import Path

    import ray

    constants = Path(ray.__file__).parent / "serve" / "_private" / "constants.py"
    assert 'os.environ.get("RAY_SERVE_HAPROXY_MAXCONN"' in constants.read_text(encoding="utf-8")
    maxconn = int(ingress_env("haproxy", str(tmp_path))["RAY_SERVE_HAPROXY_MAXCONN"])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert maxconn == 4096 and (hard == resource.RLIM_INFINITY or 2.5 * maxconn + 100 < hard)  # (50036 for 20000)


#: In a fresh interpreter: Serve's HAProxy template, from the module that renders it, with or without the hook run
#: first (as a worker of the job runs it), and with the hook run after the templates were loaded: how often each
#: replaced text and its replacement occur; and whether the replica module binds its gRPC server on the node's address.
TEMPLATE_SCRIPT = """
import json, sys
from nre_ray.cluster.ray_private import serve_setup
if sys.argv[1] == "before":
    serve_setup()
import ray.serve._private.haproxy as haproxy
import ray.serve._private.replica as replica
if sys.argv[1] == "after":
    serve_setup()
template = haproxy.HAPROXY_CONFIG_TEMPLATE
print(json.dumps([[template.count(old), template.count(new)] for old, new in json.loads(sys.argv[2])]))
print(getattr(replica.add_port_to_grpc_server, "on_node_address", False))
"""


@pytest.mark.parametrize("when", ["none", "before", "after"])
def test_the_serve_hook_rewrites_haproxys_config_and_the_replicas_grpc_address(when):
    """Serve's generated HAProxy config reuses replica connections for first requests ("always": a replica that
    dies under a request closes its client's connection without an answer) and puts its statistics and metrics on
    every interface, and each replica's gRPC server listens on every interface; the job's setup hook makes the
    reuse "safe", binds the statistics and metrics to Serve's HTTP host and the replica's server to the node's
    address, whether it runs before Serve loads its modules (a new worker) or after. "none" fails when a Ray upgrade
    drops what is replaced, so that the hook is looked at again."""
    replaced = [HAPROXY_REUSE, *HAPROXY_BINDS]
    done = subprocess.run([sys.executable, "-c", TEMPLATE_SCRIPT, when, json.dumps(replaced)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts, bound = done.stdout.split("\n")[-3:-1]
    expected = [[3, 0], [1, 0], [1, 0]] if when == "none" else [[0, 3], [0, 1], [0, 1]]
    assert (json.loads(counts), bound) == (expected, str(when != "none"))
    assert serve_runtime_env() == {"worker_process_setup_hook": "nre_ray.cluster.ray_private.serve_setup"}


def test_haproxy_that_cannot_listen_is_one_line_naming_the_port():
    """The text Serve raised when a Ray process had taken the port between the command's check and HAProxy's bind
    (seen once, on an ephemeral port): one line saying what to do; anything else is raised as it was."""
    from types import SimpleNamespace

    from nre_ray.cluster.session import UsageError
    from nre_ray.serve.app import _ingress_failure

    seen = RuntimeError(
        "HAProxy crashed during startup: [NOTICE]   (12664) : haproxy version is 2.8.25-5cf5d0683\n"
        "[ALERT]    (12664) : Binding [/tmp/nre_hap12108/a1/haproxy.cfg:50] for frontend http_frontend: cannot bind "
        "socket (Address already in use) for [127.0.0.1:38971]\n"
        "[ALERT]    (12664) : [haproxy.main()] Some protocols failed to start their listeners! Exiting.")
    options = SimpleNamespace(host="127.0.0.1", port=38971)
    error = _ingress_failure(seen, options)
    assert isinstance(error, UsageError) and "\n" not in str(error)
    assert str(error).startswith("--port 38971: Serve's HAProxy could not listen on 127.0.0.1:38971 (")
    assert "cannot bind socket (Address already in use)" in str(error) and str(error).endswith("pass a free --port")
    other = RuntimeError("the controller died")
    assert _ingress_failure(other, options) is other


def test_a_proxy_given_up_before_it_started_is_one_line(monkeypatch):
    """Serve's controller killed its proxy actor before it ever ran (its ready check ran out at a load of 16 on 2
    cores, in a clean-clone run): one line saying what happened and what to do, not Ray's traceback; another actor's
    death is raised as it was."""
    from types import SimpleNamespace

    from ray.exceptions import ActorDiedError

    from nre_ray.cluster.session import UsageError
    from nre_ray.serve.app import _ingress_failure

    seen = ActorDiedError()
    seen.error_msg = ("The actor died unexpectedly before finishing this task.\n\tclass_name: HAProxyManager\n\t"
                      "name: SERVE_PROXY_ACTOR-d918a8455a9f\n\tnamespace: serve\nThe actor is dead because it was "
                      "killed by `ray.kill`.\nThe actor never ran - it was cancelled before it started running.")
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
    error = _ingress_failure(seen, SimpleNamespace(host="127.0.0.1", port=8000))
    assert isinstance(error, UsageError) and "\n" not in str(error)
    assert str(error).startswith("Serve's proxy did not start: its controller gave it up after 30 s (this machine's "
                                 "load: ")
    replica = ActorDiedError()
    replica.error_msg = "The actor died unexpectedly before finishing this task.\n\tname: SERVE_REPLICA::app#x"
    assert _ingress_failure(replica, SimpleNamespace(host="127.0.0.1", port=8000)) is replica
