"""What a container becomes on this host: argv, environment, files (pure).

The runner has no images and no mount namespaces, so it maps Kubernetes' view onto the
host with three rules, all decided here without I/O:

* **Command.** ``command`` + ``args`` after ``$(VAR)`` expansion is the argv; it must
  name a program that exists on the host. A container without ``command`` runs only if
  its image is one of the few whose entrypoint :mod:`.images` stands in for (Spark's
  executor); otherwise it gets ``CreateContainerConfigError``.
* **Environment.** ``envFrom`` then ``env``, in order, with downward-API ``fieldRef``
  and ``resourceFieldRef``, ``configMapKeyRef`` and ``secretKeyRef``, exactly as the
  kubelet resolves them, plus ``KUBERNETES_SERVICE_HOST``/``PORT`` pointing at the API
  server on loopback and, for pods with a service-account token, ``KUBECONFIG``.
* **Volumes.** Each volume is a directory on the host. A container sees its mounts at
  the host directory, not at ``mountPath``; so every argv word, env value and
  ``workingDir`` that starts with a ``mountPath`` is rewritten to the host directory.
  The program itself (``command[0]``) is rewritten only if it does not exist on the
  host as written, so a host interpreter under a path that happens to share a prefix
  with a mount (``/work/.venv/bin/python`` vs a ``/work`` mount) still runs, and a
  script shipped in a ConfigMap volume is still found. Paths a program builds from a
  mount path at run time are not rewritten.

The I/O side (fetching ConfigMaps, writing files, spawning) is in :mod:`.kubelet`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

Obj = dict[str, Any]
#: (container, its args after expansion, its environment) -> (argv, environment to add):
#: what a container without ``command`` runs, from its image (:mod:`.images`); raises
#: :class:`ConfigError` for an image it does not know
ImageEntrypoint = Callable[[Obj, list[str], dict[str, str]], tuple[list[str], dict[str, str]]]

#: Where Kubernetes mounts the service-account token; used to find the token volume.
SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


class ConfigError(Exception):
    """A container cannot be started as specified (kubelet: CreateContainerConfigError)."""

    reason = "CreateContainerConfigError"


class VolumeError(Exception):
    """A volume cannot be set up yet or at all (kubelet keeps the pod ContainerCreating)."""

    reason = "ContainerCreating"


@dataclass(frozen=True)
class World:
    """What resolution needs from outside the pod spec, fetched by the caller."""

    pod_ip: str
    host_ip: str
    #: ConfigMaps and Secrets of the pod's namespace by name (only those referenced).
    configmaps: Mapping[str, Obj] = field(default_factory=dict)
    secrets: Mapping[str, Obj] = field(default_factory=dict)
    #: Variables every container gets first (service host/port of the API server).
    base_env: Mapping[str, str] = field(default_factory=dict)
    #: Node allocatable, for resourceFieldRef defaults (``cpu`` cores, ``memory`` bytes).
    node_cpu: str = "2"
    node_memory: str = "8Gi"


# References ------------------------------------------------------------------------
def referenced_names(pod: Obj) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the pod's env and volumes refer to."""
    cms: set[str] = set()
    secrets: set[str] = set()
    spec = pod.get("spec", {})
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for src in c.get("envFrom", []):
            if "configMapRef" in src:
                cms.add(src["configMapRef"]["name"])
            if "secretRef" in src:
                secrets.add(src["secretRef"]["name"])
        for e in c.get("env", []):
            vf = e.get("valueFrom", {})
            if "configMapKeyRef" in vf:
                cms.add(vf["configMapKeyRef"]["name"])
            if "secretKeyRef" in vf:
                secrets.add(vf["secretKeyRef"]["name"])
    for v in spec.get("volumes", []):
        if "configMap" in v:
            cms.add(v["configMap"]["name"])
        if "secret" in v:
            secrets.add(v["secret"]["secretName"])
        for src in v.get("projected", {}).get("sources", []):
            if "configMap" in src:
                cms.add(src["configMap"]["name"])
            if "secret" in src:
                secrets.add(src["secret"]["name"])
    return cms, secrets


