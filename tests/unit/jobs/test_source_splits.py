"""The data source's splits of a manifest retention has trimmed."""

from __future__ import annotations

from headrace.jobs.source import splits
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest, SegmentObject

PREFIX = "c/ns/t/0/"


def seg(base: int, last: int, epoch: int = 1) -> SegmentObject:
    return SegmentObject(base, last, 1000, layout.segment_key(PREFIX, base, last), epoch)


def test_a_read_of_a_trimmed_partition_starts_at_the_retained_start() -> None:
    # an overlapping leftover reaches below the trim point: nothing below it is read
    m = Manifest((seg(0, 199), seg(100, 299, epoch=2), seg(300, 399)), 2, 1).trimmed(200, 2)
    got = [(s.partition, s.key, s.start, s.end) for s in splits(m, 0, 0, 400)]
    assert got == [
        (0, layout.segment_key(PREFIX, 100, 299), 200, 300),
        (0, layout.segment_key(PREFIX, 300, 399), 300, 400),
    ]
