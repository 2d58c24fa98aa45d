"""Kubeconfig documents (pure: returns text, writes nothing).

Kubeconfigs are written as JSON, which is YAML too, so kubectl, client-go, helm and the
Python client all read them, and no YAML emitter is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def render(
    server: str,
    *,
    ca_file: Path | None = None,
    ca_data: str | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    token: str | None = None,
    user: str = "user",
    cluster: str = "headrace-testbed",
    namespace: str | None = None,
) -> str:
    """One cluster, one user, one current context named after the cluster."""
    cluster_entry: dict[str, Any] = {"server": server}
    if ca_file is not None:
        cluster_entry["certificate-authority"] = str(ca_file)
    if ca_data is not None:
        cluster_entry["certificate-authority-data"] = ca_data
    user_entry: dict[str, Any] = {}
    if cert_file is not None:
        user_entry["client-certificate"] = str(cert_file)
    if key_file is not None:
        user_entry["client-key"] = str(key_file)
    if token is not None:
        user_entry["token"] = token
    context: dict[str, Any] = {"cluster": cluster, "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": cluster, "context": context}],
        "current-context": cluster,
        "preferences": {},
    }
    return json.dumps(doc, indent=2) + "\n"
