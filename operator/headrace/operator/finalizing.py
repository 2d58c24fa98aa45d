"""The Topic finalizer: a deleted Topic's data goes as its ``deletionPolicy`` says.

Every Topic carries the finalizer ``headrace.dev/topic-data`` (added by the
operator when it first sees the Topic). ``kubectl delete topic`` then only
sets ``metadata.deletionTimestamp``; the object stays until the operator
removes the finalizer, which it does once the brokers have dealt with the
data:

    policy   the cluster's loop                    done when (``progress``)
    -------  ------------------------------------  ------------------------------------------
    Delete   drops the topic from its state; the   the topic is out of the state, and every
             push without it makes every broker    live broker has applied that push and
             remove its copies; its objects go     reports no partition of it
             (``control.tier_deletions``)
    Retain   the same, with the name under the     the same, and every broker of the cluster
             push's ``retained``: brokers close    is live: a broker that is down when the
             their copies and move them aside      finalizer goes would delete its copy when
             (``retained/`` in the data dir)       it comes back (it would not be told Retain)

A broker that is down while a ``Delete`` runs removes its copy when it comes
back (the topology no longer names the topic), so ``Delete`` does not wait
for it.

A held Topic whose BrokerCluster does not exist, or is being deleted (a namespace
delete, an Argo CD app delete: the Topics and their cluster go together), has no loop
left to take its data off the brokers: kopf stops the cluster's loop as soon as the
cluster's deletion starts, and nothing would run the table above again. Its finalizer
is removed at once (``handlers``: on the Topic's event, and on the cluster's deletion
for the Topics already held), whatever its policy, and its data stays where it is: on
the brokers' volumes (the StatefulSet's PersistentVolumeClaims, which outlive it, though
not a namespace delete) and, for a tiered topic, in the object store (its incarnation's
prefix, its snapshots and what they pin). An Event on the Topic says where
(``left_behind``): ``TopicDataRetained`` for ``Retain``, the Warning
``TopicDataNotDeleted`` for ``Delete``. The objects of topics deleted earlier with
``Delete`` whose removal the loop had not finished (``status.deletedTopics``) stay too:
the Warning ``TopicObjectsNotDeleted`` on the cluster says where (``removals_left``).

The held Topics are also the loop's only deletion requests (``deletions``): the loop
takes no other topic out of its state, so a Topic that merely left the cluster's
index (a ``clusterRef`` edit) keeps its data where it is.

Removing the finalizer by hand (``docs/operations.md``) makes the Topic go at
once; unless the loop had already taken the topic out of its state, no deletion
was asked for and the data stays (the topic is unclaimed).

The decisions here are pure (``needs_finalizer``, ``progress``); ``TopicFinalizer``
is the thin adapter a cluster's runtime calls after each step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from headrace.control.model import DeletionRequest
from headrace.control.reconcile import Event
from headrace.objectstore.errors import InvalidObjectKey
from headrace.operator import workloads
from headrace.operator.bodies import Meta, Parsed, meta_of
from headrace.operator.kube import KubeApi, KubeApiError, ObjectRef, StaleResourceVersion
from headrace.protocol.coordination import Heartbeat
from headrace.resources import BrokerCluster, Topic
from headrace.resources.topics import DeletionPolicy
from headrace.tiered import layout

log = logging.getLogger(__name__)

TOPIC_FINALIZER: Final = "headrace.dev/topic-data"
#: an Unload deleted mid-move stays until its moves in flight finish: a partition it
#: sealed is reassigned and opened again, never left sealed (``ControlLoop`` releases it)
UNLOAD_FINALIZER: Final = "headrace.dev/unload-moves"


def needs_finalizer(meta: Meta, finalizer: str = TOPIC_FINALIZER) -> bool:
    """A live object without ``finalizer`` (a deleted one is never given it again)."""
    return not meta.deleting and finalizer not in meta.finalizers


def held(meta: Meta, finalizer: str = TOPIC_FINALIZER) -> bool:
    """A deleted object ``finalizer`` still holds."""
    return meta.deleting and finalizer in meta.finalizers


def gone_or_going(cluster: Meta | None) -> bool:
    """A BrokerCluster (as its index holds it) that does not exist or is being deleted:
    its loop is not running and will not run again."""
    return cluster is None or cluster.deleting


def policy_of(topic: Parsed[Topic]) -> DeletionPolicy:
    """The Topic's ``deletionPolicy``; Retain when its spec does not parse (the safe side)."""
    if topic.resource is None:
        return DeletionPolicy.RETAIN
    return topic.resource.spec.deletion_policy


