"""The fair S3 ingest benchmark's loaders (benchmarks/ingest_s3.py), on one object store
behind one HDD model.

**The origin** (:func:`start_origin`): a local SeaweedFS (servers/seaweedd.py) with bucket
``ingest``, behind servers/hddproxy.py, a striped store of ``block_servers`` disks of
``spindles`` each, ``latency_ms`` a seek, ``bandwidth_mbps`` each (3 x 60 MB/s = 180 MB/s,
2 spindles, 5 ms, 4 MiB stripes each read by its own disk).  Every timed read goes through
the proxy; the uploads (not timed) go to SeaweedFS directly.  Each sample is the object
``samples/NNNNNN`` (what s3torchconnector reads), litdata's chunks are under
``litdata-NNmb/``, WebDataset's shards under ``webdataset-NNmb/``, blobsdk's blocks under
``blobsdk/``.

**The loaders** (each a :class:`~benchmarks._ingest_variants.LoaderVariant` in the common
DataLoader: ``workers`` persistent workers, :func:`~benchmarks._ingest_variants.collate`):

- :func:`s3torch`: s3torchconnector's ``S3MapDataset.from_prefix(..., endpoint=proxy,
  s3client_config=S3ClientConfig(force_path_style=True), reader_constructor=...)`` with its
  sequential or range-based reader, shuffled by the DataLoader's sampler; each item
  ``S3Reader.read()``.  Credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
  (:func:`aws_env`, set while the rows run).
- :func:`litdata_streaming`: ``litdata.optimize()`` into chunks of ``chunk_mb`` (tuple
  samples ``(index, bytes)``; not timed), then ``StreamingDataset(input_dir=
  "s3://ingest/litdata-NNmb", cache_dir=<fresh dir>, shuffle=True, max_cache_size=budget,
  storage_options={endpoint_url: proxy, ...})``: each worker downloads whole chunks into the
  local cache (``max_pre_download=2`` ahead) and reads its samples there; later epochs
  read the cache.  Its chunk GETs take its obstore path, told to allow ``http://``
  (:func:`_litdata_allow_http`).
- :func:`webdataset`: ``wds.WebDataset`` over tar shards written by its ``ShardWriter``,
  each shard opened by one plain streaming S3 GET (boto3, :class:`_S3Get`).
- :func:`blobsdk_s3`: ``BlobIterableDataset`` on a cluster whose L4 is the same bucket
  through the proxy (2 L3 nodes that read through from it; no block servers).

:func:`missing` says why the peer rows cannot run (the ``bench`` extra is not installed):
the benchmark then reports them as skipped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import multiprocessing
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch.utils.data import DataLoader

import blobsdk
from blobsdk._extras import pip_install
from blobsdk.config import S3Config
from servers.hddproxy import HddModel, HddProxy, start_hddproxy
from servers.seaweedd import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer, start_seaweed

from ._ingest_job import Variant
from ._ingest_variants import Item, LoaderVariant, as_tensor, blobsdk_dataset, loader_options, map_loader
from ._ingest_workload import MiB, Samples, Workload
from ._servers import scoped_environ

BUCKET = "ingest"
OBJECTS = "samples/"
LITDATA = "litdata"
WEBDATASET = "webdataset"
BLOBSDK_SOURCE = f"s3://{BUCKET}/blobsdk"
BENCH_EXTRA = ("s3torchconnector", "litdata", "webdataset")
UPLOAD_PARALLEL = 16


def missing() -> str | None:
    """Why the peer rows cannot run here, or None."""
    absent = [name for name in BENCH_EXTRA if importlib.util.find_spec(name) is None]
    return f"{', '.join(absent)} not installed ({pip_install('bench')})" if absent else None


@dataclass(frozen=True)
class Origin:
    seaweed: SeaweedServer
    proxy: HddProxy

    @property
    def endpoint(self) -> str:
        """Where the timed reads go: the proxy."""
        return self.proxy.endpoint

    def s3_config(self, endpoint: str | None = None) -> S3Config:
        options = {**self.seaweed.config, "endpoint": endpoint or self.endpoint}
        return S3Config(allow_http=True, **options)

    def boto3(self, endpoint: str) -> Any:
        return _boto3_client(endpoint, pool=UPLOAD_PARALLEL)

    def upload(self, items: Iterator[tuple[str, bytes | memoryview | Path]]) -> None:
        """PUT every (key, bytes or file) straight to SeaweedFS (not through the proxy)."""
        client = self.boto3(self.seaweed.endpoint)

        def put(item: tuple[str, bytes | memoryview | Path]) -> None:
            key, body = item
            data = body.read_bytes() if isinstance(body, Path) else bytes(body)
            client.put_object(Bucket=BUCKET, Key=key, Body=data)

        with ThreadPoolExecutor(UPLOAD_PARALLEL) as pool:
            list(pool.map(put, items))


def hdd_model(workload: Workload) -> HddModel:
    return HddModel(
        disks=workload.block_servers,
        spindles=workload.spindles,
        latency_ms=workload.latency_ms,
        bandwidth_mbps=workload.bandwidth_mbps,
    )


@contextlib.contextmanager
def start_origin(root: Path, workload: Workload) -> Iterator[Origin]:
    with start_seaweed(root / "seaweedfs") as seaweed:
        seaweed.make_bucket(BUCKET)
        with start_hddproxy(root / "hddproxy", seaweed.endpoint, hdd_model(workload)) as proxy:
            yield Origin(seaweed, proxy)


def aws_env() -> contextlib.AbstractContextManager[None]:
    """The origin's keys in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (s3torchconnector's
    CRT client reads the standard chain, and forked workers inherit the environment), put
    back as they were afterwards."""
    return scoped_environ({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION})


def load(
    origin: Origin, samples: Samples, root: Path, *, litdata_mb: Iterable[int] = (), webdataset_mb: Iterable[int] = ()
) -> dict[int, list[str]]:
    """Every sample as its own object, litdata's optimized chunks at each of ``litdata_mb``
    (``litdata-NNmb/``) and WebDataset's shards at each of ``webdataset_mb``
    (``webdataset-NNmb/``).  Returns each shard size's shard keys."""
    origin.upload((f"{OBJECTS}{i:06d}", samples.data(i)) for i in range(len(samples)))
    build = root / "peer-build"
    for chunk_mb in litdata_mb:
        chunks = optimize_for_litdata(samples, build, chunk_mb)
        origin.upload((f"{litdata_dir(chunk_mb)}/{path.name}", path) for path in sorted(chunks.iterdir()))
        shutil.rmtree(chunks, ignore_errors=True)
    shards: dict[int, list[str]] = {}
    for shard_mb in webdataset_mb:
        tars = sorted(write_webdataset(samples, build, shard_mb).iterdir())
        shards[shard_mb] = [f"{webdataset_dir(shard_mb)}/{path.name}" for path in tars]
        origin.upload(zip(shards[shard_mb], tars, strict=True))
        shutil.rmtree(tars[0].parent, ignore_errors=True)
    shutil.rmtree(build, ignore_errors=True)
    return shards


