"""The Kafka listener's group coordinator: ``kafka.groups`` with a clock, waiters and storage.

Joins and syncs that must wait are parked as futures under a token; the core's
replies resolve them. A ticker expires sessions and ends rebalances.

Where committed offsets are kept, and who coordinates a group:

* standalone: this broker coordinates every group; its offsets are kept in files
  (``kafka_group_files``);
* cluster mode: the leader of the group's partition of the offsets topic does, and
  keeps them there (``kafka_offsets_topic``).

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
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from headrace import clock
from headrace.aio import cancel_and_wait
from headrace.broker.kafka_group_files import GroupOffsetFiles
from headrace.broker.kafka_offsets_topic import OffsetsTopic
from headrace.errors import HeadraceError
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

if TYPE_CHECKING:
    from headrace.broker.ports import ConnectionHost

log = logging.getLogger(__name__)

#: how often sessions and rebalance deadlines are checked
TICK_S = 0.25


class KafkaGroups:
    """``host``: the broker in cluster mode (offsets in the offsets topic); None for a
    standalone broker (offsets in files under ``directory``)."""

    def __init__(self, directory: Path, host: ConnectionHost | None = None) -> None:
        self.core = Coordinator()
        self.consumer = consumer_groups.ConsumerGroups()
        #: where committed offsets are kept: files standalone; in a cluster the offsets
        #: topic, whose placement also says which groups are coordinated here
        self._store: GroupOffsetFiles | OffsetsTopic = (
            GroupOffsetFiles(directory)
            if host is None
            else OffsetsTopic(host, restore=self.core.restore, give_up=self._give_up)
        )
        self._waiting: dict[Token, asyncio.Future[JoinAnswer | SyncAnswer]] = {}
        #: the group each parked token waits in (to answer it when the group moves away)
        self._parked_in: dict[Token, str] = {}
        self._ticker: asyncio.Task[None] | None = None
        #: groups whose commits are being appended: one at a time per group, so the
        #: offsets topic holds them in the order the core applies them
        self._commit_locks: dict[str, asyncio.Lock] = {}

    def start(self) -> None:
        if isinstance(self._store, GroupOffsetFiles):
            for group_id, offsets in self._store.load():
                self.core.restore(group_id, offsets)
        else:
            self._store.placement_changed()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def close(self) -> None:
        await cancel_and_wait(self._ticker)
        if isinstance(self._store, OffsetsTopic):
            await self._store.close()
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
        if isinstance(self._store, GroupOffsetFiles):
            for (topic, partition), committed in offsets.items():
                self.core.commit(group_id, topic, partition, committed)
            self._store.write(group_id, self.core.committed(group_id))
            return
        # kept while the group is coordinated here (``_give_up`` drops it): a lock
        # dropped while a commit waits on it would let the next one run beside it
        lock = self._commit_locks.setdefault(group_id, asyncio.Lock())
        async with lock:
            batch = offsets_log.commit_batch(group_id, offsets, clock.wall_ms())
            await self._store.append(group_id, batch)
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
        if isinstance(self._store, GroupOffsetFiles):
            self._store.write(group_id, self.core.committed(group_id))
            return code, results
        batch = offsets_log.offsets_deletion_batch(group_id, gone, clock.wall_ms())
        try:
            await self._store.append(group_id, batch)
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
        if isinstance(self._store, GroupOffsetFiles):
            self._store.remove(group_id)
            return code
        batch = offsets_log.deletion_batch(group_id, clock.wall_ms())
        try:
            await self._store.append(group_id, batch)
        except HeadraceError as exc:
            log.error("kafka: deleting group %r: %s", group_id, exc)
            self.core.restore(group_id, kept)  # still in the log: it must stay here too
            return ErrorCode.KAFKA_STORAGE_ERROR
        return code

    # ------------------------------------------------------------------ who coordinates

    def owner_error(self, group_id: str) -> ErrorCode:
        """NONE if this broker answers for ``group_id`` now; else what to tell its client."""
        if isinstance(self._store, GroupOffsetFiles):
            return ErrorCode.NONE
        return self._store.owner_error(group_id)

    def find(
        self, group_id: str, me: tuple[int, KafkaAddress]
    ) -> tuple[ErrorCode, str | None, int, KafkaAddress | None]:
        """FindCoordinator: (error, message, node id, its Kafka address). ``me``: this
        broker's id and Kafka address (the standalone answer)."""
        if isinstance(self._store, GroupOffsetFiles):
            return ErrorCode.NONE, None, me[0], me[1]
        return self._store.find(group_id)

    def placement_changed(self) -> None:
        """Cluster mode: take up the groups of the offsets-topic partitions this broker
        now leads, and give up those of the ones it no longer leads."""
        if isinstance(self._store, OffsetsTopic):
            self._store.placement_changed()

    def _give_up(self, index: int, belongs: Callable[[str], bool]) -> None:
        """Forget the groups of offsets-topic partition ``index`` (another broker leads it
        now); their parked joins and syncs are told ``NOT_COORDINATOR``."""
        gone = {g for g in self.core.groups if belongs(g)}
        for token, group_id in list(self._parked_in.items()):
            if group_id not in gone:
                continue
            del self._parked_in[token]
            fut = self._waiting.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(JoinAnswer(ErrorCode.NOT_COORDINATOR))
        gone |= {g for g in self.consumer.groups if belongs(g)}
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
