"""Topic ids as Metadata gives them and as a request by id finds them."""

from __future__ import annotations

from headrace.kafka.topic_ids import kafka_topic_name, named, topic_id


def test_ids_are_stable_distinct_and_found_again_from_the_id() -> None:
    assert topic_id("orders") == topic_id("orders") != topic_id("payments")
    assert topic_id("orders") != bytes(16)
    known = ["orders", "ns/payments"]
    assert named(None, topic_id("ns/payments"), known) == "ns/payments"
    assert named("orders", bytes(16), known) == "orders"  # a name wins over an id
    assert named(None, topic_id("gone"), known) == ""  # answered as an unknown topic


def test_the_default_namespace_is_left_out() -> None:
    assert kafka_topic_name("default/orders") == "orders"
    assert kafka_topic_name("ns/orders") == "ns/orders"
