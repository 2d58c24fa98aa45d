"""The client-facing topology snapshot of a cluster state (pure).

Clients route by the snapshot a broker pushes (``TopologyUpdate``, op 101).
Its ``generation`` is the cluster's topology generation; each topic carries
its own partitioning version, never the generation. A partition's owner is
its leader, or the candidate while one is promoting (the candidate answers
``NotLeader`` until it has promoted, which clients retry); -1 when Offline.
"""

from __future__ import annotations

from headrace.control.model import ClusterState
from headrace.protocol.messages import TopicRouting, TopologySnapshot

NO_OWNER = -1


def snapshot(state: ClusterState, cluster_id: str) -> TopologySnapshot:
    brokers = [b for _, b in sorted(state.brokers.items())]
    topics = [
        TopicRouting(
            t.name,
            len(t.partitions),
            t.partitioning_version,
            [NO_OWNER if p.owner is None else p.owner for p in t.partitions],
            [p.leader_epoch for p in t.partitions],
        )
        for _, t in sorted(state.topics.items())
    ]
    return TopologySnapshot(state.generation, cluster_id, brokers, topics)
