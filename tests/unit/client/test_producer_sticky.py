"""``Producer._choose`` for unkeyed records: sticky turns counted in bytes, so the spread
over partitions does not depend on how fast records arrive or when lingering batches are
sealed; keys and explicit partitions are never charged to a turn."""

from __future__ import annotations

import itertools

from headrace.client.producer import Producer, _Accumulator
from headrace.client.routing import partition_for_key

TOPIC = "default/t"
RECORD = 100 + 8  # a 100-byte value as the accumulators count it


def producer(**settings: int) -> Producer:
    p = Producer("127.0.0.1:1", **settings)  # type: ignore[arg-type]
    p._round_robin = itertools.count()  # the first turn at partition 0, for readable runs
    return p


def runs(choices: list[int]) -> list[tuple[int, int]]:
    """(partition, how many in a row) for consecutive equal choices."""
    return [(p, len(list(group))) for p, group in itertools.groupby(choices)]


def test_each_turn_takes_sticky_bytes_then_the_next_partition_follows() -> None:
    p = producer(sticky_bytes=10 * RECORD)
    choices = [p._choose(TOPIC, 4, None, None, RECORD) for _ in range(90)]
    assert runs(choices) == [(0, 10), (1, 10), (2, 10), (3, 10)] * 2 + [(0, 10)]


def test_a_turn_ends_early_when_the_partition_batch_has_no_room() -> None:
    p = producer(sticky_bytes=10 * RECORD)
    assert p._choose(TOPIC, 3, None, None, RECORD) == 0
    p._accumulators[(TOPIC, 0)] = _Accumulator(size=p.batch_bytes - RECORD // 2)
    assert p._choose(TOPIC, 3, None, None, RECORD) == 1


def test_sticky_bytes_is_at_most_a_batch() -> None:
    assert producer(batch_bytes=5 * RECORD, sticky_bytes=1 << 20).sticky_bytes == 5 * RECORD


def test_keys_and_explicit_partitions_do_not_use_the_turn() -> None:
    p = producer(sticky_bytes=2 * RECORD)
    assert p._choose(TOPIC, 4, None, None, RECORD) == 0
    for i in range(20):
        key = b"k%d" % i
        assert p._choose(TOPIC, 4, key, None, RECORD) == partition_for_key(key, 4)
        assert p._choose(TOPIC, 4, None, 3, RECORD) == 3
    assert p._choose(TOPIC, 4, None, None, RECORD) == 0, "the turn had room for one more"
    assert p._choose(TOPIC, 4, None, None, RECORD) == 1


def test_a_turn_at_a_partition_that_no_longer_routes_starts_over() -> None:
    p = producer(sticky_bytes=10 * RECORD)
    for _ in range(35):
        p._choose(TOPIC, 6, None, None, RECORD)
    assert p._turns[TOPIC].partition == 3
    old = p._turns[TOPIC]
    assert p._choose(TOPIC, 2, None, None, RECORD) in (0, 1)  # shrunk to 2 partitions
    assert old.bytes_left <= 0, "an ended turn must not let a cursor append on"


def test_producers_start_their_first_turn_at_different_partitions() -> None:
    starts = {Producer("127.0.0.1:1")._choose(TOPIC, 6, None, None, RECORD) for _ in range(60)}
    assert len(starts) > 1
