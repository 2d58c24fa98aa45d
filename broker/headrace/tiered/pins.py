"""Snapshot documents in the store and the objects they pin (adapter: I/O through a store).

Every deleter of tiered objects asks ``pinned_in`` first, right before it deletes:
retention (``PartitionTier.delete_unlisted``), compaction's deletes
(``jobs.compact``), the orphan sweep (``jobs.sweep``) and a deleted topic's
removal (``remove_partition`` by its leaders, ``remove_incarnation`` by the broker
the controller asks until it is done). A snapshot document that cannot be read stops
the delete (``InvalidSnapshot``): an unreadable pin must not become no pin.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.objectstore.errors import ObjectNotFound, ObjectStoreError
from headrace.objectstore.interface import ObjectStore
from headrace.tiered import layout
from headrace.tiered.snapshots import (
    SNAPSHOT_SUFFIX,
    InvalidSnapshot,
    Snapshot,
    SnapshotExists,
    pinned_keys,
    snapshot_key,
    snapshots_prefix,
    topic_prefix_of,
)


def read_snapshots(store: ObjectStore, topic_prefix: str) -> list[Snapshot]:
    """Every snapshot of the topic incarnation under ``topic_prefix``, by name."""
    found: list[Snapshot] = []
    for info in store.list(snapshots_prefix(topic_prefix)):
        if not info.key.endswith(SNAPSHOT_SUFFIX):
            continue
        try:
            raw = store.get(info.key)
        except ObjectNotFound:
            continue  # deleted since the listing: it pins nothing any more
        try:
            found.append(Snapshot.from_json(raw))
        except InvalidSnapshot as exc:
            raise InvalidSnapshot(f"{info.key}: {exc.message}") from exc
    return sorted(found, key=lambda s: s.name)


def read_snapshot(store: ObjectStore, topic_prefix: str, name: str) -> Snapshot:
    """One snapshot; ``ObjectNotFound`` if there is none of that name."""
    key = snapshot_key(topic_prefix, name)
    try:
        return Snapshot.from_json(store.get(key))
    except InvalidSnapshot as exc:
        raise InvalidSnapshot(f"{key}: {exc.message}") from exc


def pinned_in(store: ObjectStore, topic_prefix: str) -> frozenset[str]:
    """Every object key a snapshot of the topic incarnation lists."""
    return pinned_keys(read_snapshots(store, topic_prefix))


def pinned_for_partition(store: ObjectStore, partition_prefix: str) -> frozenset[str]:
    return pinned_in(store, topic_prefix_of(partition_prefix))


def write_snapshot(store: ObjectStore, snap: Snapshot) -> None:
    """Create the snapshot document, only if none of that name exists (immutable)."""
    if not store.put_if_version(snap.key, snap.to_json(), None):
        raise SnapshotExists(f"{snap.key}: a snapshot named {snap.name!r} exists already")


def delete_snapshot(store: ObjectStore, topic_prefix: str, name: str) -> None:
    """Delete a snapshot document (idempotent). Its objects lose its pin: those no
    manifest lists become orphans for the sweep."""
    store.delete(snapshot_key(topic_prefix, name))


def remove_partition(store: ObjectStore, partition_prefix: str) -> list[str]:
    """A deleted topic's partition: delete the manifest first (a reader sees no history
    rather than part of one), then every other object under the prefix that no
    snapshot pins. Returns the keys kept for snapshots."""
    keys = [o.key for o in store.list(partition_prefix)]
    for key in keys:
        if key.endswith(layout.MANIFEST_NAME):
            store.delete(key)
    pinned = pinned_for_partition(store, partition_prefix)
    store.delete_many(k for k in keys if not k.endswith(layout.MANIFEST_NAME) and k not in pinned)
    return [k for k in keys if k in pinned]


class RemovalIncomplete(ObjectStoreError):
    """Objects a removal should have deleted are still there (put while it ran): try again."""


def remove_incarnation(store: ObjectStore, topic_prefix: str) -> list[str]:
    """A deleted topic incarnation (``topic_prefix``: ``<cluster>/<ns>/<name>/<creation
    id>/``, never the legacy prefix, which a later topic of the name shares): delete
    every manifest first, as ``remove_partition`` does, then every other object under the
    prefix but the snapshot documents and the objects they pin. Idempotent: run it again
    after a crash at any point. Returns the keys kept for snapshots.

    A listing afterwards must find nothing else, or it raises ``RemovalIncomplete``: an
    upload of the deleted topic that was in flight (a leader that had not yet heard of
    the deletion) may have put objects after the first listing, and the caller reports
    the removal done only when nothing is left."""
    documents = snapshots_prefix(topic_prefix)

    def listed() -> list[str]:
        return [o.key for o in store.list(topic_prefix) if not o.key.startswith(documents)]

    keys = listed()
    manifests = [k for k in keys if k.endswith("/" + layout.MANIFEST_NAME)]
    store.delete_many(manifests)
    pinned = pinned_in(store, topic_prefix)
    store.delete_many(k for k in keys if k not in pinned and k not in manifests)
    left = [k for k in listed() if k not in pinned]
    if left:
        raise RemovalIncomplete(
            f"{topic_prefix}: {len(left)} objects appeared while it was removed, {left[0]} first"
        )
    return sorted(k for k in keys if k in pinned)


def unpinned(keys: Iterable[str], pinned: frozenset[str]) -> list[str]:
    return [k for k in keys if k not in pinned]
