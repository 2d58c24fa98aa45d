"""The Kafka listener's group coordinator: ``kafka.groups`` with a clock, waiters and storage.

Joins and syncs that must wait are parked as futures under a token; the core's
replies resolve them. A ticker expires sessions and ends rebalances.

Where committed offsets are kept, and who coordinates a group:

* standalone: this broker coordinates every group; offsets are written to
  ``<data dir>/kafka-groups/`` (one file per group, replaced atomically and
  fsynced) before the commit is answered, so a broker restart keeps them;
* cluster mode: the leader of the offsets topic's partition
  ``offsets_log.coordinator_partition(group, N)`` coordinates the group. A commit
  is a batch appended there and answered once the high watermark passes it (as an
  ``acks=all`` produce); a broker that becomes that partition's leader replays it
  before it answers for the partition's groups (``COORDINATOR_LOAD_IN_PROGRESS``
  meanwhile), and one that stops leading it forgets them (``NOT_COORDINATOR``:
  clients find the new coordinator and rejoin).

Memberships are never kept (static ones neither): members of a restarted or new coordinator get
``UNKNOWN_MEMBER_ID`` and rejoin, as Kafka's clients do.

Both group protocols are coordinated here: the classic one (``kafka.groups``) and the
consumer protocol of KIP-848 (``kafka.consumer_groups``, in ``consumer``). A group id
is one protocol's while it has members: a classic join to a consumer-protocol group
is ``INCONSISTENT_GROUP_PROTOCOL``, a consumer heartbeat to a classic group is
``GROUP_ID_NOT_FOUND``, as Kafka's coordinator answers (it has no online conversion
here). Committed offsets are the group's whatever its protocol, in one store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from headrace import clock, files
from headrace.aio import cancel_and_wait
from headrace.broker import appending
from headrace.broker.topics import Role
from headrace.errors import (
    HeadraceError,
    NotEnoughReplicas,
    NotLeader,
    RequestTimedOut,
    StorageError,
)
from headrace.kafka import consumer_groups, offsets_log
from headrace.kafka.errors import ErrorCode
from headrace.kafka.groups import (
    Committed,
    Coordinator,
    JoinAnswer,
    JoinAsk,
    Reply,
    SyncAnswer,
    Token,
)
from headrace.protocol.endpoints import KafkaAddress
from headrace.records import batch as rb
from headrace.records.topic_names import canonical_topic_name
from headrace.storage.bookkeeping import FsyncPolicy

if TYPE_CHECKING:
    from headrace.broker.ports import ConnectionHost
    from headrace.broker.topics import Partition

log = logging.getLogger(__name__)

#: how often sessions and rebalance deadlines are checked
TICK_S = 0.25
_FORMAT = 1
#: how long a commit waits for the offsets topic's replicas (Kafka's
#: ``offsets.commit.timeout.ms``), then is answered ``REQUEST_TIMED_OUT``
COMMIT_TIMEOUT_S = 5.0
#: bytes read per step while a new coordinator replays its partition
_REPLAY_CHUNK = 1 << 20


class KafkaGroups:
    """``host``: the broker in cluster mode (offsets in the offsets topic); None for a
    standalone broker (offsets in files under ``directory``)."""

    def __init__(self, directory: Path, host: ConnectionHost | None = None) -> None:
        self.core = Coordinator()
        self.consumer = consumer_groups.ConsumerGroups()
        self.directory = directory
        self.host = host
        self._waiting: dict[Token, asyncio.Future[JoinAnswer | SyncAnswer]] = {}
        #: the group each parked token waits in (to answer it when the group moves away)
        self._parked_in: dict[Token, str] = {}
        self._ticker: asyncio.Task[None] | None = None
        #: cluster mode: offsets-topic partition -> the leader epoch its groups were
        #: replayed at (answering), or are being replayed at (``_loading``)
        self._loaded: dict[int, int] = {}
        self._loading: dict[int, tuple[int, asyncio.Task[None]]] = {}
        #: groups whose commits are being appended: one at a time per group, so the
        #: offsets topic holds them in the order the core applies them
        self._commit_locks: dict[str, asyncio.Lock] = {}

    def start(self) -> None:
        if self.host is None:
            files.mkdir_durable(self.directory)
            for path in sorted(self.directory.glob("*.json")):
                group_id, offsets = _read(path)
                self.core.restore(group_id, offsets)
        else:
            self.placement_changed()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def close(self) -> None:
        await cancel_and_wait(self._ticker, *(task for _, task in self._loading.values()))
        self._loading.clear()
        for fut in self._waiting.values():
            fut.cancel()
        self._waiting.clear()
        self._parked_in.clear()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = self._now()
            self._deliver(self.core.tick(now))
            for group_id, member_id in self.consumer.tick(now):
                log.info("kafka: group %r: member %s expired", group_id, member_id)

    def _deliver(self, replies: list[Reply]) -> None:
        for reply in replies:
            self._parked_in.pop(reply.token, None)
            fut = self._waiting.pop(reply.token, None)
            if fut is not None and not fut.done():
                fut.set_result(reply.answer)

    def _park(self, group_id: str) -> tuple[Token, asyncio.Future[JoinAnswer | SyncAnswer]]:
        token = object()
        fut: asyncio.Future[JoinAnswer | SyncAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        self._parked_in[token] = group_id
        return token, fut

    async def join(self, ask: JoinAsk) -> JoinAnswer:
        if self.consumer.has_members(ask.group_id):
            return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=ask.member_id)
        self.consumer.groups.pop(ask.group_id, None)  # an empty one: the id is classic now
        token, fut = self._park(ask.group_id)
        new_id = f"{ask.client_id or 'member'}-{uuid.uuid4()}"
        self._deliver(self.core.join(self._now(), token, ask, new_id))
        try:
            answer = await fut
        finally:
            self._waiting.pop(token, None)
            self._parked_in.pop(token, None)
        assert isinstance(answer, JoinAnswer)
        return answer

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        instance_id: str | None = None,
    ) -> SyncAnswer:
        token, fut = self._park(group_id)
        self._deliver(
            self.core.sync(
                self._now(), token, group_id, generation, member_id, assignments, instance_id
            )
        )
        try:
            answer = await fut
        finally:
            self._waiting.pop(token, None)
            self._parked_in.pop(token, None)
        if isinstance(answer, JoinAnswer):  # the group moved to another coordinator
            return SyncAnswer(answer.error)
        return answer

    def consumer_heartbeat(
        self, ask: consumer_groups.HeartbeatAsk, topics: consumer_groups.TopicView
    ) -> consumer_groups.HeartbeatAnswer:
        """A ConsumerGroupHeartbeat (the caller has checked ``owner_error``)."""
        classic = self.core.groups.get(ask.group_id)
        if classic is not None and classic.members:
            return consumer_groups.HeartbeatAnswer(
                ErrorCode.GROUP_ID_NOT_FOUND, f"group {ask.group_id!r} is a classic group"
            )
        return self.consumer.heartbeat(self._now(), ask, topics, str(uuid.uuid4()))

    def may_commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        version: int,
        instance_id: str | None = None,
    ) -> ErrorCode:
        """Whether an OffsetCommit is accepted: by the consumer protocol's rules (member
        epochs) while it has members, else by the classic ones (generations)."""
        if self.consumer.has_members(group_id):
            return self.consumer.may_commit(group_id, member_id, generation, version)
        return self.core.may_commit(group_id, generation, member_id, instance_id)

    def may_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """Whether an OffsetFetch is answered: a consumer-protocol member's (v9) must carry
        its current epoch; a classic group's and an admin's always are."""
        return self.consumer.may_fetch(group_id, member_id, member_epoch)

    def listed(self) -> list[tuple[str, str]]:
        """ListGroups: (group id, protocol type) of every group, either protocol."""
        found = {g.group_id: g.protocol_type for g in self.core.groups.values()}
        for group_id in self.consumer.groups:
            found[group_id] = "consumer"
        return sorted(found.items())

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> int:
        return self.core.heartbeat(self._now(), group_id, generation, member_id, instance_id)

    def leave(self, group_id: str, member_id: str, instance_id: str | None = None) -> int:
        code, replies = self.core.leave(self._now(), group_id, member_id, instance_id)
        self._deliver(replies)
        return code

    async def commit(self, group_id: str, offsets: dict[tuple[str, int], Committed]) -> None:
        """Persist and record ``offsets`` (the caller has checked ``core.may_commit``).
        Raises ``HeadraceError`` (or ``OSError`` standalone) when they are not stored."""
        if self.host is None:
            for (topic, partition), committed in offsets.items():
                self.core.commit(group_id, topic, partition, committed)
            self._write(group_id)
            return
        # kept while the group is coordinated here (``_give_up`` drops it): a lock
        # dropped while a commit waits on it would let the next one run beside it
        lock = self._commit_locks.setdefault(group_id, asyncio.Lock())
        async with lock:
            batch = offsets_log.commit_batch(group_id, offsets, clock.wall_ms())
            await self._append(group_id, batch)
            for (topic, partition), committed in offsets.items():
                self.core.commit(group_id, topic, partition, committed)

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """Forget committed offsets (``core.delete_offsets``) and persist it: the group's
        file on a standalone broker, a deletion record per partition in a cluster."""
        kept = self.core.committed(group_id)
        code, results = self.core.delete_offsets(group_id, partitions)
        gone = [where for where, result in results.items() if result == ErrorCode.NONE]
        if not gone:
            return code, results
        if self.host is None:
            self._write(group_id)
            return code, results
        batch = offsets_log.offsets_deletion_batch(group_id, gone, clock.wall_ms())
        try:
            await self._append(group_id, batch)
        except HeadraceError:
            self.core.restore(group_id, kept)  # still in the log: they must stay here too
            raise
        return code, results

    async def delete(self, group_id: str) -> int:
        if self.consumer.has_members(group_id):
            return ErrorCode.NON_EMPTY_GROUP
        dropped = self.consumer.groups.pop(group_id, None)
        kept = self.core.committed(group_id)
        code = self.core.delete(group_id)
        if code == ErrorCode.GROUP_ID_NOT_FOUND and dropped is not None:
            return ErrorCode.NONE  # a consumer-protocol group that never committed
        if code != ErrorCode.NONE:
            return code
        if self.host is None:
            self._path(group_id).unlink(missing_ok=True)
            return code
        try:
            await self._append(group_id, offsets_log.deletion_batch(group_id, clock.wall_ms()))
        except HeadraceError as exc:
            log.error("kafka: deleting group %r: %s", group_id, exc)
            self.core.restore(group_id, kept)  # still in the log: it must stay here too
            return ErrorCode.KAFKA_STORAGE_ERROR
        return code

    # ------------------------------------------------------------------ cluster mode

    def _offsets_placement(self) -> tuple[str, int] | None:
        """(the offsets topic's canonical name, its partition count) in the pushed topology."""
        assert self.host is not None
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
        assert self.host is not None
        found = self._offsets_placement()
        if found is None or self.host.cluster is None:
            return None
        name, count = found
        index = offsets_log.coordinator_partition(group_id, count)
        placement = next(t for t in self.host.cluster.topics if t.name == name)
        leader = next((a.leader for a in placement.assignments if a.partition == index), None)
        return index, leader

    def owner_error(self, group_id: str) -> ErrorCode:
        """NONE if this broker answers for ``group_id`` now; else what to tell its client."""
        if self.host is None:
            return ErrorCode.NONE
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

    def find(
        self, group_id: str, me: tuple[int, KafkaAddress]
    ) -> tuple[ErrorCode, str | None, int, KafkaAddress | None]:
        """FindCoordinator: (error, message, node id, its Kafka address). ``me``: this
        broker's id and Kafka address (the standalone answer)."""
        if self.host is None:
            return ErrorCode.NONE, None, me[0], me[1]
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
        if self.host is None:
            return
        led: dict[int, Partition] = {}
        found = self._offsets_placement()
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
                self._give_up(index)
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

    def _give_up(self, index: int) -> None:
        """Forget the groups of offsets-topic partition ``index`` (another broker leads it
        now); their parked joins and syncs are told ``NOT_COORDINATOR``."""
        found = self._offsets_placement()
        count = found[1] if found is not None else 0
        gone = {
            g
            for g in self.core.groups
            if count <= 0 or offsets_log.coordinator_partition(g, count) == index
        }
        for token, group_id in list(self._parked_in.items()):
            if group_id not in gone:
                continue
            del self._parked_in[token]
            fut = self._waiting.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(JoinAnswer(ErrorCode.NOT_COORDINATOR))
        gone |= {
            g
            for g in self.consumer.groups
            if count <= 0 or offsets_log.coordinator_partition(g, count) == index
        }
        for group_id in gone:
            self.core.groups.pop(group_id, None)
            self.consumer.groups.pop(group_id, None)
        for group_id in [g for g in self._commit_locks if g not in self.core.groups]:
            if not self._commit_locks[group_id].locked():
                del self._commit_locks[group_id]
        if gone:
            log.info(
                "kafka: no longer coordinating %d groups (offsets partition %d)", len(gone), index
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
            self.core.restore(group_id, offsets)
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

    async def _append(self, group_id: str, batch: bytes) -> None:
        """Append ``batch`` to ``group_id``'s partition of the offsets topic (which this
        broker must lead) and wait until every live replica has it."""
        assert self.host is not None
        found = self._offsets_placement()
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

    # ------------------------------------------------------------------ standalone files

    def _path(self, group_id: str) -> Path:
        # group ids are any string: the file is named by a digest, the id kept inside
        digest = hashlib.blake2b(group_id.encode(), digest_size=16).hexdigest()
        return self.directory / f"{digest}.json"

    def _write(self, group_id: str) -> None:
        doc = {
            "format": _FORMAT,
            "group": group_id,
            "offsets": [
                [topic, partition, c.offset, c.leader_epoch, c.metadata]
                for (topic, partition), c in sorted(self.core.committed(group_id).items())
            ],
        }
        files.write_atomic(self._path(group_id), json.dumps(doc).encode())


def _read(path: Path) -> tuple[str, dict[tuple[str, int], Committed]]:
    try:
        doc = json.loads(path.read_bytes())
        if doc["format"] != _FORMAT:
            raise StorageError(f"{path}: committed offsets in format {doc['format']}")
        offsets = {
            (str(topic), int(partition)): Committed(int(offset), int(epoch), str(metadata))
            for topic, partition, offset, epoch, metadata in doc["offsets"]
        }
        return str(doc["group"]), offsets
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{path}: unreadable committed offsets: {exc}") from exc
