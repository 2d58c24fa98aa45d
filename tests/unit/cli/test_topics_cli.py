"""``headrace topics``: the Topic documents it writes, without a controller."""

from __future__ import annotations

import click
import pytest

from headrace.cli import topics
from headrace.control.documents import spec_of, topic_config
from headrace.resources import load_manifests


def test_create_writes_a_topic_document_apply_accepts_and_the_broker_settings_round_trip() -> None:
    settings = topics.parse_config(
        (
            "retention_ms=3600000",
            "retention_bytes=1000000",
            "segment_bytes=4096",
            "segment_ms=60000",
            "max_batch_bytes=65536",
            "tiered=false",
            "upload_interval_ms=5000",
            "local_retention_ms=1000",
            "local_retention_bytes=2000",
        )
    )
    doc = topics.topic_manifest("team/orders", 6, 3, 2, settings, "local")
    assert doc["metadata"] == {"name": "orders", "namespace": "team"}
    (resource,) = load_manifests(__import__("json").dumps(doc), source="test")
    assert resource.spec.partitions == 6
    spec = spec_of(doc)
    assert (spec.name, spec.partitions, spec.replicas, spec.min_in_sync) == (
        "team/orders",
        6,
        3,
        2,
    )
    # What the controller would push to the brokers is exactly what -c said.
    assert topic_config(doc) == settings


def test_bad_settings_are_refused_with_the_known_names() -> None:
    with pytest.raises(click.BadParameter, match="unknown setting 'retention'"):
        topics.parse_config(("retention=1",))
    with pytest.raises(click.BadParameter, match="KEY=INTEGER"):
        topics.parse_config(("retention_ms=soon",))
    with pytest.raises(click.BadParameter, match="true or false"):
        topics.parse_config(("tiered=maybe",))
    with pytest.raises(click.BadParameter, match="whole number of seconds"):
        topics.topic_manifest("t", 1, None, None, {"upload_interval_ms": 1500}, "local")


def _applied() -> dict[str, object]:
    doc = topics.topic_manifest("orders", 3, 3, None, {"retention_ms": 1000}, "local")
    doc["metadata"]["generation"] = 4
    doc["status"] = {"partitions": []}
    return doc


def test_alter_changes_settings_and_keeps_the_rest() -> None:
    edited = topics.edited_manifest(
        _applied(), None, None, 1, {"segment_bytes": 8192}, ("retention_ms",)
    )
    assert edited["spec"] == {
        "clusterRef": {"name": "local"},
        "partitions": 3,
        "replicas": 3,
        "minInSync": 1,
        "retention": {},
        "segments": {"bytes": 8192},
    }
    assert "status" not in edited and "generation" not in edited["metadata"]


def test_alter_takes_a_partition_count_and_refuses_a_replica_count_change() -> None:
    assert topics.edited_manifest(_applied(), 4, None, None, {}, ())["spec"]["partitions"] == 4
    with pytest.raises(click.BadParameter, match="at least 1"):
        topics.edited_manifest(_applied(), 0, None, None, {}, ())
    with pytest.raises(click.ClickException, match="replica count"):
        topics.edited_manifest(_applied(), None, 1, None, {}, ())
    # Unchanged counts are fine.
    topics.edited_manifest(_applied(), 3, 3, None, {}, ())


def test_names_default_to_the_default_namespace() -> None:
    assert topics.split_name("orders") == ("default", "orders")
    assert topics.split_name("team/orders") == ("team", "orders")
