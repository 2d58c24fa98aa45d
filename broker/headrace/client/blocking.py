"""A small blocking facade over the async client, for scripts and threads.

Runs one event loop on a background thread; every call submits a coroutine
to it and waits. Good for tools and tests; for throughput use the async API.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from headrace.client.consumer import ConsumedBatch, Consumer
from headrace.client.producer import BatchResult, Producer, RecordMetadata

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="headrace-client", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


#: how much longer than the producer's delivery timeout a blocking call waits by default: the
#: producer fails a record it could not deliver at its delivery timeout, with a typed error,
#: and that error (not a wait that gave up first) is what the caller should see
DELIVERY_MARGIN_S = 5.0


class BlockingProducer:
    """``send`` blocks until the record is acknowledged and returns its metadata.

    By default a call waits as long as the producer itself does: until the record is
    acknowledged or the producer gives it up at ``delivery_timeout_ms`` and raises why
    (``RequestTimedOut``, ``NotEnoughReplicas``, ...). Either way the caller learns the
    record's fate. A ``timeout`` passed explicitly may end the wait sooner; the
    ``TimeoutError`` it raises then says nothing of the record, which stays queued and
    may still be stored, as with a Kafka producer's ``future.get(timeout)``.
    """

    def __init__(self, bootstrap: str, **options: Any) -> None:
        self._runner = _LoopThread()

        async def make() -> Producer:
            return await Producer(bootstrap, **options).start()

        self._producer = self._runner.call(make())

    def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        timeout: float | None = None,
    ) -> RecordMetadata:
        async def go() -> RecordMetadata:
            receipt = await self._producer.send(topic, value, key=key, partition=partition)
            await self._producer.flush()
            return await receipt

        return self._runner.call(go(), self._wait_s(timeout))

    def send_many(
        self, topic: str, values: Sequence[bytes], *, timeout: float | None = None
    ) -> list[BatchResult]:
        async def go() -> list[BatchResult]:
            futures = await self._producer.send_many(topic, values)
            await self._producer.flush()
            return [await f for f in futures]

        return self._runner.call(go(), self._wait_s(timeout))

    def _wait_s(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        return self._producer.delivery_timeout_s + DELIVERY_MARGIN_S

    def close(self) -> None:
        try:
            self._runner.call(self._producer.close(), 30)
        finally:
            self._runner.stop()

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingConsumer:
    """``poll`` returns the batches that arrived within ``timeout_s``; ``ack`` acks cumulatively."""

    def __init__(self, bootstrap: str, topic: str, cohort: str, **options: Any) -> None:
        self._runner = _LoopThread()

        async def make() -> Consumer:
            return await Consumer(bootstrap, topic, cohort, **options).start()

        self._consumer = self._runner.call(make())

    def poll(
        self, timeout_s: float = 1.0, max_batches: int = 100, *, max_records: int | None = None
    ) -> list[ConsumedBatch]:
        """See ``Consumer.getmany``: ``max_records`` caps the records handed out."""
        return self._runner.call(
            self._consumer.getmany(max_batches, timeout_s, max_records=max_records)
        )

    def ack(self, partition: int, offset: int) -> None:
        self._runner.loop.call_soon_threadsafe(self._consumer.ack, partition, offset)

    def ack_batch(self, batch: ConsumedBatch) -> None:
        """Acknowledge every record of ``batch`` (``Consumer.ack_batch``). A batch handed
        out before its topic was deleted and created again is ignored, where ``ack`` with
        its offsets would acknowledge the new topic's records at those offsets."""
        self._runner.loop.call_soon_threadsafe(self._consumer.ack_batch, batch)

    def close(self) -> None:
        try:
            self._runner.call(self._consumer.close(), 60)
        finally:
            self._runner.stop()

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
