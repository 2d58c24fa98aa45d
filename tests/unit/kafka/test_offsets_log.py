"""Committed offsets as records of the offsets topic: which partition (and so which
coordinator) a group has, and how a new coordinator rebuilds the groups from the log."""

from __future__ import annotations

import json
import zlib

import pytest

from headrace.kafka import offsets_log
from headrace.kafka.groups import Committed
from headrace.records import batch as rb


def values(batch: bytes) -> list[bytes]:
    rb.validate(batch)  # a batch the log takes as any produced one
    return list(rb.decode(batch).values)


def test_a_groups_partition_is_crc32_of_its_id_modulo_the_count() -> None:
    assert offsets_log.coordinator_partition("billing", 8) == zlib.crc32(b"billing") % 8
    spread = {offsets_log.coordinator_partition(f"group-{i}", 5) for i in range(200)}
    assert spread == set(range(5)), "groups spread over every partition"
    assert offsets_log.coordinator_partition("any", 1) == 0


def test_a_group_keeps_its_partition_whatever_asks() -> None:
    # every broker computes the same answer (no process-salted hash)
    assert [offsets_log.coordinator_partition("orders-readers", 3) for _ in range(5)] == [
        zlib.crc32(b"orders-readers") % 3
    ] * 5


def test_an_offsets_topic_without_partitions_is_refused() -> None:
    with pytest.raises(ValueError, match="0 partitions"):
        offsets_log.coordinator_partition("g", 0)


def test_replay_keeps_the_last_commit_of_each_partition() -> None:
    replayed = offsets_log.Replayed()
    replayed.apply(values(offsets_log.commit_batch("g", {("t", 0): Committed(5, 1, "a")}, 1)))
    replayed.apply(
        values(
            offsets_log.commit_batch(
                "g", {("t", 0): Committed(9, 2, ""), ("t", 1): Committed(3, 2, "m")}, 2
            )
        )
    )
    replayed.apply(values(offsets_log.commit_batch("h", {("u", 4): Committed(1, -1, "")}, 3)))
    assert replayed.groups == {
        "g": {("t", 0): Committed(9, 2, ""), ("t", 1): Committed(3, 2, "m")},
        "h": {("u", 4): Committed(1, -1, "")},
    }
    assert replayed.skipped == 0


def test_a_deletion_forgets_what_came_before_it_only() -> None:
    replayed = offsets_log.Replayed()
    replayed.apply(values(offsets_log.commit_batch("g", {("t", 0): Committed(5, 1, "")}, 1)))
    replayed.apply(values(offsets_log.deletion_batch("g", 2)))
    assert replayed.groups == {}
    replayed.apply(values(offsets_log.commit_batch("g", {("t", 2): Committed(7, 1, "")}, 3)))
    assert replayed.groups == {"g": {("t", 2): Committed(7, 1, "")}}


def test_an_offset_deletion_forgets_those_partitions_and_keeps_the_others() -> None:
    replayed = offsets_log.Replayed()
    replayed.apply(
        values(
            offsets_log.commit_batch(
                "g", {("t", 0): Committed(5, 1, ""), ("t", 1): Committed(6, 1, "")}, 1
            )
        )
    )
    replayed.apply(values(offsets_log.offsets_deletion_batch("g", [("t", 0), ("u", 3)], 2)))
    assert replayed.groups == {"g": {("t", 1): Committed(6, 1, "")}}
    assert replayed.skipped == 0


def test_records_keyed_by_group_in_one_batch_per_commit() -> None:
    batch = offsets_log.commit_batch(
        "g", {("t", 1): Committed(1, 0, ""), ("t", 0): Committed(0, 0, "")}, 1
    )
    decoded = rb.decode(batch)
    assert decoded.header.record_count == 2
    assert list(decoded.keys) == [b"g", b"g"]
    assert [json.loads(v)["partition"] for v in decoded.values] == [0, 1]


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"v": 2, "group": "g"}).encode(),
        json.dumps({"v": 1, "group": 3}).encode(),
        json.dumps({"v": 1, "group": "g", "topic": "t", "partition": "x", "offset": 1}).encode(),
    ],
)
def test_a_record_in_another_shape_is_skipped_not_guessed(value: bytes) -> None:
    replayed = offsets_log.Replayed()
    replayed.apply([value])
    assert replayed.groups == {} and replayed.skipped == 1
