"""MinIO specifics: big objects, outages, credentials, buckets, the server helper."""

from __future__ import annotations

import io
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from headrace.objectstore import directory, minio_store, retrying
from headrace.objectstore.errors import (
    ObjectStoreAccessDenied,
    ObjectStoreRejected,
    ObjectStoreUnavailable,
)
from headrace.objectstore.interface import ObjectStore
from headrace.testing import minio as minio_server
from tests.integration.objectstore.servers import minio_binary, new_bucket

MIB = 1 << 20


def measure(store: ObjectStore, data: bytes) -> tuple[float, float]:
    """Seconds to put ``data`` (streamed) and to get it back."""
    t0 = time.perf_counter()
    store.put_stream("big/object", io.BytesIO(data), len(data))
    t1 = time.perf_counter()
    back = store.get("big/object")
    t2 = time.perf_counter()
    assert back == data
    return t1 - t0, t2 - t1


def test_a_64_mib_object_round_trips_and_reports_throughput(
    minio: minio_server.MinioServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = os.urandom(64 * MIB)
    stores: dict[str, ObjectStore] = {
        "minio": minio_store.MinioStore(minio.settings(new_bucket())),
        "directory (fsync)": directory.DirectoryStore(tmp_path / "objects"),
    }
    lines = []
    for name, store in stores.items():
        put_s, get_s = measure(store, data)
        middle = store.get_range("big/object", 40 * MIB + 3, 1 * MIB)
        assert middle == data[40 * MIB + 3 : 41 * MIB + 3]
        lines.append(
            f"{name:18} put {64 / put_s:7.0f} MiB/s   get {64 / get_s:7.0f} MiB/s   (64 MiB object)"
        )
        store.close()
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_stopped_server_gives_a_retriable_error_then_works_after_restart(
    private_minio: minio_server.MinioServer,
) -> None:
    store = minio_store.MinioStore(private_minio.settings(new_bucket()))
    store.put("k/1", b"before")
    private_minio.stop()
    for call in (
        lambda: store.get("k/1"),
        lambda: store.put("k/2", b"x"),
        lambda: store.stat("k/1"),
        lambda: list(store.list()),
        lambda: store.delete("k/1"),
    ):
        with pytest.raises(ObjectStoreUnavailable) as info:
            call()
        assert info.value.retriable
        assert info.value.__cause__ is not None  # translated at the edge, cause kept
    private_minio.start()
    assert store.get("k/1") == b"before"
    store.put("k/2", b"after")
    assert [i.key for i in store.list()] == ["k/1", "k/2"]


class GatedStream(io.RawIOBase):
    """Yields ``size`` bytes, but stops after ``gate_at`` of them until released."""

    def __init__(self, size: int, gate_at: int) -> None:
        self.left = size
        self.sent = 0
        self.gate_at = gate_at
        self.reached = threading.Event()
        self.release = threading.Event()

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.sent >= self.gate_at and not self.release.is_set():
            self.reached.set()
            self.release.wait(30)
        n = min(len(b), self.left, 1 << 16)
        b[:n] = b"\xab" * n
        self.left -= n
        self.sent += n
        return n


def test_server_killed_mid_upload_gives_a_retriable_error_and_no_object(
    private_minio: minio_server.MinioServer,
) -> None:
    store = minio_store.MinioStore(
        private_minio.settings(new_bucket(), part_size=5 * MIB, parallel_uploads=1)
    )
    store.put("seg", b"previous")
    stream = GatedStream(size=20 * MIB, gate_at=7 * MIB)  # inside the second part
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            store.put_stream("seg", io.BufferedReader(stream), 20 * MIB)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=upload)
    t.start()
    assert stream.reached.wait(30)
    private_minio.kill()
    stream.release.set()
    t.join(60)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ObjectStoreUnavailable), errors
    private_minio.start()
    assert store.get("seg") == b"previous"  # the half-done upload never became visible
    store.put_stream("seg", io.BytesIO(b"z" * (6 * MIB)), 6 * MIB)
    assert store.stat("seg").size == 6 * MIB


