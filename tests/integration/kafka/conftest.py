from __future__ import annotations

from pathlib import Path

import pytest

from headrace.testing.procs import BrokerProcess, free_port
from tests.integration.kafka import peer_tools

HERE = Path(__file__).parent


def pytest_collection_finish(session: pytest.Session) -> None:
    # Kafka's jars, the franz-go program, kcat and Spark's Kafka connector: fetched or built
    # once per machine
    peer_tools.build_before_tests_in(
        {
            HERE / "test_kafka_peers.py": ("java", "franzgo", "kcat"),
            HERE / "test_kafka_spark.py": ("spark",),
        },
        session,
    )


class KafkaBroker:
    """A standalone broker with its Kafka listener on."""

    def __init__(self, broker: BrokerProcess, kafka_port: int) -> None:
        self.broker = broker
        self.kafka_port = kafka_port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"


@pytest.fixture
def kafka(broker_factory: object) -> KafkaBroker:
    port = free_port()
    broker = broker_factory(extra_args=["--kafka-port", str(port)])  # type: ignore[operator]
    return KafkaBroker(broker, port)
