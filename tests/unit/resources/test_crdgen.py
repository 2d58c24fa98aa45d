"""The CRDs: generated from the models, committed in sync, structural."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from resource_samples import CRDS, ROOT

from headrace.cli.generate import main, read_examples, write_crds
from headrace.resources import KINDS, docgen
from headrace.resources.crdgen import (
    custom_resource_definition,
    file_name,
    generated,
    structural_problems,
)
from headrace.resources.topics import CLUSTER_REF_IMMUTABLE, REPLICAS_IMMUTABLE

KIND_NAMES = sorted(KINDS)


def schema_of(kind: str) -> dict[str, Any]:
    crd = custom_resource_definition(KINDS[kind])
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crds_are_what_the_models_generate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # examples/ for the reference
    assert main([str(tmp_path / "crds"), str(tmp_path / "reference.md")]) == 0
    assert (tmp_path / "reference.md").read_text() == (
        ROOT / "docs" / "crd-reference.md"
    ).read_text()
    fresh = {p.name: p.read_text() for p in sorted((tmp_path / "crds").iterdir())}
    committed = {p.name: p.read_text() for p in sorted(CRDS.glob("*.yaml"))}
    assert sorted(committed) == sorted(fresh), "crds/ has missing or extra files"
    for name, text in fresh.items():
        assert committed[name] == text, f"crds/{name} is stale: run `make generate`"


def test_the_reference_doc_is_what_the_models_generate(tmp_path: Path) -> None:
    committed = (ROOT / "docs" / "crd-reference.md").read_text()
    assert committed == docgen.reference(read_examples(ROOT)), (
        "docs/crd-reference.md is stale: run `make generate`"
    )
    for kind in KINDS:
        assert f"\n## {kind}\n" in committed
        assert f"kind: {kind}\n" in committed  # its example is shown


def test_write_removes_stale_generated_files_only(tmp_path: Path) -> None:
    (tmp_path / "gone.headrace.dev.yaml").write_text("old")
    (tmp_path / "kustomization.yaml").write_text("keep")
    write_crds(tmp_path)
    assert not (tmp_path / "gone.headrace.dev.yaml").exists()
    assert (tmp_path / "kustomization.yaml").read_text() == "keep"
    assert len(list(tmp_path.glob("*.headrace.dev.yaml"))) == len(KINDS)


def test_generation_is_deterministic() -> None:
    assert generated() == generated()


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_the_schema_is_structural(kind: str) -> None:
    assert structural_problems(schema_of(kind)) == []


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_no_refs_nulls_or_titles_survive(kind: str) -> None:
    text = yaml.safe_dump(schema_of(kind))
    for word in ("$ref", "$defs", "anyOf: null", "type: 'null'", "title:", "const:", "nullable"):
        assert word not in text


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_crd_names_scope_status_and_columns(kind: str) -> None:
    cls = KINDS[kind]
    crd = custom_resource_definition(cls)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{cls.NAMES.plural}.headrace.dev"
    assert file_name(cls) == f"{cls.NAMES.plural}.headrace.dev.yaml"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind
    assert spec["names"]["listKind"] == f"{kind}List"
    assert spec["names"]["shortNames"] == list(cls.NAMES.short_names)
    assert "headrace" in spec["names"]["categories"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[-3:] == ["Ready", "Reason", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    assert schema["properties"]["metadata"] == {"type": "object"}
    # every column points at a field of the schema (or at metadata)
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0].strip(".").split(".")
        node = schema
        for part in path:
            if node.get("type") == "object" and part in node.get("properties", {}):
                node = node["properties"][part]
            elif path[0] == "metadata":
                break
            else:
                raise AssertionError(f"{kind}: column {column['name']} points nowhere: {path}")


def test_topic_columns() -> None:
    crd = custom_resource_definition(KINDS["Topic"])
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"]) for c in columns] == [
        ("Partitions", ".status.partitionCount"),  # the spec lags after a Repartition
        ("Replicas", ".spec.replicas"),
        ("Version", ".status.partitioningVersion"),
        ("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        ("Reason", '.status.conditions[?(@.type=="Ready")].reason'),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_topic_schema_details() -> None:
    spec = schema_of("Topic")["properties"]["spec"]
    assert spec["required"] == ["clusterRef", "partitions"]
    partitions = spec["properties"]["partitions"]
    assert (partitions["type"], partitions["minimum"], partitions["maximum"]) == (
        "integer",
        1,
        4096,
    )
    assert spec["properties"]["replicas"]["default"] == 3
    assert "default" not in spec["properties"]["minInSync"]  # computed from replicas
    assert spec["x-kubernetes-validations"] == [
        {
            "rule": "!has(self.minInSync) || self.minInSync <= self.replicas",
            "message": "minInSync must not exceed replicas",
            "fieldPath": ".minInSync",
        }
    ]
    assert spec["properties"]["cleanupPolicy"]["enum"] == ["delete", "compact"]
    status = schema_of("Topic")["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["partitions"]["x-kubernetes-list-map-keys"] == ["partition"]
    condition = status["conditions"]["items"]
    assert condition["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert condition["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_free_form_only_where_meant() -> None:
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            found.append(path)
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")

    for kind in KIND_NAMES:
        walk(schema_of(kind), kind)
    assert sorted(found) == [
        "BrokerCluster.spec.scheduling.affinity",
        "BrokerCluster.spec.scheduling.tolerations[]",
    ]


def test_quantities_are_int_or_string() -> None:
    spec = schema_of("BrokerCluster")["properties"]["spec"]["properties"]
    size = spec["storage"]["properties"]["size"]
    assert size["x-kubernetes-int-or-string"] is True
    assert size["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert size["default"] == "10Gi"
    requests = spec["resources"]["properties"]["requests"]
    assert requests["type"] == "object"
    assert requests["additionalProperties"]["x-kubernetes-int-or-string"] is True


@pytest.mark.parametrize("kind", ["Repartition", "Unload", "Compaction"])
def test_one_shot_specs_are_immutable(kind: str) -> None:
    rules = schema_of(kind)["properties"]["spec"]["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf"}.items() <= rules[0].items()


@pytest.mark.parametrize(
    ("field", "message"),
    [("clusterRef", CLUSTER_REF_IMMUTABLE), ("replicas", REPLICAS_IMMUTABLE)],
)
def test_topic_cluster_ref_and_replicas_are_immutable(field: str, message: str) -> None:
    """The API server refuses an edit of them: a clusterRef edit would have the old cluster
    stop serving the topic's data, and no replica-count change exists."""
    rule = {"rule": "self == oldSelf", "message": message}
    generated_rules = schema_of("Topic")["properties"]["spec"]["properties"][field]
    assert generated_rules["x-kubernetes-validations"] == [rule]
    for crds in (CRDS, ROOT / "charts" / "headrace" / "crds"):
        crd = yaml.safe_load((crds / file_name(KINDS["Topic"])).read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert spec["properties"][field]["x-kubernetes-validations"] == [rule]
    # an edit of partitions stays allowed: it is a repartition
    partitions = schema_of("Topic")["properties"]["spec"]["properties"]["partitions"]
    assert "x-kubernetes-validations" not in partitions


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("Topic", "self.metadata.name.size() <= 63"),
        (
            "BrokerCluster",
            "self.metadata.name.size() <= 52 && "
            "self.metadata.name.matches(r'^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        ),
        (
            "CompactionSchedule",
            "self.metadata.name.size() <= 52 && "
            "self.metadata.name.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
        ),
    ],
)
def test_name_rules_reach_the_api_server(kind: str, rule: str) -> None:
    assert schema_of(kind)["x-kubernetes-validations"][0]["rule"] == rule


