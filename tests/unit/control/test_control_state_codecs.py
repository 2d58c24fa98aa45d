"""The generated codecs of the persisted state: ``Transition``, ``TopicStatus``, ``ClusterState``.

The document shapes are pinned here field for field: they are what every controller
already persisted (CR status, ``state.json``), so a change of shape is a migration.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings

from headrace.control.codecs import Codec
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    TOPIC_STATUS_JSON,
    TRANSITION_JSON,
    ClusterState,
    CohortPlan,
    DeletedIncarnation,
    TopicStatus,
    Transition,
)
from headrace.errors import InvalidRequest
from headrace.protocol.coordination import PartitioningHistory, PastTransition
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


def full_state() -> ClusterState:
    """A state with one of everything a document may hold."""
    return ClusterState(
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


#: a document of each codec, by the name its errors give it
DOCUMENTS: dict[str, tuple[Codec[Any], Any]] = {
    "transition": (TRANSITION_JSON, marker()),
    "cluster state": (CLUSTER_STATE_JSON, full_state()),
}


@pytest.mark.parametrize(
    ("document", "path", "value", "words"),
    [
        ("transition", ["request"], KeyError, "missing field 'request'"),
        ("transition", ["fromPartitions"], True, "field 'fromPartitions' must be an integer"),
        ("transition", ["cutoverMs"], "1000", "field 'cutoverMs' must be int"),
        ("transition", ["cutoverOffsets"], {"0": 7}, "field 'cutoverOffsets' must be list"),
        ("transition", ["cutoverOffsets"], [7], "'cutoverOffsets' must be a list of objects"),
        ("transition", ["cutoverOffsets", 0, "offset"], KeyError, "0: missing field 'offset'"),
        ("transition", ["cutoverOffsets", 0, "partition"], "0", "'cutoverOffsets.0.partition'"),
        ("transition", ["released", 0, "partitions"], ["2"], "must be a list of integers"),
        ("transition", ["released", 0, "cohort"], 3, "field 'released.0.cohort' must be str"),
        ("transition", ["existingPartitions"], 2.5, "field 'existingPartitions' must be int"),
        ("cluster state", ["topics", 0, "name"], KeyError, "topics.0: missing field 'name'"),
        ("cluster state", ["topics", 0, "transition"], [], "'topics.0.transition' must be an obj"),
        ("cluster state", ["topics", 0, "transition", "toVersion"], KeyError, "'toVersion'"),
        ("cluster state", ["topics", 0, "history"], {"transitions": 1}, "partitioning history"),
        ("cluster state", ["topics", 0, "creationId"], 5, "'topics.0.creationId' must be str"),
        ("cluster state", ["topics", 0, "cohortPlans", 0, "cohort"], KeyError, "field 'cohort'"),
        ("cluster state", ["deleted", 0, "creationId"], KeyError, "field 'creationId'"),
        ("cluster state", ["brokers", 0], "h0:9092", "broker: expected an object"),
    ],
)
def test_a_malformed_document_is_refused_naming_the_field(
    document: str, path: list[str | int], value: object, words: str
) -> None:
    codec, good = DOCUMENTS[document]
    with pytest.raises(InvalidRequest, match=f"^{document}: .*{words}"):
        codec.load(broken(codec.dump(good), path, value))


def test_a_null_list_map_reads_as_empty() -> None:
    doc = {**CLUSTER_STATE_JSON.dump(full_state()), "topics": None, "deleted": None}
    assert CLUSTER_STATE_JSON.load(doc) == ClusterState(3, full_state().brokers)


def test_a_cluster_state_must_say_its_generation() -> None:
    with pytest.raises(InvalidRequest, match="cluster state: missing field 'generation'"):
        CLUSTER_STATE_JSON.load({"brokers": [], "topics": []})
    with pytest.raises(InvalidRequest, match="cluster state: expected an object"):
        CLUSTER_STATE_JSON.load([])
