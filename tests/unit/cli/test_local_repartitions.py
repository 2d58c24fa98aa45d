"""``headrace local status`` lines of repartitions: transitions in flight, then Repartitions."""

from __future__ import annotations

from headrace.cli.local_status import transition_lines


def test_a_transition_in_flight_and_the_repartitions_read_as_lines() -> None:
    marker = {
        "topic": "default/orders",
        "phase": "Draining",
        "request": "default/grow",
        "fromPartitions": 4,
        "toPartitions": 8,
        "fromVersion": 1,
        "toVersion": 2,
        "adoptionGeneration": 12,
        "cutoverOffsets": [{"partition": 0, "offset": 7}],
        "released": [{"cohort": "billing", "partitions": [0, 4]}],
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
    assert transition_lines([marker], [grow, old]) == [
        "transition default/orders  4 -> 8 partitions  version 1 -> 2  Draining  adoption"
        " generation 12  cutover offsets 1/4  released billing 2/8  (default/grow)",
        "repartition default/grow  topic orders  -> 8  Draining  4 -> 8 partitions",
        "repartition default/old  topic orders  -> 4  Finalized  by AdoptionTimedOut",
    ]
