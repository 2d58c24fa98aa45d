"""The operator's own install manifests: ServiceAccount, RBAC and a Deployment (pure).

Until a Helm chart ships, these are the plain manifests an install applies:

    python -m headrace.operator.install --namespace headrace-system > operator.yaml
    kubectl apply -f crds/ -f operator.yaml

``RULES`` is the one list of what the operator may do (``docs/operations.md``
§2d says why each is needed); a namespaced install (``--watch NS``) grants it
with a Role and RoleBinding in each watched namespace, a cluster-wide install
with a ClusterRole (plus listing namespaces, which kopf watches then).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final

import yaml

from headrace.operator.surfaces import DEFAULT_PORT
from headrace.operator.workloads import (
    DEFAULT_IMAGE,
    DEFAULT_SPARK_IMAGE,
    DEFAULT_SPARK_IMAGE_PULL_POLICY,
    DEFAULT_SPARK_SERVICE_ACCOUNT,
    container_security_context,
    pod_security_context,
    scratch_volume,
)

NAME: Final = "headrace-operator"

#: (API groups, resources, verbs): everything the operator reads or writes
RULES: Final[tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...]] = (
    # the custom resources: kopf watches them and patches its annotations and finalizer
    (("headrace.dev",), ("brokerclusters", "topics", "unloads"), ("get", "list", "watch", "patch")),
    # a cluster's Kafka offsets Topic, created when missing (never updated: a user's stays)
    (("headrace.dev",), ("topics",), ("create",)),
    # their status: compare-and-swap PUTs
    (
        ("headrace.dev",),
        ("brokerclusters/status", "topics/status", "unloads/status"),
        ("get", "update", "patch"),
    ),
    # Repartitions: watched (no kopf handler that patches them); their status CAS-PUT
    (("headrace.dev",), ("repartitions",), ("get", "list", "watch")),
    (("headrace.dev",), ("repartitions/status",), ("get", "update", "patch")),
    # a BrokerCluster's workload, server-side applied; its StatefulSet deleted without its
    # pods (orphaned) to take a larger volume size, its brokers' claims grown first
    # (and watched: each step reads it from the watch cache, ``caching``)
    (("apps",), ("statefulsets",), ("get", "list", "watch", "create", "patch", "delete")),
    (("",), ("persistentvolumeclaims",), ("list", "patch")),
    (("",), ("configmaps",), ("get", "create", "patch")),
    # the brokers' external Services are deleted again after a scale down
    (("",), ("services",), ("get", "list", "create", "patch", "delete")),
    (("policy",), ("poddisruptionbudgets",), ("get", "create", "patch")),
    # the brokers' pod IPs, watched into a cache (``caching``); a rolling restart deletes
    # one pod at a time
    (("",), ("pods",), ("list", "watch", "delete")),
    # elections, moves, failures as Events
    (("", "events.k8s.io"), ("events",), ("create", "patch")),
    # Compaction and CompactionSchedule (``compaction_handlers``): watched, their status written
    (
        ("headrace.dev",),
        ("compactions", "compactionschedules"),
        ("get", "list", "watch", "patch"),
    ),
    (
        ("headrace.dev",),
        ("compactions/status", "compactionschedules/status"),
        ("get", "update", "patch"),
    ),
    # their Jobs and CronJobs, server-side applied and followed
    (("batch",), ("jobs", "cronjobs"), ("get", "list", "watch", "create", "patch")),
    # TopicSnapshot, TopicRestore, TopicSnapshotSchedule (``snapshot_handlers``): watched,
    # kopf's finalizer on snapshots, their status written; a restore creates its Topic and a
    # schedule creates its TopicSnapshots and deletes those beyond its count (server-side
    # apply: create and patch)
    (
        ("headrace.dev",),
        ("topicsnapshots", "topicrestores", "topicsnapshotschedules"),
        ("get", "list", "watch", "patch"),
    ),
    (
        ("headrace.dev",),
        ("topicsnapshots/status", "topicrestores/status", "topicsnapshotschedules/status"),
        ("get", "update", "patch"),
    ),
    (("headrace.dev",), ("topics",), ("create",)),
    (("headrace.dev",), ("topicsnapshots",), ("create", "delete")),
    # Users (``principals``): watched and listed per cluster, their status written
    (("headrace.dev",), ("users",), ("get", "list", "watch", "patch")),
    (("headrace.dev",), ("users/status",), ("get", "update", "patch")),
    # the Secrets the operator makes (``auth``): a cluster's replication token and key, a
    # User's token; read back by name, created once (server-side apply: patch), never
    # listed, watched, updated or deleted (owner references let the GC delete them)
    (("",), ("secrets",), ("get", "create", "patch")),
)


#: the Lease of one active replica (``leasing``): in the operator's own namespace only, and
#: its one Lease by name (RBAC cannot name what ``create`` makes, so that rule stays by
#: namespace). A cluster-wide grant would let the operator rewrite any Lease, kube-system's
#: leader elections among them.
LEASE_NAME: Final = "headrace-operator"


def lease_rules(lease_name: str = LEASE_NAME) -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease_name],
            "verbs": ["get", "update"],
        },
    ]


#: cluster-scoped reads kopf makes in every mode: it watches CRDs (to notice its resources'
#: definitions change) and namespaces (to follow the ones it serves)
CLUSTER_RULES: Final = (
    (("apiextensions.k8s.io",), ("customresourcedefinitions",), ("get", "list", "watch")),
    (("",), ("namespaces",), ("get", "list", "watch")),
    # whether the brokers' StorageClass allows volume expansion (a larger storage.size)
    (("storage.k8s.io",), ("storageclasses",), ("get", "list")),
    # the zone of each broker pod's node: the rack placement spreads replicas over
    # (``zones``); read by name, never listed, and the brokers need no API access for it
    (("",), ("nodes",), ("get",)),
)


#: what a Compaction's Spark driver does with ``spark.master: kubernetes`` (the Spark
#: service account's Role, in each namespace Compactions run in; docs/spark.md): its
#: executor pods created, followed, labelled with their id and deleted (one by one or
#: by label), its own pod read (their owner); the executors' Spark-conf ConfigMap, and
#: a cluster-mode driver's Service
SPARK_DRIVER_RULES: Final = (
    (("",), ("pods",), ("get", "list", "watch", "create", "patch", "delete", "deletecollection")),
    (("",), ("configmaps", "services"), ("get", "list", "create", "delete", "deletecollection")),
)


def _rules(clusterwide: bool) -> list[dict[str, Any]]:
    chosen = (*RULES, *CLUSTER_RULES) if clusterwide else RULES
    return [
        {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
        for groups, resources, verbs in chosen
    ]


def _cluster_role(
    name: str, rules: list[dict[str, Any]], subject: dict[str, Any]
) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [subject],
        },
    ]


def manifests(
    namespace: str,
    *,
    image: str = DEFAULT_IMAGE,
    watch: tuple[str, ...] = (),
    command: tuple[str, ...] = ("python", "-m", "headrace.operator"),
    broker_command: str = "headrace",
    spark_image: str = DEFAULT_SPARK_IMAGE,
) -> list[dict[str, Any]]:
    """The operator in ``namespace``, watching ``watch`` (every namespace when empty), and
    the Spark drivers' service account in each watched namespace (the operator's own
    when it watches every one)."""
    labels = {"app.kubernetes.io/name": NAME}
    subject = {"kind": "ServiceAccount", "name": NAME, "namespace": namespace}
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": namespace},
        }
    ]
    lease_role = f"{NAME}-lease"
    docs += [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": lease_role, "namespace": namespace},
            "rules": lease_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": lease_role, "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": lease_role,
            },
            "subjects": [subject],
        },
    ]
    if watch:
        for ns in watch:
            docs += [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": NAME, "namespace": ns},
                    "rules": _rules(clusterwide=False),
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": NAME, "namespace": ns},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": NAME,
                    },
                    "subjects": [subject],
                },
            ]
        # the cluster-scoped reads kopf makes even when it serves a few namespaces
        cluster_reads = [
            {"apiGroups": list(g), "resources": list(r), "verbs": list(v)}
            for g, r, v in CLUSTER_RULES
        ]
        docs += _cluster_role(f"{NAME}-{namespace}", cluster_reads, subject)
    else:
        docs += _cluster_role(NAME, _rules(clusterwide=True), subject)
    # the pod IP: the kubelet probes it (``surfaces``)
    args = [
        "--lease-namespace",
        namespace,
        "--broker-command",
        broker_command,
        "--surfaces",
        f"$(POD_IP):{DEFAULT_PORT}",
    ]
    for ns in watch:
        args += ["--namespace", ns]
    scratch, scratch_mount = scratch_volume()
    docs.append(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
            "spec": {
                # a second replica would wait for the Lease: one is enough, a rollout
                # replaces it (the new pod takes the Lease the old one releases)
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "securityContext": pod_security_context(),
                        "containers": [
                            {
                                "name": "operator",
                                "image": image,
                                "command": list(command),
                                "args": args,
                                "securityContext": container_security_context(),
                                "volumeMounts": [scratch_mount],
                                "env": [
                                    {
                                        "name": "POD_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                    },
                                    {"name": "HEADRACE_IMAGE", "value": image},
                                    {"name": "HEADRACE_SPARK_IMAGE", "value": spark_image},
                                    {
                                        "name": "HEADRACE_SPARK_IMAGE_PULL_POLICY",
                                        "value": DEFAULT_SPARK_IMAGE_PULL_POLICY,
                                    },
                                    {
                                        "name": "HEADRACE_SPARK_SERVICE_ACCOUNT",
                                        "value": DEFAULT_SPARK_SERVICE_ACCOUNT,
                                    },
                                ],
                                "ports": [
                                    {
                                        "name": "http-surfaces",
                                        "containerPort": DEFAULT_PORT,
                                        "protocol": "TCP",
                                    }
                                ],
                                "livenessProbe": {
                                    "httpGet": {"path": "/livez", "port": "http-surfaces"},
                                    "periodSeconds": 10,
                                    "timeoutSeconds": 8,
                                    "failureThreshold": 6,
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/readyz", "port": "http-surfaces"},
                                    "periodSeconds": 5,
                                    "timeoutSeconds": 3,
                                },
                            }
                        ],
                        "volumes": [scratch],
                    },
                },
            },
        }
    )
    for ns in watch or (namespace,):
        docs += _spark_driver_account(ns)
    return docs


def _spark_driver_account(namespace: str) -> list[dict[str, Any]]:
    """The Spark drivers' ServiceAccount, Role and RoleBinding in ``namespace``."""
    name = DEFAULT_SPARK_SERVICE_ACCOUNT
    meta = {"name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": list(g), "resources": list(r), "verbs": list(v)}
                for g, r, v in SPARK_DRIVER_RULES
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print the operator's install manifests.")
    parser.add_argument("--namespace", default="headrace-system", help="Where the operator runs.")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument(
        "--watch", action="append", default=[], help="Watch only this namespace (repeatable)."
    )
    args = parser.parse_args(argv)
    yaml.safe_dump_all(
        manifests(args.namespace, image=args.image, watch=tuple(args.watch)),
        sys.stdout,
        sort_keys=False,
    )


if __name__ == "__main__":
    main()
