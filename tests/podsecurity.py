"""What in a pod spec the Pod Security Standards' "restricted" profile refuses (pure).

One checker for every pod the operator and the chart make: the unit tests apply it to
the operator's manifests, the chart's render test to ``helm template`` output. It
restates the profile's rules (Kubernetes' ``pod-security-admission`` policies, the
baseline ones included, as "restricted" enforces both) so a test says *which* field is
wrong; the e2e test in a namespace enforcing "restricted" is the real API server's word.

``violations`` lists the profile's refusals; ``writable_roots`` the containers whose root
filesystem is writable, which the profile allows but headrace's pods never want.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

#: the volume types "restricted" allows
ALLOWED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
#: the keys of a volume that are not its type
VOLUME_FIELDS: Final = frozenset({"name"})
#: the only capability "restricted" lets a container add
ADDABLE_CAPABILITIES: Final = frozenset({"NET_BIND_SERVICE"})
#: the seccomp profiles "restricted" accepts
SECCOMP_TYPES: Final = frozenset({"RuntimeDefault", "Localhost"})
#: the sysctls baseline calls safe
SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES: Final = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
CONTAINER_KINDS: Final = ("initContainers", "containers", "ephemeralContainers")


def pod_spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec a workload object makes (a Pod's own), None for other kinds."""
    kind = obj.get("kind")
    spec = obj.get("spec", {})
    if kind == "Pod":
        return spec
    if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        return spec["template"]["spec"]
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return None


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in CONTAINER_KINDS:
        for container in pod.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def violations(pod: Mapping[str, Any]) -> list[str]:
    """Each field of ``pod`` (a pod spec) that "restricted" refuses, as ``where: what``."""
    found: list[str] = []
    pod_context = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(f"pod: {flag} is true")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - VOLUME_FIELDS
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume.get('name')}: type {sorted(kinds - ALLOWED_VOLUMES)}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"pod: sysctl {sysctl.get('name')} is not safe")
    found += _identity_problems("pod", pod_context)
    for where, container in _containers(pod):
        found += _container_violations(where, container.get("securityContext") or {}, pod_context)
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{where}: hostPort {port['hostPort']}")
    return found


def _identity_problems(where: str, context: Mapping[str, Any]) -> list[str]:
    found = []
    if context.get("runAsUser") == 0:
        found.append(f"{where}: runAsUser is 0")
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}: windowsOptions.hostProcess is true")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        found.append(f"{where}: seLinuxOptions.type {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
        found.append(f"{where}: seLinuxOptions.user/role set")
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"{where}: appArmorProfile {apparmor}")
    return found


def _container_violations(
    where: str, context: Mapping[str, Any], pod_context: Mapping[str, Any]
) -> list[str]:
    found = _identity_problems(where, context)
    if context.get("privileged"):
        found.append(f"{where}: privileged")
    if context.get("procMount", "Default") != "Default":
        found.append(f"{where}: procMount {context['procMount']}")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"{where}: allowPrivilegeEscalation is not false")
    # a container's own setting wins over the pod's; one of them must say so
    run_as_non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    if run_as_non_root is not True:
        found.append(f"{where}: runAsNonRoot is not true")
    seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_TYPES:
        found.append(f"{where}: seccompProfile is {seccomp or 'unset'}")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"{where}: capabilities.drop lacks ALL")
    added = set(capabilities.get("add") or []) - ADDABLE_CAPABILITIES
    if added:
        found.append(f"{where}: capabilities.add {sorted(added)}")
    return found


def writable_roots(pod: Mapping[str, Any]) -> list[str]:
    """The containers of ``pod`` whose root filesystem is not read-only."""
    return [
        where
        for where, container in _containers(pod)
        if (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True
    ]
