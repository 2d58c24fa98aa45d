"""The topics a ``deletionPolicy: Retain`` deletion took out of the state, kept under the
pushed ``retained`` until every broker that may hold a copy has moved it aside (pure).

A Retain deletion is an intent about the data, not about the Topic object: once the loop
took the topic out of its state for it, a push that names the topic neither as a topic
nor under ``retained`` makes a broker still holding a copy delete it. A broker that was
down while the deletion ran has not been told to set its copy aside; so the name stays
retained, whatever becomes of the Topic meanwhile (its finalizer removed by hand, the
watch losing it), until every broker that held a replica of it has applied a generation
that lists it there and reports none of its partitions. Until then a new Topic of that
name is not placed either: a broker holding the old copy would take the new placement
for a newer incarnation and drop its copy (``replication.assigning.superseded``) rather
than move it aside.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from headrace.control.model import ClusterState, DeletionRequest
from headrace.protocol.coordination import Heartbeat


@dataclass(frozen=True, slots=True)
class SettingAside:
    """One topic a Retain deletion took out of the state, while brokers may hold copies."""

    topic: str
    #: the generation that took it out of the state: its push, and every later one while
    #: the topic is being set aside, lists it under ``retained``
    since: int
    #: the brokers the state last placed a replica of it on (a move's adding ones too)
    holders: frozenset[int]

    def waiting_for(
        self, applied: Mapping[int, int], heartbeats: Mapping[int, Heartbeat]
    ) -> frozenset[int]:
        """The holders that have not confirmed moving their copy aside: they have not
        applied a generation from ``since`` on (``applied``: the generation each broker
        last reported), or their last heartbeat still reports a partition of the topic."""
        return frozenset(
            b
            for b in self.holders
            if applied.get(b, 0) < self.since
            or (
                (heartbeat := heartbeats.get(b)) is not None
                and any(p.topic == self.topic for p in heartbeat.partitions)
            )
        )


def started(
    before: ClusterState, after: ClusterState, deletions: Collection[DeletionRequest]
) -> dict[str, SettingAside]:
    """The topics a commit from ``before`` to ``after`` takes out of the state on a
    Retain deletion, by name."""
    retain = {d.topic for d in deletions if d.retain}
    return {
        name: SettingAside(
            name, after.generation, frozenset(b for p in topic.partitions for b in p.replicas)
        )
        for name, topic in before.topics.items()
        if name not in after.topics and name in retain
    }


def confirmed(
    pending: Mapping[str, SettingAside],
    applied: Mapping[int, int],
    heartbeats: Mapping[int, Heartbeat],
) -> frozenset[str]:
    """The topics of ``pending`` every holder has confirmed setting aside: they may leave
    ``retained`` (no broker holds a copy of them any more to delete)."""
    return frozenset(
        name for name, aside in pending.items() if not aside.waiting_for(applied, heartbeats)
    )
