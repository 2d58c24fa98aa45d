"""``helm install`` of a small local chart against the cluster."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.support import Cluster

CHART = {
    "Chart.yaml": "apiVersion: v2\nname: hello\nversion: 0.1.0\nappVersion: '1.0'\n",
    "values.yaml": "greeting: hello\nreplicas: 1\npython: [python3]\nimage: python:3.12-slim\n",
    "templates/configmap.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  greeting: {{ .Values.greeting | quote }}
""",
    "templates/deployment.yaml": """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels: {app: {{ .Release.Name }}}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}}
    spec:
      containers:
      - name: hello
        image: {{ .Values.image }}
        command: {{ toJson (concat .Values.python (list "-u" "-c" "import os,time; print(os.environ['GREETING'], flush=True); time.sleep(100000)")) }}
        env:
        - name: GREETING
          valueFrom:
            configMapKeyRef: {name: {{ .Release.Name }}-config, key: greeting}
        readinessProbe:
          exec:
            command: {{ toJson (concat .Values.python (list "-c" "pass")) }}
          periodSeconds: 2
""",
}


def test_helm_install_local_chart(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    chart = tmp_path / "hello"
    for rel, text in CHART.items():
        (chart / rel).parent.mkdir(parents=True, exist_ok=True)
        (chart / rel).write_text(text)
    python = json.dumps(cluster.python)
    cluster.run(
        cluster.helm,
        "install",
        "demo",
        str(chart),
        "--namespace",
        namespace,
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--set",
        "greeting=hi-from-helm",
        "--set-json",
        f"python={python}",
        "--set",
        f"image={cluster.image}",
        "--wait",
        "--timeout",
        "3m",
        timeout=240,
    )
    status = json.loads(
        cluster.run(
            cluster.helm,
            "status",
            "demo",
            "-n",
            namespace,
            "-o",
            "json",
            "--kubeconfig",
            str(cluster.kubeconfig),
        ).stdout
    )
    assert status["info"]["status"] == "deployed"
    cm = cluster.get("configmap", "demo-config", namespace)
    assert cm["data"]["greeting"] == "hi-from-helm"
    dep = cluster.get("deployment", "demo", namespace)
    assert dep["status"]["readyReplicas"] == 1
    pods = json.loads(
        cluster.kubectl_run("get", "pods", "-n", namespace, "-l", "app=demo", "-o", "json").stdout
    )["items"]
    assert "hi-from-helm" in cluster.logs(pods[0]["metadata"]["name"], namespace)
    cluster.run(
        cluster.helm,
        "uninstall",
        "demo",
        "-n",
        namespace,
        "--wait",
        "--kubeconfig",
        str(cluster.kubeconfig),
    )
