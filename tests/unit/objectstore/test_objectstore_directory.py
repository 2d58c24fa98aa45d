"""DirectoryStore: the contract on a file system, atomic writes, key rules."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from headrace.objectstore import directory, keys
from headrace.objectstore.errors import InvalidObjectKey, ObjectNotFound, ObjectStoreRejected
from headrace.objectstore.interface import ObjectInfo


@pytest.fixture
def store(tmp_path: Path) -> directory.DirectoryStore:
    return directory.DirectoryStore(tmp_path / "objects")


def test_put_get_stat_and_overwrite(store: directory.DirectoryStore) -> None:
    store.put("c/ns/t/0/a.seg", b"hello")
    assert store.get("c/ns/t/0/a.seg") == b"hello"
    assert store.stat("c/ns/t/0/a.seg") == ObjectInfo("c/ns/t/0/a.seg", 5)
    assert store.exists("c/ns/t/0/a.seg")
    store.put("c/ns/t/0/a.seg", b"hello")  # idempotent
    store.put("c/ns/t/0/a.seg", b"bye")  # replaces
    assert store.get("c/ns/t/0/a.seg") == b"bye"
    assert (store.root / "c" / "ns" / "t" / "0" / "a.seg").read_bytes() == b"bye"


def test_missing_keys(store: directory.DirectoryStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("no/such")
    with pytest.raises(ObjectNotFound):
        store.get_range("no/such", 0, 1)
    with pytest.raises(ObjectNotFound):
        store.stat("no/such")
    assert not store.exists("no/such")
    store.put("no/such/thing", b"x")
    with pytest.raises(ObjectNotFound):
        store.stat("no/such")  # a directory, not an object
    with pytest.raises(ObjectNotFound):
        store.get("no/such")


def test_ranges(store: directory.DirectoryStore) -> None:
    data = bytes(range(256)) * 4
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 1000, 100) == data[1000:]
    assert store.get_range("r", 1024, 5) == b""
    assert store.get_range("r", 5000, 5) == b""
    assert store.get_range("r", 3, 0) == b""
    with pytest.raises(ValueError, match=">= 0"):
        store.get_range("r", -1, 5)


def test_delete_is_idempotent(store: directory.DirectoryStore) -> None:
    store.put("a/b", b"1")
    store.delete("a/b")
    store.delete("a/b")
    store.delete("never/was")
    assert not store.exists("a/b")
    assert list(store.list()) == []


def test_list_is_lexicographic_across_directories(store: directory.DirectoryStore) -> None:
    # '-' (0x2d) < '/' (0x2f) < '0' (0x30): a naive depth-first walk of
    # directory "a" before file "a-c" would get this wrong.
    keys = ["a/b", "a-c", "a0", "a/b0/x", "a/b/c", "b", "ab/c", "a/ä", "a/z"]
    for k in keys:
        if k == "a/b":
            continue  # cannot coexist with a/b/c on a file system
        store.put(k, k.encode())
    expected = sorted(k for k in keys if k != "a/b")
    assert [i.key for i in store.list()] == expected
    assert [i.size for i in store.list()] == [len(k.encode()) for k in expected]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", ["x/1/a", "x/1/b", "x/10/a", "x/2/a", "y"]),
        ("x/", ["x/1/a", "x/1/b", "x/10/a", "x/2/a"]),
        ("x/1", ["x/1/a", "x/1/b", "x/10/a"]),
        ("x/1/", ["x/1/a", "x/1/b"]),
        ("x/1/b", ["x/1/b"]),
        ("x/3", []),
        ("z/", []),
    ],
)
def test_list_by_prefix(store: directory.DirectoryStore, prefix: str, expected: list[str]) -> None:
    for k in ["x/1/a", "x/1/b", "x/10/a", "x/2/a", "y"]:
        store.put(k, b"")
    assert [i.key for i in store.list(prefix)] == expected


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/abs",
        "a//b",
        "a/",
        "../x",
        "a/../b",
        "a/./b",
        ".hidden",
        "a/.b.tmp",
        "a\\b",
        "a\x00b",
        "a\nb",
        "é" * 600,
    ],
)
def test_invalid_keys_are_refused_everywhere(store: directory.DirectoryStore, key: str) -> None:
    with pytest.raises(InvalidObjectKey):
        store.put(key, b"x")
    with pytest.raises(InvalidObjectKey):
        store.get(key)
    with pytest.raises(InvalidObjectKey):
        store.delete(key)
    assert not any(store.root.parent.rglob("x*"))


def test_valid_keys() -> None:
    for key in [
        "a",
        "a.b",
        "c/ns/t/0/00000000000000000000-00000000000000000099.seg",
        "ü/日本",
        "a b/c=d+e",
    ]:
        assert keys.validate_key(key) == key
    with pytest.raises(InvalidObjectKey):
        keys.validate_prefix("a//")
    assert keys.validate_prefix("a/") == "a/"


def test_file_and_directory_cannot_share_a_key(store: directory.DirectoryStore) -> None:
    store.put("a/b", b"1")
    with pytest.raises(InvalidObjectKey):
        store.put("a/b/c", b"2")
    store.put("x/y/z", b"3")
    with pytest.raises(InvalidObjectKey):
        store.put("x/y", b"4")
    assert store.get("a/b") == b"1"


def test_put_stream_and_file(store: directory.DirectoryStore, tmp_path: Path) -> None:
    data = os.urandom(3 * directory.CHUNK + 17)
    store.put_stream("s/unsized", io.BytesIO(data))
    assert store.get("s/unsized") == data
    src = io.BytesIO(data + b"trailing")
    store.put_stream("s/sized", src, len(data))
    assert store.get("s/sized") == data
    assert src.read() == b"trailing"  # stopped at `size`
    f = tmp_path / "segment"
    f.write_bytes(data[:1000])
    store.put_file("s/file", f)
    assert store.get("s/file") == data[:1000]


def test_short_stream_leaves_nothing(store: directory.DirectoryStore) -> None:
    store.put("s/k", b"old")
    with pytest.raises(ObjectStoreRejected, match="short"):
        store.put_stream("s/k", io.BytesIO(b"abc"), 10)
    assert store.get("s/k") == b"old"
    assert sorted(p.name for p in (store.root / "s").iterdir()) == ["k"]


def test_failed_write_removes_its_temporary_file(store: directory.DirectoryStore) -> None:
    class Boom(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b: object) -> int:
            raise RuntimeError("source broke")

    with pytest.raises(RuntimeError):
        store.put_stream("f/k", Boom())  # type: ignore[arg-type]
    assert list((store.root / "f").iterdir()) == []


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from headrace.objectstore.directory import DirectoryStore

    class Slow:
        def __init__(self):
            self.n = 0
        def read(self, size=-1):
            self.n += 1
            if self.n == 3:
                print("writing", flush=True)
                time.sleep(60)  # killed here, mid-object
            return b"x" * 65536

    DirectoryStore(Path(sys.argv[1])).put_stream("c/ns/t/0/seg", Slow(), 10 * 65536)
    """
)


