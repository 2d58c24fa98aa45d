"""What brokers advertise: their stable names through the headless Service by default
(``<pod>.<cluster>-brokers.<namespace>.svc``, the same after a restart with a new IP),
their pod IPs where the cluster has no DNS (the test bed). They bind their pod IP in
either case, and the operator polls them there."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from operator_fakes import CLUSTER

from headrace.operator import main, workloads
from headrace.resources.clusters import BrokerCluster

BROKERS = BrokerCluster.from_manifest(CLUSTER)


def broker_container(settings: workloads.WorkloadSettings) -> dict[str, Any]:
    sts = workloads.statefulset(BROKERS, "uid-1", "ns", settings)
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return container


def flag(container: dict[str, Any], name: str) -> str:
    args = container["args"]
    return str(args[args.index(name) + 1])


def test_brokers_advertise_their_stable_names_through_the_headless_service() -> None:
    container = broker_container(workloads.WorkloadSettings())
    headless = next(
        m
        for m in workloads.manifests(BROKERS, "uid-1", "ns", workloads.WorkloadSettings())
        if m["kind"] == "Service" and m["spec"].get("clusterIP") == "None"
    )
    sts = workloads.statefulset(BROKERS, "uid-1", "ns", workloads.WorkloadSettings())
    # the StatefulSet's serviceName is that Service: it gives each pod <pod>.<service>
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"] == "demo-brokers"
    assert flag(container, "--advertised-host") == "$(POD_NAME).demo-brokers.ns.svc"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # names resolve before a pod is ready: a restarting broker's peers still reach it
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert workloads.stable_host(BROKERS, "demo-0") == "demo-0.demo-brokers.ns.svc"
    # it still binds its pod IP (the operator polls it there)
    assert flag(container, "--host") == flag(container, "--admin-host") == "$(POD_IP)"


def test_without_cluster_dns_they_advertise_their_pod_ips() -> None:
    container = broker_container(workloads.WorkloadSettings(advertise=workloads.Advertise.POD_IP))
    assert flag(container, "--advertised-host") == "$(POD_IP)"


def test_the_operator_takes_the_choice_from_its_flag_or_environment() -> None:
    help_text = CliRunner().invoke(main.operator, ["--help"]).output
    assert "--advertise [dns|podIP]" in help_text
    refused = CliRunner().invoke(main.operator, ["--advertise", "nodePort"])
    assert refused.exit_code == 2 and "nodePort" in refused.output
