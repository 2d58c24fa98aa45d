"""Object names of a partition's tier: prefixes, segment and index keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.objectstore.errors import InvalidObjectKey
from headrace.tiered import layout

offsets = st.integers(0, 2**64 - 1)


def test_partition_prefix_is_cluster_namespace_topic_partition() -> None:
    assert layout.partition_prefix("prod", "payments/orders", 3) == "prod/payments/orders/3/"


@pytest.mark.parametrize(
    ("cluster", "topic", "partition"),
    [
        ("prod", "orders", 0),  # no namespace
        ("prod", "a/b/c", 0),  # too many parts
        ("prod", "a/b", -1),
        ("pr/od", "a/b", 0),
    ],
)
def test_partition_prefix_rejects_bad_arguments(cluster: str, topic: str, partition: int) -> None:
    with pytest.raises(ValueError, match=r"topic|partition|cluster"):
        layout.partition_prefix(cluster, topic, partition)


@pytest.mark.parametrize(("cluster", "topic"), [("", "a/b"), ("c", "/b"), ("c", ".ns/b")])
def test_partition_prefix_rejects_names_no_key_may_hold(cluster: str, topic: str) -> None:
    with pytest.raises(InvalidObjectKey):
        layout.partition_prefix(cluster, topic, 0)


def test_segment_and_index_keys_are_zero_padded_ranges() -> None:
    prefix = "c/ns/t/0/"
    assert layout.segment_key(prefix, 120, 129) == (
        "c/ns/t/0/00000000000000000120-00000000000000000129.log"
    )
    assert layout.index_key(prefix, 120, 129) == (
        "c/ns/t/0/00000000000000000120-00000000000000000129.index"
    )
    assert layout.index_key_for(layout.segment_key(prefix, 120, 129)) == layout.index_key(
        prefix, 120, 129
    )
    assert layout.manifest_key(prefix) == "c/ns/t/0/manifest.json"
    assert layout.sealed_key(prefix) == "c/ns/t/0/sealed.json"


@pytest.mark.parametrize(("base", "last"), [(5, 4), (-1, 3), (0, 2**64)])
def test_segment_key_rejects_impossible_ranges(base: int, last: int) -> None:
    with pytest.raises(ValueError, match="offset range"):
        layout.segment_key("p/", base, last)


@given(offsets, offsets, offsets, offsets)
def test_key_order_is_offset_order(a: int, b: int, c: int, d: int) -> None:
    (a, b), (c, d) = sorted((a, b)), sorted((c, d))
    ka, kc = layout.segment_key("p/", a, b), layout.segment_key("p/", c, d)
    assert (ka < kc) == ((a, b) < (c, d))


@given(offsets, offsets)
def test_parse_segment_key_reads_back_the_range(x: int, y: int) -> None:
    base, last = sorted((x, y))
    key = layout.segment_key("c/ns/t/7/", base, last)
    assert layout.parse_segment_key(key) == (base, last)
    assert layout.parse_segment_key(key) == layout.SegmentRange(base, last)


@pytest.mark.parametrize(
    "key",
    [
        "c/ns/t/0/manifest.json",
        "c/ns/t/0/sealed.json",
        "c/ns/t/0/00000000000000000000-00000000000000000009.index",
        "c/ns/t/0/0-9.log",
        "c/ns/t/0/00000000000000000009-00000000000000000000.log",  # last < base
        "c/ns/t/0/99999999999999999999-99999999999999999999.log",  # beyond 2**64 - 1
        "c/ns/t/0/x00000000000000000000-00000000000000000009.log",
    ],
)
def test_parse_segment_key_ignores_other_names(key: str) -> None:
    assert layout.parse_segment_key(key) is None


def test_a_creation_id_names_the_incarnation_between_topic_and_partition() -> None:
    assert layout.partition_prefix("prod", "payments/orders", 3, "4f1c-9a") == (
        "prod/payments/orders/4f1c-9a/3/"
    )
    assert layout.topic_prefix("prod", "payments/orders", "4f1c-9a") == (
        "prod/payments/orders/4f1c-9a/"
    )
    # without one: the legacy layout, as stored before creation ids
    assert layout.topic_prefix("prod", "payments/orders") == "prod/payments/orders/"


@pytest.mark.parametrize("creation_id", ["a/b", "12", "0"])
def test_a_creation_id_that_could_be_read_as_a_path_or_partition_is_refused(
    creation_id: str,
) -> None:
    with pytest.raises(ValueError, match="creation id"):
        layout.partition_prefix("prod", "a/b", 0, creation_id)


@pytest.mark.parametrize("creation_id", [".hidden", "a\\b"])
def test_a_creation_id_no_key_may_hold_is_refused(creation_id: str) -> None:
    with pytest.raises(InvalidObjectKey):
        layout.partition_prefix("prod", "a/b", 0, creation_id)
