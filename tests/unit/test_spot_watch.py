"""The spot watcher (nre_ray.cluster.spot_watch) against a fake EC2 metadata service on 127.0.0.1 (a real HTTP
server that speaks IMDSv2, tests/metadata_server.py); the drain itself, in a real Ray, is in
tests/integration/test_spot_drain.py."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nre_ray.cluster import spot_watch
from nre_ray.cluster.spot_watch import NOTICE_PATH, Metadata, Notice, parse_notice, watch
from tests.metadata_server import metadata_server
from tests.procs import free_port


def test_a_notice_gives_the_action_and_its_time_as_the_deadline():
    notice = parse_notice('{"action": "terminate", "time": "2026-12-02T05:12:30Z"}')
    assert notice == Notice("terminate", 1796188350000, "2026-12-02T05:12:30Z")
    assert notice.describe() == "spot interruption notice: terminate at 2026-12-02T05:12:30Z"


@pytest.mark.parametrize("body", ["", "{}", '{"action": "stop"}', '{"action": "stop", "time": "soon"}',
                                  '{"action": "stop", "time": "2026-12-02T05:12:30"}', "[1]"])
def test_what_is_not_a_notice_is_refused(body):
    with pytest.raises(ValueError, match="not an interruption notice"):
        parse_notice(body)


def test_the_metadata_is_read_with_an_imdsv2_token_renewed_when_it_expires():
    with metadata_server() as fake:
        metadata = Metadata(fake.url)
        assert metadata.get(NOTICE_PATH) is None  # 404: no notice
        fake.announce("stop", "2026-12-02T05:12:30Z")
        assert parse_notice(metadata.get(NOTICE_PATH)).action == "stop"
        fake.expire_tokens()
        assert parse_notice(metadata.get(NOTICE_PATH)).action == "stop"
    assert [m for m, _ in fake.requests] == ["PUT", "GET", "GET", "GET", "PUT", "GET"]  # one token until it expired


def test_a_notice_is_drained_once_and_a_failed_drain_is_tried_again():
    drains: list[Notice] = []

    def drain(notice: Notice) -> None:
        drains.append(notice)
        if len(drains) == 1:
            raise ConnectionError("the GCS does not answer")

    with metadata_server() as fake:
        fake.announce("terminate", "2026-12-02T05:12:30Z")
        notice = watch(Metadata(fake.url), drain, interval=0.01)
        polls = fake.polls()
    assert notice.deadline_ms == 1796188350000
    assert drains == [notice, notice] and polls == 2  # the failed drain, then the one that took; then no more polls


def test_metadata_that_does_not_answer_is_logged_once_and_polled_on(caplog):
    port = free_port()
    drained: list[Notice] = []
    watcher = threading.Thread(target=lambda: drained.append(watch(Metadata(f"http://127.0.0.1:{port}", timeout=0.5),
                                                                   lambda notice: None, interval=0.05)),
                               daemon=True)
    with caplog.at_level(logging.INFO, logger="nre_ray.spot_watch"):
        watcher.start()
        time.sleep(1.0)  # about 20 polls of a closed port
        with metadata_server(port) as fake:
            fake.announce("terminate", "2026-12-02T05:12:30Z")
            watcher.join(timeout=10)
    assert drained and drained[0].action == "terminate"
    lines = [r.getMessage() for r in caplog.records]
    assert len([line for line in lines if "polling on every 0.05 s" in line]) == 1, lines
    assert "Connection refused" in lines[0]


def test_an_instance_that_is_not_spot_is_not_watched(caplog):
    with metadata_server() as fake, caplog.at_level(logging.INFO, logger="nre_ray.spot_watch"):
        fake.life_cycle = "on-demand"
        assert spot_watch.main(["--address", "127.0.0.1:9", "--endpoint", fake.url]) == 0
    assert fake.polls() == 0
    assert "instance-life-cycle is 'on-demand', not spot" in caplog.text


@pytest.mark.parametrize("interval", ["0", "-1", "soon"])
def test_a_bad_interval_is_refused(interval, monkeypatch, capsys):
    monkeypatch.setenv(spot_watch.INTERVAL_ENV, interval)
    with pytest.raises(SystemExit) as exit_:
        spot_watch.main(["--address", "127.0.0.1:9"])
    assert exit_.value.code == 2 and "--interval" in capsys.readouterr().err


def test_the_endpoint_and_interval_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(spot_watch.ENDPOINT_ENV, "http://127.0.0.1:1")
    monkeypatch.setenv(spot_watch.INTERVAL_ENV, "0.5")
    args = spot_watch.build_parser().parse_args(["--address", "h:1"])
    assert (args.endpoint, args.interval) == ("http://127.0.0.1:1", 0.5)
    monkeypatch.delenv(spot_watch.ENDPOINT_ENV)
    monkeypatch.delenv(spot_watch.INTERVAL_ENV)
    args = spot_watch.build_parser().parse_args(["--address", "h:1"])
    assert (args.endpoint, args.interval) == ("http://169.254.169.254", 5.0)


def test_the_drain_modules_loaded_before_a_notice_are_what_the_drain_uses():
    """Contract of ray_private.load_drain_modules and drain_for_preemption (Ray 2.60): the GCS client's drain_node
    (its arguments in this order), the preemption reason, and the connected worker's GCS client."""
    import inspect
    import subprocess
    import sys

    import ray._private.worker
    from ray._raylet import GcsClient, InnerGcsClient
    from ray.core.generated import autoscaler_pb2

    assert "__getattr__" in vars(GcsClient)  # GcsClient passes drain_node on to its InnerGcsClient
    assert list(inspect.signature(InnerGcsClient.drain_node).parameters)[:5] == [
        "self", "node_id", "reason", "reason_message", "deadline_timestamp_ms"]
    assert autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION") > 0
    assert "worker.gcs_client = " in inspect.getsource(ray._private.worker.connect)  # what a connected driver has
    code = ("import sys\nfrom nre_ray.cluster import ray_private\nray_private.load_drain_modules()\n"
            "print(sorted(m for m in ('ray._raylet', 'ray.core.generated.autoscaler_pb2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["['ray._raylet',", "'ray.core.generated.autoscaler_pb2']"]
