"""A BrokerCluster with ``spec.tls``, over a fake ``KubeApi``: the pods mount the Secret
as a volume and get the TLS flags and HTTPS probes; the operator's condition when the
Secret is missing or lacks keys; its polls switch to HTTPS with the Secret's ca.crt."""

from __future__ import annotations

import base64
import ssl
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from operator_fakes import CLUSTER, FakeApi

from e2e.testbed import pki
from headrace.operator import tlssecrets, workloads
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.resources.clusters import BrokerCluster
from tests.unit.controller.controller_fakes import ManualClock

CA_PEM = pki.new_ca().cert.public_bytes(serialization.Encoding.PEM).decode()


def body(**tls: Any) -> dict[str, Any]:
    return {**CLUSTER, "spec": {**CLUSTER["spec"], "tls": {"enabled": True, **tls}}}  # type: ignore[dict-item]


def parsed(**tls: Any) -> BrokerCluster:
    return BrokerCluster.from_manifest(body(**tls))


def tls_secret(name: str = "demo-tls", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": "ns"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


GOOD = {"tls.crt": "CERT", "tls.key": "KEY", "ca.crt": CA_PEM}


def container(cluster: BrokerCluster) -> dict[str, Any]:
    sts = workloads.statefulset(cluster, "uid-1", "ns", workloads.WorkloadSettings())
    return dict(sts["spec"]["template"]["spec"]["containers"][0])


def test_enabled_needs_a_secret_name() -> None:
    with pytest.raises(ValueError, match="secretName"):
        parsed()


def test_the_pods_mount_the_secret_and_serve_tls_on_both_ports() -> None:
    cluster = parsed(secretName="demo-tls")
    c = container(cluster)
    args = c["args"]

    def flag(name: str) -> str:
        return str(args[args.index(name) + 1])

    assert flag("--tls-cert") == "/etc/headrace/tls/tls.crt"
    assert flag("--tls-key") == "/etc/headrace/tls/tls.key"
    assert flag("--tls-ca") == "/etc/headrace/tls/ca.crt"
    assert flag("--tls-server-name") == "demo.ns.svc"
    assert flag("--admin-tls-cert") == "/etc/headrace/tls/tls.crt"
    assert "--tls-client-ca" not in args
    sts = workloads.statefulset(cluster, "uid-1", "ns", workloads.WorkloadSettings())
    volumes = [v for v in sts["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    # the whole Secret as a directory: renewals reach the running broker (no subPath)
    assert volumes == [{"name": "tls", "secret": {"secretName": "demo-tls", "defaultMode": 0o400}}]
    assert {"name": "tls", "mountPath": "/etc/headrace/tls", "readOnly": True} in c["volumeMounts"]
    assert all("subPath" not in m for m in c["volumeMounts"])
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HEADRACE_ADMIN_URL"].startswith("https://")
    assert env["HEADRACE_ADMIN_CA"] == "/etc/headrace/tls/ca.crt"
    assert env["HEADRACE_TLS_SERVER_NAME"] == "demo.ns.svc"


def test_client_certificates_and_a_separate_admin_secret() -> None:
    cluster = parsed(
        secretName="demo-tls",
        clientAuth="required",
        clientCASecretName="clients-ca",
        adminTls={"secretName": "demo-admin"},
    )
    args = container(cluster)["args"]
    assert args[args.index("--tls-client-ca") + 1] == "/etc/headrace/client-ca/ca.crt"
    assert args[args.index("--tls-client-auth") + 1] == "required"
    assert args[args.index("--admin-tls-cert") + 1] == "/etc/headrace/admin-tls/tls.crt"
    assert workloads.tls_secrets(cluster) == ["demo-tls", "demo-admin", "clients-ca"]
    # without its own client CA Secret, the serving Secret's ca.crt signs client certificates
    same = parsed(secretName="demo-tls", clientAuth="optional")
    args = container(same)["args"]
    assert args[args.index("--tls-client-ca") + 1] == "/etc/headrace/tls/ca.crt"
    assert args[args.index("--tls-client-auth") + 1] == "optional"


def test_admin_http_may_stay_plain_and_no_tls_changes_nothing() -> None:
    plain_admin = container(parsed(secretName="demo-tls", adminTls={"enabled": False}))
    assert "--admin-tls-cert" not in plain_admin["args"]
    assert "scheme" not in plain_admin["readinessProbe"]["httpGet"]
    off = BrokerCluster.from_manifest(CLUSTER)
    c = container(off)
    assert not any(a.startswith("--tls") for a in c["args"])
    assert "scheme" not in c["readinessProbe"]["httpGet"]  # the pod template as before
    pod = workloads.statefulset(off, "u", "ns", workloads.WorkloadSettings())["spec"]["template"]
    assert not [v for v in pod["spec"]["volumes"] if "secret" in v]


def test_the_check_names_a_missing_secret_or_key() -> None:
    cluster = parsed(secretName="demo-tls")
    missing = tlssecrets.check(cluster, {"demo-tls": None})
    assert missing.problem is not None and missing.problem[0] == "TlsSecretMissing"
    assert "demo-tls" in missing.problem[1]
    no_key = tlssecrets.check(
        cluster, {"demo-tls": tls_secret(**{"tls.crt": "C", "ca.crt": CA_PEM})}
    )
    assert no_key.problem == (
        "TlsSecretInvalid",
        "Secret 'demo-tls' (tls.secretName) lacks tls.key",
    )
    bad_ca = tlssecrets.check(cluster, {"demo-tls": tls_secret(**{**GOOD, "ca.crt": "junk"})})
    assert bad_ca.problem is not None and bad_ca.problem[0] == "TlsSecretInvalid"
    good = tlssecrets.check(cluster, {"demo-tls": tls_secret(**GOOD)})
    assert good.problem is None and good.admin_ca == CA_PEM
    # a message never holds the key
    assert "KEY" not in str(no_key.problem) + str(bad_ca.problem)


async def test_a_missing_secret_is_a_stalled_condition_and_the_polls_turn_https() -> None:
    api = FakeApi()
    cluster = api.put(body(secretName="demo-tls"))
    runtime = ClusterRuntime(DesiredObjects(cluster), ClusterPorts(api, ManualClock()))
    runtime.tls_checks.recheck_s = 0  # read the Secret at every step
    runtime.sync(cluster, [])
    await runtime.step()
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "TlsSecretMissing",
    )
    assert conditions["Stalled"]["status"] == "True"
    # HTTPS that verifies nothing, never plain HTTP: the polls carry the replication token
    waiting = runtime.pods.http._ssl if runtime.pods is not None else None
    assert waiting is not None and waiting.verify_mode == ssl.CERT_REQUIRED
    assert not waiting.get_ca_certs()

    api.put(tls_secret(**GOOD))
    runtime.sync(api.body("BrokerCluster", "demo"), [])
    await runtime.step()
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "BrokersNotLive"
    assert "Stalled" not in conditions
    context = runtime.pods.http._ssl
    assert context is not None and context.check_hostname
    assert getattr(context, "server_name", None) == "demo.ns.svc"
    assert runtime.rollout.ssl_context is context
