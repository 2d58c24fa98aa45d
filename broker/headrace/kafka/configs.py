"""Kafka's topic configs in our terms, and ours in Kafka's (pure).

``CreateTopics``, ``DescribeConfigs``, ``AlterConfigs`` and
``IncrementalAlterConfigs`` speak Kafka's dotted names and string values. Those
with a counterpart in our topic settings map to it; the ones that ask for the
behaviour every topic here has anyway (``cleanup.policy=delete``) are accepted;
anything else is refused by name, so a tool never believes it set something that
does nothing. An alteration is checked whole before anything changes: one bad
entry refuses the resource's every change, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from headrace.errors import InvalidRequest, InvalidTopicSpec

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
            raise _unsupported(name)
        settings[ours] = _integer(name, value)
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


class Operation(IntEnum):
    """IncrementalAlterConfigs' operations; APPEND and SUBTRACT are for list-typed
    configs (of ours, only ``cleanup.policy`` is one)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of an IncrementalAlterConfigs resource: ``operation`` as sent (an int,
    so that an unknown one is refused here by name rather than failing to parse)."""

    name: str
    operation: int
    value: str | None


def incrementally_altered(config: Mapping[str, Any], changes: Iterable[Change]) -> dict[str, Any]:
    """A topic's settings (``config``, by our names) after ``changes``.

    ``InvalidRequest`` for a duplicate name or an unknown operation, ``InvalidTopicSpec``
    for a name with no counterpart, a value that is not an integer, or APPEND/SUBTRACT on
    a config that is not a list. Settings of ours that Kafka has no name for are kept."""
    out = dict(config)
    seen: set[str] = set()
    for change in changes:
        if change.name in seen:
            raise InvalidRequest(f"Error due to duplicate config keys: {change.name}")
        seen.add(change.name)
        try:
            operation = Operation(change.operation)
        except ValueError:
            raise InvalidRequest(
                f"unknown config operation {change.operation} for {change.name}"
            ) from None
        if change.name in ALREADY_SO:
            _check_already_so(change.name, operation, change.value)
            continue
        ours = KAFKA_TO_OURS.get(change.name)
        if ours is None:
            raise _unsupported(change.name)
        if operation is Operation.DELETE:
            out.pop(ours, None)  # the broker's default applies again
        elif operation is Operation.SET:
            out[ours] = _integer(change.name, change.value)
        else:
            raise InvalidTopicSpec(
                f"{operation.name} is not allowed for {change.name}: it is not a list"
            )
    return out


def altered(config: Mapping[str, Any], pairs: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """A topic's settings after the legacy ``AlterConfigs``, which replaces every config
    Kafka names: those not in ``pairs`` go back to the broker's defaults."""
    kept = {k: v for k, v in config.items() if k not in KAFKA_TO_OURS.values()}
    return kept | topic_settings(pairs)


def _check_already_so(name: str, operation: Operation, value: str | None) -> None:
    """Whether ``operation`` leaves ``name`` at the one value every topic here has."""
    wanted = ALREADY_SO[name]
    items = {v.strip() for v in (value or "").split(",") if v.strip()}
    if operation is Operation.SET:
        result = items
    elif operation is Operation.APPEND:
        result = {wanted} | items
    elif operation is Operation.SUBTRACT:
        result = {wanted} - items
    else:
        result = {wanted}  # DELETE: back to the default, which is that value
    if result != {wanted}:
        raise InvalidTopicSpec(
            f"{name}={','.join(sorted(result)) or '(empty)'} is not supported: only"
            f" {name}={wanted} (compaction runs as a Compaction job, docs/spark.md)"
        )


def _unsupported(name: str) -> InvalidTopicSpec:
    return InvalidTopicSpec(
        f"topic config {name!r} is not supported; supported: "
        + ", ".join([*KAFKA_TO_OURS, *ALREADY_SO])
    )


def _integer(name: str, value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise InvalidTopicSpec(f"topic config {name!r} must be an integer, got {value!r}") from None
