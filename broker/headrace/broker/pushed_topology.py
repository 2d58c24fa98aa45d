"""Cluster mode: the topology the controller pushed last, and what it says.

A standalone broker never holds one (``current`` stays None); a cluster broker holds
none between its start and the controller's first push (``awaiting``).
"""

from __future__ import annotations

from headrace.broker.config import BrokerSettings
from headrace.protocol.coordination import ClusterTopology, TopicPlacement
from headrace.protocol.endpoints import BrokerEndpoint


class PushedTopology:
    def __init__(self, settings: BrokerSettings) -> None:
        self._settings = settings
        #: the last topology the controller pushed (None until the first)
        self.current: ClusterTopology | None = None
        #: the format of the last push refused as too new (the heartbeat says so); None: none
        self.refused_format: int | None = None

    @property
    def cluster_id(self) -> str:
        """The cluster the pushed topology names (the configured one before any push)."""
        return self.current.cluster_id if self.current is not None else self._settings.cluster_id

    @property
    def generation(self) -> int | None:
        """The generation of the topology applied last (None before the first push)."""
        return self.current.generation if self.current is not None else None

    @property
    def awaiting(self) -> bool:
        """A cluster broker before the controller's first push: roles are unknown."""
        return self._settings.cluster_mode and self.current is None

    def endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        """Where broker ``broker_id`` is (None: unknown, or no push yet)."""
        return self.current.broker(broker_id) if self.current is not None else None

    def placement(self, topic: str) -> TopicPlacement | None:
        if self.current is None:
            return None
        return next((t for t in self.current.topics if t.name == topic), None)

    def leader(self, topic: str, partition: int) -> BrokerEndpoint | None:
        """The endpoint of ``topic``/``partition``'s leader (None: none, or unknown)."""
        placement = self.placement(topic)
        leader = None
        if placement is not None:
            leader = next(
                (a.leader for a in placement.assignments if a.partition == partition), None
            )
        return self.endpoint(leader) if leader is not None else None

    def cohort_plan(self, topic: str, cohort: str) -> dict[str, list[int]] | None:
        placement = self.placement(topic)
        return None if placement is None else placement.cohort_plans.get(cohort)
