"""Retention in the tier when the bucket's policy refuses deletes: a real broker process
tiering to a real MinIO as an ordinary user whose policy denies ``s3:DeleteObject``.

Retention still trims the manifest (a PUT), keeps the objects it removed, lists nothing
that is gone, counts each refused delete in ``headrace_tier_delete_errors_total``, and
deletes the leftovers once the policy allows it again.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.minio_policy import TierUser
from bench.chaos.tiercheck import check_partition
from headrace.client import Producer
from headrace.objectstore.minio_store import MinioStore
from headrace.testing import waiting
from headrace.testing.minio import MinioServer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic
from headrace.tiered import layout
from tests.integration.objectstore import servers

BUCKET = "tiering"
TOPIC = "default/tiered"


@pytest.fixture
def minio(tmp_path: Path) -> Iterator[MinioServer]:
    server = MinioServer(servers.minio_binary(), tmp_path / "minio")
    server.start()
    MinioStore(server.settings(BUCKET)).ensure_bucket()
    yield server
    server.stop()


@pytest.fixture
def user(minio: MinioServer) -> TierUser:
    return TierUser(minio.endpoint, minio.access_key, minio.secret_key, BUCKET).create()


@pytest.fixture
def broker(tmp_path: Path, minio: MinioServer, user: TierUser) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--object-store",
            f"s3://{minio.endpoint}/{BUCKET}",
            "--cluster-id",
            "t",
            "--segment-bytes",
            str(32 * 1024),
            "--retention-check-interval-ms",
            "200",
            "--tier-delete-grace-ms",
            "300",
        ],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": user.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": user.secret_key,
        },
    )
    b.start()
    yield b
    b.stop()


def metric(b: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{b.admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def stored_segments(store: MinioStore, prefix: str) -> set[str]:
    return {info.key for info in store.list(prefix) if info.key.endswith(layout.SEGMENT_SUFFIX)}


async def test_refused_deletes_keep_retentions_leftovers_and_are_retried_once_allowed(
    broker: BrokerProcess, minio: MinioServer, user: TierUser
) -> None:
    user.refuse_deletes(True)
    await create_topic(
        broker.bootstrap,
        TOPIC,
        1,
        {
            "retention_bytes": 96 * 1024,
            "local_retention_bytes": 32 * 1024,
            "upload_interval_ms": 200,
        },
    )
    creation_id = str(broker.get_json(f"/v1/topics/{TOPIC}")["creation_id"])
    prefix = layout.partition_prefix("t", TOPIC, 0, creation_id)
    direct = MinioStore(minio.settings(BUCKET))
    produced = 0
    async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
        for _ in range(40):  # ~400 KiB in small batches: many segments, retention trims
            await producer.send_many(
                TOPIC, [f"r{n:07d}".encode() * 10 for n in range(produced, produced + 100)]
            )
            await producer.flush()
            produced += 100

    def trimmed_and_refused() -> bool:
        found = check_partition(direct, prefix)
        return (
            found.manifest is not None
            and found.manifest.retained_from > 0
            and metric(broker, "headrace_tier_delete_errors_total") > 0
        )

    waiting.until(trimmed_and_refused, 30, "a trim whose deletes were refused", poll_s=0.1)
    found = check_partition(direct, prefix)
    assert found.ok, found.to_doc()
    assert found.manifest is not None
    listed = {s.key for s in found.manifest.segments}
    leftovers = stored_segments(direct, prefix) - listed
    assert leftovers, "retention removed objects from the manifest, so some are unlisted"
    assert metric(broker, "headrace_tier_retention_deleted_objects_total") == 0

    user.refuse_deletes(False)
    waiting.until(
        lambda: not leftovers & stored_segments(direct, prefix),
        30,
        "retention's leftovers deleted once the policy allows it",
        poll_s=0.1,
    )
    assert metric(broker, "headrace_tier_retention_deleted_objects_total") >= len(leftovers)
    final = check_partition(direct, prefix)
    assert final.ok, final.to_doc()
    direct.close()
