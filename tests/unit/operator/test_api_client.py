"""The operator's API clients come from one place, and a pod needs no kubeconfig file.

A real cluster gives a pod a service account and ``KUBERNETES_SERVICE_HOST``, not a
kubeconfig; the test bed gives every pod a KUBECONFIG, which once hid that the Lease client
read only kubeconfig files (the operator crashed at start in a real cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest

from headrace.operator import kube


def test_a_pod_without_kubeconfig_uses_its_service_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    loaded: list[bool] = []

    def in_cluster() -> None:  # the service account files exist only in a pod
        loaded.append(True)
        configuration: Any = kubernetes.client.Configuration()
        configuration.host = "https://10.96.0.1:443"
        kubernetes.client.Configuration.set_default(configuration)

    monkeypatch.setattr(kubernetes.config, "load_incluster_config", in_cluster)
    client: Any = kube.api_client(None)
    assert loaded == [True]
    assert client.configuration.host == "https://10.96.0.1:443"


def test_an_explicit_kubeconfig_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        "clusters: [{name: t, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: t, user: {token: x}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
    )
    client: Any = kube.api_client(str(config))
    assert client.configuration.host == "https://127.0.0.1:6443"
