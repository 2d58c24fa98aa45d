"""``MinioStore``: the object store over the S3 API of MinIO (or S3) (adapter).

The only module in headrace that imports ``minio``; its exceptions (and
urllib3's, underneath) are translated here into the ``interface`` error tree.
The client is built with urllib3 retries off and short timeouts: retrying is
``retrying.RetryingStore``'s job, with backoff the caller controls, and a dead
server should surface as ``ObjectStoreUnavailable`` in about a connect timeout.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from io import BytesIO
from typing import BinaryIO, TypeVar

import minio
import minio.error
import urllib3
from minio.credentials.credentials import Credentials
from minio.deleteobjects import DeleteError, DeleteObject
from minio.helpers import DictType

from headrace.checksums import crc32
from headrace.objectstore import interface, keys
from headrace.objectstore.errors import (
    ObjectNotFound,
    ObjectStoreAccessDenied,
    ObjectStoreError,
    ObjectStoreRejected,
    ObjectStoreUnavailable,
)
from headrace.objectstore.interface import ObjectInfo, ObjectStore

T = TypeVar("T")
log = logging.getLogger(__name__)

#: The header that carries a body's CRC-32 (big-endian, base64), which the server
#: checks before it stores the body (S3 "additional checksums").
CHECKSUM_HEADER = "x-amz-checksum-crc32"

#: the largest body ``put`` sends as one request (S3's limit for a single PUT is 5 GiB)
_SINGLE_PUT_MAX = 1 << 30
_NOT_FOUND = {"NoSuchKey", "NoSuchObject"}
#: a conditional put whose condition does not hold (If-Match on a missing key: NoSuchKey)
_CONDITION_FAILED = {"PreconditionFailed", "ConditionalRequestConflict", *_NOT_FOUND}
#: the body the server received does not match its checksum: damaged on the way, so a
#: retry (which sends it again) is the cure
_DAMAGED = {"XAmzContentChecksumMismatch", "BadDigest"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_BUSY = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "XMinioServerNotInitialized",
}


@dataclass(frozen=True, slots=True)
class MinioSettings:
    """Where the bucket is and how to talk to it."""

    #: ``host:port`` of the S3 endpoint, no scheme.
    endpoint: str
    bucket: str
    access_key: str
    #: kept out of repr: settings end up in logs and tracebacks
    secret_key: str = field(repr=False)
    #: HTTPS instead of HTTP.
    secure: bool = False
    region: str | None = None
    #: Create the bucket on first use if it is missing (local mode and tests;
    #: production buckets are made by whoever grants the credentials).
    create_bucket: bool = False
    #: Multipart part size in bytes for streamed puts: S3's minimum is 5 MiB;
    #: 16 MiB keeps a 1 GiB segment at 64 parts.
    part_size: int = 16 << 20
    #: Parts uploaded at once by one streamed put.
    parallel_uploads: int = 3
    #: Seconds to wait for a TCP connection: a stopped local server refuses at
    #: once, an unreachable remote one should fail well before a retry budget.
    connect_timeout: float = 5.0
    #: Seconds to wait for each read from the socket.
    read_timeout: float = 60.0
    #: Pooled connections per host; the broker uploads from a few threads.
    max_connections: int = 10


class _Client(minio.Minio):
    """``minio.Minio``, but a body sent with a CRC-32 the server checks is not hashed.

    Signature V4 over plain HTTP signs the SHA-256 of every body: a full pass over
    each byte here and another on the server, about a tenth of what a compaction's
    64 MiB PUT costs. A request carrying ``CHECKSUM_HEADER`` goes as
    ``UNSIGNED-PAYLOAD`` instead, as minio-py sends every body over HTTPS: its headers
    (key, length, the CRC) stay signed, and the server refuses a body whose CRC-32
    does not match. What that gives up is protection of the body against deliberate
    tampering on the network (a CRC can be forged; a signed SHA-256 cannot), which
    plain HTTP does not give the GETs either: use TLS where the network is not
    trusted. ``docs/decisions.md`` has the decision.
    """

    def _build_headers(
        self,
        host: str,
        headers: DictType | None = None,
        body: bytes | None = None,
        creds: Credentials | None = None,
    ) -> tuple[DictType, datetime]:
        if body is None or creds is None or headers is None or CHECKSUM_HEADER not in headers:
            return super()._build_headers(host, headers, body, creds)
        built, date = super()._build_headers(host, headers, None, creds)
        built["Content-Length"] = str(len(body))
        built["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
        return built, date


def checksum_header(data: bytes) -> DictType:
    """The ``CHECKSUM_HEADER`` of ``data``."""
    value = base64.b64encode((crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    return {CHECKSUM_HEADER: value}


class MinioStore(ObjectStore):
    def __init__(self, settings: MinioSettings, client: minio.Minio | None = None) -> None:
        self.settings = settings
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=settings.connect_timeout, read=settings.read_timeout),
            retries=False,
            maxsize=settings.max_connections,
        )
        self.client = client or _Client(
            settings.endpoint,
            access_key=settings.access_key,
            secret_key=settings.secret_key,
            secure=settings.secure,
            region=settings.region,
            http_client=self._http,
        )
        self.bucket = settings.bucket
        self._bucket_ready = not settings.create_bucket
        #: the store answered a PUT with a CRC-32 without echoing it (``_single_put``)
        self._checksums_ignored = False
        self._lock = threading.Lock()

    def _call(self, key: str, fn: Callable[[], T], *, setup: bool = True) -> T:
        """Run one client call with the bucket in place and errors translated."""
        try:
            if setup and not self._bucket_ready:
                self.ensure_bucket()
            return fn()
        except ObjectStoreError:
            raise
        except Exception as exc:
            raise translate(exc, key) from exc

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist; safe to race with another creator."""
        with self._lock:
            if self._bucket_ready:
                return
            try:
                if not self.client.bucket_exists(self.bucket):
                    try:
                        self.client.make_bucket(self.bucket, location=self.settings.region)
                    except minio.error.S3Error as exc:
                        if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                            raise
            except Exception as exc:
                raise translate(exc, self.bucket) from exc
            self._bucket_ready = True

    def ping(self) -> None:
        """One cheap authenticated request; raises what a real call would."""
        self._call(self.bucket, lambda: self.client.bucket_exists(self.bucket), setup=False)

    # --- writing ---

    def put(self, key: str, data: bytes) -> None:
        keys.validate_key(key)
        if len(data) > _SINGLE_PUT_MAX:
            self._call(
                key, lambda: self.client.put_object(self.bucket, key, BytesIO(data), len(data))
            )
            return
        # One request with the body's CRC-32 (``_Client``), not put_object's multipart
        # upload of 5 MiB parts: the body is in memory already, and a compaction's 64 MiB
        # object went as 15 requests (create, 13 parts, complete).
        if not self._call(key, lambda: self._single_put(key, data, {})):
            # the store ignored the CRC, so nothing checked the body: send it again, signed
            self._call(key, lambda: self._single_put(key, data, {}))

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        keys.validate_key(key)
        condition = {"If-None-Match": "*"} if version is None else {"If-Match": version}

        def put() -> bool:
            try:
                checked = self._single_put(key, data, condition)
            except minio.error.S3Error as exc:
                if exc.code in _CONDITION_FAILED:
                    return False
                raise
            if not checked:
                # The store ignored the CRC, and the condition is spent: read the object
                # back, and if it is not what was sent, replace it (signed) while it is
                # still the version this put made.
                stored, stored_version = self.get_versioned(key)
                if stored != data:
                    self._single_put(key, data, {"If-Match": stored_version})
            return True

        return self._call(key, put)

    def _single_put(self, key: str, data: bytes, headers: dict[str, str]) -> bool:
        """One PUT request (``put_object`` would turn ``headers`` into user metadata).

        With a CRC-32 unless this store is known to ignore it, in which case the body is
        signed. False when the body went with a CRC the answer does not echo: a store
        that does not implement S3's additional checksums (older MinIO, some
        S3-compatible servers) stored it unchecked; from then on this client signs
        every body instead."""
        sent = {} if self._checksums_ignored else checksum_header(data)
        result = self.client._put_object(
            self.bucket,
            key,
            data,
            headers={"Content-Type": "application/octet-stream", **headers, **sent},
        )
        if not sent:
            return True  # signed: the server checked the body's SHA-256
        if result.http_headers.get(CHECKSUM_HEADER) == sent[CHECKSUM_HEADER]:
            return True
        if not self._checksums_ignored:
            log.warning(
                "%s does not check x-amz-checksum-crc32 (S3 additional checksums): signing"
                " every PUT body from now on",
                self.settings.endpoint,
            )
        self._checksums_ignored = True
        return False

    def put_stream(self, key: str, stream: BinaryIO, size: int | None = None) -> None:
        keys.validate_key(key)
        s = self.settings
        self._call(
            key,
            lambda: self.client.put_object(
                self.bucket,
                key,
                stream,
                -1 if size is None else size,
                part_size=s.part_size,
                num_parallel_uploads=s.parallel_uploads,
            ),
        )

    def delete(self, key: str) -> None:
        keys.validate_key(key)
        self._call(key, lambda: self.client.remove_object(self.bucket, key))

    def delete_many(self, object_keys: Iterable[str]) -> None:
        # S3's multi-object delete, 1,000 keys per request: a compaction removes
        # hundreds of objects, and one request each cost MinIO three times the CPU
        batch = [keys.validate_key(key) for key in object_keys]
        if not batch:
            return

        def remove() -> list[DeleteError]:
            objects = [DeleteObject(key) for key in batch]
            return list(self.client.remove_objects(self.bucket, objects))  # lazy: drain it

        described = batch[0] if len(batch) == 1 else f"{batch[0]} and {len(batch) - 1} more"
        refused = [e for e in self._call(described, remove) if e.code not in _NOT_FOUND]
        for error in refused:
            log.warning("multi-object delete: %s: %s: %s", error.name, error.code, error.message)
        if refused:
            first = refused[0]
            failed = _translate_code(first.code, first.message, first.name or "?", 0)
            if isinstance(failed, ObjectStoreRejected):
                # no HTTP status per key to tell; deleting again is harmless, so retriable
                failed = ObjectStoreUnavailable(str(failed))
            raise failed

    # --- reading ---

    def get(self, key: str) -> bytes:
        keys.validate_key(key)
        return self._call(key, lambda: self._read(key, 0, 0))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        keys.validate_key(key)

        def read() -> tuple[bytes, str]:
            response = self.client.get_object(self.bucket, key)
            try:
                return response.read(), str(response.headers.get("ETag", ""))
            finally:
                response.close()
                response.release_conn()

        return self._call(key, read)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        keys.validate_key(key)
        interface.check_range(start, length)
        if length == 0:  # the client reads 0 as "to the end"
            self.stat(key)
            return b""

        def read() -> bytes:
            try:
                return self._read(key, start, length)
            except minio.error.S3Error as exc:
                if exc.code == "InvalidRange":  # start at or past the end
                    return b""
                raise

        return self._call(key, read)

    def _read(self, key: str, offset: int, length: int) -> bytes:
        response = self.client.get_object(self.bucket, key, offset=offset, length=length)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def stat(self, key: str) -> ObjectInfo:
        keys.validate_key(key)
        obj = self._call(key, lambda: self.client.stat_object(self.bucket, key))
        return ObjectInfo(key, obj.size or 0, _ms(obj.last_modified))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        keys.validate_prefix(prefix)
        it = self._call(
            prefix,
            lambda: iter(
                self.client.list_objects(self.bucket, prefix=prefix or None, recursive=True)
            ),
        )
        while True:
            obj = self._call(prefix, lambda: next(it, None))
            if obj is None:
                return
            if obj.object_name is None or obj.is_dir:
                continue
            yield ObjectInfo(obj.object_name, obj.size or 0, _ms(obj.last_modified))

    def close(self) -> None:
        self._http.clear()


