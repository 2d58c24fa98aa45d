"""What a repartition holds back from a cohort: a new partition's post-cutover records,
until the cohort drained the old partitions feeding it (per-key order, invariant 6).

The holds are the pushed topology's (the topic's transition marker and history),
anchored at this copy's own record of where a version began (``Partition.cutover``).
"""

from __future__ import annotations

from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.topics import TopicRegistry


class RepartitionHolds:
    def __init__(self, registry: TopicRegistry, pushed: PushedTopology) -> None:
        self._registry = registry
        self._pushed = pushed

    def delivery_hold(self, topic: str, cohort: str, partition: int) -> int | None:
        """The first offset of ``partition`` the cohort may not be delivered yet (a
        repartition, in flight or in the topic's history, holds a new partition's
        post-cutover records until the cohort drained the old partitions feeding it);
        None: no hold."""
        placement = self._pushed.placement(topic)
        if placement is None:
            return None
        holds: list[int] = []
        if placement.history is not None:
            held = placement.history.hold(cohort, partition)
            if held is not None:
                holds.append(held)
        t = placement.transition
        if t is not None:
            held = t.hold(cohort, partition, self._local_cutover(topic, partition, t.to_version))
            if held is not None:
                holds.append(held)
        return min(holds, default=None)

    def routed_anew_from(self, topic: str, partition: int) -> int | None:
        """While a grow is in flight, for a partition it routes keys to anew: where its
        post-cutover records begin (a cohort's member without a cursor there starts at
        the latest there, whatever its start: they are all newer than the cohort)."""
        placement = self._pushed.placement(topic)
        if placement is None or placement.transition is None:
            return None
        t = placement.transition
        return t.routed_anew_from(partition, self._local_cutover(topic, partition, t.to_version))

    def _local_cutover(self, topic: str, partition: int, version: int) -> int | None:
        """This copy's own record of where ``version`` began in ``partition``, if any."""
        t = self._registry.topics.get(topic)
        part = None if t is None else t.partitions.get(partition)
        if part is not None and part.cutover is not None and part.cutover[0] == version:
            return part.cutover[1]
        return None
