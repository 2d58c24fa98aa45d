"""Setting aside: a Retain deletion's topic stays retained until its holders confirm."""

from __future__ import annotations

from control_fakes import beat

from headrace.control import election, setting_aside
from headrace.control.model import ClusterState, DeletionRequest, TopicStatus
from headrace.protocol.coordination import PartitionReport

T = "ns/orders"


def placed(*replicas: tuple[int, ...]) -> TopicStatus:
    return TopicStatus(T, 1, tuple(election.first_status(i, r) for i, r in enumerate(replicas)), {})


def test_a_retain_deletion_starts_setting_aside_on_every_replica() -> None:
    before = ClusterState(4, {}, {T: placed((0, 1), (1, 2))})
    after = ClusterState(5, {}, {})
    started = setting_aside.started(before, after, {DeletionRequest(T, retain=True)})
    assert started == {T: setting_aside.SettingAside(T, 5, frozenset({0, 1, 2}))}


def test_a_delete_deletion_or_a_kept_topic_starts_nothing() -> None:
    before = ClusterState(4, {}, {T: placed((0, 1))})
    assert (
        setting_aside.started(before, ClusterState(5, {}, {}), {DeletionRequest(T, retain=False)})
        == {}
    )
    kept = ClusterState(5, {}, {T: placed((0, 1))})
    assert setting_aside.started(before, kept, {DeletionRequest(T, retain=True)}) == {}


def test_a_holder_confirms_once_it_applied_the_push_and_reports_none_of_it() -> None:
    aside = setting_aside.SettingAside(T, 5, frozenset({0, 1, 2}))
    still = PartitionReport(T, 0, "follower", 1, 10, 10)
    heartbeats = {0: beat(0, 1), 1: beat(1, 1, partitions=(still,)), 2: beat(2, 1)}
    # 0 applied it; 1 applied it but its heartbeat still reports a copy; 2 is behind
    applied = {0: 5, 1: 6, 2: 4}
    assert aside.waiting_for(applied, heartbeats) == {1, 2}
    assert setting_aside.confirmed({T: aside}, applied, heartbeats) == frozenset()
    done = {0: beat(0, 2), 1: beat(1, 2), 2: beat(2, 2)}
    assert setting_aside.confirmed({T: aside}, {0: 5, 1: 6, 2: 5}, done) == {T}
