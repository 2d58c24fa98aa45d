"""CustomResourceDefinition semantics only a real API server has: pruning, the status
subresource and optimistic concurrency."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.support import Cluster, wait_for

GROUP, VERSION, PLURAL = "e2e.headrace.dev", "v1", "widgets"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "color": {"type": "string"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def widgets(cluster: Cluster) -> Any:
    api = cluster.api()
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    wait_for("CRD Established", established, 60)
    return client.CustomObjectsApi(api)


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_unknown_fields_are_pruned(widgets: Any, namespace: str) -> None:
    body = widget("w1", size=2, color="red", flavour="bogus")
    body["extra"] = {"nested": True}
    widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    got = widgets.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w1")
    assert got["spec"] == {"size": 2, "color": "red"}
    assert "extra" not in got


def test_schema_validation_rejects_bad_values(widgets: Any, namespace: str) -> None:
    with pytest.raises(ApiException) as info:
        widgets.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, widget("w0", size=0)
        )
    assert info.value.status == 422


def test_status_patch_does_not_bump_generation(widgets: Any, namespace: str) -> None:
    created = widgets.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, widget("w2", size=1)
    )
    assert created["metadata"]["generation"] == 1
    patched = widgets.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "w2", {"status": {"phase": "Ready"}}
    )
    assert patched["status"] == {"phase": "Ready"}
    assert patched["metadata"]["generation"] == 1
    # Status written through the main resource is ignored; spec changes bump generation.
    patched = widgets.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "w2", {"spec": {"size": 5}, "status": {"phase": "X"}}
    )
    assert patched["metadata"]["generation"] == 2
    assert patched["status"] == {"phase": "Ready"}


def test_stale_resource_version_gets_409(widgets: Any, namespace: str) -> None:
    widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("w3", size=1))
    first = widgets.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w3")
    second = dict(first, spec={"size": 2})
    widgets.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w3", second)
    stale = dict(first, spec={"size": 3})  # still carries the first resourceVersion
    with pytest.raises(ApiException) as info:
        widgets.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w3", stale)
    assert info.value.status == 409
    final = widgets.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w3")
    assert final["spec"] == {"size": 2}
