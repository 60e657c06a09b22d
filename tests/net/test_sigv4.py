"""blobsdk/net/sigv4.py and the target of the S3 L4's signed GETs (blobsdk/sources/_s3get.py):
AWS's own documented example, botocore's signer as a reference, and how the endpoint,
region and credentials are found.  (That a server which checks signatures accepts them is
shown against SeaweedFS where the tests run on it; moto checks none.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from blobsdk.net.sigv4 import UNSIGNED_PAYLOAD, Credentials, Signer, uri_encode_path
from blobsdk.sources._s3get import S3Refused, S3Target, s3_refusal, target_of

EXAMPLE = Credentials(access_key_id="AKIAIOSFODNN7EXAMPLE", secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_the_get_object_example_of_aws_s3_documentation_signs_to_its_documented_signature() -> None:
    """docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, "GET Object"."""
    headers = Signer(EXAMPLE, "us-east-1").headers(
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        also_signed={"Range": "bytes=0-9"},
        payload=EMPTY_SHA256,
        now=datetime(2013, 5, 24, tzinfo=UTC),
    )
    assert headers == {
        "x-amz-content-sha256": EMPTY_SHA256,
        "x-amz-date": "20130524T000000Z",
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
    }


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////session+token="])
@pytest.mark.parametrize("key", ["plain/key.bin", "dir with space/ü+odd=key~(1)&x*y!.bin", "a//b/./c"])
def test_signatures_are_botocores_for_odd_keys_and_temporary_credentials(key: str, token: str | None) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    credentials = Credentials(access_key_id="AKIDEXAMPLE", secret_access_key="s3cr3t/+=", session_token=token)
    now = datetime(2026, 12, 2, 5, 30, 12, tzinfo=UTC)
    path = uri_encode_path(f"/bucket-one/{key}")
    ours = Signer(credentials, "eu-west-3").headers("GET", "127.0.0.1:8333", path, now=now)

    request = AWSRequest(method="GET", url=f"https://127.0.0.1:8333{path}", headers={})
    request.headers["x-amz-date"] = ours["x-amz-date"]
    request.headers["X-Amz-Content-SHA256"] = UNSIGNED_PAYLOAD
    if token:
        request.headers["X-Amz-Security-Token"] = token
    request.context["timestamp"] = "20261202T053012Z"
    boto = S3SigV4Auth(BotoCredentials("AKIDEXAMPLE", "s3cr3t/+=", token), "s3", "eu-west-3")
    signature = boto.signature(boto.string_to_sign(request, boto.canonical_request(request)), request)
    assert ours["Authorization"].endswith(f", Signature={signature}")
    assert f"SignedHeaders={boto.signed_headers(boto.headers_to_sign(request))}," in ours["Authorization"]
    assert ours.get("x-amz-security-token") == token


def test_a_path_is_encoded_once_segment_by_segment() -> None:
    assert uri_encode_path("/b/dir with space/ü+=~-_.(x)") == "/b/dir%20with%20space/%C3%BC%2B%3D~-_.%28x%29"


def test_the_secret_never_shows_in_a_repr() -> None:
    shown = repr(Credentials(access_key_id="AKID", secret_access_key="the-secret", session_token="the-token"))
    assert "the-secret" not in shown and "the-token" not in shown and "AKID" in shown


CONFIG = {"endpoint": "http://127.0.0.1:9000", "region": "r1", "access_key_id": "k", "secret_access_key": "s"}


def test_the_target_comes_from_the_config_then_the_environment_then_aws_defaults() -> None:
    assert target_of(CONFIG, True, {"AWS_ACCESS_KEY_ID": "env", "AWS_REGION": "env"}) == S3Target(
        endpoint="http://127.0.0.1:9000", region="r1", credentials=Credentials(access_key_id="k", secret_access_key="s")
    )
    env = {"AWS_ACCESS_KEY_ID": "ek", "AWS_SECRET_ACCESS_KEY": "es", "AWS_SESSION_TOKEN": "et", "AWS_DEFAULT_REGION": "r2"}
    assert target_of({}, False, env) == S3Target(
        endpoint="https://s3.r2.amazonaws.com",
        region="r2",
        credentials=Credentials(access_key_id="ek", secret_access_key="es", session_token="et"),
    )
    env |= {"AWS_REGION": "r3", "AWS_ENDPOINT_URL": "https://minio.example:9000"}
    target = target_of({}, False, env)
    assert isinstance(target, S3Target) and (target.endpoint, target.region) == ("https://minio.example:9000", "r3")
    target = target_of({"access_key_id": "k", "secret_access_key": "s"}, False, {})
    assert isinstance(target, S3Target) and (target.endpoint, target.region) == (
        "https://s3.us-east-1.amazonaws.com",
        "us-east-1",
    )


@pytest.mark.parametrize(
    ("config", "allow_http", "why"),
    [
        (
            {"endpoint": "http://127.0.0.1:9000"},
            True,
            "no static credentials (access_key_id and secret_access_key in the config, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY): credentials from ~/.aws files, SSO or an instance role are obstore's alone",
        ),
        (
            {**CONFIG, "skip_signature": "true", "aws_virtual_hosted_style_request": "true"},
            True,
            "the config sets aws_virtual_hosted_style_request, skip_signature, which only obstore understands",
        ),
        (CONFIG, False, "endpoint 'http://127.0.0.1:9000' is plain HTTP and allow_http is not set"),
        (
            {**CONFIG, "endpoint": "http://127.0.0.1:9000/path"},
            True,
            "endpoint 'http://127.0.0.1:9000/path' is not scheme://host[:port]",
        ),
        ({**CONFIG, "endpoint": "ftp://host"}, True, "endpoint 'ftp://host' is not scheme://host[:port]"),
    ],
)
def test_without_a_target_the_reason_says_why(config: dict[str, str], allow_http: bool, why: str) -> None:
    assert target_of(config, allow_http, {}) == why


def test_an_s3_error_reply_keeps_its_status_code_and_message() -> None:
    body = b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>The key does not exist.</Message></Error>"
    error = s3_refusal(404, body, "http://h/b/k")
    assert isinstance(error, S3Refused) and (error.status, error.code) == (404, "NoSuchKey")
    assert str(error) == "GET http://h/b/k: HTTP 404 NoSuchKey: The key does not exist."
    assert str(s3_refusal(503, b"", "http://h/b/k")) == "GET http://h/b/k: HTTP 503"


async def test_a_server_that_checks_signatures_serves_signed_gets_and_refuses_a_wrong_secret(tmp_path: Path) -> None:
    """SeaweedFS checks every signature (moto checks none): the S3 L4's reads of a block,
    a link block and the object it points at, with a key that needs encoding, are accepted;
    a wrong secret is Forbidden (SignatureDoesNotMatch), a changed object SourceChanged."""
    seaweedd = pytest.importorskip("servers.seaweedd", reason="SeaweedFS (servers/seaweedd.py, issue 21 item 1)")
    import obstore
    from obstore.store import S3Store

    from blobsdk.errors import Forbidden, SourceChanged
    from blobsdk.sources import S3BlockStore, S3Object
    from blobsdk.sources.base import new_block_id

    with seaweedd.start_seaweed(tmp_path) as server:
        server.make_bucket("bucket-one")
        lake = S3Store("bucket-one", config=server.config, client_options={"allow_http": True})
        key = "lake/dir with space/ü+odd=key~(1).bin"
        data = bytes(range(256)) * 400
        etag = (await obstore.put_async(lake, key, data))["e_tag"] or ""
        block = new_block_id()
        async with S3BlockStore("bucket-one", "blocks", config=server.config, allow_http=True) as store:
            assert store._getter is not None  # reads are the SDK's signed GETs
            await store.write_block(block, [data])
            assert await store.read_range(block, 1000, 5000) == data[1000:6000]
            link = await store.link(S3Object(bucket="bucket-one", key=key, etag=etag, size=len(data)))
        async with S3BlockStore("bucket-one", "blocks", config=server.config, allow_http=True) as fresh:
            assert await fresh.read_range(link, 7, 70000) == data[7:70007]  # the link block, then the object
        wrong = {**server.config, "secret_access_key": "not-the-secret"}
        async with S3BlockStore("bucket-one", "blocks", config=wrong, allow_http=True) as store:
            with pytest.raises(Forbidden, match=r"HTTP 403 SignatureDoesNotMatch"):
                await store.read_range(block, 0, 10)
        await obstore.put_async(lake, key, b"changed")
        async with S3BlockStore("bucket-one", "blocks", config=server.config, allow_http=True) as store:
            with pytest.raises(SourceChanged, match=r"^s3://bucket-one/lake/dir with space/ü\+odd=key~\(1\)\.bin changed"):
                await store.read_range(link, 0, 10)
