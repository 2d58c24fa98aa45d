"""Fetch: read each asked partition up to its high watermark, from the local log or the
object store, and long-poll until ``min_bytes`` arrive or ``max_wait_ms`` passes.

The hot read path: records are served batch by batch; a Kafka batch goes out as
stored (Kafka's prefix, then a view of its body), one of ours is converted column by
column (``kafka.convert``). No record is looked at in Python.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Final

from headrace.broker.kafka_handlers.context import KafkaHandlers, KafkaRoutes
from headrace.broker.ports import RedirectRequired
from headrace.errors import CorruptBatch, HeadraceError, OffsetOutOfRange
from headrace.kafka import messages as km
from headrace.kafka.convert import to_kafka
from headrace.kafka.errors import ErrorCode, code_of
from headrace.records import batch as rb
from headrace.security.acl import Operation

if TYPE_CHECKING:
    from headrace.broker.topics import Partition

log = logging.getLogger(__name__)

#: the buffers of a batch as Kafka's, written to the socket in order without a join
Parts = list[bytes | bytearray | memoryview]

#: fresh object-store reads one fetch may make when retention overtakes it
_TIERED_RETRIES: Final = 3
#: a fetch never parks longer than this, whatever it asks
_MAX_WAIT_MS: Final = 60_000


class _Pass(enum.Enum):
    OK = "ok"
    ERROR = "error"
    TIERED = "tiered"


class Fetching(KafkaHandlers):
    def routes(self) -> KafkaRoutes:
        return {km.ApiKey.FETCH: self.fetch}

    async def fetch(self, header: km.RequestHeader, req: km.FetchRequest) -> km.FetchResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req.max_wait_ms, 0), _MAX_WAIT_MS) / 1000
        wake = asyncio.Event()

        def on_change(_: object = None) -> None:
            wake.set()

        watched: list[Partition] = []
        # Offsets below a local log are read from the object store once, before the first
        # pass: they exist, so nothing about them waits.
        tiered = await self._read_tiered(req)
        retries = _TIERED_RETRIES
        try:
            while True:
                wake.clear()
                body, size, found = self._read_all(req, watched, tiered, retries > 0)
                if found is _Pass.TIERED:
                    # retention moved a local log start past an asked offset since the
                    # object store was read: read it there again
                    retries -= 1
                    watched.clear()
                    tiered = await self._read_tiered(req)
                    continue
                if found is _Pass.ERROR or size >= max(req.min_bytes, 1) or loop.time() >= deadline:
                    return body
                for part in watched:
                    part.add_listener(on_change)
                try:
                    await asyncio.wait_for(wake.wait(), deadline - loop.time())
                except TimeoutError:
                    pass
                finally:
                    for part in watched:
                        part.remove_listener(on_change)
                watched.clear()
        finally:
            for part in watched:
                part.remove_listener(on_change)

    async def _read_tiered(self, req: km.FetchRequest) -> dict[tuple[str, int], bytes]:
        """The object store's batches for each asked offset older than its local log (an
        error is left for ``_read_all`` to answer, as for any offset out of range)."""
        out: dict[tuple[str, int], bytes] = {}
        for topic in req.topics:
            for asked in topic.partitions:
                try:
                    self.access.require(Operation.CONSUME, topic.topic)
                    part = self.broker.partition_for_read(topic.topic, asked.partition)
                except (RedirectRequired, HeadraceError):
                    continue
                if part.tiering is None or asked.fetch_offset >= part.log.log_start_offset:
                    continue
                try:
                    out[(topic.topic, asked.partition)] = await self.broker.tiering.read(
                        part, asked.fetch_offset, max(asked.partition_max_bytes, 1)
                    )
                except HeadraceError as exc:
                    log.info(
                        "kafka: tiered read of %s at %d: %s", part.name, asked.fetch_offset, exc
                    )
        return out

    def _read_all(
        self,
        req: km.FetchRequest,
        watched: list[Partition],
        tiered: dict[tuple[str, int], bytes],
        may_retier: bool,
    ) -> tuple[km.FetchResponse, int, _Pass]:
        """One pass over the asked partitions: (response, record bytes, what the pass found:
        an error to report, an offset to read from the object store first, or neither)."""
        budget = req.max_bytes if req.max_bytes > 0 else 0x7FFFFFFF
        total = 0
        errored = False
        responses = []
        for topic in req.topics:
            answer = km.FetchableTopicResponse(topic.topic)
            responses.append(answer)
            for asked in topic.partitions:
                data = km.FetchPartitionData(asked.partition, ErrorCode.NONE, -1, records=b"")
                answer.partitions.append(data)
                try:
                    self.access.require(Operation.CONSUME, topic.topic)
                    part = self.broker.partition_for_read(topic.topic, asked.partition)
                except RedirectRequired:
                    data.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    errored = True
                    continue
                except HeadraceError as exc:
                    data.error_code = code_of(exc)
                    errored = True
                    continue
                watched.append(part)
                hw = part.high_watermark
                data.high_watermark = hw
                data.last_stable_offset = hw
                data.log_start_offset = self.broker.tiering.earliest(part)
                offset = asked.fetch_offset
                stored = tiered.get((topic.topic, asked.partition))
                below = offset < part.log.log_start_offset
                if stored is None and below and part.tiering is not None and may_retier:
                    return km.FetchResponse(0, 0, 0, []), 0, _Pass.TIERED
                if (
                    stored is None
                    and not part.log.log_start_offset <= offset <= part.log.next_offset
                ):
                    # Below every copy, or past the log end; between the HW and the end it
                    # waits, as against Kafka.
                    data.error_code = code_of(OffsetOutOfRange())
                    errored = True
                    continue
                limit = min(asked.partition_max_bytes, budget - total)
                if limit <= 0 and total > 0:
                    continue
                if stored is not None:
                    raw: bytes | memoryview = stored  # below the local log: the object store's
                else:
                    # Both isolation levels read up to the HW, as in Kafka: there are no
                    # transactions, so the last stable offset is the HW.
                    raw, _ = part.log.read(offset, max(limit, 1), hw)
                try:
                    parts, size = _as_kafka_batches(raw)
                except CorruptBatch as exc:
                    log.error("%s/%d at %d: %s", topic.topic, asked.partition, offset, exc)
                    data.error_code = ErrorCode.CORRUPT_MESSAGE
                    errored = True
                    continue
                data.records = parts
                total += size
        self.broker.metrics.fetched_bytes.inc(total)
        return km.FetchResponse(0, 0, 0, responses), total, _Pass.ERROR if errored else _Pass.OK


def _as_kafka_batches(raw: bytes | memoryview) -> tuple[Parts, int]:
    """The batches of ``raw`` as Kafka's: a Kafka batch is served as stored, with Kafka's
    prefix (no body copy); one of ours is converted (``kafka.convert``: column by column)."""
    view = memoryview(raw)
    parts: Parts = []
    size = 0
    for pos, header in rb.scan(view):
        if header.magic == rb.KAFKA_MAGIC:
            parts.append(rb.kafka_prefix(header))
            parts.append(view[pos + 16 : pos + header.size])
            size += header.size
        else:
            converted = to_kafka(view[pos : pos + header.size])
            parts.append(converted)
            size += len(converted)
    return parts, size
