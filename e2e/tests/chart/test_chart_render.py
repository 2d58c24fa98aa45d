"""``helm lint`` and ``helm template`` of charts/headrace for every ``ci/*-values.yaml``.

They need only the helm binary the test bed builds (no cluster); what they check of the
rendered objects is what a scenario promises: least-privilege RBAC in each mode, the
dashboard ConfigMap's sidecar label, a ``helm test`` pod that runs ``headrace``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed.settings import Settings
from tests.podsecurity import pod_spec_of, violations, writable_roots

CHART = Path(__file__).resolve().parents[3] / "charts" / "headrace"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACE = "headrace-system"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Settings.from_env().binary("helm")), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(*values: str) -> list[dict[str, Any]]:
    args = ["template", "hr", str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for v in values:
        args += ["-f", v] if v.endswith(".yaml") else ["--set", v]
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_lint_and_template(scenario: Path) -> None:
    lint = helm("lint", "--strict", str(CHART), "-f", str(scenario))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    by_kind = kinds(render(str(scenario)))
    assert len(by_kind["CustomResourceDefinition"]) == len(list((CHART / "crds").glob("*.yaml")))
    if by_kind.get("Deployment"):
        operator = next(
            d for d in by_kind["Deployment"] if d["metadata"]["name"].endswith("-operator")
        )
        container = operator["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][-1] == "headrace.operator"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_every_pod_fits_restricted(scenario: Path) -> None:
    # every scenario's pods (operator, MinIO, the helm test pod) pass a namespace that
    # enforces Pod Security "restricted", and write only to their volumes
    docs = render(str(scenario), "minio.enabled=true", "exampleCluster.enabled=true")
    pods = {f"{d['kind']}/{d['metadata']['name']}": pod_spec_of(d) for d in docs}
    checked = {name: pod for name, pod in pods.items() if pod is not None}
    assert {"Deployment/hr-headrace-operator", "Deployment/hr-headrace-minio"} <= set(checked)
    assert any(name.startswith("Pod/") for name in checked)
    for name, pod in checked.items():
        assert violations(pod) == [], name
        assert writable_roots(pod) == [], name


def operator_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's Roles (not the Spark drivers', ``test_spark_drivers_...``, nor its
    Lease's, ``test_the_lease_is_granted_...``)."""
    return [
        d
        for d in docs
        if d["kind"] == "Role" and not d["metadata"]["name"].endswith(("-spark", "-lease"))
    ]


def test_the_lease_is_granted_by_name_in_the_release_namespace_only() -> None:
    # a cluster-wide grant on leases could rewrite kube-system's leader elections
    from headrace.operator.install import lease_rules

    for values in ((), (str(CHART / "ci" / "namespaced-values.yaml"),)):
        docs = render(*values)
        for d in docs:
            if d["kind"] in ("ClusterRole", "Role") and not d["metadata"]["name"].endswith(
                "-lease"
            ):
                assert all("leases" not in rule["resources"] for rule in d["rules"]), d
        (lease,) = [
            d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-lease")
        ]
        assert lease["metadata"]["namespace"] == NAMESPACE
        assert lease["rules"] == lease_rules()
        (binding,) = [
            d
            for d in docs
            if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-lease")
        ]
        assert binding["roleRef"]["name"] == lease["metadata"]["name"]


def test_cluster_wide_mode_binds_one_cluster_role() -> None:
    by_kind = kinds(render())
    assert not operator_roles(by_kind.get("Role", []))
    (role,) = by_kind["ClusterRole"]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"brokerclusters", "statefulsets", "namespaces"} <= resources
    # never a wildcard; Secrets only by name: the operator creates its clusters' auth
    # Secrets and Users' token Secrets and reads back those it made, but may never list or
    # watch Secrets (it would then see every Secret in the namespace)
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    secret_verbs = {
        v for rule in role["rules"] if "secrets" in rule["resources"] for v in rule["verbs"]
    }
    assert secret_verbs <= {"get", "create", "patch"}


