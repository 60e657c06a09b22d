import shutil
import tempfile

import pytest

import blobsdk
from blobsdk.config import WriteConfig

# tests/tiers/conformance.py is not a test_*.py module: without this its failed asserts show no
# values.  Registered here, before any test module imports it (tests/peer/ does, before tests/tiers/).
pytest.register_assert_rewrite("tests.tiers.conformance")

# Small chunks and blocks so tests exercise multi-chunk blobs and multi-block packing cheaply.
SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)
# The disk caches (L2, the L3 nodes) keep min_free_ratio (5%) of their file system free and
# refuse fills past it, so below this their tests fail for the machine's reason, not the code's.
MIN_FREE_RATIO = 0.06


def pytest_sessionstart(session: pytest.Session) -> None:
    where = tempfile.gettempdir()
    usage = shutil.disk_usage(where)
    if usage.free / usage.total < MIN_FREE_RATIO:
        pytest.exit(
            f"only {usage.free / usage.total:.1%} ({usage.free >> 30} GiB) of the file system under {where} is free;"
            f" the disk caches keep 5% free and refuse fills past it, so their tests would fail: free some space"
            f" (need {MIN_FREE_RATIO:.0%})",
            returncode=1,
        )


@pytest.fixture
async def client(tmp_path):
    async with blobsdk.Client.local(tmp_path / "data", write=SMALL) as c:
        yield c


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS for the session (servers/seaweedd.py; it starts in about 2 s): each module
    makes its buckets (``make_bucket`` keeps one it has) and writes under prefixes of its own."""
    from servers.seaweedd import start_seaweed

    with start_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(scope="session")
def testbed_unavailable() -> str | None:
    """Why this machine cannot make a testbed of hosts (servers/testbed.py), or None."""
    from servers.testbed import unavailable

    return unavailable()


@pytest.fixture
def testbed(testbed_unavailable, tmp_path):
    """A started :class:`servers.testbed.Testbed` (state file in tmp_path), removed after the
    test; the test skips, saying why, where namespaces cannot be made (not root, no iproute2)."""
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    from servers.testbed import Testbed

    with Testbed(dir=tmp_path / "testbed") as bed:
        yield bed
