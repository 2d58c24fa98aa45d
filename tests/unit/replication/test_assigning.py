"""The assignment planner: pushed topology + partitions hosted here -> actions, no I/O."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.protocol.coordination import ClusterTopology
from headrace.replication import assigning as plan
from headrace.replication.assigning import (
    Drop,
    DropTopic,
    Follow,
    Hosted,
    Keep,
    Lead,
    Open,
    OpenTopic,
    RemoveIncarnations,
    Reopen,
    Seal,
    Unseal,
)

ME = 1
T = "default/orders"


def topology(*topics: dict[str, Any], generation: int = 2) -> ClusterTopology:
    """The pushed document, parsed as the broker parses it."""
    return ClusterTopology.from_json(
        {
            "generation": generation,
            "clusterId": "c1",
            "brokers": [
                {"id": b, "host": "127.0.0.1", "port": 9000 + b, "adminPort": 8000 + b}
                for b in (0, 1, 2)
            ],
            "topics": list(topics),
        }
    )


def topic(name: str = T, *assignments: dict[str, Any], min_in_sync: int = 2) -> dict[str, Any]:
    return {
        "name": name,
        "partitions": max([a["partition"] for a in assignments], default=0) + 1,
        "partitioningVersion": 1,
        "minInSync": min_in_sync,
        "config": {"retentionMs": 1000},
        "assignments": list(assignments),
    }


def assignment(
    partition: int = 0,
    *,
    leader: int | None = ME,
    replicas: tuple[int, ...] = (0, 1, 2),
    epoch: int = 3,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "partition": partition,
        "replicas": list(replicas),
        "leader": leader,
        "epoch": epoch,
        **extra,
    }


def hosted(
    index: int = 0,
    *,
    name: str = T,
    leader: bool = False,
    leader_id: int = -1,
    epoch: int = 0,
    moves: int = 0,
    start: int = 0,
) -> Hosted:
    return Hosted(name, index, leader, leader_id, epoch, moves, start)


# --------------------------------------------------------------------------- hosting


def test_hosting_opens_every_topic_and_only_the_partitions_given_to_me() -> None:
    doc = topology(
        topic(T, assignment(0), assignment(1, replicas=(0, 2), leader=0)),
        topic("default/other", assignment(0, replicas=(2,), leader=2)),
    )
    assert plan.hosting(doc, ME) == [
        OpenTopic(T, 2, 1, {"retention_ms": 1000}),
        Open(T, 0, 2),
        OpenTopic("default/other", 1, 1, {"retention_ms": 1000}),
    ]


# --------------------------------------------------------------------------- roles


def test_a_new_partition_i_lead_is_led_and_not_sealed() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=3, lrs=[1, 2])))
    assert plan.plan({T: [hosted(0)]}, doc, ME) == [
        Lead(T, 0, 3, (0, 1, 2), (1, 2)),
        Unseal(T, 0),
    ]


def test_a_partition_another_broker_leads_is_followed() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=4)))
    actions = plan.plan({T: [hosted(0, leader=True, leader_id=ME, epoch=3)]}, doc, ME)
    assert actions == [Follow(T, 0, 2, 4, (0, 1, 2)), Unseal(T, 0)]


def test_no_leader_is_followed_with_none() -> None:
    doc = topology(topic(T, assignment(0, leader=None, epoch=4)))
    actions = plan.plan({T: [hosted(0, leader_id=2, epoch=3)]}, doc, ME)
    assert actions == [Follow(T, 0, None, 4, (0, 1, 2)), Unseal(T, 0)]


def test_nothing_changed_keeps_the_role_and_refreshes_the_replicas() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=4, replicas=(1, 2))))
    actions = plan.plan({T: [hosted(0, leader_id=2, epoch=4)]}, doc, ME)
    assert actions == [Keep(T, 0, (1, 2), (1, 2)), Unseal(T, 0)]


def test_a_new_epoch_with_the_same_leader_is_a_change() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=5)))
    actions = plan.plan({T: [hosted(0, leader=True, leader_id=ME, epoch=4)]}, doc, ME)
    assert isinstance(actions[0], Lead) and actions[0].epoch == 5


def test_a_leader_id_change_at_the_same_epoch_is_a_change() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=4)))
    actions = plan.plan({T: [hosted(0, leader_id=0, epoch=4)]}, doc, ME)
    assert actions[0] == Follow(T, 0, 2, 4, (0, 1, 2))


# --------------------------------------------------------------------------- seals


def test_a_move_generation_reaches_the_leader_with_the_controllers_lrs() -> None:
    # A leader seeing a new move resets followers outside that LRS
    doc = topology(
        topic(T, assignment(0, epoch=4, replicas=(0, 1, 2, 3), lrs=[0, 1], moveGeneration=9))
    )
    kept = plan.plan({T: [hosted(0, leader=True, leader_id=ME, epoch=4)]}, doc, ME)
    assert kept[0] == Keep(T, 0, (0, 1, 2, 3), (0, 1), move_generation=9)
    led = plan.plan({T: [hosted(0, leader_id=2, epoch=3)]}, doc, ME)
    assert led[0] == Lead(T, 0, 4, (0, 1, 2, 3), (0, 1), move_generation=9)


def test_a_seal_asked_of_the_current_leader_keeps_appends_until_fenced() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=4, seal=True)))
    actions = plan.plan({T: [hosted(0, leader=True, leader_id=ME, epoch=4)]}, doc, ME)
    assert actions == [Keep(T, 0, (0, 1, 2), (0, 1, 2)), Seal(T, 0, took_over=False)]


def test_a_seal_asked_of_a_new_leader_is_a_takeover() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=5, seal=True)))
    actions = plan.plan({T: [hosted(0, leader_id=0, epoch=4)]}, doc, ME)
    assert actions[1] == Seal(T, 0, took_over=True)


def test_a_follower_never_seals() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=4, seal=True)))
    actions = plan.plan({T: [hosted(0, leader_id=2, epoch=4)]}, doc, ME)
    assert actions == [Keep(T, 0, (0, 1, 2), (0, 1, 2)), Unseal(T, 0)]


# --------------------------------------------------------------------------- moves


def test_a_newer_incarnation_reopens_before_taking_its_role() -> None:
    doc = topology(
        topic(T, assignment(0, leader=ME, epoch=6, moves=2, startOffset=500)),
    )
    actions = plan.plan({T: [hosted(0, leader_id=0, epoch=5, moves=1, start=100)]}, doc, ME)
    assert actions[0] == Reopen(T, 0, 2, 500, 6)
    assert isinstance(actions[1], Lead)


def test_a_move_without_a_known_start_reopens_from_the_store() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=6, moves=1, startOffset=None)))
    actions = plan.plan({T: [hosted(0)]}, doc, ME)
    assert actions[0] == Reopen(T, 0, 1, None, 6)


def test_the_same_incarnation_started_elsewhere_reopens_at_the_leaders_start() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=6, moves=1, startOffset=700)))
    actions = plan.plan({T: [hosted(0, leader_id=2, epoch=6, moves=1, start=650)]}, doc, ME)
    assert actions[0] == Reopen(T, 0, 1, 700, 6)


def test_the_same_incarnation_at_the_same_start_does_not_reopen() -> None:
    for start in (700, None):
        doc = topology(topic(T, assignment(0, leader=2, epoch=6, moves=1, startOffset=start)))
        actions = plan.plan({T: [hosted(0, leader_id=2, epoch=6, moves=1, start=700)]}, doc, ME)
        assert not any(isinstance(a, Reopen) for a in actions)


def test_a_never_moved_partition_does_not_reopen_on_a_start_mismatch() -> None:
    doc = topology(topic(T, assignment(0, leader=2, epoch=6, moves=0, startOffset=10)))
    actions = plan.plan({T: [hosted(0, leader_id=2, epoch=6, start=0)]}, doc, ME)
    assert not any(isinstance(a, Reopen) for a in actions)


def test_a_finished_reopen_takes_its_role_forced() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=6, moves=2, seal=True)))
    after = hosted(0, leader=True, leader_id=ME, epoch=6, moves=2)
    assert plan.plan_reopened(after, doc, ME) == [
        Lead(T, 0, 6, (0, 1, 2), (0, 1, 2)),
        Seal(T, 0, took_over=True),
    ]


def test_a_finished_reopen_of_a_superseded_incarnation_does_nothing() -> None:
    doc = topology(topic(T, assignment(0, leader=ME, epoch=7, moves=3)))
    assert plan.plan_reopened(hosted(0, moves=2), doc, ME) == []
    assert plan.plan_reopened(hosted(0, moves=2), None, ME) == []
    assert plan.plan_reopened(hosted(5, moves=3), doc, ME) == []


# --------------------------------------------------------------------------- drops


def test_a_partition_moved_away_is_dropped_but_its_objects_kept() -> None:
    doc = topology(topic(T, assignment(0, replicas=(0, 2), leader=0)))
    actions = plan.plan({T: [hosted(0, leader=True, leader_id=ME)]}, doc, ME)
    assert actions == [Drop(T, 0, forget=False)]


def test_a_deleted_topic_is_dropped_and_forgotten_by_its_leader_only() -> None:
    doc = topology()
    actions = plan.plan(
        {T: [hosted(0, leader=True, leader_id=ME), hosted(1, leader_id=2)], "default/empty": []},
        doc,
        ME,
    )
    assert actions == [
        Drop(T, 0, forget=True),
        Drop(T, 1, forget=False),
        DropTopic(T),
        DropTopic("default/empty"),
    ]


def test_a_deleted_topic_listed_as_retained_is_closed_with_its_files_and_objects_kept() -> None:
    doc = ClusterTopology.from_json({**topology().to_json(), "retained": [T]})
    hosted_now = {T: [hosted(0, leader=True, leader_id=ME), hosted(1, leader_id=2)]}
    actions = plan.plan({**hosted_now, "default/other": []}, doc, ME)
    assert actions == [
        Drop(T, 0, forget=False, retain=True),
        Drop(T, 1, forget=False, retain=True),
        DropTopic(T, retain=True),
        DropTopic("default/other"),
    ]


def test_retained_names_survive_the_wire_and_are_left_out_when_there_are_none() -> None:
    doc = ClusterTopology.from_json({**topology().to_json(), "retained": [T]})
    assert doc.retained == [T]
    assert ClusterTopology.from_json(doc.to_json()) == doc
    assert "retained" not in topology().to_json()


def test_a_broker_is_asked_to_remove_only_the_incarnations_the_push_gives_it() -> None:
    removals = [
        {"topic": T, "creationId": "u2", "partitions": 3, "broker": ME},
        {"topic": "default/other", "creationId": "u1", "partitions": 1, "broker": ME},
        {"topic": T, "creationId": "u3", "partitions": 3, "broker": 2},
    ]
    doc = ClusterTopology.from_json({**topology().to_json(), "removals": removals})
    assert plan.removals(doc, ME) == RemoveIncarnations(((T, "u2"), ("default/other", "u1")))
    assert plan.removals(topology(), ME) == RemoveIncarnations(()), "none: stop any"


# --------------------------------------------------------------------------- a fixed point


def carry_out(hosted_now: dict[str, list[Hosted]], actions: list[plan.Action]) -> None:
    """What the executor does to the planner's view, in the planner's own terms."""
    for action in actions:
        match action:
            case Lead(t, i, epoch):
                _replace(hosted_now, t, i, leader=True, leader_id=ME, leader_epoch=epoch)
            case Follow(t, i, leader, epoch):
                lid = -1 if leader is None else leader
                _replace(hosted_now, t, i, leader=False, leader_id=lid, leader_epoch=epoch)
            case Reopen(t, i, moves, start):
                _replace(hosted_now, t, i, moves=moves, start_offset=start or 0)
            case Drop(t, i):
                hosted_now[t] = [h for h in hosted_now[t] if h.index != i]
            case DropTopic(t):
                del hosted_now[t]


def _replace(hosted_now: dict[str, list[Hosted]], t: str, i: int, **changes: Any) -> None:
    hosted_now[t] = [
        dataclasses.replace(h, **changes) if h.index == i else h for h in hosted_now[t]
    ]


placements = st.fixed_dictionaries(
    {
        "replicas": st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True),
        "leader": st.one_of(st.none(), st.integers(0, 2)),
        "epoch": st.integers(0, 5),
        "seal": st.booleans(),
        "moves": st.integers(0, 2),
        "startOffset": st.one_of(st.none(), st.integers(0, 3)),
    }
)
locals_ = st.builds(
    Hosted,
    st.just(T),
    st.integers(0, 3),
    st.booleans(),
    st.integers(-1, 2),
    st.integers(0, 5),
    st.integers(0, 2),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(placements, max_size=4),
    st.lists(locals_, max_size=4, unique_by=lambda h: h.index),
    st.booleans(),
)
def test_carrying_out_a_plan_reaches_a_fixed_point(
    docs: list[dict[str, Any]], local: list[Hosted], topic_exists: bool
) -> None:
    """Once a plan is carried out, planning again changes no role and drops nothing."""
    doc = topology(
        *([topic(T, *[assignment(i, **d) for i, d in enumerate(docs)])] if topic_exists else [])
    )
    mine = {i for i, d in enumerate(docs) if ME in d["replicas"]} if topic_exists else set()
    # after ``hosting``: every partition given to me is open (new ones fresh)
    by_index = {h.index: h for h in local}
    now = {T: [by_index.get(i, hosted(i)) for i in sorted(mine | set(by_index))]}
    carry_out(now, plan.plan(now, doc, ME))
    again = plan.plan(now, doc, ME)
    assert all(isinstance(a, Keep | Seal | Unseal) for a in again), again
    assert not any(isinstance(a, Seal) and a.took_over for a in again)
    assert {h.index for hs in now.values() for h in hs} == mine


# --------------------------------------------------------------------------- incarnations


def test_hosting_passes_the_creation_id_on_to_the_topic() -> None:
    doc = topology({**topic(T, assignment(0)), "creationId": "uid-2"})
    assert plan.hosting(doc, ME)[0] == OpenTopic(T, 1, 1, {"retention_ms": 1000}, "uid-2")


def test_a_copy_of_a_deleted_incarnation_is_dropped_before_the_new_one_opens() -> None:
    doc = topology({**topic(T, assignment(0), assignment(1)), "creationId": "uid-2"})
    hosted_now = {T: [hosted(0, leader=True, leader_id=ME), hosted(1, leader_id=2)]}
    assert plan.superseded(hosted_now, {T: "uid-1"}, doc) == [
        Drop(T, 0, forget=True),
        Drop(T, 1, forget=False),
        DropTopic(T),
    ]


def test_the_same_incarnation_or_one_without_an_id_is_never_superseded() -> None:
    with_id = topology({**topic(T, assignment(0)), "creationId": "uid-1"})
    without_id = topology(topic(T, assignment(0)))
    hosted_now = {T: [hosted(0, leader=True, leader_id=ME)]}
    assert plan.superseded(hosted_now, {T: "uid-1"}, with_id) == []
    # a copy from before creation ids, or a controller that sends none: the same topic
    # as often as not, so it is kept
    assert plan.superseded(hosted_now, {T: ""}, with_id) == []
    assert plan.superseded(hosted_now, {T: "uid-1"}, without_id) == []
    assert plan.superseded({}, {}, with_id) == []
