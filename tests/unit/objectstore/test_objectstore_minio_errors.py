"""Translation of minio/urllib3 exceptions into the object store's error tree."""

from __future__ import annotations

import pytest
import urllib3
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
