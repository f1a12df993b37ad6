"""The stand-in's object store admits a request only when it is signed with the store's own key pair
(:func:`nre_ray.cluster.s3_store.check_request`); the running server is tried in tests/integration/test_standin.py."""

from __future__ import annotations

import datetime as dt

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from nre_ray.cluster.s3_store import check_request

KEY, SECRET = "AKIA0123456789ABCDEF", "s3cr3t-of-the-standin-0123456789abcdefgh"
URI = "/nre-ray/nre_ray/data/a%20b%2Bc.csv?list-type=2&prefix=nre_ray%2F"


def _signed(key: str, secret: str, method: str = "GET", uri: str = URI) -> dict[str, str]:
    """The headers boto3 would send for ``method uri``, signed with ``key``/``secret``."""
    request = AWSRequest(method=method, url=f"http://127.0.0.1:9000{uri}",
                         headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(request)
    return {**dict(request.headers.items()), "Host": "127.0.0.1:9000"}


def test_only_the_stores_own_key_pair_is_admitted():
    assert check_request("GET", URI, _signed(KEY, SECRET), KEY, SECRET) is None
    assert check_request("PUT", "/nre-ray/x", _signed(KEY, SECRET, "PUT", "/nre-ray/x"), KEY, SECRET) is None
    refusals = {
        "unsigned": ("GET", URI, {"Host": "127.0.0.1:9000"}),
        "another key": ("GET", URI, _signed("AKIAOTHER0000000000", SECRET)),
        "a wrong secret": ("GET", URI, _signed(KEY, SECRET + "x")),
        "another path than signed": ("GET", "/nre-ray/other", _signed(KEY, SECRET)),
        "another method than signed": ("DELETE", URI, _signed(KEY, SECRET)),
    }
    codes = {what: (check_request(*args, KEY, SECRET) or ("admitted",))[0] for what, args in refusals.items()}
    assert codes == {"unsigned": "AccessDenied", "another key": "InvalidAccessKeyId",
                     "a wrong secret": "SignatureDoesNotMatch", "another path than signed": "SignatureDoesNotMatch",
                     "another method than signed": "SignatureDoesNotMatch"}, codes
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=20)  # a request replayed after S3's 15 minutes
    assert check_request("GET", URI, _signed(KEY, SECRET), KEY, SECRET, now=later)[0] == "RequestTimeTooSkewed"


def test_a_presigned_url_of_the_key_pair_is_admitted_until_it_expires():
    """MLflow's server hands out presigned URLs for downloads of its artifacts (``runs:/`` models): those of the
    store's key pair are admitted, however the client encodes the query (``"`` raw or ``%22``), until they expire."""
    import boto3
    from botocore.config import Config

    def presigned(secret: str, expires: int = 300) -> str:
        client = boto3.client("s3", endpoint_url="http://127.0.0.1:9000", aws_access_key_id=KEY,
                              aws_secret_access_key=secret, region_name="us-east-1",
                              config=Config(signature_version="s3v4"))
        url = client.generate_presigned_url("get_object", ExpiresIn=expires, Params={
            "Bucket": "nre-ray", "Key": "m/a b.json", "ResponseContentDisposition": 'attachment; filename="a b.json"'})
        return url.removeprefix("http://127.0.0.1:9000")

    host = {"Host": "127.0.0.1:9000"}
    good = presigned(SECRET)
    assert check_request("GET", good, host, KEY, SECRET) is None
    assert check_request("GET", good.replace("%22", '"'), host, KEY, SECRET) is None
    assert check_request("GET", presigned(SECRET + "x"), host, KEY, SECRET)[0] == "SignatureDoesNotMatch"
    assert check_request("PUT", good, host, KEY, SECRET)[0] == "SignatureDoesNotMatch"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=301)
    assert check_request("GET", good, host, KEY, SECRET, now=later)[0] == "AccessDenied"
