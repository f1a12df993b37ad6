"""The stand-in's object store: moto's S3 server behind a signature check of its own
(``python -m nre_ray.cluster.s3_store --port PORT``, started by :func:`nre_ray.cluster.standin_cluster.up`).

moto (``moto_server``) answers anyone: unsigned requests and requests signed with any key alike. It can check
signatures itself (``INITIAL_NO_AUTH_ACTION_COUNT`` with an IAM user and key), but its ``/moto-api`` endpoints stay
open whatever that setting: an unsigned ``POST /moto-api/reset-auth`` turns the check off again, ``/moto-api/reset``
empties the store and ``/moto-api/data.json`` lists its contents. So this server runs moto's application in-process
behind a WSGI layer that admits a request only when it carries an AWS Signature Version 4 ``Authorization`` header
made with the stand-in's key pair (the ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` of its environment, new
for each stand-in), checked as S3 checks it (:func:`check_request`, botocore's ``S3SigV4Auth`` over the signed
headers), signed within the last 15 minutes; or a presigned URL made with that pair and not expired (MLflow's server
hands those out for downloads of its artifacts). Everything else gets S3's own 403 answer: anonymous requests,
other keys, wrong signatures and every ``/moto-api`` path.

The body's hash is taken as the signed ``x-amz-content-sha256`` header says (S3 checks the body against it too;
moto does not, and nothing here can change a body on its way over the loopback).
"""

from __future__ import annotations

import datetime as dt
import hmac
import os
import signal
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from nre_ray.config import REQUIRED, CommandParser, add_options, option, options_from

#: How far a request's signing time may lie from now (S3's own limit).
MAX_SKEW = dt.timedelta(minutes=15)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]


def _refusal(code: str, message: str) -> tuple[str, bytes]:
    return "403 Forbidden", (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                             f"<Message>{escape(message)}</Message></Error>").encode()