def test_namespaced_mode_grants_writes_only_in_watched_namespaces() -> None:
    by_kind = kinds(render(str(CHART / "ci" / "namespaced-values.yaml")))
    roles = {r["metadata"]["namespace"] for r in operator_roles(by_kind["Role"])}
    assert roles == {"team-a", "team-b"}
    bindings = {
        b["metadata"]["namespace"]
        for b in by_kind["RoleBinding"]
        if not b["metadata"]["name"].endswith(("-spark", "-lease"))
    }
    assert bindings == roles
    (cluster_role,) = by_kind["ClusterRole"]
    # cluster-wide, only reads: kopf's of CRDs and namespaces, StorageClasses (expansion),
    # nodes (each broker pod's zone, by name)
    for rule in cluster_role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert set(rule["resources"]) <= {
            "customresourcedefinitions",
            "namespaces",
            "storageclasses",
            "nodes",
        }
    (operator,) = by_kind["Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--namespace") + 1] == "team-a"
    assert "-v" in args


def test_bad_values_are_refused_by_the_schema() -> None:
    done = helm("template", "hr", str(CHART), "--set", "operator.replicas=0")
    assert done.returncode != 0 and "replicas" in done.stderr
    done = helm("template", "hr", str(CHART), "--set", "operator.nosuchvalue=1")
    assert done.returncode != 0 and "nosuchvalue" in done.stderr
    done = helm("template", "hr", str(CHART), "--set", "operator.brokerAdvertise=nodePort")
    assert done.returncode != 0 and "brokerAdvertise" in done.stderr
    done = helm(
        "template",
        "hr",
        str(CHART),
        "--set",
        "exampleCluster.enabled=true",
        "--set",
        "exampleCluster.tieredStorage=true",
    )
    assert done.returncode != 0 and "minio.enabled" in done.stderr


