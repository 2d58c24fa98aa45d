"""The runner's kubelet duties beyond the must-show list: env, volumes, init containers,
probes, restarts, graceful termination and logs. Test bed only (host-side checks)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.support import Cluster, python_container, wait_for

pytestmark = pytest.mark.usefixtures("testbed_only")


def pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": list(containers), **spec},
    }


def status(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    return cluster.get("pod", name, ns)["status"]  # type: ignore[no-any-return]


def phase_is(cluster: Cluster, name: str, ns: str, *phases: str) -> str | None:
    p = status(cluster, name, ns).get("phase")
    return p if p in phases else None


ENV_DUMP = r"""
import os, sys
for k in sys.argv[1:]:
    print(f"{k}={os.environ.get(k)}")
"""


def test_env_from_downward_api_configmaps_and_secrets(cluster: Cluster, namespace: str) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"mode": "fast", "LEVEL": "3"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"password": base64.b64encode(b"s3cret").decode()},
    }
    c = python_container(
        cluster,
        "main",
        ENV_DUMP,
        "POD_NAME",
        "POD_NS",
        "POD_IP",
        "MODE",
        "PASSWORD",
        "CFG_LEVEL",
        "COMBINED",
        "CPU_LIMIT",
        "KUBERNETES_SERVICE_HOST",
    )
    c["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "COMBINED", "value": "$(POD_NAME)/$(MODE)"},
        {
            "name": "CPU_LIMIT",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}},
        },
    ]
    c["envFrom"] = [{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}]
    c["resources"] = {"limits": {"cpu": "250m"}}
    cluster.apply([cm, secret, pod("env", c, restartPolicy="Never")], namespace)
    wait_for("pod to succeed", lambda: phase_is(cluster, "env", namespace, "Succeeded"))
    ip = status(cluster, "env", namespace)["podIP"]
    lines = set(cluster.logs("env", namespace).splitlines())
    expected = {
        "POD_NAME=env",
        f"POD_NS={namespace}",
        f"POD_IP={ip}",
        "MODE=fast",
        "PASSWORD=s3cret",
        "CFG_LEVEL=3",
        "COMBINED=env/fast",
        "CPU_LIMIT=250",
        "KUBERNETES_SERVICE_HOST=127.0.0.1",
    }
    assert expected <= lines, lines


READ_FILES = r"""
import os, sys
for path in sys.argv[1:]:
    print(path.rsplit("/", 1)[-1] + "=" + open(path).read().strip())
"""


def test_volumes_and_init_containers(cluster: Cluster, namespace: str) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "files"},
        "data": {"app.conf": "color=blue"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "keys"},
        "data": {"key.pem": base64.b64encode(b"PRIVATE").decode()},
    }
    init = python_container(
        cluster,
        "prepare",
        "import sys; open(sys.argv[1], 'w').write('from-init')",
        "/work/greeting",
    )
    init["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    main = python_container(
        cluster,
        "main",
        READ_FILES,
        "/work/greeting",
        "/etc/app/app.conf",
        "/etc/keys/key.pem",
        "/etc/podinfo/labels",
    )
    main["volumeMounts"] = [
        {"name": "work", "mountPath": "/work"},
        {"name": "conf", "mountPath": "/etc/app"},
        {"name": "keys", "mountPath": "/etc/keys", "readOnly": True},
        {"name": "podinfo", "mountPath": "/etc/podinfo"},
    ]
    volumes = [
        {"name": "work", "emptyDir": {}},
        {"name": "conf", "configMap": {"name": "files"}},
        {"name": "keys", "secret": {"secretName": "keys"}},
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
            },
        },
    ]
    spec = pod("vols", main, initContainers=[init], volumes=volumes, restartPolicy="Never")
    cluster.apply([cm, secret, spec], namespace)
    wait_for("pod to succeed", lambda: phase_is(cluster, "vols", namespace, "Succeeded"))
    lines = set(cluster.logs("vols", namespace).splitlines())
    assert {
        "greeting=from-init",
        "app.conf=color=blue",
        "key.pem=PRIVATE",
        'labels=app="vols"',
    } <= lines, lines
    st = status(cluster, "vols", namespace)
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


WATCH_FILES = r"""
import sys, time
seen = {}
while True:
    for word in sys.argv[1:]:
        label, path = word.split("=", 1)
        try:
            text = open(path).read().strip()
        except OSError as exc:
            text = f"<{type(exc).__name__}>"
        if seen.get(word) != text:
            seen[word] = text
            print(label + "=" + text, flush=True)
    time.sleep(0.1)
