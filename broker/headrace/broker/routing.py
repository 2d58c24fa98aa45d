"""Where a client's request belongs: the topology snapshot clients route by, and the
partition a write or a read may use here, or the redirect to where it belongs.

Standalone, this broker owns every partition of its registry; in a cluster, the
pushed topology (``pushed_topology``) names each partition's leader, and before the
first push this broker owns nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from headrace.broker.ports import BrokerCore, RedirectRequired
from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.topics import Partition, Role, Topic
from headrace.errors import PartitionMoving, UnknownPartition
from headrace.protocol import messages as msg
from headrace.protocol.endpoints import DEFAULT_LISTENER, BrokerEndpoint


class Routing:
    def __init__(
        self,
        broker: BrokerCore,
        pushed: PushedTopology,
        own_endpoint: Callable[[], BrokerEndpoint],
    ) -> None:
        self._settings = broker.settings
        self._registry = broker.registry
        self._pushed = pushed
        #: this broker's endpoint (its bound ports are known only once it listens)
        self._own_endpoint = own_endpoint

    # ------------------------------------------------------------------ snapshots

    def topology(self, listener: str = DEFAULT_LISTENER) -> tuple[msg.TopologySnapshot, object]:
        """The snapshot a client of ``listener`` is given (every broker's address on that
        listener), and its routing content (what decides whether to push)."""
        if self._pushed.current is not None:
            snapshot = self._pushed.current.client_snapshot(listener)
        elif self._settings.cluster_mode:
            snapshot = self._awaiting_snapshot(listener)
        else:
            snapshot = self._standalone_snapshot(listener)
        return snapshot, _routing_content(snapshot)

    def _awaiting_snapshot(self, listener: str) -> msg.TopologySnapshot:
        # Awaiting the controller's first push: own nothing, at generation 0, so a client
        # prefers any other broker's view and never routes writes here on our word.
        return msg.TopologySnapshot(
            0,
            self._settings.cluster_id,
            self._own_on(listener),
            [
                msg.TopicRouting(
                    t.name,
                    t.partition_count,
                    t.partitioning_version,
                    [-1] * t.partition_count,
                    [0] * t.partition_count,
                    creation_id=t.creation_id,
                )
                for t in sorted(self._registry.topics.values(), key=lambda t: t.name)
            ],
        )

    def _standalone_snapshot(self, listener: str) -> msg.TopologySnapshot:
        me = self._settings.broker_id
        routing = []
        for topic in sorted(self._registry.topics.values(), key=lambda t: t.name):
            epochs = [
                topic.partitions[i].leader_epoch if i in topic.partitions else 0
                for i in range(topic.partition_count)
            ]
            routing.append(
                msg.TopicRouting(
                    topic.name,
                    topic.partition_count,
                    topic.partitioning_version,
                    [me] * topic.partition_count,
                    epochs,
                    creation_id=topic.creation_id,
                )
            )
        return msg.TopologySnapshot(
            self._registry.generation,
            self._settings.cluster_id,
            self._own_on(listener),
            routing,
            self._registry.generation_epoch,
        )

    def _own_on(self, listener: str) -> list[BrokerEndpoint]:
        """This broker as clients of ``listener`` dial it (none while that is pending)."""
        own = self._own_endpoint().on(listener)
        return [] if own is None else [own]

    # ------------------------------------------------------------------ partitions

    def partition_for_write(self, topic: str, partition: int, version: int) -> Partition:
        t = self._registry.get(topic)
        if version != t.partitioning_version:
            reason = (
                f"routed under partitioning version {version}, current is {t.partitioning_version}"
            )
            raise self._redirect(t, partition, reason)
        placement = self._pushed.placement(t.name)
        if placement is not None and partition >= placement.routing_partitions:
            # A shrink retires partitions for routing, not for reading: they take no new
            # records (while it drains and after), and stay readable.
            reason = (
                f"{t.name}/{partition} is retired: version {version} routes to"
                f" {placement.routing_partitions} partitions"
            )
            raise self._redirect(t, partition, reason)
        part = self._led(t, partition)
        if part.moving:
            raise PartitionMoving(f"{part.name} is being moved; retry at its new owner")
        return part

    def partition_for_read(self, topic: str, partition: int) -> Partition:
        part = self._led(self._registry.get(topic), partition)
        if part.tiering is not None and part.tiering.reopening is not None:
            raise PartitionMoving(f"{part.name} is reopening after a move; retry shortly")
        return part

    def _led(self, t: Topic, partition: int) -> Partition:
        if not 0 <= partition < t.partition_count:
            raise UnknownPartition(f"topic {t.name!r} has no partition {partition}")
        part = t.partitions.get(partition)
        if part is None or part.role is not Role.LEADER:
            me = self._settings.broker_id
            raise self._redirect(t, partition, f"broker {me} does not lead {t.name}/{partition}")
        return part

    def _redirect(self, topic: Topic, partition: int, reason: str) -> RedirectRequired:
        # the whole endpoint: the connection answers with its own listener's address of it
        owner: BrokerEndpoint | None = None
        if self._pushed.current is None and not self._settings.cluster_mode:
            owner = self._own_endpoint()
        elif self._pushed.current is not None:
            owner = self._pushed.leader(topic.name, partition)
        snapshot, _ = self.topology()
        redirect = msg.Redirect(
            topic.name, partition, owner, topic.partitioning_version, snapshot.generation, reason
        )
        return RedirectRequired(redirect)


def _routing_content(snapshot: msg.TopologySnapshot) -> object:
    """What of ``snapshot`` decides whether connections are pushed a new one."""
    return (
        tuple(snapshot.brokers),
        tuple(
            (
                r.name,
                r.partitions,
                r.partitioning_version,
                r.routing_partitions,
                tuple(r.owners),
                tuple(r.epochs),
            )
            for r in snapshot.topics
        ),
    )