def deletions(topics: Iterable[Parsed[Topic]]) -> frozenset[DeletionRequest]:
    """The deletions a cluster's Topics ask for: one per Topic being deleted, as its
    ``deletionPolicy`` says. The control loop deletes no other topic: a Topic that is not
    being deleted never becomes one, whatever index it left."""
    return frozenset(
        DeletionRequest(t.meta.full_name, retain=policy_of(t) is DeletionPolicy.RETAIN)
        for t in topics
        if t.meta.deleting
    )


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a held Topic's deletion stands."""

    done: bool
    #: ``TopicDataDeleted``, ``TopicDataRetained`` or ``TopicDeletionWaiting``
    reason: str
    message: str


def progress(
    name: str,
    policy: DeletionPolicy,
    *,
    placed: bool,
    generation: int,
    brokers: Collection[int],
    live: Collection[int],
    heartbeats: Mapping[int, Heartbeat],
    applied: Mapping[int, int],
    members: Collection[int] | None = None,
    holders: Collection[int] = (),
) -> Progress:
    """Whether the brokers are done with the deleted topic ``name`` (see the module).

    ``placed``: the cluster state still holds the topic; ``generation``: the state's
    topology generation; ``brokers``: every broker of the cluster; ``live``: the live
    ones, whose latest ``heartbeats`` tell what they hold; ``applied``: the topology
    generation each broker last reported holding; ``members``: the brokers the cluster
    keeps (``ControlLoop.members``), None when every known broker is one; ``holders``: the
    brokers the deleted Topic's last status names as replicas. A broker that left the
    membership is waited for only if it holds a copy of this topic: after a finished scale
    down it holds none (its replicas moved off before its pod went) and may never come
    back, but a scale down blocked on it (its copy the only in-sync one) still needs it
    to move that copy aside.
    """
    waiting = "TopicDeletionWaiting"
    if placed:
        return Progress(False, waiting, "waiting for the controller to take it off the brokers")
    holding = sorted(
        b
        for b in live
        if (hb := heartbeats.get(b)) is None
        or applied.get(b, 0) < generation
        or any(p.topic == name for p in hb.partitions)
    )
    if holding:
        return Progress(False, waiting, f"waiting for brokers {holding} to let their copies go")
    if policy is DeletionPolicy.RETAIN:
        kept = set(brokers) if members is None else set(brokers) & (set(members) | set(holders))
        down = sorted(kept - set(live))
        if down:
            return Progress(
                False,
                waiting,
                f"deletionPolicy Retain: waiting for brokers {down} to come back and move"
                " their copies aside (removing the finalizer now would let them delete them)",
            )
        where = sorted(live)
        return Progress(
            True,
            "TopicDataRetained",
            f"deletionPolicy Retain: brokers {where} moved their copies to retained/ in their"
            " data directories; the topic left the routing table",
        )
    return Progress(
        True,
        "TopicDataDeleted",
        "deletionPolicy Delete: the brokers removed their copies; a broker removes the"
        " topic's objects from the object store (the BrokerCluster's status.deletedTopics"
        " lists it until they are gone)",
    )