def test_brokers_advertise_stable_names_unless_told_pod_ips() -> None:
    for values, advertise in (((), "dns"), (("operator.brokerAdvertise=podIP",), "podIP")):
        (operator,) = kinds(render(*values))["Deployment"]
        env = {
            e["name"]: e.get("value")
            for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["HEADRACE_ADVERTISE"] == advertise


def operator_env(*values: str) -> dict[str, str | None]:
    (operator,) = kinds(render(*values))["Deployment"]
    return {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_the_spark_image_follows_the_headrace_image_unless_named() -> None:
    """`make image-spark` builds <repository>-spark beside `make image`'s <repository>, with
    the same version: one registry and tag set for both, or the Spark image named."""
    env = operator_env()
    assert env["HEADRACE_IMAGE"] == "ghcr.io/headrace/headrace:0.1.0"
    assert env["HEADRACE_SPARK_IMAGE"] == "ghcr.io/headrace/headrace-spark:0.1.0"
    assert env["HEADRACE_SPARK_IMAGE_PULL_POLICY"] == "IfNotPresent"
    env = operator_env("image.repository=registry.local/hr", "image.tag=2.0")
    assert env["HEADRACE_SPARK_IMAGE"] == "registry.local/hr-spark:2.0"
    env = operator_env("spark.image=other/spark:9", "spark.imagePullPolicy=Always")
    assert env["HEADRACE_SPARK_IMAGE"] == "other/spark:9"
    assert env["HEADRACE_SPARK_IMAGE_PULL_POLICY"] == "Always"
    done = helm("template", "hr", str(CHART), "--set", "spark.imagePullPolicy=Sometimes")
    assert done.returncode != 0 and "imagePullPolicy" in done.stderr


def test_dashboard_config_map_carries_the_sidecar_label() -> None:
    by_kind = kinds(render())
    (cm,) = by_kind["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["headrace-brokers.json"])
    assert dashboard["uid"] == "headrace-brokers"
    assert json.loads(cm["data"]["headrace-operator.json"])["uid"] == "headrace-operator"


def test_operator_probes_and_optional_service_monitor() -> None:
    (deployment,) = kinds(render())["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "$(POD_IP):8081" in container["args"]
    assert "ServiceMonitor" not in kinds(render())
    by_kind = kinds(render("operator.serviceMonitor.enabled=true"))
    (monitor,) = by_kind["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "http-surfaces"


def test_helm_test_pod_round_trips_its_own_records_with_headrace() -> None:
    docs = render(str(CHART / "ci" / "example-cluster-values.yaml"), "test.bootstrap=10.0.0.1:9092")
    pod = next(d for d in docs if d["kind"] == "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (check,) = pod["spec"]["containers"]
    command = check["command"]
    assert command[:3] == ["headrace", "roundtrip", f"{NAMESPACE}/helm-test"]
    assert command[command.index("--acks") + 1] == "all"
    assert command[command.index("--bootstrap") + 1] == "10.0.0.1:9092"
    # it gives up (with a count of what is missing) before the pod's deadline kills it
    assert int(command[command.index("--timeout") + 1]) < pod["spec"]["activeDeadlineSeconds"]
    topic = next(d for d in docs if d["kind"] == "Topic")
    assert topic["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def _rule_set(rules: list[dict[str, Any]]) -> set[tuple[tuple[str, ...], ...]]:
    return {
        (tuple(sorted(r["apiGroups"])), tuple(sorted(r["resources"])), tuple(sorted(r["verbs"])))
        for r in rules
    }


def test_rbac_is_the_operators_own_rule_list() -> None:
    # headrace.operator.install.RULES is the one list of what the operator does; the
    # chart's templates restate it in YAML and must not drift from it
    from headrace.operator.install import CLUSTER_RULES, RULES

    namespaced = _rule_set([{"apiGroups": g, "resources": r, "verbs": v} for g, r, v in RULES])
    cluster = _rule_set([{"apiGroups": g, "resources": r, "verbs": v} for g, r, v in CLUSTER_RULES])
    (wide,) = kinds(render())["ClusterRole"]
    assert _rule_set(wide["rules"]) == namespaced | cluster
    by_kind = kinds(render(str(CHART / "ci" / "namespaced-values.yaml")))
    for role in operator_roles(by_kind["Role"]):
        assert _rule_set(role["rules"]) == namespaced
    (reads,) = by_kind["ClusterRole"]
    assert _rule_set(reads["rules"]) == cluster


def test_spark_drivers_get_executor_rights_only_where_compactions_run() -> None:
    # a Compaction with spark.master: kubernetes runs its driver as this account; it
    # creates, follows and deletes executor pods and their conf ConfigMap, nothing else
    from headrace.operator.install import SPARK_DRIVER_RULES

    spark_rules = _rule_set(
        [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v in SPARK_DRIVER_RULES]
    )
    assert {r for _, resources, _ in spark_rules for r in resources} == {
        "pods",
        "configmaps",
        "services",
    }
    for values, namespaces in (
        ((), {NAMESPACE}),
        ((str(CHART / "ci" / "namespaced-values.yaml"),), {"team-a", "team-b"}),
        (("spark.namespaces={jobs}",), {"jobs"}),
    ):
        by_kind = kinds(render(*values))
        accounts = [
            a for a in by_kind["ServiceAccount"] if a["metadata"]["name"] == "hr-headrace-spark"
        ]
        roles = [r for r in by_kind["Role"] if r["metadata"]["name"] == "hr-headrace-spark"]
        bindings = [
            b for b in by_kind["RoleBinding"] if b["metadata"]["name"] == "hr-headrace-spark"
        ]
        for docs in (accounts, roles, bindings):
            assert {d["metadata"]["namespace"] for d in docs} == namespaces, values
        for role in roles:  # the chart restates install.SPARK_DRIVER_RULES
            assert _rule_set(role["rules"]) == spark_rules
        for binding in bindings:
            (subject,) = binding["subjects"]
            assert (subject["name"], subject["namespace"]) == (
                "hr-headrace-spark",
                binding["metadata"]["namespace"],
            )
        # the operator names that account and the executors' image in the Job pods it makes
        (operator,) = by_kind["Deployment"]
        env = {
            e["name"]: e.get("value")
            for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["HEADRACE_SPARK_SERVICE_ACCOUNT"] == "hr-headrace-spark"
        assert env["HEADRACE_SPARK_IMAGE"] == "ghcr.io/headrace/headrace-spark:0.1.0"
    # and none at all when they are not wanted
    assert "hr-headrace-spark" not in {
        d["metadata"]["name"] for d in render("spark.serviceAccount.create=false")
    }