def blobsdk_cluster_options(origin: Origin, workload: Workload, samples: Samples, tier: str = "l3") -> dict[str, Any]:
    """The cluster of blobsdk's row: its L3 nodes for ``tier`` "l3", none for "l2"."""
    return {
        "l3_nodes": workload.l3_nodes if tier == "l3" else 0,
        "trackers": 0,
        "l3_capacity_mb": samples.total_bytes // MiB + 256,
        "source": BLOBSDK_SOURCE,
        "s3": origin.s3_config(),
    }


async def load_blobs(config: blobsdk.ClientConfig, origin: Origin, samples: Samples) -> None:
    """blobsdk's copy of the dataset (``put_many``), written to SeaweedFS directly."""
    direct = msgspec.structs.replace(config, s3=origin.s3_config(origin.seaweed.endpoint))
    async with blobsdk.Client(direct) as client:
        await client.put_many((samples.paths[i], samples.data(i)) for i in range(len(samples)))


def blobsdk_s3(config: blobsdk.ClientConfig, samples: Samples, workload: Workload, name: str = "blobsdk_s3") -> Variant:
    return blobsdk_dataset(config, samples, workload, name=name)


# --- s3torchconnector -----------------------------------------------------------------------


def _s3torch_item(reader: Any) -> Item:
    index = int(reader.key.rsplit("/", 1)[1])
    return index, as_tensor(bytearray(reader.read()))


