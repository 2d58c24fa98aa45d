"""Topic names and ids as Kafka clients see them (pure).

Kafka names a topic by a UUID too (Metadata v10+, the consumer protocol's
assignments, Fetch v13+). Ours is derived from the name, so every broker gives
the same id without storing one, and a name always has the same id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from headrace.records.topic_names import DEFAULT_NAMESPACE


def topic_id(name: str) -> bytes:
    """A stable, non-zero 16-byte id per topic name (Metadata v10+ carries one)."""
    return hashlib.blake2b(name.encode(), digest_size=16, person=b"headrace-topic").digest()


def kafka_topic_name(canonical: str) -> str:
    """A topic's name as Kafka clients see it: the default namespace is left out
    (``default/orders`` is ``orders``); other namespaces keep theirs (``ns/orders``)."""
    namespace, _, name = canonical.partition("/")
    return name if namespace == DEFAULT_NAMESPACE else canonical


def named(asked_name: str | None, asked_id: bytes, names: Iterable[str]) -> str:
    """The topic a Metadata request asks for: its name, or (v10+, a name left null) the
    name among ``names`` (as clients see them) whose id it gives; "" when none has it,
    which Metadata answers as an unknown topic."""
    if asked_name is not None:
        return asked_name
    return next((name for name in names if topic_id(name) == asked_id), "")
