"""Idempotent Kafka producers: InitProducerId, then sequences checked per partition, so a
retried batch is stored once and a gap is refused, with real clients and by hand."""

from __future__ import annotations

import asyncio
import socket
import struct

from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import KafkaError, KafkaException, Producer

from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.testing.reading import create_topic, read_partition
from tests.integration.kafka.conftest import KafkaBroker

TOPIC = "payments"


def call(port: int, key: km.ApiKey, version: int, body: object) -> object:
    api = km.SUPPORTED[key]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(km.encode_request(api, version, 1, "t", body))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    _, answer = km.decode_response(api, version, frame)
    return answer


def batch(producer_id: int, sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, 0, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce(port: int, records: bytes) -> km.PartitionProduceResponse:
    request = km.ProduceRequest(
        None,
        -1,
        5000,
        [km.TopicProduceData(TOPIC, [km.PartitionProduceData(0, memoryview(records))])],
    )
    answer = call(port, km.ApiKey.PRODUCE, 7, request)
    assert isinstance(answer, km.ProduceResponse)
    return answer.responses[0].partition_responses[0]


async def test_a_retried_batch_is_stored_once_and_a_gap_is_refused(kafka: KafkaBroker) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 1)
    port = kafka.kafka_port
    init = call(port, km.ApiKey.INIT_PRODUCER_ID, 4, km.InitProducerIdRequest(None, 60_000))
    assert isinstance(init, km.InitProducerIdResponse)
    assert init.error_code == ErrorCode.NONE and init.producer_id > 0 and init.producer_epoch == 0
    pid = init.producer_id

    first = batch(pid, 0, [b"a", b"b"])
    assert (produce(port, first).error_code, produce(port, first).base_offset) == (0, 0)
    second = produce(port, batch(pid, 2, [b"c"]))
    assert (second.error_code, second.base_offset) == (0, 2)
    retried = produce(port, first)  # its answer was lost, say: the same offset, stored once
    assert (retried.error_code, retried.base_offset) == (0, 0)
    gap = produce(port, batch(pid, 9, [b"z"]))
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    stranger = produce(port, batch(pid + 2, 5, [b"y"]))  # an id we know nothing of
    assert stranger.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    records = await read_partition(kafka.broker.bootstrap, TOPIC, 0)
    assert [r.value for r in records] == [b"a", b"b", b"c"]

    transactional = call(
        port, km.ApiKey.INIT_PRODUCER_ID, 4, km.InitProducerIdRequest("tx-1", 60_000)
    )
    assert isinstance(transactional, km.InitProducerIdResponse)
    assert transactional.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def test_aiokafka_and_librdkafka_produce_with_idempotence_on(kafka: KafkaBroker) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(TOPIC, b"aio-%d" % i, partition=0) for i in range(300)]
        offsets = [(await fut).offset for fut in sent]
    finally:
        await producer.stop()
    assert offsets == list(range(300))

    def librdkafka() -> list[int]:
        rd = Producer(
            {"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        acked: list[int] = []

        def delivered(err: object, msg: object) -> None:
            assert err is None, err
            acked.append(msg.offset())  # type: ignore[attr-defined]

        for i in range(300):
            rd.produce(TOPIC, value=b"rd-%d" % i, partition=0, on_delivery=delivered)
        assert rd.flush(30) == 0
        return acked

    assert sorted(await asyncio.to_thread(librdkafka)) == list(range(300, 600))
    records = await read_partition(kafka.broker.bootstrap, TOPIC, 0)
    assert [r.value for r in records] == [b"aio-%d" % i for i in range(300)] + [
        b"rd-%d" % i for i in range(300)
    ]


async def test_offset_for_leader_epoch_names_where_an_epoch_ends(kafka: KafkaBroker) -> None:
    """What a consumer asks after a leader change (KIP-320): the current epoch ends at the
    log end; an epoch from the future is unknown; a stale current epoch is fenced."""
    await create_topic(kafka.broker.bootstrap, TOPIC, 1)
    assert produce(kafka.kafka_port, batch(-1, -1, [b"a", b"b", b"c"])).error_code == 0

    def ask(leader_epoch: int, current: int = -1) -> km.EpochEndOffset:
        request = km.OffsetForLeaderEpochRequest(
            -1,
            [
                km.OffsetForLeaderTopic(
                    TOPIC, [km.OffsetForLeaderPartition(0, current, leader_epoch)]
                )
            ],
        )
        answer = call(kafka.kafka_port, km.ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, request)
        assert isinstance(answer, km.OffsetForLeaderEpochResponse)
        return answer.topics[0].partitions[0]

    assert ask(0) == km.EpochEndOffset(ErrorCode.NONE, 0, 0, 3)
    assert ask(0, current=0) == km.EpochEndOffset(ErrorCode.NONE, 0, 0, 3)
    assert ask(7) == km.EpochEndOffset(ErrorCode.NONE, 0, -1, -1)
    assert ask(0, current=5).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_a_transactional_producer_is_refused_with_a_fatal_error_not_left_retrying(
    kafka: KafkaBroker,
) -> None:
    """Transactions are not served. A transactional producer first looks up its
    transaction coordinator; a retriable answer there (COORDINATOR_NOT_AVAILABLE) kept
    franz-go asking until its caller gave up, so the answer is one clients treat as
    fatal, as from Kafka when the id may not be used."""
    found = call(
        kafka.kafka_port,
        km.ApiKey.FIND_COORDINATOR,
        2,
        km.FindCoordinatorRequest("tx-1", 1),
    )
    assert isinstance(found, km.FindCoordinatorResponse)
    assert found.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert found.error_message == "transactions are not supported"

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "tx-1"})
    try:
        producer.init_transactions(60)
    except KafkaException as exc:
        error = exc.args[0]
    else:
        raise AssertionError("init_transactions succeeded")
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal(), error
