"""A fake EC2 instance metadata service on 127.0.0.1 for the spot watcher's tests: a real HTTP server that speaks
IMDSv2 as EC2 does (``PUT /latest/api/token`` gives a session token; a ``GET`` without a valid token is answered 401)
and answers ``spot/instance-action`` with 404 until a test announces an interruption. The tests never reach the real
link-local address."""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FakeMetadata:
    """What the server answers, and what it was asked. ``notice``: the body of ``spot/instance-action`` (None: 404).
    Expire the session token with :meth:`expire_tokens`."""

    life_cycle: str = "spot"
    notice: dict | None = None
    tokens: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  #: (method, path), in order
    url: str = ""

    def announce(self, action: str, time: str) -> None:
        self.notice = {"action": action, "time": time}

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def polls(self) -> int:
        return sum(1 for method, path in self.requests if method == "GET" and path.endswith("spot/instance-action"))

    def answer(self, method: str, path: str, headers) -> tuple[int, str]:
        self.requests.append((method, path))
        if method == "PUT" and path == "/latest/api/token":
            if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, "missing X-aws-ec2-metadata-token-ttl-seconds"
            token = secrets.token_hex(8)
            self.tokens.add(token)
            return 200, token
        if method != "GET":
            return 405, ""
        if headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            return 401, ""
        if path == "/latest/meta-data/instance-life-cycle":
            return 200, self.life_cycle
        if path == "/latest/meta-data/spot/instance-action" and self.notice is not None:
            return 200, json.dumps(self.notice)
        return 404, ""


@contextlib.contextmanager
def metadata_server(port: int = 0) -> Iterator[FakeMetadata]:
    """A :class:`FakeMetadata` served on ``port`` of 127.0.0.1 (0: a free one; ``.url``) while the block runs."""
    fake = FakeMetadata()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            status, body = fake.answer(self.command, self.path, self.headers)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = _reply

        def log_message(self, *args) -> None:  # quiet: the test reads fake.requests
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
