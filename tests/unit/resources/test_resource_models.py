"""The custom resource models: valid objects, defaults, the camelCase wire form, scalars."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from resource_samples import COMPLETE, EXAMPLES, manifest

from headrace.broker.config import BrokerSettings
from headrace.resources import (
    KINDS,
    BrokerCluster,
    Condition,
    ConditionStatus,
    Resource,
    Topic,
    TopicSpec,
    TopicStatus,
    load_manifests,
)
from headrace.resources.cron import check_cron
from headrace.resources.meta import ClusterReference, parse_quantity
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

KIND_NAMES = sorted(COMPLETE)


def keys(tree: Any, free_form: tuple[str, ...]) -> list[str]:
    """Every mapping key in ``tree``, not descending into the named free-form maps."""
    found: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            found.append(key)
            if key not in free_form:
                found.extend(keys(value, free_form))
    elif isinstance(tree, list):
        for item in tree:
            found.extend(keys(item, free_form))
    return found


# --------------------------------------------------------------------------- kinds


def test_every_kind_is_registered_once_with_its_short_name() -> None:
    assert set(KINDS) == {
        "BrokerCluster",
        "Topic",
        "Repartition",
        "Unload",
        "Compaction",
        "CompactionSchedule",
        "TopicSnapshot",
        "TopicSnapshotSchedule",
        "TopicRestore",
        "User",
    }
    short = {kind: cls.NAMES.short_names for kind, cls in KINDS.items()}
    assert short == {
        "BrokerCluster": ("hrbc",),
        "Topic": ("hrt",),
        "Repartition": ("hrrp",),
        "Unload": ("hrul",),
        "Compaction": ("hrcp",),
        "CompactionSchedule": ("hrcs",),
        "TopicSnapshot": ("hrsnap",),
        "TopicSnapshotSchedule": ("hrss",),
        "TopicRestore": ("hrrs",),
        "User": ("hru",),
    }
    for kind, cls in KINDS.items():
        assert kind == cls.KIND
        assert cls.model_fields["kind"].default == kind


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_a_complete_manifest_round_trips_through_json(kind: str) -> None:
    document = manifest(kind)
    resource = KINDS[kind].from_manifest(document)
    wire = json.loads(json.dumps(resource.to_manifest()))
    assert KINDS[kind].from_manifest(wire) == resource
    # every field given comes back under its camelCase name with its value
    assert wire["spec"] == document["spec"]
    assert wire["status"] == document["status"]


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_wire_form_is_camel_case(kind: str) -> None:
    wire = KINDS[kind].from_manifest(manifest(kind)).to_manifest()
    # maps keyed by data, not field names (member ids, label keys, ...)
    free_form = (
        "labels",
        "annotations",
        "sparkConf",
        "requests",
        "limits",
        "nodeSelector",
        "affinity",
        "assignment",
    )
    for key in keys(wire, free_form):
        assert re.fullmatch(r"[a-z][a-zA-Z0-9]*", key), key
    assert "min_in_sync" not in json.dumps(wire)


def test_python_uses_snake_case_names() -> None:
    topic = Topic.from_manifest(manifest("Topic"))
    assert topic.spec.min_in_sync == 3
    assert topic.spec.tiered_storage.upload_interval_seconds == 5
    assert topic.status is not None and topic.status.partitions[0].live_replicas == [1, 2]
    spec = TopicSpec(cluster_ref=ClusterReference(name="main"), partitions=3, replicas=1)
    assert spec.model_dump()["minInSync"] == 1


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_status_is_optional_and_omitted_when_unset(kind: str) -> None:
    document = manifest(kind)
    del document["status"]
    resource = KINDS[kind].from_manifest(document)
    assert resource.status is None
    assert "status" not in resource.to_manifest()


# --------------------------------------------------------------------------- defaults


def minimal_topic(**spec: Any) -> Topic:
    return Topic.from_manifest(
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "t"},
            "spec": {"clusterRef": {"name": "main"}, "partitions": 1, **spec},
        }
    )


def test_topic_defaults() -> None:
    topic = minimal_topic()
    assert topic.metadata.namespace == "default"
    assert topic.spec.replicas == 3
    assert topic.spec.min_in_sync == 2
    assert topic.spec.cleanup_policy == "delete"
    assert topic.spec.tiered_storage.enabled is True
    assert topic.spec.retention.ms is None  # the cluster's setting applies
    assert topic.spec.delivery.cohort_grace_ms is None


@pytest.mark.parametrize(("replicas", "expected"), [(1, 1), (2, 2), (3, 2), (7, 2)])
def test_min_in_sync_defaults_to_min_of_two_and_replicas(replicas: int, expected: int) -> None:
    assert minimal_topic(replicas=replicas).spec.min_in_sync == expected


def test_broker_config_defaults_are_the_brokers_own() -> None:
    cluster = BrokerCluster.from_manifest(
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": "c"},
            "spec": {},
        }
    )
    config = cluster.spec.broker_config
    log = LogConfig()
    assert config.fsync_policy is FsyncPolicy.INTERVAL == log.fsync
    assert config.flush_interval_ms == log.flush_interval_ms
    assert config.segment_bytes == log.segment_bytes
    broker = BrokerSettings(data_dir=Path("unused"))
    assert config.cohort_grace_ms == broker.cohort_grace_ms
    assert config.cursor_flush_interval_ms == broker.cursor_flush_interval_ms
    assert cluster.spec.replicas == 3
    assert cluster.spec.storage.size == "10Gi"
    assert cluster.spec.object_store is None


def test_compaction_schedule_forbids_overlap_by_default() -> None:
    (schedule,) = load_manifests(
        "apiVersion: headrace.dev/v1alpha1\nkind: CompactionSchedule\n"
        "metadata: {name: s}\nspec: {topicRef: {name: t}, schedule: '@daily'}\n"
    )
    assert schedule.to_manifest()["spec"]["concurrencyPolicy"] == "Forbid"
    assert schedule.to_manifest()["spec"]["verify"] is True


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_loads(path: Any) -> None:
    resources = load_manifests(path.read_text(), source=path.name)
    assert resources
    assert all(isinstance(r, Resource) for r in resources)


def test_the_examples_cover_every_kind() -> None:
    kinds = {r.KIND for path in EXAMPLES.glob("*.yaml") for r in load_manifests(path.read_text())}
    assert kinds == set(KINDS)


# --------------------------------------------------------------------------- status helpers


def test_condition_lookup_and_construction_from_python() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    status = TopicStatus(
        conditions=[
            Condition(
                type="Ready",
                status=ConditionStatus.FALSE,
                reason="Electing",
                last_transition_time=now,
            )
        ]
    )
    ready = status.condition()
    assert ready is not None and ready.reason == "Electing"
    assert status.condition("Degraded") is None
    assert (
        status.model_dump(mode="json")["conditions"][0]["lastTransitionTime"]
        == "2026-01-02T00:00:00Z"
    )


def test_condition_timestamps_need_a_timezone() -> None:
    with pytest.raises(ValidationError):
        Condition(
            type="Ready", status="True", reason="Ok", last_transition_time=datetime(2026, 1, 2)
        )  # type: ignore[arg-type]


def test_objects_read_back_from_the_api_server_parse() -> None:
    document = manifest("Topic")
    document["metadata"].update(
        {
            "uid": "d6f4",
            "generation": 3,
            "resourceVersion": "991",
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "managedFields": [{"manager": "kubectl"}],
            "finalizers": ["headrace.dev/topic"],
        }
    )
    topic = Topic.from_manifest(document)
    assert topic.metadata.generation == 3
    assert topic.metadata.uid == "d6f4"
    assert str(topic.key) == "Topic/team-a/orders"
    assert yaml.safe_dump(topic.to_manifest())  # plain data all the way down


def test_any_mapping_parses() -> None:
    class View(Mapping[str, Any]):
        """A read-only view, like kopf's Body."""

        def __init__(self, data: dict[str, Any]) -> None:
            self._data = data

        def __getitem__(self, key: str) -> Any:
            value = self._data[key]
            return View(value) if isinstance(value, dict) else value

        def __iter__(self) -> Iterator[str]:
            return iter(self._data)

        def __len__(self) -> int:
            return len(self._data)

    document = manifest("Topic")
    assert Topic.from_manifest(View(document)) == Topic.from_manifest(document)


