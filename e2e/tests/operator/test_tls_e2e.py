"""TLS for the brokers on Kubernetes end to end (docs/security.md §10).

Each test mints its own CA and a broker certificate with the test bed's PKI module
(``e2e.testbed.pki``) and puts it in a ``kubernetes.io/tls`` Secret, as cert-manager
would. The certificate names the cluster's Services, never a pod IP: the test bed's pods
get loopback addresses that change on every restart, and the test reaches them by IP (no
cluster DNS here), verifying the Service name (``--tls-server-name``), as every client
does on a real cluster.

* ``test_a_chart_installed_cluster_serves_tls_end_to_end``: the chart's example cluster
  with ``exampleCluster.tls.secretName``; the Topic becomes Ready (the operator's polls
  and pushes reach the brokers' admin ports over HTTPS with the Secret's ``ca.crt``, and
  acks=all needs the followers to fetch from the leader over TLS); records are produced
  and consumed by a client with the CA; a plaintext client is refused with a typed error;
  ``helm test`` (``headrace roundtrip`` with ``--tls-ca``) passes.
* ``test_a_missing_secret_then_mutual_tls_with_a_tls_user``: a cluster whose Secret does
  not exist yet is ``Ready=False TlsSecretMissing`` (and ``Stalled``); once the Secret is
  made it becomes Ready; with ``clientAuth: required``, a ``tls`` User's client
  certificate (signed by the CA) produces and consumes, and a client without one is
  refused.

On the test bed, stand-in or real node: the test reaches the brokers' pod IPs from this
host.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from e2e.support import Cluster, wait_for
from e2e.testbed import pki
from e2e.tests.operator.fixtures import (
    CHART,
    RELEASE,
    InstalledOperator,
    cluster_manifests,
    condition,
    figure,
    pod_ips,
    tls_secret,
    wait_ready,
)
from e2e.tests.operator.test_user_live_e2e import VOLUME_REFRESH_S
from headrace import tlsnames
from headrace.testing import procs


def mint(namespace: str, cluster_name: str = "demo") -> tuple[pki.CA, bytes, bytes, bytes]:
    """A CA and a broker certificate naming the cluster's Services (server and client:
    brokers present it to one another when they fetch)."""
    ca = pki.new_ca()
    cert, key = ca.issue(
        cluster_name,
        server=True,
        client=True,
        dns=(
            f"{cluster_name}.{namespace}.svc",
            f"*.{cluster_name}-brokers.{namespace}.svc",
        ),
    )
    return ca, cert, key, ca.cert.public_bytes(serialization.Encoding.PEM)


def tls_env(ca_file: Path, namespace: str, **extra: str) -> dict[str, str]:
    return {
        "HEADRACE_TLS_CA": str(ca_file),
        "HEADRACE_TLS_SERVER_NAME": f"demo.{namespace}.svc",
        **extra,
    }


def produce(bootstrap: str, topic: str, values: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = procs.run_headrace(
        "produce", topic, "--acks", "all", "--bootstrap", bootstrap,
        stdin="".join(f"{v}\n" for v in values).encode(), timeout=60, env=env,
    )  # fmt: skip
    return done.returncode, done.stderr.decode()


def consume(bootstrap: str, topic: str, env: dict[str, str]) -> set[str]:
    done = procs.run_headrace(
        "consume", topic, "--cohort", "check", "--from-beginning", "--idle-timeout", "5",
        "--bootstrap", bootstrap, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return set(done.stdout.decode().split())


def served_common_name(ip: str, ca_file: Path, server_name: str) -> str:
    """The subject CN of the certificate a new connection to a broker's data port gets."""
    context = tlsnames.client_context(ca_file, server_name)
    with (
        socket.create_connection((ip, 9092), timeout=5) as sock,
        context.wrap_socket(sock) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    name = x509.load_der_x509_certificate(der).subject
    return str(name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def pod_incarnations(cluster: Cluster, namespace: str) -> dict[str, tuple[str, int]]:
    """Pod name -> (uid, the broker container's restart count)."""
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
    )
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])),
        )
        for p in json.loads(out.stdout)["items"]
    }


