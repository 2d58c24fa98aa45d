"""Sticky, balanced assignment: balance, minimal movement, determinism."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.cohorts.assignment import assign, moved_partitions

SETTINGS = settings(max_examples=200, deadline=None)

member_pool = [f"m{i}" for i in range(12)]
member_lists = st.lists(st.sampled_from(member_pool), min_size=1, max_size=8, unique=True)
partition_lists = st.lists(st.integers(0, 60), max_size=40, unique=True)


def check_balanced(
    partitions: list[int], members: list[str], result: dict[str, frozenset[int]]
) -> None:
    assert set(result) == set(members)
    owned = [p for ps in result.values() for p in ps]
    assert sorted(owned) == sorted(partitions), "every partition exactly once"
    lo, hi = len(partitions) // len(members), -(-len(partitions) // len(members))
    assert all(lo <= len(ps) <= hi for ps in result.values())


@SETTINGS
@given(partition_lists, member_lists)
def test_fresh_assignment_is_balanced(partitions: list[int], members: list[str]) -> None:
    check_balanced(partitions, members, assign(partitions, members, {}))


@SETTINGS
@given(partition_lists, member_lists, st.data())
def test_any_current_state_gives_a_balanced_result(
    partitions: list[int], members: list[str], data: st.DataObject
) -> None:
    # arbitrary, even overlapping or stale, current holdings
    current = data.draw(
        st.dictionaries(
            st.sampled_from(member_pool),
            st.frozensets(st.integers(0, 70), max_size=10),
            max_size=6,
        ),
        label="current",
    )
    result = assign(partitions, members, current)
    check_balanced(partitions, members, result)


@SETTINGS
@given(partition_lists, member_lists, st.sampled_from(member_pool))
def test_a_join_moves_only_the_new_members_share(
    partitions: list[int], members: list[str], newcomer: str
) -> None:
    if newcomer in members:
        return
    before = assign(partitions, members, {})
    after = assign(partitions, [*members, newcomer], before)
    check_balanced(partitions, [*members, newcomer], after)
    moved = moved_partitions(before, after)
    assert moved == set(after[newcomer])
    for m in members:
        assert after[m] <= before[m], "old members only give partitions away"


@SETTINGS
@given(partition_lists, member_lists, st.data())
def test_a_leave_moves_only_the_leavers_partitions(
    partitions: list[int], members: list[str], data: st.DataObject
) -> None:
    if len(members) < 2:
        return
    leaver = data.draw(st.sampled_from(members), label="leaver")
    before = assign(partitions, members, {})
    rest = [m for m in members if m != leaver]
    after = assign(partitions, rest, before)
    check_balanced(partitions, rest, after)
    assert moved_partitions(before, after) == set(before[leaver])
    for m in rest:
        assert before[m] <= after[m], "survivors keep everything they had"


@SETTINGS
@given(partition_lists, member_lists, st.randoms(use_true_random=False))
def test_deterministic_whatever_the_order_of_current(
    partitions: list[int], members: list[str], rnd: random.Random
) -> None:
    current = assign(partitions, members[: len(members) // 2 + 1], {})
    shuffled = list(current.items())
    rnd.shuffle(shuffled)
    a = assign(partitions, members, current)
    b = assign(list(reversed(partitions)), members, dict(shuffled))
    assert a == b


def test_fixed_vector() -> None:
    assert assign([0, 1, 2, 3, 4], ["a", "b"], {}) == {
        "a": frozenset({0, 1, 2}),
        "b": frozenset({3, 4}),
    }


def test_biggest_holders_keep_the_ceil_share() -> None:
    current = {"a": frozenset({0}), "b": frozenset({1, 2, 3, 4})}
    result = assign([0, 1, 2, 3, 4], ["a", "b"], current)
    assert result == {"a": frozenset({0, 4}), "b": frozenset({1, 2, 3})}


def test_no_members_no_assignment() -> None:
    assert assign([1, 2, 3], [], {"a": frozenset({1})}) == {}


def test_more_members_than_partitions() -> None:
    result = assign([7], ["a", "b", "c"], {"c": frozenset({7})})
    assert result == {"a": frozenset(), "b": frozenset(), "c": frozenset({7})}


def test_partitions_that_left_are_dropped_from_holdings() -> None:
    result = assign([0, 1], ["a"], {"a": frozenset({0, 1, 9})})
    assert result == {"a": frozenset({0, 1})}


def test_a_partition_claimed_twice_goes_to_the_earlier_member() -> None:
    current = {"a": frozenset({0, 1}), "b": frozenset({1, 2, 3})}
    result = assign([0, 1, 2, 3], ["a", "b"], current)
    assert result["a"] == frozenset({0, 1})
    assert result["b"] == frozenset({2, 3})


def test_moved_partitions_counts_lost_and_gained() -> None:
    before = {"a": frozenset({0, 1}), "b": frozenset({2})}
    after = {"a": frozenset({0}), "b": frozenset({2, 1}), "c": frozenset({3})}
    assert moved_partitions(before, after) == {1, 3}
    assert moved_partitions(before, before) == set()
