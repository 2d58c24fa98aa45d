"""``-f`` handling for ``headrace apply`` and ``headrace delete``: files, directories, stdin."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from resource_samples import EXAMPLES, manifest

from headrace.cli.manifests import manifests_to_apply, manifests_to_delete, read_manifests
from headrace.resources import KINDS, ManifestError, ResourceKey


def write(path: Path, *documents: Any) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def test_a_file(tmp_path: Path) -> None:
    path = write(tmp_path / "topic.yaml", manifest("Topic"))
    (topic,) = manifests_to_apply([path])
    assert topic.key == ResourceKey("Topic", "team-a", "orders")


def test_a_directory_reads_its_manifest_files_only(tmp_path: Path) -> None:
    write(tmp_path / "b.yml", manifest("Topic"))
    write(tmp_path / "a.yaml", manifest("Unload"))
    (tmp_path / "c.json").write_text(
        '{"apiVersion": "headrace.dev/v1alpha1", "kind": "Repartition",'
        ' "metadata": {"name": "r"},'
        ' "spec": {"topicRef": {"name": "orders"}, "partitions": 2}}'
    )
    (tmp_path / "README.md").write_text("not a manifest: {")
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested" / "x.yaml", {"not": "read"})
    assert [name for name, _ in read_manifests([tmp_path])] == [
        str(tmp_path / "a.yaml"),
        str(tmp_path / "b.yml"),
        str(tmp_path / "c.json"),
    ]
    # applied in dependency order, not file order
    assert [r.KIND for r in manifests_to_apply([tmp_path])] == ["Topic", "Repartition", "Unload"]


def test_stdin() -> None:
    stdin = io.StringIO(yaml.safe_dump(manifest("BrokerCluster")))
    (cluster,) = manifests_to_apply(["-"], stdin=stdin)
    assert cluster.KIND == "BrokerCluster"


def test_the_examples_directory_applies_whole() -> None:
    resources = manifests_to_apply([EXAMPLES])
    kinds = [r.KIND for r in resources]
    assert set(kinds) == set(KINDS)
    assert kinds[0] == "BrokerCluster" and kinds.index("Topic") < kinds.index("Repartition")


def test_problems_carry_the_file_name_and_nothing_loads(tmp_path: Path) -> None:
    good = write(tmp_path / "good.yaml", manifest("BrokerCluster"))
    bad_topic = manifest("Topic")
    bad_topic["spec"]["partitions"] = 0
    bad = write(tmp_path / "bad.yaml", bad_topic)
    with pytest.raises(ManifestError) as caught:
        manifests_to_apply([good, bad])
    assert caught.value.problems == [
        f"{bad}: Topic/orders: spec.partitions: Input should be greater than or equal to 1"
    ]


def test_missing_paths_empty_directories_and_double_stdin(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError) as caught:
        read_manifests(
            [tmp_path / "nope.yaml", tmp_path / "empty", "-", "-"], stdin=io.StringIO("")
        )
    assert caught.value.problems == [
        "-: standard input can be given only once",
        f"{tmp_path / 'nope.yaml'}: no such file or directory",
        f"{tmp_path / 'empty'}: no .yaml, .yml, .json files in directory",
    ]
    with pytest.raises(ManifestError, match="no manifests given"):
        read_manifests([])


def test_undecodable_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ManifestError, match="cannot read"):
        read_manifests([path])


def test_delete_keys_come_in_reverse_dependency_order(tmp_path: Path) -> None:
    outdated = manifest("Topic")
    outdated["spec"] = {"partitions": "many", "removed": True}
    path = write(tmp_path / "all.yaml", manifest("BrokerCluster"), outdated, manifest("Unload"))
    assert manifests_to_delete([path]) == [
        ResourceKey("Unload", "team-a", "orders-off-0"),
        ResourceKey("Topic", "team-a", "orders"),
        ResourceKey("BrokerCluster", "team-a", "main"),
    ]