def test_retrying_store_rides_out_a_restart(private_minio: minio_server.MinioServer) -> None:
    store = retrying.RetryingStore(
        minio_store.MinioStore(private_minio.settings(new_bucket())),
        retrying.Retrier(
            retrying.RetrySettings(attempts=100, initial_backoff=0.2, max_backoff=1.0, deadline=20)
        ),
    )
    store.put("k", b"v")
    private_minio.stop()
    restarter = threading.Timer(1.0, private_minio.start)
    restarter.start()
    try:
        assert store.get("k") == b"v"  # fails while down, then succeeds
    finally:
        restarter.join()


def test_wrong_credentials_are_access_denied(minio: minio_server.MinioServer) -> None:
    store = minio_store.MinioStore(minio.settings(new_bucket(), secret_key="not-the-secret"))
    with pytest.raises(ObjectStoreAccessDenied) as info:
        store.put("k", b"v")
    assert not info.value.retriable


def test_a_missing_bucket_is_rejected_unless_created(minio: minio_server.MinioServer) -> None:
    bucket = new_bucket()
    plain = minio_store.MinioStore(minio.settings(bucket, create_bucket=False))
    with pytest.raises(ObjectStoreRejected, match="NoSuchBucket"):
        plain.put("k", b"v")
    # two stores creating the same bucket do not trip over each other
    a = minio_store.MinioStore(minio.settings(bucket))
    b = minio_store.MinioStore(minio.settings(bucket))
    a.ensure_bucket()
    b.ensure_bucket()
    b.put("k", b"v")
    assert plain.get("k") == b"v"


def test_server_helper_stop_and_kill(tmp_path: Path) -> None:

    server = minio_server.MinioServer(minio_binary(), tmp_path / "data")
    with server:
        assert server.running
        port = server.port
        server.kill()
        assert not server.running
        server.start()  # same ports, same data
        assert server.running and server.port == port
    assert not server.running
    assert (tmp_path / "data.log").exists()


def test_a_taken_port_is_replaced_on_first_start_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        # The first "free" port handed out is the busy one: a lost race.
        real = minio_server.free_port
        handed = iter([taken])
        monkeypatch.setattr(
            minio_server, "free_port", lambda host: next(handed, None) or real(host)
        )
        server = minio_server.MinioServer(minio_binary(), tmp_path / "auto")
        assert server.port == taken
        with server:
            assert server.running and server.port != taken
        fixed = minio_server.MinioServer(minio_binary(), tmp_path / "fixed", port=taken)
        with pytest.raises(minio_server.MinioServerError, match="exited"):
            fixed.start()
        assert not fixed.running


def test_a_put_goes_unsigned_with_a_crc_the_server_checks(
    minio: minio_server.MinioServer,
) -> None:
    """``put`` sends one request whose body is not hashed for the signature but carries a
    CRC-32 (``minio_store._Client``); the server refuses a body that does not match it,
    and stores nothing."""
    store = minio_store.MinioStore(minio.settings(new_bucket(), create_bucket=True))
    data = os.urandom(6 * MIB)  # above minio-py's 5 MiB part size: one request all the same
    store.ensure_bucket()  # its own PUT, before the trace
    trace = io.StringIO()
    store.client.trace_on(trace)
    store.put("crc/object", data)
    store.client.trace_off()
    requests = [line for line in trace.getvalue().splitlines() if line.startswith("PUT ")]
    assert len(requests) == 1, requests  # not a multipart upload
    assert "x-amz-content-sha256: unsigned-payload" in trace.getvalue().lower()
    assert store.get("crc/object") == data

    # a body that does not match its CRC (as one damaged on the way would not): refused,
    # nothing stored, and retriable, since sending it again is the cure
    wrong = minio_store.checksum_header(data + b"x")
    with pytest.raises(ObjectStoreUnavailable) as info:
        store._call(
            "crc/bad",
            lambda: store.client._put_object(store.bucket, "crc/bad", data, dict(wrong)),
        )
    assert "crc/bad" in str(info.value) and "damaged" in str(info.value)
    assert info.value.retriable
    assert [o.key for o in store.list("crc/")] == ["crc/object"]

    # a conditional put carries the CRC as well, and its condition still holds
    assert store.put_if_version("crc/cond", data, None)
    assert not store.put_if_version("crc/cond", data, None)
    store.close()
