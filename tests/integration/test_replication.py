"""Replication between real broker processes, with the test acting as the controller."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.errors import NotEnoughReplicas
from headrace.testing import waiting
from tests.integration.cluster import Cluster, read_log_from_disk

TOPIC = "default/rep"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3, ["--replica-lag-max-ms", "1500", "--replica-fetch-wait-ms", "200"])
    c.start()
    yield c
    c.stop()


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


async def produce(bootstrap: str, partition: int, data: list[bytes], acks: str = "all") -> None:
    async with Producer(bootstrap, acks=acks, linger_ms=1, delivery_timeout_ms=15_000) as producer:
        futures = await producer.send_many(TOPIC, data, partition=partition)
        await producer.flush()
        for f in futures:
            await f


async def test_acks_all_replicates_to_every_replica_and_logs_are_identical(
    cluster: Cluster,
) -> None:
    cluster.set_topic(
        TOPIC, [([0, 1, 2], 0, 1, [0, 1, 2]), ([1, 2, 0], 1, 1, [1, 2, 0])], min_in_sync=2
    )
    cluster.push()
    await produce(cluster.bootstrap, 0, values("p0", 3000))
    await produce(cluster.bootstrap, 1, values("p1", 2000))
    for p, n in ((0, 3000), (1, 2000)):
        cluster.wait(
            lambda p=p, n=n: all(
                cluster.partition_report(b, TOPIC, p)["logEndOffset"] == n for b in range(3)
            ),
            what=f"partition {p} replicated",
        )
    leader0 = cluster.partition_report(0, TOPIC, 0)
    assert leader0["role"] == "leader" and leader0["highWatermark"] == 3000
    assert leader0["liveReplicas"] == [0, 1, 2]
    assert cluster.partition_report(1, TOPIC, 0)["role"] == "follower"
    cluster.stop()
    for p, n in ((0, 3000), (1, 2000)):
        logs = [read_log_from_disk(cluster.brokers[b], TOPIC, p) for b in range(3)]
        assert [o for o, _, _ in logs[0]] == list(range(n))
        assert logs[0] == logs[1] == logs[2]


async def test_diverged_follower_is_truncated_to_the_new_leaders_log(cluster: Cluster) -> None:
    b0, b1, b2 = cluster.brokers
    cluster.set_topic(TOPIC, [([0, 1, 2], 0, 1, [0, 1, 2])], min_in_sync=1)
    cluster.push()
    await produce(cluster.bootstrap, 0, values("shared", 500))
    cluster.wait(
        lambda: all(cluster.partition_report(b, TOPIC, 0)["logEndOffset"] == 500 for b in range(3))
    )
    # Cut the leader off from its followers (SIGSTOP would not do: responses already in
    # flight would still arrive), then let it append records nobody else gets.
    b1.kill9()
    b2.kill9()
    await produce(b0.bootstrap, 0, values("orphan", 200), acks="leader")
    assert cluster.partition_report(0, TOPIC, 0)["logEndOffset"] == 700
    b0.kill9()
    b1.start()
    b2.start()
    # The controller elects broker 1 at epoch 2; it takes new writes.
    cluster.set_topic(TOPIC, [([0, 1, 2], 1, 2, [1, 2])], min_in_sync=1)
    cluster.push()
    await produce(cluster.bootstrap, 0, values("new", 300))
    cluster.wait(lambda: cluster.partition_report(2, TOPIC, 0)["logEndOffset"] == 800)
    # The old leader returns as a follower: its 200 orphans must go.
    b0.start()
    cluster.push()
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["logEndOffset"] == 800,
        what="old leader caught up",
    )
    cluster.stop()
    logs = [read_log_from_disk(b, TOPIC, 0) for b in cluster.brokers]
    assert logs[0] == logs[1] == logs[2]
    assert [v for _, _, v in logs[0]] == values("shared", 500) + values("new", 300)
    assert {e for o, e, _ in logs[0] if o >= 500} == {2}


async def test_lagging_follower_leaves_the_lrs_and_returns_and_min_in_sync_fails_fast(
    cluster: Cluster,
) -> None:
    b0, b1, b2 = cluster.brokers
    cluster.set_topic(TOPIC, [([0, 1, 2], 0, 1, [0, 1, 2])], min_in_sync=2)
    cluster.push()
    await produce(cluster.bootstrap, 0, values("a", 100))
    b2.pause()
    # still acks, once the leader has dropped broker 2 after the lag bound and the
    # controller (this test) has recorded that LRS and pushed it back
    producing = asyncio.create_task(produce(b0.bootstrap, 0, values("b", 100)))
    await waiting.until_async(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1],
        20,
        "broker 2 dropped",
        retry_on=(KeyError, OSError),
        in_thread=True,
        watching=[producing],
    )
    cluster.set_topic(TOPIC, [([0, 1, 2], 0, 1, [0, 1])], min_in_sync=2)
    cluster.push(only=[0, 1])  # broker 2 is paused
    await producing
    b1.pause()
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0],
        what="broker 1 dropped",
    )
    with pytest.raises(NotEnoughReplicas):
        async with Producer(b0.bootstrap, acks="all", delivery_timeout_ms=1000) as producer:
            await (await producer.send(TOPIC, b"refused", partition=0))
    b1.resume()
    b2.resume()
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1, 2],
        what="both back",
    )
    await produce(b0.bootstrap, 0, values("c", 10))
    cluster.wait(
        lambda: all(cluster.partition_report(b, TOPIC, 0)["logEndOffset"] == 210 for b in range(3))
    )
    await asyncio.sleep(0)


async def test_follower_behind_the_leaders_log_start_restarts_there_and_catches_up(
    tmp_path: Path,
) -> None:
    import shutil

    c = Cluster(
        tmp_path / "wiped",
        3,
        [
            "--replica-lag-max-ms",
            "1500",
            "--replica-fetch-wait-ms",
            "200",
            "--retention-check-interval-ms",
            "200",
        ],
    )
    c.start()
    try:
        b0, _, b2 = c.brokers
        small = {"segment_bytes": 16_384, "retention_bytes": 65_536, "retention_ms": -1}
        c.set_topic(TOPIC, [([0, 1, 2], 0, 1, [0, 1, 2])], min_in_sync=1, config=small)
        c.push()
        b2.kill9()  # away while the leader writes and retention deletes its oldest segments
        padded = [v + b"." * 200 for v in values("r", 3000)]  # ~600 KB: several segments
        for i in range(0, 3000, 300):
            await produce(c.bootstrap, 0, padded[i : i + 300], acks="leader")
        described = lambda: b0.get_json(f"/v1/topics/{TOPIC}")["partition_details"][0]  # noqa: E731
        c.wait(lambda: described()["log_start_offset"] > 0, what="retention on the leader")
        shutil.rmtree(b2.data_dir)  # and its disk is wiped
        b2.start()
        c.push()
        start = described()["log_start_offset"]
        c.wait(
            lambda: c.partition_report(2, TOPIC, 0)["logEndOffset"] == 3000,
            what="the wiped follower caught up from the leader's log start",
        )
        c.wait(lambda: 2 in c.partition_report(0, TOPIC, 0)["liveReplicas"], what="back in the LRS")
        c.stop()
        records = read_log_from_disk(b2, TOPIC, 0)
        assert records[0][0] >= start and [o for o, _, _ in records] == list(
            range(records[0][0], 3000)
        )
    finally:
        c.stop()
