"""A cluster broker restarted on its data directory leads nothing until the controller's
first topology push: one in-process ``Broker`` on loopback ports.

Before, its partitions came back as leaders (the standalone default) with no
replica set, and its topology claimed them all: a client that bootstrapped to
it had ``acks=all`` acknowledged by that one copy, which following the real
leader later truncated away (see ``tests/integration/test_restart_before_topology.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.broker.app import Broker
from headrace.broker.config import BrokerSettings
from headrace.broker.ports import RedirectRequired
from headrace.broker.topics import Role
from headrace.records import batch as rb

TOPIC = "default/orders"


async def test_a_restarted_cluster_broker_leads_nothing_before_its_topology(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # Put two partitions with records on disk (a standalone broker writes the same layout).
    first = Broker(BrokerSettings(data_dir=data, port=0, admin_port=-1))
    await first.start()
    try:
        first.create_topic(TOPIC, 2)
        p = first.registry.get(TOPIC).partition(0)
        batch = rb.encode([b"v"], timestamp_ms=1, producer_id=7, base_sequence=0)
        p.log.append(batch, rb.validate(batch), leader_epoch=1)
    finally:
        await first.stop()

    broker = Broker(BrokerSettings(data_dir=data, port=0, admin_port=-1, cluster_mode=True))
    await broker.start()
    try:
        assert broker.awaiting_topology
        partitions = broker.registry.all_partitions()
        assert len(partitions) == 2
        assert all(p.role is Role.FOLLOWER and p.leader_id == -1 for p in partitions)
        assert [p.lrs for p in partitions] == [[], []]

        snapshot, _ = broker.topology()
        assert snapshot.generation == 0, "any controller-numbered view must win over ours"
        assert [(r.name, r.owners) for r in snapshot.topics] == [(TOPIC, [-1, -1])]

        for call in (
            lambda: broker.partition_for_write(TOPIC, 0, 1),
            lambda: broker.partition_for_read(TOPIC, 0),
        ):
            with pytest.raises(RedirectRequired) as refused:
                call()
            assert refused.value.redirect.owner is None  # not "retry here"
    finally:
        await broker.stop()
