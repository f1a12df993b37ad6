"""``python -m nre_ray.cluster.spot_watch``: on a spot instance, turn EC2's interruption notice into a Ray preemption.

AWS announces that it takes a spot instance back about two minutes ahead, in the instance metadata: the path
``/latest/meta-data/spot/instance-action`` answers 404 until then, and ``{"action": "terminate", "time":
"2026-...Z"}`` (or ``"stop"``, ``"hibernate"``) once the notice is out. The watcher polls it (IMDSv2: a session token
from ``PUT /latest/api/token``, sent with every ``GET``) and, on a notice, drains this machine's Ray node with reason
``DRAIN_NODE_REASON_PREEMPTION`` and the notice's time as the deadline (:func:`nre_ray.cluster.ray_private.
drain_for_preemption`). Ray Train then sees the preemption coming (``ray.train.get_preemption_info()``) and the
autoscaler stops placing work on the node. A notice drains once; the watcher then exits.

cluster.yaml starts it on every worker node after ``ray start``; on an instance that is not spot (the metadata's
``instance-life-cycle``) it exits at once. Metadata that does not answer (not on EC2, a blip) is logged once and
polled on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from nre_ray.cluster import ray_private
from nre_ray.config import REQUIRED, CommandParser, add_options, option, options_from

log = logging.getLogger("nre_ray.spot_watch")

#: EC2's instance metadata service (link-local, reachable from the instance only).
METADATA = "http://169.254.169.254"
#: The variables that set the endpoint and the polling interval when the options are not given.
ENDPOINT_ENV = "NRE_RAY_SPOT_METADATA"
INTERVAL_ENV = "NRE_RAY_SPOT_POLL_S"
#: AWS polls the notice every 5 s in its own examples: a notice comes two minutes ahead.
DEFAULT_INTERVAL_S = 5.0
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
LIFE_CYCLE_PATH = "/latest/meta-data/instance-life-cycle"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_S = 21600  # the longest IMDSv2 allows (6 h); an expired token answers 401 and is renewed


@dataclass(frozen=True)
class Notice:
    """An interruption notice: what AWS will do (``terminate``, ``stop``, ``hibernate``) and when, in milliseconds
    since the epoch."""

    action: str
    deadline_ms: int
    time: str  #: as AWS wrote it

    def describe(self) -> str:
        return f"spot interruption notice: {self.action} at {self.time}"


def parse_notice(body: str) -> Notice:
    """The notice in the body of ``spot/instance-action``; ValueError if it is not one."""
    try:
        notice = json.loads(body)
        when = datetime.fromisoformat(notice["time"])
        action = str(notice["action"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not an interruption notice: {body[:200]!r} ({type(err).__name__}: {err})") from None
    if when.tzinfo is None:
        raise ValueError(f"not an interruption notice: its time {notice['time']!r} has no time zone")
    return Notice(action, int(when.timestamp() * 1000), notice["time"])


class Metadata:
    """EC2 instance metadata at ``endpoint`` through IMDSv2 (the session token it requires where IMDSv1 is off)."""

    def __init__(self, endpoint: str, timeout: float = 2.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None

    def get(self, path: str) -> str | None:
        """The text at ``path``, None if the metadata has none there (404). OSError if the service does not
        answer."""
        try:
            return self._read(path)
        except urllib.error.HTTPError as err:
            if err.code != 401:
                raise
        self._token = None  # the token expired: one new token, one more try
        return self._read(path)

    def _read(self, path: str) -> str | None:
        if self._token is None:
            self._token = self._new_token()
        request = urllib.request.Request(f"{self.endpoint}{path}", headers={"X-aws-ec2-metadata-token": self._token})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                return reply.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def _new_token(self) -> str:
        request = urllib.request.Request(f"{self.endpoint}{TOKEN_PATH}", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        with urllib.request.urlopen(request, timeout=self.timeout) as reply:
            return reply.read().decode()


def this_node(gcs_address: str) -> str:
    """The id of the Ray node of this machine: the one alive node at this machine's IP address. RuntimeError if
    there is none or more than one (several nodes on one host: pass ``--node-id``)."""
    import ray.util

    ip = ray.util.get_node_ip_address()
    here = sorted(node for node, address in ray_private.alive_nodes(gcs_address).items() if address == ip)
    if len(here) != 1:
        raise RuntimeError(f"{len(here)} Ray nodes alive at {ip} (this machine's address) in the cluster at "
                           f"{gcs_address}: {', '.join(here) or 'none'}; pass --node-id")
    return here[0]


def watch(metadata: Metadata, drain: Callable[[Notice], None], interval: float) -> Notice:
    """Poll ``metadata`` every ``interval`` seconds until an interruption notice comes and ``drain`` has taken it;
    returns the notice. A metadata service that does not answer, or a drain that fails, is logged once and tried
    again at the next poll."""
    failing = ""  # what failed at the last poll, logged once until it changes
    while True:
        try:
            body = metadata.get(NOTICE_PATH)
            if body is not None:
                notice = parse_notice(body)
                drain(notice)
                return notice
            if failing:
                log.info("the instance metadata answers again: no interruption notice")
            failing = ""
        except Exception as err:  # a watcher that stops watching misses the notice: say it, go on
            what = f"{type(err).__name__}: {err}"
            if what != failing:
                log.warning("%s; polling on every %g s", what, interval)
            failing = what
        time.sleep(interval)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


@dataclass
class SpotWatchOptions:
    """The options of ``python -m nre_ray.cluster.spot_watch``, one flag each."""

    address: str = option(REQUIRED, "The Ray cluster's GCS, HOST:PORT (on cluster.yaml's nodes: $RAY_HEAD_IP:6379).")
    node_id: str | None = option(None, "The Ray node to drain (default: the one node alive at this machine's IP "
                                       "address).")
    endpoint: str = option(METADATA, f"The instance metadata service (default: ${ENDPOINT_ENV}, else {METADATA}).",
                           env=ENDPOINT_ENV)
    interval: float = option(DEFAULT_INTERVAL_S, f"Seconds between polls (default: ${INTERVAL_ENV}, else "
                                                 f"{DEFAULT_INTERVAL_S:g}).", parse=_positive_seconds, env=INTERVAL_ENV)


def build_parser() -> argparse.ArgumentParser:
    """The options of :class:`SpotWatchOptions`."""
    parser = CommandParser(
        prog="python -m nre_ray.cluster.spot_watch",
        description="Watch the EC2 instance metadata for a spot interruption notice and drain this machine's Ray "
                    "node for preemption (reason DRAIN_NODE_REASON_PREEMPTION, the notice's time as deadline), so "
                    "that Ray Train saves a checkpoint and goes on without it. Exits after one drain, or at once on "
                    "an instance that is not spot. See docs/cluster.md.")
    add_options(parser, SpotWatchOptions)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 drained or not spot, 2 a usage error, 130 interrupted)."""
    args = options_from(build_parser().parse_args(argv), SpotWatchOptions)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spot_watch: %(message)s", stream=sys.stdout)
    metadata = Metadata(args.endpoint)
    try:
        life_cycle = metadata.get(LIFE_CYCLE_PATH)
    except OSError:
        life_cycle = None  # not answering yet: watch anyway, the polls log it
    if life_cycle is not None and life_cycle.strip() != "spot":
        log.info("instance-life-cycle is %r, not spot: no interruption notice will come; exiting", life_cycle)
        return 0

    def drain(notice: Notice) -> None:
        node = args.node_id or this_node(args.address)
        log.info("%s; draining Ray node %s for preemption", notice.describe(), node)
        ray_private.drain_for_preemption(node, max(0.0, notice.deadline_ms / 1000 - time.time()), args.address,
                                         notice.describe())

    # Ray's modules load now, not when the notice comes: the drain's deadline is counted from just before the call.
    ray_private.load_drain_modules()

    log.info("watching %s%s every %g s", args.endpoint, NOTICE_PATH, args.interval)
    try:
        notice = watch(metadata, drain, args.interval)
    except KeyboardInterrupt:
        return 130
    log.info("drained: Ray knows that this node goes at %s", notice.time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
