"""Control model documents: JSON shapes, round trips, and rejection of bad documents."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control.model import (
    CLUSTER_STATE_JSON,
    ELECTION_STATES,
    PARTITION_STATUS_JSON,
    TOPIC_STATUS_JSON,
    UNLOAD_PROGRESS_JSON,
    ClusterState,
    CohortPlan,
    DeletedIncarnation,
    MovePhase,
    MoveProgress,
    PartitionState,
    PartitionStatus,
    RecoverySource,
    TopicSpec,
    TopicStatus,
    Transition,
    UnloadPhase,
    UnloadProgress,
    normalise_lrs,
)
from headrace.errors import InvalidRequest, InvalidTopicSpec, UnsupportedDocument
from headrace.protocol.coordination import (
    TOPOLOGY_FORMAT,
    ClusterTopology,
    CohortPosition,
    CohortReport,
    Heartbeat,
    PartitioningHistory,
    PartitionReport,
    PastTransition,
    SealReport,
)
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress, ListenerAddress
from tests.unit.json_edits import broken

SETTINGS = settings(max_examples=100, deadline=None)


def partition_status(p: int = 0) -> PartitionStatus:
    return PartitionStatus(
        partition=p,
        replicas=(2, 0, 1),
        leader=None,
        leader_epoch=4,
        live_replicas=(2, 0),
        state=PartitionState.ELECTING,
        candidate=0,
        deadline_ms=1_005_000,
        tried=(2, 0),
    )


def cluster() -> ClusterState:
    topic = TopicStatus(
        "default/orders",
        2,
        (partition_status(0),),
        {"billing": CohortPlan("billing", 3, {"m-b": (), "m-a": (0,)})},
    )
    return ClusterState(7, {1: BrokerEndpoint(1, "h1", 9092, 9644)}, {topic.name: topic})


def test_cluster_state_document_shape() -> None:
    assert CLUSTER_STATE_JSON.dump(cluster()) == {
        "generation": 7,
        "brokers": [{"id": 1, "host": "h1", "port": 9092, "adminPort": 9644}],
        "topics": [
            {
                "name": "default/orders",
                "partitioningVersion": 2,
                "partitions": [
                    {
                        "partition": 0,
                        "replicas": [2, 0, 1],
                        "leader": None,
                        "leaderEpoch": 4,
                        "liveReplicas": [2, 0],
                        "state": "Electing",
                        "candidate": 0,
                        "deadlineMs": 1_005_000,
                        "tried": [2, 0],
                        "seal": False,
                        "moves": 0,
                        "startOffset": None,
                    }
                ],
                "cohortPlans": [
                    {"cohort": "billing", "generation": 3, "assignment": {"m-a": [0], "m-b": []}}
                ],
            }
        ],
    }


def test_cluster_state_survives_json() -> None:
    state = cluster()
    assert CLUSTER_STATE_JSON.load(json.loads(json.dumps(CLUSTER_STATE_JSON.dump(state)))) == state


def test_retired_partitions_survive_json_and_lower_the_routing_count() -> None:
    topic = TopicStatus(
        "default/orders", 3, (partition_status(0), partition_status(1), partition_status(2))
    )
    shrunk = replace(topic, active_partitions=2)
    doc = json.loads(json.dumps(TOPIC_STATUS_JSON.dump(shrunk)))
    assert doc["activePartitions"] == 2 and "activePartitions" not in TOPIC_STATUS_JSON.dump(topic)
    assert TOPIC_STATUS_JSON.load(doc) == shrunk
    assert (shrunk.routing_partitions, topic.routing_partitions) == (2, 3)


def test_heartbeat_document_shape_and_round_trip() -> None:
    hb = Heartbeat(
        BrokerEndpoint(3, "h3", 9092, 9644),
        received_ms=55,
        adoption=9,
        draining=True,
        partitions=(PartitionReport("default/t", 1, "leader", 2, 10, 8, (3, 1)),),
        cohorts=(CohortReport("default/t", "c", ("m1", "m2")),),
    )
    doc = hb.to_json()
    assert doc == {
        "broker": {"id": 3, "host": "h3", "port": 9092, "adminPort": 9644},
        "generation": 0,
        "adoption": 9,
        "draining": True,
        "partitions": [
            {
                "topic": "default/t",
                "partition": 1,
                "role": "leader",
                "leaderEpoch": 2,
                "logEndOffset": 10,
                "highWatermark": 8,
                "liveReplicas": [3, 1],
                "moves": 0,
                "startOffset": 0,
                "sealed": None,
                "logStartOffset": 0,
                "storedThrough": None,
                "cursors": {},
            }
        ],
        "cohorts": [{"topic": "default/t", "cohort": "c", "members": ["m1", "m2"]}],
        "connections": 0,
        "topologyFormat": 1,
        "refusedTopologyFormat": None,
    }
    assert "receivedMs" not in doc, "the controller stamps the receive time, not the broker"
    assert Heartbeat.from_json(json.loads(json.dumps(doc)), received_ms=55) == hb


def test_heartbeat_optional_fields_default() -> None:
    doc = {"broker": {"id": 0, "host": "h", "port": 1, "adminPort": 2}}
    hb = Heartbeat.from_json(doc, received_ms=7)
    assert (hb.adoption, hb.draining, hb.partitions, hb.cohorts) == (None, False, (), ())
    # a broker from before topology formats reads format 1 and has refused none
    assert (hb.topology_format, hb.refused_topology_format) == (1, None)
    assert hb.broker_id == 0
    follower = {
        "topic": "t/t",
        "partition": 0,
        "role": "follower",
        "leaderEpoch": 1,
        "logEndOffset": 0,
        "highWatermark": 0,
    }
    report = PartitionReport.from_json(follower)
    assert (report.live_replicas, report.moves, report.start_offset, report.sealed) == (
        (),
        0,
        0,
        None,
    ), "a broker that knows nothing of unloads still parses"
    assert (report.log_start_offset, report.stored_through, report.cursors) == (0, None, {})


def test_partition_report_carries_log_start_tier_and_cursors() -> None:
    report = PartitionReport(
        "default/t",
        0,
        "leader",
        1,
        50,
        48,
        (1,),
        log_start_offset=5,
        stored_through=40,
        cursors={"readers": 30},
    )
    doc = json.loads(json.dumps(report.to_json()))
    assert (doc["logStartOffset"], doc["storedThrough"], doc["cursors"]) == (5, 40, {"readers": 30})
    assert PartitionReport.from_json(doc) == report
    with pytest.raises(InvalidRequest, match="cursors must map"):
        PartitionReport.from_json({**doc, "cursors": {"readers": "30"}})


def test_sealed_report_shape_and_round_trip() -> None:
    sealed = SealReport(41, epoch=3, moves=1, verified=False, message="manifest ends at 40")
    report = PartitionReport("default/t", 0, "leader", 3, 42, 42, (1,), 1, 10, sealed)
    doc = report.to_json()
    assert doc["moves"] == 1
    assert doc["startOffset"] == 10
    assert doc["sealed"] == {
        "lastCommittedOffset": 41,
        "epoch": 3,
        "moves": 1,
        "verified": False,
        "message": "manifest ends at 40",
    }
    assert PartitionReport.from_json(json.loads(json.dumps(doc))) == report
    del doc["sealed"]["message"]
    assert PartitionReport.from_json(doc).sealed == SealReport(41, 3, 1, False, "")


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("lastCommittedOffset", "41", "must be int"),
        ("epoch", KeyError, "missing field 'epoch'"),
        ("verified", 1, "must be bool"),
    ],
)
def test_bad_seal_reports_are_rejected(key: str, value: object, words: str) -> None:
    doc = PartitionReport(
        "default/t", 0, "leader", 3, 42, 42, sealed=SealReport(41, 3, 0, True)
    ).to_json()
    with pytest.raises(InvalidRequest, match=words):
        PartitionReport.from_json(broken(doc, ["sealed", key], value))


def test_partition_status_unload_fields_default_for_old_documents() -> None:
    doc = PARTITION_STATUS_JSON.dump(partition_status())
    for key in ("seal", "moves", "startOffset"):
        del doc[key]
    parsed = PARTITION_STATUS_JSON.load(doc)
    assert (parsed.seal, parsed.moves, parsed.start_offset) == (False, 0, None)
    moved = replace(partition_status(), seal=True, moves=2, start_offset=100)
    assert PARTITION_STATUS_JSON.dump(moved) == doc | {"seal": True, "moves": 2, "startOffset": 100}
    assert PARTITION_STATUS_JSON.load(PARTITION_STATUS_JSON.dump(moved)) == moved


def test_unload_progress_shape_and_round_trip() -> None:
    progress = UnloadProgress(
        "default/move-it",
        UnloadPhase.MOVING,
        (
            MoveProgress(
                0,
                MovePhase.SEALED,
                from_broker=0,
                to_broker=2,
                sealed_offset=99,
                moves=1,
                verified=True,
                checked_ms=7,
            ),
            MoveProgress(
                1,
                MovePhase.SEALING,
                from_broker=1,
                moves=3,
                recovery_source=RecoverySource.OBJECT_STORE,
                recovery_message="lost",
                deadline_ms=5,
                message="waiting",
            ),
        ),
        started_ms=3,
    )
    doc = UNLOAD_PROGRESS_JSON.dump(progress)
    assert doc == {
        "name": "default/move-it",
        "phase": "Moving",
        "moves": [
            {
                "partition": 0,
                "phase": "Sealed",
                "fromBroker": 0,
                "toBroker": 2,
                "sealedOffset": 99,
                "moves": 1,
                "verified": True,
                "verificationMessage": "",
                "checkedMs": 7,
                "recoverySource": None,
                "recoveryMessage": "",
                "deadlineMs": None,
                "message": "",
            },
            {
                "partition": 1,
                "phase": "Sealing",
                "fromBroker": 1,
                "toBroker": None,
                "sealedOffset": None,
                "moves": 3,
                "verified": None,
                "verificationMessage": "",
                "checkedMs": None,
                "recoverySource": "ObjectStore",
                "recoveryMessage": "lost",
                "deadlineMs": 5,
                "message": "waiting",
            },
        ],
        "startedMs": 3,
        "completedMs": None,
        "message": "",
    }
    assert UNLOAD_PROGRESS_JSON.load(json.loads(json.dumps(doc))) == progress
    assert UNLOAD_PROGRESS_JSON.load({"name": "a/b", "phase": "Pending"}) == UnloadProgress("a/b")


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["phase"], "Dancing", "unknown phase"),
        (["moves", 0, "phase"], "Flying", "unknown phase"),
        (["moves", 0, "recoverySource"], "Tape", "unknown recoverySource"),
        (["moves", 0, "partition"], KeyError, "missing field 'partition'"),
        (["moves", 0, "verified"], "yes", "must be bool"),
    ],
)
def test_bad_unload_progress_is_rejected(path: list[str | int], value: object, words: str) -> None:
    doc = UNLOAD_PROGRESS_JSON.dump(UnloadProgress("a/b", moves=(MoveProgress(0),)))
    with pytest.raises(InvalidRequest, match=words):
        UNLOAD_PROGRESS_JSON.load(broken(doc, path, value))


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["generation"], KeyError, "missing field 'generation'"),
        (["generation"], "7", "must be int"),
        (["generation"], True, "must be an integer"),
        (["brokers"], {"id": 1}, "must be list"),
        (["brokers", 0, "adminPort"], KeyError, "missing field 'adminPort'"),
        (["topics", 0, "partitions", 0, "state"], "Sleeping", "unknown state"),
        # the API names these two, but no controller sets them
        (["topics", 0, "partitions", 0, "state"], "Moving", "unknown state"),
        (["topics", 0, "partitions", 0, "state"], "Retiring", "unknown state"),
        (["topics", 0, "partitions", 0, "replicas"], [1, "2"], "list of integers"),
        (["topics", 0, "partitions", 0, "partition"], 1, "in order from 0"),
        (["topics", 0, "cohortPlans", 0, "assignment"], {"m": ["0"]}, "list of integers"),
        (["topics", 0, "partitions"], [3], "list of objects"),
        (["topics", 0, "activePartitions"], 1, "activePartitions must be between 1"),
        (["topics", 0, "activePartitions"], 0, "activePartitions must be between 1"),
    ],
)
def test_bad_cluster_documents_are_rejected(
    path: list[str | int], value: object, words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words):
        CLUSTER_STATE_JSON.load(broken(CLUSTER_STATE_JSON.dump(cluster()), path, value))


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["broker"], KeyError, "missing field 'broker'"),
        (["draining"], "yes", "boolean"),
        (["adoption"], 1.5, "must be int"),
        (["partitions", 0, "role"], "boss", "role must be"),
        (["cohorts", 0, "members"], [1], "strings"),
    ],
)
def test_bad_heartbeats_are_rejected(path: list[str | int], value: object, words: str) -> None:
    doc = Heartbeat(
        BrokerEndpoint(3, "h3", 9092, 9644),
        0,
        partitions=(PartitionReport("default/t", 1, "leader", 2, 10, 8),),
        cohorts=(CohortReport("default/t", "c", ("m1",)),),
    ).to_json()
    with pytest.raises(InvalidRequest, match=words):
        Heartbeat.from_json(broken(doc, path, value), received_ms=0)


def test_a_document_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(InvalidRequest, match="expected an object"):
        CLUSTER_STATE_JSON.load([])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": "orders"}, "namespace/name"),
        ({"name": "a/b/c"}, "namespace/name"),
        ({"name": "/b"}, "namespace/name"),
        ({"partitions": 0}, "partitions"),
        ({"replicas": 0}, "replicas"),
        ({"min_in_sync": 0}, "minInSync"),
        ({"replicas": 2, "min_in_sync": 3}, "minInSync"),
    ],
)
def test_topic_spec_validation(kwargs: dict[str, Any], words: str) -> None:
    args: dict[str, Any] = {"name": "default/t", "partitions": 1} | kwargs
    with pytest.raises(InvalidTopicSpec, match=words):
        TopicSpec(**args)


def test_normalise_lrs_keeps_replica_order_and_the_leader() -> None:
    assert normalise_lrs((2, 0, 1), (1, 2, 9), leader=2) == (2, 1), "non-replica 9 dropped"
    assert normalise_lrs((2, 0, 1), (), leader=0) == (0,), "never below the leader"


def test_owner_is_leader_else_candidate() -> None:
    assert partition_status().owner == 0
    online = PartitionStatus(0, (1,), 1, 1, (1,), PartitionState.ONLINE)
    assert online.owner == 1
    offline = PartitionStatus(0, (1,), None, 1, (1,), PartitionState.OFFLINE)
    assert offline.owner is None


ids = st.integers(0, 6)
partition_statuses = st.builds(
    PartitionStatus,
    partition=st.just(0),
    replicas=st.lists(ids, min_size=1, max_size=3, unique=True).map(tuple),
    leader=st.none() | ids,
    leader_epoch=st.integers(0, 10**12),
    live_replicas=st.lists(ids, max_size=3, unique=True).map(tuple),
    state=st.sampled_from(sorted(ELECTION_STATES)),
    candidate=st.none() | ids,
    deadline_ms=st.none() | st.integers(0, 2**53),
    tried=st.lists(ids, max_size=3, unique=True).map(tuple),
    seal=st.booleans(),
    moves=st.integers(0, 100),
    start_offset=st.none() | st.integers(0, 2**63),
    target=st.lists(ids, max_size=3, unique=True).map(tuple),
    target_generation=st.integers(0, 9),
)
plans = st.builds(
    CohortPlan,
    cohort=st.text("abc", min_size=1, max_size=3),
    generation=st.integers(1, 100),
    assignment=st.dictionaries(
        st.text("xyz", min_size=1, max_size=3),
        st.lists(st.integers(0, 9), unique=True).map(lambda ps: tuple(sorted(ps))),
    ),
)


@SETTINGS
@given(
    st.lists(partition_statuses, max_size=4),
    st.lists(plans, max_size=3, unique_by=lambda p: p.cohort),
    st.integers(0, 10**9),
    st.dictionaries(ids, st.builds(BrokerEndpoint, ids, st.text(max_size=5), ids, ids)),
)
def test_any_cluster_state_round_trips(
    parts: list[PartitionStatus],
    cohort_plans: list[CohortPlan],
    generation: int,
    brokers: dict[int, BrokerEndpoint],
) -> None:
    numbered = tuple(replace(p, partition=i) for i, p in enumerate(parts))
    topic = TopicStatus("ns/t", 3, numbered, {p.cohort: p for p in cohort_plans})
    brokers = {b: replace(i, id=b) for b, i in brokers.items()}
    state = ClusterState(generation, brokers, {"ns/t": topic})
    assert CLUSTER_STATE_JSON.load(json.loads(json.dumps(CLUSTER_STATE_JSON.dump(state)))) == state


def test_a_topology_in_a_newer_format_is_refused_before_it_is_read() -> None:
    doc = {"generation": 3, "brokers": [], "topics": []}
    assert ClusterTopology.from_json(doc).format == 1  # from before formats
    assert ClusterTopology.from_json({**doc, "format": TOPOLOGY_FORMAT}).to_json()["format"] == 1
    with pytest.raises(UnsupportedDocument, match="upgrade it"):
        # a newer format may mean something else by the same keys: nothing is read
        ClusterTopology.from_json({"format": TOPOLOGY_FORMAT + 1, "generation": "?"})


def test_unload_progress_reads_nulls_as_absent() -> None:
    doc = {
        "name": "a/b",
        "phase": "Moving",
        "message": None,
        "moves": [{"partition": 0, "phase": "Sealing", "verificationMessage": None}],
    }
    assert UNLOAD_PROGRESS_JSON.load(doc) == UnloadProgress(
        "a/b", UnloadPhase.MOVING, (MoveProgress(0, MovePhase.SEALING),)
    )


counts = st.integers(1, 8)
offsets = st.dictionaries(st.integers(0, 7), st.integers(0, 2**53), max_size=4)
partitions = st.lists(st.integers(0, 7), unique=True, max_size=3).map(lambda ps: tuple(sorted(ps)))
names = st.text("abc", min_size=1, max_size=3)
transitions = st.builds(
    Transition,
    request=st.sampled_from(["default/r", "Topic.spec.partitions"]),
    from_partitions=counts,
    to_partitions=counts,
    from_version=st.integers(0, 9),
    to_version=st.integers(0, 9),
    cutover_ms=st.integers(0, 2**53),
    adoption_timeout_ms=st.integers(1, 10**6),
    adoption_generation=st.none() | st.integers(0, 10**6),
    cutover_offsets=offsets,
    released=st.dictionaries(names, partitions, max_size=3),
    drained_ms=st.none() | st.integers(0, 2**53),
    existing_partitions=st.none() | counts,
)
histories = st.builds(
    PartitioningHistory,
    st.lists(st.builds(PastTransition, counts, counts, st.integers(0, 9), offsets), max_size=2).map(
        lambda ts: tuple(sorted(ts, key=lambda t: t.to_version))
    ),
    st.dictionaries(names, st.builds(CohortPosition, st.integers(0, 9), partitions), max_size=2),
)


@st.composite
def topic_statuses(draw: st.DrawFn, name: str) -> TopicStatus:
    parts = draw(st.lists(partition_statuses, max_size=4))
    numbered = tuple(PartitionStatus(**{**_fields(p), "partition": i}) for i, p in enumerate(parts))
    plans = draw(st.lists(st.builds(CohortPlan, names, st.integers(1, 9)), max_size=2))
    active = draw(st.none() | st.integers(1, len(numbered) - 1)) if len(numbered) > 1 else None
    return TopicStatus(
        name,
        draw(st.integers(1, 9)),
        numbered,
        {p.cohort: p for p in plans},
        draw(st.none() | transitions),
        draw(st.none() | counts),
        active,
        draw(st.none() | histories),
        draw(st.sampled_from(["", "uid-1"])),
    )


def _fields(p: PartitionStatus) -> dict[str, Any]:
    return {f: getattr(p, f) for f in PartitionStatus.__dataclass_fields__}


brokers = st.builds(
    BrokerEndpoint,
    ids,
    st.text("h0.", min_size=1, max_size=4),
    st.integers(0, 65535),
    st.integers(0, 65535),
    st.none() | st.builds(KafkaAddress, st.just("k"), st.integers(0, 65535)),
    st.lists(
        st.builds(ListenerAddress, st.sampled_from(["lan", "ext"]), st.just("x"), ids),
        max_size=2,
        unique_by=lambda listener: listener.name,
    ).map(tuple),
)


@st.composite
def cluster_states(draw: st.DrawFn) -> ClusterState:
    topics = {n: draw(topic_statuses(n)) for n in draw(st.sets(st.sampled_from(["a/x", "b/y"])))}
    known = {b.id: b for b in draw(st.lists(brokers, max_size=3))}
    deleted = draw(
        st.dictionaries(
            names,
            st.builds(DeletedIncarnation, st.just("a/x"), st.just(""), counts, ids, st.none()),
            max_size=2,
        )
    )
    return ClusterState(
        draw(st.integers(0, 10**6)),
        known,
        topics,
        {
            c: DeletedIncarnation(d.topic, c, d.partitions, d.deleted_generation)
            for c, d in deleted.items()
        },
    )


@SETTINGS
@given(cluster_states())
def test_any_cluster_state_with_transitions_history_and_deletions_round_trips(
    state: ClusterState,
) -> None:
    doc = json.loads(json.dumps(CLUSTER_STATE_JSON.dump(state)))
    assert CLUSTER_STATE_JSON.load(doc) == state
