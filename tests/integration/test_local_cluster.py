"""A real local cluster: controller + 3 brokers; failover, controller restart, cohorts, manifests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import Consumer, Producer
from headrace.client.producer import RecordMetadata
from headrace.errors import HeadraceError
from headrace.testing.reading import offsets_and_values, read_all
from tests.integration.localcluster import LocalCluster, topic_manifest, until

PARTITIONS = 8


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def online(c: LocalCluster, topic: str, partitions: int) -> bool:
    parts = c.partitions(topic)
    return len(parts) == partitions and all(p["state"] == "Online" for p in parts)


def test_invalid_manifests_get_field_errors_and_nothing_is_applied(cluster: LocalCluster) -> None:
    bad = (
        topic_manifest("good-one", 4)
        + "---\n"
        + """apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata:
  name: bad-one
spec:
  clusterRef: {name: local}
  partitions: 0
  replicas: 3
  minInSync: 5
  colour: blue
"""
    )
    result = cluster.apply(bad)
    assert result.returncode != 0
    err = result.stderr.decode()
    assert "spec.partitions" in err and "colour" in err and "minInSync" in err, err
    # The controller takes applied manifests in order: once a valid one applied after the
    # refused set is online, anything of the refused set that got through would be too.
    assert cluster.apply(topic_manifest("applied-after", 1)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/applied-after", 1), what="later topic online")
    assert cluster.partitions("default/good-one") == [], (
        "nothing may be applied from an invalid set"
    )


async def test_kill9_of_a_leader_under_acks_all_load_loses_nothing(cluster: LocalCluster) -> None:
    assert cluster.apply(topic_manifest("failover", PARTITIONS)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/failover", PARTITIONS), what="topic online")
    acked: list[tuple[RecordMetadata, bytes]] = []
    acked_at: list[float] = []
    stop = asyncio.Event()
    consumed: dict[str, list[tuple[int, int, bytes]]] = defaultdict(list)

    async def load() -> None:
        async with Producer(
            cluster.bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000
        ) as producer:
            i = 0
            pending: set[asyncio.Task[None]] = set()

            async def settle(receipt: object, value: bytes) -> None:
                with contextlib.suppress(HeadraceError):
                    acked.append((await receipt, value))  # type: ignore[misc]
                    acked_at.append(time.monotonic())

            while not stop.is_set():
                for _ in range(100):
                    value = f"v{i:08d}".encode()
                    i += 1
                    task = asyncio.create_task(
                        settle(await producer.send("failover", value, key=value), value)
                    )
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                await asyncio.sleep(0.005)
            await asyncio.gather(*pending)

    seen: set[bytes] = set()
    loaded = asyncio.Event()

    def drained() -> bool:
        return loaded.is_set() and all(v in seen for _, v in acked)

    async def consume(member: str) -> None:
        async with Consumer(
            cluster.bootstrap, "failover", "readers", member_id=member, start="earliest"
        ) as c:
            while not drained() and time.monotonic() < drain_deadline:
                for batch in await c.getmany(timeout_s=0.3):
                    values = batch.values()
                    consumed[member].extend(
                        zip(
                            [batch.partition] * batch.record_count,
                            batch.offsets(),
                            values,
                            strict=True,
                        )
                    )
                    seen.update(values)
                    c.ack_batch(batch)

    drain_deadline = time.monotonic() + 120
    loading = asyncio.create_task(load())
    members = [asyncio.create_task(consume(m)) for m in ("m1", "m2")]
    await until(lambda: len(acked) >= 2_000, "acks=all load under way")
    victim = cluster.partitions("default/failover")[0]["leader"]
    victim_partitions = {
        p["partition"] for p in cluster.partitions("default/failover") if p["leader"] == victim
    }
    before = len(acked)
    killed_at = time.monotonic()
    cluster.kill_broker(victim)
    cluster.wait(
        lambda: all(
            p["leader"] not in (victim, None) for p in cluster.partitions("default/failover")
        ),
        what="new leaders elected",
    )
    elected_after = time.monotonic() - killed_at
    acked_before_election = len(acked)
    await until(
        lambda: len(acked) >= acked_before_election + 2_000, "acks=all load after the election"
    )
    stop.set()
    await loading
    loaded.set()
    drain_deadline = time.monotonic() + 30
    await asyncio.gather(*members)
    first_after = min(
        (
            t
            for (meta, _), t in zip(acked, acked_at, strict=True)
            if meta.partition in victim_partitions and t > killed_at
        ),
        default=float("nan"),
    )
    print(
        f"\nkill -9 of broker {victim}: new leaders after {elected_after:.2f}s; first acks=all produce on"
        f" its partitions {first_after - killed_at:.2f}s after the kill;"
        f" acked {before} before, {len(acked)} total"
    )

    assert len(acked) > before, "no acks=all produce succeeded after the failover"
    stored: dict[tuple[int, int], bytes] = {}
    for p in range(PARTITIONS):
        records = offsets_and_values(await read_all(cluster.bootstrap, "default/failover", p))
        assert [o for o, _ in records] == list(range(len(records))), (
            f"partition {p} offsets not contiguous"
        )
        stored.update({(p, o): v for o, v in records})
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record is stored twice"
    for meta, value in acked:
        assert stored.get((meta.partition, meta.offset)) == value, f"acked record {meta} lost"
    got = {v for log in consumed.values() for _, _, v in log}
    missing = {v for _, v in acked} - got
    where: dict[int, int] = defaultdict(int)
    for meta, value in acked:
        if value in missing:
            where[meta.partition] += 1
    assert not missing, (
        f"{len(missing)} acknowledged records never reached the cohort: by partition {dict(where)}"
    )


async def test_controller_restart_mid_load_bumps_nothing_and_moves_no_leader(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("steady", 4)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/steady", 4), what="topic online")
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("steady", [b"before"] * 1000)
        await producer.flush()
        # the state is compared before and after: wait until every replica is back in the
        # live replica sets the heartbeats report, so that nothing is still on its way in
        cluster.wait(
            lambda: all(
                sorted(p["liveReplicas"]) == sorted(p["replicas"])
                for p in cluster.partitions("default/steady")
            ),
            what="every replica live",
        )
        before = cluster.state()["cluster"]
        cluster.kill_controller()
        cluster.restart_controller()
        cluster.wait(lambda: cluster.state()["steps"] >= 8, what="restarted controller polling")
        futures = await producer.send_many("steady", [b"during"] * 1000)
        await producer.flush()
        for f in futures:
            await f
        after = cluster.state()
    assert after["generationBumps"] == 0, "a restarted controller must not bump the generation"
    assert after["cluster"]["generation"] == before["generation"]

    def leaders(doc: dict[str, Any]) -> list[tuple[int, int]]:
        return [(p["leader"], p["leaderEpoch"]) for t in doc["topics"] for p in t["partitions"]]

    assert leaders(after["cluster"]) == leaders(before)
    # The persisted Topic document has the custom resource's shape, Ready condition included.
    doc = json.loads((cluster.dir / "controller" / "topics" / "default.steady.json").read_text())
    assert doc["kind"] == "Topic" and doc["spec"]["partitions"] == 4
    ready = doc["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Online")
    assert [p["leaderEpoch"] for p in doc["status"]["partitions"]] == [1, 1, 1, 1]


async def test_cohort_across_brokers_never_double_delivers(cluster: LocalCluster) -> None:
    assert cluster.apply(topic_manifest("shared", 6)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/shared", 6), what="topic online")
    deliveries: list[tuple[str, int, int]] = []
    produced = 0
    finished = asyncio.Event()

    def served(name: str) -> bool:
        return any(m == name for m, _, _ in deliveries)

    async def member(name: str, *, leaves: bool = False) -> None:
        async with Consumer(
            cluster.bootstrap, "shared", "team", member_id=name, start="earliest"
        ) as c:
            # a leaving member goes once it has taken part, while records still flow
            while not finished.is_set() and not (leaves and served(name)):
                for batch in await c.getmany(timeout_s=0.2):
                    deliveries.extend((name, batch.partition, o) for o in batch.offsets())
                    c.ack_batch(batch)

    stop_producing = asyncio.Event()

    async def produce() -> None:
        nonlocal produced
        async with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
            while not stop_producing.is_set() or produced < 30_000:
                batch = [f"r{j}".encode() for j in range(produced, produced + 1000)]
                await producer.send_many("shared", batch)
                produced += len(batch)
                await asyncio.sleep(0.1)
            await producer.flush()

    # Records flow the whole time; b joins once a is consuming, takes part and leaves; then
    # c joins: every change of the cohort happens while records flow.
    tasks = [asyncio.create_task(produce()), asyncio.create_task(member("a"))]
    await until(lambda: served("a"), "a consuming")
    tasks.append(asyncio.create_task(member("b", leaves=True)))
    await until(lambda: served("b") and tasks[-1].done(), "b given partitions and gone")
    tasks.append(asyncio.create_task(member("c")))
    await until(lambda: served("c"), "c given partitions")
    stop_producing.set()
    await tasks[0]
    await until(lambda: len(deliveries) >= produced, "every record delivered")
    finished.set()
    await asyncio.gather(*tasks)
    total = produced
    by_partition: dict[int, list[int]] = defaultdict(list)
    for _, p, o in deliveries:
        by_partition[p].append(o)
    duplicates = {p: len(v) - len(set(v)) for p, v in by_partition.items() if len(v) != len(set(v))}
    assert not duplicates, f"records delivered twice without a crash: {duplicates}"
    assert sum(len(v) for v in by_partition.values()) == total
    assert len({m for m, _, _ in deliveries}) >= 2, "the cohort's work was not shared"


async def test_partition_without_eligible_replica_goes_offline_and_recovers(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("fragile", 3, replicas=2, min_in_sync=1)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/fragile", 3), what="topic online")
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("fragile", [b"kept"] * 300, partition=0)
        await producer.flush()
    replicas = cluster.partitions("default/fragile")[0]["replicas"]
    cluster.wait(  # the LRS report of both replicas reaches the controller
        lambda: (
            sorted(cluster.partitions("default/fragile")[0]["liveReplicas"]) == sorted(replicas)
        ),
        what="both replicas in the controller's LRS",
        timeout=30,
    )
    for broker in replicas:
        cluster.kill_broker(broker)
    cluster.wait(
        lambda: cluster.partitions("default/fragile")[0]["state"] == "Offline",
        what="partition 0 reported Offline",
        timeout=30,
    )
    assert cluster.partitions("default/fragile")[0]["leader"] is None
    cluster.restart_broker(replicas[1])
    cluster.wait(
        lambda: cluster.partitions("default/fragile")[0]["state"] == "Online",
        what="partition 0 back Online",
        timeout=30,
    )
    p0 = cluster.partitions("default/fragile")[0]
    assert p0["leader"] == replicas[1]
    records = offsets_and_values(await read_all(cluster.bootstrap, "default/fragile", 0))
    assert [v for _, v in records] == [b"kept"] * 300, (
        "the returning replica serves what was committed"
    )


async def test_election_picks_the_least_lagging_live_replica(cluster: LocalCluster) -> None:
    import signal

    assert cluster.apply(topic_manifest("lag", 1, replicas=3, min_in_sync=1)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/lag", 1), what="topic online")
    p0 = cluster.partitions("default/lag")[0]
    leader = p0["leader"]
    behind, ahead = [r for r in p0["replicas"] if r != leader]
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("lag", [b"both"] * 200, partition=0)
        await producer.flush()
    cluster.wait(  # every replica caught up and reported in the LRS before `behind` pauses
        lambda: len(cluster.partitions("default/lag")[0]["liveReplicas"]) == 3,
        what="all three replicas in the controller's LRS",
        timeout=30,
    )
    # `behind` stops fetching (paused, still within the liveness TTL and the LRS lag bound)
    cluster.signal_broker(behind, signal.SIGSTOP)
    try:
        async with Producer(cluster.bootstrap, acks="leader") as producer:
            await producer.send_many("lag", [b"ahead-only"] * 500, partition=0)
            await producer.flush()
        cluster.wait(  # `ahead` replicates all 700 and the controller has heard so
            lambda: cluster.log_ends("default/lag", 0).get(ahead, 0) >= 700,
            what=f"the controller hearing broker {ahead}'s log end reach 700",
            timeout=20,
        )
        assert cluster.log_ends("default/lag", 0).get(behind, 0) < 700, "the paused one lags"
        cluster.kill_broker(leader)
        cluster.wait(
            lambda: cluster.partitions("default/lag")[0]["leader"] not in (leader, None),
            what="a new leader",
            timeout=20,
        )
        assert cluster.partitions("default/lag")[0]["leader"] == ahead, (
            "the least-lagging replica must win"
        )
    finally:
        cluster.signal_broker(behind, signal.SIGCONT)
    records = offsets_and_values(await read_all(cluster.bootstrap, "default/lag", 0))
    assert len(records) == 700, (
        "nothing acknowledged by the old leader and replicated to `ahead` is lost"
    )


def test_topics_describe_names_each_partitions_leader_whichever_broker_answers(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("described", 3)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/described", 3), what="topic online")
    leaders = {p["partition"]: p["leader"] for p in cluster.partitions("default/described")}
    assert len(set(leaders.values())) > 1, leaders  # so every broker follows some partition
    for b in cluster.record["brokers"]:
        out = cluster.cli(
            "topics", "describe", "described", "--json", "--bootstrap", f"{b['host']}:{b['port']}"
        )
        shown = {p["partition"]: p["leader"] for p in json.loads(out.stdout)["partition_details"]}
        assert shown == leaders, f"broker {b['id']} answered {shown}, the leaders are {leaders}"


def test_a_paused_broker_holds_up_neither_the_others_topology_nor_failover(
    cluster: LocalCluster,
) -> None:
    """A broker that accepts connections and never answers (SIGSTOP: its kernel still
    completes the TCP handshake) must not stall the controller. Its topology push used to
    hold every later broker's push and the whole control loop for the push timeout, 30 s:
    a new topic reached the other brokers, and the paused one's partitions failed over,
    only after 32 and 36 s."""
    import signal

    assert cluster.apply(topic_manifest("steady", 3)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/steady", 3), what="topic online")
    ids = sorted(b["id"] for b in cluster.record["brokers"])
    paused, witness = ids[0], ids[-1]  # pushes go out in id order: the paused one's first
    led = [p["partition"] for p in cluster.partitions("default/steady") if p["leader"] == paused]
    w = next(b for b in cluster.record["brokers"] if b["id"] == witness)
    cluster.signal_broker(paused, signal.SIGSTOP)
    try:
        # a new generation while the paused broker still counts as live (liveness TTL 3 s)
        assert cluster.apply(topic_manifest("later", 3)).returncode == 0

        def witness_knows_it() -> bool:
            out = cluster.cli(
                "topics", "describe", "later", "--json",
                "--bootstrap", f"{w['host']}:{w['port']}", check=False,
            )  # fmt: skip
            return out.returncode == 0 and len(json.loads(out.stdout)["partition_details"]) == 3

        # inside the old 30 s stall (32 and 36 s), with room for a loaded machine; failover
        # itself takes the TTL and a step or two
        cluster.wait(witness_knows_it, timeout=25, what=f"broker {witness} learning the topic")
        cluster.wait(
            lambda: all(
                p["leader"] not in (paused, None) for p in cluster.partitions("default/steady")
            ),
            timeout=25,
            what=f"partitions {led} failing over from the paused broker {paused}",
        )
    finally:
        cluster.signal_broker(paused, signal.SIGCONT)


async def test_a_paused_leader_holds_acks_all_produce_only_until_failover(
    cluster: LocalCluster,
) -> None:
    """A leader that accepts connections and never answers (SIGSTOP) under acks=all: the
    first produce after the pause was acknowledged 60 s later (the request's 30 s timeout,
    then a topology refresh that asked the paused broker first and waited 30 s more).
    Now a producer whose request goes unanswered asks every second where the partition's
    leader is, and resends there as soon as it has moved; refreshes ask three brokers at
    once. Measured 4.1 s."""
    import signal

    assert cluster.apply(topic_manifest("paused", 1, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: online(cluster, "default/paused", 1), what="topic online")
    leader = cluster.partitions("default/paused")[0]["leader"]
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("paused", [b"before"] * 100, partition=0)
        await producer.flush()
        cluster.signal_broker(leader, signal.SIGSTOP)
        try:
            await producer.send("paused", b"after", partition=0)
            # well inside the old 60 s; failover takes the 3 s liveness TTL and a step
            await asyncio.wait_for(producer.flush(), 20)
        finally:
            cluster.signal_broker(leader, signal.SIGCONT)
    assert cluster.partitions("default/paused")[0]["leader"] != leader
    records = offsets_and_values(await read_all(cluster.bootstrap, "default/paused", 0))
    assert [v for _, v in records] == [b"before"] * 100 + [b"after"], "each record once"


async def test_records_acknowledged_after_a_follower_died_survive_its_election(
    cluster: LocalCluster,
) -> None:
    """A follower dies; the leader drops it from its LRS and the other follower keeps
    copying; then the leader and that follower go down before the controller heard of the
    drop, and the dead one comes back first. The controller, which still counts it in the
    LRS, elects it: nothing acknowledged may be missing from its log."""
    import signal

    topic = "default/recorded"
    assert cluster.apply(topic_manifest("recorded", 1, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: online(cluster, topic, 1), what="topic online")
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("recorded", [b"early"] * 100, partition=0)
        await producer.flush()
    cluster.wait(
        lambda: len(cluster.partitions(topic)[0]["liveReplicas"]) == 3,
        what="all three replicas in the controller's LRS",
    )
    p0 = cluster.partitions(topic)[0]
    leader = p0["leader"]
    dead, holder = [r for r in p0["replicas"] if r != leader]
    acked: list[bytes] = []

    async def late() -> None:
        async with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=120_000) as p:
            receipts = [
                (await p.send("recorded", f"late-{i}".encode(), partition=0), i) for i in range(200)
            ]
            for receipt, i in receipts:
                with contextlib.suppress(HeadraceError):
                    await receipt
                    acked.append(f"late-{i}".encode())

    cluster.signal_controller(signal.SIGSTOP)  # it records nothing from here on
    try:
        cluster.kill_broker(dead)
        sending = asyncio.create_task(late())
        await until(
            lambda: (
                sorted(cluster.broker_partition(leader, topic, 0).get("liveReplicas", []))
                == sorted([leader, holder])
            ),
            what=f"leader {leader} dropping broker {dead} from its LRS",
            timeout=30,
        )
        await until(
            lambda: cluster.broker_partition(holder, topic, 0).get("logEndOffset", 0) >= 300,
            what=f"broker {holder} copying every late record",
            timeout=30,
        )
        cluster.kill_broker(leader)
        cluster.kill_broker(holder)
        cluster.restart_broker(dead)
    finally:
        cluster.signal_controller(signal.SIGCONT)
    cluster.wait(
        lambda: (
            cluster.partitions(topic)[0]["leader"] == dead
            and cluster.partitions(topic)[0]["state"] == "Online"
        ),
        what=f"broker {dead} elected",
        timeout=60,
    )
    sending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sending
    stored = {v for _, v in offsets_and_values(await read_all(cluster.bootstrap, topic, 0))}
    assert stored >= {b"early"}
    missing = [v for v in acked if v not in stored]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged late records lost"
