"""The pushed topology document: camelCase on the wire, typed both ways, bad shapes refused.

(The heartbeat's documents are tested with the control core's model, which reads them.)
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from headrace.errors import InvalidRequest
from headrace.protocol.coordination import (
    ClusterTopology,
    Heartbeat,
    IncarnationRemoval,
    PartitionPlacement,
    TopicPlacement,
    TopologyReply,
    TransitionPlacement,
)
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress, ListenerAddress
from tests.unit.json_edits import broken

_SNAKE = re.compile(r"[a-z0-9]_[a-z]")


def topology() -> ClusterTopology:
    return ClusterTopology(
        7,
        "prod",
        [BrokerEndpoint(0, "h0", 9092, 9644), BrokerEndpoint(1, "h1", 9092, 9645)],
        [
            TopicPlacement(
                "default/orders",
                2,
                3,
                2,
                {"retention_ms": 1000, "upload_interval_ms": 5000, "tiered": True},
                [
                    PartitionPlacement(0, [0, 1], 0, 4, [0, 1]),
                    PartitionPlacement(
                        1, [1, 0], None, 2, [1], seal=True, moves=1, start_offset=None
                    ),
                ],
                {"billing": {"m1": [0], "m2": [1]}},
            )
        ],
    )


def _keys(doc: Any, skip: frozenset[str] = frozenset({"cohortPlans"})) -> set[str]:
    """Every key of the document's own fields (cohort plans are keyed by names, not fields)."""
    if isinstance(doc, list):
        return set().union(*(_keys(d, skip) for d in doc)) if doc else set()
    if not isinstance(doc, dict):
        return set()
    out = set(doc)
    for key, value in doc.items():
        if key not in skip:
            out |= _keys(value, skip)
    return out


def test_topology_document_shape_and_round_trip() -> None:
    doc = topology().to_json()
    assert doc["clusterId"] == "prod"
    assert doc["brokers"][0] == {"id": 0, "host": "h0", "port": 9092, "adminPort": 9644}
    (t,) = doc["topics"]
    assert (t["partitioningVersion"], t["minInSync"]) == (3, 2)
    assert t["config"] == {"retentionMs": 1000, "uploadIntervalMs": 5000, "tiered": True}
    assert t["assignments"][1] == {
        "partition": 1,
        "replicas": [1, 0],
        "leader": None,
        "epoch": 2,
        "lrs": [1],
        "seal": True,
        "moves": 1,
        "startOffset": None,
    }
    assert t["cohortPlans"] == {"billing": {"m1": [0], "m2": [1]}}
    assert not [k for k in _keys(doc) if _SNAKE.search(k)], "one key style: camelCase"
    parsed = ClusterTopology.from_json(json.loads(json.dumps(doc)))
    assert parsed == topology()
    assert parsed.topics[0].config["upload_interval_ms"] == 5000, "the broker's setting names"
    assert parsed.broker(1) == BrokerEndpoint(1, "h1", 9092, 9645) and parsed.broker(5) is None


def test_heartbeat_keys_are_camel_case() -> None:
    doc = Heartbeat(BrokerEndpoint(0, "h", 1, 2), generation=3, connections=4).to_json()
    assert not [k for k in _keys(doc) if _SNAKE.search(k)]
    assert Heartbeat.from_json(doc, received_ms=9) == Heartbeat(
        BrokerEndpoint(0, "h", 1, 2), 9, generation=3, connections=4
    )


def test_a_heartbeat_carries_its_brokers_rack_and_an_older_one_none() -> None:
    doc = Heartbeat(BrokerEndpoint(0, "h", 1, 2), rack="eu-1a").to_json()
    assert doc["rack"] == "eu-1a"
    assert Heartbeat.from_json(doc, received_ms=1).rack == "eu-1a"
    del doc["rack"]  # a broker of an older release
    assert Heartbeat.from_json(doc, received_ms=1).rack is None


