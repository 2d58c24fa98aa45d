"""A ``headrace consume`` with a 5 s idle timeout reads on through a preferred-leader
hand-back.

On the test bed a ``consume`` reading while a returned broker got its partitions back
once went idle for over its 5 s ``--idle-timeout`` and stopped early (the records were
all there when read again). Here the same happens in local mode, under acks=all load:
broker 0 is killed, its partitions fail over, a ``consume`` starts, broker 0 comes back
and the controller hands its partitions back while the load goes on. The ``consume``
must still be reading when the load stops: every acknowledged record is in its output.
An early stop shows as records missing from it, not as a timing.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.testing import procs
from tests.integration.acked_load import AckedLoad, keys
from tests.integration.localcluster import LocalCluster, all_in_sync, topic_manifest, until

TOPIC = "default/handback"
PARTITIONS = 6
IDLE_TIMEOUT_S = 5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def leaders(c: LocalCluster) -> list[int | None]:
    return [p["leader"] for p in c.partitions(TOPIC)]


def preferred_lead(c: LocalCluster) -> bool:
    """Every partition led by the first broker of its replica list."""
    return all(p["leader"] == p["replicas"][0] for p in c.partitions(TOPIC))


async def test_a_consume_reads_on_through_a_preferred_leader_hand_back(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.apply(topic_manifest("handback", PARTITIONS)).returncode == 0
    await until(lambda: all_in_sync(cluster, TOPIC, PARTITIONS), "topic online and in sync")
    await until(lambda: preferred_lead(cluster), "every partition on its preferred leader")
    load = AckedLoad(cluster.bootstrap, "handback", keys(12))
    load.start()
    loop = asyncio.get_running_loop()
    output, errors = tmp_path / "consumed.txt", tmp_path / "consume.err"
    consume: subprocess.Popen[bytes] | None = None
    #: loop time the consume exited
    exited_at: float | None = None
    try:
        await load.wait_for_more(100)
        pid = int(next(b["pid"] for b in cluster.record["brokers"] if b["id"] == 0))
        cluster.kill_broker(0)
        await until(lambda: not alive(pid), "broker 0 stopped")
        await until(lambda: 0 not in leaders(cluster), "broker 0's partitions failed over")
        with output.open("wb") as out, errors.open("wb") as err:
            consume = procs.spawn(
                [
                    *procs.HEADRACE_CLI, "consume", TOPIC, "--cohort", "reader",
                    "--from-beginning", "--idle-timeout", str(IDLE_TIMEOUT_S),
                    "--bootstrap", cluster.bootstrap,
                ],
                stdout=out,
                stderr=err,
            )  # fmt: skip

        async def watch() -> None:
            nonlocal exited_at
            await asyncio.to_thread(consume.wait)
            exited_at = loop.time()

        watching = asyncio.create_task(watch())
        await load.wait_for_more(100)
        cluster.restart_broker(0)
        await until(lambda: 0 in leaders(cluster), "broker 0 leads again (the hand-back)", 90)
        await until(lambda: preferred_lead(cluster), "the hand-back done", 90)
        await load.wait_for_more(100)
    finally:
        await load.stop()
    stopped_at = loop.time()
    # the consume exits IDLE_TIMEOUT_S after the last record it reads
    await asyncio.wait_for(watching, 120)
    stderr = errors.read_text(errors="replace")
    assert consume.returncode == 0, stderr
    consumed = set(output.read_bytes().splitlines())
    # An idle timeout is right when nothing was acknowledged for that long (a producer
    # stalled by the failover): what the consume owes is every record acknowledged a
    # moment before it exited. Stopping early while records were acknowledged is the bug.
    assert exited_at is not None
    early = exited_at < stopped_at
    owed_until = exited_at - 1.0 if early else float("inf")
    owed = {a[3] for a, at in zip(load.acked, load.acked_at, strict=True) if at <= owed_until}
    missing = owed - consumed
    print(
        f"\n{len(load.acked)} acknowledged across a kill and a hand-back, {len(consumed)}"
        f" consumed; the consume {'exited before' if early else 'outlived'} the load;"
        f" the load's longest stall {load.longest_stall_s():.1f} s"
    )
    assert not missing, (
        f"{len(missing)} records acknowledged before the consume exited were not consumed"
        f" (e.g. {sorted(missing)[:5]}): it went idle while records were acknowledged;"
        f" stderr: {stderr[-2000:]}"
    )
