"""``headrace verify`` and ``headrace compact`` run the jobs with pyspark's spark-submit."""

from __future__ import annotations

import json
from pathlib import Path

from headrace.jobs.snapshot import take_snapshot
from headrace.jobs.topics import TopicRef, read_manifest
from headrace.objectstore.directory import DirectoryStore
from headrace.objectstore.interface import ObjectStore
from headrace.testing.procs import run_headrace
from headrace.tiered import layout
from tests.integration.jobs.topicdata import manifest, write_partition


def test_verify_a_local_clusters_directory_store_then_find_a_flipped_byte(tmp_path: Path) -> None:
    # a local cluster's directory: local.json without MinIO means <dir>/objects
    (tmp_path / "local.json").write_text(json.dumps({"object_store": "dir"}))
    store = DirectoryStore(tmp_path / "objects")
    write_partition(store, "local", "default/demo", 0, objects=4)
    # an executor pod template is written for Spark's driver (which ignores it locally)
    template = '{"apiVersion":"v1","kind":"Pod","spec":{}}'
    ok = run_headrace(
        "verify", "demo", "--dir", str(tmp_path), "--master", "local[2]",
        "--executor-pod-template", template, timeout=300,
    )  # fmt: skip
    out = ok.stdout.decode()
    assert ok.returncode == 0, ok.stderr.decode()[-3000:]
    assert "verified 4 objects, 40 records" in out and out.rstrip().endswith("OK")
    assert (tmp_path / "executor-pod-template.json").read_text() == template

    seg = manifest(store, "local", "default/demo", 0).segments[3]
    data = bytearray(store.get(seg.key))
    data[-1] ^= 0xFF  # the last byte of the last batch (offset 35)
    store.put(seg.key, bytes(data))
    bad = run_headrace(
        "verify", "demo", "--dir", str(tmp_path), "--master", "local[2]", timeout=300
    )
    out = bad.stdout.decode()
    assert bad.returncode == 1, bad.stderr.decode()[-3000:]
    assert f"crc-mismatch at offset 35 in {seg.key}" in out and "PROBLEMS FOUND" in out


def test_compact_over_minio(
    store: ObjectStore, store_url: str, cluster_id: str, tmp_path: Path
) -> None:
    write_partition(store, cluster_id, "default/logs", 0, objects=30)
    result = run_headrace(
        "compact",
        "default/logs",
        "--store",
        store_url,
        "--cluster",
        cluster_id,
        "--dir",
        str(tmp_path),
        "--master",
        "local[2]",
        "--grace-seconds",
        "0",
        timeout=300,
    )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert "30 -> 1 objects" in out and out.rstrip().endswith("OK")
    assert len(manifest(store, cluster_id, "default/logs", 0).segments) == 1
    assert "partition 0: compacted" in result.stderr.decode()


def test_tier_restore_verifies_with_spark_and_a_rerun_finishes_or_refuses_a_damaged_copy(
    store: ObjectStore, store_url: str, cluster_id: str, tmp_path: Path
) -> None:
    """The restore Job's command (``tier restore ... --into-creation-id``): the copy is
    verified by the Spark job; a retried pod finds its manifests and verifies again, and
    a restored object damaged since fails it, naming the object."""
    source = TopicRef(cluster_id, "default/logs", "")
    target = TopicRef(cluster_id, "default/logs-copy", "5c0e2b1a-3d4f-4a6b-8c7d-9e0f1a2b3c4d")
    for partition in range(2):
        write_partition(store, cluster_id, source.topic, partition, objects=3)
    take_snapshot(store, source, "s1", [0, 1], now_ms=1)
    result_file = tmp_path / "result.json"
    args = (
        "tier", "restore", source.topic, "s1", "--to", target.topic,
        "--into-creation-id", target.creation_id, "--store", store_url, "--cluster", cluster_id,
        "--dir", str(tmp_path), "--master", "local[2]", "--result-file", str(result_file),
    )  # fmt: skip
    first = run_headrace(*args, timeout=300)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    assert "verified the restore with Spark: 6 objects, 60 records" in first.stdout.decode()
    summary = json.loads(result_file.read_text())
    assert summary["ok"] and summary["objects"] == 6
    assert [o.key for o in store.list(target.prefix + "reports/")]  # the job's report

    seg = read_manifest(store, layout.manifest_key(target.partition_prefix(1))).segments[2]
    data = bytearray(store.get(seg.key))
    data[-1] ^= 0xFF  # the last byte of the last batch (offsets 25..29)
    store.put(seg.key, bytes(data))
    again = run_headrace(*args, timeout=300)
    assert again.returncode != 0
    error = json.loads(result_file.read_text())["error"]
    assert (
        "failed the Spark verification" in error
        and f"crc-mismatch at offset 25 in {seg.key}" in error
    )
