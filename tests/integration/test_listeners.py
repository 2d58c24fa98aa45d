"""Named listeners on a real local cluster: each broker serves its data protocol on a
second loopback address too, and a client that bootstraps through that listener is told
every broker's address on it, so it never dials the default (internal) listener: not
when it routes, not when it is redirected, not when it follows a new leader."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.local_cluster import listener_host
from headrace.client import Consumer, Producer
from headrace.client.producer import RecordMetadata
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.testing.procs import free_port
from tests.integration.localcluster import LocalCluster, all_in_sync, topic_manifest, until
from tests.integration.raw import RawConnection

PARTITIONS = 6
RECORDS = 3_000


class ListenersCluster(LocalCluster):
    """A local cluster whose brokers have a second listener, ``external``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        #: every broker's external listener port (each on a loopback address of its own)
        self.external_port = free_port()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ListenersCluster]:
    c = ListenersCluster(tmp_path / "local")
    c.up("--listener", f"external={c.external_port}")
    try:
        yield c
    finally:
        c.down()


def external(c: ListenersCluster, broker_id: int) -> tuple[str, int]:
    return (listener_host(1, broker_id), c.external_port)


def internal(c: ListenersCluster, broker_id: int) -> tuple[str, int]:
    b = next(b for b in c.record["brokers"] if b["id"] == broker_id)
    return (b["host"], b["port"])


def addresses(snapshot: msg.TopologySnapshot) -> dict[int, tuple[str, int]]:
    return {b.id: (b.host, b.port) for b in snapshot.brokers}


def topology_through(address: tuple[str, int]) -> msg.TopologySnapshot:
    conn = RawConnection(f"{address[0]}:{address[1]}")
    try:
        return msg.TopologySnapshot.decode(conn.call(Op.TOPOLOGY, b"{}").body)
    finally:
        conn.close()


def test_each_listener_gets_the_topology_and_redirects_of_its_own_addresses(
    cluster: ListenersCluster,
) -> None:
    assert cluster.apply(topic_manifest("routed", PARTITIONS)).returncode == 0
    cluster.wait(lambda: all_in_sync(cluster, "default/routed", PARTITIONS), what="in sync")
    everyone = range(cluster.count)
    # every broker's snapshot names every broker once the controller pushed their endpoints
    cluster.wait(
        lambda: addresses(topology_through(external(cluster, 0))).keys() == set(everyone),
        what="every broker in the pushed topology",
    )
    assert addresses(topology_through(external(cluster, 1))) == {
        i: external(cluster, i) for i in everyone
    }
    assert addresses(topology_through(internal(cluster, 1))) == {
        i: internal(cluster, i) for i in everyone
    }
    # a produce sent to a broker that does not lead the partition is redirected to the
    # leader's address on the listener the request came in through
    leader = cluster.partitions("default/routed")[0]["leader"]
    other = next(i for i in everyone if i != leader)
    for address_of in (external, internal):
        conn = RawConnection("{}:{}".format(*address_of(cluster, other)))
        try:
            batch = rb.encode([b"misrouted"], timestamp_ms=0)
            request = msg.ProduceRequest("default/routed", 0, 1, msg.Acks.LEADER, 5000, batch)
            frame = conn.call(Op.PRODUCE, request.encode())
        finally:
            conn.close()
        assert frame.op == Op.REDIRECT, frame
        owner = msg.Redirect.decode(frame.body).owner
        assert owner is not None
        assert (owner.id, (owner.host, owner.port)) == (leader, address_of(cluster, leader))

    # a broker added later gets the cluster's listeners too (on its own loopback address)
    cluster.cli("local", "add-broker", "--dir", str(cluster.dir), "--no-wait")
    grown = range(cluster.count + 1)
    cluster.wait(
        lambda: (
            addresses(topology_through(external(cluster, 1)))
            == {i: external(cluster, i) for i in grown}
        ),
        what="the added broker's external address in the topology",
    )


async def test_a_client_of_the_second_listener_follows_a_new_leader_on_it(
    cluster: ListenersCluster,
) -> None:
    assert cluster.apply(topic_manifest("outside", PARTITIONS)).returncode == 0
    cluster.wait(lambda: all_in_sync(cluster, "default/outside", PARTITIONS), what="in sync")
    # one address: every other the producer dials, it learnt from the topology
    bootstrap = "{}:{}".format(*external(cluster, 0))
    outside = {external(cluster, i) for i in range(cluster.count)}
    acked: list[tuple[RecordMetadata, bytes]] = []
    failed: list[BaseException] = []
    async with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:

        async def send(i: int) -> None:
            value = f"r{i:06d}".encode()
            try:
                acked.append((await (await producer.send("outside", value, key=value)), value))
            except HeadraceError as exc:
                failed.append(exc)

        sending = [asyncio.create_task(send(i)) for i in range(RECORDS // 2)]
        await until(lambda: len(acked) >= RECORDS // 4, "acks=all records before the kill")
        victim = cluster.partitions("default/outside")[0]["leader"]
        cluster.kill_broker(victim)
        cluster.wait(
            lambda: all(
                p["leader"] not in (victim, None) for p in cluster.partitions("default/outside")
            ),
            what="new leaders elected",
        )
        sending += [asyncio.create_task(send(i)) for i in range(RECORDS // 2, RECORDS)]
        await asyncio.gather(*sending)
        assert set(producer.cluster._pool) <= outside, producer.cluster._pool.keys()
        assert {
            (b.host, b.port) for b in (producer.cluster.routing.brokers or {}).values()
        } <= outside
    assert failed == [], failed[:3]
    assert len(acked) == RECORDS

    seen: set[bytes] = set()
    # the broker bootstrapped through may be the one killed: a consumer lists them all
    everyone = ",".join(f"{host}:{port}" for host, port in sorted(outside))
    async with Consumer(everyone, "outside", "readers", start="earliest") as consumer:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(120):
                while len(seen) < RECORDS:
                    for batch in await consumer.getmany(timeout_s=0.5):
                        seen.update(batch.values())
                        consumer.ack_batch(batch)
        assert set(consumer.cluster._pool) <= outside, consumer.cluster._pool.keys()
    assert seen == {value for _, value in acked}
