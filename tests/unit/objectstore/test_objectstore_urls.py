"""open_store: which store a URL names, and the mistakes it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.objectstore import directory, minio_store, retrying, urls
from headrace.objectstore.interface import ObjectStore

CREDS = {urls.ACCESS_KEY_ENV: "access", urls.SECRET_KEY_ENV: "s3cr3t-value"}


def inner(store: ObjectStore) -> ObjectStore:
    assert isinstance(store, retrying.RetryingStore)  # always wrapped
    return store.inner


def test_a_file_url_is_a_directory_store(tmp_path: Path) -> None:
    store = inner(urls.open_store(f"file://{tmp_path}/objects", env={}))
    assert isinstance(store, directory.DirectoryStore)
    assert store.root == tmp_path / "objects"
    assert store.fsync is True
    store.put("a/b", b"x")
    assert (tmp_path / "objects" / "a" / "b").read_bytes() == b"x"
    unsynced = inner(urls.open_store(f"file://localhost{tmp_path}?fsync=0", env={}))
    assert isinstance(unsynced, directory.DirectoryStore) and unsynced.fsync is False


def test_an_s3_url_is_a_minio_store_with_credentials_from_the_environment() -> None:
    store = inner(urls.open_store("s3://minio.internal:9000/headrace-data", env=CREDS))
    assert isinstance(store, minio_store.MinioStore)
    s = store.settings
    assert (s.endpoint, s.bucket, s.secure, s.create_bucket) == (
        "minio.internal:9000",
        "headrace-data",
        False,
        False,
    )
    assert (s.access_key, s.secret_key) == ("access", "s3cr3t-value")
    store.close()


def test_s3_https_options_and_defaults() -> None:
    store = inner(
        urls.open_store(
            "s3+https://s3.example.com/my.bucket?create_bucket=1&region=eu-west-1", env=CREDS
        )
    )
    assert isinstance(store, minio_store.MinioStore)
    s = store.settings
    assert (s.endpoint, s.bucket, s.secure, s.create_bucket, s.region) == (
        "s3.example.com",
        "my.bucket",
        True,
        True,
        "eu-west-1",
    )
    ipv6 = inner(urls.open_store("s3://[::1]:9000/b12/", env=CREDS))
    assert isinstance(ipv6, minio_store.MinioStore)
    assert ipv6.settings.endpoint == "[::1]:9000"


def test_retry_settings_are_passed_through(tmp_path: Path) -> None:
    settings = retrying.RetrySettings(attempts=2, deadline=1.0)
    store = urls.open_store(f"file://{tmp_path}", env={}, retry=settings)
    assert isinstance(store, retrying.RetryingStore)
    assert store.retrier.settings is settings


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "scheme ''"),
        ("http://host/bucket", "scheme 'http'"),
        ("file://otherhost/data", "local path"),
        ("file:relative/path", "absolute"),
        ("file:///data?fsync=maybe", "fsync='maybe' is not 0 or 1"),
        ("file:///data?compress=1", "unknown option"),
        ("s3://host:9000", "names no bucket"),
        ("s3://host:9000/", "names no bucket"),
        ("s3:///bucket", "names no host"),
        ("s3://host:9000/bucket/sub/dir", "just the bucket"),
        ("s3://host:9000/Bucket_Name", "not a valid bucket name"),
        ("s3://host:9000/ab", "not a valid bucket name"),
        ("s3://host:99999/bucket", "out of range"),
        ("s3://host:9000/bucket?create_bucket=1&create_bucket=0", "more than once"),
        ("s3://host:9000/bucket?verify=0", "unknown option"),
        ("s3://host:9000/bucket#x", "fragment"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(urls.InvalidStoreUrl, match=why.replace("(", r"\(")) as info:
        urls.open_store(url, env=CREDS)
    assert isinstance(info.value, ValueError)


def test_credentials_in_the_url_are_refused_and_never_echoed() -> None:
    with pytest.raises(urls.InvalidStoreUrl) as info:
        urls.open_store("s3://admin:hunter2@host:9000/bucket", env=CREDS)
    assert "hunter2" not in str(info.value)
    assert urls.ACCESS_KEY_ENV in str(info.value)


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({}, f"{urls.ACCESS_KEY_ENV} and {urls.SECRET_KEY_ENV} not set"),
        ({urls.ACCESS_KEY_ENV: "a"}, f"{urls.SECRET_KEY_ENV} not set"),
        ({urls.ACCESS_KEY_ENV: "a", urls.SECRET_KEY_ENV: ""}, f"{urls.SECRET_KEY_ENV} not set"),
    ],
)
def test_missing_credentials_are_named(env: dict[str, str], missing: str) -> None:
    with pytest.raises(urls.InvalidStoreUrl, match=missing):
        urls.open_store("s3://host:9000/bucket", env=env)


def test_minio_settings_repr_hides_the_secret_key() -> None:
    from headrace.objectstore.minio_store import MinioSettings

    settings = MinioSettings("127.0.0.1:9000", "bucket", "access", "very-secret-value")
    assert "very-secret-value" not in repr(settings)
    assert "access" in repr(settings)


def test_a_hung_request_cannot_outlast_the_retry_deadline() -> None:
    # The deadline is only looked at between tries: a server that accepts a request and
    # never answers holds a try for the whole read timeout. Two such tries must fit in the
    # deadline, or one hung request holds an upload past it.
    for deadline in (30.0, 4.0):
        retry = retrying.RetrySettings(deadline=deadline)
        store = inner(urls.open_store("s3://minio:9000/bucket", env=CREDS, retry=retry))
        assert isinstance(store, minio_store.MinioStore)
        assert store.settings.read_timeout * 2 <= deadline
    default = inner(urls.open_store("s3://minio:9000/bucket", env=CREDS))
    assert isinstance(default, minio_store.MinioStore)
    assert default.settings.read_timeout * 2 <= retrying.RetrySettings().deadline  # type: ignore[operator]
    unbounded = retrying.RetrySettings(deadline=None)
    store = inner(urls.open_store("s3://minio:9000/bucket", env=CREDS, retry=unbounded))
    assert isinstance(store, minio_store.MinioStore)
    assert store.settings.read_timeout == minio_store.DEFAULT_READ_TIMEOUT