def s3torch(endpoint: str, workload: Workload, reader: str = "sequential", name: str = "s3torch") -> LoaderVariant:
    """``reader``: s3torchconnector's ``sequential`` (its default) or ``range_based`` reader."""
    from s3torchconnector import S3ClientConfig, S3MapDataset, S3ReaderConstructor

    constructor = {"sequential": S3ReaderConstructor.sequential, "range_based": S3ReaderConstructor.range_based}[reader]

    def make() -> DataLoader[Item]:
        dataset = S3MapDataset.from_prefix(
            f"s3://{BUCKET}/{OBJECTS}",
            region=REGION,
            endpoint=endpoint,
            transform=_s3torch_item,
            s3client_config=S3ClientConfig(force_path_style=True),
            reader_constructor=constructor(),
        )
        return map_loader(dataset, workload)

    return LoaderVariant(name, make)


# --- litdata --------------------------------------------------------------------------------


def _litdata_sample(item: tuple[int, str]) -> tuple[int, bytes]:
    """A tuple, not a dict: with dict samples litdata 0.2.76's workers fail (benchmarks/ingest_s3.py)."""
    index, path = item
    return index, Path(path).read_bytes()


def litdata_dir(chunk_mb: int) -> str:
    return f"{LITDATA}-{chunk_mb}mb"


def optimize_for_litdata(samples: Samples, dir: Path, chunk_mb: int) -> Path:
    """The dataset in litdata's chunk format (``dir/out``), from one file per sample."""
    from litdata import optimize

    source = dir / "src"
    source.mkdir(parents=True, exist_ok=True)
    inputs = []
    for i in range(len(samples)):
        path = source / f"{i:06d}"
        if not path.exists():
            path.write_bytes(samples.data(i))
        inputs.append((i, str(path)))
    out = dir / f"out-{chunk_mb}"
    # optimize() sets the process's multiprocessing start method (force=True; "spawn" by
    # default): put it back, or every DataLoader after it spawns its workers.
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):  # its progress bars
            optimize(
                fn=_litdata_sample,
                inputs=inputs,
                output_dir=str(out),
                chunk_bytes=f"{chunk_mb}MB",
                num_workers=1,
                start_method="fork",
                verbose=False,
            )
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    return out


def _litdata_item(sample: tuple[int, bytes]) -> Item:
    return int(sample[0]), as_tensor(bytearray(sample[1]))


def _litdata_allow_http(worker_id: int) -> None:
    """litdata 0.2.76 builds its obstore store (its chunk GETs) with client options of its
    own and no ``allow_http``, so against an ``http://`` endpoint every chunk GET fails
    (``BadScheme``): each worker adds ``allow_http`` to those options, litdata's own path."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[typeddict-unknown-key]


def litdata_streaming(
    endpoint: str, workload: Workload, cache_dir: Path, chunk_mb: int, cache_bytes: int | None, name: str = "litdata"
) -> LoaderVariant:
    """A fresh cache directory per run (the first epoch is cold), removed afterwards;
    ``cache_bytes``: its ``max_cache_size`` (None: its disk-space heuristic).  A persistent
    worker's dataset copy moves to its next epoch by itself."""
    from litdata import StreamingDataset

    def make() -> DataLoader[Item]:
        cache_dir.mkdir(parents=True, exist_ok=True)
        options = {
            "endpoint_url": endpoint,
            "region_name": REGION,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }
        budget = {} if cache_bytes is None else {"max_cache_size": cache_bytes}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The provided `max_cache_size` is less than")
            logging.getLogger("litdata").setLevel(logging.ERROR)  # the same advice, as a log line
            dataset = StreamingDataset(
                f"s3://{BUCKET}/{litdata_dir(chunk_mb)}",
                cache_dir=str(cache_dir),
                shuffle=True,
                seed=workload.seed,
                drop_last=False,
                storage_options=options,
                transform=_litdata_item,
                **budget,
            )
        return DataLoader(dataset, worker_init_fn=_litdata_allow_http, **loader_options(workload))

    return LoaderVariant(name, make, cleanup=lambda: shutil.rmtree(cache_dir, ignore_errors=True))


# --- WebDataset -------------------------------------------------------------------------------