def test_partition_sets_are_list_type_set_not_unique_items() -> None:
    partitions = schema_of("Unload")["properties"]["spec"]["properties"]["partitions"]
    assert partitions["x-kubernetes-list-type"] == "set"
    assert "uniqueItems" not in partitions
    assert partitions["items"] == {"type": "integer", "minimum": 0, "maximum": 4095}


# --------------------------------------------------------------------------- the checker itself


def broken(change: str) -> dict[str, Any]:
    schema = copy.deepcopy(schema_of("Topic"))
    spec = schema["properties"]["spec"]
    partitions = spec["properties"]["partitions"]
    if change == "ref":
        spec["properties"]["clusterRef"] = {"$ref": "#/$defs/ClusterReference"}
    elif change == "untyped":
        del partitions["type"]
    elif change == "nullable-union":
        spec["properties"]["partitions"] = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    elif change == "properties-on-string":
        partitions["properties"] = {"x": {"type": "string"}}
    elif change == "additional-false":
        spec["additionalProperties"] = False
    elif change == "unique":
        partitions["uniqueItems"] = True
    elif change == "array-without-items":
        spec["properties"]["list"] = {"type": "array"}
    elif change == "const":
        partitions["const"] = 3
    elif change == "exclusive-number":
        partitions["exclusiveMinimum"] = 0
    elif change == "null-type":
        partitions["type"] = "null"
    elif change == "metadata":
        schema["properties"]["metadata"] = {
            "type": "object",
            "properties": {"labels": {"type": "object"}},
        }
    elif change == "root-additional":
        schema["additionalProperties"] = {"type": "string"}
    elif change == "map-key-optional":
        conditions = schema["properties"]["status"]["properties"]["conditions"]
        conditions["items"]["required"].remove("type")
    elif change == "required-missing":
        spec["required"].append("nope")
    return schema


@pytest.mark.parametrize(
    "change",
    [
        "ref",
        "untyped",
        "nullable-union",
        "properties-on-string",
        "additional-false",
        "unique",
        "array-without-items",
        "const",
        "exclusive-number",
        "null-type",
        "metadata",
        "root-additional",
        "map-key-optional",
        "required-missing",
    ],
)
def test_the_checker_catches_non_structural_schemas(change: str) -> None:
    assert structural_problems(broken(change)), change


def test_the_checker_allows_int_or_string_and_free_form() -> None:
    schema = {
        "type": "object",
        "properties": {
            "q": {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            },
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "anything": {"x-kubernetes-preserve-unknown-fields": True},
        },
    }
    assert structural_problems(schema) == []
    schema["properties"]["q"]["anyOf"] = [{"type": "integer"}, {"type": "boolean"}]
    assert structural_problems(schema) == [
        "openAPIV3Schema.properties.q: anyOf is only allowed as the int-or-string pair"
    ]
