"""The topology a cluster state is pushed as, and what clients route by (pure).

``cluster_topology`` is the one builder of the document the controller pushes
to brokers (``ClusterTopology``, ``POST /v1/topology``): the control loop
pushes what it returns and the tests check it. Its ``generation`` is the
cluster's topology generation; each topic carries its own partitioning
version, never the generation. A partition's leader is its leader, or the
candidate while one is promoting (the candidate answers ``NotLeader`` until it
has promoted, which clients retry); None when Offline.

``snapshot`` is the client-facing view of the same document
(``TopologySnapshot``, ``TopologyUpdate`` op 101), derived as a broker derives
it (``ClusterTopology.client_snapshot``): an Offline partition's owner is -1.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from headrace.control.model import ClusterState
from headrace.protocol.coordination import (
    ClusterTopology,
    IncarnationRemoval,
    PartitionPlacement,
    TopicPlacement,
    TransitionPlacement,
)
from headrace.protocol.messages import TopologySnapshot


def cluster_topology(
    state: ClusterState,
    cluster_id: str,
    *,
    live: Collection[int] | None = None,
    min_in_sync: Mapping[str, int] | None = None,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    retained: Collection[str] = (),
) -> ClusterTopology:
    """The topology brokers apply for ``state``.

    ``live``: the brokers the last liveness assessment found live (default: every
    known broker); a new leader seeds its LRS from the pushed ``lrs``, which
    never names a dead broker. ``min_in_sync`` and ``configs``: per topic, from
    its spec (default 1 and no settings, so the broker's own defaults apply).
    ``retained``: deleted topics whose copies brokers keep on disk (``deletionPolicy:
    Retain``); a name the state still holds is left out (it is not deleted yet).
    ``removals``: the deleted incarnations whose objects a broker is asked to remove
    (``tier_deletions``).
    """
    alive = frozenset(state.brokers) if live is None else frozenset(live)
    min_in_sync = min_in_sync or {}
    configs = configs or {}
    return ClusterTopology(
        state.generation,
        cluster_id,
        [b for _, b in sorted(state.brokers.items())],
        [
            TopicPlacement(
                name,
                len(topic.partitions),
                topic.partitioning_version,
                min_in_sync.get(name, 1),
                dict(configs.get(name, {})),
                [
                    PartitionPlacement(
                        p.partition,
                        list(p.replicas),
                        # a candidate is told it leads, so it can promote itself
                        p.owner,
                        p.leader_epoch,
                        # A new leader seeds its LRS from this: never with dead brokers,
                        # whose missing fetches would hold the HW (and acks=all) back
                        # until they time out of the set.
                        [r for r in p.live_replicas if r in alive],
                        # unloads: the leader seals; a higher ``moves`` makes every
                        # replica drop its copy and open it empty at ``start_offset``
                        # (None: after the last offset in the object store)
                        p.seal,
                        p.moves,
                        p.start_offset,
                        # a leader seeing a new one resets followers outside ``lrs``
                        p.target_generation if p.target else 0,
                    )
                    for p in topic.partitions
                ],
                {
                    cohort: {m: list(ps) for m, ps in plan.assignment.items()}
                    for cohort, plan in topic.cohort_plans.items()
                },
                None
                if topic.transition is None
                else TransitionPlacement(
                    topic.transition.from_partitions,
                    topic.transition.to_partitions,
                    topic.transition.to_version,
                    dict(topic.transition.cutover_offsets),
                    {c: list(qs) for c, qs in topic.transition.released.items()},
                ),
                topic.active_partitions or 0,
                topic.history,
                topic.creation_id,
            )
            for name, topic in sorted(state.topics.items())
        ],
        sorted(set(retained) - set(state.topics)),
        removals=[
            IncarnationRemoval(d.topic, d.creation_id, d.partitions, d.broker)
            for _, d in sorted(state.deleted.items())
            if d.broker is not None
        ],
    )


def snapshot(state: ClusterState, cluster_id: str) -> TopologySnapshot:
    """What clients route by for ``state``: the client view of ``cluster_topology``."""
    return cluster_topology(state, cluster_id).client_snapshot()
