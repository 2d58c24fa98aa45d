"""The edge where kopf's bodies become typed values (``headrace.operator.bodies``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from operator_fakes import CLUSTER, topic

from headrace.errors import HeadraceError
from headrace.operator import bodies
from headrace.resources.topics import DeletionPolicy, Topic


def test_a_body_parses_into_its_model_and_its_metadata() -> None:
    body = topic()
    body["metadata"].update(
        uid="u-1",
        generation=4,
        resourceVersion="17",
        finalizers=["headrace.dev/topic-data"],
        deletionTimestamp="2026-11-24T10:00:00Z",
        ownerReferences=[{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u-0"}],
    )
    parsed = bodies.parse_topic(body)
    assert parsed.problem is None
    assert parsed.model().spec.cluster_ref.name == "demo"
    assert parsed.model().spec.deletion_policy is DeletionPolicy.RETAIN
    meta = parsed.meta
    assert (meta.full_name, meta.uid, meta.generation, meta.resource_version) == (
        "ns/orders",
        "u-1",
        4,
        "17",
    )
    assert meta.deleting and meta.finalizers == ("headrace.dev/topic-data",)
    assert meta.owner_references[0].uid == "u-0"
    assert parsed.ref.kind == "Topic" and parsed.ref.name == "orders"


def test_metadata_the_api_server_left_out_gets_its_defaults() -> None:
    meta = bodies.meta_of({"metadata": {"name": "a"}})
    assert (meta.namespace, meta.generation, meta.deleting, meta.finalizers) == (
        "default",
        1,
        False,
        (),
    )


def test_a_spec_the_model_refuses_is_a_problem_never_an_exception() -> None:
    body = copy.deepcopy(CLUSTER)
    body["spec"]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    parsed = bodies.parse_cluster(body)
    assert parsed.resource is None
    assert parsed.problem is not None and "cpu" in parsed.problem
    assert parsed.meta.name == "demo"  # still addressable: its status can say why
    with pytest.raises(bodies.InvalidBody) as refused:
        parsed.model()
    assert isinstance(refused.value, HeadraceError)
    assert "BrokerCluster ns/demo" in str(refused.value)


def test_a_stored_status_is_typed_and_one_that_does_not_parse_is_said() -> None:
    partition = {"partition": 0, "replicas": [0, 1], "targetReplicas": [2]}
    parsed = bodies.parse_topic({**topic(), "status": {"partitions": [partition]}})
    status = parsed.model().status
    assert status is not None and status.partitions[0].target_replicas == [2]
    odd = bodies.parse_topic({**topic(), "status": {"partitions": "many"}})
    assert odd.status_problem is not None and odd.model().status is None


def test_a_topic_names_its_cluster_even_when_its_spec_does_not_parse() -> None:
    body = topic()
    body["spec"]["partitions"] = "three"
    assert bodies.parse_topic(body).resource is None
    assert bodies.topic_cluster(body) == "demo"


def test_the_cache_parses_each_snapshot_once_and_a_new_one_again() -> None:
    calls: list[str] = []

    def parse(body: Mapping[str, Any]) -> bodies.Parsed[Topic]:
        calls.append("parse")
        return bodies.parse_topic(body)

    cache = bodies.ParseCache(parse)
    first = {**topic(), "metadata": {**topic()["metadata"], "resourceVersion": "1"}}
    assert cache(first) is cache(first)
    second = copy.deepcopy(first)
    second["metadata"]["resourceVersion"] = "2"
    cache(second)
    assert len(calls) == 2
    cache.keep(set())
    cache(second)
    assert len(calls) == 3
