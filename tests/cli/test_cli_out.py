"""``blobsdk get PATH OUT`` never changes what OUT is (issue 20 item 5): a device or FIFO is
written through, a symlink is followed (its target replaced atomically, the link kept), and a
new file gets the umask's mode, as ``open(OUT, "w")`` would."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tests.cli.test_cli import error_line, ok, run

DATA = b"the bytes of /b/x\n" * 1000


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A local store holding ``/b/x`` = DATA."""
    (tmp_path / "in").write_bytes(DATA)
    ok("put", str(tmp_path / "in"), "/b/x", store=tmp_path / "store")
    return tmp_path / "store"


def null_device(tmp_path: Path) -> Path:
    """A character device that discards what is written: as root, a private node with
    /dev/null's numbers (so a regression replaces it, not the machine's /dev/null); as
    anyone else, /dev/null itself (whose directory they cannot write)."""
    if os.geteuid() != 0:
        return Path("/dev/null")
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return node


def is_null_device(path: Path) -> bool:
    st = os.stat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def test_a_null_device_stays_a_device(tmp_path, store):
    out = null_device(tmp_path)
    ok("get", "/b/x", str(out), store=store)
    assert is_null_device(out) and not out.is_symlink()


@pytest.mark.skipif(
    os.geteuid() == 0, reason="as root a regression would replace the machine's /dev/null: the private node above covers it"
)
def test_dev_null_itself_is_written_through(store):
    ok("get", "/b/x", "/dev/null", store=store)
    assert is_null_device(Path("/dev/null"))


def test_a_fifo_gets_the_bytes(tmp_path, store):
    """A thread reads the FIFO while the command writes it.  The test holds a write end of
    its own until the command has exited, so the reader's end is open before the command
    starts (a regression that replaces the FIFO cannot hand the reader the new file) and its
    EOF comes only after the command is done."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # never blocks, on Linux
    got: list[bytes] = []
    with open(os.open(fifo, os.O_RDONLY), "rb") as end:
        reader = threading.Thread(target=lambda: got.append(end.read()))
        reader.start()
        try:
            result = run("get", "/b/x", str(fifo), store=store)
        finally:
            os.close(held)
            reader.join()
    assert result.returncode == 0, result.stderr.decode()
    assert got == [DATA] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_to_a_device_stays_a_symlink_to_it(tmp_path, store):
    device = null_device(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(device)
    ok("get", "/b/x", str(link), store=store)
    assert link.is_symlink() and os.readlink(link) == str(device) and is_null_device(device)


def test_a_symlink_to_a_file_replaces_the_file_atomically_and_keeps_the_link(tmp_path, store):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "file"
    target.write_bytes(b"old")
    target.chmod(0o604)
    link = tmp_path / "link"
    link.symlink_to(target)
    ok("get", "/b/x", str(link), store=store)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == DATA and stat.S_IMODE(target.stat().st_mode) == 0o604
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["file"]  # no temp left


def test_a_dangling_symlink_gets_its_target_created(tmp_path, store):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "new")
    ok("get", "/b/x", str(link), store=store)
    assert link.is_symlink() and (tmp_path / "new").read_bytes() == DATA


@pytest.mark.parametrize(
    ("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664), (0o077, 0o600)], ids=["022", "027", "002", "077"]
)
def test_a_new_file_gets_the_umasks_mode(tmp_path, store, umask, mode):
    out = tmp_path / "out.bin"
    result = run("get", "/b/x", str(out), store=store, umask=umask)
    assert result.returncode == 0, result.stderr.decode()
    assert out.read_bytes() == DATA and stat.S_IMODE(out.stat().st_mode) == mode


def test_a_replaced_file_keeps_its_mode(tmp_path, store):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    ok("get", "/b/x", str(out), store=store)
    assert out.read_bytes() == DATA and stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_directory_gets_the_blob_by_its_last_segment_as_cp_does(tmp_path, store):
    """issue 22 CLI item 6: ``get PATH DIR`` writes DIR/<last segment of PATH>."""
    out = tmp_path / "out"
    out.mkdir()
    ok("get", "/b/x", str(out), store=store)
    assert [p.name for p in out.iterdir()] == ["x"] and (out / "x").read_bytes() == DATA
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)  # a link to a directory is that directory
    (out / "x").unlink()
    ok("get", "/b/x", str(link), store=store)
    assert link.is_symlink() and (out / "x").read_bytes() == DATA


def test_a_directory_in_the_way_of_the_blobs_name_is_an_error_and_stays(tmp_path, store):
    (tmp_path / "x").mkdir()
    result = run("get", "/b/x", str(tmp_path), store=store)
    assert result.returncode == 1 and (tmp_path / "x").is_dir()
    assert result.stderr.decode() == f"blobsdk: error: [Errno 21] Is a directory: '{os.path.realpath(tmp_path / 'x')}'\n"


def test_an_out_that_cannot_be_made_fails_before_the_blob_is_read_and_names_out(tmp_path, store):
    """The missing directory is found before the read (so before ``/b/missing``'s not-found),
    and named as OUT, not as the temp file beside it."""
    out = tmp_path / "no-such-dir" / "x"
    for path in ("/b/missing", "/b/x"):
        result = run("get", path, str(out), store=store)
        assert result.returncode == 1
        assert result.stderr.decode() == f"blobsdk: error: [Errno 2] No such file or directory: '{out}'\n"


def test_a_failed_read_leaves_out_as_it_was_and_no_temp_file(tmp_path, store):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_bytes(b"old")
    result = run("get", "/b/missing", str(out / "x"), store=store)
    assert result.returncode == 1 and error_line(result) == "blobsdk: error: no blob at '/b/missing'"
    assert [p.name for p in out.iterdir()] == ["x"] and (out / "x").read_bytes() == b"old"
