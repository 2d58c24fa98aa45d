"""A change of ``storage.size`` (the StatefulSet's ``volumeClaimTemplates`` are immutable:
applied as it is, the API server answers 422): growth expands every broker's claim
where the StorageClass allows it and replaces the StatefulSet without its pods; a
shrink, or growth the class does not allow, is refused with a reason in status. The
workload handler as kopf calls it, over the operator's ``ClientApi`` and kmock's API
emulator (``server``)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER

from headrace.operator import handlers, workloads
from headrace.operator.kube import ClientApi
from tests.unit.controller.controller_fakes import ManualClock


def sized(generation: int, size: str) -> dict[str, Any]:
    body = copy.deepcopy(CLUSTER)
    body["metadata"]["generation"] = generation
    body["spec"]["storage"] = {"size": size}
    return body


def claims(server: ApiServer, size: str) -> None:
    """The brokers' claims, as the StatefulSet controller made them."""
    for i in range(3):
        server.put(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": f"data-demo-{i}",
                    "namespace": "ns",
                    "labels": {workloads.CLUSTER_LABEL: "demo"},
                },
                "spec": {"resources": {"requests": {"storage": size}}},
            }
        )


def storage_class(server: ApiServer, expandable: bool) -> None:
    server.put(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "standard",
                "annotations": {workloads.DEFAULT_CLASS_ANNOTATION: "true"},
            },
            "provisioner": "headrace.dev/local-dir",
            "allowVolumeExpansion": expandable,
        }
    )


def claim_sizes(server: ApiServer) -> list[str]:
    return [
        server.body("PersistentVolumeClaim", f"data-demo-{i}")["spec"]["resources"]["requests"][
            "storage"
        ]
        for i in range(3)
    ]


def statefulset_size(server: ApiServer) -> str | None:
    try:
        stored = server.objects["apps/v1/statefulsets", "ns", "demo"]
    except KeyError:
        return None
    return None if stored.deleted else workloads.claim_size(stored.raw)


async def started(server: ApiServer, api: ClientApi) -> handlers.OperatorContext:
    context = handlers.OperatorContext(api=api, clock=ManualClock())
    server.put(sized(1, "10Gi"))
    await handlers.apply_workload(sized(1, "10Gi"), context)
    assert statefulset_size(server) == "10Gi"
    claims(server, "10Gi")
    return context


async def test_growth_expands_every_claim_and_replaces_the_statefulset(
    server: ApiServer, api: ClientApi
) -> None:
    context = await started(server, api)
    storage_class(server, expandable=True)

    with pytest.raises(kopf.TemporaryError):  # kopf applies again once it is gone
        await handlers.apply_workload(sized(2, "20Gi"), context)
    assert claim_sizes(server) == ["20Gi"] * 3
    deletes = [r for r in server["delete"] if r.resource == "apps/v1/statefulsets"]
    assert [r.data.get("propagationPolicy") for r in deletes] == ["Orphan"], "pods stay"

    await handlers.apply_workload(sized(2, "20Gi"), context)
    assert statefulset_size(server) == "20Gi"
    outcome = context.workloads["ns", "demo"]
    assert (outcome.applied, outcome.failure) == (2, None)


@pytest.mark.parametrize(
    ("size", "expandable", "reason"),
    [
        ("5Gi", True, workloads.STORAGE_SHRINK),
        ("20Gi", False, workloads.STORAGE_NOT_EXPANDABLE),
    ],
)
async def test_a_shrink_or_growth_the_class_does_not_allow_is_refused_with_a_reason(
    server: ApiServer, api: ClientApi, size: str, expandable: bool, reason: str
) -> None:
    context = await started(server, api)
    storage_class(server, expandable=expandable)

    with pytest.raises(kopf.PermanentError):
        await handlers.cluster_workload(
            body=sized(2, size), namespace="ns", name="demo", memo=SimpleNamespace(context=context)
        )
    outcome = context.workloads["ns", "demo"]
    assert outcome.applied == 1, "generation 2 is not applied"
    assert outcome.failure is not None and outcome.failure.reason == reason
    assert "10Gi" in outcome.failure.message and size in outcome.failure.message
    assert claim_sizes(server) == ["10Gi"] * 3
    assert statefulset_size(server) == "10Gi"
