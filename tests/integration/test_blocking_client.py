"""The blocking facade across a stall: ``send`` waits as long as the producer itself does, so
a caller learns each record's fate instead of a ``TimeoutError`` that says nothing of it.
Real broker processes over real sockets."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from headrace.client.blocking import BlockingProducer
from headrace.client.producer import RecordMetadata
from headrace.errors import RequestTimedOut
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition

#: the blocking facade's wait before it followed the producer's delivery timeout
OLD_DEFAULT_WAIT_S = 30.0


def _send_in_thread(
    producer: BlockingProducer, value: bytes
) -> tuple[concurrent.futures.Future[RecordMetadata], threading.Event]:
    """``producer.send`` on a thread of its own; the event is set once the call began."""
    outcome: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
    began = threading.Event()

    def run() -> None:
        began.set()
        try:
            outcome.set_result(producer.send("stall", value, partition=0))
        except BaseException as exc:  # handed to the test thread as it is
            outcome.set_exception(exc)

    threading.Thread(target=run, name="blocking-send", daemon=True).start()
    return outcome, began


def test_a_send_across_a_stall_longer_than_the_old_wait_returns_the_stored_record(
    broker: BrokerProcess,
) -> None:
    asyncio.run(create_topic(broker.bootstrap, "stall", 1))
    with BlockingProducer(broker.bootstrap, delivery_timeout_ms=90_000) as producer:
        producer.send("stall", b"before", partition=0)
        broker.pause()
        try:
            outcome, began = _send_in_thread(producer, b"across")
            assert began.wait(10)
            # the stall's length (a fault, not a wait for anything): past the facade's old
            # fixed wait, within the producer's delivery timeout
            time.sleep(OLD_DEFAULT_WAIT_S + 2)
        finally:
            broker.resume()
        meta = outcome.result(timeout=60)
    assert (meta.partition, meta.offset) == (0, 1)
    stored = asyncio.run(read_partition(broker.bootstrap, "stall", 0))
    assert [r.value for r in stored] == [b"before", b"across"]


def test_a_send_the_producer_gives_up_raises_the_producers_error(broker: BrokerProcess) -> None:
    asyncio.run(create_topic(broker.bootstrap, "stall", 1))
    with BlockingProducer(broker.bootstrap, delivery_timeout_ms=2_000) as producer:
        broker.pause()
        try:
            with pytest.raises(RequestTimedOut):
                producer.send("stall", b"given-up", partition=0)
        finally:
            broker.resume()
        # the producer goes on once the broker answers again
        meta = producer.send("stall", b"after", partition=0)
    assert meta.partition == 0
