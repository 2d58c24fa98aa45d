"""The generated codecs of the persisted state: ``Transition``, ``TopicStatus``, ``ClusterState``.

The document shapes are pinned here field for field: they are what every controller
already persisted (CR status, ``state.json``), so a change of shape is a migration.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control.model import (
    CLUSTER_STATE_JSON,
    ELECTION_STATES,
    TOPIC_STATUS_JSON,
    TRANSITION_JSON,
    ClusterState,
    CohortPlan,
    DeletedIncarnation,
    PartitionStatus,
    TopicStatus,
    Transition,
)
from headrace.errors import InvalidRequest
from headrace.protocol.coordination import CohortPosition, PartitioningHistory, PastTransition
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress
from tests.unit.json_edits import broken

SETTINGS = settings(max_examples=150, deadline=None)


def marker(**changes: Any) -> Transition:
    fields: dict[str, Any] = {
        "request": "default/grow",
        "from_partitions": 2,
        "to_partitions": 3,
        "from_version": 1,
        "to_version": 2,
        "cutover_ms": 1_000,
        "adoption_timeout_ms": 30_000,
        "cutover_offsets": {1: 40, 0: 7},
        "released": {"billing": (2,), "audit": (0, 2)},
    }
    return Transition(**(fields | changes))


def test_a_transition_document_has_its_shape() -> None:
    assert TRANSITION_JSON.dump(marker()) == {
        "kind": "Grow",
        "request": "default/grow",
        "fromPartitions": 2,
        "toPartitions": 3,
        "fromVersion": 1,
        "toVersion": 2,
        "cutoverMs": 1_000,
        "adoptionTimeoutMs": 30_000,
        "adoptionGeneration": None,
        "cutoverOffsets": [{"partition": 0, "offset": 7}, {"partition": 1, "offset": 40}],
        "released": [
            {"cohort": "audit", "partitions": [0, 2]},
            {"cohort": "billing", "partitions": [2]},
        ],
        "drainedMs": None,
    }
    shrink = marker(to_partitions=1, adoption_generation=9, drained_ms=5, existing_partitions=4)
    doc = TRANSITION_JSON.dump(shrink)
    assert (doc["kind"], doc["adoptionGeneration"], doc["drainedMs"]) == ("Shrink", 9, 5)
    assert doc["existingPartitions"] == 4
    assert TRANSITION_JSON.load(doc) == shrink


def test_a_transition_reads_its_released_partitions_sorted_and_ignores_its_kind() -> None:
    doc = {**TRANSITION_JSON.dump(marker()), "kind": "Shrink"}
    doc["released"] = [{"cohort": "audit", "partitions": [2, 0]}]
    assert TRANSITION_JSON.load(doc) == marker(released={"audit": (0, 2)})


def test_a_topic_status_leaves_out_what_is_unset() -> None:
    bare = TopicStatus("default/t", 1, ())
    assert TOPIC_STATUS_JSON.dump(bare) == {
        "name": "default/t",
        "partitioningVersion": 1,
        "partitions": [],
        "cohortPlans": [],
    }
    full = TopicStatus(
        "default/t",
        2,
        (),
        {"b": CohortPlan("b", 1), "a": CohortPlan("a", 2, {"m": (0,)})},
        marker(),
        spec_partitions=3,
        history=PartitioningHistory((PastTransition(1, 2, 2, {0: 3}),)),
        creation_id="uid-1",
    )
    doc = TOPIC_STATUS_JSON.dump(full)
    assert [p["cohort"] for p in doc["cohortPlans"]] == ["a", "b"]
    assert doc["transition"] == TRANSITION_JSON.dump(marker())
    assert doc["history"] == PartitioningHistory((PastTransition(1, 2, 2, {0: 3}),)).to_json()
    assert (doc["specPartitions"], doc["creationId"]) == (3, "uid-1")
    assert TOPIC_STATUS_JSON.load(json.loads(json.dumps(doc))) == full


def test_a_topic_status_without_partitions_or_plans_has_none() -> None:
    doc = {"name": "default/t", "partitioningVersion": 1, "partitions": None}
    assert TOPIC_STATUS_JSON.load(doc) == TopicStatus("default/t", 1, ())
    assert TOPIC_STATUS_JSON.load({"name": "default/t", "partitioningVersion": 1}).partitions == ()


def test_a_cluster_state_leaves_out_no_deletions_and_keeps_its_brokers_own_shape() -> None:
    kafka = BrokerEndpoint(1, "h1", 9092, 9644, KafkaAddress("k1", 9093))
    state = ClusterState(3, {1: kafka, 0: BrokerEndpoint(0, "h0", 9092, 9644)})
    doc = CLUSTER_STATE_JSON.dump(state)
    assert doc == {
        "generation": 3,
        "brokers": [BrokerEndpoint(0, "h0", 9092, 9644).to_json(), kafka.to_json()],
        "topics": [],
    }
    gone = DeletedIncarnation("default/t", "uid-1", 2, 3)
    with_deleted = ClusterState(3, deleted={"uid-1": gone})
    assert CLUSTER_STATE_JSON.dump(with_deleted)["deleted"] == [
        {
            "topic": "default/t",
            "creationId": "uid-1",
            "partitions": 2,
            "deletedGeneration": 3,
            "broker": None,
        }
    ]
    assert CLUSTER_STATE_JSON.load(CLUSTER_STATE_JSON.dump(with_deleted)) == with_deleted


def test_a_key_listed_twice_reads_as_its_last_entry() -> None:
    doc = TRANSITION_JSON.dump(marker())
    doc["cutoverOffsets"] = [{"partition": 0, "offset": 1}, {"partition": 0, "offset": 2}]
    assert TRANSITION_JSON.load(doc).cutover_offsets == {0: 2}


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["request"], KeyError, "transition: missing field 'request'"),
        (["fromPartitions"], True, "field 'fromPartitions' must be an integer"),
        (["cutoverMs"], "1000", "field 'cutoverMs' must be int"),
        (["cutoverOffsets"], {"0": 7}, "field 'cutoverOffsets' must be list"),
        (["cutoverOffsets"], [7], "field 'cutoverOffsets' must be a list of objects"),
        (["cutoverOffsets", 0, "offset"], KeyError, "cutoverOffsets.0: missing field 'offset'"),
        (["cutoverOffsets", 0, "partition"], "0", "field 'cutoverOffsets.0.partition' must be"),
        (["released", 0, "partitions"], ["2"], "'released.0.partitions' must be a list of int"),
        (["released", 0, "cohort"], 3, "field 'released.0.cohort' must be str"),
        (["existingPartitions"], 2.5, "field 'existingPartitions' must be int"),
    ],
)
def test_a_malformed_transition_is_refused_naming_the_field(
    path: list[str | int], value: object, words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words):
        TRANSITION_JSON.load(broken(TRANSITION_JSON.dump(marker()), path, value))


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["topics", 0, "name"], KeyError, "cluster state: topics.0: missing field 'name'"),
        (["topics", 0, "transition"], [], "field 'topics.0.transition' must be an object"),
        (["topics", 0, "transition", "toVersion"], KeyError, "missing field 'toVersion'"),
        (["topics", 0, "history"], {"transitions": 1}, "partitioning history"),
        (["topics", 0, "creationId"], 5, "field 'topics.0.creationId' must be str"),
        (["topics", 0, "cohortPlans", 0, "cohort"], KeyError, "missing field 'cohort'"),
        (["deleted", 0, "creationId"], KeyError, "deleted.0: missing field 'creationId'"),
        (["brokers", 0], "h0:9092", "broker: expected an object"),
        (["topics"], None, None),  # null: no topics
    ],
)
def test_a_malformed_cluster_state_is_refused_naming_the_field(
    path: list[str | int], value: object, words: str | None
) -> None:
    state = ClusterState(
        3,
        {0: BrokerEndpoint(0, "h0", 9092, 9644)},
        {
            "default/t": TopicStatus(
                "default/t",
                2,
                (),
                {"a": CohortPlan("a", 1)},
                marker(),
                history=PartitioningHistory((PastTransition(1, 2, 2),)),
                creation_id="uid-1",
            )
        },
        {"uid-0": DeletedIncarnation("default/t", "uid-0", 2, 2)},
    )
    doc = broken(CLUSTER_STATE_JSON.dump(state), path, value)
    if words is None:
        assert CLUSTER_STATE_JSON.load(doc).topics == {}
        return
    with pytest.raises(InvalidRequest, match=words):
        CLUSTER_STATE_JSON.load(doc)


def test_a_cluster_state_must_say_its_generation() -> None:
    with pytest.raises(InvalidRequest, match="cluster state: missing field 'generation'"):
        CLUSTER_STATE_JSON.load({"brokers": [], "topics": []})
    with pytest.raises(InvalidRequest, match="cluster state: expected an object"):
        CLUSTER_STATE_JSON.load([])


# --------------------------------------------------------------------------- any state

ids = st.integers(0, 6)
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
partition_statuses = st.builds(
    PartitionStatus,
    partition=st.just(0),
    replicas=st.lists(ids, min_size=1, max_size=3, unique=True).map(tuple),
    leader=st.none() | ids,
    leader_epoch=st.integers(0, 10**6),
    live_replicas=st.lists(ids, max_size=3, unique=True).map(tuple),
    state=st.sampled_from(sorted(ELECTION_STATES)),
    start_offset=st.none() | st.integers(0, 2**53),
    target=st.lists(ids, max_size=3, unique=True).map(tuple),
    target_generation=st.integers(0, 9),
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
def test_any_cluster_state_round_trips(state: ClusterState) -> None:
    doc = json.loads(json.dumps(CLUSTER_STATE_JSON.dump(state)))
    assert CLUSTER_STATE_JSON.load(doc) == state