def _field(authorization: str, name: str) -> str:
    """A field of an ``AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`` header ('' if absent)."""
    for part in authorization.removeprefix("AWS4-HMAC-SHA256").split(","):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def _canonical_query(query: str, drop: str = "") -> str:
    """``query`` as SigV4 signs it: each name and value decoded, then encoded as AWS encodes them (all but
    ``A-Za-z0-9-_.~``), sorted; ``drop``: a parameter left out (the signature itself). Clients send a query
    encoded their own way (``"`` raw or as ``%22``): the signature covers this form, not theirs."""
    pairs = []
    for part in filter(None, query.split("&")):
        name, _, value = part.partition("=")
        if name != drop:
            pairs.append((urllib.parse.unquote(name), urllib.parse.unquote(value)))
    return "&".join(f"{urllib.parse.quote(n, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                    for n, v in sorted(pairs))


def _credential(credential: str, access_key: str,
                malformed: tuple[str, str]) -> tuple[list[str], tuple[str, str] | None]:
    """A SigV4 credential ``KEY/DATE/REGION/s3/aws4_request`` split in its parts, and why S3 would refuse it
    (``malformed``, or an unknown key id), or None."""
    scope = credential.split("/")
    if len(scope) != 5 or scope[3] != "s3" or scope[4] != "aws4_request":
        return scope, malformed
    if not hmac.compare_digest(scope[0].encode(), access_key.encode()):
        return scope, ("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    return scope, None


def check_request(method: str, raw_uri: str, headers: dict[str, str], access_key: str, secret_key: str,
                  now: dt.datetime | None = None) -> tuple[str, str] | None:
    """Why S3 would refuse this request for the key pair ``access_key``/``secret_key``, as (code, message); None
    when its Signature Version 4 header is made with that pair. ``raw_uri``: the path and query as sent;
    ``headers``: the request's headers (any case)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    lower = {k.lower(): v for k, v in headers.items()}
    authorization = lower.get("authorization", "")
    path, _, query = raw_uri.partition("?")
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    if not authorization and params.get("X-Amz-Algorithm") == "AWS4-HMAC-SHA256":
        return _check_presigned(method, path, query, params, lower, access_key, secret_key, now)
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return "AccessDenied", "Access Denied: this store takes requests signed with its key (AWS Signature V4) only"
    scope, refused = _credential(_field(authorization, "Credential"), access_key,
                                 ("AuthorizationHeaderMalformed", "The authorization header is malformed"))
    if refused:
        return refused
    stamp = lower.get("x-amz-date", "")
    try:
        signed_at = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header"
    if abs((now or dt.datetime.now(dt.UTC)) - signed_at) > MAX_SKEW:
        return "RequestTimeTooSkewed", "The difference between the request time and the current time is too large."
    signed = _field(authorization, "SignedHeaders").split(";")
    request = AWSRequest(method=method, url=f"{path}?{_canonical_query(query)}" if query else path, data=b"",
                         headers={k: v for k, v in lower.items() if k in signed})
    request.context["timestamp"] = stamp
    auth = S3SigV4Auth(Credentials(access_key, secret_key), "s3", scope[2])
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if not hmac.compare_digest(expected.encode(), _field(authorization, "Signature").encode()):
        return "SignatureDoesNotMatch", ("The request signature we calculated does not match the signature you "
                                         "provided. Check your key and signing method.")
    return None


def _check_presigned(method: str, path: str, query: str, params: dict[str, str], headers: dict[str, str],
                     access_key: str, secret_key: str, now: dt.datetime | None) -> tuple[str, str] | None:
    """:func:`check_request` for a presigned URL (the signature in its query, as MLflow's server hands out for
    downloads of its artifacts): made with the key pair, and not expired."""
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    scope, refused = _credential(params.get("X-Amz-Credential", ""), access_key,
                                 ("AuthorizationQueryParametersError", "The presigned URL's credential is malformed"))
    if refused:
        return refused
    stamp = params.get("X-Amz-Date", "")
    try:
        signed_at = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        expires = int(params.get("X-Amz-Expires", ""))
    except ValueError:
        return "AuthorizationQueryParametersError", "X-Amz-Date and X-Amz-Expires must be given"
    at = now or dt.datetime.now(dt.UTC)
    if not signed_at - MAX_SKEW <= at <= signed_at + dt.timedelta(seconds=expires):
        return "AccessDenied", "Request has expired"
    signed = params.get("X-Amz-SignedHeaders", "").split(";")
    request = AWSRequest(method=method, url=f"{path}?{_canonical_query(query, drop='X-Amz-Signature')}", data=b"",
                         headers={k: v for k, v in headers.items() if k in signed})
    request.context["timestamp"] = stamp
    auth = S3SigV4QueryAuth(Credentials(access_key, secret_key), "s3", scope[2], expires=expires)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    if not hmac.compare_digest(expected.encode(), params.get("X-Amz-Signature", "").encode()):
        return "SignatureDoesNotMatch", ("The request signature we calculated does not match the signature you "
                                         "provided. Check your key and signing method.")
    return None


class SignedOnly:
    """A WSGI application that passes to ``app`` only the requests :func:`check_request` admits."""

    def __init__(self, app: Callable[[Environ, StartResponse], Iterable[bytes]], access_key: str, secret_key: str):
        self.app, self.access_key, self.secret_key = app, access_key, secret_key

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        from werkzeug.wrappers import Request
        from werkzeug.wsgi import get_input_stream

        raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
        refused = check_request(environ["REQUEST_METHOD"], raw_uri, dict(Request(environ).headers),
                                self.access_key, self.secret_key)
        if refused is None and raw_uri.startswith("/moto-api"):
            refused = ("AccessDenied", "Access Denied: moto's own API is closed here")
        if refused is None:
            return self.app(environ, start_response)
        status, body = _refusal(*refused)
        get_input_stream(environ).read()  # a body sent with it (its length known), taken before the answer
        start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


def _request_handler():  # -> type[MotoRequestHandler]
    """moto's request handler, logging each request without its query: a presigned URL's query holds the key id
    and a signature that is good for minutes."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class PathOnlyLog(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            self.log("info", '"%s %s" %s %s', self.command, self.path.partition("?")[0], code, size)

    return PathOnlyLog


@dataclass(kw_only=True)
class S3StoreOptions:
    """The options of ``python -m nre_ray.cluster.s3_store``, one flag each (in the order of its usage line)."""

    host: str = option("127.0.0.1", "Address to listen on.")
    port: int = option(REQUIRED, "Port to listen on.")


def build_parser() -> CommandParser:
    """The options of :class:`S3StoreOptions`."""
    parser = CommandParser(prog="python -m nre_ray.cluster.s3_store", description=__doc__.split("\n")[0])
    add_options(parser, S3StoreOptions)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve moto's S3 on ``--host``/``--port`` for the key pair of this process's environment."""
    args = options_from(build_parser().parse_args(argv), S3StoreOptions)
    access_key, secret_key = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not access_key or not secret_key:
        print("error: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must hold the store's key pair", file=sys.stderr)
        return 2
    os.environ.setdefault("MOTO_PORT", str(args.port))  # (as moto_server sets it: moto reads it for its own URLs)
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = SignedOnly(DomainDispatcherApplication(create_backend_app), access_key, secret_key)
    run_simple(args.host, args.port, app, threaded=True, request_handler=_request_handler())
    return 0


if __name__ == "__main__":
    sys.exit(main())
