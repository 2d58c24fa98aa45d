"""Admission: what a Topic asks for that the cluster cannot honour, one line each."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.control import admission, election
from headrace.control.model import TopicStatus


def topic(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"clusterRef": {"name": "local"}, "partitions": 3, "replicas": 3}
    return {"metadata": {"name": "orders", "namespace": "default"}, "spec": {**base, **spec}}


def placed(partitions: int, replicas: int) -> TopicStatus:
    lists = [tuple((p + r) % 3 for r in range(replicas)) for p in range(partitions)]
    return TopicStatus(
        "default/orders", 1, tuple(election.first_status(i, r) for i, r in enumerate(lists)), {}
    )


@pytest.mark.parametrize(
    ("spec", "existing", "reasons"),
    [
        ({}, None, []),
        ({}, placed(3, 3), []),
        ({"clusterRef": {"name": "main"}}, None, ["UnknownCluster"]),
        ({"replicas": 4, "minInSync": 1}, None, ["NotEnoughBrokers"]),
        ({"partitions": 6}, placed(3, 3), []),  # an edit of the count is a repartition
        ({"partitions": 6}, None, []),  # not placed yet: the count is still free
        ({"replicas": 2}, placed(3, 3), ["ReplicasChange"]),
        ({"cleanupPolicy": "compact"}, None, ["CompactionUnsupported"]),
        (
            {"clusterRef": {"name": "main"}, "replicas": 5, "minInSync": 1},
            placed(3, 3),
            ["UnknownCluster", "NotEnoughBrokers", "ReplicasChange"],
        ),
    ],
)
def test_topic_problems(
    spec: dict[str, Any], existing: TopicStatus | None, reasons: list[str]
) -> None:
    problems = admission.topic_problems(
        topic(**spec), cluster_name="local", brokers=3, existing=existing
    )
    assert [p.reason for p in problems] == reasons
    for p in problems:
        assert "\n" not in p.line() and p.line().startswith("topic default/orders: ")


def test_the_lines_name_what_was_asked_and_what_the_cluster_has() -> None:
    lines = [
        p.line()
        for p in admission.topic_problems(
            topic(clusterRef={"name": "main"}, replicas=5, minInSync=1),
            cluster_name="local",
            brokers=3,
            existing=None,
        )
    ]
    assert lines == [
        "topic default/orders: clusterRef 'main' is not this cluster: it is named 'local'",
        "topic default/orders: 5 replicas need 5 brokers, the cluster has 3",
    ]


def _repartition(partitions: int, topic: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Repartition",
        "metadata": {"name": "grow", "namespace": "default"},
        "spec": {"topicRef": {"name": topic}, "partitions": partitions},
    }


@pytest.mark.parametrize(
    ("partitions", "topic", "unloading", "reasons"),
    [
        (6, "orders", False, []),
        (3, "orders", False, ["SamePartitionCount"]),
        (6, "missing", False, ["UnknownTopic"]),
        (6, "orders", True, ["TopicUnloading"]),
    ],
)
def test_repartition_problems(
    partitions: int, topic: str, unloading: bool, reasons: list[str]
) -> None:
    problems = admission.repartition_problems(
        _repartition(partitions, topic),
        topics={"default/orders": {}},
        existing={"default/orders": placed(3, 3)},
        unloading={"default/orders"} if unloading else set(),
    )
    assert [p.reason for p in problems] == reasons
    assert all(p.line().startswith("repartition default/grow: ") for p in problems)
