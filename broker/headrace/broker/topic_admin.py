"""Topic changes asked of this broker (the admin HTTP API, the data protocol's and the
Kafka API's topic requests): create, grow, reconfigure, delete and describe.

Only a standalone broker changes its topics itself; in a cluster they are the
controller's, and each change is refused with what to run instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.broker.cohort_runtimes import CohortRuntimes
from headrace.broker.ports import BrokerCore
from headrace.broker.tiering import Tiering
from headrace.broker.topics import Topic
from headrace.errors import InvalidRequest, PolicyViolation


class TopicAdmin:
    def __init__(
        self,
        broker: BrokerCore,
        tiering: Tiering,
        cohorts: CohortRuntimes,
        *,
        created: Callable[[], None],
        deleted: Callable[[], None],
    ) -> None:
        self._settings = broker.settings
        self._registry = broker.registry
        self._tiering = tiering
        self._cohorts = cohorts
        #: told once a topic was created, and once one was deleted (the broker re-plans)
        self._created = created
        self._deleted = deleted

    def create_topic(
        self, name: str, partitions: int, config: dict[str, Any] | None = None
    ) -> Topic:
        if self._settings.cluster_mode:
            raise InvalidRequest(
                "in a cluster, topics are managed by the controller (headrace apply)"
            )
        topic = self._registry.create(name, partitions, config)
        self._created()
        return topic

    def add_partitions(self, name: str, count: int) -> None:
        """Grow topic ``name`` to ``count`` partitions: never done here, and said so.

        A grow is a live repartition (docs/repartition.md): the partitioning version
        moves, and each cohort's delivery holds keep every key's pre-cutover records
        ahead of its post-cutover ones (invariant 6). Those holds come from the
        controller's transition marker, so a standalone broker, which has none, cannot
        grow a topic without breaking that order; in a cluster the controller owns the
        Topic, and this broker has no channel to it."""
        if self._settings.cluster_mode:
            raise PolicyViolation(
                f"{name}: partitions are added by the controller as a live repartition, not"
                f" through the Kafka API: run `headrace topics alter {name} --partitions"
                f" {count}` (local mode) or set the Topic's spec.partitions (Kubernetes)"
            )
        raise PolicyViolation(
            f"{name}: a standalone broker's partition count is fixed at creation; growing a"
            " topic is a live repartition, which needs a controller (a cluster: `headrace"
            f" topics alter {name} --partitions {count}`)"
        )

    def reconfigure_topic(
        self,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Give topic ``name`` the settings ``change`` makes of its current ones (by our
        names), checked whole first; ``validate_only``: check, change nothing. In a
        cluster the settings are the controller's Topic's, so refused there."""
        if self._settings.cluster_mode:
            raise PolicyViolation(
                f"{name}: topic settings are the controller's, not changed through the Kafka"
                f" API: run `headrace topics alter {name} -c KEY=VALUE` (local mode) or edit"
                " the Topic's spec (Kubernetes)"
            )
        config = change(self._registry.get(name).config)
        self._registry.log_config_of(config)  # raises InvalidTopicSpec
        if not validate_only:
            self._registry.reconfigure(name, config)

    def delete_topic(self, name: str) -> None:
        if self._settings.cluster_mode:
            raise InvalidRequest(
                "in a cluster, topics are managed by the controller (headrace delete)"
            )
        topic = self._registry.get(name)
        self._cohorts.end_topic(topic.name)
        for partition in topic.partitions.values():
            self._tiering.forget(partition)
            self._tiering.detach(partition)
        self._registry.delete(topic.name)
        self._deleted()

    def describe_topic(self, name: str) -> dict[str, Any]:
        topic = self._registry.get(name)
        cluster = self._settings.cluster_mode
        return {
            **topic.to_json(),
            "partition_details": [
                {
                    "partition": p.index,
                    # The partition's leader, not this broker: in a cluster a follower answers too.
                    "leader": p.leader_id if cluster else self._settings.broker_id,
                    "role": p.role.value,
                    "leader_epoch": p.leader_epoch,
                    "log_start_offset": p.log.log_start_offset,
                    "log_end_offset": p.log.next_offset,
                    "high_watermark": p.high_watermark,
                    "size_bytes": p.log.size_bytes,
                    "segments": len(p.log.segments),
                    "cursors": p.cursors.all(),
                    **self._tiering.describe(p),
                }
                for p in sorted(topic.partitions.values(), key=lambda p: p.index)
            ],
        }
