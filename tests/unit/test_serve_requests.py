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

from nre_ray.cluster.ray_private import HAPROXY_REUSE
from nre_ray.serve.app import _frame, answer_json, ingress_env, ingress_runtime_env, plain_request

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
    assert ingress_env("proxy", str(tmp_path)) == {}


#: In a fresh interpreter: Serve's HAProxy template, from the module that renders it, with or without the hook run
#: first (as a worker of the job runs it), and with the hook run after the templates were loaded.
TEMPLATE_SCRIPT = """
import sys
from nre_ray.cluster.ray_private import haproxy_safe_reuse
if sys.argv[1] == "before":
    haproxy_safe_reuse()
import ray.serve._private.haproxy as haproxy
if sys.argv[1] == "after":
    haproxy_safe_reuse()
print(haproxy.HAPROXY_CONFIG_TEMPLATE.count({0!r}), haproxy.HAPROXY_CONFIG_TEMPLATE.count({1!r}))
"""


@pytest.mark.parametrize(("when", "counts"), [("none", "3 0"), ("before", "0 3"), ("after", "0 3")])
def test_the_haproxy_ingress_opens_a_replica_connection_per_client_connection(when, counts):
    """Serve's generated HAProxy config reuses replica connections for first requests ("always": a replica that
    dies under a request closes its client's connection without an answer); the job's setup hook makes it "safe",
    whether it runs before Serve loads its templates (a new worker) or after. "none" fails when a Ray upgrade drops
    the directive, so that the hook is looked at again."""
    script = TEMPLATE_SCRIPT.format(*HAPROXY_REUSE)
    done = subprocess.run([sys.executable, "-c", script, when], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == counts.split()
    assert ingress_runtime_env("haproxy") == {"worker_process_setup_hook": "nre_ray.cluster.ray_private."
                                              "haproxy_safe_reuse"}
    assert ingress_runtime_env("proxy") is None


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
