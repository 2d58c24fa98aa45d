"""Topic names and ids as Kafka clients see them (pure).

Kafka names a topic by a UUID too (Metadata v10+, the consumer protocol's
assignments, Fetch v13+). Ours is derived from the name, so every broker gives
the same id without storing one.

A topic with retired partitions (a shrink's) has another id, derived from its name and
the partitions keys are routed to. Kafka clients take a partition count below the one
they know only for a new topic id (a re-created topic: librdkafka since 2.9, the Java
client): with the same id, a producer would go on hashing keys over the old count, and a
record whose key hashes to a retired partition could never be stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from headrace.records.topic_names import DEFAULT_NAMESPACE


def topic_id(name: str, routed: int | None = None) -> bytes:
    """A stable, non-zero 16-byte id per topic name (Metadata v10+ carries one);
    ``routed``: after a shrink, the partitions keys are routed to (None: every one)."""
    text = name if routed is None else f"{name}\0{routed}"
    return hashlib.blake2b(text.encode(), digest_size=16, person=b"headrace-topic").digest()


def placed_topic_id(name: str, partitions: int, routing_partitions: int) -> bytes:
    """The id of a topic of ``partitions`` whose keys are routed to ``routing_partitions``
    of them: a new one while a shrink has retired some (from its cutover on)."""
    return topic_id(name, routing_partitions if routing_partitions < partitions else None)


def kafka_topic_name(canonical: str) -> str:
    """A topic's name as Kafka clients see it: the default namespace is left out
    (``default/orders`` is ``orders``); other namespaces keep theirs (``ns/orders``)."""
    namespace, _, name = canonical.partition("/")
    return name if namespace == DEFAULT_NAMESPACE else canonical


def named(asked_name: str | None, asked_id: bytes, ids: Mapping[str, bytes]) -> str:
    """The topic a Metadata request asks for: its name, or (v10+, a name left null) the
    name among ``ids`` (names as clients see them, to their ids) whose id it gives; ""
    when none has it, which Metadata answers as an unknown topic."""
    if asked_name is not None:
        return asked_name
    return next((name for name, known in ids.items() if known == asked_id), "")