# Downward API ----------------------------------------------------------------------
_LABEL_RE = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Obj, path: str, world: World) -> str:
    """The value of a downward-API ``fieldRef.fieldPath``."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": world.host_ip,
        "status.hostIPs": world.host_ip,
        "status.podIP": world.pod_ip,
        "status.podIPs": world.pod_ip,
    }
    if path in simple:
        return str(simple[path])
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1], {}) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    m = _LABEL_RE.match(path)
    if m:
        return str((meta.get(m.group(1), {}) or {}).get(m.group(2), ""))
    raise ConfigError(f"unsupported fieldRef {path!r}")


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 0.001,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}


def quantity(q: str) -> float:
    """A Kubernetes quantity (``500m``, ``1Gi``) as a number."""
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ConfigError(f"bad quantity {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def resource_value(container: Obj, ref: Obj, world: World) -> str:
    """``resourceFieldRef``: the container's limit/request, node allocatable if unset."""
    resource = ref["resource"]  # e.g. limits.cpu
    kind, _, name = resource.partition(".")
    resources = container.get("resources", {})
    raw = resources.get(kind, {}).get(name)
    if raw is None and kind == "requests":
        raw = resources.get("limits", {}).get(name)
    if raw is None:
        raw = world.node_cpu if name == "cpu" else world.node_memory
    divisor = quantity(str(ref.get("divisor", "1")))
    value = quantity(str(raw)) / divisor
    # The kubelet rounds up, so a 250m CPU limit reads as "1" with the default divisor.
    whole = int(value) if value == int(value) else int(value) + 1
    return str(whole)


# Expansion -------------------------------------------------------------------------
def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined vars replaced, ``$$`` escapes a ``$``,
    undefined references left as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def _key_value(obj: Obj | None, key: str, kind: str, name: str, optional: bool) -> str | None:
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind} "{name}" not found')
    if kind == "secret":
        data = obj.get("data", {}) or {}
        if key in data:
            return base64.b64decode(data[key]).decode()
    else:
        data = obj.get("data", {}) or {}
        if key in data:
            return str(data[key])
        binary = obj.get("binaryData", {}) or {}
        if key in binary:
            return base64.b64decode(binary[key]).decode(errors="replace")
    if optional:
        return None
    raise ConfigError(f'couldn\'t find key {key} in {kind} "{name}"')


def resolve_env(pod: Obj, container: Obj, world: World) -> dict[str, str]:
    """The container's environment, in the kubelet's order of precedence."""
    env: dict[str, str] = dict(world.base_env)
    for src in container.get("envFrom", []):
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            ref = src["configMapRef"]
            obj = world.configmaps.get(ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'configmap "{ref["name"]}" not found')
            for k, v in (obj.get("data", {}) or {}).items():
                env[prefix + k] = str(v)
        if "secretRef" in src:
            ref = src["secretRef"]
            obj = world.secrets.get(ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'secret "{ref["name"]}" not found')
            for k, v in (obj.get("data", {}) or {}).items():
                env[prefix + k] = base64.b64decode(v).decode()
    for e in container.get("env", []):
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(str(e.get("value", "")), env)
            continue
        vf = e["valueFrom"]
        value: str | None
        if "fieldRef" in vf:
            value = field_value(pod, vf["fieldRef"]["fieldPath"], world)
        elif "resourceFieldRef" in vf:
            value = resource_value(container, vf["resourceFieldRef"], world)
        elif "configMapKeyRef" in vf:
            r = vf["configMapKeyRef"]
            obj = world.configmaps.get(r["name"])
            value = _key_value(obj, r["key"], "configmap", r["name"], bool(r.get("optional")))
        elif "secretKeyRef" in vf:
            r = vf["secretKeyRef"]
            obj = world.secrets.get(r["name"])
            value = _key_value(obj, r["key"], "secret", r["name"], bool(r.get("optional")))
        else:
            raise ConfigError(f"unsupported valueFrom for {name}: {sorted(vf)}")
        if value is not None:
            env[name] = value
    return env


# Volumes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    """A container's view of one volume: ``mount_path`` in the spec, ``host_path`` here."""

    mount_path: str
    host_path: Path
    read_only: bool = False


