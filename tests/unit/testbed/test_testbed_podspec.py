"""podspec: env resolution, $(VAR) expansion, mount path rewriting, volume files."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed import podspec

POD: dict[str, Any] = {
    "metadata": {
        "name": "web-0",
        "namespace": "ns",
        "uid": "u1",
        "labels": {"app": "web", "tier": "a"},
        "annotations": {"note": "x"},
    },
    "spec": {"nodeName": "n1", "serviceAccountName": "sa"},
}
WORLD = podspec.World(
    pod_ip="127.0.0.7",
    host_ip="127.0.0.1",
    configmaps={
        "cm": {
            "data": {"a": "1", "b": "two"},
            "binaryData": {"bin": base64.b64encode(b"\x01").decode()},
        }
    },
    secrets={"s": {"data": {"pw": base64.b64encode(b"hunter2").decode()}}},
    base_env={"KUBERNETES_SERVICE_HOST": "127.0.0.1"},
)


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "x"),
        ("pre-$(A)-post", "pre-x-post"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$(A", "$(A"),
        ("a$", "a$"),
        ("$(A)$(B)", "xy"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert podspec.expand(text, {"A": "x", "B": "y"}) == expected


def test_resolve_env_sources_and_precedence() -> None:
    container = {
        "envFrom": [
            {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
            {"secretRef": {"name": "s"}},
        ],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "b"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "URL", "value": "http://$(IP):80/$(NAME)"},
            {"name": "CM_a", "value": "overridden"},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
        ],
    }
    env = podspec.resolve_env(POD, container, WORLD)
    assert env["NAME"] == "web-0"
    assert env["NS"] == "ns"
    assert env["IP"] == "127.0.0.7"
    assert env["APP"] == "web"
    assert env["B"] == "two"
    assert env["PW"] == "hunter2"
    assert env["pw"] == "hunter2"  # envFrom secret, no prefix
    assert env["URL"] == "http://127.0.0.7:80/web-0"
    assert env["CM_a"] == "overridden"  # env wins over envFrom
    assert env["CM_b"] == "two"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert "OPT" not in env


@pytest.mark.parametrize(
    "ref",
    [
        {"secretKeyRef": {"name": "nope", "key": "k"}},
        {"secretKeyRef": {"name": "s", "key": "missing"}},
        {"configMapKeyRef": {"name": "cm", "key": "missing"}},
        {"fieldRef": {"fieldPath": "spec.unknown"}},
    ],
)
def test_missing_references_are_config_errors(ref: dict[str, Any]) -> None:
    with pytest.raises(podspec.ConfigError):
        podspec.resolve_env(POD, {"env": [{"name": "X", "valueFrom": ref}]}, WORLD)


def test_resource_field_ref_rounds_up_and_defaults_to_node() -> None:
    c = {"resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}
    cpu = {"resource": "limits.cpu"}
    assert podspec.resource_value(c, cpu, WORLD) == "1"
    assert podspec.resource_value(c, {"resource": "limits.cpu", "divisor": "1m"}, WORLD) == "250"
    assert podspec.resource_value(c, {"resource": "limits.memory", "divisor": "1Mi"}, WORLD) == "64"
    assert podspec.resource_value({}, cpu, WORLD) == WORLD.node_cpu


def test_labels_field_is_rendered_like_the_downward_api() -> None:
    assert podspec.field_value(POD, "metadata.labels", WORLD) == 'app="web"\ntier="a"'


def test_rewrite_maps_paths_under_mounts_longest_first(tmp_path: Path) -> None:
    mounts = [
        podspec.Mount("/data", tmp_path / "d"),
        podspec.Mount("/data/logs", tmp_path / "l"),
    ]
    assert podspec.rewrite("/data", mounts) == str(tmp_path / "d")
    assert podspec.rewrite("/data/x/y", mounts) == str(tmp_path / "d/x/y")
    assert podspec.rewrite("/data/logs/a", mounts) == str(tmp_path / "l/a")
    assert podspec.rewrite("/database", mounts) == "/database"
    assert podspec.rewrite("--dir=/data/x", mounts) == f"--dir={tmp_path / 'd/x'}"
    assert podspec.rewrite("relative/data", mounts) == "relative/data"


def test_process_builds_argv_env_and_cwd(tmp_path: Path) -> None:
    container = {
        "name": "main",
        "command": ["/bin/server", "--data=$(DIR)"],
        "args": ["/data/file", "$(NAME)"],
        "workingDir": "/data",
        "env": [
            {"name": "DIR", "value": "/data/sub"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "volumeMounts": [{"name": "v", "mountPath": "/data"}],
    }
    proc = podspec.process(POD, container, WORLD, {"v": tmp_path}, {"KUBECONFIG": "/k"})
    assert proc.argv == ["/bin/server", f"--data={tmp_path}/sub", f"{tmp_path}/file", "web-0"]
    assert proc.env["DIR"] == f"{tmp_path}/sub"
    assert proc.env["KUBECONFIG"] == "/k"
    assert proc.cwd == tmp_path


def test_program_path_is_kept_when_it_exists_on_the_host(tmp_path: Path) -> None:
    container = {
        "name": "c",
        "command": ["/work/venv/python", "/work/x"],
        "volumeMounts": [{"name": "v", "mountPath": "/work"}],
    }
    kept = podspec.process(POD, container, WORLD, {"v": tmp_path}, on_host=lambda p: True)
    assert kept.argv == ["/work/venv/python", f"{tmp_path}/x"]
    moved = podspec.process(POD, container, WORLD, {"v": tmp_path}, on_host=lambda p: False)
    assert moved.argv[0] == f"{tmp_path}/venv/python"


def test_a_command_line_handed_on_keeps_its_host_program_under_a_mount(tmp_path: Path) -> None:
    # the operator pod mounts an emptyDir at /tmp and is given the brokers' command, whose
    # interpreter lives in a checkout under /tmp: a host program, not the pod's /tmp
    container = {
        "name": "c",
        "command": ["/usr/bin/python3", "--broker-command", "/tmp/co/venv/python -m x"],
        "env": [
            {"name": "CMD", "value": "/tmp/co/venv/python -m x"},
            {"name": "D", "value": "/tmp/d"},
        ],
        "volumeMounts": [{"name": "v", "mountPath": "/tmp"}],
    }
    host = {"/usr/bin/python3", "/tmp/co/venv/python"}
    proc = podspec.process(POD, container, WORLD, {"v": tmp_path}, on_host=host.__contains__)
    assert proc.argv[2] == "/tmp/co/venv/python -m x"
    assert proc.env["CMD"] == "/tmp/co/venv/python -m x"
    assert proc.env["D"] == f"{tmp_path}/d"  # a path of the pod's own /tmp is still mapped


def test_container_without_command_cannot_run() -> None:
    with pytest.raises(podspec.ConfigError, match="no command"):
        podspec.process(POD, {"name": "c", "image": "nginx"}, WORLD, {})


def test_sub_path_and_undefined_volume(tmp_path: Path) -> None:
    c = {"volumeMounts": [{"name": "v", "mountPath": "/etc/x", "subPath": "conf"}]}
    [m] = podspec.mounts(c, {"v": tmp_path})
    assert m.host_path == tmp_path / "conf"
    with pytest.raises(podspec.ConfigError):
        podspec.mounts({"volumeMounts": [{"name": "zz", "mountPath": "/z"}]}, {})
    with pytest.raises(podspec.ConfigError):
        podspec.mounts(
            {"volumeMounts": [{"name": "v", "mountPath": "/z", "subPath": "../up"}]},
            {"v": tmp_path},
        )


def test_volume_files_for_each_source() -> None:
    assert podspec.volume_files(POD, {"name": "e", "emptyDir": {}}, WORLD) is None
    assert podspec.volume_files(POD, {"name": "c", "configMap": {"name": "cm"}}, WORLD) == {
        "a": b"1",
        "b": b"two",
        "bin": b"\x01",
    }
    items = {"name": "c", "configMap": {"name": "cm", "items": [{"key": "b", "path": "sub/b.txt"}]}}
    assert podspec.volume_files(POD, items, WORLD) == {"sub/b.txt": b"two"}
    assert podspec.volume_files(POD, {"name": "s", "secret": {"secretName": "s"}}, WORLD) == {
        "pw": b"hunter2"
    }
    projected = {
        "name": "kube-api-access",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "cm", "items": [{"key": "a", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ]
        },
    }
    assert podspec.volume_files(POD, projected, WORLD, token="TOKEN") == {
        "token": b"TOKEN",
        "ca.crt": b"1",
        "namespace": b"ns",
    }
    with pytest.raises(podspec.VolumeError):
        podspec.volume_files(POD, projected, WORLD, token=None)
    with pytest.raises(podspec.VolumeError):
        podspec.volume_files(POD, {"name": "c", "configMap": {"name": "absent"}}, WORLD)
    assert (
        podspec.volume_files(
            POD, {"name": "c", "configMap": {"name": "absent", "optional": True}}, WORLD
        )
        == {}
    )
    with pytest.raises(podspec.VolumeError, match="unsupported"):
        podspec.volume_files(POD, {"name": "n", "nfs": {"server": "x"}}, WORLD)


def test_referenced_names_cover_env_and_volumes() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "env": [
                        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "c1"}}],
                }
            ],
            "initContainers": [{"envFrom": [{"secretRef": {"name": "s2"}}]}],
            "volumes": [
                {"name": "v", "configMap": {"name": "c2"}},
                {"name": "p", "projected": {"sources": [{"secret": {"name": "s3"}}]}},
            ],
        }
    }
    assert podspec.referenced_names(pod) == ({"c1", "c2"}, {"s1", "s2", "s3"})


def test_service_account_kubeconfig_carries_token_and_ca() -> None:
    doc = json.loads(
        podspec.service_account_kubeconfig("https://127.0.0.1:6443", "PEM", "tok", "ns")
    )
    assert doc["users"][0]["user"]["token"] == "tok"
    assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]) == b"PEM"
    assert doc["contexts"][0]["context"]["namespace"] == "ns"
