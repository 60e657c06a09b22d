import pytest

from blobsdk.errors import InvalidPath
from blobsdk.paths import bucket_of, listing_prefix, validate_path, validate_prefix


@pytest.mark.parametrize("path", ["/b/k", "/b/a/b/c.bin", "/b/%_*?", "/b/ünïcode", "/b/" + "x" * 1021])
def test_valid_paths(path):
    assert validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path is empty"),
        ("b/k", "path must be absolute"),
        ("/", "path '/' names no blob"),
        ("/bucketx", "path '/bucketx' names a bucket, not a blob: a blob path is /bucket/key"),
        ("/b/../k", "'..' segment"),
        ("/b/./k", "'.' segment"),
        ("/..", "'..' segment"),
        ("/b//k", "empty segment"),
        ("/b/k/", "empty segment"),
        ("/b/k\x00", "path contains NUL"),
        ("/b/" + "x" * 1022, "path is 1025 bytes, over the limit of 1024"),
        ("/b/\udcff", "path is not valid UTF-8"),
        (b"/b/k", "path must be str, not bytes"),
        (None, "path must be str, not NoneType"),
    ],
)
def test_invalid_paths(path, message):
    with pytest.raises(InvalidPath, match=message.replace("?", r"\?").replace("(", r"\(")) as info:
        validate_path(path)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("prefix", ["/", "/b", "/b/", "/b/dir/", "/b/dir/pre"])
def test_valid_prefixes(prefix):
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["", "b/", "//", "/b//", "/b/../", "/b/\x00"])
def test_invalid_prefixes(prefix):
    with pytest.raises(InvalidPath):
        validate_prefix(prefix)


def test_bucket_of():
    assert bucket_of("/bucket/a/b") == "bucket"
    assert bucket_of("/bucket") == "bucket"


@pytest.mark.parametrize(
    ("prefix", "listed"),
    [("/", "/"), ("/b", "/b/"), ("/b/", "/b/"), ("/b/dir", "/b/dir"), ("/b/dir/", "/b/dir/"), ("/b/logs/2024-", "/b/logs/2024-")],
)
def test_a_bare_bucket_lists_that_bucket_only(prefix, listed):
    assert listing_prefix(prefix) == listed


def test_a_listing_prefix_is_validated():
    with pytest.raises(InvalidPath, match="empty segment"):
        listing_prefix("/b//")
