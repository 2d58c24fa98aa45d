"""The real node's configuration (``e2e.testbed.realnode``): pure renderings, no daemons."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest

from e2e.testbed import clusterdns, controlplane, realnode
from e2e.testbed.settings import Settings


def _settings(tmp_path: Path, node: str = "real") -> Settings:
    return Settings.from_env(
        {"HEADRACE_CACHE": str(tmp_path / "cache"), "HEADRACE_TESTBED_STATE": str(tmp_path / "tb"),
         "E2E_NODE": node}
    )  # fmt: skip


def test_e2e_node_chooses_the_node_and_rejects_anything_else(tmp_path: Path) -> None:
    assert _settings(tmp_path).real_node
    assert not _settings(tmp_path, "stand-in").real_node
    assert not Settings.from_env({"HEADRACE_CACHE": str(tmp_path)}).real_node
    with pytest.raises(ValueError, match="E2E_NODE"):
        _settings(tmp_path, "kind")


def test_containerd_keeps_everything_under_the_node_directory(tmp_path: Path) -> None:
    layout = realnode.NodeLayout.of(_settings(tmp_path))
    config = tomllib.loads(realnode.containerd_config(layout))
    assert config["grpc"]["address"] == str(layout.containerd_socket)
    assert Path(config["root"]).is_relative_to(layout.root)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == realnode.PAUSE_IMAGE
    # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False


def test_kubelet_accepts_cgroup_v1_and_serves_on_the_given_port(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    config = realnode.kubelet_config(settings, realnode.NodeLayout.of(settings), 12345)
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["port"] == 12345
    assert config["containerRuntimeEndpoint"] == (
        f"unix://{realnode.NodeLayout.of(settings).containerd_socket}"
    )


def test_pod_network_names_fit_the_kernel(tmp_path: Path) -> None:
    for block in (1, 254):
        net = realnode.PodNetwork(block)
        assert len(net.bridge) <= 15  # IFNAMSIZ - 1
        assert net.subnet == f"10.244.{block}.0/24"
        assert net.gateway == f"10.244.{block}.1"


def test_the_real_nodes_volumes_are_local_and_pinned_to_it(tmp_path: Path) -> None:
    from e2e.testbed import provisioning

    claim = {
        "metadata": {"name": "data-demo-0", "namespace": "ns", "uid": "u1"},
        "spec": {"resources": {"requests": {"storage": "64Mi"}}},
    }
    storage_class = {"metadata": {"name": "standard"}, "reclaimPolicy": "Delete"}
    pv = provisioning.volume_for_claim(claim, storage_class, tmp_path, node="testbed-node")
    # fsGroup applies to local volumes, never to hostPath ones
    assert pv["spec"]["local"] == {"path": str(tmp_path / "pvc-u1")}
    assert "hostPath" not in pv["spec"]
    (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["testbed-node"]
    assert provisioning.volume_path(pv) == tmp_path / "pvc-u1"
    # the stand-in's stay hostPath
    assert "hostPath" in provisioning.volume_for_claim(claim, storage_class, tmp_path)["spec"]


def test_a_serving_certificate_is_reissued_when_its_names_change(tmp_path: Path) -> None:
    from cryptography import x509

    from e2e.testbed import pki

    pki.ensure(tmp_path)

    def names() -> set[str]:
        cert = x509.load_pem_x509_certificate((tmp_path / "node.crt").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(n.value) for n in sans}

    pki.ensure_serving(tmp_path, "node", ("localhost",), ("127.0.0.1", "192.0.2.2"))
    first = (tmp_path / "node.crt").read_bytes()
    pki.ensure_serving(tmp_path, "node", ("localhost",), ("127.0.0.1", "192.0.2.2"))
    assert (tmp_path / "node.crt").read_bytes() == first  # same names: kept
    pki.ensure_serving(tmp_path, "node", ("localhost",), ("127.0.0.1", "192.0.2.9"))
    assert names() == {"localhost", "127.0.0.1", "192.0.2.9"}


def test_pods_get_the_cluster_dns_service_as_their_nameserver(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    config = realnode.kubelet_config(settings, realnode.NodeLayout.of(settings), 10250)
    assert config["clusterDNS"] == [clusterdns.CLUSTER_DNS_IP]
    assert config["clusterDomain"] == clusterdns.CLUSTER_DOMAIN
    assert ipaddress.ip_address(clusterdns.CLUSTER_DNS_IP) in ipaddress.ip_network(
        controlplane.SERVICE_CIDR
    )
    kinds = {collection.rpartition("/")[2]: obj for collection, obj in clusterdns.objects()}
    service, deployment = kinds["services"], kinds["deployments"]
    assert service["metadata"]["name"] == clusterdns.SERVICE
    assert service["spec"]["clusterIP"] == clusterdns.CLUSTER_DNS_IP
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"] in realnode.IMAGE_ARCHIVES.values()
    # what the Service sends DNS to is what CoreDNS listens on, as the Corefile says
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {
        p["containerPort"] for p in container["ports"]
    }
    assert clusterdns.COREFILE.startswith(f".:{clusterdns.DNS_PORT} ")


def test_the_cri_counts_as_started_only_from_this_start_of_containerd(tmp_path: Path) -> None:
    log = tmp_path / "containerd.log"
    log.write_text(f"earlier boot\n{realnode.CRI_STARTED}\n")
    since = log.stat().st_size
    assert not realnode.cri_started(log, since)
    with log.open("a") as f:
        f.write('msg="containerd successfully booted in 0.05s"\n')
    assert not realnode.cri_started(log, since)
    with log.open("a") as f:
        f.write(f"time=now level=info {realnode.CRI_STARTED}\n")
    assert realnode.cri_started(log, since)
    assert not realnode.cri_started(tmp_path / "absent.log", 0)
