"""Leader-epoch cache of one partition log: which epoch wrote which offsets.

Entries are ``(epoch, start_offset)``: epoch E's records start at that offset
and end where the next entry starts (or at the log end). A follower whose log
may have diverged from a new leader asks the leader for the end offset of the
follower's latest epoch and truncates there, so no replica keeps a record the
new leader does not have. Written rarely (once per leadership change), so the
file is rewritten atomically on each change.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from headrace import files

EPOCH_FILE = "leader-epochs.json"


class LeaderEpochCache:
    def __init__(self, directory: Path) -> None:
        self._path = directory / EPOCH_FILE
        self.entries: list[tuple[int, int]] = []
        try:
            raw = json.loads(self._path.read_text())
            self.entries = [(int(e), int(o)) for e, o in raw]
        except FileNotFoundError:
            pass
        except (ValueError, TypeError):
            self.entries = []  # rebuilt from batch headers by recovery

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Epoch ``epoch`` starts writing at ``start_offset`` (no-op unless it is newer)."""
        if epoch <= self.latest_epoch:
            return
        self.entries.append((epoch, start_offset))
        self._persist()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, the offset where that epoch's records end).

        With no such epoch, (-1, start of the first known epoch or the log end).
        """
        epochs = [e for e, _ in self.entries]
        i = bisect.bisect_right(epochs, epoch)
        if i == 0:
            return -1, self.entries[0][1] if self.entries else log_end_offset
        found = self.entries[i - 1][0]
        end = self.entries[i][1] if i < len(self.entries) else log_end_offset
        return found, end

    def truncate_from(self, offset: int) -> None:
        """The log was cut at ``offset``: forget epochs that start at or after it."""
        kept = [(e, o) for e, o in self.entries if o < offset]
        if kept != self.entries:
            self.entries = kept
            self._persist()

    def _persist(self) -> None:
        files.write_json_atomic(self._path, self.entries)
