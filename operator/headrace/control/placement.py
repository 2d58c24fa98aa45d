"""Where a topic's partition replicas live (pure).

Placement spreads a partition over racks first, a topic over brokers second,
the cluster third, and is deterministic (no randomness: two controllers, or a
retry, place the same way). It runs in two passes over the new partitions:

1. **Replica sets.** Each new partition takes, one at a time, the eligible
   broker whose rack none of its replicas chosen so far is in (as Kafka's
   ``broker.rack`` does, so the loss of one zone leaves every partition a
   copy while there are at least as many racks as replicas); among those, one
   in the rack holding the fewest of this topic's replicas per broker (so
   racks fill evenly, and with them their brokers), then the one that holds
   the fewest of this topic's replicas; ties go to the one
   that shares fewest partitions with the brokers already chosen (so a
   leader's followers vary and its loss spreads the new leaders over many
   brokers), then leads fewest of the topic's partitions, then holds and
   leads fewest cluster-wide (so topics do not all start on broker 0), then
   the lowest id.
   Always taking the least-loaded brokers keeps every broker's share of the
   topic's replicas within one of every other's when the racks are the same
   size (a broker alone in a rack among bigger ones must hold more: the
   spread comes first).
2. **Leaders.** The leader of each new partition is its member leading the
   fewest of the topic's partitions. Then leadership is shifted inside
   replica sets along *cost-reducing paths* (broker A leads a partition that
   B also holds, B leads one that C holds, ... until a broker leading at
   least two fewer than A): a leadership assignment with no such path is as
   even as the replica sets allow. For a fresh topic that is always within
   one.

Existing partitions are never moved, not even their leader order: growing a
topic keeps every current replica list and places only the new partitions,
counting the old ones. So the result is ``existing + new``.

**Racks** (``Racks``: broker id -> rack name, from the brokers' ``--rack`` or, on
Kubernetes, the zone of each broker pod's node) are optional: a broker with no
rack is a rack of its own, so a cluster without racks places exactly as
before. ``rack_span`` says how many racks a replica list covers;
``wanted_span`` how many it should cover.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import TypeAlias

from headrace.errors import HeadraceError

#: broker id -> the rack (zone) it runs in; a broker missing here is a rack of its own
Racks: TypeAlias = Mapping[int, str]

#: a rack as placement compares them: a named rack, or one broker with none
RackKey: TypeAlias = tuple[str, int]

#: no broker in a named rack (read-only, so it is safe as a default)
NO_RACKS: Racks = MappingProxyType({})


def rack_of(broker: int, racks: Racks) -> RackKey:
    """The rack ``broker`` counts in: its named rack, or itself when it has none."""
    name = racks.get(broker)
    return (name, -1) if name else ("", broker)


def rack_span(replicas: Iterable[int], racks: Racks) -> int:
    """How many racks the replica list covers."""
    return len({rack_of(b, racks) for b in replicas})


def wanted_span(replication_factor: int, brokers: Collection[int], racks: Racks) -> int:
    """How many racks a partition's replicas should cover: as many as exist among
    ``brokers``, up to its replication factor."""
    return min(replication_factor, len({rack_of(b, racks) for b in brokers}))


class NotEnoughBrokers(HeadraceError):
    """Fewer eligible brokers than the replication factor asks for.

    Retriable: brokers may come back or join. Raised inside the controller
    only; it never crosses the wire (so it has no code of its own).
    """

    retriable = True


def place(
    partitions: int,
    replicas: int,
    brokers: Iterable[int],
    *,
    existing: Sequence[Sequence[int]] = (),
    others: Iterable[Sequence[int]] = (),
    racks: Racks = NO_RACKS,
) -> tuple[tuple[int, ...], ...]:
    """Replica lists (leader first) for partitions ``0..partitions-1``.

    ``brokers`` are the eligible brokers (live, not draining). ``existing``
    are the topic's current replica lists, kept as they are; only partitions
    ``len(existing)..partitions-1`` are placed. ``others`` are the replica
    lists of every other topic's partitions, used to even out the cluster.
    ``racks``: where the brokers run; each new partition covers ``wanted_span`` racks.
    """
    eligible = sorted(set(brokers))
    if partitions < len(existing):
        raise ValueError("placement never removes partitions")
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    kept = [tuple(r) for r in existing]
    if partitions == len(kept):
        return tuple(kept)
    if replicas > len(eligible):
        raise NotEnoughBrokers(
            f"{replicas} replicas need {replicas} eligible brokers, {len(eligible)} available"
        )
    topic_leads: Counter[int] = Counter(r[0] for r in kept if r)
    topic_holds: Counter[int] = Counter(b for r in kept for b in r)
    other_lists = [tuple(r) for r in others if r]
    cluster_leads: Counter[int] = Counter(r[0] for r in other_lists)
    cluster_holds: Counter[int] = Counter(b for r in other_lists for b in r)
    shared: Counter[tuple[int, int]] = Counter()
    for r in [*kept, *other_lists]:
        _count_pairs(shared, r)
    rack_size: Counter[RackKey] = Counter(rack_of(b, racks) for b in eligible)
    rack_holds: Counter[RackKey] = Counter()
    for b in eligible:
        rack_holds[rack_of(b, racks)] += topic_holds[b]

    new: list[list[int]] = []
    for _ in range(len(kept), partitions):
        chosen: list[int] = []
        while len(chosen) < replicas:
            used = {rack_of(c, racks) for c in chosen}
            chosen.append(
                min(
                    (b for b in eligible if b not in chosen),
                    key=lambda b: (
                        rack_of(b, racks) in used,
                        Fraction(rack_holds[rack_of(b, racks)], rack_size[rack_of(b, racks)]),
                        topic_holds[b],
                        sum(shared[_pair(b, c)] for c in chosen),
                        topic_leads[b],
                        cluster_holds[b] + topic_holds[b],
                        cluster_leads[b] + topic_leads[b],
                        b,
                    ),
                )
            )
        leader = min(chosen, key=lambda b: (topic_leads[b], cluster_leads[b], b))
        chosen.remove(leader)
        chosen.insert(0, leader)
        topic_leads[leader] += 1
        for b in chosen:
            topic_holds[b] += 1
            rack_holds[rack_of(b, racks)] += 1
        _count_pairs(shared, chosen)
        new.append(chosen)
    _even_out_leaders(new, Counter(r[0] for r in kept if r))
    return (*kept, *(tuple(r) for r in new))


def _even_out_leaders(sets: list[list[int]], fixed_leads: Counter[int]) -> None:
    """Reorder ``sets`` (leader first) along cost-reducing paths until none is left."""
    leads = Counter(fixed_leads)
    for s in sets:
        leads[s[0]] += 1
    brokers = sorted({b for s in sets for b in s})
    while True:
        for source in sorted(brokers, key=lambda b: (-leads[b], b)):
            path = _cost_reducing_path(sets, leads, source)
            if path:
                for i, b in path:
                    sets[i].remove(b)
                    sets[i].insert(0, b)
                leads[source] -= 1
                leads[path[-1][1]] += 1
                break
        else:
            return


def _cost_reducing_path(
    sets: list[list[int]], leads: Counter[int], source: int
) -> list[tuple[int, int]]:
    """(partition, new leader) steps from ``source`` to a broker leading 2+ fewer; [] if none."""
    came_from: dict[int, tuple[int, int] | None] = {source: None}
    queue = deque([source])
    while queue:
        a = queue.popleft()
        if leads[a] <= leads[source] - 2:
            steps: list[tuple[int, int]] = []
            b = a
            while (step := came_from[b]) is not None:
                prev, i = step
                steps.append((i, b))
                b = prev
            return steps[::-1]
        for i, s in enumerate(sets):
            if s[0] != a:
                continue
            for b in s[1:]:
                if b not in came_from:
                    came_from[b] = (a, i)
                    queue.append(b)
    return []


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _count_pairs(shared: Counter[tuple[int, int]], replicas: Sequence[int]) -> None:
    for i, a in enumerate(replicas):
        for b in replicas[i + 1 :]:
            shared[_pair(a, b)] += 1
