"""Replication between brokers: the topology a controller pushes, and the fetchers.

A cluster broker learns its partitions from a ``ClusterTopology`` document
(``protocol.coordination``; POST ``/v1/topology``, generation-fenced); ``replication.assigning`` plans what
changes and ``placing`` carries it out. For each partition it replicates
it is either the leader at an epoch or a follower of one. Followers pull from
their leader over one connection per broker pair (``ReplicaFetcher``), first
checking divergence with the leader-epoch cache and truncating to the common
prefix, then fetching from their log end. The leader side (``serve_fetch``,
``answer_epochs``) tracks follower progress in ``replication.leader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from headrace import clock
from headrace.aio import cancel_and_wait
from headrace.broker.fetch_sessions import FetchSession, PartitionKey
from headrace.broker.ports import LiveReplicasChanged, Publish, ReplicationHost
from headrace.broker.topics import Partition, Role
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import (
    CorruptBatch,
    HeadraceError,
    NotLeader,
    OffsetOutOfRange,
    RequestTimedOut,
    StaleEpoch,
    UnknownPartition,
    UnknownTopic,
)
from headrace.protocol import replication as rp
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.storage.log import PartitionLog, ReadPosition

log = logging.getLogger(__name__)

#: how often the LRS tick visits every led partition even when all followers fetch
FULL_TICK_MS = 30_000
#: how often a fetcher reads the partitions it follows again with no placement between
REREAD_S = 30.0

# --------------------------------------------------------------------------- follower side


class ReplicaFetcher:
    """Pulls every partition this broker follows from one leader, over one connection."""

    def __init__(
        self,
        broker: ReplicationHost,
        leader: BrokerEndpoint,
        placement_version: Callable[[], int] = lambda: 0,
    ) -> None:
        self.broker = broker
        self.leader = leader
        #: bumped on every placement: the partitions followed are read again then
        self._placement_version = placement_version
        self._conn: ClientConnection | None = None
        #: the replication token ``_conn`` authenticated with
        self._token: str | None = None
        self.errors = 0
        #: the followed partitions (``partitions``), as of placement ``_seen_version``
        self._followed: list[Partition] = []
        self._seen_version = -1
        self._read_at = 0.0
        #: the connection the leader holds our fetch session on, and the positions it
        #: holds there, (epoch, offset) by partition
        self._session_conn: ClientConnection | None = None
        self._sent: dict[PartitionKey, tuple[int, int]] = {}
        #: the partitions past their divergence check, by key, as of reading ``_ready_of``
        self._ready_map: dict[PartitionKey, Partition] = {}
        self._ready_of: list[Partition] | None = None
        #: the reading whose partitions all passed their divergence check
        self._checked: list[Partition] | None = None
        #: keys whose position the next fetch compares with what the leader holds
        self._recheck: set[PartitionKey] = set()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"fetch-from-{leader.id}"
        )

    def partitions(self) -> list[Partition]:
        """The partitions followed from this leader: read again after a placement, or
        ``REREAD_S`` after the last reading (not on every fetch: that is every partition
        hosted, twice a second)."""
        now = asyncio.get_running_loop().time()
        version = self._placement_version()
        if version != self._seen_version or now - self._read_at >= REREAD_S:
            self._seen_version, self._read_at = version, now
            self._followed = [
                p
                for p in self.broker.registry.all_partitions()
                if p.role is Role.FOLLOWER and p.leader_id == self.leader.id and not p.moving
            ]
        return self._followed

    def _ready(self, partitions: list[Partition]) -> dict[PartitionKey, Partition]:
        """The partitions past their divergence check, by key: read again for a new
        reading of the followed partitions or after a check passed, not on every fetch."""
        if self._ready_of is not partitions:
            self._ready_of = partitions
            self._ready_map = {
                (p.topic.name, p.index): p
                for p in partitions
                if p.truncated_for_epoch == p.leader_epoch
            }
            self._recheck = set(self._ready_map)
        return self._ready_map

    async def _connect(self) -> ClientConnection:
        token = self.broker.replication_token
        if self._conn is not None and not self._conn.is_closed and token != self._token:
            # A rotated token (the file's first line changed): hang up and present the new
            # one, so no connection still relies on the old one when it is removed.
            if self._conn.transport is not None:
                self._conn.transport.close()
            self._conn = None
        if self._conn is None or self._conn.is_closed:
            self._token = token
            options = ConnectOptions(
                client_id=f"replica-{self.broker.settings.broker_id}",
                auth_token=token,
                ssl=self.broker.client_ssl_context(),
                connect_timeout_s=3.0,
                # a fetch long-polls up to replica_fetch_wait_ms; an answer later than a few
                # seconds past that means a half-dead leader connection: drop it, reconnect
                request_timeout_s=self.broker.settings.replica_fetch_wait_ms / 1000 + 5.0,
            )
            self._conn = await ClientConnection.open(self.leader.host, self.leader.port, options)
        return self._conn

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            partitions = self.partitions()
            if not partitions:
                await asyncio.sleep(0.1)
                continue
            try:
                conn = await self._connect()
                await self._truncate_diverged(conn, partitions)
                await self._fetch_once(conn, partitions)
                backoff = 0.05
            except (HeadraceError, OSError) as exc:
                self.errors += 1
                log.debug("fetch from broker %s failed: %s", self.leader.id, exc)
                conn_now = self._conn
                if isinstance(exc, RequestTimedOut) and conn_now and conn_now.transport:
                    # half-dead: hang up (is_closed from now on) and reconnect next round
                    conn_now.transport.close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            except Exception:
                # Never let replication from this leader stop silently.
                self.errors += 1
                log.exception("replica fetcher for broker %s failed; retrying", self.leader.id)
                await asyncio.sleep(1.0)

    async def _truncate_diverged(self, conn: ClientConnection, partitions: list[Partition]) -> None:
        """Cut each newly-following partition back to the prefix it shares with the leader."""
        if partitions is self._checked:
            return  # every partition of this reading passed its divergence check
        pending = [p for p in partitions if p.truncated_for_epoch != p.leader_epoch]
        if pending:
            self._ready_of = None  # some may pass now: ``_ready`` reads them again
        else:
            self._checked = partitions
        rounds = 0
        while pending and rounds < 16:
            rounds += 1
            asked = {id(p): (p.leader_epoch, p.leader_id) for p in pending}
            queries = [
                rp.EpochQuery(
                    p.topic.name, p.index, p.log.epochs.latest_epoch if p.log.epochs else -1
                )
                for p in pending
            ]
            frame = await conn.request(Op.OFFSET_FOR_EPOCH, rp.encode_epoch_queries(queries))
            answers = {(a.topic, a.partition): a for a in rp.decode_epoch_answers(frame.body)}
            still = []
            for p, q in zip(pending, queries, strict=True):
                a = answers.get((p.topic.name, p.index))
                if a is None or a.error:
                    continue  # the leader is not ready yet; try again next round
                if not self._unchanged(p, *asked[id(p)]):
                    continue  # leadership moved while we asked: the answer is about the old leader
                if q.epoch < 0 or (a.end_offset >= p.log.next_offset and a.epoch == q.epoch):
                    p.truncated_for_epoch = p.leader_epoch
                    continue
                cut = min(a.end_offset, p.log.next_offset)
                if cut < p.log.next_offset:
                    log.warning(
                        "truncating %s from %d to %d (diverged from leader %s)",
                        p.name,
                        p.log.next_offset,
                        cut,
                        self.leader.id,
                    )
                    p.log.truncate_to(cut)
                    # Never leave a high watermark above what the log now holds.
                    p.high_watermark = min(p.high_watermark, cut)
                    p.leader_high_watermark = min(p.leader_high_watermark, cut)
                    self.broker.metrics.truncations.inc()
                    p.appended()  # the log end moved (heartbeat report, listeners)
                if a.epoch == q.epoch or a.epoch < 0:
                    p.truncated_for_epoch = asked[id(p)][0]
                else:
                    still.append(p)  # ask again about the epoch we now end with
            pending = still

    async def _fetch_once(self, conn: ClientConnection, partitions: list[Partition]) -> None:
        """One fetch over the session (``protocol.replication``): the positions that
        changed since the leader last heard them, or all of them on a new connection."""
        ready = self._ready(partitions)
        if not ready:
            await asyncio.sleep(0.05)
            return
        incremental = self._session_conn is conn
        if not incremental:
            self._sent = {}
            self._recheck = set(ready)
        sent = self._sent
        # Only positions that may have moved: those this fetcher appended to, truncated or
        # was refused (``_recheck``), and all of them after a new reading or on a new
        # session. Not every followed partition on every fetch.
        recheck, self._recheck = self._recheck, set()
        positions = []
        for key in recheck:
            p = ready.get(key)
            if p is None:
                continue
            position = (p.leader_epoch, p.log.next_offset)
            if sent.get(key) != position:
                sent[key] = position
                positions.append(rp.FetchPosition(key[0], key[1], *position))
        # every key sent and no longer ready (not only when there are more of them: one may
        # leave as another arrives); the leader must stop crediting this fetch to it
        forgotten = list(sent.keys() - ready.keys())
        for key in forgotten:
            del sent[key]
        request = rp.ReplicaFetch(
            self.broker.settings.broker_id,
            self.broker.settings.replica_fetch_wait_ms,
            positions,
            incremental,
            forgotten,
        )
        self._session_conn = conn
        try:
            frame = await conn.request(Op.REPLICA_FETCH, request.encode())
            response = rp.ReplicaFetchOk.decode(frame.body)
        except BaseException:
            self._session_conn = None  # what the leader holds is unknown: start over
            raise
        if response.session_reset:
            self._session_conn = None
            return
        # Every partition this answer names may move (appended, reset, refused): look again.
        self._recheck.update((e.topic, e.partition) for e in response.partitions)
        for entry in response.partitions:
            key = (entry.topic, entry.partition)
            found = ready.get(key)
            asked = sent.get(key)
            if found is None or asked is None:
                continue
            p = found
            epoch, end = asked
            if not self._unchanged(p, epoch, self.leader.id) or p.log.next_offset != end:
                sent.pop(key, None)  # name it again next time: the leader may not resend
                continue  # moved, dropped or already advanced while the fetch was out
            if entry.error or len(entry.data):
                # Not taken, or taken: either way the next fetch names its position again
                # (the leader answers a named partition whether or not it has news).
                sent.pop(key, None)
            if entry.error == OffsetOutOfRange.CODE and entry.log_start_offset > p.log.next_offset:
                log.warning(
                    "%s: log end %d is below leader %s's log start %d; restarting the log there",
                    p.name,
                    p.log.next_offset,
                    self.leader.id,
                    entry.log_start_offset,
                )
                p.log.reset_to(entry.log_start_offset)
                self.broker.metrics.truncations.inc()
                p.appended()  # the log end moved (heartbeat report, listeners)
                continue
            if entry.error:
                if entry.error == StaleEpoch.CODE and entry.epoch < p.leader_epoch:
                    await asyncio.sleep(0.05)  # the leader has not heard of our epoch yet
                continue
            # Only news wakes listeners: an idle answer must not touch every partition.
            moved = len(entry.data) > 0 or entry.high_watermark != p.leader_high_watermark
            if len(entry.data):
                for pos, header in rb.scan(entry.data):
                    if not rb.crc_ok(entry.data, header, pos):
                        raise CorruptBatch(
                            f"{p.name}: batch at offset {header.base_offset} from broker"
                            f" {self.leader.id} failed its CRC; not appended"
                        )
            # The leader's cutover, kept (on disk) before its records: if this copy leads
            # next, the version's records begin there, not at our log end (``Placer._lead``).
            p.record_cutover(entry.cutover)
            if len(entry.data):
                p.log.append_stamped(entry.data)
                self.broker.committer.appended(p)
            if entry.cursors is not None:
                for cohort, cursor in entry.cursors.items():
                    p.cursors.set(cohort, cursor)
            p.leader_high_watermark = entry.high_watermark
            if moved:
                p.appended()

    def _unchanged(self, p: Partition, epoch: int, leader: int) -> bool:
        """Still a follower of the same leader at the same epoch, and still hosted here."""
        return (
            p.role is Role.FOLLOWER
            and p.leader_epoch == epoch
            and p.leader_id == leader
            and p.topic.partitions.get(p.index) is p
            and self.broker.registry.topics.get(p.topic.name) is p.topic
        )

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 2)


class Replication:
    """The fetchers of one broker, the leader side of replica fetches, and the leader's
    periodic LRS checks."""

    def __init__(self, broker: ReplicationHost, publish: Publish) -> None:
        self.broker = broker
        #: where live replica set changes are reported
        self.publish = publish
        self.fetchers: dict[int, ReplicaFetcher] = {}
        #: (follower id, partition name) -> the cursor version last sent to that follower
        self.cursor_versions_sent: dict[tuple[int, str], int] = {}
        #: (follower id, partition name) -> (the log, the leader epoch, where the last read
        #: for that follower stopped). A follower fetches from exactly where the previous
        #: answer ended, so this saves the segment index lookup and the scan chunk it reads
        #: (up to 1 MiB, the very bytes then read again) on every replica fetch.
        self.read_hints: dict[tuple[int, str], tuple[PartitionLog, int, ReadPosition]] = {}
        #: follower broker id -> its last fetch over a session (``LeaderReplicaSet.tick``)
        self.fetched_ms: dict[int, int] = {}
        #: follower broker id -> its session on this leader: a fetch credits only the
        #: partitions that session holds (``_fetched_for``)
        self.sessions: dict[int, FetchSession] = {}
        #: led partitions whose log end moved since the last LRS tick
        self._appended: set[Partition] = set()
        #: every led partition with followers, as of the last placement
        self._led: list[Partition] = []
        self._full_tick_ms = 0
        #: the follower broker ids of ``_led``
        self._followers: set[int] = set()
        #: every follower fetched lately at the last tick
        self._quiet = False
        #: bumped on every placement: fetchers re-read what they follow
        self.placement_version = 0
        self._tick_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._tick_task = asyncio.get_running_loop().create_task(
            self._tick_forever(), name="lrs-tick"
        )

    # ------------------------------------------------------------------ leader side

    def serve_fetch(self, request: rp.ReplicaFetch) -> rp.ReplicaFetchOk:
        """Answer one sessionless replica fetch without waiting (every position)."""
        now = clock.monotonic_ms()
        out = rp.ReplicaFetchOk()
        for pos in request.positions:
            out.partitions.append(self._serve_one(request.follower_id, pos, now))
        return out

    def open_session(self, request: rp.ReplicaFetch, session: FetchSession | None) -> FetchSession:
        """The connection's session after ``request``: a full fetch starts a new one."""
        if not request.incremental:
            if session is not None:
                session.close()
            session = FetchSession(request.follower_id)
        assert session is not None
        for key in request.forgotten:
            session.forget(key)
            # no longer fetched: the next tick must look at it (silence), not wait for the
            # full pass, as an idle partition would
            forgotten = self._led_partition(key)
            if forgotten is not None:
                self._appended.add(forgotten)
        for pos in request.positions:
            session.positions[(pos.topic, pos.partition)] = pos
        return session

    def serve_session(
        self, session: FetchSession, asked: Iterable[tuple[str, int]]
    ) -> rp.ReplicaFetchOk:
        """Answer a session fetch without waiting: the ``asked`` partitions, and those
        whose leader side moved since the session's last answer (marked by listeners)."""
        now = clock.monotonic_ms()
        self.fetched_ms[session.follower_id] = now
        self.sessions[session.follower_id] = session
        asked = set(asked)
        examine, session.dirty = asked | session.dirty, set()
        self.broker.metrics.replica_fetches.inc()
        self.broker.metrics.replica_fetch_partitions.inc(len(examine))
        out = rp.ReplicaFetchOk()
        registry = self.broker.registry
        for key in examine:
            pos = session.positions.get(key)
            if pos is None:
                continue
            topic = registry.topics.get(key[0])
            partition = topic.partitions.get(key[1]) if topic is not None else None
            if partition is not None:
                session.listen(key, partition)
            entry = self._serve_one(session.follower_id, pos, now)
            state = (entry.high_watermark, entry.log_end_offset, entry.log_start_offset)
            if (
                key in asked
                or entry.error
                or len(entry.data)
                or entry.cursors is not None
                or session.sent.get(key) != state
            ):
                session.sent[key] = state
                out.partitions.append(entry)
        return out

    def _serve_one(self, follower_id: int, pos: rp.FetchPosition, now: int) -> rp.FetchedPartition:
        entry = rp.FetchedPartition(pos.topic, pos.partition)
        try:
            partition = self.broker.registry.get(pos.topic).partition(pos.partition)
        except (UnknownTopic, UnknownPartition) as exc:
            entry.error, entry.message = exc.CODE, exc.message
            return entry
        entry.epoch = partition.leader_epoch
        reopening = partition.tiering is not None and partition.tiering.reopening is not None
        if partition.role is not Role.LEADER or partition.replica_set is None or reopening:
            entry.error, entry.message = (
                NotLeader.CODE,
                f"broker {self.broker.settings.broker_id} does not lead {partition.name}",
            )
            return entry
        if pos.epoch != partition.leader_epoch:
            entry.error = StaleEpoch.CODE
            entry.message = (
                f"{partition.name}: follower at epoch {pos.epoch},"
                f" leader at {partition.leader_epoch}"
            )
            return entry
        plog = partition.log
        if pos.offset < plog.log_start_offset:
            # The follower needs records retention already deleted: it must restart its
            # log at our log start (answered with where that is).
            entry.error = OffsetOutOfRange.CODE
            entry.message = f"offset {pos.offset} is below log start {plog.log_start_offset}"
            entry.log_start_offset = plog.log_start_offset
            return entry
        if pos.offset > plog.next_offset:
            entry.error, entry.message = (
                StaleEpoch.CODE,
                f"follower offset {pos.offset} beyond leader end {plog.next_offset}",
            )
            return entry
        if partition.replica_set.on_fetch(follower_id, pos.offset, plog.next_offset, now):
            self.publish(LiveReplicasChanged(partition))
        partition.advance_high_watermark()
        if pos.offset < plog.next_offset:
            key = (follower_id, partition.name)
            known = self.read_hints.get(key)
            hint = (
                known[2]
                if known is not None and known[0] is plog and known[1] == partition.leader_epoch
                else None
            )
            data, hint = plog.read(pos.offset, pos.max_bytes, hint=hint)
            if hint is not None:
                self.read_hints[key] = (plog, partition.leader_epoch, hint)
        else:
            data = b""
        entry.data = data
        # After the read, with no await between: data past a cutover goes with it.
        entry.cutover = partition.cutover
        entry.high_watermark = partition.high_watermark
        entry.log_end_offset = plog.next_offset
        entry.log_start_offset = plog.log_start_offset
        sent = self.cursor_versions_sent.get((follower_id, partition.name))
        if sent != partition.cursors.version:
            entry.cursors = partition.cursors.all()
            self.cursor_versions_sent[(follower_id, partition.name)] = partition.cursors.version
        return entry

    def answer_epochs(self, queries: list[rp.EpochQuery]) -> list[rp.EpochAnswer]:
        answers = []
        for q in queries:
            try:
                partition = self.broker.registry.get(q.topic).partition(q.partition)
            except (UnknownTopic, UnknownPartition) as exc:
                answers.append(rp.EpochAnswer(q.topic, q.partition, -1, -1, exc.CODE))
                continue
            if partition.role is not Role.LEADER or partition.log.epochs is None:
                answers.append(rp.EpochAnswer(q.topic, q.partition, -1, -1, NotLeader.CODE))
                continue
            epoch, end = partition.log.epochs.end_offset_for(q.epoch, partition.log.next_offset)
            answers.append(rp.EpochAnswer(q.topic, q.partition, epoch, end))
        return answers

    # ------------------------------------------------------------------ follower side

    def reconcile(self) -> None:
        """Run one fetcher per broker this one follows partitions from."""
        self.placement_version += 1
        led = [
            p
            for p in self.broker.registry.all_partitions()
            if p.role is Role.LEADER and p.replica_set is not None
        ]
        for p in led:
            p.remove_append_listener(self._note_append)
            p.add_append_listener(self._note_append)
        self._led = led
        self._followers = {f for p in led if p.replica_set for f in p.replica_set.followers}
        self._full_tick_ms = 0
        leaders = {
            p.leader_id
            for p in self.broker.registry.all_partitions()
            if p.role is Role.FOLLOWER and p.leader_id >= 0
        }
        for leader_id in list(self.fetchers):
            endpoint = self.broker.endpoint(leader_id)
            if leader_id not in leaders or endpoint != self.fetchers[leader_id].leader:
                fetcher = self.fetchers.pop(leader_id)
                asyncio.get_running_loop().create_task(fetcher.close())
        for leader_id in leaders:
            endpoint = self.broker.endpoint(leader_id)
            if leader_id not in self.fetchers and endpoint is not None:
                self.fetchers[leader_id] = ReplicaFetcher(
                    self.broker, endpoint, lambda: self.placement_version
                )

    def _note_append(self, p: Partition) -> None:
        self._appended.add(p)

    def _fetched_for(self, p: Partition) -> dict[int, int]:
        """Each follower's last session fetch, for the followers whose session holds ``p``:
        a fetch proves a follower alive (and, idle, caught up) only for the partitions it
        fetches. One that stopped fetching ``p`` (not ready, moving, a topology not yet
        applied) is then judged by its last fetch of ``p`` alone, and falls silent."""
        key = (p.topic.name, p.index)
        return {
            f: t
            for f, t in self.fetched_ms.items()
            if (session := self.sessions.get(f)) is not None and key in session.positions
        }

    def _led_partition(self, key: tuple[str, int]) -> Partition | None:
        topic = self.broker.registry.topics.get(key[0])
        return topic.partitions.get(key[1]) if topic is not None else None

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            self.tick(clock.monotonic_ms())

    def tick(self, now: int) -> None:
        """LRS upkeep. Every led partition when some follower may have gone silent (its
        session's last fetch is half the silence bound old, or it has none), or every
        ``FULL_TICK_MS``; otherwise only those appended to since (only they can lag).
        An idle broker so does no work per partition here."""
        silence = self.broker.settings.replica_fetch_silence_max_ms
        quiet = all(now - self.fetched_ms.get(f, -silence) < silence // 2 for f in self._followers)
        # One more full pass once all are back: an idle partition's follower rejoins there.
        was_quiet, self._quiet = self._quiet, quiet
        if quiet and was_quiet and now - self._full_tick_ms < FULL_TICK_MS:
            visit: Iterable[Partition] = self._appended
        else:
            visit = self._led
            self._full_tick_ms = now
        self._appended = set()
        for p in visit:
            rs = p.replica_set
            if p.role is not Role.LEADER or rs is None:
                continue
            leo = p.log.next_offset
            fetched = self._fetched_for(p)
            removed = rs.tick(leo, now, fetched)
            added = rs.rejoin(leo, now, fetched)
            if removed:
                log.warning("%s: followers %s left the live replica set", p.name, sorted(removed))
            if removed or added:
                self.publish(LiveReplicasChanged(p))
                p.advance_high_watermark()
            if any(rs.followers[f].leo < leo for f in rs.lrs if f != rs.leader_id):
                self._appended.add(p)  # still lagging: look again next tick

    async def close(self) -> None:
        await cancel_and_wait(self._tick_task)
        for fetcher in list(self.fetchers.values()):
            await fetcher.close()
        self.fetchers.clear()
