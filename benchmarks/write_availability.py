"""Write availability: puts while one block server at a time is down.

A local cluster (API server + 3 block servers), one client putting 50 KB blobs one after
another (``sock_read`` 2 s, so a write to a stopped server fails in 2 s, not 30).  Round after round, one block server is
made unavailable, SIGKILLed or SIGSTOPped in turn, while a client puts blobs; then it comes
back (restarted on its port, or SIGCONTinued) and the client puts more.  Measured with the
default write quorum (a majority, 2 of 3) and, as the baseline, with ``write_quorum =
"all"``.  After the rounds the repairer's pass makes up the copies the writes missed, and
a fresh client reads back every acknowledged blob.

Reported: the put success rate while a server is down (goal >= 99%), the acknowledged blobs
lost or wrong (goal 0), blocks recorded under-replicated and copies made up, and blocks left
without a copy on every replica after the pass (goal 0).
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

import msgspec

import blobsdk
from blobsdk.config import ClientConfig, Timeouts, WriteConfig
from blobsdk.ops.repair import Repairer
from blobsdk.sources import ReplicatedBlockStore
from blobsdk.sources._replicated import Quorum
from servers.cluster import Cluster, ServerProcess, start_cluster
from servers.cluster import _wait_ready as wait_ready

from ._report import Report

SMALL = {"chunk_size": 64 << 10, "block_size": 256 << 10}
SOCK_READ = 2.0  # a write to the stopped server fails after this (default 30 s: the baseline would crawl)


async def run(quick: bool = False) -> Report:
    rounds, puts = (3, 10) if quick else (12, 40)
    report = Report("write_availability")
    with tempfile.TemporaryDirectory(prefix="blobsdk-bench-wa-") as tmp:
        async with start_cluster(Path(tmp), block_servers=3, l3_nodes=0, trackers=0) as cluster:
            for label, quorum, n in (("majority", None, puts), ("all", "all", max(2, puts // 4))):
                counts = await _rounds(cluster, quorum, rounds, n)
                ok, tried = counts["acked_down"], counts["tried_down"]
                report.metrics[f"{label}_put_success_one_down"] = ok / tried
                report.metrics[f"{label}_puts_tried_one_down"] = tried
                if label == "majority":
                    report.metrics.update({k: float(v) for k, v in counts.items() if not k.endswith("_down")})
    report.goals["majority_put_success_one_down"] = "goal >= 0.99"
    report.goals["acked_lost_or_wrong"] = "goal 0"
    report.goals["blocks_not_whole_after_repair"] = "goal 0"
    return report


async def _rounds(cluster: Cluster, quorum: Quorum, rounds: int, puts: int) -> dict[str, int]:
    config = _config(cluster, quorum)
    counts = dict.fromkeys(("tried_down", "acked_down"), 0)
    acked: dict[str, bytes] = {}
    async with blobsdk.Client(config) as c:
        for r in range(rounds):
            proc = next(p for p in cluster.processes if p.name == f"block-{r % 3}")
            stop = r % 2 == 1
            if stop:
                proc.popen.send_signal(signal.SIGSTOP)  # its kernel still accepts connections
            else:
                proc.popen.kill()
                proc.popen.wait()
            for i in range(puts):
                counts["tried_down"] += 1
                counts["acked_down"] += await _put(c, f"/wa/{quorum}/{r}/down{i}", acked)
            if stop:
                proc.popen.send_signal(signal.SIGCONT)
            else:
                await _restart(cluster, proc)
            for i in range(puts // 4):
                await _put(c, f"/wa/{quorum}/{r}/up{i}", acked)
        store, repairer = _parts(c)
        await store.settle()
        counts["under_replicated_recorded"] = store.under_replicated.recorded
        await repairer.repair_under_replicated()  # what the background passes have not done yet
        counts["copies_made_up"] = repairer.stats.repairs_done  # in the background and by this pass
        counts["blocks_not_whole_after_repair"] = len(store.under_replicated)
    async with blobsdk.Client(config) as fresh:
        wrong = [p for p, data in acked.items() if await _read(fresh, p) != data]
    counts["acked_lost_or_wrong"] = len(wrong)
    return counts


async def _put(c: blobsdk.Client, path: str, acked: dict[str, bytes]) -> int:
    data = os.urandom(50_000 + len(acked))
    try:
        await c.put(path, data)
    except blobsdk.BlobError:
        return 0
    acked[path] = data
    return 1


async def _read(c: blobsdk.Client, path: str) -> bytes | None:
    try:
        return bytes(await c.get(path))
    except blobsdk.BlobError:
        return None


def _config(cluster: Cluster, quorum: Quorum) -> ClientConfig:
    assert cluster.config is not None
    return msgspec.structs.replace(
        cluster.config, write=WriteConfig(**SMALL, write_quorum=quorum), timeouts=Timeouts(sock_read=SOCK_READ)
    )


def _parts(c: blobsdk.Client) -> tuple[ReplicatedBlockStore, Repairer]:
    store, repairer = c._open.blocks, c._open.repairer
    assert isinstance(store, ReplicatedBlockStore) and repairer is not None
    return store, repairer


async def _restart(cluster: Cluster, proc: ServerProcess) -> None:
    """Start the dead ``proc`` again on its port; return once it answers /healthz."""
    cluster.restart(proc)
    await asyncio.to_thread(wait_ready, proc, time.monotonic() + 30, 30)
