"""Real network partitions: controller and brokers in their own network namespaces.

``bench/netns.py`` builds the network (veth pairs on a bridge) and drops
packets with nftables rules inside the namespaces. Every scenario runs an
acks=all producer (RF=3, minInSync=2) from the root namespace, which always
reaches every broker, and ends with the same checks once the network heals
and the replicas converge:

- every acknowledged record is in the log exactly once, at the offset it was
  acknowledged at; offsets are contiguous from 0;
- every replica's segment files (read from disk, not through a broker) hold
  the same records as the leader: a deposed leader's divergent suffix is gone.

The delay scenarios hold a broker's packets with an NFQUEUE forwarder
(``bench/delayline.py``; this kernel has no netem) and first check, from a TCP
connect, that the round trip really grew by the delay.

Skipped, with the reason, where namespaces or nft (or, for the delay, iptables'
NFQUEUE) are not available.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench import netns
from headrace.client import Producer
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op
from headrace.records import batch as rb
from headrace.testing.reading import read_partition
from headrace.testing.waiting import until_async
from tests.integration.localcluster import topic_manifest
from tests.integration.raw import RawConnection, error_of

pytestmark = [
    pytest.mark.skipif(netns.unavailable() is not None, reason=f"netns: {netns.unavailable()}"),
    pytest.mark.timeout(180),
]

TOPIC = "default/split"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[netns.NetnsCluster]:
    with netns.NetnsCluster(
        tmp_path,
        # leadership must stay where the elections put it while the checks read
        controller_options=("--no-preferred-leader-rebalance",),
    ) as c:
        c.apply(topic_manifest("split", 1, replicas=3, min_in_sync=2))
        c.wait(lambda: _online_with(c, {1, 2, 3}), 30, "split/0 online with LRS [1, 2, 3]")
        yield c


def _produce_raw(c: netns.NetnsCluster, broker: int, value: bytes) -> Frame:
    """One acks=all PRODUCE on a plain socket to ``broker``; its answer (OK or ERROR)."""
    conn = RawConnection(f"{c.address(broker)}:{netns.DATA_PORT}")
    try:
        body = msg.ProduceRequest(
            TOPIC, 0, 1, msg.Acks.ALL, 3_000, rb.encode([value], timestamp_ms=0)
        ).encode()
        return conn.call(Op.PRODUCE, body)
    finally:
        conn.sock.close()


def _online_with(c: netns.NetnsCluster, lrs: set[int]) -> bool:
    p = c.partition(TOPIC, 0)
    return p.get("state") == "Online" and set(p.get("liveReplicas") or []) == lrs


@dataclass
class Load:
    """An acks=all producer that keeps sending unique values and notes every acknowledgement."""

    bootstrap: str
    acked: list[tuple[int, bytes]] = field(default_factory=list)
    failed: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        producer = await Producer(
            self.bootstrap,
            acks="all",
            linger_ms=2,
            request_timeout_ms=2_000,
            delivery_timeout_ms=60_000,
        ).start()
        pending: set[asyncio.Task[None]] = set()

        async def note(receipt: Any, value: bytes) -> None:
            try:
                meta = await receipt
            except HeadraceError:
                self.failed += 1
                return
            self.acked.append((meta.offset, value))

        sent = 0
        try:
            while not self._stop.is_set():
                for _ in range(10):
                    value = f"v{sent:08d}".encode()
                    sent += 1
                    task = asyncio.create_task(note(await producer.send(TOPIC, value), value))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                await asyncio.sleep(0.02)
        finally:
            await producer.close()  # waits for every outstanding record's outcome
            await asyncio.gather(*pending)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def wait_for_more(self, count: int, timeout: float = 30.0) -> None:
        target = len(self.acked) + count
        deadline = time.monotonic() + timeout
        while len(self.acked) < target:
            assert self._task is not None and not self._task.done(), "the load stopped"
            assert time.monotonic() < deadline, f"fewer than {count} acks within {timeout}s"
            await asyncio.sleep(0.05)


async def _wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Wait without blocking the loop the load runs on; a broker or controller that does
    not answer yet (or answers without the partition) counts as not yet."""
    await until_async(
        predicate, timeout, what, retry_on=(OSError, ValueError, KeyError), in_thread=True
    )


