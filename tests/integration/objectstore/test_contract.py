"""The ObjectStore contract, run against DirectoryStore and a real MinIO alike."""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from headrace.objectstore.errors import InvalidObjectKey, ObjectNotFound, ObjectStoreError
from headrace.objectstore.interface import ObjectInfo, ObjectStore

SEG = "c1/ns/orders/3/00000000000000000000-00000000000000000099.seg"


def test_put_get_stat_exists(store: ObjectStore) -> None:
    store.put(SEG, b"segment bytes")
    assert store.get(SEG) == b"segment bytes"
    assert store.stat(SEG) == ObjectInfo(SEG, 13)
    assert store.exists(SEG)


def test_put_is_idempotent_and_replaces(store: ObjectStore) -> None:
    store.put(SEG, b"one")
    store.put(SEG, b"one")
    assert [i.key for i in store.list()] == [SEG]
    store.put(SEG, b"two!")
    assert store.get(SEG) == b"two!"
    assert store.stat(SEG).size == 4


def test_empty_objects(store: ObjectStore) -> None:
    store.put("e/empty", b"")
    assert store.get("e/empty") == b""
    assert store.stat("e/empty").size == 0
    assert store.get_range("e/empty", 0, 10) == b""


def test_missing_objects(store: ObjectStore) -> None:
    for call in (
        lambda: store.get("m/none"),
        lambda: store.get_range("m/none", 0, 4),
        lambda: store.get_range("m/none", 0, 0),
        lambda: store.stat("m/none"),
    ):
        with pytest.raises(ObjectNotFound):
            call()
    assert not store.exists("m/none")


@pytest.mark.parametrize(
    ("start", "length"),
    [
        (0, 1),
        (0, 1000),
        (1, 998),
        (500, 10),
        (999, 1),
        (999, 50),
        (1000, 1),
        (1000, 0),
        (2000, 5),
        (7, 0),
    ],
)
def test_ranged_reads(store: ObjectStore, start: int, length: int) -> None:
    data = os.urandom(1000)
    store.put("r/obj", data)
    assert store.get_range("r/obj", start, length) == data[start : start + length]


def test_ranges_must_not_be_negative(store: ObjectStore) -> None:
    store.put("r/obj", b"abc")
    with pytest.raises(ValueError, match=">= 0"):
        store.get_range("r/obj", -1, 2)


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d/k", b"x")
    store.delete("d/k")
    store.delete("d/k")
    store.delete("d/never")
    assert not store.exists("d/k")
    assert list(store.list("d/")) == []


def test_delete_many_removes_every_key_past_one_request(store: ObjectStore) -> None:
    # more than S3's 1,000 keys per multi-object delete, and keys that never existed
    doomed = [f"dm/{i:05d}" for i in range(1005)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), doomed))
    store.put("dm-kept", b"y")
    store.delete_many([*doomed, "dm/never", "dm/also-never"])
    assert list(store.list("dm/")) == []
    assert store.get("dm-kept") == b"y"
    store.delete_many([])
    store.delete_many(iter(["dm/00001"]))  # a generator; already gone


def test_delete_many_checks_every_key_first(store: ObjectStore) -> None:
    store.put("dv/a", b"x")
    with pytest.raises(InvalidObjectKey):
        store.delete_many(["dv/a", "dv/../escape"])
    assert store.exists("dv/a")


def test_listing_order_and_prefixes(store: ObjectStore) -> None:
    keys = ["a-c", "a/b/c", "a/b0", "a/z", "a0", "ab/c", "b", "a/ä", "a/日本"]
    for k in keys:
        store.put(k, k.encode())
    listed = list(store.list())
    assert [i.key for i in listed] == sorted(keys)
    assert all(i.size == len(i.key.encode()) for i in listed)
    assert [i.key for i in store.list("a/")] == sorted(k for k in keys if k.startswith("a/"))
    assert [i.key for i in store.list("a/b")] == ["a/b/c", "a/b0"]
    assert [i.key for i in store.list("a")] == sorted(k for k in keys if k.startswith("a"))
    assert list(store.list("q")) == []