def webdataset_dir(shard_mb: int) -> str:
    return f"{WEBDATASET}-{shard_mb}mb"


def write_webdataset(samples: Samples, dir: Path, shard_mb: int) -> Path:
    """The dataset as WebDataset tar shards of at most ``shard_mb`` MB (its ``ShardWriter``),
    each sample ``NNNNNN.bin``."""
    import webdataset as wds

    out = dir / f"wds-{shard_mb}"
    out.mkdir(parents=True, exist_ok=True)
    pattern = str(out / "shard-%06d.tar")
    with contextlib.redirect_stdout(None), wds.ShardWriter(pattern, maxsize=shard_mb * 10**6, verbose=0) as sink:
        for i in range(len(samples)):
            sink.write({"__key__": f"{i:06d}", "bin": bytes(samples.data(i))})
    return out


class _S3Get:
    """WebDataset's opener for ``s3://bucket/key``: one plain streaming GET (boto3), a client
    per process (a forked worker makes its own)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._client: Any = None
        self._pid = 0

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = _boto3_client(self.endpoint), os.getpid()
        bucket, key = url.removeprefix("s3://").split("/", 1)
        return self._client.get_object(Bucket=bucket, Key=key)["Body"]


def _boto3_client(endpoint: str, pool: int = 10) -> Any:
    """A boto3 client of the origin (``pool``: its connections; 10 is botocore's default)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=pool),
    )


def _open_s3_with(endpoint: str, worker_id: int) -> None:
    """WebDataset opens ``s3://`` URLs with :class:`_S3Get` in this worker."""
    importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = _S3Get(endpoint)  # wds.gopen is its function


def _webdataset_item(sample: dict[str, Any]) -> Item:
    return int(sample["__key__"]), as_tensor(bytearray(sample["bin"]))


def webdataset(endpoint: str, workload: Workload, keys: list[str], name: str = "webdataset") -> LoaderVariant:
    """``wds.WebDataset`` over the shards ``keys`` (shards shuffled, split over the workers),
    each shard one plain S3 GET streamed through its tar reader; no local cache."""
    import webdataset as wds

    def make() -> DataLoader[Item]:
        urls = [f"s3://{BUCKET}/{key}" for key in keys]
        dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=workload.seed, empty_check=False).map(_webdataset_item)
        return DataLoader(dataset, worker_init_fn=functools.partial(_open_s3_with, endpoint), **loader_options(workload))

    return LoaderVariant(name, make)


# --- Mosaic Streaming (in its own venv: benchmarks/_ingest_mosaic.py) ------------------------------


def mosaic_dir(shard_mb: int) -> str:
    return f"mosaic-{shard_mb}mb"


def _mosaic_item(sample: dict[str, Any]) -> Item:
    return int(sample["index"]), as_tensor(bytearray(sample["data"]))


class _MosaicItems(torch.utils.data.IterableDataset[Item]):
    """Mosaic's ``StreamingDataset``, each sample as the common ``(index, tensor)`` item."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Item]:
        return map(_mosaic_item, iter(self.dataset))


def mosaic(endpoint: str, workload: Workload, cache_dir: Path, shard_mb: int, cache_bytes: int, name: str) -> LoaderVariant:
    """``streaming.StreamingDataset(remote="s3://ingest/mosaic-NNmb", local=<fresh dir>,
    shuffle=True, batch_size=..., cache_limit=budget)``, its S3 endpoint the proxy
    (``S3_ENDPOINT_URL``, read by its boto3 downloads in each worker)."""
    from streaming import StreamingDataset

    def make() -> DataLoader[Item]:
        os.environ["S3_ENDPOINT_URL"] = endpoint
        dataset = StreamingDataset(
            remote=f"s3://{BUCKET}/{mosaic_dir(shard_mb)}",
            local=str(cache_dir),
            shuffle=True,
            shuffle_seed=workload.seed,
            batch_size=workload.batch_size,
            cache_limit=cache_bytes,
        )
        return DataLoader(_MosaicItems(dataset), **loader_options(workload))

    def cleanup() -> None:
        from streaming.base.util import clean_stale_shared_memory

        shutil.rmtree(cache_dir, ignore_errors=True)
        clean_stale_shared_memory()

    return LoaderVariant(name, make, cleanup=cleanup)
