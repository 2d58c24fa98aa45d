"""Kafka's topic configs in our terms: mapped, accepted as already so, or refused by name."""

from __future__ import annotations

import re

import pytest

from headrace.errors import InvalidRequest, InvalidTopicSpec
from headrace.kafka import configs


def test_mapped_settings_become_ours() -> None:
    pairs = [
        ("retention.ms", "60000"),
        ("max.message.bytes", "1048576"),
        ("cleanup.policy", "delete"),
    ]
    assert configs.topic_settings(pairs) == {"retention_ms": 60000, "max_batch_bytes": 1048576}


@pytest.mark.parametrize(
    ("pair", "named"),
    [
        (("cleanup.policy", "compact"), "cleanup.policy=compact"),
        (("min.insync.replicas", "2"), "min.insync.replicas"),
        (("retention.ms", "a week"), "must be an integer"),
        (("segment.bytes", None), "must be an integer"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    pair: tuple[str, str | None], named: str
) -> None:
    with pytest.raises(InvalidTopicSpec, match=named.replace(".", r"\.")):
        configs.topic_settings([pair])


def test_described_settings_say_which_are_the_topics_own() -> None:
    effective = {
        "retention_ms": 5,
        "retention_bytes": -1,
        "segment_bytes": 7,
        "segment_ms": 8,
        "max_batch_bytes": 9,
    }
    described = configs.describe(effective, ["retention_ms"], None)
    by_name = {d.name: (d.value, d.is_default) for d in described}
    assert by_name["retention.ms"] == ("5", False)
    assert by_name["retention.bytes"] == ("-1", True)
    assert by_name["cleanup.policy"] == ("delete", True)
    assert [d.name for d in configs.describe(effective, [], ["segment.ms"])] == ["segment.ms"]


SET, DELETE, APPEND, SUBTRACT = (op.value for op in configs.Operation)


def test_incremental_changes_set_and_delete_ours_and_keep_the_rest() -> None:
    current = {"retention_ms": 1000, "segment_bytes": 4096, "tieredStorage": {"enabled": True}}
    changes = [
        configs.Change("retention.bytes", SET, "1048576"),
        configs.Change("segment.bytes", DELETE, None),
        configs.Change("cleanup.policy", APPEND, "delete"),
    ]
    assert configs.incrementally_altered(current, changes) == {
        "retention_ms": 1000,
        "retention_bytes": 1048576,
        "tieredStorage": {"enabled": True},
    }
    assert current["segment_bytes"] == 4096  # the input is not changed


@pytest.mark.parametrize(
    ("change", "error", "named"),
    [
        (configs.Change("min.insync.replicas", SET, "2"), InvalidTopicSpec, "min.insync.replicas"),
        (configs.Change("retention.ms", SET, "soon"), InvalidTopicSpec, "must be an integer"),
        (configs.Change("retention.ms", APPEND, "5"), InvalidTopicSpec, "not a list"),
        (configs.Change("cleanup.policy", APPEND, "compact"), InvalidTopicSpec, "compact,delete"),
        (configs.Change("cleanup.policy", SUBTRACT, "delete"), InvalidTopicSpec, "(empty)"),
        (configs.Change("cleanup.policy", SET, "compact"), InvalidTopicSpec, "compact"),
        (configs.Change("retention.ms", 9, "5"), InvalidRequest, "unknown config operation 9"),
    ],
)
def test_an_incremental_change_that_cannot_be_honoured_is_refused_by_name(
    change: configs.Change, error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=re.escape(named)):
        configs.incrementally_altered({}, [configs.Change("segment.ms", SET, "10"), change])


def test_a_name_twice_in_one_resource_is_an_invalid_request() -> None:
    twice = [configs.Change("retention.ms", SET, "1"), configs.Change("retention.ms", DELETE, None)]
    with pytest.raises(InvalidRequest, match=re.escape("duplicate config keys: retention.ms")):
        configs.incrementally_altered({}, twice)


def test_the_whole_alteration_resets_what_it_does_not_name() -> None:
    current = {"retention_ms": 1000, "segment_bytes": 4096, "tieredStorage": {"enabled": True}}
    assert configs.altered(current, [("retention.bytes", "10")]) == {
        "retention_bytes": 10,
        "tieredStorage": {"enabled": True},
    }
