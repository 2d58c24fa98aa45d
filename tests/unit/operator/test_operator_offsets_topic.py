"""A BrokerCluster with ``spec.kafka`` gets the Topic of Kafka groups' committed offsets:
created by the workload handler when none of that name exists, owned by the cluster,
and never written again (a user's own Topic of that name, or an edit of the operator's,
stays as it is). The handler as kopf calls it, over the operator's ``ClientApi`` and
kmock's API emulator (``server``)."""

from __future__ import annotations

import copy
from typing import Any

import kmock
from kube_server import ApiServer
from operator_fakes import CLUSTER

from headrace.operator import handlers
from headrace.operator.kube import ClientApi
from headrace.resources import Topic
from headrace.resources.clusters import OFFSETS_TOPIC_PARTITIONS
from tests.unit.controller.controller_fakes import ManualClock


def with_kafka(kafka: dict[str, Any] | None = None, replicas: int = 3) -> dict[str, Any]:
    body = copy.deepcopy(CLUSTER)
    body["spec"]["replicas"] = replicas
    if kafka is not None:
        body["spec"]["kafka"] = kafka
    return body


def stored_topic(server: ApiServer, name: str) -> dict[str, Any] | None:
    try:
        found = server.objects["headrace.dev/v1alpha1/topics", "ns", name]
    except KeyError:
        return None
    return None if found.deleted else copy.deepcopy(dict(found.raw))


def topic_posts(server: ApiServer) -> list[kmock.Request]:
    return [r for r in server["post"] if r.resource == "headrace.dev/v1alpha1/topics"]


async def apply(server: ApiServer, api: ClientApi, body: dict[str, Any]) -> list[str]:
    """The workload handler of a freshly started operator (its own context)."""
    server.put(body)
    context = handlers.OperatorContext(api=api, clock=ManualClock())
    return await handlers.apply_workload(body, context)


async def test_a_cluster_with_kafka_gets_its_offsets_topic_owned_by_it(
    server: ApiServer, api: ClientApi
) -> None:
    applied = await apply(server, api, with_kafka({}))

    assert "Topic/kafka.group-offsets" in applied
    stored = stored_topic(server, "kafka.group-offsets")
    assert stored is not None
    topic = Topic.from_manifest({k: v for k, v in stored.items() if k != "status"})
    assert topic.spec.cluster_ref.name == "demo"
    assert topic.spec.partitions == OFFSETS_TOPIC_PARTITIONS
    assert (topic.spec.replicas, topic.spec.min_in_sync) == (3, 2)
    assert (topic.spec.retention.ms, topic.spec.retention.bytes) == (-1, -1)
    [owner] = stored["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "demo", "uid-1")
    # what GitOps tools track their own objects by is not copied onto it
    assert "app.kubernetes.io/instance" not in stored["metadata"]["labels"]


async def test_its_name_and_replicas_follow_the_cluster(server: ApiServer, api: ClientApi) -> None:
    await apply(server, api, with_kafka({"offsetsTopic": "groups"}, replicas=1))

    assert stored_topic(server, "kafka.group-offsets") is None
    stored = stored_topic(server, "groups")
    assert stored is not None
    assert (stored["spec"]["replicas"], stored["spec"]["minInSync"]) == (1, 1)


async def test_an_existing_topic_of_that_name_is_never_written(
    server: ApiServer, api: ClientApi
) -> None:
    users = {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "kafka.group-offsets", "namespace": "ns"},
        "spec": {"clusterRef": {"name": "demo"}, "partitions": 6, "replicas": 3},
    }
    server.put(users)
    before = stored_topic(server, "kafka.group-offsets")

    applied = await apply(server, api, with_kafka({}))
    await apply(server, api, with_kafka({}))  # again, as after an operator restart

    assert "Topic/kafka.group-offsets" not in applied
    assert stored_topic(server, "kafka.group-offsets") == before, "not adopted, not changed"
    patches = [r for r in server["patch"] if r.resource == "headrace.dev/v1alpha1/topics"]
    assert patches == []


async def test_a_restarted_operator_creates_it_again_once_and_only_if_missing(
    server: ApiServer, api: ClientApi
) -> None:
    await apply(server, api, with_kafka({}))
    first = stored_topic(server, "kafka.group-offsets")
    applied = await apply(server, api, with_kafka({}))
    assert "Topic/kafka.group-offsets" not in applied
    assert stored_topic(server, "kafka.group-offsets") == first

    del server.objects["headrace.dev/v1alpha1/topics", "ns", "kafka.group-offsets"]
    applied = await apply(server, api, with_kafka({}))
    assert "Topic/kafka.group-offsets" in applied
    assert stored_topic(server, "kafka.group-offsets") is not None
    assert len(topic_posts(server)) == 3


async def test_without_kafka_there_is_no_offsets_topic(server: ApiServer, api: ClientApi) -> None:
    await apply(server, api, with_kafka(None))
    assert topic_posts(server) == []
