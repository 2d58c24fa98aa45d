"""Fakes for the control core's tests: a clock and a fleet of brokers that heartbeat."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.control.model import (
    BrokerInfo,
    ClusterState,
    CohortReport,
    Heartbeat,
    PartitionReport,
    PartitionState,
)


def info(broker: int) -> BrokerInfo:
    return BrokerInfo(broker, f"10.0.0.{broker}", 9092, 9644)


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
    adoption: int | None = None
    log_end: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (topic, cohort) -> connected member ids
    members: dict[tuple[str, str], set[str]] = field(default_factory=dict)


class Fleet:
    """Brokers that answer polls the way real ones would, given the pushed state.

    A leader appends one record per poll and reports every up replica as live;
    followers that are up catch up with the leader. A nominated candidate that
    ``promotes`` reports itself leader at the new epoch on its next poll. The
    controller keeps the last heartbeat of a broker that went down (stale).
    """

    def __init__(self, brokers: int, clock: FakeClock) -> None:
        self.clock = clock
        self.brokers = {b: FakeBroker(b) for b in range(brokers)}
        self.latest: dict[int, Heartbeat] = {}

    def poll(self, state: ClusterState) -> dict[int, Heartbeat]:
        for b in sorted(self.brokers):
            broker = self.brokers[b]
            if broker.up:
                self.latest[b] = self._heartbeat(broker, state)
        return dict(self.latest)

    def forget(self) -> None:
        """A restarted controller remembers no heartbeats."""
        self.latest = {}

    def _heartbeat(self, broker: FakeBroker, state: ClusterState) -> Heartbeat:
        reports = []
        for topic in state.topics.values():
            for p in topic.partitions:
                if broker.id not in p.replicas:
                    continue
                key = (topic.name, p.partition)
                leads = (p.state is PartitionState.ONLINE and p.leader == broker.id) or (
                    p.state is PartitionState.ELECTING
                    and p.candidate == broker.id
                    and broker.promotes
                )
                if leads:
                    broker.log_end[key] = broker.log_end.get(key, 0) + 1
                    live = tuple(r for r in p.replicas if self.brokers[r].up)
                    reports.append(
                        PartitionReport(
                            topic.name,
                            p.partition,
                            "leader",
                            p.leader_epoch,
                            broker.log_end[key],
                            broker.log_end[key],
                            live,
                        )
                    )
                else:
                    leader = p.owner
                    if leader is not None and self.brokers[leader].up:
                        broker.log_end[key] = self.brokers[leader].log_end.get(key, 0)
                    reports.append(
                        PartitionReport(
                            topic.name,
                            p.partition,
                            "follower",
                            p.leader_epoch,
                            broker.log_end.get(key, 0),
                            0,
                        )
                    )
        cohorts = tuple(
            CohortReport(t, c, tuple(sorted(ms))) for (t, c), ms in sorted(broker.members.items())
        )
        return Heartbeat(
            info(broker.id),
            self.clock.now_ms,
            broker.adoption,
            broker.draining,
            tuple(reports),
            cohorts,
        )
