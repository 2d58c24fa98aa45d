"""Real Kafka clients (aiokafka, and librdkafka through confluent-kafka) against the
Kafka listener of a standalone broker: metadata, produce with acks=all, consume
with assigned partitions, list offsets, and bad input that changes nothing."""

from __future__ import annotations

import asyncio
import socket
import struct

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from headrace.checksums import crc32c
from headrace.client import Producer as HeadraceProducer
from headrace.client.consumer import Consumer as HeadraceConsumer
from headrace.kafka import messages as km
from headrace.kafka.wire import Reader
from headrace.records.batch import Record
from headrace.testing.reading import create_topic, read_partition
from tests.integration.kafka.conftest import KafkaBroker

TOPIC = "orders"


async def _aiokafka_roundtrip(
    kafka: KafkaBroker, count: int
) -> list[tuple[int, bytes | None, bytes | None]]:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=False
    )
    await producer.start()
    try:
        sent = [
            await producer.send_and_wait(TOPIC, b"v%d" % i, key=b"k%d" % i, partition=1)
            for i in range(count)
        ]
    finally:
        await producer.stop()
    assert [m.offset for m in sent] == list(range(count))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 1)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[tuple[int, bytes | None, bytes | None]] = []
        async with asyncio.timeout(30):
            while len(got) < count:
                for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    got.extend((r.offset, r.key, r.value) for r in records)
        assert await consumer.beginning_offsets([tp]) == {tp: 0}
        assert await consumer.end_offsets([tp]) == {tp: count}
        return got
    finally:
        await consumer.stop()


async def test_aiokafka_produces_and_consumes(kafka: KafkaBroker) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 3)
    got = await _aiokafka_roundtrip(kafka, 20)
    assert got == [(i, b"k%d" % i, b"v%d" % i) for i in range(20)]


def test_confluent_kafka_metadata_produce_consume_and_offsets(kafka: KafkaBroker) -> None:
    asyncio.run(create_topic(kafka.broker.bootstrap, TOPIC, 3))
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 5,
        }
    )
    metadata = producer.list_topics(timeout=10)
    topic = metadata.topics[TOPIC]
    assert topic.error is None and sorted(topic.partitions) == [0, 1, 2]
    assert topic.partitions[0].leader == 0 and topic.partitions[0].isrs == [0]
    assert [(b.id, b.port) for b in metadata.brokers.values()] == [(0, kafka.kafka_port)]
    reports: list[tuple[int, int]] = []

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        reports.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    for i in range(50):
        producer.produce(
            TOPIC,
            value=b"c%d" % i,
            key=b"k",
            partition=i % 3,
            timestamp=1_700_000_000_000 + i,
            on_delivery=delivered,
        )
    assert producer.flush(30) == 0
    assert sorted(reports) == sorted((p, o) for p in range(3) for o in range(len(range(p, 50, 3))))

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([CTopicPartition(TOPIC, 2, 0)])
        values = []
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is None:
                if len(values) == 16:
                    break
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        assert values == [b"c%d" % i for i in range(2, 50, 3)]
        low, high = consumer.get_watermark_offsets(CTopicPartition(TOPIC, 0), timeout=10)
        assert (low, high) == (0, 17)
        # by timestamp: batch granularity, so the offset of the batch holding the record
        found = consumer.offsets_for_times(
            [CTopicPartition(TOPIC, 0, 1_700_000_000_000)], timeout=10
        )
        assert found[0].offset == 0
        later = consumer.offsets_for_times(
            [CTopicPartition(TOPIC, 0, 1_800_000_000_000)], timeout=10
        )
        assert later[0].offset == -1  # no record at or after it
    finally:
        consumer.close()


