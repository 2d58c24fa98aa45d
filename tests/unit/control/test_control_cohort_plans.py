"""Cohort plans: coverage, balance, stickiness, fixed point, and the per-cohort generation."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control.cohort_plans import assign_across, plan
from headrace.control.model import COHORT_PLAN_JSON, CohortPlan

SETTINGS = settings(max_examples=200, deadline=None)

member_pool = [f"m{i}" for i in range(8)]
owner_lists = st.lists(st.none() | st.integers(0, 3), max_size=24)


@st.composite
def cohorts(draw: st.DrawFn, *, everyone_everywhere: bool = False) -> dict[str, frozenset[int]]:
    members = draw(st.lists(st.sampled_from(member_pool), max_size=6, unique=True))
    if everyone_everywhere:
        return {m: frozenset(range(4)) for m in members}
    return {m: draw(st.frozensets(st.integers(0, 3))) for m in members}


currents = st.dictionaries(
    st.sampled_from([*member_pool, "gone"]), st.lists(st.integers(0, 30), max_size=8)
)


def flat(assignment: dict[str, tuple[int, ...]]) -> list[int]:
    return sorted(p for ps in assignment.values() for p in ps)


@SETTINGS
@given(owner_lists, cohorts(), currents)
def test_every_partition_is_planned_exactly_once(
    owners: list[int | None], connections: dict[str, frozenset[int]], current: dict[str, list[int]]
) -> None:
    result = assign_across(owners, connections, current)
    assert set(result) == set(connections), "every member appears, nobody else"
    if connections:
        assert flat(result) == list(range(len(owners)))
    for ps in result.values():
        assert list(ps) == sorted(ps)


@SETTINGS
@given(owner_lists, cohorts(), currents)
def test_coverage_first(
    owners: list[int | None], connections: dict[str, frozenset[int]], current: dict[str, list[int]]
) -> None:
    # a partition goes to a member connected to its owner whenever one exists
    result = assign_across(owners, connections, current)
    holder = {p: m for m, ps in result.items() for p in ps}
    for p, owner in enumerate(owners):
        if owner is not None and any(owner in c for c in connections.values()):
            assert owner in connections[holder[p]]


@SETTINGS
@given(owner_lists, cohorts(everyone_everywhere=True), currents)
def test_without_constraints_the_plan_is_balanced(
    owners: list[int | None], connections: dict[str, frozenset[int]], current: dict[str, list[int]]
) -> None:
    result = assign_across(owners, connections, current)
    if connections:
        sizes = [len(ps) for ps in result.values()]
        assert max(sizes) - min(sizes) <= 1


@SETTINGS
@given(owner_lists, cohorts(), currents)
def test_a_plan_is_a_fixed_point(
    owners: list[int | None], connections: dict[str, frozenset[int]], current: dict[str, list[int]]
) -> None:
    # what makes a reseeded controller reproduce the published plan exactly
    result = assign_across(owners, connections, current)
    assert assign_across(owners, connections, result) == result


@SETTINGS
@given(owner_lists, cohorts(everyone_everywhere=True), st.sampled_from(member_pool))
def test_a_join_moves_only_the_newcomers_share(
    owners: list[int | None], connections: dict[str, frozenset[int]], newcomer: str
) -> None:
    if newcomer in connections or not connections:
        return
    before = assign_across(owners, connections, {})
    after = assign_across(owners, connections | {newcomer: frozenset(range(4))}, before)
    moved = [p for p in range(len(owners)) if _holder(after, p) != _holder(before, p)]
    assert sorted(moved) == list(after[newcomer]), "only the newcomer's share moves"
    assert len(moved) == len(owners) // (len(connections) + 1)


@SETTINGS
@given(owner_lists, cohorts(everyone_everywhere=True), st.data())
def test_a_leave_moves_only_the_leavers_partitions(
    owners: list[int | None], connections: dict[str, frozenset[int]], data: st.DataObject
) -> None:
    if len(connections) < 2:
        return
    leaver = data.draw(st.sampled_from(sorted(connections)))
    before = assign_across(owners, connections, {})
    rest = {m: c for m, c in connections.items() if m != leaver}
    after = assign_across(owners, rest, before)
    for m in rest:
        assert set(before[m]) <= set(after[m]), "stayers keep everything they had"


def _holder(assignment: dict[str, tuple[int, ...]], p: int) -> str:
    return next(m for m, ps in assignment.items() if p in ps)


def test_partitions_spread_over_owners() -> None:
    # two brokers own two partitions each; each of two members gets one on each broker
    result = assign_across([0, 0, 1, 1], {"a": frozenset({0, 1}), "b": frozenset({0, 1})}, {})
    assert result == {"a": (0, 2), "b": (1, 3)}


def test_a_member_not_connected_to_the_owner_loses_the_partition_to_one_that_is() -> None:
    current = {"a": [0, 1], "b": [2, 3]}
    result = assign_across([0, 0, 1, 1], {"a": frozenset({1}), "b": frozenset({0, 1})}, current)
    assert set(result["b"]) >= {0, 1}


def test_nobody_connected_to_the_owner_keeps_the_previous_holder() -> None:
    current = {"a": [0], "b": [1]}
    result = assign_across([7, 7], {"a": frozenset({0}), "b": frozenset({0})}, current)
    assert result == {"a": (0,), "b": (1,)}


def test_no_members_no_assignment() -> None:
    assert assign_across([0, 1], {}, {"a": [0]}) == {}


# --------------------------------------------------------------------------- plans and generations

ALL = frozenset({0, 1})


def test_a_first_plan_has_generation_1() -> None:
    new = plan("c", [0, 1], {"a": ALL}, None)
    assert new == CohortPlan("c", 1, {"a": (0, 1)})


def test_no_members_and_no_plan_is_no_plan() -> None:
    assert plan("c", [0, 1], {}, None) is None


def test_an_unchanged_plan_is_returned_as_is() -> None:
    previous = CohortPlan("c", 5, {"a": (0,), "b": (1,)})
    assert plan("c", [0, 1], {"a": ALL, "b": ALL}, previous) is previous


def test_generation_bumps_only_on_content_change() -> None:
    gens = []
    current = None
    for members in (["a"], ["a"], ["a", "b"], ["a", "b"], ["b", "a"], ["a"], ["a"]):
        current = plan("c", [0, 1, 2, 3], {m: ALL for m in members}, current)
        assert current is not None
        gens.append(current.generation)
    assert gens == [1, 1, 2, 2, 2, 3, 3]


def test_when_everyone_leaves_the_plan_stays_with_nobody_and_a_new_generation() -> None:
    previous = CohortPlan("c", 4, {"a": (0, 1)})
    gone = plan("c", [0, 1], {}, previous)
    assert gone == CohortPlan("c", 5, {})
    assert plan("c", [0, 1], {}, gone) is gone
    back = plan("c", [0, 1], {"a": ALL}, gone)
    assert back is not None
    assert back.generation == 6, "never restarts at 1"


def test_a_reseeded_plan_bumps_nothing() -> None:
    connections = {"a": ALL, "b": frozenset({1}), "c": ALL}
    first = plan("c", [0, 1, 0, 1, 1], connections, None)
    assert first is not None
    reread = COHORT_PLAN_JSON.load(json.loads(json.dumps(COHORT_PLAN_JSON.dump(first))))
    again = plan("c", [0, 1, 0, 1, 1], connections, reread)
    assert again == first
    assert again is reread
