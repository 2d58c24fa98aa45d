"""The manifest of a partition's segment objects, and its sealed state (pure: values and JSON).

The manifest is the one object readers trust: an object that is not listed in
it does not exist for them, whatever a listing of the bucket shows. It is
replaced as a whole (``ObjectStore.put`` is atomic), so the rules for changing
it live here, apart from the I/O (``tier.PartitionTier`` does that):

- **Merge, and put only over the version read.** A writer reads the stored
  manifest with its version and puts ``stored.merged(mine)`` with a
  conditional write (``ObjectStore.put_if_version``): if anyone wrote in
  between, the put is refused and the writer reads and merges again. No
  writer's entry is ever overwritten.
- **Fencing.** The manifest carries the highest leader epoch that wrote it. A
  writer whose epoch is lower has been deposed and must stop:
  ``admitting`` and ``trimmed`` raise ``FencedUploader`` instead of merging.
- **Retention trims the start.** ``retained_from`` is the lowest offset the
  tier still keeps: retention raises it (``trimmed``) and drops the entries
  wholly below it; their objects are deleted after a grace period, by the
  writer that trimmed. Offsets below it are gone for every reader, and the
  checkpoint of a manifest trimmed empty is ``retained_from - 1``, so a new
  leader never hands out those offsets again.
- **Overlaps are allowed.** After a leadership change two leaders may upload
  overlapping ranges of the same committed log. Committed records are the
  same bytes on every replica, so any object that holds an offset is a correct
  place to read it from; ``covering`` picks one deterministically.

``SealedState`` is what a leader writes beside the manifest when its partition
is sealed for a move (unloaded): where the log ended, and the cursors and
producer state the next owner continues from.

JSON field names are camelCase, like the custom resources; ``from_json``
rejects a malformed document with ``InvalidManifest`` naming the field.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.errors import HeadraceError, InvalidRequest
from headrace.objectstore.errors import InvalidObjectKey
from headrace.objectstore.keys import validate_key
from headrace.records.batch import HEADER_SIZE

#: the document format written; a reader refuses any other
FORMAT: Final = 1
#: the largest offset the batch format can hold (base_offset is a u64)
MAX_OFFSET: Final = 2**64 - 1


# --- errors (codes 80-89; like the object store's, not wire errors) ---


class InvalidManifest(InvalidRequest):
    """A manifest or sealed-state document (or value) is malformed; the message names the field."""

    CODE = 80


class FencedUploader(HeadraceError):
    """The stored manifest was written by a newer leader epoch: this (deposed) leader must
    stop writing to the partition's tier."""

    CODE = 81
    retriable = False


# --- values ---


def _check_int(name: str, value: object, minimum: int, maximum: int = MAX_OFFSET) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidManifest(f"{name}: expected an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise InvalidManifest(f"{name}: {value} is outside {minimum}..{maximum}")
    return value


@dataclass(frozen=True, slots=True)
class SegmentObject:
    """One uploaded segment object: offsets ``base..last`` inclusive, ``size`` bytes,
    uploaded under ``key`` by a leader at ``epoch``."""

    base: int
    last: int
    size: int
    key: str
    epoch: int
    #: written by key compaction (keep the last record per key): the batches'
    #: offsets rise but have holes where records were dropped
    compacted: bool = False
    #: the largest record timestamp in the object, ms since the Unix epoch; -1:
    #: unknown (written before it was recorded), so retention by age skips it
    max_timestamp: int = -1

    def __post_init__(self) -> None:
        _check_int("base", self.base, 0)
        _check_int("last", self.last, self.base)
        # a segment object holds at least one whole batch
        _check_int("size", self.size, HEADER_SIZE)
        _check_int("epoch", self.epoch, 0, 2**31 - 1)
        if not isinstance(self.key, str):
            raise InvalidManifest(f"key: expected a string, got {self.key!r}")
        if not isinstance(self.compacted, bool):
            raise InvalidManifest(f"compacted: expected true or false, got {self.compacted!r}")
        _check_int("maxTimestamp", self.max_timestamp, -1, 2**63 - 1)
        try:
            validate_key(self.key)
        except InvalidObjectKey as exc:
            raise InvalidManifest(f"key: {exc.message}") from exc

    @property
    def next_offset(self) -> int:
        return self.last + 1

    def holds(self, offset: int) -> bool:
        return self.base <= offset <= self.last

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "base": self.base,
            "last": self.last,
            "size": self.size,
            "key": self.key,
            "epoch": self.epoch,
        }
        if (
            self.compacted
        ):  # absent when false: the documents of uncompacted topics stay as they were
            doc["compacted"] = True
        if self.max_timestamp >= 0:
            doc["maxTimestamp"] = self.max_timestamp
        return doc

    @classmethod
    def from_doc(cls, doc: object) -> SegmentObject:
        fields = _object(doc, "segment", ("base", "last", "size", "key", "epoch"))
        return cls(
            base=fields["base"],
            last=fields["last"],
            size=fields["size"],
            key=fields["key"],
            epoch=fields["epoch"],
            compacted=fields.get("compacted", False),
            max_timestamp=fields.get("maxTimestamp", -1),
        )


