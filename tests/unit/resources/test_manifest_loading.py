"""Loading manifests: field-level problems, one line each, and all or nothing."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from resource_samples import manifest

from headrace.errors import HeadraceError, InvalidTopicSpec
from headrace.resources import (
    ManifestError,
    Repartition,
    ResourceKey,
    in_apply_order,
    load_keys,
    load_manifests,
    load_sources,
)


def text(*documents: Any) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)


def problems(source: str) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        load_manifests(source)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def with_spec(kind: str, **changes: Any) -> dict[str, Any]:
    document = manifest(kind)
    document.pop("status")
    document["metadata"] = {"name": "x"}
    document["spec"].update(changes)
    return document


def test_valid_multi_document_text_loads_in_order() -> None:
    loaded = load_manifests(text(manifest("Topic"), None, manifest("BrokerCluster")))
    assert [r.KIND for r in loaded] == ["Topic", "BrokerCluster"]
    assert [r.KIND for r in in_apply_order(loaded)] == ["BrokerCluster", "Topic"]


def test_empty_text_loads_nothing() -> None:
    assert load_manifests("") == []
    assert load_manifests("---\n---\n") == []


def test_the_error_is_typed() -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifests(text(with_spec("Topic", partitions=0)))
    assert isinstance(caught.value, InvalidTopicSpec)
    assert isinstance(caught.value, HeadraceError)
    assert caught.value.CODE == InvalidTopicSpec.CODE
    assert not caught.value.retriable


# --------------------------------------------------------------------------- field-level problems


@pytest.mark.parametrize(
    ("kind", "change", "expected"),
    [
        (
            "Topic",
            {"partitions": 0},
            "Topic/x: spec.partitions: Input should be greater than or equal to 1",
        ),
        (
            "Topic",
            {"partitions": 4097},
            "Topic/x: spec.partitions: Input should be less than or equal to 4096",
        ),
        ("Topic", {"partitions": "3"}, "Topic/x: spec.partitions: Input should be a valid integer"),
        ("Topic", {"partitions": 2.5}, "Topic/x: spec.partitions: Input should be a valid integer"),
        (
            "Topic",
            {"replicas": 8},
            "Topic/x: spec.replicas: Input should be less than or equal to 7",
        ),
        (
            "Topic",
            {"replicas": 2, "minInSync": 3},
            "Topic/x: spec.minInSync: minInSync (3) must not exceed replicas (2)",
        ),
        (
            "Topic",
            {"minInSync": 0},
            "Topic/x: spec.minInSync: Input should be greater than or equal to 1",
        ),
        ("Topic", {"partitionz": 3}, "Topic/x: spec.partitionz: Unknown field"),
        ("Topic", {"min_in_sync": 2}, "Topic/x: spec.min_in_sync: Unknown field"),
        ("Topic", {"retention": {"days": 7}}, "Topic/x: spec.retention.days: Unknown field"),
        (
            "Topic",
            {"retention": {"ms": -2}},
            "Topic/x: spec.retention.ms: Input should be greater than or equal to -1",
        ),
        (
            "Topic",
            {"tieredStorage": {"enabled": "yes"}},
            "Topic/x: spec.tieredStorage.enabled: Input should be a valid boolean",
        ),
        (
            "Topic",
            {"cleanupPolicy": "keep"},
            "Topic/x: spec.cleanupPolicy: Input should be 'delete' or 'compact'",
        ),
        (
            "Topic",
            {"clusterRef": {"name": "Main"}},
            "Topic/x: spec.clusterRef.name: 'Main' is not a valid name",
        ),
        ("Topic", {"clusterRef": "main"}, "Topic/x: spec.clusterRef: Input should be an object"),
        (
            "BrokerCluster",
            {"storage": {"size": "10GB"}},
            "BrokerCluster/x: spec.storage.size: '10GB' is not a Kubernetes quantity",
        ),
        (
            "BrokerCluster",
            {"storage": {"size": 0}},
            "BrokerCluster/x: spec.storage.size: must be greater than zero",
        ),
        (
            "BrokerCluster",
            {"storage": {"sise": "1Gi"}},
            "BrokerCluster/x: spec.storage.sise: Unknown field",
        ),
        (
            "BrokerCluster",
            {"brokerConfig": {"fsyncPolicy": "sometimes"}},
            "BrokerCluster/x: spec.brokerConfig.fsyncPolicy: Input should be 'none', 'interval' or 'always'",
        ),
        (
            "BrokerCluster",
            {"objectStore": {"endpoint": "minio:9000", "bucket": "b1b"}},
            "BrokerCluster/x: spec.objectStore.endpoint: String should match pattern",
        ),
        (
            "BrokerCluster",
            {"objectStore": {"endpoint": "http://m", "bucket": "B"}},
            "BrokerCluster/x: spec.objectStore.bucket: String should match pattern",
        ),
        (
            "BrokerCluster",
            {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}},
            "BrokerCluster/x: spec.resources: requests.cpu (2) exceeds limits.cpu (1)",
        ),
        (
            "BrokerCluster",
            {"scheduling": {"tolerations": {"key": "a"}}},
            "BrokerCluster/x: spec.scheduling.tolerations: Input should be a valid array",
        ),
        (
            "Unload",
            {"partitions": [1, 1]},
            "Unload/x: spec.partitions: partition 1 is listed twice",
        ),
        (
            "Unload",
            {"partitions": [-1]},
            "Unload/x: spec.partitions[0]: Input should be greater than or equal to 0",
        ),
        (
            "Repartition",
            {"adoptionTimeoutSeconds": 0},
            "Repartition/x: spec.adoptionTimeoutSeconds: Input should be greater than or equal to 1",
        ),
        (
            "Compaction",
            {"sparkConf": {"spark.x": 1}},
            "Compaction/x: spec.sparkConf.spark.x: Input should be a valid string",
        ),
        (
            "CompactionSchedule",
            {"schedule": "61 * * * *"},
            "CompactionSchedule/x: spec.schedule: '61 * * * *' is not a cron schedule: minute '61' is out of range 0-59",
        ),
        (
            "CompactionSchedule",
            {"schedule": "@weekly 1"},
            "CompactionSchedule/x: spec.schedule: '@weekly 1' is not a cron schedule: unknown macro",
        ),
        (
            "CompactionSchedule",
            {"concurrencyPolicy": "forbid"},
            "CompactionSchedule/x: spec.concurrencyPolicy: Input should be 'Allow', 'Forbid' or 'Replace'",
        ),
    ],
)
def test_invalid_specs_name_the_field(kind: str, change: dict[str, Any], expected: str) -> None:
    found = problems(text(with_spec(kind, **change)))
    assert len(found) == 1, found
    assert found[0].startswith(expected), found[0]


def test_every_problem_is_reported_one_per_line() -> None:
    found = problems(
        text(with_spec("Topic", partitions=0, replicas=9, bogus=True, retention={"ms": "x"}))
    )
    assert found == [
        "Topic/x: spec.partitions: Input should be greater than or equal to 1",
        "Topic/x: spec.replicas: Input should be less than or equal to 7",
        "Topic/x: spec.retention.ms: Input should be a valid integer",
        "Topic/x: spec.bogus: Unknown field",
    ]


def test_a_missing_required_field_is_named() -> None:
    document = with_spec("Topic")
    del document["spec"]["partitions"]
    assert problems(text(document)) == ["Topic/x: spec.partitions: Field required"]
    del document["spec"]
    assert problems(text(document)) == ["Topic/x: spec: Field required"]


def test_status_is_validated_too() -> None:
    document = manifest("Topic")
    document["status"]["partitions"][0]["state"] = "Sleeping"
    document["status"]["conditions"][0]["status"] = "Yes"
    found = problems(text(document))
    assert found == [
        "Topic/orders: status.conditions[0].status: Input should be 'True', 'False' or 'Unknown'",
        "Topic/orders: status.partitions[0].state: "
        "Input should be 'Online', 'Electing', 'Offline', 'Moving' or 'Retiring'",
    ]


def test_unknown_top_level_fields_are_rejected() -> None:
    document = with_spec("Topic")
    document["sepc"] = {}
    assert problems(text(document)) == ["Topic/x: sepc: Unknown field"]


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("kind", "name", "ok"),
    [
        ("Topic", "orders", True),
        ("Topic", "orders.eu-1", True),
        ("Topic", "a" * 63, True),
        ("Topic", "a" * 64, False),
        ("Topic", "Orders", False),
        ("Topic", "orders_", False),
        ("Topic", "-orders", False),
        ("Topic", "", False),
        ("BrokerCluster", "main", True),
        ("BrokerCluster", "a" * 52, True),
        ("BrokerCluster", "a" * 53, False),
        ("BrokerCluster", "1main", False),  # a Service name must start with a letter
        ("BrokerCluster", "main.eu", False),
        ("Compaction", "0nightly", True),
        ("Compaction", "a.b", False),
        ("CompactionSchedule", "a" * 53, False),
    ],
)
def test_names_follow_each_kinds_rule(kind: str, name: str, ok: bool) -> None:
    document = with_spec(kind)
    document["metadata"] = {"name": name}
    if ok:
        assert load_manifests(text(document))[0].metadata.name == name
    else:
        (line,) = problems(text(document))
        assert "metadata.name:" in line and "is not a valid name" in line, line


def test_bad_namespace_and_missing_metadata() -> None:
    document = with_spec("Topic")
    document["metadata"]["namespace"] = "Team_A"
    (line,) = problems(text(document))
    assert line.startswith("Topic/x: metadata.namespace: 'Team_A' is not a valid name")
    del document["metadata"]
    assert problems(text(document)) == ["document 1: metadata: Field required"]


# --------------------------------------------------------------------------- apiVersion and kind


def test_unknown_kind() -> None:
    document = with_spec("Topic")
    document["kind"] = "Topik"
    assert problems(text(document)) == [
        "Topik/x: kind: unknown kind 'Topik'; expected one of "
        "BrokerCluster, Topic, CompactionSchedule, Compaction, Repartition, Unload,"
        " TopicSnapshot, TopicSnapshotSchedule, TopicRestore, User"
    ]


@pytest.mark.parametrize(
    ("api_version", "expected"),
    [
        (
            "headrace.dev/v1",
            "Topic/x: apiVersion: headrace.dev/v1 is not a served version; use headrace.dev/v1alpha1",
        ),
        ("apps/v1", "Topic/x: apiVersion: expected headrace.dev/v1alpha1, got 'apps/v1'"),
        (None, "Topic/x: apiVersion: Field required (use headrace.dev/v1alpha1)"),
    ],
)
def test_bad_api_version(api_version: str | None, expected: str) -> None:
    document = with_spec("Topic")
    if api_version is None:
        del document["apiVersion"]
    else:
        document["apiVersion"] = api_version
    assert problems(text(document)) == [expected]


def test_a_foreign_kind_and_a_non_mapping() -> None:
    found = problems(
        text({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, ["a"])
    )
    assert found == [
        "ConfigMap/c: apiVersion: expected headrace.dev/v1alpha1, got 'v1'",
        "ConfigMap/c: kind: unknown kind 'ConfigMap'; expected one of "
        "BrokerCluster, Topic, CompactionSchedule, Compaction, Repartition, Unload,"
        " TopicSnapshot, TopicSnapshotSchedule, TopicRestore, User",
        "document 2: expected a mapping with apiVersion and kind, got list",
    ]


def test_yaml_syntax_errors_say_where() -> None:
    (line,) = problems("apiVersion: headrace.dev/v1alpha1\nkind: [Topic\n")
    assert line.startswith("invalid YAML at line 3, column 1:"), line


def test_values_json_cannot_carry_are_reported() -> None:
    assert problems(text(with_spec("Topic", partitions=float("nan")))) == [
        "Topic/x: NaN and infinite numbers are not allowed in a manifest"
    ]
    assert problems(text(with_spec("Topic", partitions=b"\x00"))) == [
        "Topic/x: bytes values are not allowed in a manifest"
    ]


def test_unquoted_yaml_timestamps_are_read_as_strings() -> None:
    source = text(manifest("Repartition")).replace("'2026-01-02T03:04:05Z'", "2026-01-02T03:04:05Z")
    assert "cutoverAt: 2026-01-02T03:04:05Z" in source
    (repartition,) = load_manifests(source)
    assert isinstance(repartition, Repartition) and repartition.status is not None
    assert repartition.status.cutover_at is not None
    assert repartition.status.cutover_at.year == 2026


# --------------------------------------------------------------------------- all or nothing


def test_one_bad_document_loads_nothing() -> None:
    good = manifest("BrokerCluster")
    bad = with_spec("Topic", partitions=0)
    with pytest.raises(ManifestError) as caught:
        load_manifests(text(good, bad, manifest("Repartition")))
    assert caught.value.problems == [
        "Topic/x: spec.partitions: Input should be greater than or equal to 1"
    ]


def test_problems_of_every_document_and_source_are_gathered() -> None:
    with pytest.raises(ManifestError) as caught:
        load_sources(
            [
                ("a.yaml", text(with_spec("Topic", partitions=0))),
                ("b.yaml", text(manifest("Topic"), with_spec("Unload", targetBroker=-1))),
            ]
        )
    assert caught.value.problems == [
        "a.yaml: Topic/x: spec.partitions: Input should be greater than or equal to 1",
        "b.yaml: Unload/x: spec.targetBroker: Input should be greater than or equal to 0",
    ]


def test_the_same_resource_twice_is_a_problem() -> None:
    topic = manifest("Topic")
    other_namespace = manifest("Topic")
    other_namespace["metadata"]["namespace"] = "team-b"
    with pytest.raises(ManifestError) as caught:
        load_sources([("a.yaml", text(topic, other_namespace)), ("b.yaml", text(topic))])
    assert caught.value.problems == ["b.yaml: Topic/orders: also defined in a.yaml: document 1"]


def test_a_list_is_expanded() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [manifest("Topic"), manifest("Unload")]}
    assert [r.KIND for r in load_manifests(text(listed))] == ["Topic", "Unload"]
    listed["items"][1]["spec"]["targetBroker"] = "two"
    assert problems(text(listed)) == [
        "Unload/orders-off-0: spec.targetBroker: Input should be a valid integer"
    ]


# --------------------------------------------------------------------------- keys for delete


def test_keys_ignore_specs_that_no_longer_validate() -> None:
    outdated = with_spec("Topic", partitions=0, removedField=1)
    keys = load_keys(text(outdated, manifest("Unload"), outdated))
    assert keys == [
        ResourceKey("Topic", "default", "x"),
        ResourceKey("Unload", "team-a", "orders-off-0"),
    ]


def test_keys_still_check_kind_and_name() -> None:
    document = with_spec("Topic")
    document["metadata"]["name"] = "X"
    document2 = with_spec("Topic")
    document2["kind"] = "Nope"
    with pytest.raises(ManifestError) as caught:
        load_keys(text(document, document2), source="m.yaml")
    assert len(caught.value.problems) == 2
    assert caught.value.problems[0].startswith(
        "m.yaml: Topic/X: metadata.name: 'X' is not a valid name"
    )
    assert caught.value.problems[1].startswith("m.yaml: Nope/x: kind: unknown kind 'Nope'")
