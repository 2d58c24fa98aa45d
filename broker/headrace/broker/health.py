"""Whether this broker serves: ready (started, not stopping), draining (asked to hand its
leaderships off), or halting (a log's data fdatasync failed)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from headrace.broker.metrics import BrokerMetrics
from headrace.broker.ports import LogSyncFailed
from headrace.broker.topics import Partition, Role

log = logging.getLogger(__name__)


class Health:
    def __init__(
        self, metrics: BrokerMetrics, broker_id: int, hosted: Callable[[], list[Partition]]
    ) -> None:
        self._metrics = metrics
        self._broker_id = broker_id
        #: every partition hosted here
        self._hosted = hosted
        #: started and not stopping (``/readyz``; the heartbeat says draining otherwise)
        self.ready = False
        #: asked to drain (``POST /v1/drain``, a pod's preStop): the heartbeat says so, and
        #: the controller moves every leadership it can to another in-sync replica
        self.draining = False
        #: the first log whose data fdatasync failed: the broker must halt (see ``halt``)
        self.fatal: LogSyncFailed | None = None
        #: set once ``fatal`` is: the entry point stops the process and exits non-zero
        self.halting = asyncio.Event()

    def halt(self, failure: LogSyncFailed) -> None:
        """A log's data fdatasync failed: stop serving, and have the process exit.

        The log refuses writes and never counts data durable again, so leading
        its partition would only hand producers retriable errors until their
        timeouts. As Kafka does when its only log directory fails, the broker
        stops instead: the controller sees it gone and elects an in-sync replica,
        and a restart recovers the partition from what is on disk.
        """
        self._metrics.log_sync_failures.inc()
        self.ready = False  # /readyz and the heartbeat (draining) say so while we stop
        if self.fatal is not None:
            log.critical("fdatasync of %s failed too: %s", failure.partition.name, failure.error)
            return
        self.fatal = failure
        log.critical(
            "fdatasync of %s failed: %s; its log takes no more writes, so broker %s halts"
            " (a restart recovers the partition from disk)",
            failure.partition.name,
            failure.error.message,
            self._broker_id,
        )
        self.halting.set()

    def drain_report(self) -> dict[str, Any]:
        """Where a drain stands (``/v1/drain``): the partitions this broker leads, and which
        of them it can hand off (their live replica set has another member). A leader with
        no in-sync peer keeps leading: stopping it takes the partition offline either way."""
        leading = sorted(
            (p for p in self._hosted() if p.role is Role.LEADER),
            key=lambda p: (p.topic.name, p.index),
        )
        me = self._broker_id
        movable = [p.name for p in leading if any(b != me for b in p.lrs)]
        return {
            "brokerId": me,
            "draining": self.draining,
            "leading": [p.name for p in leading],
            "movable": movable,
            "drained": self.draining and not movable,
        }
