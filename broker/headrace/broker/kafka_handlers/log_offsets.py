"""ListOffsets and OffsetForLeaderEpoch: where records sit in a partition's log (the first,
the high watermark, the one at a timestamp, the end of a leader epoch)."""

from __future__ import annotations

import logging

from headrace.broker.cohort_admin import offset_for_timestamp, offset_of_max_timestamp
from headrace.broker.kafka_handlers.context import KafkaHandlers, KafkaRoutes
from headrace.broker.ports import RedirectRequired
from headrace.errors import HeadraceError
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode, code_of
from headrace.security.acl import Operation

log = logging.getLogger(__name__)


class LogOffsets(KafkaHandlers):
    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.LIST_OFFSETS: self.list_offsets,
            km.ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
        }

    def list_offsets(
        self, header: km.RequestHeader, req: km.ListOffsetsRequest
    ) -> km.ListOffsetsResponse:
        topics = []
        for topic in req.topics:
            answer = km.ListOffsetsTopicResponse(topic.name)
            topics.append(answer)
            for asked in topic.partitions:
                result = km.ListOffsetsPartitionResponse(asked.partition_index, ErrorCode.NONE)
                answer.partitions.append(result)
                self._list_offset(header.api_version, topic.name, asked, result)
        return km.ListOffsetsResponse(0, topics)

    def _list_offset(
        self,
        version: int,
        topic: str,
        asked: km.ListOffsetsPartition,
        result: km.ListOffsetsPartitionResponse,
    ) -> None:
        """Fill ``result`` with the offset ``asked`` names, or the error that stops it."""
        try:
            self.access.require(Operation.CONSUME, topic)
            part = self.broker.partition_for_read(topic, asked.partition_index)
        except RedirectRequired:
            result.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return
        except HeadraceError as exc:
            result.error_code = code_of(exc)
            return
        result.leader_epoch = part.leader_epoch
        # the object store's first offset when it holds older records than the disk
        earliest = self.broker.tiering.earliest(part)
        if asked.timestamp == km.EARLIEST_TIMESTAMP:
            result.offset = earliest
        elif asked.timestamp == km.LATEST_TIMESTAMP:
            result.offset = part.high_watermark
        elif asked.timestamp == km.MAX_TIMESTAMP and version >= 7:
            # exact: the record's own offset and timestamp, committed records only
            try:
                found = offset_of_max_timestamp(part, part.high_watermark)
            except HeadraceError as exc:  # its batch could not be decoded
                log.warning("kafka: max timestamp of %s: %s", part.name, exc)
                result.error_code = code_of(exc)
                return
            if found is None:
                result.leader_epoch = -1  # no record: offset, timestamp, epoch all -1
            else:
                result.offset, result.timestamp = found.offset, found.timestamp
                result.leader_epoch = found.leader_epoch
        elif asked.timestamp < 0:
            result.error_code = ErrorCode.UNSUPPORTED_VERSION
        else:
            # Batch granularity: the first batch holding a record at or after it.
            offset = offset_for_timestamp(part, asked.timestamp, earliest)
            if offset < part.high_watermark:
                result.offset = offset
                result.timestamp = asked.timestamp

    def offset_for_leader_epoch(
        self, header: km.RequestHeader, req: km.OffsetForLeaderEpochRequest
    ) -> km.OffsetForLeaderEpochResponse:
        return km.OffsetForLeaderEpochResponse(
            0,
            [
                km.OffsetForLeaderTopicResult(
                    t.topic, [self._epoch_end(t.topic, p) for p in t.partitions]
                )
                for t in req.topics
            ],
        )

    def _epoch_end(self, topic: str, asked: km.OffsetForLeaderPartition) -> km.EpochEndOffset:
        """Where ``asked.leader_epoch`` ended in this leader's log: the start of the next
        epoch, or the log end for the current one (what a consumer checks its position
        against after a leader change, KIP-320)."""
        try:
            self.access.require(Operation.CONSUME, topic)
            part = self.broker.partition_for_read(topic, asked.partition)
        except RedirectRequired:
            return km.EpochEndOffset(ErrorCode.NOT_LEADER_OR_FOLLOWER, asked.partition)
        except HeadraceError as exc:
            return km.EpochEndOffset(code_of(exc), asked.partition)
        current = part.leader_epoch
        if asked.current_leader_epoch > current:
            return km.EpochEndOffset(ErrorCode.UNKNOWN_LEADER_EPOCH, asked.partition)
        if 0 <= asked.current_leader_epoch < current:
            return km.EpochEndOffset(ErrorCode.FENCED_LEADER_EPOCH, asked.partition)
        if asked.leader_epoch < 0 or asked.leader_epoch > current:
            return km.EpochEndOffset(ErrorCode.NONE, asked.partition)  # undefined: -1, -1
        if part.log.epochs is None:  # a standalone log has one epoch, its leader's
            return km.EpochEndOffset(ErrorCode.NONE, asked.partition, current, part.log.next_offset)
        epoch, end = part.log.epochs.end_offset_for(asked.leader_epoch, part.log.next_offset)
        if epoch < 0:
            # Older than every epoch this copy knows (a partition an Unload reopened here,
            # its offsets continuing; or retention took the epoch's records): it ended
            # where the first known one starts. Kafka answers so; an undefined epoch makes
            # a consumer reset its position, as if the log had been truncated.
            epoch = asked.leader_epoch
        return km.EpochEndOffset(ErrorCode.NONE, asked.partition, epoch, end)
