"""Translation of minio/urllib3 exceptions into the object store's error tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3
from minio.deleteobjects import DeleteError, DeleteObject
from minio.error import S3Error, ServerError

from headrace.objectstore import errors, minio_store


def s3_error(code: str, status: int) -> S3Error:
    response = urllib3.HTTPResponse(body=b"", status=status)
    return S3Error(response, code, "message", "/b/k", "req", "host")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (s3_error("NoSuchKey", 404), errors.ObjectNotFound),
        (s3_error("AccessDenied", 403), errors.ObjectStoreAccessDenied),
        (s3_error("SignatureDoesNotMatch", 403), errors.ObjectStoreAccessDenied),
        (s3_error("SlowDown", 503), errors.ObjectStoreUnavailable),
        (s3_error("XMinioStorageFull", 507), errors.ObjectStoreUnavailable),
        (s3_error("NoSuchBucket", 404), errors.ObjectStoreRejected),
        (s3_error("EntityTooLarge", 400), errors.ObjectStoreRejected),
        (ServerError("bad gateway", 502), errors.ObjectStoreUnavailable),
        (urllib3.exceptions.NewConnectionError(None, "refused"), errors.ObjectStoreUnavailable),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("reset"), errors.ObjectStoreUnavailable),
        (ConnectionResetError(), errors.ObjectStoreUnavailable),
        (
            OSError("stream having not enough data;expected: 10, got: 3 bytes"),
            errors.ObjectStoreRejected,
        ),
        (ValueError("invalid bucket name x"), errors.ObjectStoreRejected),
        (RuntimeError("?"), errors.ObjectStoreError),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.__name__,
)
def test_translation(exc: BaseException, expected: type[errors.ObjectStoreError]) -> None:
    err = minio_store.translate(exc, "k")
    assert type(err) is expected
    assert err.retriable == expected.retriable


class _StoreThatIgnoresChecksums:
    """The client side of an S3-compatible server without S3's additional checksums:
    it stores whatever arrives and answers without echoing ``x-amz-checksum-crc32``."""

    def __init__(self) -> None:
        self.puts: list[dict[str, object]] = []

    def _put_object(self, bucket: str, key: str, data: bytes, headers: dict[str, object]) -> object:
        self.puts.append(dict(headers))
        return type("Result", (), {"http_headers": {}})()


def test_a_store_that_ignores_the_crc_gets_the_body_again_signed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = _StoreThatIgnoresChecksums()
    settings = minio_store.MinioSettings("127.0.0.1:9", "bucket", "key", "secret")
    store = minio_store.MinioStore(settings, client=fake)  # type: ignore[arg-type]
    store.put("a/b", b"body")
    # first with the CRC (not echoed: nothing checked it), then again without, which the
    # client signs with the body's SHA-256
    assert [minio_store.CHECKSUM_HEADER in p for p in fake.puts] == [True, False]
    assert "does not check x-amz-checksum-crc32" in caplog.text
    store.put("a/c", b"more")  # from then on signed at once
    assert [minio_store.CHECKSUM_HEADER in p for p in fake.puts] == [True, False, False]


class _StoreThatRefusesOneDelete:
    """The client side of a multi-object delete that removes every key but one, which
    it answers with ``code`` (S3 reports failures per key, in a 200 response)."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.asked: list[str] = []

    def remove_objects(self, bucket: str, objects: list[DeleteObject]) -> Iterator[DeleteError]:
        self.asked = [o.name for o in objects]
        yield DeleteError(self.code, "message", self.asked[-1], None)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("AccessDenied", errors.ObjectStoreAccessDenied),
        ("InternalError", errors.ObjectStoreUnavailable),
        # no HTTP status comes per key: an unknown refusal is retriable (deleting is idempotent)
        ("SomethingNew", errors.ObjectStoreUnavailable),
        ("NoSuchKey", None),  # deleting what is not there is not an error
    ],
)
def test_a_key_the_multi_object_delete_refused_is_raised(
    code: str, expected: type[errors.ObjectStoreError] | None
) -> None:
    fake = _StoreThatRefusesOneDelete(code)
    settings = minio_store.MinioSettings("127.0.0.1:9", "bucket", "key", "secret")
    store = minio_store.MinioStore(settings, client=fake)  # type: ignore[arg-type]
    if expected is None:
        store.delete_many(["a/1", "a/2"])
    else:
        with pytest.raises(expected, match="a/2"):
            store.delete_many(["a/1", "a/2"])
    assert fake.asked == ["a/1", "a/2"]
