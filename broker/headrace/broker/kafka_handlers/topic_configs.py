"""A topic's configs through the Kafka API: DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs (``kafka.configs`` maps Kafka's names to ours)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.broker.kafka_handlers.context import KafkaHandlers, KafkaRoutes
from headrace.errors import HeadraceError, InvalidTopicSpec
from headrace.kafka import configs
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode, code_of
from headrace.security.acl import Operation


class TopicConfigs(KafkaHandlers):
    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            km.ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            km.ApiKey.ALTER_CONFIGS: self.alter_configs,
        }

    def describe_configs(
        self, header: km.RequestHeader, req: km.DescribeConfigsRequest
    ) -> km.DescribeConfigsResponse:
        return km.DescribeConfigsResponse(0, [self._describe(r) for r in req.resources])

    def _describe(self, asked: km.DescribeConfigsResource) -> km.DescribeConfigsResult:
        result = km.DescribeConfigsResult(
            ErrorCode.NONE, None, asked.resource_type, asked.resource_name
        )
        if asked.resource_type == km.RESOURCE_BROKER:
            return result  # no broker setting is described: an empty, truthful list
        if asked.resource_type != km.RESOURCE_TOPIC:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {asked.resource_type} is not described"
            return result
        try:
            self.access.require(Operation.CONSUME, asked.resource_name)
            topic = self.broker.registry.get(asked.resource_name)
        except HeadraceError as exc:
            result.error_code = code_of(exc)
            result.error_message = exc.message
            return result
        log_config = next(iter(topic.partitions.values())).log.config
        effective = {ours: getattr(log_config, ours) for ours in configs.KAFKA_TO_OURS.values()}
        for entry in configs.describe(effective, topic.config, asked.configuration_keys):
            source = km.SOURCE_DEFAULT if entry.is_default else km.SOURCE_TOPIC
            result.configs.append(
                km.DescribeConfigsResourceResult(
                    entry.name,
                    entry.value,
                    # in a cluster they are the controller's Topic's (reconfigure_topic)
                    read_only=self.broker.settings.cluster_mode,
                    is_default=entry.is_default,
                    config_source=source,
                    is_sensitive=False,
                    synonyms=[km.DescribeConfigsSynonym(entry.name, entry.value, source)],
                )
            )
        return result

    def incremental_alter_configs(
        self, header: km.RequestHeader, req: km.IncrementalAlterConfigsRequest
    ) -> km.AlterConfigsResponse:
        return km.AlterConfigsResponse(
            0, [self._alter_incrementally(r, req.validate_only) for r in req.resources]
        )

    def alter_configs(
        self, header: km.RequestHeader, req: km.AlterConfigsRequest
    ) -> km.AlterConfigsResponse:
        return km.AlterConfigsResponse(
            0, [self._alter_whole(r, req.validate_only) for r in req.resources]
        )

    def _alter_incrementally(
        self, asked: km.IncrementalAlterConfigsResource, validate_only: bool
    ) -> km.AlterConfigsResourceResponse:
        changes = [configs.Change(c.name, c.config_operation, c.value) for c in asked.configs]
        return self._alter(
            asked.resource_type,
            asked.resource_name,
            validate_only,
            lambda config: configs.incrementally_altered(config, changes),
        )

    def _alter_whole(
        self, asked: km.AlterConfigsResource, validate_only: bool
    ) -> km.AlterConfigsResourceResponse:
        pairs = [(c.name, c.value) for c in asked.configs]
        return self._alter(
            asked.resource_type,
            asked.resource_name,
            validate_only,
            lambda config: configs.altered(config, pairs),
        )

    def _alter(
        self,
        resource_type: int,
        name: str,
        validate_only: bool,
        new_config: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> km.AlterConfigsResourceResponse:
        """One resource of an (Incremental)AlterConfigs: every change checked, then all
        of them in force at once, or none (``validate_only``: none, with the same answer)."""
        result = km.AlterConfigsResourceResponse(ErrorCode.NONE, None, resource_type, name)
        if resource_type == km.RESOURCE_BROKER:
            result.error_code = ErrorCode.POLICY_VIOLATION
            result.error_message = (
                "broker settings are the broker's command-line flags, not changed through"
                " the Kafka API"
            )
            return result
        if resource_type != km.RESOURCE_TOPIC:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {resource_type} has no configs here"
            return result
        try:
            self.access.require(Operation.ADMIN, name)
            self.broker.reconfigure_topic(name, new_config, validate_only=validate_only)
        except InvalidTopicSpec as exc:
            result.error_code = ErrorCode.INVALID_CONFIG
            result.error_message = exc.message
        except HeadraceError as exc:
            result.error_code = code_of(exc)
            result.error_message = exc.message
        return result