def test_a_writer_killed_mid_write_leaves_no_visible_object(
    store: directory.DirectoryStore,
) -> None:
    store.put("c/ns/t/0/seg", b"previous")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(store.root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        tmp_files = [p for p in (store.root / "c/ns/t/0").iterdir() if p.name.startswith(".")]
        assert len(tmp_files) == 1 and tmp_files[0].stat().st_size > 0  # partly written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert store.get("c/ns/t/0/seg") == b"previous"
    assert [i.key for i in store.list()] == ["c/ns/t/0/seg"]
    # the sweep leaves fresh temporaries (a live writer's) alone, removes old ones
    assert store.remove_partial_writes(older_than=3600) == 0
    old = time.time() - 7200
    os.utime(tmp_files[0], (old, old))
    assert store.remove_partial_writes(older_than=3600) == 1
    assert [p.name for p in (store.root / "c/ns/t/0").iterdir()] == ["seg"]


def test_write_protocol_is_temp_fsync_rename(
    store: directory.DirectoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        assert not os.path.exists(dst)  # nothing visible before the rename
        assert Path(src).name.startswith(".") and Path(src).parent == Path(dst).parent
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(directory.os, "fsync", fsync)
    monkeypatch.setattr(directory.os, "replace", replace)
    store.put("p/q", b"data")
    assert events == ["fsync-file", "rename", "fsync-dir"]
