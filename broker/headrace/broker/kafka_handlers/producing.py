"""Produce and InitProducerId: validate each partition's batch, append it, and answer once
it is as durable as ``acks`` asks.

The hot write path: a request is validated and appended synchronously on the loop,
batch by batch (no record is looked at in Python); only a wait for the high
watermark (acks=all) or for fsync (fsync=always) leaves a callback behind.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Final

from headrace.broker import appending
from headrace.broker.kafka_handlers.context import KafkaHandlers, KafkaRoutes
from headrace.broker.ports import RedirectRequired
from headrace.errors import (
    CorruptBatch,
    HeadraceError,
    InvalidRecordBatch,
    RequestTimedOut,
    UnknownPartition,
)
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode, code_of
from headrace.records import batch as rb
from headrace.security.acl import Operation
from headrace.storage.bookkeeping import FsyncPolicy

if TYPE_CHECKING:
    from headrace.broker.topics import Partition

#: Kafka's acks: none, the leader, every live replica (then minInSync applies)
ACKS_NONE: Final = 0
ACKS_LEADER: Final = 1
ACKS_ALL: Final = -1


class Producing(KafkaHandlers):
    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.PRODUCE: self.produce,
            km.ApiKey.INIT_PRODUCER_ID: init_producer_id,
        }

    def produce(
        self, header: km.RequestHeader, req: km.ProduceRequest
    ) -> km.ProduceResponse | asyncio.Future[km.ProduceResponse]:
        """Every partition's batch appended now; the answer now, or a future of it when
        one of them waits on its replicas or on fsync (acks=0: nobody reads it)."""
        responses: list[km.TopicProduceResponse] = []
        waits: list[asyncio.Future[None]] = []
        for topic in req.topic_data:
            topic_answer = km.TopicProduceResponse(topic.name)
            for data in topic.partition_data:
                answer = km.PartitionProduceResponse(data.index, ErrorCode.NONE, -1)
                topic_answer.partition_responses.append(answer)
                try:
                    fut = self._append(topic.name, data, req, answer)
                except RedirectRequired:
                    answer.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                except HeadraceError as exc:
                    answer.error_code = code_of(exc)
                    answer.error_message = exc.message
                else:
                    if fut is not None:
                        waits.append(fut)
            responses.append(topic_answer)
        body = km.ProduceResponse(responses)
        if not waits:
            return body
        answered: asyncio.Future[km.ProduceResponse] = asyncio.get_running_loop().create_future()
        # the settled futures never fail: each holds its partition's outcome in ``body``
        asyncio.gather(*waits).add_done_callback(lambda _: answered.set_result(body))
        return answered

    def _append(
        self,
        topic_name: str,
        data: km.PartitionProduceData,
        req: km.ProduceRequest,
        answer: km.PartitionProduceResponse,
    ) -> asyncio.Future[None] | None:
        """Validate and append one partition's batch; a future when the answer must wait."""
        if req.transactional_id is not None:
            raise InvalidRecordBatch("transactions are not supported (docs/kafka.md)")
        if req.acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
            answer.error_code = ErrorCode.INVALID_REQUIRED_ACKS
            return None
        self.access.require(Operation.PRODUCE, topic_name)
        topic = self.broker.registry.get(topic_name)
        placement = None
        if self.broker.cluster is not None:
            placement = next((t for t in self.broker.cluster.topics if t.name == topic.name), None)
        if placement is not None and data.index >= placement.routing_partitions:
            # Retired by a shrink (readable, never written again); Metadata no longer lists
            # it, so the producer's refreshed metadata routes its next records elsewhere.
            raise UnknownPartition(
                f"{topic.name}/{data.index} is retired: the topic takes records on"
                f" {placement.routing_partitions} partitions"
            )
        # Kafka producers route by the partition count in Metadata and know no partitioning
        # version: the current one is theirs (docs/kafka.md, repartitions).
        partition = self.broker.partition_for_write(
            topic_name, data.index, topic.partitioning_version
        )
        if data.records is None:
            raise CorruptBatch("no records")
        header = rb.validate_kafka(
            data.records, max_batch_bytes=partition.log.config.max_batch_bytes
        )
        result = appending.append_produced(
            self.broker, partition, data.records, header, all_replicas=req.acks == ACKS_ALL
        )
        answer.base_offset = result.base_offset
        answer.log_start_offset = partition.log.log_start_offset
        end = result.base_offset + header.record_count
        fut: asyncio.Future[None] | None = None
        if req.acks == ACKS_ALL:
            if partition.log.config.fsync is FsyncPolicy.ALWAYS:
                self.broker.committer.wait_durable(partition, end)
            fut = partition.wait_for_high_watermark(end)
        elif req.acks == ACKS_LEADER and partition.log.config.fsync is FsyncPolicy.ALWAYS:
            fut = self.broker.committer.wait_durable(partition, end)
        if fut is None or req.acks == ACKS_NONE:
            return None
        return _settle(fut, partition, answer, req)


def _settle(
    fut: asyncio.Future[None],
    partition: Partition,
    answer: km.PartitionProduceResponse,
    req: km.ProduceRequest,
) -> asyncio.Future[None]:
    """A future that completes (never fails) once ``answer`` holds the outcome."""
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[None] = loop.create_future()
    timer = loop.call_later(max(req.timeout_ms, 0) / 1000, _expire, fut)

    def done(f: asyncio.Future[None]) -> None:
        timer.cancel()
        exc = None if f.cancelled() else f.exception()
        replica_set = partition.replica_set
        if exc is not None:
            answer.error_code = code_of(exc)
            answer.error_message = str(exc)
        elif (
            req.acks == ACKS_ALL
            and replica_set is not None
            and len(replica_set.lrs) < partition.min_in_sync
        ):
            answer.error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        if not settled.done():
            settled.set_result(None)

    fut.add_done_callback(done)
    return settled


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(RequestTimedOut("not replicated in time"))


def init_producer_id(
    header: km.RequestHeader, req: km.InitProducerIdRequest
) -> km.InitProducerIdResponse:
    """A fresh producer id, epoch 0, for an idempotent producer. Our producer state is per
    producer id, as for our own producers (random, never 0); a producer that asks again
    (KIP-360, after a sequence error) gets a new id and starts again at sequence 0."""
    if req.transactional_id is not None:
        return km.InitProducerIdResponse(0, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    return km.InitProducerIdResponse(0, ErrorCode.NONE, secrets.randbits(62) | 1, 0)
