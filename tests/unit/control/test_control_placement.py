"""Placement: distinct brokers, balance, determinism, stickiness when a topic grows, racks."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control.placement import (
    NotEnoughBrokers,
    Racks,
    place,
    rack_of,
    rack_span,
    wanted_span,
)

SETTINGS = settings(max_examples=300, deadline=None)

broker_sets = st.lists(st.integers(0, 40), min_size=1, max_size=9, unique=True)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[int], int, int]:
    brokers = draw(broker_sets)
    replicas = draw(st.integers(1, min(len(brokers), 4)))
    partitions = draw(st.integers(1, 40))
    return brokers, replicas, partitions


other_topics = st.lists(
    st.lists(st.integers(0, 40), min_size=1, max_size=4, unique=True).map(tuple), max_size=20
)


def spread(counts: Counter[int], brokers: list[int]) -> int:
    values = [counts[b] for b in brokers]
    return max(values) - min(values)


@SETTINGS
@given(layouts(), other_topics)
def test_fresh_placement_is_distinct_and_even(
    layout: tuple[list[int], int, int], others: list[tuple[int, ...]]
) -> None:
    brokers, replicas, partitions = layout
    result = place(partitions, replicas, brokers, others=others)
    assert len(result) == partitions
    for r in result:
        assert len(r) == replicas
        assert len(set(r)) == replicas, "a partition's replicas are on distinct brokers"
        assert set(r) <= set(brokers)
    leads = Counter(r[0] for r in result)
    holds = Counter(b for r in result for b in r)
    assert spread(leads, brokers) <= 1, "leaders within one of each other"
    assert spread(holds, brokers) <= 1, "replicas within one of each other"


@SETTINGS
@given(layouts(), other_topics, st.randoms(use_true_random=False))
def test_placement_is_deterministic(
    layout: tuple[list[int], int, int], others: list[tuple[int, ...]], rnd: object
) -> None:
    brokers, replicas, partitions = layout
    shuffled = list(brokers)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    first = place(partitions, replicas, brokers, others=others)
    assert place(partitions, replicas, shuffled, others=others) == first
    assert place(partitions, replicas, set(brokers), others=list(others)) == first


@SETTINGS
@given(layouts(), st.integers(0, 30))
def test_growing_keeps_existing_replicas_and_stays_even(
    layout: tuple[list[int], int, int], more: int
) -> None:
    brokers, replicas, partitions = layout
    before = place(partitions, replicas, brokers)
    after = place(partitions + more, replicas, brokers, existing=before)
    assert after[:partitions] == before, "existing owners are kept, leader order too"
    for r in after[partitions:]:
        assert len(set(r)) == replicas
    assert spread(Counter(b for r in after for b in r), brokers) <= 1


def test_growing_after_a_broker_died_keeps_its_replicas() -> None:
    before = place(3, 2, [0, 1, 2])
    after = place(5, 2, [0, 1], existing=before)
    assert after[:3] == before
    assert all(set(r) == {0, 1} for r in after[3:])


def test_other_topics_steer_single_partition_topics_apart() -> None:
    placed: list[tuple[int, ...]] = []
    for _ in range(5):
        placed.extend(place(1, 1, range(5), others=placed))
    assert sorted(r[0] for r in placed) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("brokers", range(2, 13))
def test_replica_pairs_vary(brokers: int) -> None:
    # with two replicas and as many partitions as broker pairs, (nearly) every pair is used
    # once, so losing one broker spreads its partitions' new leaders over the others
    pairs = brokers * (brokers - 1) // 2
    result = place(pairs, 2, range(brokers))
    distinct = len({frozenset(r) for r in result})
    assert distinct >= 0.85 * pairs
    if brokers <= 6:
        assert distinct == pairs


def test_a_known_layout() -> None:
    assert place(3, 2, [0, 1, 2]) == ((0, 1), (1, 2), (2, 0))


def test_more_replicas_than_brokers_is_refused() -> None:
    with pytest.raises(NotEnoughBrokers, match="3 replicas need 3 eligible brokers, 2") as exc:
        place(1, 3, [4, 7])
    assert exc.value.retriable


def test_nothing_new_to_place_needs_no_brokers() -> None:
    existing = ((1, 2),)
    assert place(1, 2, [], existing=existing) == existing


@pytest.mark.parametrize(
    ("partitions", "replicas", "words"), [(0, 1, "never removes"), (1, 0, "at least 1")]
)
def test_nonsense_is_a_value_error(partitions: int, replicas: int, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        place(partitions, replicas, [0], existing=[(0,)])


# --------------------------------------------------------------------------- racks


@st.composite
def even_racks(draw: st.DrawFn) -> tuple[list[int], Racks, int, int]:
    """Brokers in racks of one size (zones of a cloud region), numbered round the racks."""
    count = draw(st.integers(1, 4))
    size = draw(st.integers(1, 3))
    brokers = list(range(count * size))
    racks = {b: f"zone-{b % count}" for b in brokers}
    replicas = draw(st.integers(1, min(len(brokers), 4)))
    return brokers, racks, replicas, draw(st.integers(1, 40))


@st.composite
def any_racks(draw: st.DrawFn) -> tuple[list[int], Racks, int, int]:
    """Racks of any sizes; some brokers may have none (each is then a rack of its own)."""
    brokers = draw(broker_sets)
    named = {b: draw(st.sampled_from(["a", "b", "c", ""])) for b in brokers}
    racks = {b: r for b, r in named.items() if r}
    replicas = draw(st.integers(1, min(len(brokers), 4)))
    return brokers, racks, replicas, draw(st.integers(1, 40))


@SETTINGS
@given(any_racks(), other_topics)
def test_every_partition_spans_as_many_racks_as_it_can(
    layout: tuple[list[int], Racks, int, int], others: list[tuple[int, ...]]
) -> None:
    brokers, racks, replicas, partitions = layout
    result = place(partitions, replicas, brokers, others=others, racks=racks)
    span = wanted_span(replicas, brokers, racks)
    assert span == min(replicas, len({rack_of(b, racks) for b in brokers}))
    for r in result:
        assert len(set(r)) == replicas
        assert rack_span(r, racks) == span, f"{r} covers too few racks of {racks}"
    # a rack's brokers share its load within one (a small rack's brokers may hold more)
    holds = Counter(b for r in result for b in r)
    by_rack: dict[tuple[str, int], list[int]] = {}
    for b in brokers:
        by_rack.setdefault(rack_of(b, racks), []).append(holds[b])
    for counts in by_rack.values():
        assert max(counts) - min(counts) <= 1


@SETTINGS
@given(even_racks())
def test_racks_of_one_size_keep_brokers_within_one(
    layout: tuple[list[int], Racks, int, int],
) -> None:
    brokers, racks, replicas, partitions = layout
    result = place(partitions, replicas, brokers, racks=racks)
    assert all(rack_span(r, racks) == wanted_span(replicas, brokers, racks) for r in result)
    assert spread(Counter(b for r in result for b in r), brokers) <= 1
    assert spread(Counter(r[0] for r in result), brokers) <= 1


@SETTINGS
@given(even_racks(), st.integers(0, 30))
def test_growing_with_racks_keeps_existing_and_spans_racks(
    layout: tuple[list[int], Racks, int, int], more: int
) -> None:
    brokers, racks, replicas, partitions = layout
    before = place(partitions, replicas, brokers, racks=racks)
    after = place(partitions + more, replicas, brokers, existing=before, racks=racks)
    assert after[:partitions] == before
    assert all(rack_span(r, racks) == wanted_span(replicas, brokers, racks) for r in after)
    assert spread(Counter(b for r in after for b in r), brokers) <= 1


@SETTINGS
@given(layouts(), other_topics)
def test_no_racks_places_as_before(
    layout: tuple[list[int], int, int], others: list[tuple[int, ...]]
) -> None:
    # a broker without a rack is a rack of its own, so naming no racks changes nothing
    brokers, replicas, partitions = layout
    one_each = {b: f"rack-of-{b}" for b in brokers}
    assert place(partitions, replicas, brokers, others=others) == place(
        partitions, replicas, brokers, others=others, racks=one_each
    )


def test_three_replicas_over_three_zones_of_two_brokers() -> None:
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    result = place(6, 3, range(6), racks=racks)
    assert all(sorted(racks[b] for b in r) == ["a", "b", "c"] for r in result)
