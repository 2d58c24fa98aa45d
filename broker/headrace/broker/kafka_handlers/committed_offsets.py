"""A consumer group's committed offsets: OffsetCommit, OffsetFetch and OffsetDelete.

A group's offsets are a cohort's: every request needs a grant that covers the group's
name on each topic (``require_cohort``). Commits and deletes are written through
``kafka_groups.KafkaGroups`` (in a cluster, to the offsets topic), so they answer later.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from headrace.broker.kafka_handlers.context import (
    KafkaHandlers,
    KafkaRequestContext,
    KafkaRoutes,
)
from headrace.errors import HeadraceError, UnknownTopic
from headrace.kafka import groups
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode, code_of, commit_code_of
from headrace.records.topic_names import canonical_topic_name

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups

log = logging.getLogger(__name__)


class CommittedOffsets(KafkaHandlers):
    def __init__(self, context: KafkaRequestContext, coordinator: KafkaGroups) -> None:
        super().__init__(context)
        self.groups = coordinator

    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.OFFSET_COMMIT: self.offset_commit,
            km.ApiKey.OFFSET_FETCH: self.offset_fetch,
            km.ApiKey.OFFSET_DELETE: self.offset_delete,
        }

    async def offset_commit(
        self, header: km.RequestHeader, req: km.OffsetCommitRequest
    ) -> km.OffsetCommitResponse:
        allowed = self.groups.owner_error(req.group_id)
        if allowed == ErrorCode.NONE:
            allowed = self.groups.may_commit(
                req.group_id,
                req.generation_id,
                req.member_id,
                header.api_version,
                req.group_instance_id,
            )
        accepted: dict[tuple[str, int], groups.Committed] = {}
        topics = []
        for topic in req.topics:
            answer = km.OffsetCommitResponseTopic(topic.name)
            topics.append(answer)
            code = allowed
            if code == ErrorCode.NONE:
                try:
                    # a group's offsets are a cohort's: the grant must cover the group's name
                    self.access.require_cohort(topic.name, req.group_id)
                    self._known_topic(topic.name)
                except HeadraceError as exc:
                    code = code_of(exc)
            for part in topic.partitions:
                answer.partitions.append(
                    km.OffsetCommitResponsePartition(part.partition_index, code)
                )
                if code == ErrorCode.NONE:
                    accepted[(topic.name, part.partition_index)] = groups.Committed(
                        part.committed_offset,
                        part.committed_leader_epoch,
                        part.committed_metadata or "",
                    )
        if accepted:
            try:
                await self.groups.commit(req.group_id, accepted)
            except (OSError, HeadraceError) as exc:
                log.error("kafka: committing offsets of group %r: %s", req.group_id, exc)
                failed = commit_code_of(exc) if isinstance(exc, HeadraceError) else None
                for answer in topics:
                    for part_answer in answer.partitions:
                        part_answer.error_code = failed or ErrorCode.KAFKA_STORAGE_ERROR
        return km.OffsetCommitResponse(0, topics)

    def offset_fetch(
        self, header: km.RequestHeader, req: km.OffsetFetchRequest
    ) -> km.OffsetFetchResponse:
        if header.api_version >= 8:
            # several groups at once (KIP-709), each with its own error
            answers = []
            for group in req.groups:
                code, topics = self._fetch_group(
                    group.group_id, group.topics, group.member_id, group.member_epoch
                )
                answers.append(km.OffsetFetchResponseGroup(group.group_id, topics, code))
            return km.OffsetFetchResponse(0, groups=answers)
        code, topics = self._fetch_group(req.group_id, req.topics, None, -1)
        if code != ErrorCode.NONE:
            # v1 has no group-level code: every partition carries it too
            topics = [
                km.OffsetFetchResponseTopic(
                    t.name,
                    [
                        km.OffsetFetchResponsePartition(i, -1, -1, "", code)
                        for i in t.partition_indexes
                    ],
                )
                for t in req.topics or []
            ]
        return km.OffsetFetchResponse(0, topics, code)

    def _fetch_group(
        self,
        group_id: str,
        asked_topics: list[km.OffsetFetchRequestTopic] | None,
        member_id: str | None,
        member_epoch: int,
    ) -> tuple[ErrorCode, list[km.OffsetFetchResponseTopic]]:
        """One group's committed offsets of ``asked_topics`` (None: every one it has), or
        the group's error and nothing."""
        code = self.groups.owner_error(group_id)
        if code == ErrorCode.NONE:
            code = self.groups.may_fetch(group_id, member_id, member_epoch)
        if code != ErrorCode.NONE:
            return code, []
        committed = self.groups.core.committed(group_id)
        if asked_topics is None:
            asked: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                asked.setdefault(topic, []).append(partition)
        else:
            asked = {t.name: list(t.partition_indexes) for t in asked_topics}
        topics = []
        for name, partitions in asked.items():
            answer = km.OffsetFetchResponseTopic(name)
            topics.append(answer)
            try:
                self.access.require_cohort(name, group_id)
                denied = ErrorCode.NONE
            except HeadraceError as exc:
                denied = code_of(exc)
            for index in partitions:
                found = committed.get((name, index))
                if denied != ErrorCode.NONE or found is None:
                    answer.partitions.append(
                        km.OffsetFetchResponsePartition(index, -1, -1, "", denied)
                    )
                else:
                    answer.partitions.append(
                        km.OffsetFetchResponsePartition(
                            index, found.offset, found.leader_epoch, found.metadata, ErrorCode.NONE
                        )
                    )
        return ErrorCode.NONE, topics

    async def offset_delete(
        self, header: km.RequestHeader, req: km.OffsetDeleteRequest
    ) -> km.OffsetDeleteResponse:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            return km.OffsetDeleteResponse(owner, 0)
        refused: dict[tuple[str, int], ErrorCode] = {}
        asked: list[tuple[str, int]] = []
        for topic in req.topics:
            try:
                # as for commits: the grant must cover the group's name
                self.access.require_cohort(topic.name, req.group_id)
                self._known_topic(topic.name)
                code = ErrorCode.NONE
            except HeadraceError as exc:
                code = code_of(exc)
            for part in topic.partitions:
                if code == ErrorCode.NONE:
                    asked.append((topic.name, part.partition_index))
                else:
                    refused[(topic.name, part.partition_index)] = code
        try:
            code, deleted = await self.groups.delete_offsets(req.group_id, asked)
        except (OSError, HeadraceError) as exc:
            log.error("kafka: deleting offsets of group %r: %s", req.group_id, exc)
            return km.OffsetDeleteResponse(ErrorCode.KAFKA_STORAGE_ERROR, 0)
        if code != ErrorCode.NONE:
            return km.OffsetDeleteResponse(code, 0)
        topics: dict[str, km.OffsetDeleteResponseTopic] = {}
        for (name, index), result in {**deleted, **refused}.items():
            answer = topics.setdefault(name, km.OffsetDeleteResponseTopic(name))
            answer.partitions.append(km.OffsetDeleteResponsePartition(index, result))
        return km.OffsetDeleteResponse(ErrorCode.NONE, 0, list(topics.values()))

    def _known_topic(self, name: str) -> None:
        """Raises ``UnknownTopic`` unless the topic exists (in a cluster: in the pushed
        topology; this broker need not host it)."""
        cluster = self.broker.cluster
        if cluster is None:
            self.broker.registry.get(name)
            return
        canonical = canonical_topic_name(name)
        if not any(t.name == canonical for t in cluster.topics):
            raise UnknownTopic(f"no topic {canonical!r}")
