"""Kafka's topic configs in our terms, and ours in Kafka's (pure).

``CreateTopics`` and ``DescribeConfigs`` speak Kafka's dotted names and string
values. Those with a counterpart in our topic settings map to it; the ones
that ask for the behaviour every topic here has anyway (``cleanup.policy=delete``)
are accepted; anything else is refused by name, so a tool never believes it
set something that does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from headrace.errors import InvalidTopicSpec

#: Kafka's name -> our topic setting (an integer)
KAFKA_TO_OURS: Final[dict[str, str]] = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "max.message.bytes": "max_batch_bytes",
}
#: Kafka settings accepted when they ask for what every topic here does
ALREADY_SO: Final[dict[str, str]] = {"cleanup.policy": "delete"}


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    name: str
    value: str
    is_default: bool


def topic_settings(pairs: Iterable[tuple[str, str | None]]) -> dict[str, int]:
    """Our topic settings for Kafka's ``(name, value)`` pairs; ``InvalidTopicSpec`` names the
    first pair that has no counterpart or no integer value."""
    settings: dict[str, int] = {}
    for name, value in pairs:
        if name in ALREADY_SO:
            if value != ALREADY_SO[name]:
                raise InvalidTopicSpec(
                    f"{name}={value} is not supported: only {name}={ALREADY_SO[name]}"
                    " (compaction runs as a Compaction job, docs/spark.md)"
                )
            continue
        ours = KAFKA_TO_OURS.get(name)
        if ours is None:
            raise InvalidTopicSpec(
                f"topic config {name!r} is not supported; supported: "
                + ", ".join([*KAFKA_TO_OURS, *ALREADY_SO])
            )
        try:
            settings[ours] = int(value or "")
        except ValueError:
            raise InvalidTopicSpec(
                f"topic config {name!r} must be an integer, got {value!r}"
            ) from None
    return settings


def describe(
    effective: dict[str, int], overridden: Iterable[str], keys: Iterable[str] | None
) -> list[DescribedConfig]:
    """Kafka's view of a topic's settings: ``effective`` by our names, ``overridden`` the
    ones the topic sets itself, ``keys`` the Kafka names asked for (None: all)."""
    set_here = set(overridden)
    asked = set(keys) if keys is not None else None
    out = [
        DescribedConfig(kafka, str(effective[ours]), ours not in set_here)
        for kafka, ours in KAFKA_TO_OURS.items()
        if asked is None or kafka in asked
    ]
    out += [
        DescribedConfig(name, value, True)
        for name, value in ALREADY_SO.items()
        if asked is None or name in asked
    ]
    return out
