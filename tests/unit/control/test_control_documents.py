"""``documents.restore``: when the persisted documents are one whole commit, and when not;
and the cluster document, the commit record, as a BrokerCluster status."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.control import documents
from headrace.control.liveness import Liveness
from headrace.control.model import (
    ClusterState,
    PartitionState,
    PartitionStatus,
    TopicStatus,
)
from headrace.errors import InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress, ListenerAddress
from headrace.resources.clusters import BrokerClusterStatus

NOW = "2026-01-02T03:04:05Z"


def state(generation: int, *names: str) -> ClusterState:
    topics = {
        n: TopicStatus(
            n, 1, (PartitionStatus(0, (0,), 0, generation, (0,), PartitionState.ONLINE),)
        )
        for n in names
    }
    return ClusterState(generation, {0: BrokerEndpoint(0, "h", 9092, 9644)}, topics)


def statuses(s: ClusterState, *names: str) -> dict[str, dict[str, Any]]:
    return {n: documents.topic_status(s, n, None, None, NOW, 1) for n in names}


def test_a_whole_commit_restores_exactly() -> None:
    s = state(7, "ns/a", "ns/b")
    restored = documents.restore(documents.cluster_status(s), statuses(s, "ns/a", "ns/b"))
    assert restored == documents.Restored(s, torn=False, highest=7)


def test_statuses_older_than_the_commit_are_part_of_it() -> None:
    old, new = state(5, "ns/a", "ns/b"), state(7, "ns/a", "ns/b")
    docs = {**statuses(old, "ns/a"), **statuses(new, "ns/b")}
    assert not documents.restore(documents.cluster_status(new), docs).torn


def test_a_status_newer_than_the_commit_is_torn() -> None:
    old, new = state(7, "ns/a", "ns/b"), state(8, "ns/a", "ns/b")
    docs = {**statuses(new, "ns/a"), **statuses(old, "ns/b")}
    restored = documents.restore(documents.cluster_status(old), docs)
    assert restored.torn and restored.highest == 8
    assert restored.state.generation == 7


@pytest.mark.parametrize(
    ("committed", "present"),
    [(("ns/a", "ns/b"), ("ns/a",)), (("ns/a",), ("ns/a", "ns/b"))],
    ids=["a committed topic is gone", "a topic is not committed"],
)
def test_a_topic_set_other_than_the_committed_one_is_torn(
    committed: tuple[str, ...], present: tuple[str, ...]
) -> None:
    s = state(7, *present)
    cluster = {**documents.cluster_status(s), "topics": list(committed)}
    assert documents.restore(cluster, statuses(s, *present)).torn


def test_unplaced_topics_hold_no_state() -> None:
    s = state(3)
    pending = statuses(s, "ns/new")
    assert "partitions" not in pending["ns/new"]
    restored = documents.restore(documents.cluster_status(s), pending)
    assert not restored.torn and restored.state.topics == {}


def test_documents_without_a_commit_record_or_a_stamp_are_not_trusted() -> None:
    s = state(4, "ns/a")
    docs = statuses(s, "ns/a")
    assert documents.restore(None, docs).torn
    legacy = {k: v for k, v in documents.cluster_status(s).items() if k != "topics"}
    assert documents.restore(legacy, docs).torn
    unstamped = {"ns/a": {k: v for k, v in docs["ns/a"].items() if k != "topologyGeneration"}}
    assert documents.restore(documents.cluster_status(s), unstamped).torn
    assert not documents.restore(None, {}).torn


# --------------------------------------------------------------------------- the cluster document


def liveness(live: set[int], draining: frozenset[int] = frozenset()) -> Liveness:
    return Liveness(frozenset(live), frozenset(), frozenset(), draining)


def test_the_cluster_document_is_a_broker_cluster_status() -> None:
    brokers = {
        0: BrokerEndpoint(0, "h", 9092, 9644),
        1: BrokerEndpoint(1, "::1", 9093, 9645, KafkaAddress("k1", 19093)),
        2: BrokerEndpoint(2, "10.0.0.2", admin_port=9644),  # no client port told
        3: BrokerEndpoint(3, "h3", 9092, 9644, listeners=(ListenerAddress("ext", "n3", 31003),)),
    }
    s = ClusterState(7, brokers, state(7, "ns/a").topics)
    doc = documents.cluster_status(s, liveness({0, 1}, frozenset({1})))
    assert doc == {
        "topologyGeneration": 7,
        "topics": ["ns/a"],
        "brokers": [
            {"id": 0, "address": "h:9092", "live": True, "draining": False}
            | {"host": "h", "port": 9092, "adminPort": 9644},
            {"id": 1, "address": "[::1]:9093", "live": True, "draining": True}
            | {"host": "::1", "port": 9093, "adminPort": 9645}
            | {"kafkaHost": "k1", "kafkaPort": 19093},
            {"id": 2, "address": "10.0.0.2", "live": False, "draining": False}
            | {"host": "10.0.0.2", "adminPort": 9644},
            {"id": 3, "address": "h3:9092", "live": False, "draining": False}
            | {"host": "h3", "port": 9092, "adminPort": 9644}
            | {"listeners": [{"name": "ext", "host": "n3", "port": 31003}]},
        ],
    }
    assert (
        BrokerClusterStatus.model_validate(doc).model_dump(
            mode="json", exclude_none=True, exclude={"conditions"}
        )
        == doc
    )
    restored = documents.restore(doc, statuses(s, "ns/a"))
    assert restored == documents.Restored(s, torn=False, highest=7)


def test_liveness_is_refreshed_without_touching_the_record() -> None:
    s = state(7, "ns/a")
    doc = documents.cluster_status(s, liveness({0}))
    refreshed = documents.with_liveness(doc, liveness(set()))
    assert refreshed["brokers"][0]["live"] is False
    assert {**refreshed, "brokers": doc["brokers"]} == doc
    assert documents.restore(refreshed, statuses(s, "ns/a")) == documents.restore(
        doc, statuses(s, "ns/a")
    )


@pytest.mark.parametrize(
    "doc",
    [
        {"generation": 3, "brokers": [], "topics": []},  # the shape before the BrokerCluster's
        {"topologyGeneration": 3, "brokers": [{"id": 0, "address": "h:1", "live": True}]},
        {"topologyGeneration": 3, "brokers": [{"id": 0, "host": "h", "port": -1}]},
    ],
    ids=["not a status", "no host", "not the schema's"],
)
def test_a_cluster_document_the_schema_refuses_is_not_read(doc: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="cluster document"):
        documents.restore(doc, {})
