"""The operator's install manifests: what a namespaced and a cluster-wide install grant."""

from __future__ import annotations

from headrace.operator import install


def kinds(docs: list[dict]) -> list[tuple[str, str | None]]:  # type: ignore[type-arg]
    return [(d["kind"], d["metadata"].get("namespace")) for d in docs]


def test_a_namespaced_install_grants_roles_where_it_watches_and_where_its_lease_is() -> None:
    docs = install.manifests("ops", watch=("apps",))
    assert kinds(docs) == [
        ("ServiceAccount", "ops"),
        ("Role", "ops"),  # its Lease, by name
        ("RoleBinding", "ops"),
        ("Role", "apps"),
        ("RoleBinding", "apps"),
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Deployment", "ops"),
        # the Spark drivers' account where Compactions run (docs/spark.md)
        ("ServiceAccount", "apps"),
        ("Role", "apps"),
        ("RoleBinding", "apps"),
    ]
    assert docs[1]["rules"] == install.lease_rules()
    role = docs[3]
    status_rule = next(r for r in role["rules"] if "topics/status" in r["resources"])
    assert "update" in status_rule["verbs"]
    assert not any("namespaces" in r["resources"] for r in role["rules"])
    cluster_role = docs[5]
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
        "storageclasses",
        "nodes",  # read by name: the zone of each broker pod's node
    }
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cluster_role["rules"])
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][-2:] == ["--namespace", "apps"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == install.NAME
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HEADRACE_SPARK_SERVICE_ACCOUNT"] == docs[-1]["subjects"][0]["name"]


def test_a_cluster_wide_install_grants_one_cluster_role() -> None:
    docs = install.manifests("ops")
    assert kinds(docs) == [
        ("ServiceAccount", "ops"),
        ("Role", "ops"),  # its Lease, by name: never a cluster-wide grant on leases
        ("RoleBinding", "ops"),
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Deployment", "ops"),
        ("ServiceAccount", "ops"),
        ("Role", "ops"),
        ("RoleBinding", "ops"),
    ]
    (container,) = docs[5]["spec"]["template"]["spec"]["containers"]
    assert "--namespace" not in container["args"]
    assert not any("leases" in rule["resources"] for rule in docs[3]["rules"])


def test_the_operator_may_watch_repartitions_and_write_their_status() -> None:
    (role,) = [d for d in install.manifests("ops") if d["kind"] == "ClusterRole"]

    def verbs(resource: str) -> set[str]:
        return {v for r in role["rules"] if resource in r["resources"] for v in r["verbs"]}

    assert {"get", "list", "watch"} <= verbs("repartitions")
    assert {"update", "patch"} <= verbs("repartitions/status")
