"""Spark's own Kafka source and sink (spark-sql-kafka-0-10, from Maven Central, passed with
``spark.jars``) against the Kafka listener of a standalone broker: a batch
``spark.read.format("kafka")`` of records our own producer wrote, ``df.write.format("kafka")``
read back by a native reader, and a ``readStream`` that resumes from its checkpoint.

One Spark driver for the module, in a process of its own (``spark_driver.py`` says why).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from headrace.client import Producer as HeadraceProducer
from headrace.testing.procs import BrokerProcess, free_port
from headrace.testing.reading import create_topic, read_partition
from tests.integration.kafka import peer_tools
from tests.integration.kafka.conftest import KafkaBroker
from tests.integration.kafka.spark_driver import RESULT_PREFIX

DRIVER = Path(__file__).resolve().parent / "spark_driver.py"
#: a Spark command's longest wait: a JVM's first job on a loaded two-core machine is slow
COMMAND_TIMEOUT_S = 300.0

#: (partition, offset, key, value), as Spark's Kafka source reports each record
Row = tuple[int, int, bytes | None, bytes]


class SparkDriver:
    """``spark_driver.py`` running in its own process: one command at a time."""

    def __init__(self, jars_dir: str, log: Path) -> None:
        self._log_path = log
        self._log = log.open("wb")
        self._proc = subprocess.Popen(
            [sys.executable, str(DRIVER), jars_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            # the driver binds to loopback, not to whatever the host name resolves to
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read_answers, daemon=True).start()
        # Spark's version, once it is up: the first command waits for it, so that the JVM
        # starts while the test starts its broker
        self.version: str | None = None

    def _read_answers(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(RESULT_PREFIX):
                self._answers.put(json.loads(line[len(RESULT_PREFIX) :]))
        self._answers.put(None)  # the driver exited

    def _answer(self) -> dict[str, Any]:
        try:
            answer = self._answers.get(timeout=COMMAND_TIMEOUT_S)
        except queue.Empty:
            answer = {"error": f"no answer in {COMMAND_TIMEOUT_S:.0f} s"}
        if answer is None:
            answer = {"error": f"the driver exited ({self._proc.poll()})"}
        if "error" in answer:
            log = self._log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"Spark: {answer['error']}\ndriver log:\n{log}")
        return answer

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None
        if self.version is None:
            self.version = self._answer()["ready"]
        self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        if self._proc.poll() is None and self._proc.stdin is not None:
            self._proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkDriver]:
    jars = peer_tools.require("spark")["spark_kafka_jars"]
    driver = SparkDriver(jars, tmp_path_factory.mktemp("spark-driver") / "driver.log")
    yield driver
    driver.stop()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One standalone broker for the module (each test has its own topic)."""
    port = free_port()
    broker = BrokerProcess(
        tmp_path_factory.mktemp("broker") / "data", extra_args=["--kafka-port", str(port)]
    )
    broker.start()
    yield KafkaBroker(broker, port)
    broker.kill9()


def _rows(answer: dict[str, Any]) -> list[Row]:
    return [
        (partition, offset, None if key is None else bytes.fromhex(key), bytes.fromhex(value))
        for partition, offset, key, value in answer["rows"]
    ]


def _hex(data: bytes) -> str:
    return data.hex()


async def test_batch_read_sees_every_record_our_producer_wrote_once(
    kafka: KafkaBroker, spark: SparkDriver
) -> None:
    await create_topic(kafka.broker.bootstrap, "spark-in", 3)
    producer = await HeadraceProducer(kafka.broker.bootstrap).start()
    try:
        receipts = [
            await producer.send("spark-in", b"v%d" % i, key=b"k%d" % (i % 7)) for i in range(60)
        ]
        await producer.flush()
        sent = [await r for r in receipts]
    finally:
        await producer.close()
    produced = sorted(
        (m.partition, m.offset, b"k%d" % (i % 7), b"v%d" % i) for i, m in enumerate(sent)
    )
    assert len({m.partition for m in sent}) > 1  # keys spread over partitions

    got = _rows(spark.call("read", bootstrap=kafka.bootstrap, topic="spark-in"))

    assert sorted(got) == produced


async def test_batch_write_lands_every_row_once_for_our_reader(
    kafka: KafkaBroker, spark: SparkDriver
) -> None:
    await create_topic(kafka.broker.bootstrap, "spark-out", 3)
    rows = [(b"k%d" % (i % 5), b"w%d" % i) for i in range(50)]

    written = spark.call(
        "write",
        bootstrap=kafka.bootstrap,
        topic="spark-out",
        rows=[[_hex(k), _hex(v)] for k, v in rows],
    )

    assert written == {"written": len(rows)}
    read = [
        (partition, r.key, r.value)
        for partition in range(3)
        for r in await read_partition(kafka.broker.bootstrap, "spark-out", partition)
    ]
    assert Counter((key, value) for _, key, value in read) == Counter(rows)
    # Kafka's default partitioner keeps each key in one partition
    partitions_of: dict[bytes | None, set[int]] = {}
    for partition, key, _ in read:
        partitions_of.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in partitions_of.values())


def _produce(kafka: KafkaBroker, topic: str, values: range) -> list[Row]:
    """confluent-kafka, idempotent: the (partition, offset, key, value) of each record."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    delivered: list[Row] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    for i in values:
        producer.produce(topic, b"s%d" % i, key=b"k%d" % (i % 4), on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert len(delivered) == len(values)
    return delivered


async def test_stream_reads_what_was_produced_and_resumes_from_its_checkpoint(
    kafka: KafkaBroker, spark: SparkDriver, tmp_path: Path
) -> None:
    await create_topic(kafka.broker.bootstrap, "spark-stream", 2)
    query = {
        "bootstrap": kafka.bootstrap,
        "topic": "spark-stream",
        "checkpoint": str(tmp_path / "checkpoint"),
        "out": str(tmp_path / "out"),
    }
    first = _produce(kafka, "spark-stream", range(40))

    run = spark.call("stream", **query)

    assert run["input_rows"] == len(first)
    assert sorted(_rows(run)) == sorted(first)

    second = _produce(kafka, "spark-stream", range(40, 70))
    run = spark.call("stream", **query)

    # the second run starts where the checkpoint says: only the new records
    assert run["input_rows"] == len(second)
    assert sorted(_rows(run)) == sorted(first + second)