"""


def test_running_pods_see_configmap_and_secret_updates_but_not_in_subpaths(
    cluster: Cluster, namespace: str
) -> None:
    """The kubelet keeps ConfigMap, Secret and projected volumes of a running pod in step
    with their sources (the runner's ``volume_refresh_s``); a ``subPath`` mount keeps what
    it had at container start. The container is never restarted for it."""

    def sources(color: str, key: str) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "live"},
                "data": {"app.conf": f"color={color}"},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "live-keys"},
                "data": {"key.pem": base64.b64encode(key.encode()).decode()},
            },
        ]

    main = python_container(
        cluster,
        "main",
        WATCH_FILES,
        "app.conf=/etc/app/app.conf",
        "key.pem=/etc/keys/key.pem",
        "app.conf=/etc/both/app.conf",
        "pinned.conf=/etc/pinned.conf",
    )
    main["volumeMounts"] = [
        {"name": "conf", "mountPath": "/etc/app"},
        {"name": "keys", "mountPath": "/etc/keys", "readOnly": True},
        {"name": "both", "mountPath": "/etc/both"},
        {"name": "conf", "mountPath": "/etc/pinned.conf", "subPath": "app.conf"},
    ]
    volumes = [
        {"name": "conf", "configMap": {"name": "live"}},
        {"name": "keys", "secret": {"secretName": "live-keys"}},
        {
            "name": "both",
            "projected": {"sources": [{"configMap": {"name": "live"}}]},
        },
    ]
    cluster.apply([*sources("blue", "K1"), pod("live", main, volumes=volumes)], namespace)

    def logged(*lines: str) -> bool:
        return set(lines) <= set(cluster.logs("live", namespace).splitlines())

    wait_for(
        "first contents",
        lambda: logged("app.conf=color=blue", "key.pem=K1", "pinned.conf=color=blue"),
    )
    uid = cluster.get("pod", "live", namespace)["metadata"]["uid"]
    cluster.apply(sources("red", "K2"), namespace)

    def updated() -> list[str] | None:
        out: list[str] = cluster.logs("live", namespace).splitlines()
        # the configMap and the projected volume both show app.conf
        return out if out.count("app.conf=color=red") == 2 and "key.pem=K2" in out else None

    out = wait_for("updated contents", updated, 30)
    # never half-written: each file goes straight from its old content to its new
    assert [line for line in out if line.startswith("key.pem=")] == ["key.pem=K1", "key.pem=K2"]
    assert [line for line in out if line.startswith("pinned.conf=")] == ["pinned.conf=color=blue"]
    st = status(cluster, "live", namespace)
    assert cluster.get("pod", "live", namespace)["metadata"]["uid"] == uid
    assert st["containerStatuses"][0]["restartCount"] == 0


def test_missing_secret_blocks_start_until_created(cluster: Cluster, namespace: str) -> None:
    c = python_container(cluster, "main", "import os; print('pw=' + os.environ['PW'])")
    c["env"] = [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "later", "key": "pw"}}}]
    cluster.apply([pod("waits", c, restartPolicy="Never")], namespace)

    def waiting_reason() -> str | None:
        cs = status(cluster, "waits", namespace).get("containerStatuses") or [{}]
        return cs[0].get("state", {}).get("waiting", {}).get("reason")

    assert wait_for("config error", lambda: waiting_reason() == "CreateContainerConfigError")
    assert status(cluster, "waits", namespace)["phase"] == "Pending"
    cluster.kubectl_run(
        "create", "secret", "generic", "later", "--from-literal=pw=ok", "-n", namespace
    )
    wait_for("pod to succeed", lambda: phase_is(cluster, "waits", namespace, "Succeeded"))
    assert "pw=ok" in cluster.logs("waits", namespace)


FLAKY = r"""
import os, sys
marker = sys.argv[1] + "/attempted"
if not os.path.exists(marker):
    open(marker, "w").close()
    print("first attempt fails", flush=True)
    sys.exit(7)
print("second attempt works", flush=True)
"""


def test_on_failure_restarts_then_succeeds_with_previous_logs(
    cluster: Cluster, namespace: str
) -> None:
    c = python_container(cluster, "main", FLAKY, "/state")
    c["volumeMounts"] = [{"name": "state", "mountPath": "/state"}]
    cluster.apply(
        [pod("flaky", c, restartPolicy="OnFailure", volumes=[{"name": "state", "emptyDir": {}}])],
        namespace,
    )
    wait_for("pod to succeed", lambda: phase_is(cluster, "flaky", namespace, "Succeeded"))
    cs = status(cluster, "flaky", namespace)["containerStatuses"][0]
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 7
    assert "second attempt works" in cluster.logs("flaky", namespace)
    assert "first attempt fails" in cluster.logs("flaky", namespace, "--previous")


# Serves /healthz while a file exists; the liveness probe restarts it once it is gone.
HEALTH = r"""
import http.server, os, sys
flag = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = os.path.exists(flag)
        self.send_response(200 if ok else 500)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["POD_IP"], 8081), H).serve_forever()
