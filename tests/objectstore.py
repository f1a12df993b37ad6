"""A real S3-compatible object store for the tests of ``s3://`` paths: ``moto_server`` on 127.0.0.1 (no mocks of
boto3 or pyarrow; both talk HTTP to it).

* :func:`object_store` (session fixture): ``s3://<bucket>``, a bucket on a server started on first use and stopped
  (by its process id) at the end of the session.
* :func:`moto_server`: a context manager that starts another server, e.g. one that refuses every credential.
* :func:`requests_to_store`: the requests the session's server received during a block (what a call read).

The ``AWS_*`` variables point at the session's server from before the first test runs, when the session holds a test
that uses :func:`object_store`: Ray's worker processes inherit the environment of the process that starts Ray, and
the session's Ray (``ray_cluster``) may be started by an earlier test. The credentials are moto's dummy ones; an
``AWS_PROFILE`` or session token from the developer's shell is removed so that no real account is ever reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from nre_ray.cluster.ports import free_port

BUCKET = "nre-ray-tests"
MOTO_SERVER = Path(sys.executable).with_name("moto_server")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
DROPPED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
           "AWS_SHARED_CREDENTIALS_FILE")
_PORT: dict[str, int] = {}


def _session_port() -> int:
    """The session server's port, chosen once; the environment points at it from then on."""
    if "port" not in _PORT:
        _PORT["port"] = free_port()
        for key in DROPPED:
            os.environ.pop(key, None)
        os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=f"http://127.0.0.1:{_PORT['port']}")
    return _PORT["port"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Point the environment at the session's server before any test runs (and before Ray starts), when a test of
    the session uses it."""
    if any("object_store" in getattr(item, "fixturenames", ()) for item in items):
        _session_port()


@contextlib.contextmanager
def moto_server(port: int | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``moto_server`` on 127.0.0.1 (``env``: extra variables for it, e.g. ``INITIAL_NO_AUTH_ACTION_COUNT=0``
    to refuse every credential); yield its endpoint URL; stop it by its process id."""
    if not MOTO_SERVER.exists():
        pytest.skip(f"{MOTO_SERVER} is not installed (pip install 'moto[server]')")
    port = port or free_port()
    proc = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(env or {})})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except urllib.error.HTTPError:  # it answered
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {port}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and nothing else
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def object_store() -> Iterator[str]:
    """``s3://nre-ray-tests``: an empty bucket on a ``moto_server`` for the whole session (tests write under their
    own prefixes)."""
    import boto3

    port = _session_port()
    os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    recording = tempfile.mkdtemp(prefix="nre_ray_moto_")  # where requests_to_store's recorder writes
    with moto_server(port, env={"MOTO_RECORDER_FILEPATH": str(Path(recording) / "requests.jsonl")}) as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}"
    shutil.rmtree(recording, ignore_errors=True)


@contextlib.contextmanager
def requests_to_store() -> Iterator[list[tuple[str, str]]]:
    """The requests the session's server (:func:`object_store`) receives while the block runs, as ``(method, path)``
    pairs (``("GET", "/nre-ray-tests/a/b.csv")``), filled in when the block ends: moto's own request recorder."""
    api = f"{os.environ['AWS_ENDPOINT_URL']}/moto-api/recorder"
    requests.post(f"{api}/reset-recording", timeout=10).raise_for_status()
    requests.post(f"{api}/start-recording", timeout=10).raise_for_status()
    seen: list[tuple[str, str]] = []
    try:
        yield seen
    finally:
        requests.post(f"{api}/stop-recording", timeout=10).raise_for_status()
        recorded = requests.get(f"{api}/download-recording", timeout=10)
        recorded.raise_for_status()
        for line in recorded.text.splitlines():
            entry = json.loads(line)
            seen.append((entry["method"], urllib.parse.unquote(urllib.parse.urlsplit(entry["url"]).path)))
