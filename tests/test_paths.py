import pytest

from blobsdk.errors import InvalidPath
from blobsdk.paths import bucket_of, validate_path, validate_prefix


@pytest.mark.parametrize("path", ["/b", "/b/k", "/b/a/b/c.bin", "/b/%_*?", "/b/ünïcode", "/b/" + "x" * 1021])
def test_valid_paths(path):
    assert validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "path is empty"),
        ("b/k", "path must be absolute"),
        ("/", "path '/' names no blob"),
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
