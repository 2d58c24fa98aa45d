"""Cross-broker cohort plans: which member should hold which partition (pure).

Theory of operation
-------------------
Every broker enforces its own delivery gates (``cohorts.gates``); the plan
only tells the gates whom to prefer, so it is advisory: a plan one heartbeat
late costs balance, never correctness. The controller plans each
(topic, cohort) from:

* the **members**: the union of the members that live brokers report as
  connected for that cohort, each with the set of brokers it is connected to;
* the **owner** of each partition: its leader, or the candidate promoting;
* the **previous plan**, published and persisted.

The assignment is built in three passes, each moving as little as it can:

    pass       what it does                                             why
    ---------  -------------------------------------------------------  ----------------
    keep       each member keeps its previous partitions, except ones   sticky
               whose owner it is not connected to while some other
               member is (departed members keep nothing)
    cover      each unheld partition, most constrained first, goes to   coverage first
               the least-loaded member connected to its owner (any
               member if none is), preferring members holding the
               fewest partitions on that owner
    even out   while a member holds 2+ more than another that could    balanced
               take one of its partitions, move one (the one whose
               owner the receiver holds fewest on)                       and spread

"Could take" means: connected to the partition's owner, or nobody is. With no
connection constraints the result is balanced (everyone holds floor(P/M) or
ceil(P/M)); with constraints, every partition an eligible member exists for
gets one, and the rest is as even as the constraints allow.

The passes leave a plan they produced unchanged (it is a fixed point), which
is what makes a restarted controller's first plan, seeded from the published
one, identical to it: the **generation**, per cohort and durable, bumps only
when the assignment's content changes, so reseeding bumps nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from headrace.control.model import CohortPlan

#: member id -> the brokers it is connected to
Connections = Mapping[str, frozenset[int]]


def assign_across(
    owners: Sequence[int | None],
    connections: Connections,
    current: Mapping[str, Sequence[int]],
) -> dict[str, tuple[int, ...]]:
    """Member -> sorted partitions, for partitions ``0..len(owners)-1``.

    ``owners[p]`` is the broker serving partition ``p`` (None while it has
    none); ``current`` is the previous assignment, the stickiness seed.
    """
    members = sorted(connections)
    if not members:
        return {}
    partitions = range(len(owners))

    def can_serve(m: str, p: int) -> bool:
        owner = owners[p]
        return owner is None or owner in connections[m]

    eligible = {p: [m for m in members if can_serve(m, p)] for p in partitions}

    def may_hold(m: str, p: int) -> bool:
        return not eligible[p] or can_serve(m, p)

    held: dict[str, set[int]] = {m: set() for m in members}
    taken: set[int] = set()
    # keep
    for m in members:
        for p in sorted(set(current.get(m, ()))):
            if p in partitions and p not in taken and may_hold(m, p):
                held[m].add(p)
                taken.add(p)

    def on_owner(m: str, p: int) -> int:
        return sum(1 for q in held[m] if owners[q] == owners[p])

    # cover: the most constrained partitions first, so they get an eligible member
    unheld = [p for p in partitions if p not in taken]
    for p in sorted(unheld, key=lambda p: (len(eligible[p]) or len(members), p)):
        pool = eligible[p] or members
        best = min(pool, key=lambda m: (len(held[m]), on_owner(m, p), m))
        held[best].add(p)
    # even out: each move lowers the sum of squared loads, so this ends
    while (move := _improving_move(members, held, may_hold, on_owner)) is not None:
        giver, taker, p = move
        held[giver].discard(p)
        held[taker].add(p)
    return {m: tuple(sorted(held[m])) for m in members}


def _improving_move(
    members: list[str],
    held: dict[str, set[int]],
    may_hold: Callable[[str, int], bool],
    on_owner: Callable[[str, int], int],
) -> tuple[str, str, int] | None:
    """(giver, taker, partition) where giver holds 2+ more than taker; None if no such move."""
    for giver in sorted(members, key=lambda m: (-len(held[m]), m)):
        for taker in sorted(members, key=lambda m: (len(held[m]), m)):
            if len(held[giver]) < len(held[taker]) + 2:
                break
            movable = [p for p in held[giver] if may_hold(taker, p)]
            if movable:
                best = min(movable, key=lambda p: (on_owner(taker, p), -on_owner(giver, p), p))
                return giver, taker, best
    return None


def plan(
    cohort: str,
    owners: Sequence[int | None],
    connections: Connections,
    previous: CohortPlan | None,
) -> CohortPlan | None:
    """The cohort's next plan; ``previous`` itself when the assignment is unchanged.

    No previous plan and no members: no plan (None). A cohort whose members
    all left keeps its document with an empty assignment, so its generation
    never restarts (a broker would otherwise ignore the new, lower one).
    """
    if previous is None and not connections:
        return None
    current = previous.assignment if previous is not None else {}
    assignment = assign_across(owners, connections, current)
    if previous is not None and dict(previous.assignment) == assignment:
        return previous
    generation = previous.generation + 1 if previous is not None else 1
    return CohortPlan(cohort, generation, assignment)


def uncovered(owners: Sequence[int | None], connections: Connections) -> dict[int, list[int]]:
    """Owner -> the partitions it serves that no member of the cohort is connected to.

    Nobody can be delivered those partitions: a plan gives them to a member, but each
    broker only admits members connected to it, so they wait until one joins there. A
    cohort with no members at all is left out (nobody consumes; nothing is stuck).
    Moments of this are normal while a leader moves (the members join the new one);
    lasting, it means the members never joined that broker.
    """
    if not connections:
        return {}
    reached = frozenset().union(*connections.values())
    out: dict[int, list[int]] = {}
    for partition, owner in enumerate(owners):
        if owner is not None and owner not in reached:
            out.setdefault(owner, []).append(partition)
    return out
