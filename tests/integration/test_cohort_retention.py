"""A member holding a partition while retention deletes the records at its delivery position.

A real standalone broker with small segments, byte retention and a 100 ms
retention check. The member's credit is small and the application takes
nothing for a while, so the broker's delivery position stays near the start
while retention deletes segment after segment past it. Once the application
reads again, delivery must go on from the new log start, as it would for a
fresh member, and the skipped records must be counted in
``headrace_cohort_skipped_records_total``. The same for a ``BlockingConsumer`` and a
``headrace consume`` process kept open behind retention.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.blocking import BlockingConsumer
from headrace.testing import procs, waiting
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic
from tests.integration.test_clients_kept_open_across_faults import cli

TOPIC = "default/shrinking"
COHORT = "laggards"
#: the blocking consumer's and ``headrace consume``'s topic
BEHIND = "default/behind"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the tests here, each on a topic of its own."""
    data = tmp_path_factory.mktemp("retention") / "data"
    b = BrokerProcess(data, extra_args=["--retention-check-interval-ms", "100"])
    b.start()
    try:
        yield b
    finally:
        b.kill9()


def log_start(b: BrokerProcess, topic: str = TOPIC) -> int:
    doc = b.get_json(f"/v1/topics/{topic}")
    return int(doc["partition_details"][0]["log_start_offset"])  # type: ignore[index]


def skipped_metric(b: BrokerProcess, cohort: str = COHORT, topic: str = TOPIC) -> float:
    with urllib.request.urlopen(f"{b.admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    pattern = (
        rf'^headrace_cohort_skipped_records_total\{{(?=[^}}]*cohort="{cohort}")'
        rf'(?=[^}}]*partition="0")(?=[^}}]*topic="{topic}")[^}}]*\}} (\S+)$'
    )
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def produce(
    b: BrokerProcess, first: int, count: int, topic: str = TOPIC, repeat: int = 10
) -> None:
    """Records ``first`` to ``first + count - 1``, each its number ``repeat`` times (8
    bytes each), 50 to a batch."""
    async with Producer(b.bootstrap, acks="leader", linger_ms=1) as producer:
        for i in range(first, first + count, 50):
            await producer.send_many(
                topic, [b"r%07d" % n * repeat for n in range(i, min(i + 50, first + count))]
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


def printed_offsets(path: Path) -> list[int]:
    """The offsets ``headrace consume --print-offsets`` printed (``0:OFFSET value`` lines),
    up to its last complete line."""
    lines = path.read_bytes().split(b"\n")[:-1]
    return [int(line.split(b" ", 1)[0].split(b":")[1]) for line in lines]


def skips(offsets: list[int], last: int) -> list[tuple[int, int]]:
    """The gaps in ``offsets`` (the last offset before each, the first after), which must
    run to ``last``. A consumer still behind while retention goes on deleting is skipped
    again: one gap per time it found its position deleted."""
    gaps = [(a, b) for a, b in itertools.pairwise(offsets) if b != a + 1]
    assert gaps, "expected a skip over the deleted records"
    assert all(b > a for a, b in gaps), f"offsets went back: {gaps}"
    assert offsets[-1] == last
    return gaps


def test_a_blocking_consumer_and_headrace_consume_behind_retention_move_on_to_the_log_start(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """The same for the blocking facade (a small credit, not polled) and for a ``headrace
    consume`` process (its consumer's 8 MiB credit, stopped with SIGSTOP while twice that
    is written): once they read again each goes on from the log start, a gap in its
    offsets (more, if retention deletes past it again while it reads), counted for its
    cohort. Neither raises nor exits."""
    config = {"segment_bytes": 262_144, "retention_bytes": 1_048_576, "retention_ms": -1}
    asyncio.run(create_topic(broker.bootstrap, BEHIND, 1, config))
    printed = tmp_path / "consume.out"
    consume = cli(
        ["consume", BEHIND, "--cohort", "cli", "--from-beginning", "--print-offsets",
         "--idle-timeout", "600", "--bootstrap", broker.bootstrap],
        printed,
    )  # fmt: skip
    last = 3_999
    polled: list[int] = []
    try:
        with BlockingConsumer(
            broker.bootstrap, BEHIND, "blocking", start="earliest", credit_bytes=8_192
        ) as consumer:

            def polled_to_the_end() -> bool:
                for batch in consumer.poll(timeout_s=0.5):
                    polled.extend(batch.offsets())
                    consumer.ack(batch.partition, batch.last_offset)
                return bool(polled) and polled[-1] == last

            # 4 KB records: 4,000 of them are twice consume's credit
            asyncio.run(produce(broker, 0, 50, BEHIND, repeat=500))
            waiting.until(lambda: printed_offsets(printed), 30, "consume printed the first")
            os.kill(consume.pid, signal.SIGSTOP)
            try:
                asyncio.run(produce(broker, 50, last + 1 - 50, BEHIND, repeat=500))
                waiting.until(lambda: log_start(broker, BEHIND) > 3_000, 20, "retention past both")
            finally:
                os.kill(consume.pid, signal.SIGCONT)
            waiting.until(polled_to_the_end, 30, f"the blocking consumer reached {last}")
            waiting.until(
                lambda: printed_offsets(printed)[-1] == last, 30, f"consume printed {last}"
            )
            assert consume.poll() is None, "consume exited"
    finally:
        procs.reap(consume)
    for cohort, offsets in (("blocking", polled), ("cli", printed_offsets(printed))):
        gaps = skips(offsets, last)
        assert gaps[0][1] >= 3_000, f"{cohort}: delivery went on from the new log start"
        skipped = sum(after - before - 1 for before, after in gaps)
        assert skipped_metric(broker, cohort, BEHIND) == skipped, cohort
