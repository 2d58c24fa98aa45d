"""ipam, log tails, provisioning, kubeconfigs, certificates, versions."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

from e2e.testbed import ipam, kubeconfig, logserving, pki, provisioning, settings


def test_ipam_allocates_distinct_stable_addresses_and_prefers_previous() -> None:
    pool = ipam.Pool()
    a, b = pool.allocate("a"), pool.allocate("b")
    assert a != b
    assert a.startswith("127.")
    assert a != "127.0.0.1"
    assert pool.allocate("a") == a
    pool.release("a")
    assert pool.allocate("c") not in (a, b)  # round robin, not immediate reuse
    assert pool.allocate("d", prefer="127.0.9.9") == "127.0.9.9"
    assert pool.allocate("e", prefer="127.0.9.9") != "127.0.9.9"  # taken
    assert pool.allocate("f", prefer="10.0.0.1") != "10.0.0.1"  # not loopback


def test_ipam_skips_network_and_broadcast_looking_addresses() -> None:
    pool = ipam.Pool(next=ipam.from_str("127.0.0.254") or 0)
    assert pool.allocate("x") == "127.0.0.254"
    assert pool.allocate("y") == "127.0.1.1"


def test_ipam_blocks_keep_test_beds_apart() -> None:
    block = ipam.block_for("/some/state")
    assert 1 <= block <= 254
    assert block == ipam.block_for("/some/state")
    pool = ipam.Pool(block=block)
    assert pool.allocate("a") == f"127.{block}.0.2"
    assert pool.allocate("b", prefer="127.0.0.9") != "127.0.0.9"  # outside the block


def test_tail_bytes() -> None:
    data = b"a\nb\nc\n"
    assert logserving.tail_bytes(data, 2) == b"b\nc\n"
    assert logserving.tail_bytes(data, 0) == b""
    assert logserving.tail_bytes(data, -1) == data


def test_volume_for_claim_is_pre_bound_under_the_volumes_dir(tmp_path: Path) -> None:
    claim = {
        "metadata": {"name": "data-web-0", "namespace": "ns", "uid": "u"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cls = {"metadata": {"name": "standard"}, "reclaimPolicy": "Delete"}
    pv = provisioning.volume_for_claim(claim, cls, tmp_path)
    assert pv["spec"]["claimRef"]["uid"] == "u"
    assert pv["spec"]["storageClassName"] == "standard"
    assert provisioning.volume_path(pv) == tmp_path / "pvc-u"


def test_kubeconfig_render() -> None:
    doc = json.loads(kubeconfig.render("https://127.0.0.1:1", ca_file=Path("/ca"), token="t"))
    assert doc["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:1",
        "certificate-authority": "/ca",
    }
    assert doc["users"][0]["user"] == {"token": "t"}


def test_pki_chain_verifies_and_is_reused(tmp_path: Path) -> None:
    pki.ensure(tmp_path)
    first = (tmp_path / "apiserver.crt").read_bytes()
    pki.ensure(tmp_path)
    assert (tmp_path / "apiserver.crt").read_bytes() == first
    # The serving cert chains to the CA and names 127.0.0.1.
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    ctx.load_cert_chain(str(tmp_path / "admin.crt"), str(tmp_path / "admin.key"))
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(first)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    admin = x509.load_pem_x509_certificate((tmp_path / "admin.crt").read_bytes())
    orgs = [
        a.value for a in admin.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    ]
    assert orgs == ["system:masters"]


def test_versions_file_names_all_components() -> None:
    v = settings.read_versions()
    assert {"K8S_VERSION", "ETCD_VERSION", "HELM_VERSION", "COREDNS_VERSION"} <= set(v)
    assert v["K8S_VERSION"].startswith("v1.")
    gomod = (settings.SOURCE_DIR / "kube" / "go.mod").read_text()
    assert f"k8s.io/kubernetes {v['K8S_VERSION']}" in gomod
    coredns = (settings.SOURCE_DIR / "coredns" / "go.mod").read_text()
    assert f"require github.com/coredns/coredns {v['COREDNS_VERSION']}" in coredns