def _request(port: int, frame: bytes) -> bytes:
    """One raw request on its own connection; the response frame without its size."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the broker closed the connection instead of answering"
        out += chunk
    return out


def _batch(n: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(n):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"x%d" % i, headers=[])
    return bytes(builder.build())


def _produce(port: int, records: bytes) -> int:
    api = km.SUPPORTED[km.ApiKey.PRODUCE]
    request = km.ProduceRequest(
        None,
        -1,
        5000,
        [km.TopicProduceData(TOPIC, [km.PartitionProduceData(0, memoryview(records))])],
    )
    _, body = km.decode_response(
        api, 7, _request(port, km.encode_request(api, 7, 11, "t", request))
    )
    return int(body.responses[0].partition_responses[0].error_code)


async def test_bad_input_gets_error_answers_and_changes_nothing(kafka: KafkaBroker) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 3)
    port = kafka.kafka_port
    assert _produce(port, _batch(3)) == 0
    good = _batch(2)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    assert _produce(port, bytes(bad_crc)) == 2  # CORRUPT_MESSAGE
    assert _produce(port, good[:-3]) == 2
    # records that do not parse, under a CRC-32C computed over them: refused, never stored
    garbled = bytearray(good + b"\x00")  # a stray byte after the last record
    struct.pack_into(">ii", garbled, 8, len(garbled) - 12, 0)
    struct.pack_into(">I", garbled, 17, crc32c(bytes(garbled[21:])))
    assert _produce(port, bytes(garbled)) == 2
    # an unknown API and an unserved version: UNSUPPORTED_VERSION, as header v0 and a code
    for key, version in ((9999, 0), (int(km.ApiKey.PRODUCE), 2)):
        frame = struct.pack(">hhih", key, version, 77, -1)
        answer = _request(port, struct.pack(">i", len(frame)) + frame)
        assert answer == struct.pack(">ih", 77, 35)
    # a body that does not parse: INVALID_REQUEST
    frame = struct.pack(">hhih", int(km.ApiKey.METADATA), 1, 78, -1) + b"\x00\x00"
    assert _request(port, struct.pack(">i", len(frame)) + frame) == struct.pack(">ih", 78, 42)
    # ApiVersions in a version from the future: v0 with the error and our table (KIP-511)
    frame = struct.pack(">hhih", int(km.ApiKey.API_VERSIONS), 99, 79, -1)
    answer = _request(port, struct.pack(">i", len(frame)) + frame)
    r = Reader(answer)
    assert r.int32() == 79
    assert r.int16() == 35
    # the broker is up, and partition 0 holds exactly the three good records
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = (await consumer.getmany(tp, timeout_ms=5000))[tp]
        assert [r.value for r in records] == [b"x0", b"x1", b"x2"]
        assert await consumer.end_offsets([tp]) == {tp: 3}
    finally:
        await consumer.stop()


async def test_records_produced_through_kafka_are_readable_by_native_consumers(
    kafka: KafkaBroker,
) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 3)
    assert _produce(kafka.kafka_port, _batch(3)) == 0
    records = await read_partition(kafka.broker.bootstrap, TOPIC, 0)
    assert [r.value for r in records] == [b"x0", b"x1", b"x2"]


async def test_both_clients_batches_with_headers_and_null_keys_and_values_are_stored(
    kafka: KafkaBroker,
) -> None:
    """What librdkafka and aiokafka encode passes the broker's record check, headers and
    tombstones included, and our consumers read it back."""
    await create_topic(kafka.broker.bootstrap, TOPIC, 3)
    headers = [("trace", b"t1"), ("h\u00e9", b"")]
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all", "linger.ms": 20})
    failures: list[object] = []
    for i in range(30):
        producer.produce(
            TOPIC,
            value=None if i % 10 == 9 else b"r%d" % i,
            key=None if i % 2 else b"k%d" % i,
            partition=0,
            headers=headers if i % 3 == 0 else None,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert failures == []
    aio = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=20)
    await aio.start()
    try:
        sent = [
            aio.send(TOPIC, b"a%d" % i, key=None, partition=1, headers=headers) for i in range(30)
        ]
        await asyncio.gather(*[await fut for fut in sent])
    finally:
        await aio.stop()
    by_rdkafka = await read_partition(kafka.broker.bootstrap, TOPIC, 0)
    assert [r.value for r in by_rdkafka] == [b"" if i % 10 == 9 else b"r%d" % i for i in range(30)]
    assert [r.key for r in by_rdkafka][:2] == [b"k0", None]
    assert by_rdkafka[0].headers == tuple(headers) and by_rdkafka[1].headers == ()
    by_aiokafka = await read_partition(kafka.broker.bootstrap, TOPIC, 1)
    assert [(r.value, r.headers) for r in by_aiokafka] == [
        (b"a%d" % i, tuple(headers)) for i in range(30)
    ]


async def test_records_produced_natively_are_readable_by_kafka_consumers(
    kafka: KafkaBroker,
) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, 3)
    producer = await HeadraceProducer(kafka.broker.bootstrap).start()
    try:
        await (await producer.send(TOPIC, b"native", partition=0))
        await producer.flush()
    finally:
        await producer.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = (await consumer.getmany(tp, timeout_ms=5000))[tp]
        assert [r.value for r in records] == [b"native"]
    finally:
        await consumer.stop()


async def test_answers_keep_request_order_behind_a_long_poll_and_acks_0_gets_none(
    kafka: KafkaBroker,
) -> None:
    """Kafka clients pair answers with requests by order: an ApiVersions sent behind a
    parked fetch is answered after it; an acks=0 produce is answered never, yet stored."""
    await create_topic(kafka.broker.bootstrap, TOPIC, 1)
    fetch = km.SUPPORTED[km.ApiKey.FETCH]
    versions = km.SUPPORTED[km.ApiKey.API_VERSIONS]
    produce = km.SUPPORTED[km.ApiKey.PRODUCE]
    parked = km.FetchRequest(
        max_wait_ms=1000,
        min_bytes=1,
        topics=[
            km.FetchTopic(
                TOPIC,
                partitions=[km.FetchPartition(0, fetch_offset=0, partition_max_bytes=1 << 20)],
            )
        ],
    )
    fire_and_forget = km.ProduceRequest(
        None,
        0,
        5000,
        [km.TopicProduceData(TOPIC, [km.PartitionProduceData(0, memoryview(_batch(2)))])],
    )
    with socket.create_connection(("127.0.0.1", kafka.kafka_port), timeout=10) as sock:
        sock.sendall(
            km.encode_request(fetch, 11, 1, "t", parked)
            + km.encode_request(versions, 3, 2, "t", km.ApiVersionsRequest("t", "1"))
            + km.encode_request(produce, 8, 3, "t", fire_and_forget)
            + km.encode_request(versions, 0, 4, "t", km.ApiVersionsRequest())
        )
        answers = []
        for _ in range(3):
            size = struct.unpack(">i", _read_exactly(sock, 4))[0]
            answers.append(_read_exactly(sock, size))
    assert [struct.unpack_from(">i", a)[0] for a in answers] == [1, 2, 4]
    _, fetched = km.decode_response(fetch, 11, answers[0])
    assert fetched.responses[0].partitions[0].error_code == 0
    end = await _end_offset(kafka)
    assert end == 2


async def _end_offset(kafka: KafkaBroker) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def test_one_log_written_by_both_protocols_reads_whole_through_each(
    kafka: KafkaBroker,
) -> None:
    """Our producer (zstd, then zlib) and librdkafka (lz4) take turns on one partition, with
    keys and headers. librdkafka then reads every record through the Kafka listener (ours
    converted, its own as sent), and a cohort of ours reads them all through our API."""
    await create_topic(kafka.broker.bootstrap, TOPIC, 1)
    expected: list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]] = []

    async def ours(codec: str, start: int) -> None:
        producer = await HeadraceProducer(kafka.broker.bootstrap, compression=codec).start()
        try:
            for i in range(start, start + 300):
                headers = (("n", b"%d" % i),) if i % 2 else ()
                expected.append((b"k%d" % (i % 7), b"native-%d" % i, headers))
                await producer.send(TOPIC, b"native-%d" % i, key=b"k%d" % (i % 7), headers=headers)
            await producer.flush()
        finally:
            await producer.close()

    def theirs(start: int) -> None:
        producer = Producer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "compression.type": "lz4",
                "linger.ms": 20,
            }
        )
        for i in range(start, start + 300):
            headers = (("n", b"%d" % i),) if i % 2 else ()
            expected.append((b"k%d" % (i % 7), b"kafka-%d" % i, headers))
            producer.produce(
                TOPIC,
                value=b"kafka-%d" % i,
                key=b"k%d" % (i % 7),
                partition=0,
                headers=list(headers),
            )
        assert producer.flush(30) == 0

    await ours("zstd", 0)
    await asyncio.to_thread(theirs, 300)
    await ours("zlib", 600)

    def read_through_kafka() -> list[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]]:
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
            }
        )
        got = []
        try:
            consumer.assign([CTopicPartition(TOPIC, 0, 0)])
            while len(got) < 900:
                msg = consumer.poll(10)
                assert msg is not None, f"librdkafka stopped after {len(got)} records"
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ())))
        finally:
            consumer.close()
        return got

    through_kafka = await asyncio.to_thread(read_through_kafka)
    assert [o for o, *_ in through_kafka] == list(range(900))
    assert [(k, v, h) for _, k, v, h in through_kafka] == expected

    cohort = HeadraceConsumer(kafka.broker.bootstrap, TOPIC, "mixed", start="earliest")
    await cohort.start()
    records: list[Record] = []
    try:
        async with asyncio.timeout(30):
            while len(records) < 900:
                for batch in await cohort.getmany(timeout_s=1.0):
                    records.extend(batch.records())
                    cohort.ack_batch(batch)
    finally:
        await cohort.close()
    assert [r.offset for r in records] == list(range(900))
    assert [(r.key, r.value, r.headers) for r in records] == expected
