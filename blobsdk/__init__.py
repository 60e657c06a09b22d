"""blobsdk: an asyncio fat-client SDK that feeds training jobs from tiered BLOB storage."""

from ._version import __version__
from .client import Client
from .config import ClientConfig, L1Config, L2Config, PeerConfig, ReadConfig, Timeouts, WriteConfig
from .errors import (
    BadRequest,
    BlobError,
    BlobNotFound,
    BlockCollected,
    BlockNotFound,
    BufferChanged,
    ClientClosed,
    CorruptData,
    Forbidden,
    IncompatibleFormat,
    InvalidPath,
    MissingExtra,
    NotForkSafe,
    PeerNotFound,
    PreconditionFailed,
    QuotaExceeded,
    SourceChanged,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from .ops import GcReport
from .sync import SyncClient
from .wire import BlobInfo, ChunkRef, ReadPlan

__all__ = (
    "BadRequest",
    "BlobError",
    "BlobInfo",
    "BlobNotFound",
    "BlockCollected",
    "BlockNotFound",
    "BufferChanged",
    "ChunkRef",
    "Client",
    "ClientClosed",
    "ClientConfig",
    "CorruptData",
    "Forbidden",
    "GcReport",
    "IncompatibleFormat",
    "InvalidPath",
    "L1Config",
    "L2Config",
    "MissingExtra",
    "NotForkSafe",
    "PeerConfig",
    "PeerNotFound",
    "PreconditionFailed",
    "QuotaExceeded",
    "ReadConfig",
    "ReadPlan",
    "SourceChanged",
    "SyncClient",
    "Timeouts",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "WriteConfig",
    "__version__",
)
