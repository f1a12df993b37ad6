"""One way to join Ray for every command: each address form, --address over RAY_ADDRESS, and one line (exit 2, no
traceback) for a dashboard's http:// address or an address where nothing answers."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nre_ray.cluster.session import (
    ANSWER_TIMEOUT_S,
    RayAddress,
    UsageError,
    check_address,
    resolve_address,
    start_ray,
)
from tests.procs import env, free_port
from tests.unit.test_inference import make_checkpoint

SAMPLE = Path(__file__).resolve().parents[2] / "nre_ray" / "data" / "sample"


@pytest.mark.parametrize(("given", "kind", "host", "port"), [
    ("10.0.0.5:6379", "gcs", "10.0.0.5", 6379),
    ("head.example.com:6380", "gcs", "head.example.com", 6380),
    ("[::1]:6379", "gcs", "::1", 6379),
    ("ray://10.0.0.5:10001", "client", "10.0.0.5", 10001),
    ("auto", "auto", None, None),
])
def test_each_address_form(monkeypatch, given, kind, host, port):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(given) == RayAddress(kind, given, "--address", host, port)
    monkeypatch.setenv("RAY_ADDRESS", given)  # as `ray job submit` sets it for its driver, or a user's shell
    assert resolve_address(None) == RayAddress(kind, given, "RAY_ADDRESS", host, port)


def test_no_address_is_a_local_ray_and_the_option_wins_over_the_variable(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) == RayAddress("local", None, "RAY_ADDRESS")
    assert resolve_address(None).joining() == "starting a local Ray"
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")  # the stand-in's env.sh
    where = resolve_address("10.0.0.5:6379")
    assert (where.kind, where.source) == ("gcs", "--address")
    assert where.joining() == "joining the Ray cluster at 10.0.0.5:6379"


@pytest.mark.parametrize("dashboard", ["http://127.0.0.1:8265", "https://ray.example.com"])
def test_a_dashboard_address_says_what_to_do(monkeypatch, dashboard):
    monkeypatch.setenv("RAY_ADDRESS", dashboard)
    with pytest.raises(UsageError) as caught:
        resolve_address(None)
    assert str(caught.value) == (f"RAY_ADDRESS {dashboard} is the Ray dashboard (for ray job submit); to run on that "
                                 "cluster submit the command with ray job submit, or give --address HOST:GCS_PORT")
    with pytest.raises(UsageError, match=f"^--address {dashboard} is the Ray dashboard"):
        resolve_address(dashboard)


@pytest.mark.parametrize("bad", ["head", "head:port", "s3://bucket/x", "ray://head", "10.0.0.5:6379/x"])
def test_what_is_not_a_ray_address_is_refused(bad):
    with pytest.raises(UsageError, match=r"not a Ray address; give HOST:PORT .* or auto"):
        resolve_address(bad)


def test_an_address_where_nothing_answers_is_one_clear_error_at_once(monkeypatch):
    """Ray itself retries such an address for minutes (a Ray Client for 30 s)."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever Ray this test session has joined
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    port = free_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(UsageError, match=rf"^--address {address}: nothing answers there \(.*\)\. Check that the "
                                             r"cluster is up"):
            start_ray(address)


@pytest.fixture
def web_server():
    """An HTTP server on a free loopback port (Python's own, as a dashboard's port would answer): its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_that_answers_http_is_named_at_once(monkeypatch, web_server):
    """The dashboard's port (8265) given as the GCS's: ``ray.init`` waits there forever, repeating warnings."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    for address, what in ((f"127.0.0.1:{web_server}", "Ray's GCS. Give the head's GCS port (6379 by default)"),
                          (f"ray://127.0.0.1:{web_server}", "a Ray Client server. Give the head's Ray Client server "
                                                              "port (10001 by default)")):
        began = time.monotonic()
        with pytest.raises(UsageError) as caught:
            start_ray(address)
        assert str(caught.value) == (
            f"--address {address}: that port answers HTTP (a web server, such as the Ray dashboard: port 8265 by "
            f"default), not {what}, or submit the command with ray job submit --address http://127.0.0.1:{web_server}")
        assert time.monotonic() - began < 3


def test_a_port_that_accepts_and_never_answers_is_refused_within_seconds(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        with pytest.raises(UsageError, match=rf"^--address {address}: something accepts connections there but does "
                                             rf"not answer as Ray's GCS within {ANSWER_TIMEOUT_S:g} s\. Check that "):
            check_address(address)
        assert time.monotonic() - began < ANSWER_TIMEOUT_S + 2


def _run(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env(**extra),
                          timeout=120)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_the_commands_refuse_a_dashboard_address_in_one_line(tmp_path):
    """RAY_ADDRESS as the stand-in's env.sh writes it (``ray job`` needs it there); nothing answers at its port."""
    dashboard = f"http://127.0.0.1:{free_port()}"
    expected = (f"error: RAY_ADDRESS {dashboard} is the Ray dashboard (for ray job submit); to run on that cluster "
                "submit the command with ray job submit, or give --address HOST:GCS_PORT")
    rows = tmp_path / "rows.csv"
    rows.write_text("".join((SAMPLE / "test.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:4]),
                    encoding="utf-8")
    # a real checkpoint: predict reads it first (its task says how the input is read), then asks for Ray
    model = make_checkpoint(tmp_path / "model")
    evaluate = _run("nre_ray.evaluate", "--model", str(model), "--data", str(rows), cwd=tmp_path,
                    RAY_ADDRESS=dashboard)
    assert _one_error_line(evaluate) == expected
    # predict needs Ray only for an input of more than --local-max-rows rows
    predict = _run("nre_ray.predict", "--model", str(model), "--input", str(rows), "--output",
                   str(tmp_path / "out.csv"), "--local-max-rows", "0", cwd=tmp_path, RAY_ADDRESS=dashboard)
    assert _one_error_line(predict) == expected
    train = _run("nre_ray.train", "--address", dashboard, "--epochs", "1", cwd=tmp_path)
    assert _one_error_line(train) == expected.replace("RAY_ADDRESS", "--address", 1)


def test_address_wins_over_ray_address_and_nothing_answering_there_is_one_line(tmp_path):
    gcs = f"127.0.0.1:{free_port()}"
    inspect = _run("nre_ray.data", "inspect", "--data-dir", str(SAMPLE), "--cache-dir", str(tmp_path / "cache"),
                   "--address", gcs, cwd=tmp_path, RAY_ADDRESS="http://127.0.0.1:8265")
    assert _one_error_line(inspect).startswith(f"error: --address {gcs}: nothing answers there (")
