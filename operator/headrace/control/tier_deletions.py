"""A deleted topic's objects in the object store, removed until they are gone (pure).

Theory of operation
-------------------
A topic deleted with its data (``DeletionRequest.retain`` False) leaves the state in
the step its deletion was asked in. If it has a creation id, that step records it
(``DeletedIncarnation``: name, creation id, partition count) in the state, which the
controller persists; the record stays until a broker reports that the store holds
nothing of it but what snapshots pin. The leader of each partition still removes
its own objects when it drops its copy, but a leader that is down at the delete
never does, and one that dies part-way leaves the rest: the record is what makes
the removal finish.

A record asks one broker at a time (``broker``, pushed in the topology's
``removals``), which removes everything under the incarnation's prefix
(``tiered.pins.remove_incarnation``, idempotent) and reports the creation id in its
heartbeat (``removedIncarnations``). The rules, for each record, first match wins::

    a live broker reports it removed                    dropped  (TopicObjectsRemoved)
    warming up, or its broker is live with a store      kept as it is
    every live broker says it has no object store       dropped  (TopicObjectsNotStored)
    a live broker has not applied the generation        no broker (a dead one's is let go)
      that deleted the topic
    otherwise                                           asked of the lowest live broker
                                                        with a store, not draining first
                                                        (TopicObjectsRemoving)

The wait for every live broker to apply the deleting generation keeps the removal
from racing a leader that still uploads the topic's segments: a broker stops its
uploads when it applies a topology without the topic. A broker from before these
fields reports neither a store nor removals: it is never asked, nor counted as
having no store.

A topic of the legacy layout (no creation id) is never recorded: its prefix is the
one a topic created again under its name uses, so only its leaders remove its
objects, as they drop their copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headrace.control.liveness import Liveness
from headrace.control.model import DeletedIncarnation, TopicStatus
from headrace.protocol.coordination import Heartbeat

#: (kind, subject, message), as ``reconcile.Event`` takes them
Note = tuple[str, str, str]


def record(topic: TopicStatus, generation: int) -> DeletedIncarnation | None:
    """The record of ``topic``, deleted with its data at ``generation``; None for a topic
    of the legacy layout (see the module)."""
    if not topic.creation_id:
        return None
    return DeletedIncarnation(
        topic.name, topic.creation_id, len(topic.partitions), deleted_generation=generation
    )


def step(
    deleted: Mapping[str, DeletedIncarnation],
    new: Iterable[DeletedIncarnation],
    liveness: Liveness,
    heartbeats: Mapping[int, Heartbeat],
) -> tuple[dict[str, DeletedIncarnation], list[Note]]:
    """The records after one step, by creation id, and what happened to them.

    ``deleted``: the records of the state; ``new``: those of the topics this step
    deletes; ``heartbeats``: the latest of each broker (only live ones count)."""
    live = {b: heartbeats[b] for b in sorted(liveness.live) if b in heartbeats}
    removed = {c for hb in live.values() for c in hb.removed_incarnations}
    storeless = bool(live) and all(hb.object_store is False for hb in live.values())
    stores = [b for b, hb in live.items() if hb.object_store]
    candidates = [b for b in stores if b not in liveness.draining] or stores
    records: dict[str, DeletedIncarnation] = {}
    notes: list[Note] = []
    for r in [*deleted.values(), *new]:
        subject = f"{r.topic}@{r.creation_id}"
        if r.creation_id in removed:
            notes.append(
                ("TopicObjectsRemoved", subject, "its objects are gone from the object store")
            )
            continue
        if liveness.warming_up or r.broker in stores:
            records[r.creation_id] = r
            continue
        if storeless:
            notes.append(("TopicObjectsNotStored", subject, "no broker has an object store"))
            continue
        applied = all(hb.generation >= r.deleted_generation for hb in live.values())
        broker = candidates[0] if candidates and applied else None
        if broker is not None:
            notes.append(
                (
                    "TopicObjectsRemoving",
                    subject,
                    f"broker {broker} removes its objects from the object store",
                )
            )
        records[r.creation_id] = DeletedIncarnation(
            r.topic, r.creation_id, r.partitions, r.deleted_generation, broker
        )
    return dict(sorted(records.items())), notes
