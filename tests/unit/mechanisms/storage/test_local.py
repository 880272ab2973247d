"""Local-store specifics: permissions, a full disk, crash leftovers, incremental size."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.errors import StorageError
from tidal.mechanisms.storage import DEFAULT_CHUNK_SIZE, CheckpointStore
from tidal.mechanisms.storage.chunks import chunk_key


def rand(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(rng.randbytes(min(1 << 24, n - i)) for i in range(0, n, 1 << 24))


def tree(root: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files]


def test_permissions_are_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a permissive umask must not leak into the store
    try:
        root = tmp_path / "store"
        store = CheckpointStore(root, chunk_size=4096)
        src = tmp_path / "f"
        src.write_bytes(rand(3 * 4096 + 1, 1))
        src.chmod(0o644)
        w = store.writer("job")
        w.add_file("rank-0/pages.img", src)
        w.add_bytes("fs/x", b"x" * 10000)
        w.add_symlink("fs/l", "x")
        info = w.commit({})
        w2 = store.writer("job")  # an in-progress writer's files too
        w2.add_bytes("y", b"y")
        store.retain("job", 1)
    finally:
        os.umask(old)
    paths = [root, *tree(root)]
    assert len(paths) > 10
    for p in paths:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), f"{p} has mode {oct(mode)}"
    assert store.reader("job", info.id).entry("rank-0/pages.img").mode == 0o644
    store.close()


def test_existing_root_is_made_private(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    CheckpointStore(root).close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_manifestless_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "s")
    w = store.writer("job")
    w.add_bytes("a", b"a")
    good = w.commit({})
    # What a crash between chunk writes and the manifest leaves behind.
    crashed = tmp_path / "s" / "jobs" / "job" / "000009-dead00"
    (crashed / "pending").mkdir(parents=True)
    (crashed / "pending" / "000001.refs").write_text(chunk_key("ab" * 32).rsplit("/", 1)[1])
    assert store.list("job") == [good]
    assert store.latest("job") == good
    # The next id continues after the crashed one, so ids stay unique and sortable.
    assert store.writer("job").id.startswith("000010-")


def test_gc_removes_crash_leftover_temp_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "s")
    w = store.writer("job")
    w.add_bytes("a", b"a" * 100)
    w.commit({})
    chunk_dir = tmp_path / "s" / "chunks" / "00"
    chunk_dir.mkdir(mode=0o700)
    (chunk_dir / ".00abc.1234.tmp").write_bytes(b"half a chunk")
    (chunk_dir / ("00" + "1" * 62)).write_bytes(b"Rorphan")  # unreferenced chunk
    assert store.gc() == 1
    assert os.listdir(chunk_dir) == []
    assert store.reader("job", store.list("job")[0].id).read_bytes("a") == b"a" * 100


def changed_pages(data: bytes, fraction: float, *, clustered: bool, seed: int) -> bytes:
    pages = len(data) // 4096
    k = round(pages * fraction)
    rng = random.Random(seed)
    if clustered:  # four regions (e.g. some tensors) rewritten
        starts = [rng.randrange(0, pages - k // 4) for _ in range(4)]
        idx = {s + i for s in starts for i in range(k // 4)}
    else:
        idx = set(rng.sample(range(pages), k))
    out = bytearray(data)
    for i in idx:
        out[i * 4096 : (i + 1) * 4096] = rng.randbytes(4096)
    return bytes(out)


@pytest.mark.parametrize(
    ("chunk_size", "clustered"), [(DEFAULT_CHUNK_SIZE, True), (16 * 1024, False), (4096, False)]
)
def test_incremental_checkpoint_stores_little(tmp_path: Path, chunk_size: int, clustered: bool) -> None:
    """1 % of 4 KiB pages changed: the second checkpoint stores at most 5 % of the first's bytes.

    With the default chunk size this holds when changes are clustered in regions (tensors); pages
    changed at random all over a file need small chunks (every 1 MiB chunk would contain one).
    """
    store = CheckpointStore(tmp_path / "s", chunk_size=chunk_size)
    first = rand((256 if clustered else 32) << 20, 3)
    src = tmp_path / "pages.img"
    src.write_bytes(first)
    w = store.writer("job")
    w.add_file("pages.img", src)
    a = w.commit({})
    second = changed_pages(first, 0.01, clustered=clustered, seed=4)
    src.write_bytes(second)
    w = store.writer("job")
    w.add_file("pages.img", src)
    b = w.commit({})
    assert a.stored_bytes > len(first)  # random data is stored raw
    assert b.stored_bytes <= 0.05 * a.stored_bytes, (b.stored_bytes, a.stored_bytes)
    assert store.reader("job", b.id).read_bytes("pages.img") == second
    store.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_store_keeps_last_good_checkpoint(small_fs: Path, tmp_path: Path) -> None:
    root = small_fs / "store"
    store = CheckpointStore(root, chunk_size=256 * 1024)
    good_data = rand(1 << 20, 5)
    w = store.writer("job")
    w.add_bytes("pages.img", good_data)
    good = w.commit({"step": 1})
    used_after_good = shutil.disk_usage(small_fs).used

    big = tmp_path / "big.img"
    big.write_bytes(rand(8 << 20, 6))  # twice the store's size
    with pytest.raises(StorageError) as err, store.writer("job") as w:
        w.add_bytes("meta", b"m" * 1000)
        w.add_file("pages.img", big)
    msg = str(err.value)
    assert "checkpoint store full" in msg and str(root) in msg, msg
    assert err.value.fields["reason"] == "store full"
    assert w.state == "aborted"

    assert store.list("job") == [good]
    assert store.latest("job") == good
    store.verify("job", good.id)
    store.reader("job", good.id).extract("pages.img", tmp_path / "restored")
    assert (tmp_path / "restored").read_bytes() == good_data
    # The failed checkpoint left nothing: no directory, no chunk, no temp file.
    assert os.listdir(root / "jobs" / "job") == [good.id]
    assert not [p for p in tree(root) if p.name.startswith(".")]
    assert shutil.disk_usage(small_fs).used <= used_after_good + 4096  # and the collection's marker

    # Once there is room again, checkpointing works.
    w = store.writer("job")
    w.add_bytes("pages.img", rand(1 << 20, 7))
    nxt = w.commit({"step": 2})
    assert [i.id for i in store.list("job")] == [good.id, nxt.id]
    store.close()


def test_full_store_during_commit(small_fs: Path) -> None:
    """The manifest itself does not fit: the checkpoint does not exist and its temp file is gone."""
    root = small_fs / "store"
    store = CheckpointStore(root, chunk_size=64 * 1024)
    w = store.writer("job")
    w.add_bytes("a", b"a")
    good = w.commit({})
    w = store.writer("job")
    w.add_bytes("x", b"x")
    filler = small_fs / "filler"
    with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 4096)
    with pytest.raises(StorageError, match="checkpoint store full"):
        w.commit({"pad": "p" * 100_000})
    w.abort()
    filler.unlink()
    assert store.list("job") == [good]
    assert not [p for p in tree(root) if p.name.startswith(".")]
    assert os.listdir(root / "jobs" / "job") == [good.id]
    store.close()
