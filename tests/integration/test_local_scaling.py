"""Scale a local cluster 3 -> 4 -> 3 brokers under acks=all keyed load (replica moves).

Real controller and broker processes (``headrace local up``). ``local
add-broker`` starts broker 3 and makes it a member: replicas move onto it
(each one a follower that catches up before the old copy goes) and with them
some leaderships. ``local remove-broker`` moves its replicas off again and
only then stops it. Throughout, a producer writes keyed records with
acks=all; afterwards every acknowledged record must be stored exactly once
where it was acknowledged, offsets contiguous, and each key's records in the
order they were sent.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client.producer import Producer
from headrace.protocol import messages as msg
from headrace.testing.procs import run_headrace
from headrace.testing.reading import read_all
from headrace.testing.waiting import until_async
from tests.integration.acked_load import Acked, AckedLoad, check_stored_once, keys
from tests.integration.keyed import KeyedCohort, KeyedLoad
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/scaling"
PARTITIONS = 6
KEYS = keys(24)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def online(c: LocalCluster) -> bool:
    parts = c.partitions(TOPIC)
    return len(parts) == PARTITIONS and all(p["state"] == "Online" for p in parts)


def headrace(c: LocalCluster, *args: str) -> tuple[int, str]:
    proc = run_headrace("local", *args, "--dir", str(c.dir))
    return proc.returncode, proc.stderr.decode()


async def stored(c: LocalCluster, partition: int) -> list[tuple[int, bytes, bytes]]:
    return [
        (r.offset, r.key or b"", r.value) for r in await read_all(c.bootstrap, TOPIC, partition)
    ]


def load_on(c: LocalCluster) -> AckedLoad:
    return AckedLoad(c.bootstrap, "scaling", KEYS)


async def check_nothing_lost(c: LocalCluster, acked: list[Acked]) -> None:
    await check_stored_once(lambda p: stored(c, p), PARTITIONS, acked)


async def test_scale_3_4_3_under_acks_all_load_loses_nothing(cluster: LocalCluster) -> None:
    assert cluster.apply(topic_manifest("scaling", PARTITIONS)).returncode == 0
    cluster.wait(lambda: online(cluster), what="topic online")
    load = load_on(cluster)
    load.start()
    try:
        await load.wait_for_more(200)  # acks=all flowing before the scale up
        code, err = await asyncio.to_thread(headrace, cluster, "add-broker", "--timeout", "120")
        assert code == 0, err
        assert "broker 3 holds its share" in err
        parts = cluster.partitions(TOPIC)
        assert sum(3 in p["replicas"] for p in parts) >= 4, parts
        assert any(p["leader"] == 3 for p in parts), f"broker 3 leads nothing: {parts}"
        assert all(len(p["replicas"]) == 3 and "targetReplicas" not in p for p in parts)
        during_4 = len(load.acked)
        await load.wait_for_more(100)  # and on 4 brokers

        code, err = await asyncio.to_thread(headrace, cluster, "remove-broker", "--timeout", "120")
        assert code == 0, err
        assert "broker 3 holds nothing and is stopped" in err
        parts = cluster.partitions(TOPIC)
        assert all(3 not in p["replicas"] for p in parts), parts
        assert [b["id"] for b in cluster.record["brokers"]] == [0, 1, 2]
        cluster.wait(lambda: online(cluster), what="topic online on 3 brokers")

        # 3 brokers, replication factor 3: a further scale-down is refused, nothing moves
        code, err = await asyncio.to_thread(headrace, cluster, "remove-broker", "--timeout", "30")
        assert code == 1
        assert "removing broker 2 is refused" in err and "below the replication factor" in err
        assert [b["id"] for b in cluster.record["brokers"]] == [0, 1, 2]
        assert all(len(p["replicas"]) == 3 for p in cluster.partitions(TOPIC))
        await load.wait_for_more(100)  # and on 3 again
    finally:
        await load.stop()
    assert len(load.acked) > during_4 > 0, "acks=all produce went on through the moves"
    await check_nothing_lost(cluster, load.acked)
    print(f"\nscaled 3 -> 4 -> 3 under load: {len(load.acked)} acks=all records, none lost")


def members(c: LocalCluster) -> dict[str, Any]:
    with urllib.request.urlopen(f"{c.controller_url}/v1/members", timeout=5) as resp:
        return dict(json.loads(resp.read()))


async def test_a_controller_killed_mid_move_resumes_and_loses_nothing(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("scaling", PARTITIONS)).returncode == 0
    cluster.wait(lambda: online(cluster), what="topic online")
    load = load_on(cluster)
    load.start()
    try:
        await load.wait_for_more(200)
        code, err = await asyncio.to_thread(headrace, cluster, "add-broker", "--no-wait")
        assert code == 0, err
        cluster.wait(
            lambda: any(p.get("targetReplicas") for p in cluster.partitions(TOPIC)),
            what="a move in flight",
        )
        cluster.kill_controller()
        cluster.restart_controller()  # same state directory: members.json and the targets
        cluster.wait(lambda: members(cluster)["members"] == [0, 1, 2, 3], what="membership kept")
        cluster.wait(
            lambda: (
                not members(cluster)["moving"]
                and not members(cluster)["waiting"]
                and online(cluster)
                and all("targetReplicas" not in p for p in cluster.partitions(TOPIC))
                and sum(3 in p["replicas"] for p in cluster.partitions(TOPIC)) >= 4
            ),
            timeout=120,
            what="the moves finished by the restarted controller",
        )
        await load.wait_for_more(100)  # produce goes on after the moves
    finally:
        await load.stop()
    await check_nothing_lost(cluster, load.acked)


async def test_a_cohort_kept_open_across_a_scale_up_and_down_receives_every_ack(
    cluster: LocalCluster,
) -> None:
    """Replicas, and with them leaderships, move onto an added broker and off it again
    while a three-member cohort consumes under acks=all keyed load: every acknowledged
    record of every partition must still reach the cohort, whichever broker leads it
    after the moves, and every member must be a member on every leader (the operator
    campaign's scale round, in local mode)."""
    partitions = 4  # as the campaign's topic then: leaders move, not only replicas
    assert cluster.apply(topic_manifest("scaling", partitions)).returncode == 0
    cluster.wait(
        lambda: (
            len(parts := cluster.partitions(TOPIC)) == partitions
            and all(p["state"] == "Online" for p in parts)
        ),
        what="topic online",
    )
    producer = await Producer(cluster.bootstrap, acks=msg.Acks.ALL, linger_ms=2).start()
    cohort = KeyedCohort(cluster.bootstrap, TOPIC)
    await cohort.start()
    load = KeyedLoad(producer, TOPIC, len(KEYS))
    tasks = [asyncio.create_task(load.run())]
    tasks += [asyncio.create_task(cohort.run(m)) for m in cohort.members]

    async def wait_for(predicate: Callable[[], bool], what: str) -> None:
        # a member or the load that failed ends the wait with its error, at once
        await until_async(predicate, 60, what, watching=tasks)

    def undelivered(acked: set[tuple[int, int]]) -> dict[int, int]:
        """Partition -> how many acknowledged records the cohort has not been delivered."""
        missing = acked - {(p, o) for _, _, p, o in cohort.log}
        return {p: sum(1 for q, _ in missing if q == p) for p in sorted({p for p, _ in missing})}

    try:
        await wait_for(lambda: load.rounds >= 5, "the first rounds")
        code, err = await asyncio.to_thread(headrace, cluster, "add-broker", "--timeout", "120")
        assert code == 0, err
        assert any(p["leader"] == 3 for p in cluster.partitions(TOPIC)), "broker 3 leads nothing"
        rounds = load.rounds
        await wait_for(lambda: load.rounds >= rounds + 5, "rounds on 4 brokers")
        code, err = await asyncio.to_thread(headrace, cluster, "remove-broker", "--timeout", "120")
        assert code == 0, err
        rounds = load.rounds
        await wait_for(lambda: load.rounds >= rounds + 5, "rounds on 3 brokers again")
        load.stop.set()
        await tasks[0]
        assert not load.failures, load.failures[:3]
        acked = {(p, o) for _, _, p, o in load.positions}
        try:
            await wait_for(lambda: not undelivered(acked), "every acknowledged record delivered")
        except AssertionError as exc:
            leaders = {p["partition"]: p["leader"] for p in cluster.partitions(TOPIC)}
            raise AssertionError(
                f"{exc}: undelivered per partition {undelivered(acked)}, leaders {leaders},"
                f" not a member on (leader: partitions)"
                f" {[m.unjoined_partitions for m in cohort.members]}"
            ) from None
        assert all(not m.unjoined_partitions for m in cohort.members), [
            m.unjoined_partitions for m in cohort.members
        ]
    finally:
        load.stop.set()
        cohort.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cohort.close()
        await producer.close()
