"""Topic ids as Metadata gives them and as a request by id finds them."""

from __future__ import annotations

from headrace.kafka.topic_ids import kafka_topic_name, named, placed_topic_id, topic_id


def test_ids_are_stable_distinct_and_found_again_from_the_id() -> None:
    assert topic_id("orders") == topic_id("orders") != topic_id("payments")
    assert topic_id("orders") != bytes(16)
    known = {name: topic_id(name) for name in ("orders", "ns/payments")}
    assert named(None, topic_id("ns/payments"), known) == "ns/payments"
    assert named("orders", bytes(16), known) == "orders"  # a name wins over an id
    assert named(None, topic_id("gone"), known) == ""  # answered as an unknown topic


def test_a_topic_with_retired_partitions_has_another_id_per_routed_count() -> None:
    """Kafka clients take a lower partition count only with a new topic id."""
    assert placed_topic_id("orders", 4, 4) == topic_id("orders")
    shrunk = placed_topic_id("orders", 4, 2)
    assert shrunk not in (topic_id("orders"), placed_topic_id("orders", 4, 3))
    assert shrunk == placed_topic_id("orders", 4, 2) == placed_topic_id("orders", 6, 2)
    # a grow that routes to every partition again gives the name's own id back
    assert placed_topic_id("orders", 4, 4) == topic_id("orders")
    known = {"orders": shrunk}
    assert named(None, shrunk, known) == "orders"
    assert named(None, topic_id("orders"), known) == ""


def test_the_default_namespace_is_left_out() -> None:
    assert kafka_topic_name("default/orders") == "orders"
    assert kafka_topic_name("ns/orders") == "ns/orders"
