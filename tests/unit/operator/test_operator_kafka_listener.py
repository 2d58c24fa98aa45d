"""A BrokerCluster's opt-in Kafka listener: the brokers get the flags, the pods and the
headless Service the port; without ``spec.kafka`` nothing changes."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest
from operator_fakes import CLUSTER

from headrace.operator import workloads
from headrace.resources.clusters import BrokerCluster

SETTINGS = workloads.WorkloadSettings()


def cluster(kafka: dict[str, Any] | None) -> BrokerCluster:
    manifest = copy.deepcopy(CLUSTER)
    if kafka is not None:
        manifest["spec"]["kafka"] = kafka
    return BrokerCluster.from_manifest(manifest)


def container(c: BrokerCluster) -> dict[str, Any]:
    sts = workloads.statefulset(c, "uid-1", "ns", SETTINGS)
    found: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return found


def headless(c: BrokerCluster) -> dict[str, Any]:
    return next(
        m
        for m in workloads.manifests(c, "uid-1", "ns", SETTINGS)
        if m["kind"] == "Service" and m["spec"].get("clusterIP") == "None"
    )


def test_a_cluster_with_kafka_gets_the_listener_flags_and_the_port() -> None:
    c = cluster({"port": 19093})
    args = container(c)["args"]
    assert args[args.index("--kafka-port") + 1] == "19093"
    namespace = c.metadata.namespace
    assert args[args.index("--kafka-offsets-topic") + 1] == f"{namespace}/kafka.group-offsets"
    assert {"name": "kafka", "containerPort": 19093} in container(c)["ports"]
    assert {"name": "kafka", "port": 19093, "targetPort": "kafka"} in headless(c)["spec"]["ports"]


def test_an_empty_kafka_section_takes_the_default_port() -> None:
    args = container(cluster({}))["args"]
    assert args[args.index("--kafka-port") + 1] == "9093"


def test_without_kafka_there_is_no_listener() -> None:
    c = cluster(None)
    assert "--kafka-port" not in container(c)["args"]
    assert all(p["name"] != "kafka" for p in headless(c)["spec"]["ports"])


@pytest.mark.parametrize("kafka", [{"port": 0}, {"offsetsTopic": "Bad/Name"}])
def test_a_bad_kafka_section_is_refused(kafka: dict[str, Any]) -> None:
    with pytest.raises((pydantic.ValidationError, ValueError)):
        cluster(kafka)