def replica_holders(topic: Parsed[Topic]) -> frozenset[int]:
    """Every broker the Topic's status names as a replica (or a move's target)."""
    status = None if topic.resource is None else topic.resource.status
    holders: set[int] = set()
    for p in status.partitions if status is not None else ():
        holders.update(p.replicas)
        holders.update(p.target_replicas or ())
    return frozenset(holders)


class TopicFinalizer:
    """Releases a cluster's deleted Topics once ``progress`` says so, and tells why on the
    Topic as Events (each message once)."""

    def __init__(self, api: KubeApi, events: Callable[[Event], None] | None) -> None:
        self.api = api
        self.events = events
        #: held Topics by name, as the watch last delivered them
        self.held: dict[str, Parsed[Topic]] = {}
        self._told: dict[str, str] = {}

    def sync(self, topics: Collection[Parsed[Topic]]) -> None:
        self.held = {t.meta.full_name: t for t in topics if held(t.meta)}
        for name in set(self._told) - set(self.held):
            del self._told[name]

    async def release_finished(
        self,
        placed: Collection[str],
        generation: int,
        brokers: Collection[int],
        live: Collection[int],
        heartbeats: Mapping[int, Heartbeat],
        applied: Mapping[int, int],
        members: Collection[int] | None = None,
    ) -> list[str]:
        """Remove the finalizer of every held Topic that is done; their names."""
        released = []
        for name, topic in sorted(self.held.items()):
            verdict = progress(
                name,
                policy_of(topic),
                placed=name in placed,
                generation=generation,
                brokers=brokers,
                live=live,
                heartbeats=heartbeats,
                applied=applied,
                members=members,
                holders=replica_holders(topic),
            )
            if self._told.get(name) != verdict.message:
                self._told[name] = verdict.message
                log.info("topic %s: %s", name, verdict.message)
                if self.events is not None:
                    self.events(Event(verdict.reason, name, verdict.message))
            if not verdict.done:
                continue
            await release(self.api, topic.ref, topic.meta)
            released.append(name)
        return released


def left_behind(
    topic: Parsed[Topic], cluster_name: str, cluster: Parsed[BrokerCluster] | None
) -> Progress:
    """What a held Topic whose BrokerCluster ``cluster_name`` is gone or being deleted
    (``cluster``: as last seen, None once gone) leaves behind, and where: the Event its
    finalizer's removal posts (see the module)."""
    name = topic.meta.full_name
    namespace, _, short = name.partition("/")
    holders = sorted(replica_holders(topic))
    if holders:
        claims = ", ".join(workloads.data_claim_name(cluster_name, b) for b in holders)
        volumes = (
            f"on the volumes of brokers {holders} (PersistentVolumeClaims {claims}: the"
            " StatefulSet leaves them when it goes, a namespace delete takes them and"
            " their volumes go as their reclaim policy says), in topics/"
            f"{namespace}/{short} of each, or under retained/ where a broker had already"
            " moved it aside"
        )
    else:
        volumes = "nowhere on the brokers (it was never placed)"
    tiered = topic.resource is not None and topic.resource.spec.tiered_storage.enabled
    model = None if cluster is None else cluster.resource
    store = None if model is None else model.spec.object_store
    objects = ""
    if tiered:
        bucket = f"bucket {store.bucket}" if store is not None else "the cluster's bucket"
        prefix = objects_prefix(topic, cluster_name)
        objects = (
            f", and in the object store ({bucket}, under {prefix}, with its snapshots under"
            f" {prefix}snapshots/ and every object they pin: no broker is left to remove"
            " them)"
        )
    going = "was deleted" if cluster is None else "is being deleted"
    where = f"its data stays where it is: {volumes}{objects}"
    if policy_of(topic) is DeletionPolicy.RETAIN:
        return Progress(
            True,
            "TopicDataRetained",
            f"deletionPolicy Retain: BrokerCluster {cluster_name} {going}, so no broker"
            f" is told anything more; {where}",
        )
    return Progress(
        True,
        "TopicDataNotDeleted",
        f"deletionPolicy Delete: BrokerCluster {cluster_name} {going}, so nothing is left to"
        f" delete the data; {where}. Delete the volumes (and objects) by hand",
    )