def _converged(c: netns.NetnsCluster) -> bool:
    """LRS full again and every replica at the same log end, which the leader has committed."""
    if not _online_with(c, set(c.broker_ids)):
        return False
    leader = c.partition(TOPIC, 0)["leader"]
    reports = {b: c.report(b, TOPIC, 0) for b in c.broker_ids}
    if any(r is None for r in reports.values()):
        return False
    ends = {r["logEndOffset"] for r in reports.values() if r is not None}
    lead = reports[leader]
    return len(ends) == 1 and lead is not None and lead["highWatermark"] == lead["logEndOffset"]


async def _check(c: netns.NetnsCluster, load: Load) -> dict[int, bytes]:
    """The end-of-scenario checks (module docstring); returns the final log."""
    await _wait(lambda: _converged(c), 60, "replicas converged with a full LRS")
    records = await read_partition(c.bootstrap, TOPIC, 0)
    offsets = [r.offset for r in records]
    assert offsets == list(range(len(offsets))), "offsets not contiguous from 0"
    final = {r.offset: r.value for r in records}
    values = list(final.values())
    assert len(values) == len(set(values)), "a record is stored twice"
    lost = [(o, v) for o, v in load.acked if final.get(o) != v]
    assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {lost[:3]}"
    for b in c.broker_ids:
        copy = netns.read_replica(c.data_dir(b), TOPIC, 0)
        assert copy == final, f"broker {b}'s segment files differ from the leader's log"
    return final


async def test_a_leader_cut_off_from_controller_and_followers_acks_nothing_and_is_truncated(
    cluster: netns.NetnsCluster,
) -> None:
    c = cluster
    load = Load(c.bootstrap)
    load.start()
    await load.wait_for_more(200)
    before = c.partition(TOPIC, 0)
    old = before["leader"]
    committed_at_cut = c.report(old, TOPIC, 0)["highWatermark"]  # type: ignore[index]

    c.isolate(old)  # the controller and both followers; our clients still reach it

    # An acks=all produce sent straight to the cut-off leader (no client retries, no
    # rerouting) is refused or times out: it is never acknowledged.
    answer = await asyncio.to_thread(_produce_raw, c, old, b"sent-to-the-cut-off-leader")
    assert answer.op == Op.ERROR, "the cut-off leader acknowledged an acks=all write"
    refusal = error_of(answer)

    await _wait(
        lambda: (
            (p := c.partition(TOPIC, 0))["leader"] not in (None, old)
            and p["leaderEpoch"] > before["leaderEpoch"]
            and p["state"] == "Online"
        ),
        30,
        "a new leader elected",
    )
    await load.wait_for_more(200)  # the new leader acknowledges
    isolated_copy = netns.read_replica(c.data_dir(old), TOPIC, 0)
    assert max(isolated_copy, default=-1) >= committed_at_cut, (
        "the cut-off leader appended nothing past its high watermark: no divergence to test"
    )

    c.heal()
    await load.wait_for_more(100)
    await load.stop()
    final = await _check(c, load)
    divergent = [o for o, v in isolated_copy.items() if final.get(o) != v]
    assert divergent, "the old leader's uncommitted suffix matches the new log by chance?"
    assert b"sent-to-the-cut-off-leader" not in final.values()
    print(
        f"old leader {old}: refused an acks=all write ({refusal.message});"
        f" {len(divergent)} divergent records truncated; {len(load.acked)} acked, none lost"
    )


async def test_an_asymmetric_partition_leader_to_controller_dropped(
    cluster: netns.NetnsCluster,
) -> None:
    """The leader hears everyone, but nothing it sends reaches the controller (so the
    controller's polls never complete): the controller deposes it; its followers follow
    the new leader, and it can no longer acknowledge."""
    c = cluster
    load = Load(c.bootstrap)
    load.start()
    await load.wait_for_more(200)
    before = c.partition(TOPIC, 0)
    old = before["leader"]

    c.cut(old, netns.CONTROLLER, one_way=True)
    await _wait(
        lambda: (
            (p := c.partition(TOPIC, 0))["leader"] not in (None, old)
            and p["leaderEpoch"] > before["leaderEpoch"]
        ),
        30,
        "a new leader elected",
    )
    await load.wait_for_more(200)
    c.heal()
    await load.wait_for_more(100)
    await load.stop()
    await _check(c, load)


