"""A cluster broker's committed Kafka group offsets: the offsets topic.

The leader of the offsets topic's partition ``offsets_log.coordinator_partition(group,
N)`` coordinates the group. A commit is a batch appended there and answered once the
high watermark passes it (as an ``acks=all`` produce); a broker that becomes that
partition's leader replays it before it answers for the partition's groups
(``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile), and one that stops leading it forgets
them (``NOT_COORDINATOR``: clients find the new coordinator and rejoin).

Which groups are coordinated here follows the pushed topology; what a replay finds
and which groups to forget are handed to the coordinator (``kafka_groups``), which
holds the groups' state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from headrace.aio import cancel_and_wait
from headrace.broker import appending
from headrace.broker.topics import Role
from headrace.errors import NotEnoughReplicas, NotLeader, RequestTimedOut
from headrace.kafka import offsets_log
from headrace.kafka.errors import ErrorCode
from headrace.kafka.groups import Committed
from headrace.protocol.endpoints import KafkaAddress
from headrace.records import batch as rb
from headrace.records.topic_names import canonical_topic_name
from headrace.storage.bookkeeping import FsyncPolicy

if TYPE_CHECKING:
    from headrace.broker.ports import ConnectionHost
    from headrace.broker.topics import Partition

log = logging.getLogger(__name__)

#: how long a commit waits for the offsets topic's replicas (Kafka's
#: ``offsets.commit.timeout.ms``), then is answered ``REQUEST_TIMED_OUT``
COMMIT_TIMEOUT_S = 5.0
#: bytes read per step while a new coordinator replays its partition
_REPLAY_CHUNK = 1 << 20

#: a replayed group's committed offsets are handed over: (group id, its offsets)
Restore = Callable[[str, dict[tuple[str, int], Committed]], None]
#: the groups of an offsets-topic partition no longer led here are to be forgotten:
#: (that partition, which group ids belong to it)
GiveUp = Callable[[int, Callable[[str], bool]], None]


class OffsetsTopic:
    def __init__(self, host: ConnectionHost, *, restore: Restore, give_up: GiveUp) -> None:
        self.host = host
        self._restore = restore
        self._give_up = give_up
        #: offsets-topic partition -> the leader epoch its groups were replayed at
        #: (answering), or are being replayed at (``_loading``)
        self._loaded: dict[int, int] = {}
        self._loading: dict[int, tuple[int, asyncio.Task[None]]] = {}

    async def close(self) -> None:
        await cancel_and_wait(*(task for _, task in self._loading.values()))
        self._loading.clear()

    def _placement(self) -> tuple[str, int] | None:
        """(the offsets topic's canonical name, its partition count) in the pushed topology."""
        cluster = self.host.cluster
        if cluster is None:
            return None
        name = canonical_topic_name(self.host.settings.kafka_offsets_topic)
        placement = next((t for t in cluster.topics if t.name == name), None)
        if placement is None or placement.partitions <= 0:
            return None
        return name, placement.partitions

    def _coordinator_leader(self, group_id: str) -> tuple[int, int | None] | None:
        """(the group's partition of the offsets topic, its leader per the topology)."""
        found = self._placement()
        if found is None or self.host.cluster is None:
            return None
        name, count = found
        index = offsets_log.coordinator_partition(group_id, count)
        placement = next(t for t in self.host.cluster.topics if t.name == name)
        leader = next((a.leader for a in placement.assignments if a.partition == index), None)
        return index, leader

    def owner_error(self, group_id: str) -> ErrorCode:
        """NONE if this broker answers for ``group_id`` now; else what to tell its client."""
        found = self._coordinator_leader(group_id)
        if found is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        index, leader = found
        if leader is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if leader != self.host.settings.broker_id:
            return ErrorCode.NOT_COORDINATOR
        if index not in self._loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    def find(self, group_id: str) -> tuple[ErrorCode, str | None, int, KafkaAddress | None]:
        """FindCoordinator: (error, message, node id, its Kafka address)."""
        found = self._coordinator_leader(group_id)
        if found is None:
            topic = self.host.settings.kafka_offsets_topic
            why = f"the offsets topic {topic!r} does not exist (docs/kafka.md)"
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, why, -1, None
        index, leader = found
        endpoint = (
            None
            if leader is None or self.host.cluster is None
            else self.host.cluster.broker(leader)
        )
        if endpoint is None or endpoint.kafka is None:
            why = f"partition {index} of the offsets topic has no leader with a Kafka listener"
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, why, -1, None
        return ErrorCode.NONE, None, endpoint.id, endpoint.kafka

    def placement_changed(self) -> None:
        """Take up the offsets-topic partitions this broker now leads (replay them), and
        give up the groups of those it no longer leads."""
        led: dict[int, Partition] = {}
        found = self._placement()
        if found is not None:
            topic = self.host.registry.topics.get(found[0])
            if topic is not None:
                led = {
                    i: p
                    for i, p in topic.partitions.items()
                    if p.role is Role.LEADER and p.replica_set is not None
                }
        for index in list(self._loaded):
            part = led.get(index)
            if part is None or part.leader_epoch != self._loaded[index]:
                del self._loaded[index]
                self._give_up(index, self._belongs_to(index))
        for index, (epoch, task) in list(self._loading.items()):
            part = led.get(index)
            if part is None or part.leader_epoch != epoch:
                task.cancel()
                del self._loading[index]
        for index, part in led.items():
            if index in self._loaded or index in self._loading:
                continue
            task = asyncio.get_running_loop().create_task(
                self._replay(index, part), name=f"kafka-offsets-replay-{index}"
            )
            self._loading[index] = (part.leader_epoch, task)

    def _belongs_to(self, index: int) -> Callable[[str], bool]:
        """Whether a group is coordinated by offsets-topic partition ``index`` (every
        group, once the offsets topic is gone)."""
        found = self._placement()
        count = found[1] if found is not None else 0
        return lambda group_id: (
            count <= 0 or offsets_log.coordinator_partition(group_id, count) == index
        )

    async def _replay(self, index: int, part: Partition) -> None:
        """Rebuild the groups of ``part`` from its records, then answer for them."""
        epoch = part.leader_epoch
        end = part.log.next_offset  # this leader's log is the partition's from now on
        offset = part.log.log_start_offset
        replayed = offsets_log.Replayed()
        while offset < end:
            raw, _ = part.log.read(offset, _REPLAY_CHUNK, end)
            if not len(raw):
                break
            for pos, header in rb.scan(raw):
                decoded = rb.decode(memoryview(raw)[pos : pos + header.size])
                replayed.apply(decoded.values)
                offset = header.base_offset + header.record_count
            await asyncio.sleep(0)  # let other requests through between chunks
            if part.role is not Role.LEADER or part.leader_epoch != epoch:
                return  # placement_changed cancels or restarts this
        for group_id, offsets in replayed.groups.items():
            self._restore(group_id, offsets)
        if replayed.skipped:
            log.warning(
                "kafka: %s: skipped %d unreadable offset records", part.name, replayed.skipped
            )
        self._loading.pop(index, None)
        self._loaded[index] = epoch
        log.info(
            "kafka: coordinating the groups of %s (epoch %d): %d groups replayed",
            part.name,
            epoch,
            len(replayed.groups),
        )

    async def append(self, group_id: str, batch: bytes) -> None:
        """Append ``batch`` to ``group_id``'s partition of the offsets topic (which this
        broker must lead) and wait until every live replica has it."""
        found = self._placement()
        if found is None:
            raise NotLeader("the offsets topic is gone")
        index = offsets_log.coordinator_partition(group_id, found[1])
        topic = self.host.registry.topics.get(found[0])
        part = None if topic is None else topic.partitions.get(index)
        if (
            part is None
            or part.role is not Role.LEADER
            or self._loaded.get(index) != part.leader_epoch
        ):
            raise NotLeader(f"this broker does not coordinate group {group_id!r}")
        header = rb.validate(batch)
        result = appending.append_produced(self.host, part, batch, header, all_replicas=True)
        end = result.base_offset + header.record_count
        if part.log.config.fsync is FsyncPolicy.ALWAYS:
            self.host.committer.wait_durable(part, end)
        try:
            await asyncio.wait_for(part.wait_for_high_watermark(end), COMMIT_TIMEOUT_S)
        except TimeoutError:
            raise RequestTimedOut(f"{part.name}: offsets not replicated in time") from None
        if part.replica_set is not None and len(part.replica_set.lrs) < part.min_in_sync:
            raise NotEnoughReplicas(f"{part.name}: live replica set shrank below minInSync")