def _ms(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


def translate(exc: BaseException, key: str) -> ObjectStoreError:
    """The headrace error for an exception from the minio client or urllib3."""
    if isinstance(exc, minio.error.S3Error):
        status = exc.response.status if exc.response is not None else 0
        return _translate_code(exc.code, exc.message, key, status)
    if isinstance(exc, minio.error.ServerError):
        return ObjectStoreUnavailable(f"{key!r}: {exc}")
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return ObjectStoreUnavailable(f"{key!r}: {type(exc).__name__}: {exc}")
    if isinstance(exc, OSError) and "not enough data" in str(exc):
        return ObjectStoreRejected(f"{key!r}: the stream ended early: {exc}")  # caller's input
    if isinstance(exc, ValueError):
        return ObjectStoreRejected(f"{key!r}: {exc}")
    return ObjectStoreError(f"{key!r}: {type(exc).__name__}: {exc}")


def _translate_code(
    code: str | None, message: str | None, key: str, status: int
) -> ObjectStoreError:
    """The headrace error for an S3 error code (``status``: the HTTP status, 0 if
    unknown, as for one key's failure in a multi-object delete)."""
    text = f"{key!r}: {code}: {message}"
    if code in _NOT_FOUND:
        return ObjectNotFound(key)
    if code in _DENIED:
        return ObjectStoreAccessDenied(text)
    if code in _DAMAGED:
        return ObjectStoreUnavailable(f"{text} (the body was damaged on the way)")
    if code in _BUSY or status >= 500 or status == 429:
        return ObjectStoreUnavailable(text)
    return ObjectStoreRejected(text)
