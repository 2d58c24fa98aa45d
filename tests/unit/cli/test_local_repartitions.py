"""``headrace local status`` lines of repartitions: transitions in flight, then Repartitions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from headrace.cli.local_status import status_lines, transition_lines
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    TRANSITION_JSON,
    ClusterState,
    PartitionState,
    PartitionStatus,
    TopicStatus,
    Transition,
)
from headrace.protocol.endpoints import BrokerEndpoint


def test_a_transition_in_flight_and_the_repartitions_read_as_lines() -> None:
    marker = Transition("default/grow", 4, 8, 1, 2, 1_000, 30_000, 12, {0: 7}, {"billing": (0, 4)})
    topics = {
        "default/orders": TopicStatus("default/orders", 2, (), transition=marker),
        "default/calm": TopicStatus("default/calm", 1, ()),
    }
    grow = {
        "metadata": {"name": "grow", "namespace": "default"},
        "spec": {"topicRef": {"name": "orders"}, "partitions": 8},
        "status": {
            "phase": "Draining",
            "conditions": [{"type": "Ready", "message": "4 -> 8 partitions"}],
        },
    }
    old = {
        "metadata": {"name": "old", "namespace": "default"},
        "spec": {"topicRef": {"name": "orders"}, "partitions": 4},
        "status": {"phase": "Finalized", "finalizedBy": "AdoptionTimedOut"},
    }
    assert transition_lines(topics, [grow, old]) == [
        "transition default/orders  4 -> 8 partitions  version 1 -> 2  Draining  adoption"
        " generation 12  cutover offsets 1/4  released billing 2/8  (default/grow)",
        "repartition default/grow  topic orders  -> 8  Draining  4 -> 8 partitions",
        "repartition default/old  topic orders  -> 4  Finalized  by AdoptionTimedOut",
    ]


def test_status_lines_read_topics_and_transitions_from_the_controllers_state() -> None:
    moved = PartitionStatus(
        1, (0, 1, 2), 0, 3, (0, 1), PartitionState.ONLINE, seal=True, moves=2, start_offset=40
    )
    moved = replace(moved, target=(1, 2))
    marker = Transition("default/grow", 2, 4, 1, 2, 1_000, 30_000, 12, {0: 7}, {"billing": (0, 2)})
    topic = TopicStatus(
        "default/orders",
        2,
        (PartitionStatus(0, (1,), None, 1, (1,), PartitionState.OFFLINE), moved),
        transition=marker,
    )
    state = ClusterState(9, {0: BrokerEndpoint(0, "h0", 9092, 9644)}, {topic.name: topic})
    doc = {
        "cluster": CLUSTER_STATE_JSON.dump(state),
        "live": [0],
        "adoptionFloor": 8,
        "problems": [],
        "reassignment": {},
        "members": None,
        "unloads": [],
        "repartitions": [],
        # what the controller also sends, read by older CLIs
        "transitions": [{"topic": topic.name, "phase": "Draining", **TRANSITION_JSON.dump(marker)}],
    }
    assert status_lines(doc, Path("/nonexistent")) == [
        "generation 9  live brokers [0]  adoption floor 8",
        "topic default/orders  version 2",
        "    0  leader None  epoch 1  replicas [1]  lrs [1]  Offline",
        "    1  leader 0  epoch 3  replicas [0, 1, 2]  lrs [0, 1]  Online  moves 2 from 40  SEALED"
        "  MOVING to [1, 2]",
        "transition default/orders  2 -> 4 partitions  version 1 -> 2  Draining  adoption"
        " generation 12  cutover offsets 1/2  released billing 2/4  (default/grow)",
    ]