def mounts(
    container: Obj, volume_dirs: Mapping[str, Path], pinned: Mapping[int, Path] | None = None
) -> list[Mount]:
    """The container's mounts, with ``subPath`` applied. ``pinned`` maps the index of a
    ``subPath`` mount to the copy the runner made at container start (a ``subPath`` of an
    updating volume never changes in a running container)."""
    out: list[Mount] = []
    for index, vm in enumerate(container.get("volumeMounts", [])):
        name = vm["name"]
        if name not in volume_dirs:
            raise ConfigError(f"volume {name!r} is mounted but not defined")
        host = volume_dirs[name]
        sub = vm.get("subPath")
        if sub:
            if PurePosixPath(sub).is_absolute() or ".." in PurePosixPath(sub).parts:
                raise ConfigError(f"invalid subPath {sub!r}")
            host = (pinned or {}).get(index, host / sub)
        out.append(Mount(vm["mountPath"].rstrip("/") or "/", host, bool(vm.get("readOnly"))))
    return out


def rewrite(word: str, container_mounts: Sequence[Mount]) -> str:
    """Map a path under a ``mountPath`` to the host directory (longest mount wins)."""
    best: Mount | None = None
    for m in container_mounts:
        mp = m.mount_path
        if (word == mp or word.startswith(mp + "/")) and (
            best is None or len(mp) > len(best.mount_path)
        ):
            best = m
    if best is None:
        # Also catch --flag=/mount/path forms, common in command lines.
        flag, eq, rest = word.partition("=")
        if eq and rest.startswith("/"):
            mapped = rewrite(rest, container_mounts)
            if mapped != rest:
                return f"{flag}={mapped}"
        return word
    return str(best.host_path) + word[len(best.mount_path) :]