"""


def test_probes_readiness_exec_tcp_and_liveness_restart(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    flag = tmp_path / "healthy"
    ready_flag = tmp_path / "ready"
    flag.touch()
    c = python_container(cluster, "main", HEALTH, str(flag))
    c["env"] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    c["ports"] = [{"name": "http", "containerPort": 8081}]
    c["livenessProbe"] = {
        "httpGet": {"path": "/healthz", "port": "http"},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    c["readinessProbe"] = {"exec": {"command": ["test", "-e", str(ready_flag)]}, "periodSeconds": 1}
    c["startupProbe"] = {"tcpSocket": {"port": 8081}, "periodSeconds": 1, "failureThreshold": 30}
    cluster.apply([pod("probed", c, terminationGracePeriodSeconds=2)], namespace)

    def ready() -> bool:
        return bool(
            status(cluster, "probed", namespace).get("containerStatuses", [{}])[0].get("ready")
        )

    def started() -> bool:
        return bool(
            status(cluster, "probed", namespace).get("containerStatuses", [{}])[0].get("started")
        )

    wait_for("startup probe to pass", started)
    time.sleep(2)
    assert not ready(), "ready before the exec readiness probe passed"
    ready_flag.touch()
    wait_for("Ready", ready, 30)
    ready_flag.unlink()
    wait_for("not Ready", lambda: not ready(), 30)

    flag.unlink()  # liveness now fails: the runner must kill and restart the container

    def restarted() -> int:
        return int(status(cluster, "probed", namespace)["containerStatuses"][0]["restartCount"])

    wait_for("liveness restart", lambda: restarted() >= 1, 60)
    flag.touch()
    ready_flag.touch()
    wait_for("Ready after restart", ready, 60)


TERM_HANDLER = r"""
import signal, sys, time
out = sys.argv[1]
def on_term(*_):
    open(out, "a").write("got SIGTERM\n")
    if sys.argv[2] == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("running", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize(
    ("mode", "min_s", "hook"), [("exit", 0.0, False), ("ignore", 3.0, False), ("exit", 0.0, True)]
)
def test_deletion_sends_sigterm_then_sigkill_after_grace(
    cluster: Cluster, namespace: str, tmp_path: Path, mode: str, min_s: float, hook: bool
) -> None:
    record = tmp_path / "signals"
    c = python_container(cluster, "main", TERM_HANDLER, str(record), mode)
    if hook:  # the preStop hook runs to completion before SIGTERM
        c["lifecycle"] = {
            "preStop": {"exec": {"command": ["sh", "-c", f"sleep 1; echo preStop >> {record}"]}}
        }
    cluster.apply([pod("term", c, terminationGracePeriodSeconds=3)], namespace)
    wait_for("running", lambda: "running" in cluster.logs("term", namespace))
    pid = int(
        status(cluster, "term", namespace)["containerStatuses"][0]["containerID"].split("//")[1]
    )
    start = time.monotonic()
    cluster.kubectl_run("delete", "pod", "term", "-n", namespace, "--wait=true", timeout=60)
    took = time.monotonic() - start
    assert record.read_text() == ("preStop\n" if hook else "") + "got SIGTERM\n"
    assert took >= min_s
    assert took < 3.0 + 10, took
    assert not Path(f"/proc/{pid}").exists(), "process survived its pod"
