"""A BrokerCluster's workload: the Kubernetes objects that run its brokers (pure).

From a parsed ``BrokerCluster`` this module builds the manifests the operator
server-side applies, with no I/O:

* a **StatefulSet**: pod ordinal = broker id (from the pod's
  ``apps.kubernetes.io/pod-index`` label), one PVC per pod from
  ``volumeClaimTemplates``, readiness on ``/readyz`` and liveness on
  ``/healthz``; every broker runs ``headrace broker --cluster`` and binds its
  pod IP, so the operator can poll its heartbeat on that IP with the same
  protocol as local mode; it advertises its stable DNS name through the
  headless Service (``Advertise``; its pod IP where there is no cluster DNS);
  it runs as the image's user under Pod Security "restricted", with a
  read-only root and ``/tmp`` as an emptyDir; a ``preStop`` hook
  (``headrace drain``) moves the broker's leadership away before it stops;
* a **headless Service** (stable pod identities for the StatefulSet) and a
  **client Service**;
* with ``spec.listeners.external``, a **Service per broker** selecting that broker's
  pod (``NodePort``: node port ``nodePortBase + id``; ``LoadBalancer``: the listener's
  port) and the broker's external listener (``external_listener_args``), advertised as
  its node's address and that node port, or as its load balancer's address, which only
  the Service's status tells: the operator reads it (``load_balancer_addresses``) and
  puts it in the broker's heartbeat before the control loop records it
  (``headrace.operator.pods``); the operator deletes the Services of brokers a scale
  down removed, or all of them once the listener is (``stale_external_services``);
* a **PodDisruptionBudget** (``maxUnavailable: 1``);
* with ``spec.tls``, the TLS Secret(s) mounted as volumes (``tls_volumes``; never
  ``subPath``, so a renewal reaches the running brokers, which reload it), the TLS
  flags (``tls_args``) and HTTPS probes;
* with ``spec.kafka``, the **Topic** of Kafka groups' committed offsets
  (``offsets_topic``): created once, never applied over;
* a **ConfigMap** with the cluster's ``brokerConfig``; its hash is a pod
  template annotation, so a config change makes a new pod revision. The
  StatefulSet's ``updateStrategy`` is ``OnDelete``: the operator rolls the pods
  itself, one at a time, draining each broker's leadership first and waiting
  for every live replica set to be whole again before the next (``rollout_plan``).

Every object carries an owner reference to the BrokerCluster, so deleting
the cluster lets the garbage collector delete them (the PVCs follow the
StatefulSet's ``persistentVolumeClaimRetentionPolicy``: kept, as data is).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import quote

from headrace.operator import auth
from headrace.operator.bodies import Meta
from headrace.protocol.endpoints import BrokerEndpoint, ListenerAddress
from headrace.resources.clusters import (
    BrokerCluster,
    ClientAuth,
    ExternalListenerType,
    ObjectStore,
    offsets_topic_spec,
)
from headrace.resources.meta import parse_quantity

#: the broker reads the object store's credentials from these (``headrace.objectstore.urls``;
#: restated, as the control plane does not import the data plane's adapters)
ACCESS_KEY_ENV: Final = "HEADRACE_OBJECT_STORE_ACCESS_KEY"
SECRET_KEY_ENV: Final = "HEADRACE_OBJECT_STORE_SECRET_KEY"

#: the ports every broker listens on (on its own pod IP, so they never collide)
DATA_PORT: Final = 9092
ADMIN_PORT: Final = 9644
#: where the broker's volume is mounted in its container
DATA_DIR: Final = "/var/lib/headrace"
#: the image's user and group (Containerfile: ``USER 10001:10001``); pods run as them and
#: own their volumes through ``fsGroup`` (a fresh cloud disk's root is ``root:root 0755``)
IMAGE_UID: Final = 10001
#: the one writable path outside the data volume (the root filesystem is read-only): an
#: emptyDir for temporary files (the broker's certificate checks, Spark's scratch)
SCRATCH_DIR: Final = "/tmp"
SCRATCH_VOLUME: Final = "tmp"
#: CPU and memory a broker is given when its cluster's ``spec.resources`` names neither a
#: request nor a limit for them: no broker is BestEffort (the first evicted under memory
#: pressure) and the scheduler counts its memory; the CPU floor is small, so an
#: evaluation cluster (or the 2-core test bed running several suites) still fits
DEFAULT_REQUESTS: Final[Mapping[str, str]] = {"cpu": "100m", "memory": "512Mi"}
#: how long a broker may take to start before the kubelet restarts it: the startup probe
#: holds liveness off while the broker recovers its logs (it answers /healthz only after)
STARTUP_PERIOD_SECONDS: Final = 5
STARTUP_BUDGET_SECONDS: Final = 30 * 60
#: the label the StatefulSet controller puts on each pod (Kubernetes >= 1.28)
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
#: the label the StatefulSet controller puts on each pod: its name (a broker's Service
#: selects its one pod by it)
POD_NAME_LABEL: Final = "statefulset.kubernetes.io/pod-name"
#: the name brokers know their external listener by (``--listener``); the internal one
#: is the data port
EXTERNAL_LISTENER: Final = "external"
#: marks a broker's external Service (its value: the broker id), so the operator finds
#: the ones no broker needs any more
EXTERNAL_SERVICE_LABEL: Final = "headrace.dev/external-broker"
CLUSTER_LABEL: Final = "headrace.dev/cluster"
CONFIG_HASH_ANNOTATION: Final = "headrace.dev/config-hash"
#: where the TLS Secrets are mounted (``tls_volumes``)
TLS_DIR: Final = "/etc/headrace/tls"
ADMIN_TLS_DIR: Final = "/etc/headrace/admin-tls"
CLIENT_CA_DIR: Final = "/etc/headrace/client-ca"
EXTERNAL_TLS_DIR: Final = "/etc/headrace/external-tls"
#: the keys of a ``kubernetes.io/tls`` Secret as cert-manager writes it
TLS_CERT_KEY: Final = "tls.crt"
TLS_KEY_KEY: Final = "tls.key"
CA_KEY: Final = "ca.crt"
#: ``headrace drain`` and the CLI in a broker pod find the admin CA and server name here
ADMIN_CA_ENV: Final = "HEADRACE_ADMIN_CA"
TLS_CA_ENV: Final = "HEADRACE_TLS_CA"
TLS_SERVER_NAME_ENV: Final = "HEADRACE_TLS_SERVER_NAME"
#: the image when a BrokerCluster names none (the operator's own, in a real install)
DEFAULT_IMAGE: Final = "ghcr.io/headrace/headrace:latest"
#: the Spark image (``make image-spark``, Containerfile.spark): a Java runtime and
#: headrace's ``jobs`` extra. A Compaction's Job runs its driver from it, and its executor
#: pods (``spark.kubernetes.container.image``: the image's entrypoint runs ``executor``)
#: too, so the driver's and the executors' Spark are one version (docs/spark.md)
DEFAULT_SPARK_IMAGE: Final = "ghcr.io/headrace/headrace-spark:latest"
#: Kubernetes' image pull policies
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
#: the Spark image's pull policy unless told otherwise (a ``latest`` tag would mean Always)
DEFAULT_SPARK_IMAGE_PULL_POLICY: Final = "IfNotPresent"
#: the Spark image's user and group: the headrace image's; executor pods run as them
SPARK_IMAGE_UID: Final = IMAGE_UID
#: the Spark image's working directory: executors fetch the application's files into it
SPARK_WORK_DIR: Final = "/opt/spark/work-dir"
#: the service account the chart gives Spark drivers (pods, services, configmaps)
DEFAULT_SPARK_SERVICE_ACCOUNT: Final = "headrace-spark"


class Advertise(enum.StrEnum):
    """What each broker tells clients and its peers to dial (``--advertised-host``)."""

    #: its stable name through the headless Service, ``<pod>.<headless>.<namespace>.svc``
    #: (``stable_host``): it outlives the pod's IP, certificates can name it, and the
    #: Service publishes it before the pod is ready (``publishNotReadyAddresses``)
    DNS = "dns"
    #: its pod IP: for a cluster whose pods' and clients' resolvers do not know the
    #: Service's names (the test bed has no cluster DNS: docs/testbed.md)
    POD_IP = "podIP"


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """How the operator runs brokers (operator-wide, not per cluster)."""

    #: the program (and leading arguments) that runs ``headrace``; ``headrace`` on the
    #: image's PATH in a real cluster, the virtualenv's script on the test bed
    broker_command: tuple[str, ...] = ("headrace",)
    #: the image when a BrokerCluster names none
    default_image: str = DEFAULT_IMAGE
    #: SIGTERM to SIGKILL; the broker flushes and closes its logs in well under this
    termination_grace_seconds: int = 30
    #: extra environment for every broker (e.g. PYTHONPATH on the test bed)
    env: Mapping[str, str] = field(default_factory=dict)
    #: the Spark image: every Compaction's driver (the Job's pod) and its executor pods
    #: (``spark.master: kubernetes``)
    spark_image: str = DEFAULT_SPARK_IMAGE
    #: their containers' ``imagePullPolicy``
    spark_image_pull_policy: str = DEFAULT_SPARK_IMAGE_PULL_POLICY
    #: the service account of those Compactions' driver pods, in each watched namespace
    #: (the chart creates it with its Role); executors run as the namespace's `default`
    spark_service_account: str = DEFAULT_SPARK_SERVICE_ACCOUNT
    #: what brokers advertise: their stable DNS names, or their pod IPs
    advertise: Advertise = Advertise.DNS


def names(cluster_name: str) -> dict[str, str]:
    """The name of each object the cluster owns."""
    return {
        "statefulset": cluster_name,
        "headless": f"{cluster_name}-brokers",
        "client": cluster_name,
        "config": f"{cluster_name}-config",
        "pdb": cluster_name,
    }


#: the StatefulSet's volume claim template: each broker's data directory
DATA_CLAIM: Final = "data"


def data_claim_name(cluster_name: str, broker: int) -> str:
    """The PersistentVolumeClaim of ``broker`` (the StatefulSet controller names it
    ``<template>-<statefulset>-<ordinal>``)."""
    return f"{DATA_CLAIM}-{names(cluster_name)['statefulset']}-{broker}"


def labels(cluster_name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "headrace",
        "app.kubernetes.io/instance": cluster_name,
        "app.kubernetes.io/managed-by": "headrace-operator",
        CLUSTER_LABEL: cluster_name,
    }


#: the topology keys broker pods spread over by default: nodes, then zones
SPREAD_KEYS: Final = ("kubernetes.io/hostname", "topology.kubernetes.io/zone")


def spread_constraints(cluster_name: str) -> list[dict[str, Any]]:
    """A cluster's brokers spread across nodes and across zones, one apart at most.

    ``ScheduleAnyway``: a preference the scheduler scores, never a refusal, so a cluster
    with fewer nodes (or zones) than brokers still runs, as compact as it must be; a node
    without a zone label is simply not counted for the zone spread."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": _selector(cluster_name)},
        }
        for key in SPREAD_KEYS
    ]


