"""A pushed topology's new partitions are opened off the event loop (``Placer.prepare``)
and then taken by the registry: one in-process cluster ``Broker``, no controller."""

from __future__ import annotations

import asyncio
from pathlib import Path

from headrace.broker.app import Broker
from headrace.broker.config import BrokerSettings
from headrace.broker.topics import Role
from headrace.protocol.coordination import ClusterTopology, PartitionPlacement, TopicPlacement
from headrace.protocol.endpoints import BrokerEndpoint

TOPIC = "default/many"


def _topology(generation: int, partitions: int) -> ClusterTopology:
    """Broker 0 leads the even partitions and follows broker 1 on the odd ones."""
    return ClusterTopology(
        generation,
        "local",
        [BrokerEndpoint(0, "127.0.0.1", 1, 2), BrokerEndpoint(1, "127.0.0.1", 3, 4)],
        [
            TopicPlacement(
                TOPIC,
                partitions,
                1,
                1,
                {},
                [
                    PartitionPlacement(p, [p % 2, 1 - p % 2], p % 2, 1, [p % 2, 1 - p % 2])
                    for p in range(partitions)
                ],
            )
        ],
    )


async def test_a_push_opens_its_new_partitions_on_a_thread_and_keeps_the_loop_free(
    tmp_path: Path,
) -> None:
    broker = Broker(
        BrokerSettings(data_dir=tmp_path / "data", port=0, admin_port=-1, cluster_mode=True)
    )
    await broker.start()
    try:
        loop_ran: list[int] = []
        opened_by = broker.placer.prepare

        def slow_prepare(*args: object) -> object:
            # the loop must be able to run while the thread opens the logs
            asyncio.run_coroutine_threadsafe(_note(loop_ran), loop).result(timeout=10)
            return opened_by(*args)  # type: ignore[arg-type]

        loop = asyncio.get_running_loop()
        broker.placer.prepare = slow_prepare  # type: ignore[method-assign]
        assert await broker.receive_topology(_topology(5, 40).to_json())
        assert loop_ran == [1]

        topic = broker.registry.get(TOPIC)
        assert sorted(topic.partitions) == list(range(40))
        assert {p.role for i, p in topic.partitions.items() if i % 2 == 0} == {Role.LEADER}
        assert {p.role for i, p in topic.partitions.items() if i % 2 == 1} == {Role.FOLLOWER}
        for index in range(40):
            assert any(n.name.endswith(".log") for n in (topic.directory / str(index)).iterdir())

        # an older or equal push changes nothing; a bigger one opens only the new partitions
        before = {i: p.log for i, p in topic.partitions.items()}
        assert not await broker.receive_topology(_topology(5, 60).to_json())
        assert sorted(topic.partitions) == list(range(40))
        assert await broker.receive_topology(_topology(6, 60).to_json())
        assert sorted(topic.partitions) == list(range(60))
        assert all(topic.partitions[i].log is log for i, log in before.items())
    finally:
        await broker.stop()


async def _note(ran: list[int]) -> None:
    ran.append(1)
