"""Which partitions a cluster broker hosts, and in which role (pure).

Theory of operation
-------------------
A cluster broker learns its partitions from the topology the controller pushes
(``protocol.coordination.ClusterTopology``). The planner compares that document
with the partitions hosted here and returns *actions*; one executor in the
broker (``broker.placing``) carries them out. Nothing here reads a clock, a
disk or a socket, so every decision is tested on plain values
(``tests/unit/replication/test_assigning.py``).

Applying a push takes two plans, because a copy's incarnation (how many moves
it has seen) is on its disk and known only once it is open. First, though,
``superseded(hosted, creation_ids, topology)`` drops (``Drop``, ``DropTopic``) the
copies of a topic the topology names under another creation id: it was deleted
and created again under the same name while this broker did not hear of it, and
those copies belong to the deleted one.

``hosting(topology, me)``: every topic the topology names, then every partition it
gives this broker (both idempotent)::

    OpenTopic   create or update the topic's metadata
    Open        open the partition's log (if not yet open), set minInSync, attach its tier

``plan(hosted, topology, me)``: then, per partition the topology gives this broker::

    pushed incarnation newer than the copy's     Reopen   (empty where the new one starts)
      (or same one, started elsewhere)           the actions below wait for the reopen:
                                                 ``plan_reopened`` plans them when it is done
    I lead; role, epoch or leader changed        Lead
    another broker leads (or none); changed      Follow
    nothing changed                              Keep     (the replica list is refreshed; a
                                                          leader resets followers when a
                                                          move it has not seen starts)
    a seal is asked and I lead                   Seal     (took_over: the role changed now)
    otherwise                                    Unseal   (no-op unless a seal was withdrawn)

and per partition hosted here that the topology does not give this broker::

    Drop        close it and remove its files; ``forget``: its topic is gone and
                this broker led it, so its objects in the store go too; ``retain``:
                its topic is gone but listed in ``retained`` (deletionPolicy Retain):
                close it and keep its files (and objects)
    DropTopic   the topology no longer names a topic hosted here; ``retain``: move
                its directory aside (``retained/``) instead of letting it go

``removals(topology, me)``: the deleted topic incarnations whose objects the topology
asks this broker to remove (``RemoveIncarnations``, the whole set: a removal it no
longer lists stops, as another broker was asked or it is done).

Topic names are the registry's canonical ``namespace/name``; the controller
pushes them in that form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# --------------------------------------------------------------------------- inputs


class PlacementDoc(Protocol):
    """One partition of the pushed topology (``protocol.coordination.PartitionPlacement``)."""

    @property
    def partition(self) -> int: ...

    @property
    def replicas(self) -> Sequence[int]: ...

    @property
    def leader(self) -> int | None: ...

    @property
    def epoch(self) -> int: ...

    @property
    def lrs(self) -> Sequence[int]: ...

    @property
    def seal(self) -> bool: ...

    @property
    def moves(self) -> int: ...

    @property
    def start_offset(self) -> int | None: ...

    @property
    def move_generation(self) -> int: ...


class TopicDoc(Protocol):
    """One topic of the pushed topology (``protocol.coordination.TopicPlacement``)."""

    @property
    def name(self) -> str: ...

    @property
    def partitions(self) -> int: ...

    @property
    def partitioning_version(self) -> int: ...

    @property
    def min_in_sync(self) -> int: ...

    @property
    def config(self) -> Mapping[str, Any]: ...

    @property
    def assignments(self) -> Sequence[PlacementDoc]: ...

    @property
    def creation_id(self) -> str: ...


class TopologyDoc(Protocol):
    """The pushed topology (``protocol.coordination.ClusterTopology``)."""

    @property
    def topics(self) -> Sequence[TopicDoc]: ...

    @property
    def retained(self) -> Sequence[str]: ...


class RemovalDoc(Protocol):
    """One removal of the pushed topology (``protocol.coordination.IncarnationRemoval``)."""

    @property
    def topic(self) -> str: ...

    @property
    def creation_id(self) -> str: ...

    @property
    def broker(self) -> int: ...


class RemovalsDoc(Protocol):
    """The removals of the pushed topology (``ClusterTopology.removals``)."""

    @property
    def removals(self) -> Sequence[RemovalDoc]: ...


@dataclass(frozen=True, slots=True)
class Hosted:
    """What the planner knows of one partition hosted here."""

    topic: str
    index: int
    leader: bool
    leader_id: int
    leader_epoch: int
    #: the incarnation the copy belongs to, and where it started
    moves: int
    start_offset: int


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class OpenTopic:
    name: str
    partitions: int
    partitioning_version: int
    config: Mapping[str, Any]
    #: ``TopicDoc.creation_id``: the prefix of its objects ("" for the legacy layout)
    creation_id: str = ""


@dataclass(frozen=True, slots=True)
class Open:
    topic: str
    index: int
    min_in_sync: int


@dataclass(frozen=True, slots=True)
class Reopen:
    topic: str
    index: int
    moves: int
    #: None: derive it from the object store (the old owner left no sealed state)
    start_offset: int | None
    #: the new incarnation's first leader epoch
    epoch: int


@dataclass(frozen=True, slots=True)
class Lead:
    topic: str
    index: int
    epoch: int
    replicas: tuple[int, ...]
    lrs: tuple[int, ...]
    #: ``PlacementDoc.move_generation``
    move_generation: int = 0


@dataclass(frozen=True, slots=True)
class Follow:
    topic: str
    index: int
    #: None: no leader right now
    leader: int | None
    epoch: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Keep:
    topic: str
    index: int
    replicas: tuple[int, ...]
    #: the controller's LRS and ``PlacementDoc.move_generation``: a leader resets the
    #: progress of followers outside it when a move it has not seen starts
    lrs: tuple[int, ...] = ()
    move_generation: int = 0


@dataclass(frozen=True, slots=True)
class Seal:
    topic: str
    index: int
    #: this broker took the lead with the seal already asked: it accepts no appends at all
    took_over: bool


@dataclass(frozen=True, slots=True)
class Unseal:
    topic: str
    index: int


@dataclass(frozen=True, slots=True)
class Drop:
    topic: str
    index: int
    #: also delete the partition's objects (its topic was deleted, and this broker led it)
    forget: bool
    #: keep the files: the topic was deleted with ``deletionPolicy: Retain``
    retain: bool = False


@dataclass(frozen=True, slots=True)
class DropTopic:
    name: str
    #: move the topic's directory aside instead of letting it go (``Drop.retain``)
    retain: bool = False


@dataclass(frozen=True, slots=True)
class RemoveIncarnations:
    """Remove the objects of exactly these deleted incarnations, (topic, creation id), and
    stop removing any other."""

    incarnations: tuple[tuple[str, str], ...]


Action = (
    OpenTopic
    | Open
    | Reopen
    | Lead
    | Follow
    | Keep
    | Seal
    | Unseal
    | Drop
    | DropTopic
    | RemoveIncarnations
)


# --------------------------------------------------------------------------- planning


def superseded(
    hosted: Mapping[str, Sequence[Hosted]], creation_ids: Mapping[str, str], topology: TopologyDoc
) -> list[Drop | DropTopic]:
    """Drop the topics hosted here whose creation id (``creation_ids``: topic -> its id on
    this broker) is not the one the topology names: copies of a deleted incarnation, as
    its delete would have dropped them. A topic without an id on either side (the legacy
    layout, or a controller from before creation ids) is never superseded: it would be a
    copy of the same topic as often as of an older one, and dropping it loses records."""
    actions: list[Drop | DropTopic] = []
    for t in topology.topics:
        mine = creation_ids.get(t.name, "")
        if not mine or not t.creation_id or mine == t.creation_id:
            continue
        actions.extend(Drop(t.name, h.index, forget=h.leader) for h in hosted.get(t.name, ()))
        actions.append(DropTopic(t.name))
    return actions


def hosting(topology: TopologyDoc, me: int) -> list[OpenTopic | Open]:
    """Open every topic the topology names and every partition it gives broker ``me``."""
    actions: list[OpenTopic | Open] = []
    for t in topology.topics:
        actions.append(
            OpenTopic(t.name, t.partitions, t.partitioning_version, t.config, t.creation_id)
        )
        actions.extend(
            Open(t.name, a.partition, t.min_in_sync) for a in t.assignments if me in a.replicas
        )
    return actions


def plan(hosted: Mapping[str, Sequence[Hosted]], topology: TopologyDoc, me: int) -> list[Action]:
    """Roles, seals and reopens for the partitions ``topology`` gives broker ``me``; drops
    for the rest. ``hosted``: topic -> its partitions hosted here, after ``hosting`` ran."""
    actions: list[Action] = []
    wanted: set[tuple[str, int]] = set()
    for t in topology.topics:
        here = {h.index: h for h in hosted.get(t.name, ())}
        for a in t.assignments:
            h = here.get(a.partition)
            if me not in a.replicas or h is None:
                continue
            wanted.add((t.name, a.partition))
            if needs_reopen(h, a):
                actions.append(Reopen(h.topic, h.index, a.moves, a.start_offset, a.epoch))
            actions.extend(place(h, a, me))
    named = {t.name for t in topology.topics}
    retained = set(topology.retained)
    for name, partitions in hosted.items():
        deleted = name not in named
        retain = deleted and name in retained
        for h in partitions:
            if (name, h.index) not in wanted:
                forget = deleted and h.leader and not retain
                actions.append(Drop(name, h.index, forget=forget, retain=retain))
        if deleted:
            actions.append(DropTopic(name, retain=retain))
    return actions


def removals(topology: RemovalsDoc, me: int) -> RemoveIncarnations:
    """The deleted incarnations whose objects ``topology`` asks broker ``me`` to remove."""
    return RemoveIncarnations(
        tuple(sorted({(r.topic, r.creation_id) for r in topology.removals if r.broker == me}))
    )


def plan_reopened(hosted: Hosted, topology: TopologyDoc | None, me: int) -> list[Action]:
    """A move's reopen finished: take the role the current topology gives, if it still
    gives this incarnation (forced: the reopen reset the partition's state)."""
    a = None if topology is None else assignment_of(topology, hosted.topic, hosted.index)
    if a is None or a.moves != hosted.moves:
        return []
    return place(hosted, a, me, force=True)


def place(h: Hosted, a: PlacementDoc, me: int, *, force: bool = False) -> list[Action]:
    """The role ``a`` gives broker ``me`` for ``h``, then whether it seals."""
    leads = a.leader == me
    changed = (
        force
        or leads != h.leader
        or a.epoch != h.leader_epoch
        or h.leader_id != (a.leader if a.leader is not None else -1)
    )
    role: Action
    if not changed:
        role = Keep(h.topic, h.index, tuple(a.replicas), tuple(a.lrs), a.move_generation)
    elif leads:
        role = Lead(h.topic, h.index, a.epoch, tuple(a.replicas), tuple(a.lrs), a.move_generation)
    else:
        role = Follow(h.topic, h.index, a.leader, a.epoch, tuple(a.replicas))
    if a.seal and leads:
        return [role, Seal(h.topic, h.index, took_over=changed)]
    return [role, Unseal(h.topic, h.index)]


def needs_reopen(h: Hosted, a: PlacementDoc) -> bool:
    """The copy belongs to an older incarnation (a move), or to the same one started
    elsewhere than the leader reported."""
    if a.moves > h.moves:
        return True
    # Same incarnation, but on the recovery path each replica derived its start from the
    # object store on its own: the leader's (reported, then pushed) start is the one.
    return (
        a.moves == h.moves > 0 and a.start_offset is not None and a.start_offset != h.start_offset
    )


def assignment_of(topology: TopologyDoc, topic: str, partition: int) -> PlacementDoc | None:
    placement = next((t for t in topology.topics if t.name == topic), None)
    if placement is None:
        return None
    return next((a for a in placement.assignments if a.partition == partition), None)
