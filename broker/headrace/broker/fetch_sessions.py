"""A follower connection's replica fetch session, as its leader keeps it.

See ``protocol.replication`` for the protocol (Kafka's KIP-227 fetch
sessions, the connection standing for the session id) and ``replicating``
for the leader side that serves it.
"""

from __future__ import annotations

from collections.abc import Callable

from headrace.broker.topics import Partition
from headrace.protocol import replication as rp

PartitionKey = tuple[str, int]


class FetchSession:
    """A follower connection's fetch session, on the leader (``protocol.replication``).

    It holds the follower's last position in every partition it fetches, and
    listens to those partitions: an append, a moved high watermark or a cursor
    marks the partition *dirty* and wakes a parked long poll. A fetch then
    looks at the partitions it names and the dirty ones only.
    """

    def __init__(self, follower_id: int) -> None:
        self.follower_id = follower_id
        self.positions: dict[PartitionKey, rp.FetchPosition] = {}
        #: (high watermark, log end, log start) last answered, per partition
        self.sent: dict[PartitionKey, tuple[int, int, int]] = {}
        self.dirty: set[PartitionKey] = set()
        #: a parked long poll's completion (called once, on the first mark)
        self.wake: Callable[[], None] | None = None
        self._listened: dict[PartitionKey, Partition] = {}

    def mark(self, p: Partition) -> None:
        self.dirty.add((p.topic.name, p.index))
        wake, self.wake = self.wake, None
        if wake is not None:
            wake()

    def listen(self, key: PartitionKey, p: Partition) -> None:
        held = self._listened.get(key)
        if held is p:
            return
        if held is not None:
            self._unlisten(held)
        p.add_append_listener(self.mark)
        p.add_listener(self.mark)
        p.add_cursor_listener(self.mark)
        self._listened[key] = p

    def _unlisten(self, p: Partition) -> None:
        p.remove_append_listener(self.mark)
        p.remove_listener(self.mark)
        p.remove_cursor_listener(self.mark)

    def forget(self, key: PartitionKey) -> None:
        self.positions.pop(key, None)
        self.sent.pop(key, None)
        self.dirty.discard(key)
        held = self._listened.pop(key, None)
        if held is not None:
            self._unlisten(held)

    def close(self) -> None:
        self.wake = None
        for p in self._listened.values():
            self._unlisten(p)
        self._listened.clear()
