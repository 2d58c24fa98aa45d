"""The brokers over HTTP: heartbeat polls and topology pushes (a ``BrokerFleet``).

Every broker's admin port answers ``GET /v1/heartbeat`` and takes the
topology on ``POST /v1/topology``; the local controller and the kopf operator
both talk to the brokers through this fleet. When the brokers ask for credentials, the fleet presents a token
whose principal holds the ``cluster`` grant (the brokers' replication token) as
``Authorization: Bearer``; with an SSL context it speaks HTTPS.

Polls ask for deltas: the fleet keeps each broker's partition reports and
passes the journal position it holds (``?since=instance:seq``), so a broker
answers with what changed since (``protocol.coordination.ReportJournal``);
``merged_into`` makes the full heartbeat the control loop sees. A broker that
restarted, or a delta that does not apply, gets a full poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import aiohttp

from headrace.control.looping import Clock, Report
from headrace.errors import HeadraceError, UnsupportedDocument
from headrace.protocol.coordination import (
    Heartbeat,
    PartitionKey,
    PartitionReport,
    ReportJournal,
    TopologyReply,
)
from headrace.protocol.endpoints import BrokerEndpoint

log = logging.getLogger(__name__)

#: a topology push may take this long: the document names every partition (1 MB at
#: 10,000) and the broker applies it before it answers. The poll timeout (under a second)
#: failed such pushes and each retry started over. Pushes are idempotent.
PUSH_TIMEOUT_S = 30.0
#: how long ``push`` waits for the broker's answer. A push still going then finishes in
#: the background (the broker's next heartbeat shows the generation it holds) and the
#: control step moves on: one broker that accepts the connection and never answers
#: (paused, swapping, a hung disk) held every later broker's push and the whole control
#: loop for PUSH_TIMEOUT_S, so no election ran for 30 s (failover ≤ 3 s).
PUSH_WAIT_S = 0.5
#: a broker that refused a push's format as too new (it runs an older release) gets no
#: push in that format again for this long: it cannot take one until it is upgraded, and
#: one refusal a minute (logged) says so without a refused request every step
BEHIND_RETRY_MS = 60_000


class CredentialsRefused(ValueError):
    """A broker refused our heartbeat poll's credentials (HTTP 401/403): no answer."""


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
        #: per broker: the journal position held and the partition reports as of it
        self._held: dict[int, tuple[ReportJournal, dict[PartitionKey, PartitionReport]]] = {}
        #: body bytes of the last answer from each broker (a benchmark figure)
        self.last_poll_bytes: dict[int, int] = {}
        #: polls and pushes refused for their credentials (HTTP 401/403), ever: the
        #: operator re-reads its token when this moves (a rotation it has not seen yet)
        self.refusals = 0
        #: the push still going to each broker, if any (one at a time per broker), and
        #: the address it went to
        self._pushing: dict[int, tuple[BrokerEndpoint, asyncio.Task[int | None]]] = {}
        #: those of them ``push`` stopped waiting for
        self._unawaited: set[asyncio.Task[int | None]] = set()
        #: per broker that refused a push's format as too new: (that format, when)
        self._behind: dict[int, tuple[int, int]] = {}

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000)
        self._session = aiohttp.ClientSession(timeout=timeout, headers=self._headers)

    def set_auth_token(self, auth_token: str | None) -> None:
        """Present ``auth_token`` from the next request on (None: no credentials); the
        operator's loop of a cluster whose auth was turned on or off while it ran."""
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        if self._session is not None:
            self._session.headers.pop("Authorization", None)
            self._session.headers.update(self._headers)

    def set_ssl_context(self, ssl_context: ssl.SSLContext | None) -> None:
        """Speak HTTPS with ``ssl_context`` from the next request on (None: HTTP); the
        operator's loop of a cluster whose TLS was turned on, or whose CA changed."""
        self._ssl = ssl_context

    def _url(self, broker: BrokerEndpoint, path: str) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{broker.host}:{broker.admin_port}{path}"

    async def close(self) -> None:
        pending = [task for _, task in self._pushing.values()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def poll(self) -> Mapping[int, Report | None]:
        brokers = list(self.brokers.values())
        answers = await asyncio.gather(*(self._poll(b) for b in brokers))
        return {b.id: a for b, a in zip(brokers, answers, strict=True) if a is not False}

    async def _poll(self, broker: BrokerEndpoint) -> Report | Literal[False] | None:
        """The report; None: nothing listens (the process is gone); False: no answer."""
        assert self._session is not None, "start() first"
        held = self._held.get(broker.id)
        try:
            heartbeat = await self._get(broker, held)
            merged = heartbeat.merged_into(held[1] if held is not None else None)
            if merged is None:  # a delta against reports we do not hold: ask for all of them
                self._held.pop(broker.id, None)
                heartbeat = await self._get(broker, None)
                merged = heartbeat.merged_into(None)
            assert merged is not None
        except aiohttp.ClientConnectorError as exc:
            # Nothing listens on the admin port: that is proof, not silence, so the loop
            # need not wait out the liveness TTL (a timeout still does).
            return None if isinstance(exc.os_error, ConnectionRefusedError) else False
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            # What we hold stays good: the broker keeps no state per poller, and re-applying
            # a delta merged before the failure changes nothing.
            log.debug("no heartbeat from broker %s: %s", broker.id, exc)
            return False
        if heartbeat.broker_id != broker.id:
            log.error(
                "broker at %s says it is %s, expected %s",
                self._url(broker, ""),
                heartbeat.broker_id,
                broker.id,
            )
            self._held.pop(broker.id, None)
            return False
        full, reports = merged
        if heartbeat.journal is not None:
            self._held[broker.id] = (heartbeat.journal, reports)
        return Report(full, full.generation)

    async def _get(
        self, broker: BrokerEndpoint, held: tuple[ReportJournal, Any] | None
    ) -> Heartbeat:
        assert self._session is not None, "start() first"
        params = {"since": f"{held[0].instance}:{held[0].seq}"} if held is not None else {}
        async with self._session.get(
            self._url(broker, "/v1/heartbeat"), params=params, ssl=self._ssl or True
        ) as resp:
            if resp.status in (401, 403):
                self.refusals += 1
                # Not silence: the broker is up and says our credentials are wrong.
                log.error(
                    "broker %s refused the heartbeat poll (HTTP %s): check the token",
                    broker.id,
                    resp.status,
                )
                raise CredentialsRefused(f"broker {broker.id} answered HTTP {resp.status}")
            body = await resp.read()
        self.last_poll_bytes[broker.id] = len(body)
        return Heartbeat.from_json(json.loads(body), received_ms=self.clock.now_ms())

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        """The generation the broker holds after the push; None if it refused, failed,
        or has not answered within ``PUSH_WAIT_S`` (the push goes on meanwhile, and
        the next ones to that broker answer None until it ends)."""
        broker = self.brokers[broker_id]
        behind = self._behind.get(broker_id)
        if (
            behind is not None
            and topology.get("format") == behind[0]
            and self.clock.now_ms() - behind[1] < BEHIND_RETRY_MS
        ):
            return None  # it reads no such format yet (its refusal was logged)
        running = self._pushing.get(broker_id)
        if running is not None and not running[1].done():
            if running[0] == broker:
                return None
            running[1].cancel()  # the broker moved (a new pod, a new IP): push there now
        task = asyncio.get_running_loop().create_task(
            self._push(broker_id, topology), name=f"topology push to broker {broker_id}"
        )
        self._pushing[broker_id] = (broker, task)
        task.add_done_callback(lambda done: self._pushed(broker_id, done))
        try:
            finished, _ = await asyncio.wait({task}, timeout=PUSH_WAIT_S)
        except asyncio.CancelledError:
            self._unawaited.add(task)
            raise
        if not finished:
            self._unawaited.add(task)
            log.info(
                "broker %s has not answered the push of generation %s within %.1f s;"
                " it goes on in the background",
                broker_id,
                topology.get("generation"),
                PUSH_WAIT_S,
            )
            return None
        return task.result()

    def _pushed(self, broker_id: int, task: asyncio.Task[int | None]) -> None:
        running = self._pushing.get(broker_id)
        if running is not None and running[1] is task:
            del self._pushing[broker_id]
        if task in self._unawaited:  # nobody will read its outcome: say what went wrong
            self._unawaited.discard(task)
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("push to broker %s failed: %s: %s", broker_id, type(exc).__name__, exc)

    async def _push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        assert self._session is not None, "start() first"
        broker = self.brokers[broker_id]
        generation = topology.get("generation")
        try:
            async with self._session.post(
                self._url(broker, "/v1/topology"),
                ssl=self._ssl or True,
                json=topology,
                timeout=aiohttp.ClientTimeout(total=PUSH_TIMEOUT_S),
            ) as resp:
                if resp.status in (401, 403):
                    self.refusals += 1
                if resp.status != 200:
                    # Loud: a broker that keeps refusing stays on its old topology (a body
                    # over its size limit was once refused as text, every step, at INFO).
                    text = (await resp.text())[:500]
                    log.warning("broker %s refused topology %s: %s", broker.id, generation, text)
                    if resp.status == 422 and UnsupportedDocument.__name__ in text:
                        fmt = topology.get("format")
                        if isinstance(fmt, int):
                            self._behind[broker_id] = (fmt, self.clock.now_ms())
                    return None
                body = await resp.json()
            return TopologyReply.from_json(body).generation or 0
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            # %s, never %r: an aiohttp error's repr carries the request headers (the token)
            log.info("push to broker %s failed: %s: %s", broker.id, type(exc).__name__, exc)
            return None
