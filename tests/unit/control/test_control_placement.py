"""Placement: distinct brokers, balance, determinism, stickiness when a topic grows."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control.placement import NotEnoughBrokers, place

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