def test_listing_many_keys_under_prefixes(store: ObjectStore) -> None:
    # More than one S3 listing page (1000 keys), over three partitions.
    keys = [f"c/ns/t/{p}/{b:020d}-{b + 9:020d}.seg" for p in range(3) for b in range(0, 4000, 10)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b"s"), keys))
    assert [i.key for i in store.list()] == sorted(keys)
    assert [i.key for i in store.list("c/ns/t/1/")] == sorted(k for k in keys if "/t/1/" in k)
    assert len(list(store.list("c/ns/t/2/" + "39".zfill(18)))) == 10
    assert list(store.list("c/ns/t/3/")) == []


@pytest.mark.parametrize(
    "key", ["", "/abs", "a//b", "a/", "../etc/passwd", "a/../b", ".x", "a\\b", "a\x00"]
)
def test_invalid_keys(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidObjectKey):
        store.put(key, b"x")
    with pytest.raises(InvalidObjectKey):
        store.get(key)
    with pytest.raises(InvalidObjectKey):
        store.stat(key)
    with pytest.raises(InvalidObjectKey):
        store.delete(key)
    with pytest.raises(InvalidObjectKey):
        list(store.list(key + "//"))


def test_streamed_puts(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(12 << 20)  # several multipart parts at MinIO's 5 MiB minimum
    store.put_stream("s/sized", io.BytesIO(data), len(data))
    assert store.stat("s/sized").size == len(data)
    assert store.get("s/sized") == data
    store.put_stream("s/unsized", io.BytesIO(data[:3_000_000]))
    assert store.get("s/unsized") == data[:3_000_000]
    f = tmp_path / "segment"
    f.write_bytes(data[:777])
    store.put_file("s/file", f)
    assert store.get("s/file") == data[:777]


def test_a_short_stream_fails_and_keeps_the_old_object(store: ObjectStore) -> None:
    store.put("s/k", b"old")
    for size in (10, 6 << 20):
        with pytest.raises(ObjectStoreError) as info:
            store.put_stream("s/k", io.BytesIO(b"abc" * (size // 6)), size)
        assert not info.value.retriable  # the same stream would fail the same way
    assert store.get("s/k") == b"old"
    assert [i.key for i in store.list("s/")] == ["s/k"]


def test_concurrent_puts_to_one_key_never_mix(store: ObjectStore) -> None:
    bodies = [bytes([n]) * (256 << 10) for n in range(8)]
    seen: list[bytes] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(store.get("w/k"))
            except ObjectNotFound:
                pass

    t = threading.Thread(target=reader)
    t.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda b: store.put("w/k", b), bodies * 3))
    finally:
        stop.set()
        t.join()
    assert store.get("w/k") in bodies
    assert all(s in bodies for s in seen)


def test_conditional_put_only_over_the_version_read(store: ObjectStore) -> None:
    # absent: only a put that expects no object succeeds
    assert store.put_if_version("c/manifest.json", b"v1", "no-such-version") is False
    assert store.put_if_version("c/manifest.json", b"v1", None) is True
    assert store.put_if_version("c/manifest.json", b"again", None) is False
    data, version = store.get_versioned("c/manifest.json")
    assert data == b"v1"
    # another writer's plain put in between: the conditional put does nothing
    store.put("c/manifest.json", b"theirs")
    assert store.put_if_version("c/manifest.json", b"mine", version) is False
    assert store.get("c/manifest.json") == b"theirs"
    data, version = store.get_versioned("c/manifest.json")
    assert store.put_if_version("c/manifest.json", b"mine", version) is True
    assert store.get("c/manifest.json") == b"mine"
    with pytest.raises(ObjectNotFound):
        store.get_versioned("c/missing.json")
