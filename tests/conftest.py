import pytest

import blobsdk
from blobsdk.config import WriteConfig

# Small chunks and blocks so tests exercise multi-chunk blobs and multi-block packing cheaply.
SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)


@pytest.fixture
async def client(tmp_path):
    async with blobsdk.Client.local(tmp_path / "data", write=SMALL) as c:
        yield c
