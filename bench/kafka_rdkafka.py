"""``python -m bench.kafka_rdkafka produce|consume``: librdkafka (confluent-kafka) as the
client of ``bench.kafka_peers``, in its own process so that its CPU is the client's.

``produce`` sends ``--records`` records of ``--record-size`` bytes with acks=all and
idempotence, librdkafka's defaults otherwise (linger 5 ms), and waits for every
acknowledgement. The first ``--warmup-records`` are sent and acknowledged before the clock
starts. Latency (send to acknowledgement) is sampled on every 64th record: a callback per
record would make this Python process the bound even more than it is.

``consume`` reads ``--records`` records in a new group from the earliest offset. Its rate is
over the whole read, from the subscribe: librdkafka fetches ahead while the group forms. The
group join (subscribe to the first record) is also reported.

Each prints one JSON line: what ``bench.kafka_peers`` puts in its row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

SAMPLE_EVERY = 64


def produce(
    bootstrap: str, topic: str, records: int, warmup: int, record_bytes: int
) -> dict[str, Any]:
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
            "log_level": 0,
        }
    )
    value = b"x" * record_bytes
    failed: list[str] = []
    latencies: list[float] = []

    def sampled(sent_at: float) -> Any:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                latencies.append(time.perf_counter() - sent_at)

        return delivered

    def failures_only(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(str(err))

    def send(count: int, measured: bool) -> None:
        for i in range(count):
            callback = (
                sampled(time.perf_counter())
                if measured and i % SAMPLE_EVERY == 0
                else failures_only
            )
            while True:
                try:
                    producer.produce(topic, value, on_delivery=callback)
                    break
                except BufferError:
                    producer.poll(0.01)
            if i % 1000 == 0:
                producer.poll(0)
        if producer.flush(120) != 0:
            raise RuntimeError("records still unacknowledged after 120 s")

    send(warmup, measured=False)
    started = time.perf_counter()
    send(records - warmup, measured=True)
    elapsed = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{len(failed)} records failed, the first: {failed[0]}")
    measured = records - warmup
    latencies.sort()

    def percentile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)

    return {
        "measured_records": measured,
        "records_per_s": round(measured / elapsed, 1),
        "mb_per_s": round(measured * record_bytes / elapsed / 2**20, 2),
        "latency_ms": {
            "avg": round(sum(latencies) / len(latencies) * 1000, 1),
            "max": round(latencies[-1] * 1000, 1),
            "p50": percentile(0.50),
            "p95": percentile(0.95),
            "p99": percentile(0.99),
            "p99_9": percentile(0.999),
        },
    }


def consume(bootstrap: str, topic: str, records: int, record_bytes: int) -> dict[str, Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-rdkafka-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    joined = time.perf_counter()
    consumer.subscribe([topic])
    seen = 0
    first_at: float | None = None
    deadline = time.monotonic() + 120
    try:
        while seen < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {seen} of {records} records in 120 s")
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"consume: {message.error()}")
            if batch and first_at is None:
                first_at = time.perf_counter()
            seen += len(batch)
        ended = time.perf_counter()
    finally:
        consumer.close()
    assert first_at is not None
    # From the subscribe, join included: librdkafka prefetches up to 64 MiB while the group
    # forms, so a clock started at the first record would time little more than this
    # process draining its queue.
    total_s = ended - joined
    return {
        "records": seen,
        "records_per_s": round(seen / total_s, 1),
        "mb_per_s": round(seen * record_bytes / total_s / 2**20, 2),
        "group_join_ms": int((first_at - joined) * 1000),
        "fetch_ms": int((ended - first_at) * 1000),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_rdkafka", description=__doc__)
    parser.add_argument("mode", choices=("produce", "consume"))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--warmup-records", type=int, default=0)
    parser.add_argument("--record-size", type=int, required=True)
    args = parser.parse_args(argv)
    if args.mode == "produce":
        found = produce(
            args.bootstrap, args.topic, args.records, args.warmup_records, args.record_size
        )
    else:
        found = consume(args.bootstrap, args.topic, args.records, args.record_size)
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
