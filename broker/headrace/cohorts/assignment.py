"""Sticky, balanced assignment of partitions to cohort members (pure).

Balanced: every member holds floor(P/M) or ceil(P/M) partitions. Sticky: a
member keeps as many of its current partitions as its share allows, so a join
or leave moves the fewest partitions and the rest keep flowing. The result
depends only on the inputs (no randomness), so two computations agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def assign(
    partitions: Sequence[int],
    members: Sequence[str],
    current: Mapping[str, frozenset[int]],
) -> dict[str, frozenset[int]]:
    """New target assignment for ``members`` (in join order) over ``partitions``."""
    if not members:
        return {}
    valid = set(partitions)
    held = {m: sorted(p for p in current.get(m, frozenset()) if p in valid) for m in members}
    base, extra = divmod(len(partitions), len(members))
    # The members that already hold the most get the ceil shares: fewest moves.
    by_holding = sorted(members, key=lambda m: (-len(held[m]), members.index(m)))
    capacity = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    result: dict[str, list[int]] = {m: [] for m in members}
    taken: set[int] = set()
    for m in members:
        for p in held[m]:
            if len(result[m]) < capacity[m] and p not in taken:
                result[m].append(p)
                taken.add(p)
    free = [p for p in sorted(valid) if p not in taken]
    for m in members:
        while len(result[m]) < capacity[m] and free:
            result[m].append(free.pop(0))
    return {m: frozenset(ps) for m, ps in result.items()}


def moved_partitions(
    before: Mapping[str, frozenset[int]], after: Mapping[str, frozenset[int]]
) -> set[int]:
    owner_before = {p: m for m, ps in before.items() for p in ps}
    owner_after = {p: m for m, ps in after.items() for p in ps}
    return {
        p
        for p in owner_before.keys() | owner_after.keys()
        if owner_before.get(p) != owner_after.get(p)
    }