# --------------------------------------------------------------------------- scalars


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", Decimal(10 * 1024**3)),
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5k", Decimal(1500)),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("+.5Ki", Decimal(512)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "10GB", "-1Gi", "1.5.3", "Gi", "1e1.5", "ten"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    "schedule",
    [
        "* * * * *",
        "15 3 * * *",
        "*/5 0-23/2 1,15 jan-jun ?",
        "0 12 * DEC sun",
        "59 23 31 12 7",
        "@daily",
        "@hourly",
        "0\t0 * * *",
    ],
)
def test_cron_schedules_a_cronjob_accepts(schedule: str) -> None:
    assert check_cron(schedule) == schedule


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        ("60 * * * *", "minute '60' is out of range 0-59"),
        ("* 24 * * *", "hour '24' is out of range 0-23"),
        ("* * 0 * *", "day of month '0' is out of range 1-31"),
        ("* * * 13 *", "month '13' is out of range 1-12"),
        ("* * * * 8", "day of week '8' is out of range 0-7"),
        ("* * * foo *", "month 'foo' is not a number"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("5-1 * * * *", "range '5-1' runs backwards"),
        ("? * * * *", "minute '?' is not a number"),
        ("@every 5m", "unknown macro"),
        ("@fortnightly", "unknown macro"),
        (" * * * * *", "expected 5 fields"),
    ],
)
def test_cron_schedules_rejected(schedule: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        check_cron(schedule)