async def test_a_flapping_link_loses_nothing_and_the_cluster_converges(
    cluster: netns.NetnsCluster,
) -> None:
    """For ~15 s a broker (the leader first, then one at random) is cut off or loses 30% of
    its packets, for 0.3-2 s at a time, with heals in between, under load."""
    c = cluster
    rng = random.Random(14)
    load = Load(c.bootstrap)
    load.start()
    await load.wait_for_more(100)
    deadline = time.monotonic() + 15
    target: int = c.partition(TOPIC, 0)["leader"]
    flaps = 0
    while time.monotonic() < deadline:
        if rng.random() < 0.5:
            c.isolate(target)
        else:
            c.lossy(target, 30)
        await asyncio.sleep(rng.uniform(0.3, 2.0))  # the fault's duration: not a sync point
        c.heal()
        flaps += 1
        await asyncio.sleep(rng.uniform(0.3, 2.0))
        target = rng.choice(c.broker_ids)
    await load.wait_for_more(100, timeout=60)
    await load.stop()
    final = await _check(c, load)
    print(f"{flaps} flaps; {len(load.acked)} acked, {len(final)} in the log, none lost")


requires_delay = pytest.mark.skipif(
    netns.delay_unavailable() is not None, reason=f"delay: {netns.delay_unavailable()}"
)


async def _round_trip_s(c: netns.NetnsCluster, broker: int) -> float:
    """The fastest of three TCP connects to ``broker`` (a lost SYN costs a 1 s retry)."""
    return min([await asyncio.to_thread(c.connect_s, broker) for _ in range(3)])


async def _delay_and_loss_on(c: netns.NetnsCluster, role: str) -> None:
    """200 ms delay and 5% loss on the partition's leader or on a follower, under load,
    until 400 more records are acknowledged; then heal. The acks/s before and during are
    printed for the record, never asserted (the figures: ``python -m bench.netdelay``)."""
    load = Load(c.bootstrap)
    load.start()
    await load.wait_for_more(100)
    before_from, count = time.monotonic(), len(load.acked)
    await load.wait_for_more(200)
    before = (len(load.acked) - count) / (time.monotonic() - before_from)
    leader = c.partition(TOPIC, 0)["leader"]
    victim = leader if role == "leader" else next(b for b in c.broker_ids if b != leader)
    healthy_rtt = await _round_trip_s(c, victim)

    c.delay(victim, 200)
    delayed_rtt = await _round_trip_s(c, victim)
    # precondition, on the network and not on the broker: every packet is held >= 200 ms
    assert delayed_rtt >= 0.2, f"connect took {delayed_rtt * 1000:.1f} ms: no delay on the wire"
    c.lossy(victim, 5)
    during_from, count = time.monotonic(), len(load.acked)
    await load.wait_for_more(400, timeout=90)
    during = (len(load.acked) - count) / (time.monotonic() - during_from)
    c.heal()
    await load.wait_for_more(100)
    await load.stop()
    final = await _check(c, load)
    print(
        f"{role} {victim}: connect {healthy_rtt * 1000:.2f} ms healthy,"
        f" {delayed_rtt * 1000:.1f} ms delayed; acks/s before {before:.0f},"
        f" with 200 ms + 5% loss {during:.0f}; {len(load.acked)} acked,"
        f" {len(final)} in the log, none lost"
    )


@requires_delay
async def test_200ms_delay_and_5pct_loss_on_the_leader_lose_nothing(
    cluster: netns.NetnsCluster,
) -> None:
    await _delay_and_loss_on(cluster, "leader")


@requires_delay
async def test_200ms_delay_and_5pct_loss_on_a_follower_lose_nothing(
    cluster: netns.NetnsCluster,
) -> None:
    await _delay_and_loss_on(cluster, "follower")
