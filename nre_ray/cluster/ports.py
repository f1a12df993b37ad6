"""Free TCP ports: the one helper that picks a port for a server nre_ray starts (the stand-in's, HAProxy's
statistics, the State API's dashboard)."""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(host: str = "127.0.0.1", taken: Collection[int] = ()) -> int:
    """A TCP port the system had free on ``host`` a moment ago (``""``: on every address), not among ``taken``
    (ports already chosen but not yet opened). A server has to take it soon: another process may take it first."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port
