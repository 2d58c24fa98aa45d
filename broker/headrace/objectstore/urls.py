"""``open_store(url)``: an object store from the one URL a broker is configured with.

==========================================  ====================================
URL                                         store
==========================================  ====================================
``file:///abs/path``                        ``DirectoryStore`` rooted there
``file:///abs/path?fsync=0``                ... without fsyncs (throwaway data)
``s3://host:port/bucket``                   ``MinioStore``, plain HTTP
``s3+https://host:port/bucket``             ``MinioStore``, HTTPS
``...?create_bucket=1&region=eu-west-1``    create the bucket on first use; region
==========================================  ====================================

The credentials of an S3 store come from the environment,
``HEADRACE_OBJECT_STORE_ACCESS_KEY`` and ``HEADRACE_OBJECT_STORE_SECRET_KEY``,
never from the URL: a URL ends up on command lines, which every user of the
machine can read in ``ps``. A URL with ``user:password@`` is refused.

Every store comes wrapped in ``retrying.RetryingStore``. Mistakes raise
``InvalidStoreUrl`` (a ``ValueError``) saying what is wrong; its message never
contains a secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from headrace.objectstore import directory, minio_store, retrying
from headrace.objectstore.interface import ObjectStore

ACCESS_KEY_ENV = "HEADRACE_OBJECT_STORE_ACCESS_KEY"
SECRET_KEY_ENV = "HEADRACE_OBJECT_STORE_SECRET_KEY"

#: S3's bucket naming rules (the common subset of AWS and MinIO): 3-63 lowercase
#: letters, digits, dots and hyphens, starting and ending with a letter or digit
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class InvalidStoreUrl(ValueError):
    """An object store URL that cannot be used; the message says why."""


def open_store(
    url: str,
    env: Mapping[str, str] = os.environ,
    *,
    retry: retrying.RetrySettings | None = None,
) -> ObjectStore:
    """The store ``url`` names, wrapped in a ``RetryingStore`` (``retry``: its
    settings, default ``RetrySettings()``). Opens no connection yet."""
    settings = retry or retrying.RetrySettings()
    return retrying.RetryingStore(_open(url, env, settings), retrying.Retrier(settings))


def read_timeout_within(retry: retrying.RetrySettings) -> float:
    """Each S3 request's read timeout under ``retry``: half its deadline, at most the
    client's default. The deadline is only looked at between tries, so a server that
    accepts a request and never answers holds a try for the whole read timeout; with
    half the deadline, a hung server costs two tries and the call ends near the deadline
    instead of one read timeout (60 s) past it."""
    if retry.deadline is None:
        return minio_store.DEFAULT_READ_TIMEOUT
    return min(minio_store.DEFAULT_READ_TIMEOUT, retry.deadline / 2)


def _open(url: str, env: Mapping[str, str], retry: retrying.RetrySettings) -> ObjectStore:
    try:
        parts = urlsplit(url)
        port = parts.port  # parsing it raises ValueError for a bad one
    except ValueError as exc:
        raise InvalidStoreUrl(f"object store URL {_safe(url)!r}: {exc}") from exc
    if parts.fragment:
        raise InvalidStoreUrl(f"object store URL {_safe(url)!r} has a #fragment")
    options = _options(url, parts.query)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return _directory(url, parts.netloc, parts.path, options)
    if scheme in ("s3", "s3+https"):
        if parts.username is not None or parts.password is not None:
            raise InvalidStoreUrl(
                f"object store URL {_safe(url)!r} carries credentials; set {ACCESS_KEY_ENV}"
                f" and {SECRET_KEY_ENV} in the environment instead"
            )
        if not parts.hostname:
            raise InvalidStoreUrl(f"object store URL {_safe(url)!r} names no host")
        bucket = parts.path.removeprefix("/").removesuffix("/")
        if "/" in bucket:
            raise InvalidStoreUrl(
                f"object store URL {_safe(url)!r}: the path must be just the bucket"
            )
        if not bucket:
            raise InvalidStoreUrl(f"object store URL {_safe(url)!r} names no bucket")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise InvalidStoreUrl(
                f"object store URL {_safe(url)!r}: {bucket!r} is not a valid bucket name"
                " (3-63 lowercase letters, digits, '.' and '-')"
            )
        create = _flag(url, options.pop("create_bucket", "0"), "create_bucket")
        region = options.pop("region", None)
        _no_more(url, options)
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        endpoint = host if port is None else f"{host}:{port}"
        access, secret = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
        missing = [
            name for name, v in ((ACCESS_KEY_ENV, access), (SECRET_KEY_ENV, secret)) if not v
        ]
        if missing:
            raise InvalidStoreUrl(
                f"object store URL {_safe(url)!r} needs credentials: {' and '.join(missing)}"
                " not set"
            )
        return minio_store.MinioStore(
            minio_store.MinioSettings(
                endpoint=endpoint,
                bucket=bucket,
                access_key=access,
                secret_key=secret,
                secure=scheme == "s3+https",
                region=region or None,
                create_bucket=create,
                read_timeout=read_timeout_within(retry),
            )
        )
    raise InvalidStoreUrl(
        f"object store URL {_safe(url)!r}: scheme {parts.scheme!r} is not one of file, s3, s3+https"
    )


def _directory(url: str, netloc: str, path: str, options: dict[str, str]) -> ObjectStore:
    if netloc not in ("", "localhost"):
        raise InvalidStoreUrl(
            f"object store URL {url!r}: a file URL names a local path, file:///abs/path"
            f" (got host {netloc!r})"
        )
    if not path.startswith("/"):
        raise InvalidStoreUrl(f"object store URL {url!r}: the path must be absolute")
    fsync = _flag(url, options.pop("fsync", "1"), "fsync")
    _no_more(url, options)
    return directory.DirectoryStore(Path(path), fsync=fsync)


def _options(url: str, query: str) -> dict[str, str]:
    try:
        raw = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise InvalidStoreUrl(f"object store URL {_safe(url)!r}: bad query: {exc}") from exc
    out: dict[str, str] = {}
    for name, values in raw.items():
        if len(values) != 1:
            raise InvalidStoreUrl(f"object store URL {_safe(url)!r}: {name} given more than once")
        out[name] = values[0]
    return out


def _flag(url: str, value: str, name: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidStoreUrl(f"object store URL {_safe(url)!r}: {name}={value!r} is not 0 or 1")


def _no_more(url: str, options: dict[str, str]) -> None:
    if options:
        raise InvalidStoreUrl(
            f"object store URL {_safe(url)!r}: unknown option(s) {', '.join(sorted(options))}"
        )


def _safe(url: str) -> str:
    """``url`` without a password, for messages."""
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)
