"""Replication, tiering and the placement executor built from fakes of their ports: no
``Broker``, no sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from headrace.broker.config import BrokerSettings
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.placing import Placer
from headrace.broker.ports import LiveReplicasChanged, PartitionEvent, PartitionReopened
from headrace.broker.replicating import Replication
from headrace.broker.tiering import Tiering
from headrace.broker.topics import Partition, Role, TopicRegistry
from headrace.errors import NotLeader, StaleEpoch, UnknownTopic
from headrace.objectstore.directory import DirectoryStore
from headrace.protocol import replication as rp
from headrace.protocol.coordination import ClusterTopology
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.records import batch as rb
from headrace.replication import assigning
from headrace.replication.leader import LeaderReplicaSet
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig
from headrace.tiered.sealing import Sealing, SealStage

ME = 0
TOPIC = "default/orders"
#: bounds a regression's hang; never part of the synchronisation
HANG_GUARD_SECONDS = 30


class FakeCommitter:
    def __init__(self) -> None:
        self.appended_to: list[Partition] = []

    def appended(self, partition: Partition) -> None:
        self.appended_to.append(partition)

    def wait_durable(self, partition: Partition, offset: int) -> asyncio.Future[None]:
        raise AssertionError("not used here")


class FakeCohort:
    def __init__(self) -> None:
        self.woken = 0

    def in_flight(self, partition: int) -> bool:
        return False

    def wake(self) -> None:
        self.woken += 1


@dataclass
class FakeHost:
    """Implements ``ReplicationHost`` and ``TieringHost``."""

    settings: BrokerSettings
    registry: TopicRegistry
    metrics: BrokerMetrics
    committer: FakeCommitter = field(default_factory=FakeCommitter)
    endpoints: dict[int, BrokerEndpoint] = field(default_factory=dict)
    cohorts: list[FakeCohort] = field(default_factory=list)
    cluster_id: str = "c1"
    awaiting_topology: bool = False
    replication_token: str | None = None

    def endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        return self.endpoints.get(broker_id)

    def client_ssl_context(self) -> None:
        return None

    def cohorts_of(self, topic: str) -> list[FakeCohort]:
        return self.cohorts


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FakeHost]:
    log_config = LogConfig(fsync=FsyncPolicy.NONE)
    settings = BrokerSettings(data_dir=tmp_path, broker_id=ME, cluster_mode=True, log=log_config)
    registry = TopicRegistry(tmp_path, log_config)
    yield FakeHost(settings, registry, BrokerMetrics(registry.all_partitions))
    registry.close()


def lead(host: FakeHost, *, epoch: int = 3, lrs: list[int] | None = None) -> Partition:
    """A partition this broker leads, with follower 1 (outside the LRS unless named)."""
    p = host.registry.create(TOPIC, 1).partition(0)
    p.role, p.leader_id, p.leader_epoch = Role.LEADER, ME, epoch
    now = time.monotonic_ns() // 1_000_000
    p.replica_set = LeaderReplicaSet.become_leader(ME, [ME, 1], lrs or [ME], 0, now)
    return p


def append(p: Partition, count: int) -> None:
    raw = rb.encode([b"x" * 10] * count, timestamp_ms=1_000)
    p.log.append(raw, rb.validate(raw), p.leader_epoch)
    p.appended()


def fetch(offset: int, epoch: int = 3) -> rp.ReplicaFetch:
    return rp.ReplicaFetch(1, 0, [rp.FetchPosition(TOPIC, 0, epoch, offset)])


# --------------------------------------------------------------------------- replication


def test_the_leader_side_serves_records_and_reports_the_lrs_growing(host: FakeHost) -> None:
    events: list[PartitionEvent] = []
    replication = Replication(host, events.append)
    p = lead(host)
    append(p, 3)
    assert p.high_watermark == 3  # the LRS is the leader alone

    (entry,) = replication.serve_fetch(fetch(0)).partitions
    assert entry.error == 0 and entry.epoch == 3
    assert [h.record_count for _, h in rb.scan(entry.data)] == [3]
    assert (entry.high_watermark, entry.log_end_offset) == (3, 3)
    assert events == []  # behind the HW: not back in the LRS yet

    replication.serve_fetch(fetch(3))
    assert events == [LiveReplicasChanged(p)]
    assert p.replica_set is not None and p.replica_set.lrs == {ME, 1}


def test_cursors_are_sent_to_each_follower_once_per_version(host: FakeHost) -> None:
    replication = Replication(host, lambda event: None)
    p = lead(host, lrs=[ME, 1])
    p.cursors.set("readers", 2)
    assert replication.serve_fetch(fetch(0)).partitions[0].cursors == {"readers": 2}
    assert replication.serve_fetch(fetch(0)).partitions[0].cursors is None
    p.cursors.set("readers", 3)
    assert replication.serve_fetch(fetch(0)).partitions[0].cursors == {"readers": 3}
    assert replication.cursor_versions_sent == {(1, p.name): p.cursors.version}


def test_the_leader_side_refuses_stale_epochs_and_non_leaders(host: FakeHost) -> None:
    replication = Replication(host, lambda event: None)
    p = lead(host, epoch=3)
    assert replication.serve_fetch(fetch(0, epoch=2)).partitions[0].error == StaleEpoch.CODE
    p.role = Role.FOLLOWER
    assert replication.serve_fetch(fetch(0)).partitions[0].error == NotLeader.CODE
    answers = replication.answer_epochs(
        [rp.EpochQuery(TOPIC, 0, 3), rp.EpochQuery("default/gone", 0, 3)]
    )
    assert [a.error for a in answers] == [NotLeader.CODE, UnknownTopic.CODE]


def test_the_leader_sends_its_cutover_with_the_records(host: FakeHost) -> None:
    """A repartition's cutover goes with every answer, read after the records: a follower
    that copies a record appended under the new version copies where that version began."""
    replication = Replication(host, lambda event: None)
    p = lead(host, lrs=[ME, 1])
    append(p, 2)
    assert replication.serve_fetch(fetch(0)).partitions[0].cutover is None
    host.registry.ensure_topic(TOPIC, 1, 2, {})  # the cutover: the fence moves at offset 2
    append(p, 3)
    (entry,) = replication.serve_fetch(fetch(0)).partitions
    assert [h.record_count for _, h in rb.scan(entry.data)] == [2, 3]
    assert entry.cutover == (2, 2) == p.cutover


async def test_fetchers_follow_the_endpoints_the_host_knows(host: FakeHost) -> None:
    replication = Replication(host, lambda event: None)
    p = host.registry.create(TOPIC, 1).partition(0)
    p.role, p.leader_id = Role.FOLLOWER, 2
    replication.reconcile()
    assert replication.fetchers == {}  # broker 2's address is unknown
    host.endpoints[2] = BrokerEndpoint(2, "127.0.0.1", 1)
    replication.reconcile()
    assert list(replication.fetchers) == [2]
    assert replication.fetchers[2].leader == host.endpoints[2]
    await replication.close()
    assert replication.fetchers == {}


# --------------------------------------------------------------------------- tiering and the executor


def topology(**placement: object) -> ClusterTopology:
    return ClusterTopology.from_json(
        {
            "generation": 2,
            "clusterId": "c1",
            "brokers": [{"id": 0, "host": "127.0.0.1", "port": 1, "adminPort": 2}],
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": 1,
                    "partitioningVersion": 1,
                    "minInSync": 1,
                    "assignments": [{"partition": 0, "replicas": [ME], "epoch": 4, **placement}],
                }
            ],
        }
    )


def apply(placer: Placer, doc: ClusterTopology) -> None:
    placer.execute(assigning.hosting(doc, ME))
    placer.execute(assigning.plan(placer.hosted(), doc, ME))


def test_the_executor_opens_and_leads_a_new_partition(host: FakeHost) -> None:
    tiering = Tiering(host, None, lambda event: None, report_changed=lambda p: None)
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=ME))
    p = host.registry.get(TOPIC).partition(0)
    assert (p.role, p.leader_id, p.leader_epoch, p.replicas) == (Role.LEADER, ME, 4, [ME])
    assert p.replica_set is not None
    apply(placer, topology(leader=None))
    assert (p.role, p.leader_id) == (Role.FOLLOWER, -1)
    assert not p.lrs  # no replica set: a follower tracks nobody
    apply(placer, ClusterTopology(3, "c1", []))
    assert host.registry.topics == {}


def test_a_copy_leads_from_the_cutover_it_copied_even_after_a_restart(
    host: FakeHost, tmp_path: Path
) -> None:
    """A follower that copied the old leader's cutover with its records takes it when it
    leads under that version, not its log end (past the records it copied after it); a
    restart in between keeps it, as it keeps the records."""
    tiering = Tiering(host, None, lambda event: None, report_changed=lambda p: None)
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=None))
    p = host.registry.get(TOPIC).partition(0)
    assert p.role is Role.FOLLOWER
    append(p, 5)
    p.record_cutover((1, 3))  # as ``ReplicaFetcher`` keeps the leader's
    host.registry.close()

    registry = TopicRegistry(tmp_path, host.settings.log)
    registry.load()
    try:
        restarted = FakeHost(host.settings, registry, BrokerMetrics(registry.all_partitions))
        placer = Placer(
            restarted.settings,
            registry,
            Tiering(restarted, None, lambda event: None, report_changed=lambda p: None),
            host.metrics,
        )
        p = registry.get(TOPIC).partition(0)
        assert p.cutover == (1, 3) and p.log.next_offset == 5
        apply(placer, topology(leader=ME))
        assert p.role is Role.LEADER and p.cutover == (1, 3)
    finally:
        registry.close()


def test_a_copy_without_a_cutover_for_the_version_leads_from_its_log_end(
    host: FakeHost,
) -> None:
    """No cutover of this version reached the copy (an older one, or none copied): none of
    its records was appended under it, so the version begins at its end. A copied cutover
    past its end (records it never got, or cut away) is capped there."""
    tiering = Tiering(host, None, lambda event: None, report_changed=lambda p: None)
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=None))
    p = host.registry.get(TOPIC).partition(0)
    append(p, 4)
    p.record_cutover((0, 1))
    apply(placer, topology(leader=ME))
    assert p.cutover == (1, 4)
    apply(placer, topology(leader=None, epoch=5))
    p.record_cutover((1, 9))
    apply(placer, topology(leader=ME, epoch=6))
    assert p.cutover == (1, 4)


def test_a_deleted_topic_is_removed_from_disk_unless_retained(
    host: FakeHost, tmp_path: Path
) -> None:
    tiering = Tiering(host, None, lambda event: None, report_changed=lambda p: None)
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=ME))
    append(host.registry.get(TOPIC).partition(0), 3)
    apply(placer, ClusterTopology(3, "c1", [], retained=[TOPIC]))
    assert host.registry.topics == {}
    kept = list((tmp_path / "retained").iterdir())
    assert len(kept) == 1 and (kept[0] / "0").is_dir()  # the partition's files, moved aside
    assert not (tmp_path / "topics" / TOPIC).exists()
    host.registry.load()  # a restart does not bring it back
    assert host.registry.topics == {}

    apply(placer, topology(leader=ME))
    apply(placer, ClusterTopology(5, "c1", []))
    assert not (tmp_path / "topics" / TOPIC).exists()  # partition and topic.json
    assert len(list((tmp_path / "retained").iterdir())) == 1


def test_a_move_without_an_object_store_reopens_bare_and_takes_its_role_at_once(
    host: FakeHost,
) -> None:
    events: list[PartitionEvent] = []
    tiering = Tiering(host, None, events.append, report_changed=lambda p: None)
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=ME, moves=1, startOffset=10))
    p = host.registry.get(TOPIC).partition(0)
    assert (p.moves, p.start_offset, p.first_epoch, p.log.next_offset) == (1, 10, 4, 10)
    assert p.role is Role.LEADER and p.leader_epoch == 4
    assert events == []  # nothing ran in the background


async def test_a_move_with_an_object_store_reopens_then_reports_it(
    host: FakeHost, tmp_path: Path
) -> None:
    events: list[PartitionEvent] = []
    published = asyncio.Event()

    def publish(event: PartitionEvent) -> None:
        events.append(event)
        published.set()

    host.registry.object_store_configured = True
    tiering = Tiering(
        host,
        DirectoryStore(tmp_path / "store", fsync=False),
        publish,
        report_changed=lambda p: None,
    )
    placer = Placer(host.settings, host.registry, tiering, host.metrics)
    apply(placer, topology(leader=ME, moves=1, startOffset=10))
    p = host.registry.get(TOPIC).partition(0)
    assert p.moving and p.role is Role.LEADER and p.leader_epoch == 0  # the role waits
    await asyncio.wait_for(published.wait(), HANG_GUARD_SECONDS)
    assert events == [PartitionReopened(p)]
    assert (p.moves, p.start_offset, p.log.next_offset, p.moving) == (1, 10, 10, False)
    await tiering.close()


def test_withdrawing_a_seal_wakes_the_cohorts_the_host_names(
    host: FakeHost, tmp_path: Path
) -> None:
    host.registry.object_store_configured = True
    host.cohorts.append(FakeCohort())
    tiering = Tiering(
        host,
        DirectoryStore(tmp_path / "store", fsync=False),
        lambda e: None,
        report_changed=lambda p: None,
    )
    p = lead(host)
    state = tiering.attach(p)
    assert state is not None and state.tier.prefix.startswith("c1/")
    state.sealing = Sealing(SealStage.SEALED)
    assert p.moving
    tiering.moves.unseal(p)
    assert not p.moving and host.cohorts[0].woken == 1
