"""Writing cohort cursors to disk: every ``cursor_flush_interval_ms`` the ones that
moved, and all of them at shutdown.

The flusher listens to the cursors of every hosted partition, so that a flush looks
at moved ones only, not at every partition five times a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from headrace.broker.topics import CursorStore, Partition

log = logging.getLogger(__name__)


class CursorFlusher:
    def __init__(self, hosted: Callable[[], list[Partition]], interval_ms: int) -> None:
        #: every partition hosted here
        self._hosted = hosted
        self._interval_s = interval_ms / 1000
        #: partitions whose cursors moved since the last flush, and those listened to
        self._moved: set[Partition] = set()
        self._watched: set[Partition] = set()
        #: a write failed: the next flush looks at every partition again
        self._sweep = False

    def watch(self) -> None:
        """Listen to the cursors of every partition hosted now (after a placement or a
        new topic), and no longer to those of partitions gone."""
        for p in self._hosted():
            if p not in self._watched:
                p.add_cursor_listener(self._cursor_moved)
                self._watched.add(p)
        hosted = set(self._hosted())
        for p in self._watched - hosted:
            p.remove_cursor_listener(self._cursor_moved)
        self._watched &= hosted
        self._moved &= hosted

    def _cursor_moved(self, p: Partition) -> None:
        self._moved.add(p)

    def flush_now(self, *, sync: bool) -> list[tuple[CursorStore, dict[str, int]]]:
        """The cursor snapshots due a write; ``sync``: every partition's, written here."""
        pending = []
        if sync or self._sweep:
            partitions: Iterable[Partition] = self._hosted()
            self._moved, self._sweep = set(), False
        else:
            partitions, self._moved = self._moved, set()
        for p in partitions:
            snap = p.cursors.snapshot_for_flush()
            if snap is not None:
                pending.append((p.cursors, snap))
        if sync:
            for store, snap in pending:
                store.write(snap)
        return pending

    async def run(self) -> None:
        """Flush forever, writing on a worker thread."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._interval_s)
            pending = self.flush_now(sync=False)
            for store, snap in pending:
                try:
                    await loop.run_in_executor(None, store.write, snap)
                except OSError as exc:
                    log.error("cursor flush failed: %s", exc)
                    self._sweep = True  # the store stays dirty: look at all again
