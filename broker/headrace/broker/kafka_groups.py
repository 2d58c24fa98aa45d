"""The Kafka listener's group coordinator: ``kafka.groups`` with a clock, waiters and a disk.

Joins and syncs that must wait are parked as futures under a token; the core's
replies resolve them. A ticker expires sessions and ends rebalances. Committed
offsets are written to ``<data dir>/kafka-groups/`` (one file per group,
replaced atomically and fsynced) before the commit is answered, so a broker
restart keeps them; memberships are not kept, and members rejoin, as Kafka's
clients do when their coordinator forgets them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from pathlib import Path

from headrace import files
from headrace.aio import cancel_and_wait
from headrace.errors import StorageError
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

log = logging.getLogger(__name__)

#: how often sessions and rebalance deadlines are checked
TICK_S = 0.25
_FORMAT = 1


class KafkaGroups:
    def __init__(self, directory: Path) -> None:
        self.core = Coordinator()
        self.directory = directory
        self._waiting: dict[Token, asyncio.Future[JoinAnswer | SyncAnswer]] = {}
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        files.mkdir_durable(self.directory)
        for path in sorted(self.directory.glob("*.json")):
            group_id, offsets = _read(path)
            self.core.restore(group_id, offsets)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def close(self) -> None:
        if self._ticker is not None:
            await cancel_and_wait(self._ticker)
        for fut in self._waiting.values():
            fut.cancel()
        self._waiting.clear()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._deliver(self.core.tick(self._now()))

    def _deliver(self, replies: list[Reply]) -> None:
        for reply in replies:
            fut = self._waiting.pop(reply.token, None)
            if fut is not None and not fut.done():
                fut.set_result(reply.answer)

    def _park(self) -> tuple[Token, asyncio.Future[JoinAnswer | SyncAnswer]]:
        token = object()
        fut: asyncio.Future[JoinAnswer | SyncAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        return token, fut

    async def join(self, ask: JoinAsk) -> JoinAnswer:
        token, fut = self._park()
        new_id = f"{ask.client_id or 'member'}-{uuid.uuid4()}"
        self._deliver(self.core.join(self._now(), token, ask, new_id))
        try:
            answer = await fut
        finally:
            self._waiting.pop(token, None)
        assert isinstance(answer, JoinAnswer)
        return answer

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]
    ) -> SyncAnswer:
        token, fut = self._park()
        self._deliver(
            self.core.sync(self._now(), token, group_id, generation, member_id, assignments)
        )
        try:
            answer = await fut
        finally:
            self._waiting.pop(token, None)
        assert isinstance(answer, SyncAnswer)
        return answer

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        return self.core.heartbeat(self._now(), group_id, generation, member_id)

    def leave(self, group_id: str, member_id: str) -> int:
        code, replies = self.core.leave(self._now(), group_id, member_id)
        self._deliver(replies)
        return code

    def commit(self, group_id: str, offsets: dict[tuple[str, int], Committed]) -> None:
        """Record and persist ``offsets`` (the caller has checked ``core.may_commit``)."""
        for (topic, partition), committed in offsets.items():
            self.core.commit(group_id, topic, partition, committed)
        self._write(group_id)

    def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """Forget committed offsets (``core.delete_offsets``) and persist what is left."""
        code, results = self.core.delete_offsets(group_id, partitions)
        if ErrorCode.NONE in results.values():
            self._write(group_id)
        return code, results

    def delete(self, group_id: str) -> int:
        code = self.core.delete(group_id)
        if code == 0:
            self._path(group_id).unlink(missing_ok=True)
        return code

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
