"""The brokers over HTTP: heartbeat polls and topology pushes (a ``BrokerFleet``).

Every broker's admin port answers ``GET /v1/heartbeat`` and takes the
topology on ``POST /v1/topology``; the kopf operator talks to the brokers
the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import aiohttp

from headrace.control.looping import Clock, Report
from headrace.errors import HeadraceError
from headrace.protocol.coordination import Heartbeat, TopologyReply
from headrace.protocol.endpoints import BrokerEndpoint

log = logging.getLogger(__name__)


class HttpFleet:
    """Polls and pushes over one aiohttp session, opened by ``start``."""

    def __init__(self, brokers: Sequence[BrokerEndpoint], clock: Clock, timeout_ms: int) -> None:
        self.brokers = {b.id: b for b in brokers}
        self.clock = clock
        #: a poll that takes longer than this counts as a missed heartbeat
        self.timeout_ms = timeout_ms
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000)
        self._session = aiohttp.ClientSession(timeout=timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def poll(self) -> Mapping[int, Report | None]:
        brokers = list(self.brokers.values())
        answers = await asyncio.gather(*(self._poll(b) for b in brokers))
        return {b.id: a for b, a in zip(brokers, answers, strict=True) if a is not False}

    async def _poll(self, broker: BrokerEndpoint) -> Report | Literal[False] | None:
        """The report; None: nothing listens (the process is gone); False: no answer."""
        assert self._session is not None, "start() first"
        try:
            async with self._session.get(f"{broker.admin_url}/v1/heartbeat") as resp:
                doc = await resp.json()
            heartbeat = Heartbeat.from_json(doc, received_ms=self.clock.now_ms())
        except aiohttp.ClientConnectorError as exc:
            # Nothing listens on the admin port: that is proof, not silence, so the loop
            # need not wait out the liveness TTL (a timeout still does).
            return None if isinstance(exc.os_error, ConnectionRefusedError) else False
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            log.debug("no heartbeat from broker %s: %s", broker.id, exc)
            return False
        if heartbeat.broker_id != broker.id:
            log.error(
                "broker at %s says it is %s, expected %s",
                broker.admin_url,
                heartbeat.broker_id,
                broker.id,
            )
            return False
        return Report(heartbeat, heartbeat.generation)

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        assert self._session is not None, "start() first"
        broker = self.brokers[broker_id]
        generation = topology.get("generation")
        try:
            async with self._session.post(f"{broker.admin_url}/v1/topology", json=topology) as resp:
                body = await resp.json()
            if resp.status != 200:
                log.warning("broker %s refused topology %s: %s", broker.id, generation, body)
                return None
            return TopologyReply.from_json(body).generation or 0
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            log.info("push to broker %s failed: %s", broker.id, exc)
            return None
