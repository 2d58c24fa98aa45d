"""The real node's cluster DNS: CoreDNS as a pod in ``kube-system`` behind the ``kube-dns``
Service, which the kubelet names to every pod as its nameserver (``clusterDNS``).

Pure: the objects ``up`` creates, nothing else. CoreDNS is built from its Go module
(``e2e/testbed/coredns``, only the plugins used here) and its image from that binary
(``e2e/testbed/node/build.sh``); nothing is pulled. Its ``kubernetes`` plugin answers
``<svc>.<ns>.svc.cluster.local`` (a headless Service's name with its pods' addresses,
and ``<pod>.<svc>.<ns>.svc.cluster.local`` for a StatefulSet's pods) from the API server;
names outside the cluster domain are not forwarded anywhere (this machine has no
resolver to forward to that a test needs).
"""

from __future__ import annotations

from typing import Any

#: The kube-dns Service's ClusterIP: the tenth address of the service range, as kubeadm picks.
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "kube-system"
NAME = "coredns"
SERVICE = "kube-dns"
IMAGE = "localhost/testbed-coredns:1"
#: CoreDNS listens above 1024 as an unprivileged user; the Service maps port 53 to it.
DNS_PORT = 1053
READY_PORT = 8181
HEALTH_PORT = 8080

COREFILE = f""".:{DNS_PORT} {{
    errors
    health :{HEALTH_PORT}
    ready :{READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for each object of the cluster DNS, in creation order."""
    labels = {"k8s-app": SERVICE}
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    return [
        (f"{ns}/serviceaccounts", {"metadata": {"name": NAME}}),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "metadata": {"name": f"system:{NAME}"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["endpoints", "services", "pods", "namespaces"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["list", "watch"],
                    },
                ],
            },
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": f"system:{NAME}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"system:{NAME}",
                },
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            },
        ),
        (f"{ns}/configmaps", {"metadata": {"name": NAME}, "data": {"Corefile": COREFILE}}),
        ("/apis/apps/v1/namespaces/kube-system/deployments", deployment(labels)),
        (
            f"{ns}/services",
            {
                "metadata": {"name": SERVICE, "labels": labels},
                "spec": {
                    "selector": labels,
                    "clusterIP": CLUSTER_DNS_IP,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": DNS_PORT},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": DNS_PORT},
                    ],
                },
            },
        ),
    ]


def deployment(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    # its own nameserver would be itself: it resolves nothing through DNS
                    "dnsPolicy": "Default",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": NAME,
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": READY_PORT},
                                "periodSeconds": 2,
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": HEALTH_PORT},
                                "periodSeconds": 10,
                                "failureThreshold": 5,
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                },
            },
        },
    }
