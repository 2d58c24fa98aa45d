"""What brokers hold back during a repartition, and which old partitions feed which new ones."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.control.model import Transition
from headrace.protocol.coordination import TopicPlacement, TransitionPlacement


def marker(before: int, after: int) -> Transition:
    return Transition("default/r", before, after, 1, 2, 0, 30_000)


@pytest.mark.parametrize(
    ("before", "after", "q", "feeders"),
    [(4, 8, 5, (1,)), (8, 12, 9, (1, 5)), (12, 6, 2, (2, 8)), (3, 5, 4, (0, 1, 2))],
)
def test_feeders(before: int, after: int, q: int, feeders: tuple[int, ...]) -> None:
    assert marker(before, after).feeders(q) == feeders


@given(st.binary(min_size=1, max_size=16), st.integers(1, 24), st.integers(1, 24))
def test_every_keys_old_partition_feeds_its_new_one(key: bytes, before: int, after: int) -> None:
    h = zlib.crc32(key)
    assert h % before in marker(before, after).feeders(h % after)


def test_holds_start_at_the_cutover_and_end_when_released() -> None:
    t = TransitionPlacement(4, 8, 2, {0: 100}, {"billing": [0]})
    assert t.hold("billing", 0, None) is None  # released
    assert t.hold("other", 0, 90) == 100  # the controller's offset wins over the local one
    assert t.hold("other", 1, 40) == 40  # not reported yet: the leader's own record
    assert t.hold("other", 2, None) == 0  # nothing known: hold everything
    assert t.hold("other", 5, None) == 0  # added by the grow: every record is post-cutover
    shrink = TransitionPlacement(12, 6, 3)
    assert shrink.hold("other", 8, None) is None  # retiring: only pre-cutover records


def test_a_grow_holds_a_retired_partition_it_routes_to_again_at_its_own_log_end() -> None:
    # 4 -> 2 -> 4: 2 and 3 come back with their older records, which a cohort created
    # after the shrink must be able to read (the shrink's history waits for them).
    grow = TransitionPlacement(2, 4, 3, {0: 50, 1: 40, 2: 30})
    assert grow.hold("c", 2, 25) == 30  # measured by the controller
    assert grow.hold("c", 3, 20) == 20  # not reported yet: the leader's own record
    assert grow.hold("c", 3, None) == 0  # nothing known: hold everything
    assert grow.routed_anew_from(2, None) == 30 and grow.routed_anew_from(3, 20) == 20
    assert grow.routed_anew_from(1, 40) is None  # routed to before the grow too


def test_the_routing_count_and_the_transition_travel_in_the_topology() -> None:
    placement = TopicPlacement(
        "default/t", 12, 3, 1, {}, [], {}, TransitionPlacement(12, 6, 3, {0: 5}, {"c": [1]})
    )
    back = TopicPlacement.from_json(placement.to_json())
    assert back == placement and back.routing_partitions == 6
    assert (
        TopicPlacement.from_json({**placement.to_json(), "transition": None}).routing_partitions
        == 12
    )