def _selector(cluster_name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "headrace", CLUSTER_LABEL: cluster_name}


def _meta(name: str, cluster: BrokerCluster, uid: str, namespace: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(cluster.metadata.name),
        "ownerReferences": [
            {
                "apiVersion": cluster.api_version,
                "kind": cluster.kind,
                "name": cluster.metadata.name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def broker_config_document(cluster: BrokerCluster) -> str:
    """The ConfigMap's ``broker.json``: the cluster's ``brokerConfig``, camelCase, sorted."""
    doc = cluster.spec.broker_config.model_dump(mode="json", by_alias=True)
    return json.dumps(doc, sort_keys=True, indent=2)


def config_data(cluster: BrokerCluster) -> dict[str, str]:
    """The ConfigMap's data: ``broker.json`` and, with an object store, ``object-store.json``
    (the URL the brokers use and where their credentials come from; no secret in it)."""
    data = {"broker.json": broker_config_document(cluster)}
    store = cluster.spec.object_store
    if store is not None:
        secret = store.credentials_secret
        doc = {
            "url": object_store_url(store),
            "credentialsSecret": None
            if secret is None
            else secret.model_dump(mode="json", by_alias=True),
        }
        data["object-store.json"] = json.dumps(doc, sort_keys=True, indent=2)
    return data


def stable_host(cluster: BrokerCluster, pod: str) -> str:
    """A broker pod's DNS name through the headless Service (``<pod>.<headless>.<ns>.svc``),
    the same whatever IP the pod has."""
    headless = names(cluster.metadata.name)["headless"]
    return f"{pod}.{headless}.{cluster.metadata.namespace}.svc"


def advertised_host(cluster: BrokerCluster, advertise: Advertise) -> str:
    """The broker's ``--advertised-host``, from the container's env (``$(VAR)``)."""
    if advertise is Advertise.POD_IP:
        return "$(POD_IP)"
    return stable_host(cluster, "$(POD_NAME)")


def broker_args(cluster: BrokerCluster, advertise: Advertise = Advertise.DNS) -> list[str]:
    """``headrace broker`` arguments; ``$(VAR)`` is expanded from the container's env. It
    binds its pod IP and advertises ``advertised_host``."""
    config = cluster.spec.broker_config
    args = [
        "broker",
        "--cluster",
        "--broker-id",
        "$(HEADRACE_BROKER_ID)",
        "--host",
        "$(POD_IP)",
        "--port",
        str(DATA_PORT),
        "--admin-host",
        "$(POD_IP)",
        "--admin-port",
        str(ADMIN_PORT),
        "--advertised-host",
        advertised_host(cluster, advertise),
        "--data-dir",
        DATA_DIR,
        "--cluster-id",
        cluster.metadata.name,
        "--fsync",
        str(config.fsync_policy),
        "--flush-interval-ms",
        str(config.flush_interval_ms),
        "--segment-bytes",
        str(config.segment_bytes),
        "--cohort-grace-ms",
        str(config.cohort_grace_ms),
        "--cursor-flush-interval-ms",
        str(config.cursor_flush_interval_ms),
    ]
    store = cluster.spec.object_store
    if store is not None:
        args += ["--object-store", object_store_url(store)]
    kafka = cluster.spec.kafka
    if kafka is not None:
        # advertised as the broker's own stable name (``--advertised-host``); the offsets
        # topic is a Topic of the cluster's namespace
        args += [
            "--kafka-port",
            str(kafka.port),
            "--kafka-offsets-topic",
            f"{cluster.metadata.namespace}/{kafka.offsets_topic}",
        ]
    args += external_listener_args(cluster)
    args += tls_args(cluster)
    if cluster.spec.auth.enabled:
        # credentials come from files the kubelet refreshes (``auth_volumes``), never argv
        args += [
            "--acl-file",
            f"{auth.ACL_DIR}/{auth.ACL_KEY}",
            "--cluster-key-file",
            f"{auth.AUTH_DIR}/{auth.CLUSTER_KEY_FILE}",
            "--replication-token-file",
            auth.REPLICATION_TOKEN_PATH,
        ]
    return args


def external_listener_args(cluster: BrokerCluster) -> list[str]:
    """The external listener's flags: bound on the pod IP (the broker's Service forwards
    to it), advertised as the node the pod runs on and the broker's node port
    (``nodePortBase`` plus its id: ``+id``). Behind a load balancer the broker cannot
    know its address (a controller writes it into its Service's status, maybe after the
    pod started, maybe changed later): the operator replaces what the broker's heartbeat
    says with it (``advertise_external``), so no flag names it. With
    ``listeners.external.tls``, the listener serves that Secret's certificate."""
    external = cluster.spec.listeners.external
    if external is None:
        return []
    args = ["--listener", f"{EXTERNAL_LISTENER}=$(POD_IP):{external.port}"]
    if external.node_port_base is not None:
        args += [
            "--advertised-listener",
            f"{EXTERNAL_LISTENER}=$(NODE_IP):{external.node_port_base}+id",
        ]
    if external.tls is not None:
        args += [
            "--listener-tls-cert", f"{EXTERNAL_LISTENER}={EXTERNAL_TLS_DIR}/{TLS_CERT_KEY}",
            "--listener-tls-key", f"{EXTERNAL_LISTENER}={EXTERNAL_TLS_DIR}/{TLS_KEY_KEY}",
        ]  # fmt: skip
    return args


def external_service_name(cluster_name: str, broker: int) -> str:
    """Broker ``broker``'s external Service."""
    return f"{cluster_name}-external-{broker}"


def external_services(
    cluster: BrokerCluster, uid: str, namespace: str, replicas: int
) -> list[dict[str, Any]]:
    """One Service per broker for ``spec.listeners.external`` (none without it): a
    NodePort forwarding node port ``nodePortBase + id``, or a LoadBalancer forwarding
    the listener's port, to that broker's pod alone, so a client outside the cluster
    reaches the broker it was told (a shared Service would spread its connections over
    every broker). ``annotations`` go on every one (a cloud's load-balancer settings)."""
    external = cluster.spec.listeners.external
    if external is None:
        return []
    name = cluster.metadata.name
    services = []
    for broker in range(replicas):
        meta = _meta(external_service_name(name, broker), cluster, uid, namespace)
        meta["labels"] = {**meta["labels"], EXTERNAL_SERVICE_LABEL: str(broker)}
        if external.annotations:
            meta["annotations"] = dict(sorted(external.annotations.items()))
        port: dict[str, Any] = {
            "name": EXTERNAL_LISTENER,
            "port": external.port,
            "targetPort": EXTERNAL_LISTENER,
        }
        if external.node_port_base is not None:
            port["nodePort"] = external.node_port_base + broker
        services.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": meta,
                "spec": {
                    "type": external.type.value,
                    "selector": {
                        **_selector(name),
                        POD_NAME_LABEL: f"{names(name)['statefulset']}-{broker}",
                    },
                    # the pod's broker is the address: ready or not, as the headless one
                    "publishNotReadyAddresses": True,
                    "ports": [port],
                },
            }
        )
    return services


def load_balancer_address(service: Mapping[str, Any]) -> ListenerAddress | None:
    """The external listener's address a LoadBalancer Service's status gives (its first
    ingress: the IP, else the hostname; the Service's port), or None while the
    load-balancer controller has given it none."""
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    ports = (service.get("spec") or {}).get("ports") or []
    if not ingress or not ports:
        return None
    host = ingress[0].get("ip") or ingress[0].get("hostname")
    port = next((p.get("port") for p in ports if p.get("name") == EXTERNAL_LISTENER), None)
    if not host or not isinstance(port, int):
        return None
    return ListenerAddress(EXTERNAL_LISTENER, host, port)


def load_balancer_addresses(
    cluster: BrokerCluster, services: Iterable[Mapping[str, Any]]
) -> dict[int, ListenerAddress] | None:
    """Each broker's external address behind its load balancer, by broker id, as
    ``services`` (the cluster's) give them; a broker whose Service has none yet is
    left out. None when the external listener is not a LoadBalancer one (the brokers'
    own flags name their addresses)."""
    external = cluster.spec.listeners.external
    if external is None or external.type is not ExternalListenerType.LOAD_BALANCER:
        return None
    addresses: dict[int, ListenerAddress] = {}
    for service in services:
        labels = (service.get("metadata") or {}).get("labels") or {}
        broker = labels.get(EXTERNAL_SERVICE_LABEL)
        if broker is None or not broker.isdigit():
            continue
        address = load_balancer_address(service)
        if address is not None:
            addresses[int(broker)] = address
    return addresses


def advertise_external(
    endpoint: BrokerEndpoint, addresses: Mapping[int, ListenerAddress]
) -> BrokerEndpoint:
    """The broker's endpoint with its external listener's address replaced by its load
    balancer's (``addresses``, by broker id), or marked pending while it has none: never
    the pod address the broker bound, which no client outside the cluster reaches. A
    broker that names no external listener (not restarted with it yet) is left as is."""
    if not any(n.name == EXTERNAL_LISTENER for n in endpoint.listeners):
        return endpoint
    assigned = addresses.get(endpoint.id, ListenerAddress.pending(EXTERNAL_LISTENER))
    listeners = tuple(assigned if n.name == EXTERNAL_LISTENER else n for n in endpoint.listeners)
    return replace(endpoint, listeners=listeners)


def pending_external_brokers(
    cluster: BrokerCluster, addresses: Mapping[int, ListenerAddress] | None, replicas: int
) -> list[int]:
    """The brokers (of ``replicas``) whose load balancer has no address yet; none when
    the external listener is not a LoadBalancer one."""
    if addresses is None:
        return []
    return [broker for broker in range(replicas) if broker not in addresses]


def stale_external_services(
    cluster: BrokerCluster, replicas: int, existing: Iterable[Meta]
) -> list[str]:
    """The names of the external Services in ``existing`` (the cluster's Services) no
    broker needs: a broker's at or beyond ``replicas``, or all once the listener is gone."""
    keep = 0 if cluster.spec.listeners.external is None else replicas
    stale = []
    for service in existing:
        broker = service.labels.get(EXTERNAL_SERVICE_LABEL)
        if broker is not None and (not broker.isdigit() or int(broker) >= keep):
            stale.append(service.name)
    return sorted(stale)


def auth_env(cluster: BrokerCluster) -> list[dict[str, Any]]:
    """Where ``headrace drain`` (the preStop hook) finds the replication token: the file
    the broker reads too, so a rotated token reaches it without a restart. Not the token
    itself (an env var a running pod never sees change; pods made before the file carry
    ``HEADRACE_REPLICATION_TOKEN``, which ``drain`` still reads when the file is absent)."""
    if not cluster.spec.auth.enabled:
        return []
    return [{"name": auth.REPLICATION_TOKEN_FILE_ENV, "value": auth.REPLICATION_TOKEN_PATH}]


def auth_volumes(cluster: BrokerCluster) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts for the ACL file, the cluster key and
    the replication token. The key file is 0400, which the pod's ``fsGroup`` makes
    ``root:<fsGroup> 0440``: the broker refuses a key others or another group can read
    (the token file shares the mode). Each is mounted as a directory,
    not with ``subPath``, so the kubelet's updates reach running pods and the broker
    reloads them: that is how the key and the token rotate (docs/security.md §9)."""
    if not cluster.spec.auth.enabled:
        return [], []
    name = cluster.metadata.name
    volumes = [
        {"name": "acl", "configMap": {"name": auth.acl_config_name(name)}},
        {
            "name": "auth",
            "secret": {
                "secretName": auth.auth_secret_name(name),
                "items": [
                    {"key": auth.CLUSTER_KEY_KEY, "path": auth.CLUSTER_KEY_FILE},
                    {"key": auth.REPLICATION_TOKEN_KEY, "path": auth.REPLICATION_TOKEN_FILE},
                ],
                "defaultMode": 0o400,
            },
        },
    ]
    mounts = [
        {"name": "acl", "mountPath": auth.ACL_DIR, "readOnly": True},
        {"name": "auth", "mountPath": auth.AUTH_DIR, "readOnly": True},
    ]
    return volumes, mounts


def tls_server_name(cluster: BrokerCluster) -> str:
    """The name every broker's certificate must carry: the client Service's DNS name.
    Clients verify it whatever pod IP they dial (``headrace.tlsnames``)."""
    return f"{names(cluster.metadata.name)['client']}.{cluster.metadata.namespace}.svc"


def admin_tls_secret(cluster: BrokerCluster) -> str | None:
    """The Secret admin HTTP serves from (None: plain HTTP)."""
    tls = cluster.spec.tls
    if not tls.enabled or not tls.admin_tls.enabled:
        return None
    return tls.admin_tls.secret_name or tls.secret_name


def external_tls_secret(cluster: BrokerCluster) -> str | None:
    """The Secret the external listener serves from, if it has one of its own."""
    external = cluster.spec.listeners.external
    if not cluster.spec.tls.enabled or external is None or external.tls is None:
        return None
    return external.tls.secret_name


def tls_secrets(cluster: BrokerCluster) -> list[str]:
    """Every Secret ``spec.tls`` names, each once: the serving one, the admin one, the
    client CA's (checked by the operator: ``headrace.operator.certificates``)."""
    tls = cluster.spec.tls
    if not tls.enabled or tls.secret_name is None:
        return []
    found = [
        tls.secret_name,
        admin_tls_secret(cluster),
        tls.client_ca_secret_name,
        external_tls_secret(cluster),
    ]
    return list(dict.fromkeys(n for n in found if n is not None))


def tls_args(cluster: BrokerCluster) -> list[str]:
    """The broker's TLS flags: the serving pair and CA from the mounted Secret, the
    Service name peers' certificates must carry, client certificates as ``clientAuth``
    asks, and admin HTTP's pair."""
    tls = cluster.spec.tls
    if not tls.enabled:
        return []
    args = [
        "--tls-cert", f"{TLS_DIR}/{TLS_CERT_KEY}",
        "--tls-key", f"{TLS_DIR}/{TLS_KEY_KEY}",
        "--tls-ca", f"{TLS_DIR}/{CA_KEY}",
        "--tls-server-name", tls_server_name(cluster),
    ]  # fmt: skip
    if tls.client_auth is not ClientAuth.NONE:
        ca_dir = CLIENT_CA_DIR if tls.client_ca_secret_name else TLS_DIR
        args += [
            "--tls-client-ca",
            f"{ca_dir}/{CA_KEY}",
            "--tls-client-auth",
            tls.client_auth.value,
        ]
    admin_secret = admin_tls_secret(cluster)
    if admin_secret is not None:
        admin_dir = TLS_DIR if admin_secret == tls.secret_name else ADMIN_TLS_DIR
        args += [
            "--admin-tls-cert", f"{admin_dir}/{TLS_CERT_KEY}",
            "--admin-tls-key", f"{admin_dir}/{TLS_KEY_KEY}",
        ]  # fmt: skip
    return args


def tls_volumes(cluster: BrokerCluster) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts for the TLS Secrets: whole Secrets as
    directories (no ``subPath``, no ``items``), so the kubelet's atomic updates of a
    renewed certificate reach the brokers. Keys are 0400: only the broker reads them."""
    tls = cluster.spec.tls
    if not tls.enabled or tls.secret_name is None:
        return [], []
    wanted = [("tls", tls.secret_name, TLS_DIR)]
    admin_secret = admin_tls_secret(cluster)
    if admin_secret is not None and admin_secret != tls.secret_name:
        wanted.append(("admin-tls", admin_secret, ADMIN_TLS_DIR))
    if tls.client_auth is not ClientAuth.NONE and tls.client_ca_secret_name:
        wanted.append(("client-ca", tls.client_ca_secret_name, CLIENT_CA_DIR))
    external_secret = external_tls_secret(cluster)
    if external_secret is not None:
        wanted.append(("external-tls", external_secret, EXTERNAL_TLS_DIR))
    volumes = [
        {"name": volume, "secret": {"secretName": secret, "defaultMode": 0o400}}
        for volume, secret, _ in wanted
    ]
    mounts = [{"name": volume, "mountPath": path, "readOnly": True} for volume, _, path in wanted]
    return volumes, mounts


def tls_env(cluster: BrokerCluster) -> list[dict[str, str]]:
    """What a ``headrace`` command in the pod needs to reach the brokers over TLS: the
    preStop ``headrace drain`` (admin CA), ``kubectl exec ... headrace produce`` (CA)."""
    admin_secret = admin_tls_secret(cluster)
    if not cluster.spec.tls.enabled:
        return []
    env = [
        {"name": TLS_CA_ENV, "value": f"{TLS_DIR}/{CA_KEY}"},
        {"name": TLS_SERVER_NAME_ENV, "value": tls_server_name(cluster)},
    ]
    if admin_secret is not None:
        admin_dir = TLS_DIR if admin_secret == cluster.spec.tls.secret_name else ADMIN_TLS_DIR
        env.append({"name": ADMIN_CA_ENV, "value": f"{admin_dir}/{CA_KEY}"})
    return env


def object_store_url(store: ObjectStore) -> str:
    """The broker's ``--object-store`` URL (``headrace.objectstore.urls``) of the spec's
    object store; never with credentials (they come from the environment: ``store_env``)."""
    scheme, _, rest = store.endpoint.partition("://")
    host = rest.split("/", 1)[0]
    options = []
    if store.create_bucket:
        options.append("create_bucket=1")
    if store.region is not None:
        options.append(f"region={quote(store.region, safe='')}")
    query = f"?{'&'.join(options)}" if options else ""
    return f"{'s3+https' if scheme == 'https' else 's3'}://{host}/{store.bucket}{query}"


def store_env(store: ObjectStore | None) -> list[dict[str, Any]]:
    """The credentials' environment variables, each a ``secretKeyRef`` into the Secret the
    spec names: the operator never copies a secret, the kubelet resolves it."""
    if store is None or store.credentials_secret is None:
        return []
    secret = store.credentials_secret
    return [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
        for var, key in (
            (ACCESS_KEY_ENV, secret.access_key_key),
            (SECRET_KEY_ENV, secret.secret_key_key),
        )
    ]


def drain_command(settings: WorkloadSettings) -> list[str]:
    """The preStop hook: ``headrace drain``, bounded well inside the grace period so the
    broker still gets SIGTERM with time to flush and close its logs."""
    grace = settings.termination_grace_seconds
    timeout = max(1, min(grace - 10, (grace * 2) // 3))
    return [*settings.broker_command, "drain", "--timeout", str(timeout)]


def _env(cluster: BrokerCluster, settings: WorkloadSettings) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *_node_ip_env(cluster),
        # the preStop hook's ``headrace drain`` finds the broker's admin port here
        {
            "name": "HEADRACE_ADMIN_URL",
            "value": f"{admin_scheme(cluster)}://$(POD_IP):{ADMIN_PORT}",
        },
        {
            "name": "HEADRACE_BROKER_ID",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
        },
    ]
    env += store_env(cluster.spec.object_store)
    env += auth_env(cluster)
    env += tls_env(cluster)
    env += [{"name": k, "value": v} for k, v in sorted(settings.env.items())]
    return env


def _node_ip_env(cluster: BrokerCluster) -> list[dict[str, Any]]:
    """The node's address, which a NodePort external listener advertises (none without
    one, so a cluster without it keeps its pod template)."""
    external = cluster.spec.listeners.external
    if external is None or external.node_port_base is None:
        return []
    return [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]


def pod_security_context(uid: int = IMAGE_UID) -> dict[str, Any]:
    """Pod Security "restricted" at the pod level: a non-root numeric user (the image's),
    its group owning the volumes (``fsGroup``; changed only when the volume's root does
    not have it yet, so a large log is not walked at every start), the runtime's seccomp
    profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Pod Security "restricted" at the container level, and a read-only root filesystem
    (what a container writes goes to its volumes: the data volume and ``SCRATCH_DIR``)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's scratch emptyDir and the container's mount of it at ``SCRATCH_DIR``."""
    return (
        {"name": SCRATCH_VOLUME, "emptyDir": {}},
        {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR},
    )


def broker_resources(cluster: BrokerCluster) -> dict[str, Any]:
    """The spec's resources, with ``DEFAULT_REQUESTS`` for each resource it names neither a
    request nor a limit of (a limit alone is also the request, as Kubernetes defaults it)."""
    requirements: dict[str, Any] = cluster.spec.resources.model_dump(
        mode="json", by_alias=True, exclude_defaults=True
    )
    requests = dict(requirements.get("requests", {}))
    limits = requirements.get("limits", {})
    for resource, amount in DEFAULT_REQUESTS.items():
        if resource not in requests and resource not in limits:
            requests[resource] = amount
    return {**requirements, "requests": requests}


def admin_scheme(cluster: BrokerCluster) -> str:
    return "http" if admin_tls_secret(cluster) is None else "https"


def hosting(topic_statuses: Iterable[Mapping[str, Any]]) -> dict[int, list[str]]:
    """Broker id -> the partitions ('<topic>/<partition>') it holds a replica of, from Topic
    statuses (``name`` added to each: 'namespace/name')."""
    held: dict[int, list[str]] = {}
    for status in topic_statuses:
        for p in status.get("partitions") or []:
            for broker in p.get("replicas") or []:
                held.setdefault(int(broker), []).append(f"{status['name']}/{p['partition']}")
    return held


def scale_down_blockers(
    replicas: int, topic_statuses: Iterable[Mapping[str, Any]]
) -> dict[int, list[str]]:
    """The brokers a scale down to ``replicas`` would remove that still hold replicas.

    Removing one would take copies away that nothing has moved off (and possibly the last
    in-sync one), so the StatefulSet keeps them until their partitions are unloaded.
    """
    return {b: parts for b, parts in sorted(hosting(topic_statuses).items()) if b >= replicas}


def statefulset(
    cluster: BrokerCluster,
    uid: str,
    namespace: str,
    settings: WorkloadSettings,
    replicas: int | None = None,
) -> dict[str, Any]:
    """``replicas``: the pod count, when it must differ from the spec's (a refused scale
    down keeps the brokers that still hold partitions)."""
    name = cluster.metadata.name
    spec = cluster.spec
    config_hash = hashlib.sha256(broker_config_document(cluster).encode()).hexdigest()[:16]
    auth_volume_list, auth_mounts = auth_volumes(cluster)
    tls_volume_list, tls_mounts = tls_volumes(cluster)
    scratch, scratch_mount = scratch_volume()
    # HTTPS probes with admin TLS (the kubelet does not verify their certificate); no
    # ``scheme`` otherwise, so a cluster without TLS keeps its pod template
    https = {"scheme": "HTTPS"} if admin_scheme(cluster) == "https" else {}
    container: dict[str, Any] = {
        "name": "broker",
        "image": spec.image or settings.default_image,
        "command": list(settings.broker_command),
        "args": broker_args(cluster, settings.advertise),
        "env": _env(cluster, settings),
        "ports": [
            {"name": "data", "containerPort": DATA_PORT},
            {"name": "admin", "containerPort": ADMIN_PORT},
            *_kafka_ports(cluster, "containerPort"),
            *_external_ports(cluster),
        ],
        # admin HTTP answers only once the logs are recovered: until then the startup
        # probe, not liveness, decides, and it waits as long as a large log may take
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "admin", **https},
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": STARTUP_BUDGET_SECONDS // STARTUP_PERIOD_SECONDS,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "admin", **https},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "admin", **https},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": broker_resources(cluster),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": DATA_CLAIM, "mountPath": DATA_DIR},
            scratch_mount,
            *auth_mounts,
            *tls_mounts,
        ],
        # controlled shutdown: move leadership off before SIGTERM (``cli.drain``)
        "lifecycle": {"preStop": {"exec": {"command": drain_command(settings)}}},
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [scratch, *auth_volume_list, *tls_volume_list],
    }
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = list(scheduling.tolerations)
    if scheduling.affinity is not None:
        pod_spec["affinity"] = scheduling.affinity
    else:
        pod_spec["topologySpreadConstraints"] = spread_constraints(name)
    claim: dict[str, Any] = {
        "metadata": {"name": DATA_CLAIM, "labels": labels(name)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": spec.storage.size}},
        },
    }
    if spec.storage.storage_class_name is not None:
        claim["spec"]["storageClassName"] = spec.storage.storage_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(names(name)["statefulset"], cluster, uid, namespace),
        "spec": {
            "serviceName": names(name)["headless"],
            "replicas": spec.replicas if replicas is None else replicas,
            # brokers start together: each waits for the controller, not for its peers
            "podManagementPolicy": "Parallel",
            # the operator rolls the pods itself, draining each first (``rollout_plan``)
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": _selector(name)},
            "template": {
                "metadata": {
                    "labels": labels(name),
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
                },
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [claim],
        },
    }


def _kafka_ports(cluster: BrokerCluster, key: str) -> list[dict[str, Any]]:
    """The Kafka listener's port, if the cluster has one (a container's or a Service's)."""
    kafka = cluster.spec.kafka
    if kafka is None:
        return []
    port: dict[str, Any] = {"name": "kafka", key: kafka.port}
    if key == "port":
        port["targetPort"] = "kafka"
    return [port]


