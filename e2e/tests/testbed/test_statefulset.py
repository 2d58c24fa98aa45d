"""A StatefulSet of Python HTTP servers: distinct addresses, readiness, and a pod that
comes back with its name and its volume's contents."""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from e2e.support import Cluster, python_container, wait_for

# Writes a token into its data directory on first start, keeps it after, and serves
# {pod, ip, pid, token} on / and 200 on /healthz. It binds its own pod IP, as every
# test bed pod must (pods share the host's network stack).
SERVER = r"""
import http.server, json, os, secrets, sys
data = sys.argv[1]
os.makedirs(data, exist_ok=True)
path = os.path.join(data, "token")
if not os.path.exists(path):
    with open(path, "w") as f:
        f.write(secrets.token_hex(8))
token = open(path).read()
me = {"pod": os.environ["POD_NAME"], "ip": os.environ["POD_IP"], "pid": os.getpid(), "token": token}
print("serving", json.dumps(me), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(me).encode() if self.path == "/" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
"""


def manifests(cluster: Cluster) -> list[dict[str, Any]]:
    container = python_container(cluster, "web", SERVER, "/var/lib/web")
    container.update(
        env=[
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        ports=[{"name": "http", "containerPort": 8080}],
        readinessProbe={"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
        volumeMounts=[{"name": "data", "mountPath": "/var/lib/web"}],
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "web"},
            "spec": {
                "serviceName": "web",
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 5,
                        "containers": [container],
                        # a fresh volume is root:root 0755 on a real node, and the headrace
                        # image runs as 10001: its group must own the volume
                        "securityContext": {"fsGroup": 10001},
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "16Mi"}},
                        },
                    }
                ],
            },
        },
    ]


def served(cluster: Cluster, pod: str, namespace: str) -> dict[str, Any]:
    """What the server in ``pod`` says about itself, from its log (works on any provider)."""
    for line in cluster.logs(pod, namespace).splitlines():
        if line.startswith("serving "):
            return json.loads(line.removeprefix("serving "))  # type: ignore[no-any-return]
    raise AssertionError(f"{pod} has not logged its identity yet")


def ready_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]] | None:
    sts = cluster.get("statefulset", "web", namespace)
    if sts.get("status", {}).get("readyReplicas") != 3:
        return None
    out = cluster.kubectl_run("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json")
    pods = json.loads(out.stdout)["items"]
    ready = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
    ]
    return sorted(ready, key=lambda p: p["metadata"]["name"]) if len(ready) == 3 else None


def test_statefulset_pods_ready_on_distinct_addresses_and_keep_their_volume(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(manifests(cluster), namespace)
    pods = wait_for("3 ready StatefulSet pods", lambda: ready_pods(cluster, namespace), 180)

    assert [p["metadata"]["name"] for p in pods] == ["web-0", "web-1", "web-2"]
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 3, ips
    identities = {
        p["metadata"]["name"]: served(cluster, p["metadata"]["name"], namespace) for p in pods
    }
    for p in pods:
        name = p["metadata"]["name"]
        assert identities[name]["ip"] == p["status"]["podIP"]
    if cluster.is_testbed:
        # Three host processes, each answering on its own loopback address.
        pids = set()
        for name, ident in identities.items():
            assert ipaddress.ip_address(ident["ip"]).is_loopback
            with urllib.request.urlopen(f"http://{ident['ip']}:8080/", timeout=5) as resp:
                assert json.loads(resp.read())["pod"] == name
            os.kill(ident["pid"], 0)  # the process exists on this host
            pids.add(ident["pid"])
        assert len(pids) == 3

    old = pods[1]
    token = identities["web-1"]["token"]
    cluster.kubectl_run("delete", "pod", "web-1", "-n", namespace, "--wait=true", timeout=60)

    def replaced() -> dict[str, Any] | None:
        pods = ready_pods(cluster, namespace)
        if pods and pods[1]["metadata"]["uid"] != old["metadata"]["uid"]:
            return pods[1]
        return None

    new = wait_for("web-1 to come back Ready", replaced, 120)
    assert new["metadata"]["name"] == "web-1"
    again = served(cluster, "web-1", namespace)
    assert again["token"] == token, "the PVC's contents did not survive the pod"
    if cluster.is_testbed:
        # The claim's volume is a directory on the host that outlived the pod.
        claim = cluster.get("pvc", "data-web-1", namespace)
        assert claim["status"]["phase"] == "Bound"
        pv = cluster.get("pv", claim["spec"]["volumeName"], "")
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert (directory / "token").read_text() == token
        assert again["pid"] != identities["web-1"]["pid"]
        try:
            os.kill(identities["web-1"]["pid"], 0)
            raise AssertionError("the deleted pod's process is still running")
        except ProcessLookupError:
            pass
