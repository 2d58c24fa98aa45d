"""Live repartition on a real local cluster: keyed load through grow 4→8, 8→12, shrink 12→6.

Three brokers (RF=3, acks=all), a producer sending 1,000 keys each with its own
sequence numbers, and a 3-member cohort that logs every record it is delivered,
in the order the members process them (one event loop, so one global order).
The checker asserts, over that log: every acknowledged record was delivered,
each key's sequence numbers arrive strictly increasing across every cutover,
and nothing was delivered twice (nothing crashed).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from headrace.client.consumer import ConsumedBatch, Consumer
from headrace.client.producer import Producer
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.testing.reading import read_partition
from headrace.testing.waiting import until_async
from tests.integration.keyed import Delivery, KeyedCohort, KeyedLoad, check_keyed_order
from tests.integration.localcluster import LocalCluster, topic_manifest
from tests.integration.raw import RawConnection

TOPIC = "keyed"
KEYS = 1_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("repartition") / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def repartition_manifest(name: str, topic: str, partitions: int, timeout_s: int = 5) -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Repartition
metadata: {{name: {name}}}
spec: {{topicRef: {{name: {topic}}}, partitions: {partitions}, adoptionTimeoutSeconds: {timeout_s}}}
"""


def routed_partitions(c: LocalCluster, topic: str) -> int:
    """The partitions keys are routed to: fewer than exist after a shrink."""
    doc = next(t for t in c.state()["cluster"]["topics"] if t["name"] == topic)
    return int(doc.get("activePartitions") or len(doc["partitions"]))


def repartition_status(c: LocalCluster, name: str) -> dict[str, Any]:
    for doc in c.state().get("repartitions", []):
        if doc["metadata"]["name"] == name:
            return dict(doc.get("status") or {})
    return {}