def _external_ports(cluster: BrokerCluster) -> list[dict[str, Any]]:
    """The external listener's container port, if the cluster has one."""
    external = cluster.spec.listeners.external
    if external is None:
        return []
    return [{"name": EXTERNAL_LISTENER, "containerPort": external.port}]


def manifests(
    cluster: BrokerCluster,
    uid: str,
    namespace: str,
    settings: WorkloadSettings,
    replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Every object of the cluster's workload, in apply order."""
    name = cluster.metadata.name
    ports = [
        {"name": "data", "port": DATA_PORT, "targetPort": "data"},
        {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin"},
    ]
    headless_ports = [*ports, *_kafka_ports(cluster, "port")]
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(names(name)["config"], cluster, uid, namespace),
            "data": config_data(cluster),
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(names(name)["headless"], cluster, uid, namespace),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": _selector(name),
                "ports": headless_ports,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(names(name)["client"], cluster, uid, namespace),
            "spec": {"selector": _selector(name), "ports": ports[:1]},
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(names(name)["pdb"], cluster, uid, namespace),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(name)}},
        },
        *external_services(
            cluster, uid, namespace, cluster.spec.replicas if replicas is None else replicas
        ),
        statefulset(cluster, uid, namespace, settings, replicas),
    ]


def offsets_topic(cluster: BrokerCluster, uid: str, namespace: str) -> dict[str, Any] | None:
    """The Topic of Kafka groups' committed offsets the operator creates for a cluster with
    ``spec.kafka`` (None without): created only when absent and never applied again, so
    an existing one (a user's own, or one edited since) is never overwritten.

    Owned by the BrokerCluster: deleted with it, and GitOps tools see it as the cluster's
    child, not as an object missing from (or extra to) their sources. It carries none of
    the ``app.kubernetes.io/instance`` labels some of them track their own objects by, so
    none prunes it as out of its sources."""
    kafka = cluster.spec.kafka
    if kafka is None:
        return None
    meta = _meta(kafka.offsets_topic, cluster, uid, namespace)
    meta["labels"] = {
        "app.kubernetes.io/managed-by": "headrace-operator",
        CLUSTER_LABEL: cluster.metadata.name,
    }
    return {
        "apiVersion": cluster.api_version,
        "kind": "Topic",
        "metadata": meta,
        "spec": offsets_topic_spec(cluster.metadata.name, cluster.spec.replicas),
    }


