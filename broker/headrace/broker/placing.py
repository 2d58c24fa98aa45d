"""The one executor of the assignment planner's actions (``replication.assigning``).

The planner decides; this module changes partitions, the registry and the tier
state accordingly, on the event loop. Every action is idempotent for the state
the planner saw, and a ``Reopen`` that runs in the background defers the rest
of its partition's actions: ``PartitionReopened`` plans them again when it is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from headrace import clock, files
from headrace.broker.config import BrokerSettings
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.tiering import Tiering
from headrace.broker.topics import Partition, Role, TopicRegistry
from headrace.errors import NotLeader
from headrace.records.topic_names import canonical_topic_name
from headrace.replication import assigning as plan
from headrace.replication.leader import LeaderReplicaSet
from headrace.storage.log import PartitionLog

log = logging.getLogger(__name__)


def hosted(partition: Partition) -> plan.Hosted:
    """What the planner needs to know of ``partition``."""
    return plan.Hosted(
        partition.topic.name,
        partition.index,
        partition.role is Role.LEADER,
        partition.leader_id,
        partition.leader_epoch,
        partition.moves,
        partition.start_offset,
    )


class Placer:
    """Carries out planned actions on this broker's partitions."""

    def __init__(
        self,
        settings: BrokerSettings,
        registry: TopicRegistry,
        tiering: Tiering,
        metrics: BrokerMetrics,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.tiering = tiering
        self.metrics = metrics

    def hosted(self) -> dict[str, list[plan.Hosted]]:
        """Every topic in the registry -> its partitions hosted here, in registry order."""
        return {
            name: [hosted(p) for p in topic.partitions.values()]
            for name, topic in self.registry.topics.items()
        }

    def creation_ids(self) -> dict[str, str]:
        """Every topic in the registry -> the creation id of its copy here."""
        return {name: topic.creation_id for name, topic in self.registry.topics.items()}

    def prepare(self, topology: plan.TopologyDoc, me: int) -> dict[tuple[str, int], PartitionLog]:
        """Blocking, for a worker thread: open (creating them, durably) the logs of the
        partitions ``topology`` gives broker ``me`` that it does not host yet, by
        (topic, index), for ``execute`` to take.

        Creating a partition is file work (directories, segment files, their fsyncs):
        about 1 ms of CPU each, so 3,000 of them on the event loop stopped heartbeats
        and replication long enough for the controller to count the broker dead (issue
        16 §8). Only the registry is read here; the caller holds off other pushes.
        """
        syncs = files.DirectorySyncs()
        logs: dict[tuple[str, int], PartitionLog] = {}
        try:
            configs = {t.name: t.config for t in topology.topics}
            for action in plan.hosting(topology, me):
                if not isinstance(action, plan.Open):
                    continue
                topic = self.registry.topics.get(canonical_topic_name(action.topic))
                if topic is not None and action.index in topic.partitions:
                    continue
                directory = self.registry.directory_of(action.topic) / str(action.index)
                config = self.registry.log_config_of(dict(configs[action.topic]))
                logs[(action.topic, action.index)] = PartitionLog.open(
                    directory, config, syncs=syncs
                )
            syncs.flush()
        except BaseException:
            for opened in logs.values():
                opened.close()
            raise
        return logs

    def execute(
        self,
        actions: Iterable[plan.Action],
        prepared: dict[tuple[str, int], PartitionLog] | None = None,
    ) -> None:
        """Carry out ``actions``; ``prepared``: logs ``prepare`` opened (taken from it; the
        caller closes what is left)."""
        # New partitions' directory fsyncs, done together once every action has run
        # (``files.DirectorySyncs``): nothing runs on the event loop in between, so no
        # record reaches a new log before its directories are durable.
        syncs = files.DirectorySyncs()
        try:
            self._execute(actions, syncs, {} if prepared is None else prepared)
        finally:
            syncs.flush()

    def _execute(
        self,
        actions: Iterable[plan.Action],
        syncs: files.DirectorySyncs,
        prepared: dict[tuple[str, int], PartitionLog],
    ) -> None:
        deferred: set[tuple[str, int]] = set()
        for action in actions:
            match action:
                case plan.OpenTopic(name, partitions, version, config, creation_id):
                    self.registry.ensure_topic(name, partitions, version, dict(config), creation_id)
                case plan.Open(topic, index, min_in_sync):
                    opened = prepared.pop((topic, index), None)
                    partition = self.registry.open_partition(
                        self.registry.get(topic), index, syncs, opened
                    )
                    partition.min_in_sync = min_in_sync
                    self.tiering.attach(partition)
                case plan.DropTopic(name, retain):
                    if retain:
                        self.registry.retain_topic(name)
                    else:
                        self.registry.forget_topic(name)
                case plan.RemoveIncarnations(incarnations):
                    self.tiering.remove_incarnations(incarnations)
                case _ if (action.topic, action.index) in deferred:
                    continue
                case plan.Reopen(topic, index, moves, start_offset, epoch):
                    # A move: this copy belongs to an older incarnation. Start empty where
                    # the new one starts; the role is applied once that is done.
                    partition = self._partition(topic, index)
                    if self.tiering.moves.reopen(partition, moves, start_offset, epoch):
                        deferred.add((topic, index))
                case plan.Keep():
                    self._keep(self._partition(action.topic, action.index), action)
                case plan.Lead():
                    self._lead(self._partition(action.topic, action.index), action)
                case plan.Follow():
                    self._follow(self._partition(action.topic, action.index), action)
                case plan.Seal(topic, index, took_over):
                    self.tiering.moves.seal(self._partition(topic, index), took_over=took_over)
                case plan.Unseal(topic, index):
                    self.tiering.moves.unseal(self._partition(topic, index))
                case plan.Drop(topic, index, forget, retain):
                    t = self.registry.topics[topic]
                    partition = t.partitions[index]
                    if forget:
                        self.tiering.forget(partition)  # the topic is gone: its objects too
                    self.tiering.detach(partition)
                    self.registry.drop_partition(t, index, keep_files=retain)

    def _partition(self, topic: str, index: int) -> Partition:
        return self.registry.topics[topic].partitions[index]

    def _keep(self, partition: Partition, a: plan.Keep) -> None:
        """Same role; the replica set may have changed (a move adds or removes replicas),
        or a move started (a leader makes the followers it cannot trust fetch again)."""
        replicas = list(a.replicas)
        changed = partition.replicas != replicas
        partition.replicas = replicas
        rs = partition.replica_set
        if partition.role is not Role.LEADER or rs is None:
            return
        new_move = a.move_generation != rs.move_generation
        if changed or new_move:
            lrs_changed = rs.reassign(
                replicas, clock.monotonic_ms(), in_sync=a.lrs, move_generation=a.move_generation
            )
            if lrs_changed:
                log.info(
                    "%s: replicas now %s, live replica set %s",
                    partition.name,
                    replicas,
                    sorted(rs.lrs),
                )
            if new_move and a.move_generation:
                # Followers reset to LEO 0 are known again from their sessions' positions:
                # have every session look at the partition now (an idle follower names its
                # position only when it changes), and the heartbeat report it.
                partition.followers_reset()
        # A removed follower, or one the controller has now recorded leaving the LRS, no
        # longer holds the HW back (``LeaderReplicaSet.recorded``).
        if rs.record_controllers(a.lrs) or changed or new_move:
            partition.advance_high_watermark()

    def _lead(self, partition: Partition, a: plan.Lead) -> None:
        partition.replicas = list(a.replicas)
        self.metrics.leadership_changes.inc()
        partition.role = Role.LEADER
        partition.leader_id = self.settings.broker_id
        partition.leader_epoch = a.epoch
        version = partition.topic.partitioning_version
        held = partition.cutover
        if held is None or held[0] != version:
            # No cutover for this version: no record of it reached this copy (a follower
            # copies the cutover with the first one), so the version starts at our end.
            # Only from a leader of an older release, which sends none, can such records
            # be here: then our end is past the true cutover (docs/repartition.md).
            partition.record_cutover((version, partition.log.next_offset))
        else:
            # Ours, or the old leader's as copied with its records: exact. Capped at our
            # end: a copy that missed the records between, or truncated them, appends
            # this version's records from its end on.
            partition.record_cutover((version, min(held[1], partition.log.next_offset)))
        # The new leader may hold records its old followers lack: HW restarts from ours.
        partition.high_watermark = min(partition.high_watermark, partition.log.next_offset)
        partition.replica_set = LeaderReplicaSet.become_leader(
            self.settings.broker_id,
            list(a.replicas),
            list(a.lrs),
            partition.high_watermark,
            clock.monotonic_ms(),
            lag_max_ms=self.settings.replica_lag_max_ms,
            fetch_silence_max_ms=self.settings.replica_fetch_silence_max_ms,
            move_generation=a.move_generation,
        )
        partition.advance_high_watermark()
        log.info(
            "leading %s at epoch %d (lrs %s)",
            partition.name,
            a.epoch,
            sorted(partition.replica_set.lrs),
        )

    def _follow(self, partition: Partition, a: plan.Follow) -> None:
        partition.replicas = list(a.replicas)
        was_leader = partition.role is Role.LEADER and partition.replica_set is not None
        if partition.role is Role.LEADER:
            self.metrics.leadership_changes.inc()
        partition.role = Role.FOLLOWER
        partition.leader_id = a.leader if a.leader is not None else -1
        partition.leader_epoch = a.epoch
        if was_leader:
            partition.fail_waiters(
                NotLeader(f"{partition.name}: leadership moved to broker {a.leader}")
            )
        partition.replica_set = None
        partition.leader_high_watermark = min(partition.high_watermark, partition.log.next_offset)
        partition.truncated_for_epoch = -1
        log.info("following %s from broker %s at epoch %d", partition.name, a.leader, a.epoch)