def test_a_heartbeat_carries_its_store_and_removals_and_an_older_one_neither() -> None:
    beat = Heartbeat(BrokerEndpoint(0, "h", 1, 2), object_store=True, removed_incarnations=("u1",))
    doc = json.loads(json.dumps(beat.to_json()))
    assert (doc["objectStore"], doc["removedIncarnations"]) == (True, ["u1"])
    assert Heartbeat.from_json(doc, received_ms=0) == beat
    del doc["objectStore"], doc["removedIncarnations"]  # a broker of an older release
    older = Heartbeat.from_json(doc, received_ms=0)
    assert (older.object_store, older.removed_incarnations) == (None, ())
    with pytest.raises(InvalidRequest, match="removedIncarnations"):
        Heartbeat.from_json({**doc, "removedIncarnations": [1]}, received_ms=0)


def test_topology_removals_survive_the_wire_and_are_left_out_when_there_are_none() -> None:
    pushed = ClusterTopology(3, "c", [], removals=[IncarnationRemoval("a/b", "u1", 2, 1)])
    doc = json.loads(json.dumps(pushed.to_json()))
    assert doc["removals"] == [{"topic": "a/b", "creationId": "u1", "partitions": 2, "broker": 1}]
    assert ClusterTopology.from_json(doc) == pushed
    assert "removals" not in ClusterTopology(3, "c", []).to_json()
    with pytest.raises(InvalidRequest, match="creationId"):
        ClusterTopology.from_json({**doc, "removals": [{**doc["removals"][0], "creationId": ""}]})