@dataclass(frozen=True)
class Process:
    """Everything needed to exec a container on the host."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    mounts: list[Mount]


def process(
    pod: Obj,
    container: Obj,
    world: World,
    volume_dirs: Mapping[str, Path],
    extra_env: Mapping[str, str] | None = None,
    on_host: Callable[[str], bool] = lambda _path: False,
    pinned: Mapping[int, Path] | None = None,
    image_entrypoint: ImageEntrypoint | None = None,
) -> Process:
    """Resolve a container into a host process description, or raise :class:`ConfigError`.

    ``on_host`` tells whether a path exists on the host (the caller passes
    ``os.path.exists``); it decides whether the program path is rewritten.
    ``image_entrypoint`` runs a container that has no ``command`` (see ``ImageEntrypoint``).
    """
    if not container.get("command") and image_entrypoint is None:
        raise ConfigError(
            f"container {container.get('name')!r} has no command: the test bed ignores "
            "images, so every container must name a program that exists on the host"
        )
    env = resolve_env(pod, container, world)
    if extra_env:
        env.update(extra_env)
    ms = mounts(container, volume_dirs, pinned)

    def mapped(word: str) -> str:
        # A command line handed on to the pod (the broker command the operator is given)
        # starts with a program on the host: the test bed runs pods as host processes, so
        # it stays, even under a mount path (a checkout under /tmp, where pods mount an
        # emptyDir). Any other path under a mount is the pod's view of that volume.
        program, space, _ = word.partition(" ")
        return word if space and on_host(program) else rewrite(word, ms)

    env = {k: mapped(v) for k, v in env.items()}
    if not container.get("command"):
        assert image_entrypoint is not None
        args = [mapped(expand(str(w), env)) for w in container.get("args", [])]
        argv, image_env = image_entrypoint(container, args, env)
        env = {**env, **image_env}
    else:
        words = [expand(str(w), env) for w in [*container["command"], *container.get("args", [])]]
        argv = [w if i == 0 and on_host(w) else mapped(w) for i, w in enumerate(words)]
    wd = container.get("workingDir")
    cwd = Path(rewrite(wd, ms)) if wd else None
    return Process(argv, env, cwd, ms)


def _items(
    data: Mapping[str, bytes], items: Sequence[Obj] | None, optional: bool, what: str
) -> dict[str, bytes]:
    if not items:
        return dict(data)
    out: dict[str, bytes] = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeError(f"{what} has no key {item['key']!r}")
        out[item["path"]] = data[item["key"]]
    return out


def _cm_bytes(obj: Obj) -> dict[str, bytes]:
    out = {k: str(v).encode() for k, v in (obj.get("data", {}) or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData", {}) or {}).items()})
    return out


def _secret_bytes(obj: Obj) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (obj.get("data", {}) or {}).items()}


def _downward_files(pod: Obj, items: Sequence[Obj], world: World) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for item in items:
        if "fieldRef" in item:
            out[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"], world).encode()
    return out


def updates_in_place(volume: Obj) -> bool:
    """Whether the kubelet keeps the volume's files in step with their sources while the
    pod runs (ConfigMap, Secret, downwardAPI, projected), so ``subPath`` mounts of it are
    pinned at container start."""
    return any(k in volume for k in ("configMap", "secret", "downwardAPI", "projected"))


def volume_files(
    pod: Obj, volume: Obj, world: World, token: str | None = None
) -> dict[str, bytes] | None:
    """The files a ConfigMap/Secret/downwardAPI/projected volume holds (relative path ->
    content), or None for a volume that is a plain directory (emptyDir, PVC, hostPath).

    ``token`` is the service-account token for a projected ``serviceAccountToken``
    source; the caller requests it from the API server.
    """
    if "configMap" in volume:
        src = volume["configMap"]
        obj = world.configmaps.get(src["name"])
        if obj is None:
            if src.get("optional"):
                return {}
            raise VolumeError(f'configmap "{src["name"]}" not found')
        return _items(_cm_bytes(obj), src.get("items"), bool(src.get("optional")), "configmap")
    if "secret" in volume:
        src = volume["secret"]
        obj = world.secrets.get(src["secretName"])
        if obj is None:
            if src.get("optional"):
                return {}
            raise VolumeError(f'secret "{src["secretName"]}" not found')
        return _items(_secret_bytes(obj), src.get("items"), bool(src.get("optional")), "secret")
    if "downwardAPI" in volume:
        return _downward_files(pod, volume["downwardAPI"].get("items", []), world)
    if "projected" in volume:
        files: dict[str, bytes] = {}
        for src in volume["projected"].get("sources", []):
            if "serviceAccountToken" in src:
                if token is None:
                    raise VolumeError("service-account token not available yet")
                files[src["serviceAccountToken"]["path"]] = token.encode()
            elif "configMap" in src:
                files.update(volume_files(pod, {"configMap": src["configMap"]}, world) or {})
            elif "secret" in src:
                s = dict(src["secret"])
                s["secretName"] = s.pop("name")
                files.update(volume_files(pod, {"secret": s}, world) or {})
            elif "downwardAPI" in src:
                files.update(_downward_files(pod, src["downwardAPI"].get("items", []), world))
            else:
                raise VolumeError(f"unsupported projected source {sorted(src)}")
        return files
    if any(k in volume for k in ("emptyDir", "persistentVolumeClaim", "hostPath")):
        return None
    kinds = sorted(k for k in volume if k != "name")
    raise VolumeError(f"unsupported volume type {kinds} for volume {volume.get('name')!r}")


def token_audience_and_ttl(pod: Obj) -> tuple[str | None, int] | None:
    """The (audience, expirationSeconds) of the pod's projected token source, if any."""
    for v in pod.get("spec", {}).get("volumes", []):
        for src in v.get("projected", {}).get("sources", []):
            sat = src.get("serviceAccountToken")
            if sat is not None:
                return sat.get("audience"), int(sat.get("expirationSeconds", 3607))
    return None


def service_account_kubeconfig(server: str, ca_pem: str, token: str, namespace: str) -> str:
    """A kubeconfig that authenticates as the pod's service account (``KUBECONFIG``)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode(),
                },
            }
        ],
        "users": [{"name": "service-account", "user": {"token": token}}],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {
                    "cluster": "in-cluster",
                    "user": "service-account",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "in-cluster",
    }
    return json.dumps(doc, indent=2) + "\n"