def brokers(cluster: Cluster, namespace: str, count: int) -> str:
    ips = wait_for(
        f"{count} broker pod IPs",
        lambda: (found := pod_ips(cluster, namespace)) and len(found) >= count and found,
        90,
    )
    return ",".join(f"{ip}:9092" for ip in ips.values())


def test_a_chart_installed_cluster_serves_tls_end_to_end(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    operator: InstalledOperator,
    tmp_path: Path,
) -> None:
    ca, cert, key, ca_pem = mint(namespace)
    cluster.apply([tls_secret("demo-tls", cert, key, ca_pem)], namespace)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca_pem)
    started = time.monotonic()
    operator.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values",
        "--set", "exampleCluster.enabled=true",
        "--set", "exampleCluster.replicas=2",
        "--set", "exampleCluster.storageSize=32Mi",
        "--set", "exampleCluster.tls.secretName=demo-tls",
        "--set-json",
        'exampleCluster.topic={"name":"orders","partitions":2,"replicas":2,"minInSync":2}',
        "--wait", "--timeout", "3m",
    )  # fmt: skip
    # Ready: the operator's polls and pushes reached the brokers over HTTPS
    wait_ready(cluster, "topic", "orders", namespace, timeout=150)
    figure("TLS cluster: install to Topic Ready", time.monotonic() - started)
    sts = cluster.get("statefulset", "demo", namespace)["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "demo-tls", "defaultMode": 0o400}} in sts[
        "volumes"
    ]
    assert sts["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"

    bootstrap = brokers(cluster, namespace, 2)
    topic = f"{namespace}/orders"
    values = [f"tls-{i}" for i in range(20)]
    code, err = produce(bootstrap, topic, values, tls_env(ca_file, namespace))
    assert code == 0, err  # acks=all with minInSync 2: the follower fetched over TLS
    assert consume(bootstrap, topic, tls_env(ca_file, namespace)) == set(values)

    # a plaintext client gets a typed error, not a hang
    code, err = produce(bootstrap, topic, ["plain"], {})
    assert code != 0 and "ConnectionClosed" in err, err
    # nor does a client that trusts another CA get through
    other = tmp_path / "other-ca.crt"
    other.write_bytes(pki.new_ca().cert.public_bytes(serialization.Encoding.PEM))
    code, err = produce(bootstrap, topic, ["x"], tls_env(other, namespace))
    assert code != 0 and "certificate verify failed" in err, err

    # ``helm test``: the test pod mounts only ca.crt and verifies the Service name
    operator.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values",
        "--set-json", f"test.bootstrap={json.dumps(bootstrap)}",
        "--set", "test.records=30",
        "--wait", "--timeout", "3m",
    )  # fmt: skip
    out = operator.helm("test", RELEASE, "--logs", "--timeout", "4m", timeout=300)
    assert "Succeeded" in out, out
    checked = cluster.logs(f"{RELEASE}-headrace-test", namespace, "-c", "roundtrip")
    assert "consumed all 30 records marked" in checked, checked[-2000:]

    # a renewal (what cert-manager does before expiry): the Secret gets a new certificate;
    # the kubelet updates the volume and every broker serves it, with no pod restarted
    service = f"demo.{namespace}.svc"
    ips = list(pod_ips(cluster, namespace).values())
    assert {served_common_name(ip, ca_file, service) for ip in ips} == {"demo"}
    before = pod_incarnations(cluster, namespace)
    renewed_cert, renewed_key = ca.issue(
        "demo-renewed",
        server=True,
        client=True,
        dns=(service, f"*.demo-brokers.{namespace}.svc"),
    )
    renewed = time.monotonic()
    cluster.apply([tls_secret("demo-tls", renewed_cert, renewed_key, ca_pem)], namespace)
    wait_for(
        "every broker serving the renewed certificate",
        lambda: {served_common_name(ip, ca_file, service) for ip in ips} == {"demo-renewed"},
        VOLUME_REFRESH_S,
    )
    figure("TLS Secret renewed to every broker serving it", time.monotonic() - renewed)
    assert pod_incarnations(cluster, namespace) == before
    code, err = produce(bootstrap, topic, ["after-renewal"], tls_env(ca_file, namespace))
    assert code == 0, err