def removals_left(cluster: Parsed[BrokerCluster]) -> str | None:
    """What a BrokerCluster being deleted leaves in the object store of the topics deleted
    with ``Delete`` whose objects its controller was still having a broker remove
    (``status.deletedTopics``): the Warning ``TopicObjectsNotDeleted`` its deletion posts
    on it, or None when no removal was under way. The loop stops with the cluster, so
    nothing finishes them: the objects stay, and the Event says where."""
    model = cluster.resource
    status = None if model is None else model.status
    left = [] if status is None else list(status.deleted_topics or ())
    if not left:
        return None
    store = None if model is None else model.spec.object_store
    bucket = f"bucket {store.bucket}" if store is not None else "the cluster's bucket"
    name = cluster.meta.name
    prefixes = ", ".join(
        _prefix_or_as_is(name, d.topic, d.creation_id) for d in sorted(left, key=lambda d: d.topic)
    )
    return (
        f"BrokerCluster {name} is being deleted before the objects of {len(left)} topic(s)"
        f" deleted with deletionPolicy Delete were removed: no broker is left to remove"
        f" them, so they stay in the object store ({bucket}, under {prefixes}), with what"
        " their snapshots pin; delete them by hand"
    )


def _prefix_or_as_is(cluster_name: str, topic: str, creation_id: str) -> str:
    try:
        return layout.topic_prefix(cluster_name, topic, creation_id)
    except (ValueError, InvalidObjectKey):
        # a name or creation id no key may hold (set by hand) had no objects: say it as is
        return f"{cluster_name}/{topic}/" + (f"{creation_id}/" if creation_id else "")


def objects_prefix(topic: Parsed[Topic], cluster_name: str) -> str:
    """Where the Topic's incarnation keeps its objects: ``<cluster>/<namespace>/<name>/
    <creation id>/`` (its ``status.creationId``; without one, the legacy prefix)."""
    status = None if topic.resource is None else topic.resource.status
    creation_id = (None if status is None else status.creation_id) or ""
    return _prefix_or_as_is(cluster_name, topic.meta.full_name, creation_id)


#: a release whose object keeps changing under it gives up after this many tries (the next
#: event or step tries again)
MAX_RELEASE_TRIES: Final = 5


async def release(
    api: KubeApi, ref: ObjectRef, meta: Meta, finalizer: str = TOPIC_FINALIZER
) -> None:
    """Remove ``finalizer``: a merge patch of the list, fenced on the ``resourceVersion``
    it was computed from (``meta``: the object as last seen). A merge patch replaces the
    whole list, so without the fence a finalizer another controller added meanwhile would
    be dropped; with it, a 409 re-reads the object and computes the list again. The object
    may be gone already."""
    for _ in range(MAX_RELEASE_TRIES):
        if finalizer not in meta.finalizers:
            return
        patch: dict[str, object] = {"finalizers": [f for f in meta.finalizers if f != finalizer]}
        if meta.resource_version is not None:
            patch["resourceVersion"] = meta.resource_version
        try:
            await api.patch_metadata(ref, patch)
            return
        except StaleResourceVersion:
            fresh = await api.get(ref)
            if fresh is None:
                return
            meta = meta_of(fresh)
    raise KubeApiError(
        f"{ref.kind} {ref.namespace}/{ref.name}: its finalizers changed {MAX_RELEASE_TRIES}"
        " times while one was being removed"
    )


async def attach(
    api: KubeApi, ref: ObjectRef, meta: Meta, finalizer: str = TOPIC_FINALIZER
) -> None:
    """Add ``finalizer``, fenced on the resourceVersion seen (a 409 comes back as the
    next watch event, which tries again)."""
    patch = {"finalizers": [*meta.finalizers, finalizer], "resourceVersion": meta.resource_version}
    await api.patch_metadata(ref, patch)
