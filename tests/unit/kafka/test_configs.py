"""Kafka's topic configs in our terms: mapped, accepted as already so, or refused by name."""

from __future__ import annotations

import pytest

from headrace.errors import InvalidTopicSpec
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