def test_a_missing_secret_then_mutual_tls_with_a_tls_user(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    operator: InstalledOperator,
    tmp_path: Path,
) -> None:
    docs = cluster_manifests(namespace, replicas=2, partitions=1, topic_replicas=2)
    docs[0]["spec"]["auth"] = {"enabled": True}
    docs[0]["spec"]["tls"] = {"enabled": True, "secretName": "demo-tls", "clientAuth": "required"}
    app_user = {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {"name": "app"},
        "spec": {
            "clusterRef": {"name": "demo"},
            "authentication": {"type": "tls", "commonName": "app.example"},
            "authorization": {
                "grants": [
                    {"operations": ["produce", "consume"], "topics": [f"{namespace}/orders"]}
                ]
            },
        },
    }
    cluster.apply([app_user, *docs], namespace)

    def tls_condition() -> dict[str, object] | None:
        ready = condition(cluster.get("brokercluster", "demo", namespace))
        return ready if ready is not None and ready["reason"] == "TlsSecretMissing" else None

    ready = wait_for("Ready=False TlsSecretMissing", tls_condition, 60)
    assert ready["status"] == "False" and "demo-tls" in str(ready["message"])
    stalled = condition(cluster.get("brokercluster", "demo", namespace), "Stalled")
    assert stalled is not None and stalled["status"] == "True"

    ca, cert, key, ca_pem = mint(namespace)
    made = time.monotonic()
    cluster.apply([tls_secret("demo-tls", cert, key, ca_pem)], namespace)
    wait_ready(cluster, "brokercluster", "demo", namespace, timeout=150)
    wait_ready(cluster, "topic", "orders", namespace, timeout=60)
    figure("TLS Secret made to BrokerCluster Ready", time.monotonic() - made)
    wait_ready(cluster, "user", "app", namespace, timeout=60)

    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca_pem)
    app_cert, app_key = ca.issue("app.example", client=True)
    (tmp_path / "app.crt").write_bytes(app_cert)
    (tmp_path / "app.key").write_bytes(app_key)
    with_cert = tls_env(
        ca_file,
        namespace,
        HEADRACE_TLS_CERT=str(tmp_path / "app.crt"),
        HEADRACE_TLS_KEY=str(tmp_path / "app.key"),
    )
    bootstrap = brokers(cluster, namespace, 2)
    topic = f"{namespace}/orders"
    values = [f"mtls-{i}" for i in range(10)]
    code, err = produce(bootstrap, topic, values, with_cert)
    assert code == 0, err
    assert consume(bootstrap, topic, with_cert) == set(values)

    # no client certificate: the TLS handshake itself is refused
    code, err = produce(bootstrap, topic, ["x"], tls_env(ca_file, namespace))
    assert code != 0 and "ConnectionClosed" in err, err
    # a certificate from another CA neither
    stranger_ca = pki.new_ca()
    s_cert, s_key = stranger_ca.issue("app.example", client=True)
    (tmp_path / "s.crt").write_bytes(s_cert)
    (tmp_path / "s.key").write_bytes(s_key)
    code, err = produce(
        bootstrap,
        topic,
        ["x"],
        tls_env(
            ca_file,
            namespace,
            HEADRACE_TLS_CERT=str(tmp_path / "s.crt"),
            HEADRACE_TLS_KEY=str(tmp_path / "s.key"),
        ),
    )
    assert code != 0 and "ConnectionClosed" in err, err
