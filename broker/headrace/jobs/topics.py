"""A topic's partitions and manifests in an object store (adapter: I/O through the store)."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.tiered import layout
from headrace.tiered.manifest import InvalidManifest, Manifest, SealedState


@dataclass(frozen=True, slots=True)
class TopicRef:
    """Which incarnation of which topic of which cluster: its objects live under
    ``<cluster>/<namespace>/<name>/<creation id>/`` (``layout.topic_prefix``)."""

    cluster_id: str
    topic: str  # "namespace/name"
    #: the topic's creation id (its status's ``creationId``); "" for a topic created
    #: before creation ids, whose objects keep the legacy layout
    creation_id: str = ""

    def __post_init__(self) -> None:
        layout.topic_prefix(self.cluster_id, self.topic, self.creation_id)  # ValueError if bad

    @property
    def prefix(self) -> str:
        return layout.topic_prefix(self.cluster_id, self.topic, self.creation_id)

    def partition_prefix(self, partition: int) -> str:
        return layout.partition_prefix(self.cluster_id, self.topic, partition, self.creation_id)


def stored_partitions(store: ObjectStore, ref: TopicRef) -> list[int]:
    """The partitions that have any object in the store, ascending."""
    found: set[int] = set()
    for info in store.list(ref.prefix):
        head = info.key[len(ref.prefix) :].partition("/")[0]
        if head.isdigit():
            found.add(int(head))
    return sorted(found)


def read_manifest(store: ObjectStore, key: str) -> Manifest:
    """The manifest at ``key`` (missing: empty); ``InvalidManifest`` naming the key."""
    try:
        raw = store.get(key)
    except ObjectNotFound:
        return Manifest()
    try:
        return Manifest.from_json(raw)
    except InvalidManifest as exc:
        raise InvalidManifest(f"{key}: {exc.message}") from exc


def read_manifest_versioned(store: ObjectStore, key: str) -> tuple[Manifest, str | None]:
    """The manifest and its version for ``put_if_version`` (missing: empty, None)."""
    try:
        raw, version = store.get_versioned(key)
    except ObjectNotFound:
        return Manifest(), None
    try:
        return Manifest.from_json(raw), version
    except InvalidManifest as exc:
        raise InvalidManifest(f"{key}: {exc.message}") from exc


def read_sealed(store: ObjectStore, key: str) -> SealedState | None:
    try:
        raw = store.get(key)
    except ObjectNotFound:
        return None
    try:
        return SealedState.from_json(raw)
    except InvalidManifest as exc:
        raise InvalidManifest(f"{key}: {exc.message}") from exc
