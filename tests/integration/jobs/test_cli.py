"""``headrace verify`` and ``headrace compact`` run the jobs with pyspark's spark-submit."""

from __future__ import annotations

import json
from pathlib import Path

from headrace.objectstore.directory import DirectoryStore
from headrace.objectstore.interface import ObjectStore
from headrace.testing.procs import run_headrace
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
