"""Bootstrap, connection pool and routing cache shared by producers and consumers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.client.routing import RoutingCache
from headrace.errors import ConnectionClosed, HeadraceError, TokenRotated
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op

log = logging.getLogger(__name__)

#: how many brokers one topology refresh asks, at once. One broker's view can be stale --
#: a leader cut off from the controller still names itself leader, and a client that
#: reaches it would follow it forever -- and one may never answer.
REFRESH_FANOUT = 3
#: after the first broker answered, how long a refresh waits for the others (seconds):
#: a broker behind a dead link must not hold the refresh up
REFRESH_GRACE_S = 0.25
#: how long a client waits for a topic it does not know to appear in the topology (seconds):
#: a topic just created reaches the brokers one push at a time, so the first broker asked
#: may not have it yet (Kafka clients block on metadata the same way, max.block.ms, 60 s).
#: A controller reports a topic Online once it is placed, before every broker applied the
#: push; on a busy machine that took longer than the 5 s this once was.
TOPIC_WAIT_S = 15.0
#: the longest wait between two tries to ask for the topology again after a connection
#: that brought its changes closed (seconds)
MAX_RESUBSCRIBE_BACKOFF_S = 2.0


def parse_bootstrap(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap
    out = []
    for item in items:
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"bootstrap address {item!r} is not HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap address given")
    return out


class ClusterClient:
    def __init__(self, bootstrap: str | list[str], options: ConnectOptions | None = None) -> None:
        self._bootstrap = parse_bootstrap(bootstrap)
        self.options = options or ConnectOptions()
        self.routing = RoutingCache()
        self._pool: dict[tuple[str, int], ClientConnection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Task[ClientConnection]] = {}
        self._push_handlers: dict[int, Callable[[ClientConnection, Frame], None]] = {}
        #: called after the routing cache changed (push or refresh)
        self.topology_listeners: list[Callable[[], None]] = []
        self._refreshing: asyncio.Task[None] | None = None
        #: refresh queries still out when their refresh returned (a slow or cut-off broker)
        self._side_refreshes: set[asyncio.Task[msg.TopologySnapshot]] = set()
        #: the generation every applied push was acked at, newest last (for tests and metrics)
        self.acked_generations: list[int] = []
        #: open connections a topology request was answered on: a broker pushes topology
        #: changes only on those (``_resubscribe``)
        self.subscribed: set[ClientConnection] = set()
        self._resubscribing: asyncio.Task[None] | None = None
        #: a subscribed connection closed since the resubscription's last refresh began
        self._resubscribe_wanted = False
        self._closing = False

    def on_push(self, op: Op, handler: Callable[[ClientConnection, Frame], None]) -> None:
        self._push_handlers[op] = handler

    async def start(self) -> None:
        await self.refresh()

    # ------------------------------------------------------------------ connections

    async def connect(self, host: str, port: int) -> ClientConnection:
        key = (host, port)
        conn = self._pool.get(key)
        if conn is not None and not conn.is_closed:
            return conn
        task = self._connecting.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                ClientConnection.open(host, port, self.options, self._handle_push)
            )
            self._connecting[key] = task
        try:
            conn = await asyncio.shield(task)
        finally:
            if task.done():
                self._connecting.pop(key, None)
        self._pool[key] = conn
        return conn

    async def bootstrap_connection(self) -> ClientConnection:
        """Any reachable broker: pooled ones first, then the bootstrap list."""
        for conn in self._pool.values():
            if not conn.is_closed:
                return conn
        errors = []
        candidates = list(self._bootstrap)
        for b in (self.routing.brokers or {}).values():
            if (b.host, b.port) not in candidates:
                candidates.append((b.host, b.port))
        for host, port in candidates:
            try:
                return await self.connect(host, port)
            except HeadraceError as exc:
                if not exc.retriable:
                    raise  # bad credentials or protocol version: another broker won't differ
                errors.append(str(exc))
        raise ConnectionClosed("no broker reachable: " + "; ".join(errors))

    async def connection_for(self, topic: str, partition: int) -> ClientConnection:
        owner = self.routing.owner(topic, partition)
        if owner is None:
            return await self.bootstrap_connection()
        return await self.connect(owner.host, owner.port)

    # ------------------------------------------------------------------ topology

    async def refresh(self) -> None:
        """Fetch the topology; concurrent callers share one request."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        await asyncio.shield(self._refreshing)

    async def topic_routing(self, name: str, wait_s: float = TOPIC_WAIT_S) -> msg.TopicRouting:
        """``name``'s routing, refreshing the topology until it has the topic or ``wait_s``
        has passed (then ``UnknownTopic``, or whatever the last refresh raised)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        backoff = 0.05
        while True:
            try:
                return self.routing.topic(name)
            except HeadraceError:
                if loop.time() >= deadline:
                    raise
            await self.refresh()
            with contextlib.suppress(HeadraceError):
                return self.routing.topic(name)
            await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
            backoff = min(backoff * 2, 0.5)

    async def _refresh(self) -> None:
        """Ask ``REFRESH_FANOUT`` brokers at once for the topology (another one in place of
        each that fails), and keep the newest (the highest epoch and generation, as the controller
        numbers them) of those that answer within ``REFRESH_GRACE_S`` of the first.

        At once, not the first one and then others: a broker that accepts connections and
        never answers (paused, or hung on its disk) held every refresh for the whole
        request timeout, so a producer whose leader was paused retried there for 60 s."""
        loop = asyncio.get_running_loop()
        waiting = self._candidates()
        asking: set[asyncio.Task[msg.TopologySnapshot]] = set()
        snapshots: list[msg.TopologySnapshot] = []
        errors: list[HeadraceError] = []

        def ask_next() -> None:
            if waiting:
                asking.add(asyncio.create_task(self._topology_at(waiting.pop(0))))

        for _ in range(REFRESH_FANOUT):
            ask_next()
        try:
            grace_ends: float | None = None  # no limit until the first answer
            while asking:
                timeout = None if grace_ends is None else max(grace_ends - loop.time(), 0.0)
                done, _ = await asyncio.wait(
                    asking, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break  # the grace after the first answer is over
                for task in done:
                    asking.discard(task)
                    if task.cancelled():  # the client is closing
                        errors.append(ConnectionClosed("a topology request was cancelled"))
                        continue
                    exc = task.exception()
                    if exc is None:
                        snapshots.append(task.result())
                    elif not isinstance(exc, HeadraceError):
                        raise exc  # a bug: the rest are retrieved below
                    elif not snapshots and not exc.retriable:
                        raise exc  # bad credentials or protocol version: another broker won't differ
                    else:
                        errors.append(exc)
                        if not snapshots:
                            ask_next()
                if snapshots and grace_ends is None:
                    grace_ends = loop.time() + REFRESH_GRACE_S
        finally:
            for task in asking:
                self._side_refreshes.add(task)  # left to finish (its connection is pooled)
                task.add_done_callback(self._side_done)
        if not snapshots:
            if len({type(e) for e in errors}) == 1:
                raise errors[0]  # one kind of failure (a timeout, say): that one
            raise ConnectionClosed("no broker reachable: " + "; ".join(map(str, errors)))
        newest = max(snapshots, key=lambda snap: snap.order)
        if not self.routing.apply(newest) and newest.order == self.routing.order:
            # Same generation (e.g. a Redirect patched the cache): take the broker's view.
            self.routing.topics = None
            self.routing.apply(newest)
        self._notify()

    def _side_done(self, task: asyncio.Task[msg.TopologySnapshot]) -> None:
        self._side_refreshes.discard(task)
        if not task.cancelled():
            task.exception()  # nobody waits for it: a failure is no news

    def _candidates(self) -> list[tuple[str, int]]:
        """Every broker address we know: open connections first, then the topology's
        brokers, the bootstrap list, and last the addresses whose connections closed
        (a broker gone or moved: a refresh must not spend its first tries there)."""
        out: list[tuple[str, int]] = []
        known = [(b.host, b.port) for b in (self.routing.brokers or {}).values()]
        open_ = [key for key, conn in self._pool.items() if not conn.is_closed]
        closed = [key for key, conn in self._pool.items() if conn.is_closed]
        for key in [*open_, *known, *self._bootstrap, *closed]:
            if key not in out:
                out.append(key)
        return out

    async def _topology(self, conn: ClientConnection) -> msg.TopologySnapshot:
        frame = await conn.request(Op.TOPOLOGY, b"{}")
        snapshot = msg.TopologySnapshot.decode(frame.body)
        if conn not in self.subscribed and not conn.is_closed:
            self.subscribed.add(conn)
            conn.close_listeners.append(self._subscription_closed)
        return snapshot

    def _subscription_closed(self, conn: ClientConnection) -> None:
        """A connection the brokers pushed topology changes on closed: ask again.

        Nothing else would. A client refreshes when a request fails, and a consumer when a
        connection it is a member on closes; but a broker that is drained before it stops
        (a rolling restart) loses its leaderships first, so a consumer leaves it while the
        connection is open, and no producer request goes there any more. Once every broker
        was restarted so, no connection the client asked for the topology on is left, the
        client hears of no leader change, and a consumer never joins the brokers that lead
        again (its cohort gets nothing of those partitions)."""
        self.subscribed.discard(conn)
        if self._closing:
            return
        self._resubscribe_wanted = True
        if self._resubscribing is None or self._resubscribing.done():
            self._resubscribing = asyncio.get_running_loop().create_task(self._resubscribe())

    async def _resubscribe(self) -> None:
        """Refresh until a refresh succeeds after the last such close: a refresh asks
        the open connections first, and each that answers pushes the changes from then on;
        the listeners hear of what changed while no push came. Refreshes are spaced (more
        when they fail), so that a broker that answers and hangs up at once costs little."""
        delay = 0.1
        while self._resubscribe_wanted and not self._closing:
            self._resubscribe_wanted = False
            try:
                await self.refresh()
                delay = 0.1
            except HeadraceError as exc:
                if not exc.retriable:
                    return  # bad credentials: the client's next request says so
                log.info("asking for the topology again failed: %s", exc)
                self._resubscribe_wanted = True
                delay = min(delay * 2, MAX_RESUBSCRIBE_BACKOFF_S)
            if self._resubscribe_wanted:
                await asyncio.sleep(delay)

    async def _topology_at(self, key: tuple[str, int]) -> msg.TopologySnapshot:
        try:
            return await self._topology(await self.connect(*key))
        except TokenRotated:
            # refused the token a pooled connection presented: a new one presents the
            # source's new token (and is refused if the broker does not take it either)
            return await self._topology(await self.connect(*key))

    def _notify(self) -> None:
        for listener in list(self.topology_listeners):
            listener()

    def _handle_push(self, conn: ClientConnection, frame: Frame) -> None:
        if frame.op == Op.TOPOLOGY_UPDATE:
            try:
                snapshot = msg.TopologySnapshot.decode(frame.body)
            except HeadraceError as exc:
                log.warning("ignoring malformed topology push: %s", exc)
                return
            if self.routing.apply(snapshot):
                self._notify()
            # Ack the generation the cache reflects now (never one it has not applied).
            generation = self.routing.generation
            self.acked_generations.append(generation)
            conn.send_no_reply(Op.TOPOLOGY_UPDATE_ACK, msg.TopologyUpdateAck(generation).encode())
            return
        handler = self._push_handlers.get(frame.op)
        if handler is not None:
            handler(conn, frame)

    async def close(self) -> None:
        self._closing = True
        if self._resubscribing is not None:
            self._resubscribing.cancel()
            await asyncio.gather(self._resubscribing, return_exceptions=True)
        if self._refreshing is not None:  # before the pool goes: it may still connect
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        for side in list(self._side_refreshes):
            side.cancel()
        for task in self._connecting.values():
            task.cancel()
        for conn in list(self._pool.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)
        self._pool.clear()
