"""A local-directory volume provisioner for PersistentVolumeClaims (I/O adapter).

It plays an external provisioner's part for StorageClasses whose ``provisioner`` is
:data:`PROVISIONER`: for each pending claim it creates a PersistentVolume of type
``hostPath`` whose directory lives under ``<state>/volumes``, pre-bound to the claim
through ``claimRef``; kube-controller-manager's PV controller then binds the two as it
would in any cluster. A directory belongs to the volume, not to a pod, so a StatefulSet
pod that is deleted and recreated finds its data again. When a claim is deleted and its
volume is ``Released`` with reclaim policy ``Delete``, the directory and the volume go.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from e2e.testbed import kubeapi

Obj = dict[str, Any]
PROVISIONER = "headrace.dev/local-dir"
ANNOTATION = "pv.kubernetes.io/provisioned-by"
log = logging.getLogger("e2e.testbed.provisioning")


def volume_for_claim(
    claim: Obj, storage_class: Obj, volumes_dir: Path, node: str | None = None
) -> Obj:
    """The PersistentVolume to create for ``claim`` (pure).

    With ``node`` (a real node's name) the volume is ``local``, pinned to that node: the
    kubelet applies a pod's ``fsGroup`` to local volumes (never to hostPath ones), as to
    a cloud disk. Without it, ``hostPath``, which the stand-in runner mounts as it is.
    """
    meta = claim["metadata"]
    spec = claim.get("spec", {})
    name = f"pvc-{meta['uid']}"
    size = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {ANNOTATION: PROVISIONER}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy", "Delete"),
            "storageClassName": storage_class["metadata"]["name"],
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            **_source(volumes_dir / name, node),
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def _source(path: Path, node: str | None) -> Obj:
    if node is None:
        return {"hostPath": {"path": str(path), "type": "DirectoryOrCreate"}}
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {
        "local": {"path": str(path)},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}},
    }


def volume_path(pv: Obj) -> Path | None:
    """The host directory of a hostPath or local PersistentVolume."""
    spec = pv.get("spec", {})
    for kind in ("hostPath", "local"):
        if kind in spec:
            return Path(spec[kind]["path"])
    return None


class Provisioner:
    """One pass of :meth:`sync` provisions pending claims and reclaims released volumes."""

    def __init__(self, api: kubeapi.Client, volumes_dir: Path, node: str | None = None) -> None:
        self._api = api
        self._dir = volumes_dir
        self._node = node

    def sync(self) -> None:
        classes = {
            c["metadata"]["name"]: c
            for c in self._api.get("/apis/storage.k8s.io/v1/storageclasses").get("items", [])
            if c.get("provisioner") == PROVISIONER
        }
        default = next(
            (
                name
                for name, c in classes.items()
                if c["metadata"]
                .get("annotations", {})
                .get("storageclass.kubernetes.io/is-default-class")
                == "true"
            ),
            None,
        )
        for claim in self._api.get("/api/v1/persistentvolumeclaims").get("items", []):
            spec = claim.get("spec", {})
            if spec.get("volumeName") or claim.get("status", {}).get("phase") != "Pending":
                continue
            if claim["metadata"].get("deletionTimestamp"):
                continue
            cls_name = spec.get("storageClassName", default)
            if cls_name not in classes:
                continue
            pv = volume_for_claim(claim, classes[cls_name], self._dir, self._node)
            path = volume_path(pv)
            assert path is not None
            # root:root 0755, like a freshly formatted disk: the pod's fsGroup must open it
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
            try:
                self._api.create("/api/v1/persistentvolumes", pv)
                log.info(
                    "provisioned %s for %s/%s",
                    pv["metadata"]["name"],
                    claim["metadata"]["namespace"],
                    claim["metadata"]["name"],
                )
            except kubeapi.ApiError as exc:
                if not exc.conflict:
                    raise
        for pv in self._api.get("/api/v1/persistentvolumes").get("items", []):
            meta = pv["metadata"]
            if meta.get("annotations", {}).get(ANNOTATION) != PROVISIONER:
                continue
            released = pv.get("status", {}).get("phase") == "Released"
            if released and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                path = volume_path(pv)
                if path is not None and path.is_relative_to(self._dir):
                    shutil.rmtree(path, ignore_errors=True)
                try:
                    self._api.delete(f"/api/v1/persistentvolumes/{meta['name']}")
                    log.info("deleted released volume %s", meta["name"])
                except kubeapi.ApiError as exc:
                    if not exc.not_found:
                        raise


def main() -> None:
    """``python -m e2e.testbed.provisioning``: the real node's provisioner, a daemon of its
    own (the stand-in runner runs :class:`Provisioner` in a thread)."""
    import argparse
    import json
    import time

    parser = argparse.ArgumentParser(prog="python -m e2e.testbed.provisioning")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    port = json.loads((args.state_dir / "run" / "ports.json").read_text())["apiserver"]
    api = kubeapi.from_kubeconfig_files("127.0.0.1", port, args.state_dir / "pki", "runner", 30.0)
    provisioner = Provisioner(api, args.state_dir / "volumes", node=args.node_name)
    while True:
        try:
            provisioner.sync()
        except (kubeapi.ApiError, OSError) as exc:
            log.warning("provisioner: %s", exc)
        time.sleep(args.interval_s)


if __name__ == "__main__":
    main()
