"""Retention of every hosted partition, every ``retention_check_interval_ms``: in the
object store first (leaders of tiered partitions), then of the local log, which may
delete only what the object store already holds.

One partition's failure is logged and the sweep goes on to the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from headrace.broker.tier_upload import Uploader
from headrace.broker.topics import Partition
from headrace.errors import HeadraceError, StorageError

log = logging.getLogger(__name__)


class RetentionSweeper:
    def __init__(
        self,
        hosted: Callable[[], list[Partition]],
        uploader: Uploader,
        log_start_moved: Callable[[Partition], None],
        interval_ms: int,
    ) -> None:
        #: every partition hosted here
        self._hosted = hosted
        self._uploader = uploader
        #: told of a partition whose log start clients see moved (its report changed)
        self._log_start_moved = log_start_moved
        self._interval_ms = interval_ms

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_ms / 1000)
            for p in self._hosted():
                await self._sweep(p)

    async def _sweep(self, p: Partition) -> None:
        if p.tiering is not None and not p.moving:
            try:
                # the whole log's retention, in the object store (leaders only)
                if await self._uploader.apply_retention(p):
                    self._log_start_moved(p)
            except Exception as exc:
                expected = isinstance(exc, HeadraceError)
                log.warning(
                    "retention in the tier on %s failed: %s", p.name, exc, exc_info=not expected
                )
        if p.moving or not p.log.retention_due():
            return  # nothing to delete: no manifest read
        try:
            # Tiered: only what the object store already holds may go.
            floor = await self._uploader.refresh_floor(p)
            if p.moving or p.topic.partitions.get(p.index) is not p:
                return
            deleted = p.log.apply_retention(upload_floor=floor)
        except StorageError as exc:
            log.error("retention on %s failed: %s", p.name, exc)
            return
        except Exception:
            # One partition's failure must not end retention for all of them.
            log.exception("retention on %s failed", p.name)
            return
        if deleted:
            self._log_start_moved(p)
            log.info("retention deleted %d segments of %s", len(deleted), p.name)
