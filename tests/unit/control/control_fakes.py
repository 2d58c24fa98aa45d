"""Fakes for the control core's tests: a clock and a fleet of brokers that heartbeat."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.control.model import ClusterState, PartitionState, PartitionStatus
from headrace.protocol.coordination import (
    CohortReport,
    Heartbeat,
    PartitionReport,
    SealReport,
)
from headrace.protocol.endpoints import BrokerEndpoint


def info(broker: int) -> BrokerEndpoint:
    return BrokerEndpoint(broker, f"10.0.0.{broker}", 9092, 9644)


def beat(broker: int, received_ms: int, **kwargs: object) -> Heartbeat:
    return Heartbeat(info(broker), received_ms, **kwargs)  # type: ignore[arg-type]


@dataclass
class FakeClock:
    now_ms: int = 1_000_000

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


@dataclass
class FakeBroker:
    id: int
    up: bool = True
    draining: bool = False
    #: promotes itself when nominated candidate
    promotes: bool = True
    #: seals a partition it leads when the seal marker is set
    seals: bool = True
    #: a leader appends one record per poll (False: an idle partition, reports unchanged)
    appends: bool = True
    adoption: int | None = None
    log_end: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (topic, partition) -> (incarnation, its start offset) of the copy held
    incarnation: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    #: (topic, partition) -> the seal this broker made
    sealed: dict[tuple[str, int], SealReport] = field(default_factory=dict)
    #: (topic, cohort) -> connected member ids
    members: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: what it reports of its object store (None: a broker from before the field)
    object_store: bool | None = None
    #: removes the deleted incarnations it is asked to (at once)
    removes: bool = True
    #: the creation ids of the incarnations it removed, of those it is asked to remove
    removed: set[str] = field(default_factory=set)


class Fleet:
    """Brokers that answer polls the way real ones would, given the pushed state.

    A leader appends one record per poll and reports every up replica as live;
    followers that are up catch up with the leader. A nominated candidate that
    ``promotes`` reports itself leader at the new epoch on its next poll. The
    controller keeps the last heartbeat of a broker that went down (stale).

    Unloads: a leader of a partition with ``seal`` set that ``seals`` uploads
    everything (``uploaded``: the next offset not in the object store), stops
    appending and reports the seal. A replica that sees a higher incarnation
    (``moves``) drops its copy and opens it at ``startOffset``, or where the
    object store ends when there is none.
    """

    def __init__(self, brokers: int, clock: FakeClock) -> None:
        self.clock = clock
        self.brokers = {b: FakeBroker(b) for b in range(brokers)}
        self.latest: dict[int, Heartbeat] = {}
        #: (topic, partition) -> next offset not yet in the object store
        self.uploaded: dict[tuple[str, int], int] = {}

    def poll(self, state: ClusterState) -> dict[int, Heartbeat]:
        for b in sorted(self.brokers):
            broker = self.brokers[b]
            if broker.up:
                self.latest[b] = self._heartbeat(broker, state)
        return dict(self.latest)

    def forget(self) -> None:
        """A restarted controller remembers no heartbeats."""
        self.latest = {}

    def _open(self, broker: FakeBroker, key: tuple[str, int], p: PartitionStatus) -> int:
        """The start of incarnation ``p.moves`` of this copy, dropping an older one first."""
        held = broker.incarnation.get(key, (0, 0))
        if held[0] < p.moves:
            start = p.start_offset if p.start_offset is not None else self.uploaded.get(key, 0)
            broker.incarnation[key] = (p.moves, start)
            broker.log_end[key] = start
            broker.sealed.pop(key, None)
            held = (p.moves, start)
        return held[1]

    def _heartbeat(self, broker: FakeBroker, state: ClusterState) -> Heartbeat:
        reports = []
        for topic in state.topics.values():
            for p in topic.partitions:
                if broker.id not in p.replicas:
                    continue
                key = (topic.name, p.partition)
                start = self._open(broker, key, p)
                leads = (p.state is PartitionState.ONLINE and p.leader == broker.id) or (
                    p.state is PartitionState.ELECTING
                    and p.candidate == broker.id
                    and broker.promotes
                )
                if leads:
                    seal = broker.sealed.get(key)
                    if seal is not None and (seal.epoch, seal.moves) != (p.leader_epoch, p.moves):
                        seal = None
                    if seal is None and p.seal and broker.seals:
                        end = broker.log_end.get(key, start)
                        self.uploaded[key] = max(self.uploaded.get(key, 0), end)
                        seal = SealReport(end - 1, p.leader_epoch, p.moves, True)
                        broker.sealed[key] = seal
                    if seal is None and broker.appends:
                        broker.log_end[key] = broker.log_end.get(key, start) + 1
                    live = tuple(r for r in p.replicas if self.brokers[r].up)
                    reports.append(
                        PartitionReport(
                            topic.name,
                            p.partition,
                            "leader",
                            p.leader_epoch,
                            broker.log_end.get(key, start),
                            broker.log_end.get(key, start),
                            live,
                            p.moves,
                            start,
                            seal,
                        )
                    )
                else:
                    leader = p.owner
                    if leader is not None and self.brokers[leader].up:
                        theirs = self.brokers[leader].log_end.get(key)
                        if theirs is not None and theirs >= start:
                            broker.log_end[key] = theirs
                    reports.append(
                        PartitionReport(
                            topic.name,
                            p.partition,
                            "follower",
                            p.leader_epoch,
                            broker.log_end.get(key, start),
                            0,
                            (),
                            p.moves,
                            start,
                        )
                    )
        cohorts = tuple(
            CohortReport(t, c, tuple(sorted(ms))) for (t, c), ms in sorted(broker.members.items())
        )
        asked = {c for c, d in state.deleted.items() if d.broker == broker.id}
        broker.removed &= asked
        if broker.object_store and broker.removes:
            broker.removed |= asked
        return Heartbeat(
            info(broker.id),
            self.clock.now_ms,
            broker.adoption,
            broker.draining,
            tuple(reports),
            cohorts,
            generation=state.generation,  # it answers from the state last pushed
            object_store=broker.object_store,
            removed_incarnations=tuple(sorted(broker.removed)),
        )
