"""blobsdk's DLIO plugins: the DLIO-free part (blobsdk/integrations/dliofiles.py) over real
stores, and DLIO itself running them end to end when `make dlio` made .venv-dlio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import blobsdk
from blobsdk.errors import MissingExtra
from blobsdk.integrations.dliofiles import (
    CheckpointStates,
    DlioSettings,
    Lookahead,
    SampleFiles,
    dlio_order,
    tensor_bytes,
    worker_batches,
)
from servers.cluster import start_cluster
from tests.helpers import in_a_forked_child

ROOT = Path(__file__).resolve().parent.parent.parent
DLIO_VENV = ROOT / ".venv-dlio"
PREFIX = "/bench/dlio"


def settings(store: Path) -> DlioSettings:
    return DlioSettings.from_env({"BLOBSDK_DLIO_PREFIX": PREFIX + "/", "BLOBSDK_DLIO_LOCAL": str(store)})


def test_settings_need_a_prefix() -> None:
    message = r"^set BLOBSDK_DLIO_PREFIX to the blob prefix of DLIO's data folder \(e\.g\. /bucket/dlio\)$"
    with pytest.raises(ValueError, match=message):
        DlioSettings.from_env({"BLOBSDK_DLIO_LOCAL": "/tmp/x"})


def test_settings_refuse_a_prefix_that_is_no_blob_path() -> None:
    with pytest.raises(blobsdk.InvalidPath, match=r"^'\.\.' segment in '/bucket/\.\./x/x'$"):
        DlioSettings.from_env({"BLOBSDK_DLIO_PREFIX": "/bucket/../x", "BLOBSDK_DLIO_LOCAL": "/tmp/x"})


def test_settings_without_a_store_say_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"^set BLOBSDK_CONFIG, or BLOBSDK_API_URL and BLOBSDK_BLOCK_URLS$"):
        DlioSettings.from_env({"BLOBSDK_DLIO_PREFIX": PREFIX})


def test_a_sample_file_is_the_blob_under_the_prefix(tmp_path: Path) -> None:
    files = SampleFiles(settings(tmp_path / "store"), tmp_path / "data")
    assert files.blob_path(tmp_path / "data" / "train" / "img_1_of_8.npz") == f"{PREFIX}/train/img_1_of_8.npz"
    assert files.blob_path(str(tmp_path / "data" / "train" / ".." / "valid" / "a.npz")) == f"{PREFIX}/valid/a.npz"


@pytest.mark.parametrize("name", ["outside.npz", "data/../other/x.npz", "data"])
def test_a_file_outside_the_data_folder_is_refused(tmp_path: Path, name: str) -> None:
    files = SampleFiles(settings(tmp_path / "store"), tmp_path / "data")
    with pytest.raises(ValueError, match=r" is not under DLIO's data folder "):
        files.blob_path(tmp_path / name)


def test_samples_read_whole_and_counted(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put_many((f"{PREFIX}/train/img_{i}.npz", bytes([i]) * (1000 + i)) for i in range(4))
    files = SampleFiles(settings(tmp_path / "store"), tmp_path / "data")
    try:
        got = [files.read(tmp_path / "data" / "train" / f"img_{i}.npz") for i in range(4)]
        assert got == [bytes([i]) * (1000 + i) for i in range(4)]
        assert (files.files_read, files.bytes_read) == (4, 4006)
        with pytest.raises(blobsdk.BlobNotFound):
            files.read(tmp_path / "data" / "train" / "missing.npz")
        # DLIO's DataLoader workers are forked after the main process has read: each opens its own client
        assert in_a_forked_child(lambda: bytes(files.read(tmp_path / "data" / "train" / "img_2.npz"))) == bytes([2]) * 1002
    finally:
        files.close()


def test_reads_ahead_are_taken_by_the_reads_that_come_and_dropped_past_the_bound(tmp_path: Path) -> None:
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        c.put_many((f"{PREFIX}/train/{i}", bytes([i]) * 5000) for i in range(8))
    files = SampleFiles(settings(tmp_path / "store"), tmp_path / "data", threads=4, max_pending=3)
    name = [tmp_path / "data" / "train" / str(i) for i in range(8)]
    try:
        assert files.read(name[0], ahead=[name[1], name[2], name[0]]) == bytes([0]) * 5000
        assert sorted(files._pending) == [f"{PREFIX}/train/1", f"{PREFIX}/train/2"]
        assert files.read(name[1]) == bytes([1]) * 5000 and list(files._pending) == [f"{PREFIX}/train/2"]
        files.read(name[3], ahead=[name[4], name[5], name[6]])  # four guesses waiting: the oldest (2) goes
        assert list(files._pending) == [f"{PREFIX}/train/{i}" for i in (4, 5, 6)]
        assert [files.read(name[i]) for i in (2, 4, 5, 6)] == [bytes([i]) * 5000 for i in (2, 4, 5, 6)]
        assert (files.files_read, files.bytes_read, files._pending) == (7, 35000, {})
        files.read(name[7], ahead=[tmp_path / "data" / "train" / "missing"])
        with pytest.raises(blobsdk.BlobNotFound):  # a guess that failed fails the read that takes it, as the read would
            files.read(tmp_path / "data" / "train" / "missing")
    finally:
        files.close()


def test_dlio_order_is_its_samplers() -> None:
    np = pytest.importorskip("numpy")
    indices = list(range(10, 20))
    np.random.seed(7)  # DLIO 2.0.0's dlio_sampler.__iter__: seed the global state, shuffle the rank's list
    np.random.shuffle(indices)
    assert dlio_order(1, 3, 30, 7) == indices
    assert dlio_order(2, 3, 30, None) == list(range(20, 30))
    assert dlio_order(0, 4, 10, None) == [0, 1, 2]  # ceil(10 / 4) a rank


def test_worker_batches_are_dealt_round_robin_without_the_partial_last() -> None:
    order = list(range(100, 111))
    assert worker_batches(order, 2, 2, 0) == [[100, 101], [104, 105], [108, 109]]
    assert worker_batches(order, 2, 2, 1) == [[102, 103], [106, 107]]
    assert worker_batches(order, 3, 0, 0) == [[100, 101, 102], [103, 104, 105], [106, 107, 108]]


def test_lookahead_names_the_rest_of_the_batch_and_the_next_then_stops_on_a_surprise() -> None:
    ahead = Lookahead([[5, 6, 7], [1, 2, 3], [9, 8, 4]])
    assert ahead.after(5) == [6, 7, 1, 2, 3]
    assert ahead.after(6) == [7, 1, 2, 3]
    assert ahead.after(7) == [1, 2, 3]
    assert ahead.after(1) == [2, 3, 9, 8, 4]
    assert [ahead.after(i) for i in (2, 3, 9, 8, 4)] == [[3, 9, 8, 4], [9, 8, 4], [8, 4], [4], []]
    assert ahead.after(5) == [6, 7, 1, 2, 3]  # the next epoch, in the same order
    assert ahead.after(2) == [] and not ahead.on  # not the sample predicted: no more guesses
    assert ahead.after(6) == []
    assert Lookahead([]).after(0) == []


def test_samples_from_a_cluster_through_its_client_toml(tmp_path: Path) -> None:
    with start_cluster(tmp_path / "cluster", block_servers=1, l3_nodes=0, trackers=0) as cluster:
        with blobsdk.SyncClient(cluster.config) as c:
            c.put(f"{PREFIX}/train/a.npz", b"x" * 300_000)
        env = {"BLOBSDK_DLIO_PREFIX": PREFIX, "BLOBSDK_CONFIG": str(cluster.config_path)}
        files = SampleFiles(DlioSettings.from_env(env), tmp_path / "data")
        try:
            assert files.read(tmp_path / "data" / "train" / "a.npz") == b"x" * 300_000
        finally:
            files.close()


def test_checkpoint_states_save_and_load_through_dcp(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    states = CheckpointStates(settings(tmp_path / "store"))
    state = {"a": torch.randint(-128, 128, (300_000,), dtype=torch.int8), "opt": {"b": torch.arange(1000, dtype=torch.float32)}}
    assert states.save("model-0-4-0", state) == 304_000
    into = {"a": torch.zeros(300_000, dtype=torch.int8), "opt": {"b": torch.zeros(1000, dtype=torch.float32)}}
    assert states.load("model-0-4-0", into) == 304_000
    assert torch.equal(into["a"], state["a"]) and torch.equal(into["opt"]["b"], state["opt"]["b"])
    with blobsdk.SyncClient.local(tmp_path / "store") as c:
        assert any(info.path.startswith(f"{PREFIX}/checkpoints/model-0-4-0/") for info in c.list(f"{PREFIX}/checkpoints/"))


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_a_checkpoint_name_is_one_segment(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^a checkpoint name is one path segment: got {name!r}$".replace(".", r"\.")):
        CheckpointStates(settings(tmp_path / "store")).prefix(name)


def test_tensor_bytes_counts_nested_arrays() -> None:
    np = pytest.importorskip("numpy")
    assert tensor_bytes({"a": np.zeros(10, np.int8), "b": {"c": np.zeros(3, np.float64), "d": "text"}}) == 34


@pytest.mark.skipif(bool(__import__("importlib").util.find_spec("dlio_benchmark")), reason="DLIO is installed here")
def test_the_dlio_module_without_dlio_says_how_to_install_it() -> None:
    sys.modules.pop("blobsdk.dlio", None)
    message = r"^blobsdk\.dlio runs inside DLIO: install dlio-benchmark \(`make dlio`, docs/dlio\.md\)"
    with pytest.raises(MissingExtra, match=message):
        import blobsdk.dlio  # noqa: F401


# --- DLIO itself ------------------------------------------------------------------------------


def _dlio(run: Path, *overrides: str, env: dict[str, str], ranks: int = 1) -> subprocess.CompletedProcess[str]:
    bin = DLIO_VENV / "bin"
    command = [str(bin / "mpiexec"), "-n", str(ranks), str(bin / "dlio_benchmark"), "workload=unet3d_a100"]
    command += [f"++workload.{o}" for o in overrides] + [f"hydra.run.dir={run / 'hydra'}"]
    return subprocess.run(command, cwd=run, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(not (DLIO_VENV / "bin" / "dlio_benchmark").exists(), reason="DLIO's own venv is absent: `make dlio` makes it")
def test_dlio_trains_and_checkpoints_through_blobsdk(tmp_path: Path) -> None:
    data, store = tmp_path / "data", tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOBSDK_DLIO_PREFIX": PREFIX, "BLOBSDK_DLIO_LOCAL": str(store)}
    dataset = ["dataset.num_files_train=8", "dataset.record_length=262144", "dataset.record_length_stdev=0"]
    dataset.append(f"dataset.data_folder={data}")
    generate = ["workflow.generate_data=True", "workflow.train=False", f"output.folder={tmp_path / 'gen'}"]
    made = _dlio(tmp_path, *generate, *dataset, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    files = sorted((data / "train").iterdir())
    with blobsdk.SyncClient.local(store) as c:  # the samples go to the store; DLIO lists empty stand-ins
        c.put_many((f"{PREFIX}/train/{f.name}", f.read_bytes()) for f in files)
    for f in files:
        f.write_bytes(b"")
    trained = _dlio(
        tmp_path,
        "workflow.generate_data=False",
        "workflow.train=True",
        "workflow.checkpoint=True",
        *dataset,
        "reader.reader_classname=blobsdk.dlio.BlobReader",
        "reader.read_threads=1",
        "reader.batch_size=2",
        "checkpoint.checkpoint_mechanism_classname=blobsdk.dlio.BlobCheckpointing",
        f"checkpoint.checkpoint_folder={tmp_path / 'ckpt'}",
        "checkpoint.checkpoint_after_epoch=1",
        "checkpoint.model_size=100000",
        "train.epochs=1",
        "train.computation_time=0.01",
        f"output.folder={tmp_path / 'out'}",
        env=env,
        ranks=2,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_accelerators"] == 2 and summary["metric"]["train_au_mean_percentage"] > 0
    with blobsdk.SyncClient.local(store) as c:
        saved = {info.path.split("/")[4] for info in c.list(f"{PREFIX}/checkpoints/")}
    assert any(name.startswith("model-1-") and name.endswith("-0") for name in saved), saved


@pytest.mark.skipif(not (DLIO_VENV / "bin" / "dlio_benchmark").exists(), reason="DLIO's own venv is absent: `make dlio` makes it")
def test_dlio_order_is_what_the_installed_dlios_sampler_hands_out() -> None:
    script = (
        "from dlio_benchmark.data_loader.torch_data_loader import dlio_sampler\n"
        "from dlio_benchmark.common.enumerations import Shuffle\n"
        "print(list(dlio_sampler(1, 3, 30, Shuffle.SEED, 1, 7)), list(dlio_sampler(0, 2, 9, Shuffle.OFF, 1, 7)))\n"
    )
    python = str(DLIO_VENV / "bin" / "python")
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == f"{dlio_order(1, 3, 30, 7)} {dlio_order(0, 2, 9, None)}"
