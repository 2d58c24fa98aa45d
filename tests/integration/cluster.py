"""Cluster-mode brokers driven by the test as their controller (pushing topology documents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace.protocol.coordination import (
    ClusterTopology,
    PartitionPlacement,
    TopicPlacement,
)
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.records import batch as rb
from headrace.storage.bookkeeping import LogConfig
from headrace.storage.log import PartitionLog
from headrace.testing import waiting
from headrace.testing.procs import BrokerProcess


class Cluster:
    def __init__(self, root: Path, size: int = 3, extra_args: list[str] | None = None) -> None:
        self.brokers = [
            BrokerProcess(
                root / f"broker{i}" / "data",
                mode="cluster",
                broker_id=i,
                extra_args=extra_args or [],
            )
            for i in range(size)
        ]
        for b in self.brokers:
            b.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.generation = 0
        self.topics: dict[str, TopicPlacement] = {}

    def start(self) -> None:
        for b in self.brokers:
            b.start()

    def stop(self) -> None:
        for b in self.brokers:
            b.kill9()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.alive)

    def set_topic(
        self,
        name: str,
        assignments: list[tuple[list[int], int | None, int, list[int]]],
        min_in_sync: int = 1,
        config: dict[str, int] | None = None,
    ) -> None:
        """assignments: per partition (replicas, leader, epoch, lrs)."""
        self.topics[name] = TopicPlacement(
            name,
            len(assignments),
            1,
            min_in_sync,
            config or {},
            [
                PartitionPlacement(i, r, leader, e, lrs)
                for i, (r, leader, e, lrs) in enumerate(assignments)
            ],
        )

    def push(self, only: list[int] | None = None) -> None:
        self.generation += 1
        doc = ClusterTopology(
            self.generation,
            "test",
            [BrokerEndpoint(b.broker_id, "127.0.0.1", b.port, b.admin_port) for b in self.brokers],
            list(self.topics.values()),
        ).to_json()
        for b in self.brokers:
            if b.alive and (only is None or b.broker_id in only):
                b.post_json("/v1/topology", doc)

    def heartbeat(self, broker: int) -> dict[str, Any]:
        return self.brokers[broker].get_json("/v1/heartbeat")

    def partition_report(self, broker: int, topic: str, partition: int) -> dict[str, Any]:
        for p in self.heartbeat(broker)["partitions"]:  # type: ignore[union-attr]
            if p["topic"] == topic and p["partition"] == partition:
                return dict(p)
        raise KeyError((broker, topic, partition))

    def wait(self, predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
        waiting.until(predicate, timeout, what, retry_on=(KeyError, OSError))


def read_log_from_disk(
    broker: BrokerProcess, topic: str, partition: int
) -> list[tuple[int, int, bytes]]:
    """(offset, leader epoch, value) of every record, read from a stopped broker's files."""
    directory = broker.data_dir / "topics" / topic / str(partition)
    log = PartitionLog.open(directory, LogConfig())
    out: list[tuple[int, int, bytes]] = []
    try:
        offset = log.log_start_offset
        while offset < log.next_offset:
            data, _ = log.read(offset, 1 << 20)
            for pos, header in rb.scan(data):
                for record in rb.decode(data[pos : pos + header.size]).records():
                    out.append((record.offset, header.leader_epoch, record.value))
                offset = header.next_offset
    finally:
        log.close()
    return out
