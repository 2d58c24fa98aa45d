"""Gate epochs do not restart at 0 when a broker restarts.

A member holds the partition's gate under some epoch; the broker is killed
and started again on the same data directory; the next admission's epoch is
higher than any the previous incarnation handed out.
"""

from __future__ import annotations

from headrace.client import Consumer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic
from headrace.testing.waiting import until


async def held_epoch(bootstrap: str) -> int:
    consumer = await Consumer(bootstrap, "epochs", "readers", start="earliest").start()
    try:
        for _ in range(3):  # wait for the assignment push without sleeping blind
            if consumer.assignment:
                break
            await consumer.getmany(timeout_s=1.0)
        assert consumer.assignment, "no gate was assigned"
        return consumer.assignment[0]
    finally:
        await consumer.close(grace_s=2.0)


async def test_a_restarted_broker_admits_at_a_higher_epoch(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "epochs", 1)
    first = await held_epoch(broker.bootstrap)
    again = await held_epoch(broker.bootstrap)
    assert again > first  # within one incarnation, every admission bumps the epoch

    broker.kill9()
    broker.start()
    until(lambda: broker.alive, 10, "broker restarted")
    after_restart = await held_epoch(broker.bootstrap)
    assert after_restart > again, (first, again, after_restart)