async def test_keyed_load_stays_in_order_through_grow_grow_and_shrink(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest(TOPIC, 4, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(
        lambda: (
            len(cluster.partitions(f"default/{TOPIC}")) == 4
            and all(p["state"] == "Online" for p in cluster.partitions(f"default/{TOPIC}"))
        ),
        what="topic online",
    )
    producer = await Producer(cluster.bootstrap, acks=msg.Acks.ALL, linger_ms=2).start()
    cohort = KeyedCohort(cluster.bootstrap, f"default/{TOPIC}")
    await cohort.start()
    load = KeyedLoad(producer, f"default/{TOPIC}", KEYS)
    tasks = [asyncio.create_task(load.run())]
    tasks += [asyncio.create_task(cohort.run(m)) for m in cohort.members]

    try:
        await wait_async(lambda: load.rounds >= 2, "the first rounds", tasks)
        for name, partitions in (("grow-8", 8), ("grow-12", 12), ("shrink-6", 6)):
            # The cohort lags across the cutover: old keys' backlog sits in the old
            # partitions while their new records pile up in the new ones.
            cohort.running.clear()
            await wait_async(
                lambda s=load.rounds: load.rounds >= s + 1, f"a backlog before {name}", tasks
            )
            applied = cluster.apply(repartition_manifest(name, TOPIC, partitions))
            assert applied.returncode == 0, applied.stderr.decode()
            await wait_async(
                lambda n=name: (
                    repartition_status(cluster, n).get("phase")
                    in ("Draining", "AwaitingAdoption", "Finalized")
                ),
                f"{name} cut over",
                tasks,
            )
            start = load.rounds
            await wait_async(lambda s=start: load.rounds >= s + 2, f"a backlog after {name}", tasks)
            # The paused cohort holds the drain: the transition is in flight, and shown.
            shown = await asyncio.to_thread(
                cluster.cli, "local", "status", "--dir", str(cluster.dir)
            )
            line = next(
                (
                    ln
                    for ln in shown.stdout.decode().splitlines()
                    if ln.startswith(f"transition default/{TOPIC}")
                ),
                "",
            )
            assert f"-> {partitions} partitions" in line and "Draining" in line, line
            cohort.running.set()
            await wait_async(
                lambda n=name: repartition_status(cluster, n).get("phase") == "Finalized",
                f"{name} finalized",
                tasks,
            )
            status = repartition_status(cluster, name)
            assert status["toPartitions"] == partitions
            assert status["toVersion"] == status["fromVersion"] + 1
            assert status["finalizedBy"] in ("Adopted", "AdoptionTimedOut")
            # A shrink retires partitions for routing only: 12 -> 6 keeps all 12.
            placed = cluster.partitions(f"default/{TOPIC}")
            assert routed_partitions(cluster, f"default/{TOPIC}") == partitions
            assert len(placed) == (12 if name == "shrink-6" else partitions)
        load.stop.set()
        await tasks[0]
        assert not load.failures, load.failures[:3]
        total = sum(v + 1 for v in load.acked.values())
        await wait_async(lambda: len(cohort.log) >= total, "every acked record delivered", tasks)
    finally:
        load.stop.set()
        cohort.stop.set()
        cohort.running.set()  # a paused member waits for this before it sees ``stop``
        await asyncio.gather(*tasks, return_exceptions=True)
        await cohort.close()
        await producer.close()
    check_keyed_order(cohort.log, load.acked)
    topic = next(t for t in cluster.state()["cluster"]["topics"] if t["name"] == f"default/{TOPIC}")
    assert topic["partitioningVersion"] == 4 and "transition" not in topic


async def keyed_load_through(
    cluster: LocalCluster,
    short: str,
    counts: Sequence[int],
    keys: int = 150,
    *,
    manifest: str | None = None,
    after_step: Callable[[int], Awaitable[None]] | None = None,
) -> list[Delivery]:
    """Keyed acks=all load on a new topic of ``counts[0]`` partitions, through a
    Repartition to each later count in turn (load before, during and after each, each
    finalized before the next): the acknowledged records. No cohort reads meanwhile.

    ``manifest``: the Topic to apply (default: RF=3, minInSync 2, ``counts[0]``
    partitions). ``after_step(count)`` runs, under load, once the Repartition to
    ``count`` has finalized and rounds have followed it."""
    topic = f"default/{short}"
    if manifest is None:
        manifest = topic_manifest(short, counts[0], replicas=3, min_in_sync=2)
    assert cluster.apply(manifest).returncode == 0
    cluster.wait(
        lambda: (
            len(cluster.partitions(topic)) == counts[0]
            and all(p["state"] == "Online" for p in cluster.partitions(topic))
        ),
        what=f"{topic} online",
    )
    producer = await Producer(cluster.bootstrap, acks=msg.Acks.ALL, linger_ms=2).start()
    load = KeyedLoad(producer, topic, keys)
    task = asyncio.create_task(load.run())
    try:
        await wait_async(lambda: load.rounds >= 2, "the first rounds", [task])
        for step, count in enumerate(counts[1:]):
            name = f"{short}-{step}-to-{count}"
            applied = cluster.apply(repartition_manifest(name, short, count, timeout_s=2))
            assert applied.returncode == 0, applied.stderr.decode()
            await wait_async(
                lambda n=name: repartition_status(cluster, n).get("phase") == "Finalized",
                f"{name} finalized",
                [task],
            )
            start = load.rounds
            await wait_async(lambda s=start: load.rounds >= s + 2, f"rounds after {name}", [task])
            if after_step is not None:
                await after_step(count)
        load.stop.set()
        await task
    finally:
        load.stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await producer.close()
    assert not load.failures, load.failures[:3]
    return load.positions


async def wait_async(
    predicate: Callable[[], bool],
    what: str,
    tasks: Sequence[asyncio.Task[None]] = (),
    timeout: float = 60.0,
) -> bool:
    """Wait for ``predicate`` (run in a thread: it may ask the controller) up to
    ``timeout``; raises what a task raised, and AssertionError on the deadline."""
    return await until_async(predicate, timeout, what, in_thread=True, watching=tasks)


async def read_with_a_fresh_cohort(
    cluster: LocalCluster, topic: str, cohort: str, acked: Sequence[Delivery]
) -> list[Delivery]:
    """What one new member of a new cohort starting at the earliest offsets is delivered,
    once it has every acknowledged record (or after 20 s without them all)."""
    reader = KeyedCohort(cluster.bootstrap, topic, cohort=cohort, members=1)
    await reader.start()
    task = asyncio.create_task(reader.run(reader.members[0]))
    wanted = {(key, seq) for key, seq, _, _ in acked}
    try:
        await wait_async(
            lambda: wanted <= {(key, seq) for key, seq, _, _ in reader.log},
            "every acknowledged record read back",
            [task],
            timeout=20.0,
        )
    except AssertionError:
        pass  # the caller says what is missing
    finally:
        reader.stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await reader.close()
    return reader.log


async def test_a_shrink_keeps_every_acknowledged_record_readable(cluster: LocalCluster) -> None:
    """A shrink retires partitions for routing only: a cohort created after it, reading
    from the earliest offsets, gets every record acknowledged before, during and after."""
    acked = await keyed_load_through(cluster, "retire", [4, 2])
    assert {p for _, _, p, _ in acked} == {0, 1, 2, 3}
    read = await read_with_a_fresh_cohort(cluster, "default/retire", "after-shrink", acked)
    got = {(key, seq) for key, seq, _, _ in read}
    missing = [(k, s, p, o) for k, s, p, o in acked if (k, s) not in got]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged records lost: {missing[:3]}"
    assert len(cluster.partitions("default/retire")) == 4
    assert routed_partitions(cluster, "default/retire") == 2
    # Read-only: its leader refuses a publish with the typed Redirect, storing nothing.
    leader = cluster.partitions("default/retire")[3]["leader"]
    before = len(await read_partition(cluster.bootstrap, "default/retire", 3))
    raw = RawConnection(broker_address(cluster, leader))
    try:
        version = int(
            next(
                t["partitioningVersion"]
                for t in cluster.state()["cluster"]["topics"]
                if t["name"] == "default/retire"
            )
        )
        request = msg.ProduceRequest("default/retire", 3, version, msg.Acks.ALL, 5_000, b"")
        batch = rb.encode([b"late"], keys=[b"k"], timestamp_ms=1)
        answer = await asyncio.to_thread(raw.call, Op.PRODUCE, request.encode_prefix() + batch)
    finally:
        raw.close()
    assert answer.op == Op.REDIRECT, answer
    assert "default/retire/3 is retired" in msg.Redirect.decode(answer.body).reason
    assert len(await read_partition(cluster.bootstrap, "default/retire", 3)) == before


async def test_a_partition_number_that_comes_back_never_reuses_an_offset(
    cluster: LocalCluster,
) -> None:
    """3 -> 2 -> 4 under load: partition 2 is retired and then routed to again. Its log
    continues where it stopped, so no two acknowledged records share a (partition,
    offset), and a new cohort reads each acknowledged record where it was acknowledged."""
    acked = await keyed_load_through(cluster, "reuse", [3, 2, 4])
    twice = [at for at, n in Counter((p, o) for _, _, p, o in acked).items() if n > 1]
    assert not twice, f"{len(twice)} (partition, offset) pairs acknowledged twice: {twice[:3]}"
    read = await read_with_a_fresh_cohort(cluster, "default/reuse", "after-regrow", acked)
    at = {(p, o): (key, seq) for key, seq, p, o in read}
    wrong = [(k, s, p, o, at.get((p, o))) for k, s, p, o in acked if at.get((p, o)) != (k, s)]
    assert not wrong, f"{len(wrong)} acknowledged records not read where acked: {wrong[:3]}"


async def read_deferring(
    cluster: LocalCluster, topic: str, cohort: str, acked: Sequence[Delivery], first: set[int]
) -> list[Delivery]:
    """What one new member of a new cohort, from the earliest offsets, processes until it
    has every acknowledged record: what it is delivered from the partitions in ``first``
    at once, what it is delivered from the others only when a round brings nothing from
    ``first``. A legal member, so only delivery holds can keep each key in order for it."""
    reader = Consumer(cluster.bootstrap, topic, cohort, member_id=cohort, start="earliest")
    await reader.start()
    log: list[Delivery] = []
    aside: list[ConsumedBatch] = []
    wanted = {(key, seq) for key, seq, _, _ in acked}

    def process(batch: ConsumedBatch) -> None:
        for offset, record in zip(batch.offsets(), batch.records(), strict=True):
            assert record.key is not None
            log.append((record.key.decode(), int(record.value), batch.partition, offset))
        reader.ack_batch(batch)

    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not wanted <= {(key, seq) for key, seq, _, _ in log}:
            assert loop.time() < deadline, f"{cohort} never read every acked record"
            processed = 0
            for batch in await reader.getmany(timeout_s=0.2):
                if batch.partition in first:
                    process(batch)
                    processed += 1
                else:
                    aside.append(batch)
            if not processed:
                for batch in aside:
                    process(batch)
                aside.clear()
    finally:
        await reader.close(grace_s=1)
    return log


async def test_a_cohort_created_after_a_shrink_gets_each_key_in_order(
    cluster: LocalCluster,
) -> None:
    """4 -> 2 under keyed load, then a new cohort from the earliest offsets that processes
    the partitions keys are routed to first: the history's holds keep each key in order
    (without them: a key's newer records from 0 or 1 before its older ones from 2 or 3)."""
    acked = await keyed_load_through(cluster, "history", [4, 2])
    log = await read_deferring(cluster, "default/history", "late", acked, first={0, 1})
    check_keyed_order(log, {})


async def test_a_cohort_created_after_a_shrink_and_a_grow_back_gets_each_key_in_order(
    cluster: LocalCluster,
) -> None:
    """4 -> 2 -> 4 under keyed load: partitions 2 and 3 are retired and then routed to
    again. New cohorts after it, one processing 2 and 3 first and one 0 and 1 first, read
    every acknowledged record, each key in order across both transitions, and neither
    waits for ever (the grow holds 2 and 3 at their own log ends, not from 0)."""
    acked = await keyed_load_through(cluster, "backagain", [4, 2, 4])
    topic = next(
        t for t in cluster.state()["cluster"]["topics"] if t["name"] == "default/backagain"
    )
    assert [t["toPartitions"] for t in topic["history"]["transitions"]] == [2, 4]
    for cohort, first in (("late-high", {2, 3}), ("late-low", {0, 1})):
        log = await read_deferring(cluster, "default/backagain", cohort, acked, first)
        check_keyed_order(log, {})


def test_bad_repartitions_are_refused_and_change_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.apply(topic_manifest("steady", 3, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: len(cluster.partitions("default/steady")) == 3, what="steady placed")
    same = cluster.apply(repartition_manifest("same", "steady", 3))
    assert same.returncode == 1
    assert "topic default/steady already has 3 partitions" in same.stderr.decode()
    missing = cluster.apply(repartition_manifest("lost", "nowhere", 4))
    assert missing.returncode == 1
    assert "topic default/nowhere does not exist" in missing.stderr.decode()
    zero = cluster.apply(repartition_manifest("zero", "steady", 0))
    assert zero.returncode == 1
    assert "spec.partitions" in zero.stderr.decode()
    assert all(
        d["metadata"]["name"] not in ("same", "lost", "zero")
        for d in cluster.state().get("repartitions", [])
    )
    version = next(
        t["partitioningVersion"]
        for t in cluster.state()["cluster"]["topics"]
        if t["name"] == "default/steady"
    )
    assert version == 1


def broker_address(c: LocalCluster, broker_id: int) -> str:
    b = next(b for b in c.record["brokers"] if b["id"] == broker_id)
    return f"{b['host']}:{b['port']}"


def test_an_old_client_is_fenced_by_redirect_and_the_transition_finalizes_by_timeout(
    cluster: LocalCluster,
) -> None:
    """A client that acked once and then never acks pushes (an older client) holds the
    adoption floor down: the transition finalizes by timeout, and its publishes routed
    under the old version are redirected, never stored."""
    topic = "default/legacy"
    assert cluster.apply(topic_manifest("legacy", 2, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(
        lambda: [p.get("leader") is not None for p in cluster.partitions(topic)] == [True, True],
        what="legacy online",
    )
    leader = cluster.partitions(topic)[0]["leader"]
    old = RawConnection(broker_address(cluster, leader))
    try:
        snapshot = msg.TopologySnapshot.decode(old.call(Op.TOPOLOGY, b"{}").body)
        old.send(Op.TOPOLOGY_UPDATE_ACK, msg.TopologyUpdateAck(snapshot.generation).encode())
        cluster.wait(
            lambda: cluster.state()["adoptionFloor"] == snapshot.generation,
            what="the old client's ack in the floor",
        )
        applied = cluster.apply(repartition_manifest("legacy-4", "legacy", 4, timeout_s=2))
        assert applied.returncode == 0, applied.stderr.decode()
        cluster.wait(
            lambda: (
                repartition_status(cluster, "legacy-4").get("phase")
                in ("AwaitingAdoption", "Finalized")
            ),
            what="legacy-4 drained",
        )
        batch = rb.encode([b"routed under version 1"], keys=[b"k"], timestamp_ms=1)
        request = msg.ProduceRequest(topic, 0, 1, msg.Acks.ALL, 5_000, b"")
        answer = old.call(Op.PRODUCE, request.encode_prefix() + batch)
        assert answer.op == Op.REDIRECT, answer
        redirect = msg.Redirect.decode(answer.body)
        assert redirect.partitioning_version == 2 and redirect.owner is not None
        assert "partitioning version 1" in redirect.reason
        cluster.wait(
            lambda: repartition_status(cluster, "legacy-4").get("phase") == "Finalized",
            what="legacy-4 finalized",
        )
        status = repartition_status(cluster, "legacy-4")
        assert status["finalizedBy"] == "AdoptionTimedOut"
        assert status["adoptionGeneration"] > snapshot.generation
    finally:
        old.close()
    stored = asyncio.run(read_partition(cluster.bootstrap, topic, 0))
    assert stored == [], "a publish routed under a stale version was stored"


def test_a_restarted_controller_resumes_the_transition_without_a_second_bump(
    cluster: LocalCluster,
) -> None:
    """A cohort member that takes nothing holds the drain; the controller is killed and
    restarted mid-transition; once the member reads, the transition finalizes at version
    2 (one bump)."""
    topic = "default/resume"
    assert cluster.apply(topic_manifest("resume", 2, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(
        lambda: [p.get("leader") is not None for p in cluster.partitions(topic)] == [True, True],
        what="resume online",
    )

    async def scenario() -> None:
        producer = await Producer(cluster.bootstrap, acks=msg.Acks.ALL).start()
        member = await Consumer(
            cluster.bootstrap, topic, "slow", member_id="slow", start="earliest"
        ).start()
        try:
            receipts = [await producer.send(topic, b"%d" % i, key=b"k%d" % i) for i in range(50)]
            for r in receipts:
                await r
            applied = cluster.apply(repartition_manifest("resume-4", "resume", 4, timeout_s=1))
            assert applied.returncode == 0, applied.stderr.decode()
            await asyncio.to_thread(
                cluster.wait,
                lambda: repartition_status(cluster, "resume-4").get("phase") == "Draining",
                30.0,
                "resume-4 draining",
            )
            cluster.kill_controller()
            cluster.restart_controller()
            await asyncio.to_thread(
                cluster.wait,
                lambda: repartition_status(cluster, "resume-4").get("phase") == "Draining",
                30.0,
                "the restarted controller serving resume-4",
            )
            got = 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while repartition_status(cluster, "resume-4").get("phase") != "Finalized":
                assert loop.time() < deadline, "resume-4 never finalized"
                for batch in await member.getmany(timeout_s=0.2):
                    got += batch.record_count
                    member.ack_batch(batch)
            assert got >= 50
        finally:
            await member.close(grace_s=1)
            await producer.close()

    asyncio.run(scenario())
    version = next(
        t["partitioningVersion"] for t in cluster.state()["cluster"]["topics"] if t["name"] == topic
    )
    assert version == 2
    assert len(cluster.partitions(topic)) == 4


def test_a_dead_brokers_frozen_adoption_label_does_not_stall_finalize(
    cluster: LocalCluster,
) -> None:
    """Broker 2's only acking client never acks the cutover, so its label holds the floor
    down; once broker 2 is killed, the floor counts live brokers only and the transition
    finalizes as adopted (its timeout, 600 s, is far away)."""
    topic = "default/frozen"
    assert cluster.apply(topic_manifest("frozen", 2, replicas=3, min_in_sync=1)).returncode == 0
    cluster.wait(
        lambda: [p.get("leader") is not None for p in cluster.partitions(topic)] == [True, True],
        what="frozen online",
    )

    async def scenario() -> None:
        # Bootstraps on broker 0: its topology connection acks every push.
        producer = await Producer(broker_address(cluster, 0), acks=msg.Acks.ALL).start()
        old = RawConnection(broker_address(cluster, 2))
        try:
            await (await producer.send(topic, b"before", key=b"k"))
            snapshot = msg.TopologySnapshot.decode(old.call(Op.TOPOLOGY, b"{}").body)
            old.send(Op.TOPOLOGY_UPDATE_ACK, msg.TopologyUpdateAck(snapshot.generation).encode())
            applied = cluster.apply(repartition_manifest("frozen-3", "frozen", 3, timeout_s=600))
            assert applied.returncode == 0, applied.stderr.decode()
            await asyncio.to_thread(
                cluster.wait,
                lambda: repartition_status(cluster, "frozen-3").get("phase") == "AwaitingAdoption",
                30.0,
                "frozen-3 waiting for adoption",
            )
            assert cluster.state()["adoptionFloor"] == snapshot.generation
            cluster.kill_broker(2)
            await asyncio.to_thread(
                cluster.wait,
                lambda: repartition_status(cluster, "frozen-3").get("phase") == "Finalized",
                30.0,
                "frozen-3 finalized with broker 2 dead",
            )
            assert repartition_status(cluster, "frozen-3")["finalizedBy"] == "Adopted"
            await (await producer.send(topic, b"after", key=b"k"))
        finally:
            old.close()
            await producer.close()

    try:
        asyncio.run(scenario())
    finally:
        cluster.restart_broker(2)
        cluster.wait(lambda: 2 in cluster.state()["live"], what="broker 2 back")
