"""The brokers over HTTP: heartbeat polls and topology pushes (a ``BrokerFleet``).

Every broker's admin port answers ``GET /v1/heartbeat`` and takes the
topology on ``POST /v1/topology``; the kopf operator talks to the brokers
the same way. When the brokers ask for credentials, the fleet presents a token
whose principal holds the ``cluster`` grant (the brokers' replication token) as
``Authorization: Bearer``; with an SSL context it speaks HTTPS.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
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

    def __init__(
        self,
        brokers: Sequence[BrokerEndpoint],
        clock: Clock,
        timeout_ms: int,
        *,
        auth_token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``auth_token``: sent as a bearer token (None: no credentials);
        ``ssl_context``: speak HTTPS to the admin ports, verifying with it."""
        self.brokers = {b.id: b for b in brokers}
        self.clock = clock
        #: a poll that takes longer than this counts as a missed heartbeat
        self.timeout_ms = timeout_ms
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000)
        self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers)

    def _url(self, broker: BrokerEndpoint, path: str) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{broker.host}:{broker.admin_port}{path}"

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
            async with self._session.get(
                self._url(broker, "/v1/heartbeat"), ssl=self._ssl or True
            ) as resp:
                if resp.status in (401, 403):
                    # Not silence: the broker is up and says our credentials are wrong.
                    log.error(
                        "broker %s refused the heartbeat poll (HTTP %s): check the token",
                        broker.id,
                        resp.status,
                    )
                    return False
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
                self._url(broker, ""),
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
            async with self._session.post(
                self._url(broker, "/v1/topology"), json=topology, ssl=self._ssl or True
            ) as resp:
                body = await resp.json()
            if resp.status != 200:
                log.warning("broker %s refused topology %s: %s", broker.id, generation, body)
                return None
            return TopologyReply.from_json(body).generation or 0
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            log.info("push to broker %s failed: %s", broker.id, exc)
            return None
