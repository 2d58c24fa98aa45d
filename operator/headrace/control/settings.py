"""Tunables of the control core (pure data).

Every duration is in milliseconds of the controller's own clock, the clock
that stamps ``Heartbeat.received_ms`` and is passed to ``reconcile`` as
``now_ms``. The controller reads these once at start-up (from flags, the
environment or the BrokerCluster spec) and passes them in.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ControlSettings:
    #: A broker is live while its last heartbeat is at most this old. Three
    #: polls at the default 1 s interval, so one lost or slow poll never
    #: starts an election, and a dead leader is noticed within about 3 s.
    liveness_ttl_ms: int = 3_000
    #: How long a nominated candidate has to report itself leader at the new
    #: epoch before the next candidate gets a turn. Promotion needs one
    #: topology push and one heartbeat (two polls); 5 s leaves room for a
    #: slow broker without stalling the partition for long.
    candidate_wait_ms: int = 5_000
    #: How long an Offline partition waits before it gives another chance to
    #: LRS members that failed to promote and have stayed live since. A
    #: member that restarts is retried at once; this covers one that stays up
    #: but failed once (a full disk that was cleaned up, say).
    offline_retry_ms: int = 30_000
    #: How long an unload waits, once no live replica can seal a partition
    #: (its owner, and for RF > 1 every in-sync replica, are dead), before it
    #: gives up on them and reopens the partition from the object store,
    #: losing what the owner had acknowledged but not uploaded. The clock
    #: starts when liveness declares them dead (one TTL after their last
    #: heartbeat), so a broker that merely restarts (a few seconds) comes back
    #: and seals with no loss, while a lost machine costs about 8 s of
    #: unavailability in all.
    unload_recovery_timeout_ms: int = 5_000
    #: Give leadership back to a partition's preferred replica (the first of its
    #: replica set, where placement spread the leaders) once it is back and in sync,
    #: as Kafka's ``auto.leader.rebalance.enable`` does. Off, a broker that
    #: restarts stays a follower everywhere and the others keep its load.
    preferred_leader_rebalance: bool = True
    #: How long the preferred replica must have been live, in the LRS and not
    #: draining before leadership moves back to it (Kafka's
    #: ``leader.imbalance.check.interval``). A broker that just rejoined is often
    #: still warming caches or about to fail again; 10 s of good behaviour keeps a
    #: flapping broker from dragging leaders to and fro, and each move costs
    #: producers one short retry.
    preferred_leader_quiet_ms: int = 10_000
    #: A repartition started by an edit of ``Topic.spec.partitions`` (a Repartition
    #: carries its own ``adoptionTimeoutSeconds``) finalizes at the latest this long after
    #: its backlog drained, even if some clients have not acked the new routing: the
    #: version fence keeps them correct, the gate only spares them redirects. Fibril's 30 s.
    repartition_adoption_timeout_ms: int = 30_000
    #: How many partitions may have a replica move in flight at once, cluster-wide
    #: (``moves``). Each move copies a partition's whole log to its new replicas over
    #: the leaders' replication links; a few at a time keeps that from starving
    #: producers' replication, while 8 keeps a scale-out of a few hundred partitions
    #: within minutes.
    max_concurrent_moves: int = 8

    def __post_init__(self) -> None:
        for name in (
            "liveness_ttl_ms",
            "candidate_wait_ms",
            "offline_retry_ms",
            "unload_recovery_timeout_ms",
            "preferred_leader_quiet_ms",
            "repartition_adoption_timeout_ms",
            "max_concurrent_moves",
        ):
            if getattr(self, name) <= 0:
                raise InvalidRequest(f"control setting {name} must be positive")
