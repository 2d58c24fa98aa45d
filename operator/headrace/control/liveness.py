"""Which brokers are live, dead or not yet heard from, and the adoption floor (pure).

A broker is **live** while its latest heartbeat is at most ``ttl_ms`` old. A
broker is **dead** when its last sign of life is older than that: the last
heartbeat, or, for a broker the controller has not heard from since it started
observing, the moment it started (``observing_since_ms``). In between, a known
broker with no heartbeat yet is **unheard**: a freshly restarted controller
has simply not polled it. The core acts on unheard brokers as if nothing had
changed, which is what keeps a controller restart from deposing every leader:

    heartbeat        age against ttl                        verdict
    ---------------  -------------------------------------  -------
    present          now - received_ms <= ttl               live
    present          now - received_ms >  ttl               dead
    absent           now - observing_since_ms <= ttl        unheard
    absent           now - observing_since_ms >  ttl        dead

The **adoption floor** is the lowest topology generation acked by client
connections anywhere in the fleet: the minimum adoption label over *live*
brokers that have one. A dead broker's label is frozen at its last value and
stands for clients that have gone, so counting it would pin the floor down
forever. No label anywhere means no evidence of adoption: ``None``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from headrace.protocol.coordination import Heartbeat


@dataclass(frozen=True, slots=True)
class Liveness:
    live: frozenset[int]
    dead: frozenset[int]
    #: known brokers not heard from since the controller started observing, within one TTL
    unheard: frozenset[int]
    #: live brokers whose heartbeat says they are shutting down
    draining: frozenset[int]

    @property
    def warming_up(self) -> bool:
        """Some known broker has not been heard from yet: absence proves nothing."""
        return bool(self.unheard)


def placeable(liveness: Liveness, members: Collection[int] | None) -> frozenset[int]:
    """The brokers new replicas may go to: live, not draining, and, when the cluster says
    which brokers it should have (``members``), one of them. A broker being scaled away
    gets no new partition from a topic's creation, a repartition's grow, an unload or a
    move (a grow and an unload once ignored ``members``, so the moves
    had to take back what they had just placed)."""
    eligible = liveness.live - liveness.draining
    return eligible if members is None else eligible & frozenset(members)


def is_live(heartbeat: Heartbeat | None, now_ms: int, ttl_ms: int) -> bool:
    return heartbeat is not None and now_ms - heartbeat.received_ms <= ttl_ms


def assess(
    known: Iterable[int],
    heartbeats: Mapping[int, Heartbeat],
    now_ms: int,
    ttl_ms: int,
    observing_since_ms: int,
) -> Liveness:
    """Classify every known broker and every broker with a heartbeat."""
    live: set[int] = set()
    dead: set[int] = set()
    unheard: set[int] = set()
    for broker in set(known) | set(heartbeats):
        hb = heartbeats.get(broker)
        if hb is not None:
            (live if now_ms - hb.received_ms <= ttl_ms else dead).add(broker)
        elif now_ms - observing_since_ms <= ttl_ms:
            unheard.add(broker)
        else:
            dead.add(broker)
    draining = {b for b in live if heartbeats[b].draining}
    return Liveness(frozenset(live), frozenset(dead), frozenset(unheard), frozenset(draining))


def adoption_floor(heartbeats: Mapping[int, Heartbeat], live: Iterable[int]) -> int | None:
    """Lowest adoption label among live brokers that carry one; None if none does."""
    labels = [
        hb.adoption
        for b in live
        if (hb := heartbeats.get(b)) is not None and hb.adoption is not None
    ]
    return min(labels) if labels else None
