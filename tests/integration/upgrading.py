"""What the rolling-upgrade tests share: the release they upgrade from, the cohort that
consumes throughout, and the checks and figures of the run.

Two tests upgrade a 3-broker cluster from ``PREVIOUS_RELEASE`` to this checkout under
keyed acks=all load (``acked_load.AckedLoad``) with a ``Cohort`` consuming, neither
client ever restarted: in local mode process by process
(``tests/integration/test_rolling_upgrade.py``), and on Kubernetes with ``helm upgrade``
and a new image (``e2e/tests/operator/test_rolling_upgrade_e2e.py``, on the real node).
Afterwards ``check_upgrade`` reads every partition back and asserts nothing acknowledged
was lost, nothing stored twice, each key in order, every acknowledgement delivered with
each key's first deliveries in order; ``UpgradeFigures`` is what it measured, printed
and written to ``test-artifacts/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from headrace.client import Consumer
from tests.integration.acked_load import Acked, Stored, check_stored_once

#: the release a cluster is upgraded from: the last commit of main before the version
#: negotiation (move it forward when a release stops being supported)
PREVIOUS_RELEASE = "4ddf8aadcdf98f592b816510bcd7500d1b64e7b8"
#: where the figures go (git-ignored), as the other tests' artifacts
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

#: partition, offset, value of each delivery, in the order the consumer got them
Delivery = tuple[int, int, bytes]


class Cohort:
    """One cohort consumer, opened once and kept open until stopped, recording every
    delivery and acknowledging each batch. It runs as a task on the test's event loop or
    on a thread of its own (a synchronous test); if it fails, ``stop``/``stop_thread``
    raise: a client that had to be restarted is a failed run."""

    def __init__(self, bootstrap: str, topic: str, cohort: str) -> None:
        self.consumer = Consumer(bootstrap, topic, cohort, start="earliest")
        self.deliveries: list[Delivery] = []
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None

    def received(self) -> set[bytes]:
        return {value for _, _, value in list(self.deliveries)}

    async def _consume(self) -> None:
        try:
            while not self._stop.is_set():
                for batch in await self.consumer.getmany(timeout_s=0.2):
                    for offset, value in zip(batch.offsets(), batch.values(), strict=True):
                        self.deliveries.append((batch.partition, offset, value))
                    self.consumer.ack_batch(batch)
        finally:
            await self.consumer.close()

    # ------------------------------------------------------------ on the test's event loop

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._consume())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    # ------------------------------------------------------------ on a thread of its own

    def start_thread(self, timeout: float = 60.0) -> None:
        started = threading.Event()

        async def run() -> None:
            await self.consumer.start()
            started.set()
            await self._consume()

        def target() -> None:
            try:
                asyncio.run(run())
            except BaseException as exc:  # handed to stop_thread
                self._thread_error = exc
                started.set()

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise AssertionError(f"the consumer did not start in {timeout:.0f}s")
        self.raise_if_failed()

    def running(self) -> bool:
        """Still consuming (on its thread): the same consumer, never restarted."""
        return self._thread is not None and self._thread.is_alive()

    def raise_if_failed(self) -> None:
        if self._thread_error is not None:
            raise AssertionError(f"the consumer failed: {self._thread_error!r}") from (
                self._thread_error
            )

    def stop_thread(self, timeout: float = 120.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        self.raise_if_failed()


@dataclass(frozen=True)
class UpgradeFigures:
    """What a rolling-upgrade run measured (written as JSON, printed as a line)."""

    mode: str
    previous_release: str
    acknowledged: int
    lost: int
    redelivered: int
    longest_produce_stall_s: float
    keys_in_order: bool
    clients_restarted: int

    def line(self) -> str:
        return (
            f"rolling upgrade ({self.mode}) {self.previous_release[:10]} -> this release:"
            f" {self.acknowledged} acknowledged, {self.lost} lost, {self.redelivered}"
            f" redelivered, longest produce stall {self.longest_produce_stall_s:.2f} s,"
            f" keys in order: {self.keys_in_order}, clients restarted: {self.clients_restarted}"
        )

    def write(self, name: str, **extra: object) -> Path:
        """``test-artifacts/<name>.json``: these figures and ``extra`` (what ran)."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.json"
        path.write_text(json.dumps({**asdict(self), **extra}, indent=2) + "\n")
        return path


def first_deliveries_out_of_order(deliveries: list[Delivery]) -> list[str]:
    """Where a key's first deliveries (a record's first, by partition and offset) did not
    come in the order its records were sent (values are ``key:seq``, seq zero-padded)."""
    first: dict[tuple[int, int], bytes] = {}
    for partition, offset, value in deliveries:
        first.setdefault((partition, offset), value)
    last_seq: dict[bytes, bytes] = {}
    wrong = []
    for value in first.values():
        key, _, seq = value.partition(b":")
        if seq <= last_seq.get(key, b""):
            wrong.append(f"key {key!r}: {seq!r} after {last_seq[key]!r}")
        last_seq[key] = max(seq, last_seq.get(key, b""))
    return wrong


async def check_upgrade(
    read: Callable[[int], Awaitable[Stored]],
    partitions: int,
    acked: list[Acked],
    deliveries: list[Delivery],
    *,
    mode: str,
    longest_stall_s: float,
    what_ran: dict[str, object] | None = None,
) -> UpgradeFigures:
    """Read every partition back (``read``), print the figures and write them (with
    ``what_ran``) to ``test-artifacts/rolling-upgrade-<mode>.json``, then assert: every
    acknowledged record stored once where acknowledged, each key in order, and each
    key's first deliveries in order (the caller has waited for every acknowledgement to
    be delivered)."""
    stored: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    for partition in range(partitions):
        stored.update({(partition, o): (k, v) for o, k, v in await read(partition)})
    lost = [a for a in acked if stored.get((a[0], a[1])) != (a[2], a[3])]
    out_of_order = first_deliveries_out_of_order(deliveries)
    figures = UpgradeFigures(
        mode=mode,
        previous_release=PREVIOUS_RELEASE,
        acknowledged=len(acked),
        lost=len(lost),
        redelivered=len(deliveries) - len({(p, o) for p, o, _ in deliveries}),
        longest_produce_stall_s=round(longest_stall_s, 3),
        keys_in_order=not out_of_order,
        clients_restarted=0,  # one producer and one consumer, the whole run (or it failed)
    )
    print(f"\n{figures.line()}")
    with contextlib.suppress(OSError):
        figures.write(f"rolling-upgrade-{mode}", **(what_ran or {}))
    assert not lost, f"{len(lost)} acknowledged records lost, the first: {lost[:3]}"
    await check_stored_once(read, partitions, acked)
    assert not out_of_order, out_of_order[:5]
    return figures