def broker_id_of(pod: Mapping[str, Any]) -> int | None:
    """The broker id of a StatefulSet pod: its ordinal (label, else the name's suffix)."""
    meta = pod.get("metadata", {})
    index = (meta.get("labels") or {}).get(POD_INDEX_LABEL)
    if index is None:
        index = str(meta.get("name", "")).rpartition("-")[2]
    return int(index) if str(index).isdigit() else None


# ---------------------------------------------------------------------- storage size

#: Ready reasons of a ``storage.size`` the operator refuses (the spec as it stands)
STORAGE_SHRINK: Final = "StorageShrinkRefused"
STORAGE_NOT_EXPANDABLE: Final = "StorageNotExpandable"
#: the annotation that makes a StorageClass the cluster's default
DEFAULT_CLASS_ANNOTATION: Final = "storageclass.kubernetes.io/is-default-class"


class StorageRefused(Exception):
    """A ``storage.size`` the operator cannot carry out: ``reason`` is the Ready reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def claim_size(statefulset: Mapping[str, Any]) -> str | None:
    """The size the StatefulSet's ``data`` claim template asks for, as stored."""
    for claim in (statefulset.get("spec") or {}).get("volumeClaimTemplates") or []:
        if (claim.get("metadata") or {}).get("name") == "data":
            size = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
                "storage"
            )
            return None if size is None else str(size)
    return None


def storage_change(stored: str | None, wanted: str) -> int:
    """-1 (a shrink), 0 (the same size) or 1 (growth) from ``stored`` to ``wanted``.

    ``volumeClaimTemplates`` are immutable, so neither can go through the StatefulSet:
    growth is an expansion of every claim (where their class allows it), a shrink is
    refused (a volume cannot be made smaller)."""
    if stored is None:
        return 0
    before, after = parse_quantity(stored), parse_quantity(wanted)
    return (after > before) - (after < before)


def expandable(storage_class: Mapping[str, Any] | None) -> bool:
    return bool((storage_class or {}).get("allowVolumeExpansion"))


def claim_patch(claim: Mapping[str, Any], size: str) -> dict[str, Any] | None:
    """The apply that grows one broker's claim to ``size``; None if it is that big already."""
    requested = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
        "storage"
    )
    if requested is not None and parse_quantity(str(requested)) >= parse_quantity(size):
        return None
    meta = claim["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
        "spec": {"resources": {"requests": {"storage": size}}},
    }