def test_topology_optional_fields_default() -> None:
    doc = {
        "generation": 1,
        "brokers": [],
        "topics": [
            {
                "name": "a/b",
                "partitions": 1,
                "partitioningVersion": 1,
                "assignments": [{"partition": 0, "replicas": [0, 1], "leader": 0, "epoch": 1}],
            }
        ],
    }
    parsed = ClusterTopology.from_json(doc)
    assert parsed.cluster_id == "local"
    (t,) = parsed.topics
    assert (t.min_in_sync, t.config, t.cohort_plans) == (1, {}, {})
    assert (t.active_partitions, t.routing_partitions) == (0, 1)
    (a,) = t.assignments
    assert (a.lrs, a.seal, a.moves, a.start_offset) == ([0, 1], False, 0, 0)
    assert ClusterTopology.from_json({"generation": 0, "brokers": []}).topics == []


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["generation"], KeyError, "missing field 'generation'"),
        (["generation"], "7", "must be int"),
        (["brokers"], KeyError, "missing field 'brokers'"),
        (["brokers", 0, "adminPort"], KeyError, "missing field 'adminPort'"),
        (["topics"], [1], "list of objects"),
        (["topics", 0, "partitioningVersion"], KeyError, "partitioningVersion"),
        (["topics", 0, "config"], [], "must be dict"),
        (["topics", 0, "assignments", 0, "replicas"], [0, "1"], "list of integers"),
        (["topics", 0, "assignments", 0, "seal"], "yes", "must be bool"),
        (["topics", 0, "assignments", 0, "startOffset"], 1.5, "must be int"),
        (["topics", 0, "cohortPlans", "billing"], ["m1"], "expected an object"),
        (["topics", 0, "cohortPlans", "billing", "m1"], [True], "list of integers"),
    ],
)
def test_bad_topologies_are_rejected(path: list[str | int], value: object, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        ClusterTopology.from_json(broken(topology().to_json(), path, value))


def test_retired_partitions_lower_the_routing_count_and_survive_json() -> None:
    placement = TopicPlacement("a/b", 4, 2, 1, {}, [], active_partitions=2)
    doc = json.loads(json.dumps(placement.to_json()))
    assert doc["activePartitions"] == 2
    assert TopicPlacement.from_json(doc) == placement
    assert placement.routing_partitions == 2
    # A transition in flight routes by its target count, whatever is retired.
    moving = replace(placement, transition=TransitionPlacement(2, 3, 3))
    assert moving.routing_partitions == 3


def test_the_creation_id_survives_json_and_is_left_out_when_there_is_none() -> None:
    placement = TopicPlacement("a/b", 1, 1, 1, {}, [], creation_id="uid-1")
    doc = json.loads(json.dumps(placement.to_json()))
    assert doc["creationId"] == "uid-1"
    assert TopicPlacement.from_json(doc) == placement
    legacy = replace(placement, creation_id="")
    assert "creationId" not in legacy.to_json()
    assert TopicPlacement.from_json(legacy.to_json()).creation_id == ""


def test_topology_reply_round_trip() -> None:
    for reply in (TopologyReply(True, 7), TopologyReply(False, None)):
        assert TopologyReply.from_json(json.loads(json.dumps(reply.to_json()))) == reply
    with pytest.raises(InvalidRequest, match="applied"):
        TopologyReply.from_json({"generation": 1})


def test_a_heartbeat_carries_its_kafka_listener_and_one_without_says_none() -> None:
    endpoint = BrokerEndpoint(0, "h", 1, 2, KafkaAddress("k.example", 9093))
    doc = Heartbeat(endpoint).to_json()
    assert doc["broker"]["kafka"] == {"host": "k.example", "port": 9093}
    assert Heartbeat.from_json(doc, received_ms=1).broker == endpoint
    del doc["broker"]["kafka"]  # no listener, or a broker of an older release
    assert Heartbeat.from_json(doc, received_ms=1).broker.kafka is None
    assert "kafka" not in BrokerEndpoint(0, "h", 1, 2).to_json()


def test_the_topology_carries_the_brokers_kafka_listeners() -> None:
    with_kafka = BrokerEndpoint(1, "h1", 9092, 9645, KafkaAddress("h1", 9093))
    pushed = replace(topology(), brokers=[BrokerEndpoint(0, "h0", 9092, 9644), with_kafka])
    parsed = ClusterTopology.from_json(json.loads(json.dumps(pushed.to_json())))
    assert parsed.broker(1) == with_kafka
    assert parsed.broker(0) is not None and parsed.broker(0).kafka is None  # type: ignore[union-attr]
    # the client snapshot's endpoints are the data port's only
    assert all(b.kafka is None for b in parsed.client_snapshot().brokers)


@pytest.mark.parametrize("kafka", [{"host": "h"}, {"port": 1}, {"host": 1, "port": 1}, "h:1"])
def test_a_malformed_kafka_address_is_refused(kafka: object) -> None:
    doc = BrokerEndpoint(0, "h", 1, 2).to_json()
    doc["kafka"] = kafka
    with pytest.raises(InvalidRequest, match="kafka"):
        BrokerEndpoint.from_json(doc)


def test_the_client_snapshot_names_each_broker_on_the_listener_asked_for() -> None:
    outside = ListenerAddress("external", "n0.example", 31000)
    named = BrokerEndpoint(0, "h0", 9092, 9644, listeners=(outside,))
    older = BrokerEndpoint(1, "h1", 9092, 9645)  # a broker from before listeners
    pushed = replace(topology(), brokers=[named, older])
    parsed = ClusterTopology.from_json(json.loads(json.dumps(pushed.to_json())))
    assert parsed.broker(0) == named
    external = parsed.client_snapshot("external").brokers
    assert external == [BrokerEndpoint(0, "n0.example", 31000), BrokerEndpoint(1, "h1", 9092)]
    assert parsed.client_snapshot().brokers == [
        BrokerEndpoint(0, "h0", 9092),
        BrokerEndpoint(1, "h1", 9092),
    ]


def test_an_endpoint_without_named_listeners_is_what_it_was_before_them() -> None:
    doc = BrokerEndpoint(0, "h", 1, 2).to_json()
    assert doc == {"id": 0, "host": "h", "port": 1, "adminPort": 2}
    with_one = BrokerEndpoint(0, "h", 1, 2, listeners=(ListenerAddress("x", "n", 3),))
    assert with_one.to_json()["listeners"] == [{"name": "x", "host": "n", "port": 3}]
    assert Heartbeat.from_json(Heartbeat(with_one).to_json(), received_ms=1).broker == with_one


@pytest.mark.parametrize(
    "listeners", [{"name": "x"}, [{"name": "x", "host": "h"}], [{"host": "h", "port": 1}], ["x"]]
)
def test_a_malformed_listener_is_refused(listeners: object) -> None:
    doc = BrokerEndpoint(0, "h", 1, 2).to_json()
    doc["listeners"] = listeners
    with pytest.raises(InvalidRequest, match="listeners"):
        BrokerEndpoint.from_json(doc)
