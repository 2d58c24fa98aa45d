"""Keyed acks=all load that records every acknowledgement, and the check that none of
them was lost.

Shared by the scaling tests (local: ``tests/integration/test_local_scaling.py``;
Kubernetes: ``e2e/tests/operator/test_scale_e2e.py``). ``AckedLoad`` sends rounds of one
record per key, the value being the key and its next sequence number, and keeps
(partition, offset, key, value) of each acknowledged one; it runs as a task on the
test's event loop or on a thread of its own (a synchronous test).
``check_stored_once`` then reads every partition back and asserts that every
acknowledged record is stored exactly once where it was acknowledged, that offsets are
contiguous and that each key's records are in the order they were sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable

from headrace.client import Producer
from headrace.errors import HeadraceError

#: partition, offset, key, value
Acked = tuple[int, int, bytes, bytes]
#: offset, key, value of each record of a partition, in offset order
Stored = list[tuple[int, bytes, bytes]]


def keys(count: int) -> list[bytes]:
    return [f"key-{k:02d}".encode() for k in range(count)]


class AckedLoad:
    """Rounds of one record per key with acks=all, until stopped."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        keys: list[bytes],
        *,
        linger_ms: int = 2,
        pause_s: float = 0.01,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.keys = keys
        self.linger_ms = linger_ms
        #: between rounds: the load is steady, not as fast as the producer can go
        self.pause_s = pause_s
        self.acked: list[Acked] = []
        #: loop time of each acknowledgement, in the order they came (stalls: the gaps)
        self.acked_at: list[float] = []
        # a thread's Event: set from the test's thread or its event loop alike
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None

    # ------------------------------------------------------------ on the test's event loop

    def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def longest_stall_s(self) -> float:
        """The longest time without an acknowledgement while the load ran."""
        gaps = [b - a for a, b in zip(self.acked_at, self.acked_at[1:], strict=False)]
        return max(gaps, default=0.0)

    async def wait_for_more(self, count: int, timeout: float = 60.0) -> None:
        """Until ``count`` more records than now are acknowledged (the load is flowing)."""
        target = len(self.acked) + count
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.acked) < target:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{count} more acks not seen in {timeout:.0f}s")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ on a thread of its own

    def start_thread(self) -> None:
        def target() -> None:
            try:
                asyncio.run(self.run())
            except BaseException as exc:  # handed to stop_thread
                self._thread_error = exc

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Still producing (on its thread): the same producer, never restarted."""
        return self._thread is not None and self._thread.is_alive()

    def stop_thread(self, timeout: float = 120.0) -> None:
        """Stop the load; raise if its producer failed (it is never restarted)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if self._thread_error is not None:
            raise AssertionError(f"the producer failed: {self._thread_error!r}") from (
                self._thread_error
            )

    # ------------------------------------------------------------ the load

    async def run(self) -> None:
        seq: dict[bytes, int] = defaultdict(int)
        async with Producer(
            self.bootstrap, acks="all", linger_ms=self.linger_ms, delivery_timeout_ms=60_000
        ) as producer:
            pending: set[asyncio.Task[None]] = set()

            async def settle(receipt: object, key: bytes, value: bytes) -> None:
                with contextlib.suppress(HeadraceError):  # not acknowledged: not counted
                    meta = await receipt  # type: ignore[misc]
                    self.acked.append((meta.partition, meta.offset, key, value))
                    self.acked_at.append(asyncio.get_running_loop().time())

            while not self._stop.is_set():
                for key in self.keys:
                    value = key + b":%08d" % seq[key]
                    seq[key] += 1
                    task = asyncio.create_task(
                        settle(await producer.send(self.topic, value, key=key), key, value)
                    )
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                await asyncio.sleep(self.pause_s)
            await asyncio.gather(*pending)


async def check_stored_once(
    read: Callable[[int], Awaitable[Stored]], partitions: int, acked: list[Acked]
) -> None:
    """Every acknowledged record stored once where acknowledged; contiguous; keys in order.
    ``read``: a partition's records, by partition."""
    stored: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    for p in range(partitions):
        records = await read(p)
        assert [o for o, _, _ in records] == list(range(len(records))), (
            f"partition {p}: offsets not contiguous"
        )
        stored.update({(p, o): (k, v) for o, k, v in records})
        by_key: dict[bytes, list[bytes]] = defaultdict(list)
        for _, k, v in records:
            by_key[k].append(v)
        for k, values in by_key.items():
            assert values == sorted(values), f"partition {p}: key {k!r} out of order"
    values = [v for _, v in stored.values()]
    assert len(values) == len(set(values)), "a record is stored twice"
    for partition, offset, key, value in acked:
        assert stored.get((partition, offset)) == (key, value), (
            f"acknowledged {value!r} at {partition}/{offset} lost"
        )
