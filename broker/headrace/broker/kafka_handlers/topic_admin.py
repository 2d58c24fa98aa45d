"""Topic administration through the Kafka API: CreateTopics, DeleteTopics and
CreatePartitions, checked as Kafka checks them and carried out by the broker."""

from __future__ import annotations

from headrace.broker.kafka_handlers.context import KafkaHandlers, KafkaRoutes
from headrace.broker.topics import MAX_PARTITIONS, topic_log_config
from headrace.errors import HeadraceError, InvalidTopicSpec, UnknownTopic
from headrace.kafka import configs
from headrace.kafka import messages as km
from headrace.kafka import partitions as partition_counts
from headrace.kafka.errors import ErrorCode, code_of
from headrace.kafka.topic_ids import kafka_topic_name
from headrace.records.topic_names import canonical_topic_name
from headrace.security.acl import Operation
from headrace.storage.bookkeeping import LogConfig


class TopicAdmin(KafkaHandlers):
    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.CREATE_TOPICS: self.create_topics,
            km.ApiKey.DELETE_TOPICS: self.delete_topics,
            km.ApiKey.CREATE_PARTITIONS: self.create_partitions,
        }

    def create_topics(
        self, header: km.RequestHeader, req: km.CreateTopicsRequest
    ) -> km.CreateTopicsResponse:
        return km.CreateTopicsResponse(0, [self._create_topic(t, req) for t in req.topics])

    def _create_topic(
        self, topic: km.CreatableTopic, req: km.CreateTopicsRequest
    ) -> km.CreatableTopicResult:
        def refused(code: ErrorCode, why: str) -> km.CreatableTopicResult:
            return km.CreatableTopicResult(topic.name, code, why)

        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            return refused(
                ErrorCode.INVALID_PARTITIONS, f"partitions must be between 1 and {MAX_PARTITIONS}"
            )
        if topic.replication_factor not in (-1, 1):
            return refused(
                ErrorCode.INVALID_REPLICATION_FACTOR, "a standalone broker keeps one replica"
            )
        if topic.assignments:
            return refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replica assignments are not supported"
            )
        try:
            canonical_topic_name(topic.name)
            self.access.require(Operation.ADMIN, topic.name)
        except HeadraceError as exc:
            return refused(code_of(exc), exc.message)
        try:
            settings = configs.topic_settings((c.name, c.value) for c in topic.configs)
            topic_log_config(LogConfig(), dict(settings))
        except InvalidTopicSpec as exc:
            return refused(ErrorCode.INVALID_CONFIG, exc.message)
        if req.validate_only:
            if kafka_topic_name(canonical_topic_name(topic.name)) in self._topic_names():
                return refused(ErrorCode.TOPIC_ALREADY_EXISTS, f"{topic.name} exists")
            return km.CreatableTopicResult(topic.name, ErrorCode.NONE)
        try:
            self.broker.create_topic(topic.name, partitions, dict(settings))
        except HeadraceError as exc:
            return refused(code_of(exc), exc.message)
        return km.CreatableTopicResult(topic.name, ErrorCode.NONE)

    def _topic_names(self) -> set[str]:
        return {kafka_topic_name(name) for name in self.broker.registry.topics}

    def delete_topics(
        self, header: km.RequestHeader, req: km.DeleteTopicsRequest
    ) -> km.DeleteTopicsResponse:
        return km.DeleteTopicsResponse(0, [self._delete_topic(n) for n in req.topic_names])

    def _delete_topic(self, name: str) -> km.DeletableTopicResult:
        try:
            self.access.require(Operation.ADMIN, name)
            self.broker.delete_topic(name)
        except HeadraceError as exc:
            return km.DeletableTopicResult(name, code_of(exc))
        return km.DeletableTopicResult(name, ErrorCode.NONE)

    def create_partitions(
        self, header: km.RequestHeader, req: km.CreatePartitionsRequest
    ) -> km.CreatePartitionsResponse:
        """Kafka's checks, then the broker's answer to a valid grow (``add_partitions``).
        ``validate_only`` gets the same answer and changes nothing, as in Kafka."""
        names = [t.name for t in req.topics]
        results = []
        for asked in req.topics:
            if names.count(asked.name) > 1:
                results.append(
                    km.CreatePartitionsTopicResult(
                        asked.name, ErrorCode.INVALID_REQUEST, "Duplicate topic name."
                    )
                )
                continue
            try:
                self.access.require(Operation.ADMIN, asked.name)
                current = self._partition_count(asked.name)
            except HeadraceError as exc:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, code_of(exc), exc.message)
                )
                continue
            refused = partition_counts.check_new_count(
                asked.name,
                current,
                asked.count,
                assigned=asked.assignments is not None,
                limit=MAX_PARTITIONS,
            )
            if refused is not None:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, refused.code, refused.message)
                )
                continue
            try:
                self.broker.add_partitions(asked.name, asked.count)
            except HeadraceError as exc:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, code_of(exc), exc.message)
                )
                continue
            results.append(km.CreatePartitionsTopicResult(asked.name, ErrorCode.NONE))
        return km.CreatePartitionsResponse(0, results)

    def _partition_count(self, name: str) -> int:
        """The partition count a Kafka client sees in ``Metadata``: in a cluster the
        topology's active partitions, which this broker knows whether or not it hosts
        a copy of the topic."""
        cluster = self.broker.cluster
        if cluster is None:
            return self.broker.registry.get(name).partition_count
        try:
            canonical = canonical_topic_name(name)
        except InvalidTopicSpec as exc:
            raise UnknownTopic(exc.message) from exc
        placement = next((t for t in cluster.topics if t.name == canonical), None)
        if placement is None:
            raise UnknownTopic(f"unknown topic {canonical!r}")
        return placement.routing_partitions
