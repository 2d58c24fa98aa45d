"""A namespace enforcing Pod Security "restricted": the chart's operator and a BrokerCluster's
brokers are admitted and the cluster gets Ready (before the brokers had a securityContext
the StatefulSet's pods were refused at creation and the cluster never got Ready).

Admission is the API server's own (the ``PodSecurity`` admission plugin, on by default),
so this holds on the test bed as on any cluster, although the test bed's runner ignores
``securityContext`` when it runs the processes. The profile's field-by-field check of
every pod the operator and the chart make is in the unit tests (``tests/podsecurity.py``).

On a real node (``E2E_NODE=real``, part of ``make test``) it also shows that the node is
real: each broker is a containerd container of the image this checkout built, and a pod
resolves the brokers' names through the cluster DNS.
"""

from __future__ import annotations

import json

import pytest

from e2e.support import Cluster, wait_for
from e2e.testbed import clusterdns, realnode
from e2e.tests.operator.fixtures import (
    InstalledOperator,
    cluster_manifests,
    consume,
    pod_ips,
    produce,
    wait_ready,
)

ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture
def namespace(cluster: Cluster, namespace: str) -> str:
    """The test's namespace, enforcing "restricted" before anything runs in it (the
    ``operator`` fixture installs the chart into it)."""
    cluster.kubectl_run(
        "label", "namespace", namespace, f"{ENFORCE}=restricted", f"{ENFORCE}-version=latest"
    )
    return namespace


def refused_pod(cluster: Cluster, namespace: str) -> str:
    """The API server's answer to a pod with no securityContext (empty if it was admitted)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unrestricted", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]},
    }
    done = cluster.kubectl_run(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    return done.stderr if done.returncode != 0 else ""


def refusals(cluster: Cluster, namespace: str) -> list[str]:
    """The StatefulSet controller's ``FailedCreate`` messages (admission's refusals)."""
    out = cluster.kubectl_run(
        "get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate", "-o", "json"
    ).stdout
    return sorted({e["message"] for e in json.loads(out)["items"]})


def assert_brokers_are_containers(cluster: Cluster, namespace: str) -> None:
    """On a real node: each broker is a container containerd runs, of the image imported
    from this checkout's build (its config digest is buildah's image id)."""
    image_id = realnode.buildah_image_id(cluster.image)
    pods = json.loads(
        cluster.kubectl_run(
            "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 3
    for pod in pods:
        (broker,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "broker"]
        assert broker["containerID"].startswith("containerd://"), broker
        assert broker["imageID"].endswith(image_id), (broker, image_id)
        assert broker["started"] and broker["ready"], broker


RESOLVE = """
import json, socket, sys
print(json.dumps({
    "resolv.conf": open("/etc/resolv.conf").read(),
    "names": {name: sorted(socket.gethostbyname_ex(name)[2]) for name in sys.argv[1:]},
}))
"""


def assert_a_pod_resolves_the_brokers_names(cluster: Cluster, namespace: str) -> None:
    """On a real node, through the cluster DNS (CoreDNS, the kubelet's clusterDNS): a pod
    resolves the headless Service's name to every broker and each broker's stable name
    (``<pod>.<headless>.<ns>.svc``, what brokers advertise where there is cluster DNS,
    through the pod's search path) to that broker's pod IP."""
    ips = pod_ips(cluster, namespace)
    headless = f"demo-brokers.{namespace}.svc.cluster.local"
    stable = {i: f"demo-{i}.demo-brokers.{namespace}.svc" for i in ips}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "resolver"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "resolve",
                    "image": cluster.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", RESOLVE, headless, *stable.values()],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    cluster.apply([pod], namespace)
    done = wait_for(
        "the resolver pod to finish",
        lambda: (
            (p := cluster.get("pod", "resolver", namespace))["status"].get("phase")
            in ("Succeeded", "Failed")
            and p
        ),
        90,
    )
    out = cluster.logs("resolver", namespace)
    assert done["status"]["phase"] == "Succeeded", out
    answer = json.loads(out.strip().splitlines()[-1])
    assert f"nameserver {clusterdns.CLUSTER_DNS_IP}" in answer["resolv.conf"]
    assert answer["names"][headless] == sorted(ips.values())
    for i, name in stable.items():
        assert answer["names"][name] == [ips[i]], (name, answer)


def test_a_broker_cluster_gets_ready_where_restricted_is_enforced(
    cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    # admission is on: a pod without the profile's settings is refused here
    assert "violates PodSecurity" in refused_pod(cluster, namespace)
    cluster.apply(cluster_manifests(namespace, replicas=3), namespace)
    try:
        wait_ready(cluster, "brokercluster", "demo", namespace, timeout=180)
    except AssertionError as not_ready:
        raise AssertionError(
            f"not Ready; the StatefulSet's refusals: {refusals(cluster, namespace)}"
        ) from not_ready
    wait_ready(cluster, "topic", "orders", namespace)
    # every broker pod was admitted and is Ready (the StatefulSet's count trails the pods')
    wait_for(
        "3 ready broker pods",
        lambda: cluster.get("statefulset", "demo", namespace)["status"].get("readyReplicas") == 3,
        60,
    )
    if cluster.real_node:
        assert_brokers_are_containers(cluster, namespace)
        assert_a_pod_resolves_the_brokers_names(cluster, namespace)
    if cluster.host_reaches_pod_ips:
        bootstrap = ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values())
        values = [f"restricted-{i}" for i in range(20)]
        produce(bootstrap, f"{namespace}/orders", values)
        assert consume(bootstrap, f"{namespace}/orders") == set(values)
