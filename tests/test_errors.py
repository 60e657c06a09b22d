import pytest

import blobsdk
from blobsdk.errors import BlobError, error_from_code


@pytest.mark.parametrize(
    ("cls", "also"),
    [
        (blobsdk.BlobNotFound, FileNotFoundError),
        (blobsdk.BlockNotFound, blobsdk.BlobNotFound),
        (blobsdk.PeerNotFound, blobsdk.BlobNotFound),
        (blobsdk.SourceChanged, blobsdk.BlockNotFound),
        (blobsdk.InvalidPath, ValueError),
        (blobsdk.Unauthorized, PermissionError),
        (blobsdk.BadRequest, ValueError),
        (blobsdk.ClientClosed, RuntimeError),
        (blobsdk.NotForkSafe, RuntimeError),
    ],
)
def test_dual_inheritance(cls, also):
    assert issubclass(cls, also) and issubclass(cls, BlobError)


@pytest.mark.parametrize(
    "cls",
    [
        blobsdk.BlobNotFound,
        blobsdk.BlockNotFound,
        blobsdk.SourceChanged,
        blobsdk.PeerNotFound,
        blobsdk.InvalidPath,
        blobsdk.PreconditionFailed,
        blobsdk.CorruptData,
        blobsdk.QuotaExceeded,
        blobsdk.Unauthorized,
        blobsdk.Unavailable,
        blobsdk.BadRequest,
    ],
)
def test_code_round_trip(cls):
    err = error_from_code(cls.code, "msg")
    assert type(err) is cls and str(err) == "msg"


def test_unknown_code():
    err = error_from_code("martian", "msg")
    assert type(err) is BlobError
