"""A member holding a partition while retention deletes the records at its delivery position.

A real standalone broker with small segments, byte retention and a 100 ms
retention check. The member's credit is small and the application takes
nothing for a while, so the broker's delivery position stays near the start
while retention deletes segment after segment past it. Once the application
reads again, delivery must go on from the new log start, as it would for a
fresh member, and the skipped records must be counted in
``headrace_cohort_skipped_records_total``.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.testing import waiting
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic

TOPIC = "default/shrinking"
COHORT = "laggards"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data", extra_args=["--retention-check-interval-ms", "100"])
    b.start()
    try:
        yield b
    finally:
        b.kill9()


def log_start(b: BrokerProcess) -> int:
    doc = b.get_json(f"/v1/topics/{TOPIC}")
    return int(doc["partition_details"][0]["log_start_offset"])  # type: ignore[index]


def skipped_metric(b: BrokerProcess) -> float:
    with urllib.request.urlopen(f"{b.admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    pattern = (
        r'^headrace_cohort_skipped_records_total\{(?=[^}]*cohort="laggards")'
        r'(?=[^}]*partition="0")(?=[^}]*topic="default/shrinking")[^}]*\} (\S+)$'
    )
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def produce(b: BrokerProcess, first: int, count: int) -> None:
    async with Producer(b.bootstrap, acks="leader", linger_ms=1) as producer:
        for i in range(first, first + count, 50):
            await producer.send_many(
                TOPIC, [b"r%07d" % n * 10 for n in range(i, min(i + 50, first + count))]
            )
            await producer.flush()  # small batches: segments roll every few of them


async def test_a_holder_behind_retention_moves_on_to_the_log_start_and_counts_the_skip(
    broker: BrokerProcess,
) -> None:
    config = {"segment_bytes": 16_384, "retention_bytes": 65_536, "retention_ms": -1}
    await create_topic(broker.bootstrap, TOPIC, 1, config)
    async with Consumer(
        broker.bootstrap, TOPIC, COHORT, start="earliest", credit_bytes=8_192
    ) as consumer:
        await produce(broker, 0, 500)
        # The credit is spent on the first records; the application takes none of them, so
        # the broker's delivery position stays there while retention deletes past it.
        await produce(broker, 500, 4_500)
        waiting.until(lambda: log_start(broker) > 1_000, 20, "retention past the member")
        last = 4_999
        offsets: list[int] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not offsets or offsets[-1] < last:
            assert loop.time() < deadline, (
                f"the member stalled at offset {offsets[-1] if offsets else None};"
                f" log start {log_start(broker)}"
            )
            for batch in await consumer.getmany(timeout_s=0.5):
                offsets.extend(batch.offsets())
                consumer.ack_batch(batch)
    gaps = [(a, b) for a, b in itertools.pairwise(offsets) if b != a + 1]
    assert len(gaps) == 1, f"expected one skip over the deleted records, got {gaps}"
    (before, after) = gaps[0]
    assert after >= 1_000, "delivery went on from the new log start"
    assert offsets[-1] == last
    assert skipped_metric(broker) == after - before - 1
