"""The client's routing cache and the keyed partitioner (part of the protocol)."""

from __future__ import annotations

import dataclasses
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.client import routing
from headrace.errors import UnknownPartition, UnknownTopic
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.messages import TopicRouting, TopologySnapshot

B1 = BrokerEndpoint(1, "10.0.0.1", 9092)
B2 = BrokerEndpoint(2, "10.0.0.2", 9092)
B3 = BrokerEndpoint(3, "10.0.0.3", 9092)


def snapshot(
    generation: int, owners: list[int] | None = None, version: int = 1
) -> TopologySnapshot:
    owners = owners if owners is not None else [1, 2, 1]
    topic = TopicRouting("default/orders", len(owners), version, owners, [0] * len(owners))
    return TopologySnapshot(generation, "cluster-a", [B1, B2], [topic])


# --------------------------------------------------------------------------- partitioner


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        (b"", 8, 0),
        (b"a", 8, 3),
        (b"key-1", 8, 2),
        (b"key-2", 8, 0),
        (b"user-42", 12, 7),
        (b"user-42", 3, 1),
    ],
)
def test_partition_for_key_fixed_vectors(key: bytes, partitions: int, expected: int) -> None:
    # These numbers are the protocol: any client in any language must agree.
    assert routing.partition_for_key(key, partitions) == expected


def test_partition_for_key_is_crc32_mod_n() -> None:
    assert routing.partition_for_key(b"key-1", 8) == zlib.crc32(b"key-1") % 8 == 2


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 10_000))
def test_partition_for_key_is_in_range_and_stable(key: bytes, partitions: int) -> None:
    p = routing.partition_for_key(key, partitions)
    assert 0 <= p < partitions
    assert p == routing.partition_for_key(bytes(key), partitions)


# --------------------------------------------------------------------------- generations


def test_first_snapshot_is_applied_whatever_its_generation() -> None:
    cache = routing.RoutingCache()
    assert cache.apply(snapshot(0))
    assert cache.owner("orders", 1) == B2


def test_older_or_equal_push_is_ignored() -> None:
    cache = routing.RoutingCache()
    assert cache.apply(snapshot(5, [1, 1, 1]))
    assert not cache.apply(snapshot(5, [2, 2, 2]))
    assert not cache.apply(snapshot(4, [2, 2, 2]))
    assert cache.generation == 5
    assert cache.owner("orders", 0) == B1


def test_newer_push_replaces_everything() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(5, [1, 1, 1]))
    newer = TopologySnapshot(6, "cluster-b", [B3], [TopicRouting("default/x", 1, 1, [3], [0])])
    assert cache.apply(newer)
    assert cache.cluster_id == "cluster-b"
    assert cache.owner("x", 0) == B3
    with pytest.raises(UnknownTopic):
        cache.topic("orders")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=15))
def test_generation_never_goes_back(generations: list[int]) -> None:
    cache = routing.RoutingCache()
    for i, gen in enumerate(generations):
        applied = cache.apply(snapshot(gen))
        assert applied == (i == 0 or gen > max(generations[:i]))
    assert cache.generation == max(generations)


def test_a_counter_that_started_again_is_newer_than_the_old_one() -> None:
    cache = routing.RoutingCache()
    assert cache.apply(snapshot(40, [1, 1, 1]))  # a counter kept since before epochs
    restarted = dataclasses.replace(snapshot(2, [2, 2, 2]), epoch=1_700_000_000_000)
    assert cache.apply(restarted)
    assert (cache.epoch, cache.generation) == (1_700_000_000_000, 2)
    assert cache.owner("orders", 0) == B2
    # the old counter's late pushes, however high, stay older
    assert not cache.apply(snapshot(41, [1, 1, 1]))
    assert cache.apply(dataclasses.replace(snapshot(3, [1, 2, 1]), epoch=1_700_000_000_000))


def test_the_epoch_travels_in_the_snapshot_and_defaults_to_zero() -> None:
    with_epoch = dataclasses.replace(snapshot(7), epoch=123)
    assert TopologySnapshot.decode(with_epoch.encode()).order == (123, 7)
    legacy = json.loads(snapshot(7).encode())
    del legacy["epoch"]  # what a broker from before epochs sends
    assert TopologySnapshot.decode(json.dumps(legacy).encode()).order == (0, 7)


# --------------------------------------------------------------------------- lookups


def test_topic_names_are_canonicalised() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1))
    assert cache.topic("orders") is cache.topic("default/orders")
    with pytest.raises(UnknownTopic):
        cache.topic("other/orders")


def test_lookup_before_any_snapshot_is_unknown_topic() -> None:
    with pytest.raises(UnknownTopic):
        routing.RoutingCache().topic("orders")


@pytest.mark.parametrize("partition", [-1, 3, 100])
def test_partition_outside_the_topic_is_unknown(partition: int) -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1))
    with pytest.raises(UnknownPartition):
        cache.owner("orders", partition)


def test_owner_without_a_known_broker_is_none() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1, [1, -1, 9]))
    assert cache.owner("orders", 0) == B1
    assert cache.owner("orders", 1) is None
    assert cache.owner("orders", 2) is None


# --------------------------------------------------------------------------- redirects


def test_redirect_moves_one_partition_and_learns_the_broker() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1, [1, 2, 1]))
    cache.note_redirect("orders", 2, B3, 1)
    assert cache.owner("orders", 2) == B3
    assert cache.owner("orders", 0) == B1
    assert cache.topic("orders").owners == [1, 2, 3]
    assert cache.generation == 1


def test_redirect_raises_the_version_but_never_lowers_it() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1, version=4))
    cache.note_redirect("orders", 0, None, 7)
    assert cache.topic("orders").partitioning_version == 7
    assert cache.topic("orders").owners == [1, 2, 1]
    cache.note_redirect("orders", 0, None, 2)
    assert cache.topic("orders").partitioning_version == 7


def test_redirect_for_an_unknown_topic_is_ignored() -> None:
    cache = routing.RoutingCache()
    cache.note_redirect("orders", 0, B3, 9)
    assert cache.topics is None
    cache.apply(snapshot(1))
    cache.note_redirect("nope", 0, B3, 9)
    assert set(cache.topics or {}) == {"default/orders"}
    assert 3 not in (cache.brokers or {})


def test_redirect_to_a_partition_out_of_range_changes_no_owner() -> None:
    cache = routing.RoutingCache()
    cache.apply(snapshot(1))
    cache.note_redirect("orders", 10, B3, 1)
    assert cache.topic("orders").owners == [1, 2, 1]


def test_redirect_does_not_mutate_the_applied_snapshot() -> None:
    snap = snapshot(1)
    cache = routing.RoutingCache()
    cache.apply(snap)
    cache.note_redirect("orders", 0, B2, 1)
    assert snap.topics[0].owners == [1, 2, 1]
    assert cache.owner("orders", 0) == B2