def _order(seg: SegmentObject) -> tuple[int, int, int, str]:
    # by base; among equal bases the newest epoch and the longest object come
    # last, which is where ``covering``'s backward scan looks first
    return (seg.base, seg.epoch, seg.last, seg.key)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The live segment objects of one partition, sorted by base offset.

    ``epoch`` is the highest leader epoch that wrote this manifest (-1: none
    yet); ``version`` counts writes, for diagnostics; ``retained_from`` is the
    lowest offset retention keeps (0: never trimmed). Objects may overlap (see
    the module docstring); keys are unique; none lies wholly below
    ``retained_from``.
    """

    segments: tuple[SegmentObject, ...] = ()
    epoch: int = -1
    version: int = 0
    retained_from: int = 0
    _bases: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: _reach[i]: the highest ``last`` among segments[0..i]; bounds covering's scan
    _reach: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _checkpoint: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("epoch", self.epoch, -1, 2**31 - 1)
        _check_int("version", self.version, 0)
        _check_int("retainedFrom", self.retained_from, 0)
        segments = tuple(sorted(self.segments, key=_order))
        keys = {s.key for s in segments}
        if len(keys) != len(segments):
            raise InvalidManifest("segments: the same key is listed twice")
        for s in segments:
            if s.last < self.retained_from:
                raise InvalidManifest(
                    f"segments: {s.key} lies below retainedFrom {self.retained_from}"
                )
        reach: list[int] = []
        high = -1
        for s in segments:
            high = max(high, s.last)
            reach.append(high)
        checkpoint = self.retained_from - 1
        if segments:
            checkpoint = max(segments[0].base, self.retained_from) - 1
            for s in segments:
                if s.base > checkpoint + 1:
                    break
                checkpoint = max(checkpoint, s.last)
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "_bases", tuple(s.base for s in segments))
        object.__setattr__(self, "_reach", tuple(reach))
        object.__setattr__(self, "_checkpoint", checkpoint)

    # --- questions ---

    @property
    def start_offset(self) -> int | None:
        """The lowest offset a reader can get from the tier; None for an empty manifest."""
        if not self.segments:
            return None
        return max(self.segments[0].base, self.retained_from)

    @property
    def checkpoint(self) -> int:
        """The last offset of the contiguous run of objects from ``start_offset``
        (``retained_from - 1`` when empty): everything up to here is in the tier
        with no hole, or was and retention removed it. This is the uploader's
        checkpoint; it resumes at ``checkpoint + 1``."""
        return self._checkpoint

    @property
    def end_offset(self) -> int:
        """The highest offset any object holds (-1 when empty); above
        ``checkpoint`` only if there are gaps."""
        return self._reach[-1] if self._reach else -1

    def covering(self, offset: int) -> SegmentObject | None:
        """The object to read ``offset`` from: among those holding it, the one with
        the largest base (ties: newest epoch, then longest); None if none holds it
        (or retention removed it)."""
        if offset < self.retained_from:
            return None
        i = bisect_right(self._bases, offset) - 1
        while i >= 0 and self._reach[i] >= offset:
            seg = self.segments[i]
            if seg.last >= offset:
                return seg
            i -= 1
        return None

    def find(self, key: str) -> SegmentObject | None:
        for seg in self.segments:
            if seg.key == key:
                return seg
        return None

    def gaps(self) -> tuple[tuple[int, int], ...]:
        """Holes between ``start_offset`` and ``end_offset``, as inclusive
        ``(first, last)`` ranges: offsets no object holds. Empty in a healthy
        manifest; for diagnostics and tests."""
        holes: list[tuple[int, int]] = []
        reached: int | None = None
        for seg in self.segments:
            if reached is not None and seg.base > reached + 1:
                holes.append((reached + 1, seg.base - 1))
            reached = seg.last if reached is None else max(reached, seg.last)
        return tuple(holes)

    # --- changes (each returns a new manifest) ---

    def chain(self) -> tuple[SegmentObject, ...]:
        """The objects a reader reads from ``start_offset`` to the checkpoint, in
        order (``covering`` of each next offset): overlapped leftovers are skipped."""
        found: list[SegmentObject] = []
        offset = self.start_offset
        if offset is None:
            return ()
        while offset <= self.checkpoint:
            seg = self.covering(offset)
            if seg is None:  # cannot happen below the checkpoint
                break
            found.append(seg)
            offset = seg.last + 1
        return tuple(found)

    def with_segment(self, seg: SegmentObject) -> Manifest:
        """This manifest with ``seg`` added (replacing an entry with the same key);
        epoch and version unchanged."""
        kept = tuple(s for s in self.segments if s.key != seg.key)
        return Manifest((*kept, seg), self.epoch, self.version, self.retained_from)

    def merged(self, other: Manifest) -> Manifest:
        """The union of both by key, at the higher epoch and the next version.

        For a key listed in both, the entry with the higher epoch wins, and
        ``other``'s on a tie: a key names an offset range, and committed records
        are the same bytes whoever uploaded them, so the entries differ at most
        in who wrote them. The higher ``retained_from`` wins, and entries wholly
        below it are dropped: what retention removed does not come back.
        """
        retained = max(self.retained_from, other.retained_from)
        by_key = {s.key: s for s in self.segments}
        for seg in other.segments:
            mine = by_key.get(seg.key)
            if mine is None or seg.epoch >= mine.epoch:
                by_key[seg.key] = seg
        return Manifest(
            tuple(s for s in by_key.values() if s.last >= retained),
            max(self.epoch, other.epoch),
            max(self.version, other.version) + 1,
            retained,
        )

    def admitting(self, seg: SegmentObject, epoch: int) -> Manifest:
        """What a leader at ``epoch`` puts after uploading ``seg``, given that this
        is the manifest it just read; ``FencedUploader`` if a newer leader wrote it."""
        self.check_fence(epoch)
        return self.merged(Manifest((seg,), epoch, self.version))

    def trimmed(self, start: int, epoch: int) -> Manifest:
        """What a leader at ``epoch`` puts to make ``start`` the lowest offset kept:
        the entries wholly below it dropped (``removed_by`` names them), the next
        version; ``FencedUploader`` if a newer leader wrote this manifest. ``start``
        may not pass the checkpoint's next offset: the tier never skips offsets it
        has not stored."""
        self.check_fence(epoch)
        if start > self.checkpoint + 1:
            raise InvalidManifest(
                f"retainedFrom: {start} is past the stored checkpoint {self.checkpoint}"
            )
        retained = max(self.retained_from, start)
        return Manifest(
            tuple(s for s in self.segments if s.last >= retained),
            max(self.epoch, epoch),
            self.version + 1,
            retained,
        )

    def removed_by(self, newer: Manifest) -> tuple[SegmentObject, ...]:
        """This manifest's entries that ``newer`` no longer lists."""
        kept = {s.key for s in newer.segments}
        return tuple(s for s in self.segments if s.key not in kept)

    def check_fence(self, epoch: int) -> None:
        if self.epoch > epoch:
            raise FencedUploader(
                f"the manifest was written at leader epoch {self.epoch}; this uploader is at"
                f" epoch {epoch} and must stop"
            )

    # --- JSON ---

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "epoch": self.epoch,
            "segments": [s.to_doc() for s in self.segments],
        }
        if self.retained_from:  # absent until trimmed: untrimmed documents stay as they were
            doc["retainedFrom"] = self.retained_from
        return doc

    def to_json(self) -> bytes:
        return _dump(self.to_doc())

    @classmethod
    def from_doc(cls, doc: object) -> Manifest:
        fields = _object(doc, "manifest", ("format", "version", "epoch", "segments"))
        _check_format(fields["format"])
        raw = fields["segments"]
        if not isinstance(raw, list):
            raise InvalidManifest(f"segments: expected a list, got {type(raw).__name__}")
        segments = []
        for i, item in enumerate(raw):
            try:
                segments.append(SegmentObject.from_doc(item))
            except InvalidManifest as exc:
                raise InvalidManifest(f"segments[{i}].{exc.message}") from exc
        return cls(
            tuple(segments), fields["epoch"], fields["version"], fields.get("retainedFrom", 0)
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        return cls.from_doc(_load(raw, "manifest"))


@dataclass(frozen=True, slots=True)
class SealedState:
    """What the last owner of a partition left when it sealed it for a move.

    The next owner continues the log at ``last_committed_offset + 1`` (offsets
    stay unique and contiguous across the move), its uploader's checkpoint is
    ``last_committed_offset``, each cohort resumes at its cursor, and
    idempotent producers keep their sequence state. ``producers`` is the opaque
    JSON of ``headrace.storage.bookkeeping.ProducerStateTable.snapshot()``.
    """

    #: the last offset written and committed before the seal; -1 for an empty log
    last_committed_offset: int
    #: id of the broker that sealed it
    broker: int
    #: leader epoch of that broker when it sealed
    epoch: int
    #: when it was sealed, ms since the Unix epoch
    time_ms: int
    #: how many times the partition has been moved, this move included
    moves: int
    #: cohort name -> next offset to deliver
    cursors: dict[str, int] = field(default_factory=dict)
    producers: dict[str, Any] = field(default_factory=dict)
    #: whether the sealing broker checked that the manifest covers the log with no gap
    verified: bool = False
    #: a human-readable note (why, or what verification found)
    message: str = ""

    def __post_init__(self) -> None:
        _check_int("lastCommittedOffset", self.last_committed_offset, -1)
        _check_int("broker", self.broker, 0)
        _check_int("epoch", self.epoch, -1, 2**31 - 1)
        _check_int("timeMs", self.time_ms, 0)
        _check_int("moves", self.moves, 0)
        if not isinstance(self.cursors, dict):
            raise InvalidManifest(f"cursors: expected an object, got {self.cursors!r}")
        for name, cursor in self.cursors.items():
            if not isinstance(name, str) or not name:
                raise InvalidManifest(f"cursors: cohort name {name!r} is not a non-empty string")
            _check_int(f"cursors.{name}", cursor, 0)
        if not isinstance(self.producers, dict):
            raise InvalidManifest(f"producers: expected an object, got {self.producers!r}")
        if not isinstance(self.verified, bool):
            raise InvalidManifest(f"verified: expected true or false, got {self.verified!r}")
        if not isinstance(self.message, str):
            raise InvalidManifest(f"message: expected a string, got {self.message!r}")

    @property
    def next_offset(self) -> int:
        """Where the next owner's log continues."""
        return self.last_committed_offset + 1

    def to_doc(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "lastCommittedOffset": self.last_committed_offset,
            "broker": self.broker,
            "epoch": self.epoch,
            "timeMs": self.time_ms,
            "moves": self.moves,
            "cursors": dict(self.cursors),
            "producers": self.producers,
            "verified": self.verified,
            "message": self.message,
        }

    def to_json(self) -> bytes:
        return _dump(self.to_doc())

    @classmethod
    def from_doc(cls, doc: object) -> SealedState:
        fields = _object(
            doc,
            "sealed state",
            (
                "format",
                "lastCommittedOffset",
                "broker",
                "epoch",
                "timeMs",
                "moves",
                "cursors",
                "producers",
                "verified",
                "message",
            ),
        )
        _check_format(fields["format"])
        return cls(
            last_committed_offset=fields["lastCommittedOffset"],
            broker=fields["broker"],
            epoch=fields["epoch"],
            time_ms=fields["timeMs"],
            moves=fields["moves"],
            cursors=fields["cursors"],
            producers=fields["producers"],
            verified=fields["verified"],
            message=fields["message"],
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> SealedState:
        return cls.from_doc(_load(raw, "sealed state"))


# --- JSON helpers ---


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()


def _load(raw: bytes | str, what: str) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidManifest(f"{what} is not valid JSON: {exc}") from exc


def _object(doc: object, what: str, required: Iterable[str]) -> dict[str, Any]:
    """``doc`` as a JSON object with every required field; unknown fields are
    ignored so that a newer writer's additions do not break an older reader."""
    if not isinstance(doc, dict):
        raise InvalidManifest(f"{what}: expected a JSON object, got {type(doc).__name__}")
    for name in required:
        if name not in doc:
            raise InvalidManifest(f"{name}: missing from the {what}")
    return doc


def _check_format(value: object) -> None:
    if value != FORMAT:
        raise InvalidManifest(f"format: {value!r} is not the supported format {FORMAT}")
