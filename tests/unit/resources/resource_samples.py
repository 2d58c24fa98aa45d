"""Shared manifests for the custom resource tests: one complete object per kind.

Imported by the tests as ``resource_samples`` (this directory is on ``sys.path``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
CRDS = ROOT / "crds"

T = "2026-01-02T03:04:05Z"
READY = [
    {
        "type": "Ready",
        "status": "True",
        "observedGeneration": 2,
        "lastTransitionTime": T,
        "reason": "Finalized",
        "message": "done",
    }
]

#: every field of every kind set, status included (what the operator would write)
COMPLETE: dict[str, dict[str, Any]] = {
    "BrokerCluster": {
        "spec": {
            "replicas": 3,
            "image": "ghcr.io/example/headrace:0.1.0",
            "storage": {"size": "20Gi", "storageClassName": "fast"},
            "objectStore": {
                "endpoint": "http://minio.default.svc:9000",
                "bucket": "headrace",
                "region": "us-east-1",
                "createBucket": True,
                "credentialsSecret": {
                    "name": "minio-credentials",
                    "accessKeyKey": "user",
                    "secretKeyKey": "password",
                },
            },
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2"}},
            "brokerConfig": {
                "fsyncPolicy": "always",
                "flushIntervalMs": 50,
                "segmentBytes": 1048576,
                "segmentMs": 3600000,
                "retentionMs": -1,
                "retentionBytes": 1073741824,
                "maxBatchBytes": 1048576,
                "checkpointIntervalMs": 1000,
                "cursorFlushIntervalMs": 100,
                "cohortGraceMs": 5000,
            },
            "scheduling": {
                "nodeSelector": {"disktype": "ssd"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"anything": ["goes", {"here": 1}]}},
            },
            "auth": {"enabled": True},
            "tls": {
                "enabled": True,
                "secretName": "main-tls",
                "clientAuth": "optional",
                "clientCASecretName": "main-client-ca",
                "adminTls": {"enabled": True, "secretName": "main-admin-tls"},
            },
            "listeners": {
                "external": {
                    "type": "NodePort",
                    "port": 9094,
                    "nodePortBase": 31000,
                    "annotations": {"example.com/lb-class": "internal"},
                    "tls": {"secretName": "external-tls"},
                }
            },
        },
        "status": {
            "observedGeneration": 2,
            "conditions": READY,
            "brokers": [
                {
                    "id": 0,
                    "address": "main-0.main:9092",
                    "live": True,
                    "draining": True,
                    "listeners": [{"name": "external", "host": "192.0.2.7", "port": 31000}],
                }
            ],
            "topologyGeneration": 17,
            "adoptionFloor": 16,
        },
    },
    "Topic": {
        "spec": {
            "clusterRef": {"name": "main"},
            "partitions": 12,
            "replicas": 3,
            "minInSync": 3,
            "retention": {"ms": 604800000, "bytes": -1},
            "segments": {"bytes": 1048576, "ms": 60000},
            "maxBatchBytes": 65536,
            "cleanupPolicy": "compact",
            "deletionPolicy": "Delete",
            "tieredStorage": {
                "enabled": False,
                "uploadIntervalSeconds": 5,
                "localRetentionMs": 60000,
                "localRetentionBytes": 1024,
            },
            "delivery": {"cohortGraceMs": 0},
        },
        "status": {
            "observedGeneration": 2,
            "conditions": READY,
            "partitioningVersion": 2,
            "partitions": [
                {
                    "partition": 0,
                    "leader": 1,
                    "replicas": [1, 2, 0],
                    "liveReplicas": [1, 2],
                    "leaderEpoch": 4,
                    "state": "Retiring",
                    "candidate": 2,
                    "deadlineMs": 1767322800000,
                    "tried": [2],
                    "seal": True,
                    "moves": 1,
                    "startOffset": 4096,
                    "targetReplicas": [3, 1, 2],
                }
            ],
            "transition": {
                "kind": "Shrink",
                "fromVersion": 1,
                "toVersion": 2,
                "fromPartitions": 24,
                "toPartitions": 12,
                "request": "default/orders-to-12",
                "cutoverMs": 1767322800000,
                "adoptionTimeoutMs": 30000,
                "adoptionGeneration": 17,
                "cutoverOffsets": [{"partition": 0, "offset": 4096}],
                "released": [{"cohort": "readers", "partitions": [0, 1]}],
                "drainedMs": 1767322800000,
            },
            "cohortPlans": [
                {"cohort": "readers", "generation": 3, "assignment": {"m-1": [0], "m-2": []}}
            ],
        },
    },
    "Repartition": {
        "spec": {"topicRef": {"name": "orders"}, "partitions": 24, "adoptionTimeoutSeconds": 60},
        "status": {
            "observedGeneration": 1,
            "conditions": READY,
            "phase": "Finalized",
            "fromPartitions": 12,
            "toPartitions": 24,
            "fromVersion": 1,
            "toVersion": 2,
            "adoptionGeneration": 17,
            "cutoverAt": T,
            "drainedAt": T,
            "finalizedAt": T,
            "finalizedBy": "AdoptionTimedOut",
        },
    },
    "Unload": {
        "spec": {"topicRef": {"name": "orders"}, "partitions": [3, 0], "targetBroker": 2},
        "status": {
            "observedGeneration": 1,
            "conditions": READY,
            "phase": "Completed",
            "moves": [
                {
                    "partition": 3,
                    "fromBroker": 0,
                    "toBroker": 2,
                    "sealedOffset": 21,
                    "phase": "Completed",
                    "verification": {"result": "Passed", "checkedAt": T, "message": ""},
                }
            ],
            "startedAt": T,
            "completedAt": T,
        },
    },
    "Compaction": {
        "spec": {
            "topicRef": {"name": "orders"},
            "partitions": [0, 1],
            "verify": False,
            "targetSegmentBytes": 134217728,
            "graceSeconds": 5,
            "backoffLimit": 0,
            "activeDeadlineSeconds": 3600,
            "sparkConf": {"spark.executor.memory": "2g"},
            "spark": {
                "master": "kubernetes",
                "executors": 3,
                "executorCores": 2,
                "executorMemory": "2g",
            },
        },
        "status": {
            "observedGeneration": 1,
            "conditions": READY,
            "phase": "Succeeded",
            "jobName": "orders-once-1",
            "attempts": 1,
            "startTime": T,
            "completionTime": T,
            "result": {
                "segmentsBefore": 40,
                "segmentsAfter": 4,
                "bytesReclaimed": -12,
                "verified": True,
                "mismatches": 0,
                "report": "main/default/orders/reports/1.json",
            },
        },
    },
    "CompactionSchedule": {
        "spec": {
            "topicRef": {"name": "orders"},
            "partitions": [],
            "verify": True,
            "targetSegmentBytes": 1,
            "graceSeconds": 0,
            "backoffLimit": 10,
            "activeDeadlineSeconds": 1,
            "sparkConf": {},
            "spark": {
                "master": "local",
                "executors": 1,
                "executorCores": 1,
                "executorMemory": "512m",
            },
            "schedule": "*/15 1-5 ? JAN-MAR,dec mon-fri",
            "suspend": True,
            "concurrencyPolicy": "Replace",
            "startingDeadlineSeconds": 300,
            "successfulJobsHistoryLimit": 0,
            "failedJobsHistoryLimit": 5,
        },
        "status": {
            "observedGeneration": 1,
            "conditions": READY,
            "lastScheduleTime": T,
            "lastSuccessfulTime": T,
            "active": [{"name": "orders-nightly-29000000"}],
            "lastJob": {"name": "orders-nightly-28999999"},
            "lastResult": {
                "segmentsBefore": 40,
                "segmentsAfter": 4,
                "bytesReclaimed": 0,
                "verified": False,
                "mismatches": 1,
                "report": "demo/team-a/orders/reports/compact-1.json",
            },
            "lastFailure": "BackoffLimitExceeded: Job has reached the specified backoff limit",
        },
    },
}

NAMES = {
    "BrokerCluster": "main",
    "Topic": "orders",
    "Repartition": "orders-to-24",
    "Unload": "orders-off-0",
    "Compaction": "orders-once",
    "CompactionSchedule": "orders-nightly",
}


def manifest(kind: str, **overrides: Any) -> dict[str, Any]:
    """The complete manifest of ``kind``; ``overrides`` replace top-level parts."""
    document: dict[str, Any] = {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": NAMES[kind], "namespace": "team-a", "labels": {"tier": "gold"}},
        **copy.deepcopy(COMPLETE[kind]),
    }
    document.update(overrides)
    return document
