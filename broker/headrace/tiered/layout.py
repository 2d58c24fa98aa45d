"""Where a partition's tiered objects live in the object store (pure: names only).

One prefix per partition, ``<cluster>/<namespace>/<topic>/<creation id>/<partition>/``,
and under it::

    <base:020d>-<last:020d>.log     a segment object: whole stamped batches, offsets base..last
    <base:020d>-<last:020d>.index   its sparse offset -> position index
    manifest.json                   the live segment objects (``manifest.Manifest``)
    sealed.json                     the sealed state of an unloaded partition

Offsets are zero-padded to 20 digits (the width of 2**64 - 1) so that key
order is offset order: a listing of the prefix returns segments in offset
order, and the base and last offsets can be read back from the key alone.
A segment's key depends only on its offset range, so uploading the same
range twice writes the same key (uploads are idempotent).

The *creation id* names one incarnation of a topic (the Topic resource's
``metadata.uid``): a topic deleted and created again under the same name gets
a new one, so it never meets objects the old one left behind (their removal
runs in the background, and a leader that died never runs it). A topic created
before creation ids existed has none (``""``) and keeps the *legacy* prefix
``<cluster>/<namespace>/<topic>/<partition>/``; a creation id is never all
digits, so the two layouts cannot be mistaken for each other in a listing.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from headrace.objectstore.keys import validate_key

MANIFEST_NAME: Final = "manifest.json"
SEALED_NAME: Final = "sealed.json"
SEGMENT_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
#: the largest offset the batch format can hold (base_offset is a u64)
MAX_OFFSET: Final = 2**64 - 1

_SEGMENT_NAME = re.compile(r"(\d{20})-(\d{20})\.log")


class SegmentRange(NamedTuple):
    """The offsets a segment object's key says it holds, both inclusive."""

    base: int
    last: int


def topic_prefix(cluster_id: str, topic: str, creation_id: str = "") -> str:
    """``"<cluster>/<namespace>/<topic>/<creation id>/"`` for a ``"namespace/name"`` topic
    (``"<cluster>/<namespace>/<topic>/"``, the legacy layout, for ``creation_id=""``).

    Raises ``ValueError`` for a topic without exactly one ``/``, or a cluster or creation
    id that could not be one part of a key, and ``InvalidObjectKey`` for names no object
    key may hold.
    """
    return partition_prefix(cluster_id, topic, 0, creation_id).removesuffix("0/")


def partition_prefix(cluster_id: str, topic: str, partition: int, creation_id: str = "") -> str:
    """``"<cluster>/<namespace>/<topic>/<creation id>/<partition>/"`` for a
    ``"namespace/name"`` topic; without a creation id, the legacy
    ``"<cluster>/<namespace>/<topic>/<partition>/"``.

    Raises ``ValueError`` for a topic without exactly one ``/``, a negative partition,
    or a cluster or creation id that could not be one part of a key, and
    ``InvalidObjectKey`` for names no object key may hold.
    """
    namespace, slash, name = topic.partition("/")
    if not slash or "/" in name:
        raise ValueError(f"topic {topic!r} is not of the form 'namespace/name'")
    if "/" in cluster_id:
        raise ValueError(f"cluster id {cluster_id!r} contains '/'")
    if partition < 0:
        raise ValueError(f"partition {partition} is negative")
    if "/" in creation_id or creation_id.isdigit():
        # all digits would read as a partition of the legacy layout
        raise ValueError(f"creation id {creation_id!r} contains '/' or is all digits")
    incarnation = f"{creation_id}/" if creation_id else ""
    prefix = f"{cluster_id}/{namespace}/{name}/{incarnation}{partition}/"
    validate_key(prefix + MANIFEST_NAME)  # every name below the prefix is then valid too
    return prefix


def _range_name(base: int, last: int) -> str:
    if not 0 <= base <= last <= MAX_OFFSET:
        raise ValueError(f"offset range {base}..{last} is not 0 <= base <= last < 2**64")
    return f"{base:020d}-{last:020d}"


def segment_key(prefix: str, base: int, last: int) -> str:
    """The key of the segment object holding offsets ``base..last`` inclusive."""
    return prefix + _range_name(base, last) + SEGMENT_SUFFIX


def index_key(prefix: str, base: int, last: int) -> str:
    """The key of the sparse index of the segment object ``base..last``."""
    return prefix + _range_name(base, last) + INDEX_SUFFIX


def index_key_for(segment: str) -> str:
    """The index key that belongs to a segment key."""
    if not segment.endswith(SEGMENT_SUFFIX):
        raise ValueError(f"{segment!r} is not a segment key")
    return segment[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX


def manifest_key(prefix: str) -> str:
    return prefix + MANIFEST_NAME


def sealed_key(prefix: str) -> str:
    return prefix + SEALED_NAME


def parse_segment_key(key: str) -> SegmentRange | None:
    """The offset range a segment key names, or None if the key's last part is
    not a segment name (a manifest, an index, anything else in a listing)."""
    match = _SEGMENT_NAME.fullmatch(key.rpartition("/")[2])
    if match is None:
        return None
    base, last = int(match[1]), int(match[2])
    if not base <= last <= MAX_OFFSET:
        return None
    return SegmentRange(base, last)
