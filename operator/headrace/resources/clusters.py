"""BrokerCluster: a StatefulSet of brokers, the Services in front of it and their settings.

Pure data. Defaults of the broker settings are the broker's own: the log's come
from :class:`headrace.storage.bookkeeping.LogConfig` (a pure core), the two
from :class:`headrace.broker.config.BrokerSettings` are restated here and a unit
test keeps them equal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from headrace.resources.meta import (
    READY_COLUMNS,
    CelRule,
    ClusterMeta,
    KindNames,
    Model,
    PositiveQuantity,
    PrinterColumn,
    Quantity,
    Resource,
    SecretReference,
    Status,
    SubdomainName,
    list_map,
    parse_quantity,
    validations,
)
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

_LOG: Final = LogConfig()

#: the broker's own defaults (``BrokerSettings``); not imported, so that this pure data
#: package does not depend on the data path. A unit test keeps them equal.
DEFAULT_CURSOR_FLUSH_INTERVAL_MS: Final = 200
DEFAULT_COHORT_GRACE_MS: Final = 10_000


class Storage(Model):
    """Each broker's PersistentVolumeClaim (one per pod, kept across restarts)."""

    size: PositiveQuantity = "10Gi"
    """Requested volume size, a Kubernetes quantity. It may grow: the operator expands
    every broker's claim when their StorageClass allows volume expansion
    (``allowVolumeExpansion``), and refuses the change in status otherwise. It may not
    shrink."""
    storage_class_name: SubdomainName | None = None
    """StorageClass of the claims; the cluster's default class when unset. Immutable:
    a claim's class cannot change."""


#: the API server's refusal of a smaller ``storage.size`` (a volume cannot shrink)
STORAGE_SHRINK_REFUSED: Final = (
    "storage.size cannot shrink: a volume cannot be made smaller (a larger size expands it)"
)
#: the API server's refusal of a ``storage.storageClassName`` edit
STORAGE_CLASS_IMMUTABLE: Final = (
    "storage.storageClassName is immutable: the brokers' claims cannot change class"
)
#: transition rules (checked on updates, while ``storage`` was and is set)
STORAGE_RULES: Final = (
    CelRule(
        "!has(self.size) || !has(oldSelf.size) || !isQuantity(string(self.size))"
        " || !isQuantity(string(oldSelf.size))"
        " || quantity(string(self.size)).compareTo(quantity(string(oldSelf.size))) >= 0",
        STORAGE_SHRINK_REFUSED,
        ".size",
    ),
    CelRule(
        "has(self.storageClassName) == has(oldSelf.storageClassName)"
        " && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        STORAGE_CLASS_IMMUTABLE,
        ".storageClassName",
    ),
)


class CredentialsSecretReference(SecretReference):
    """A Secret in the cluster's namespace holding the object store's credentials."""

    access_key_key: str = Field(default="accessKey", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    """Key of the access key in the Secret's data."""
    secret_key_key: str = Field(default="secretKey", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    """Key of the secret key in the Secret's data."""


class ObjectStore(Model):
    """The S3-compatible bucket (MinIO, S3) that partitions are tiered to."""

    endpoint: str = Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048)
    """URL of the S3 API, ``http://`` or ``https://``."""
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """Bucket name (S3 rules: 3-63 lower-case letters, digits, '.' and '-')."""
    region: str | None = Field(default=None, min_length=1, max_length=64)
    """Region to sign requests for; MinIO ignores it."""
    create_bucket: bool = False
    """Create the bucket on first use if it does not exist (needs the right to)."""
    credentials_secret: CredentialsSecretReference | None = None
    """Secret with the access key and the secret key. Brokers refuse an S3 store without
    credentials, so a cluster without one has no working tiered storage."""


#: the API server's refusal of a request above its limit (``ResourceRequirements``)
REQUEST_ABOVE_LIMIT: Final = "resources: each of requests must be at most its limits"
#: resource names a container may list (cpu, memory, ephemeral-storage, hugepages-*, ...):
#: a bound, so that the API server can bound the cost of the CEL rule over them
MAX_RESOURCE_NAMES: Final = 16


class ResourceRequirements(Model):
    """CPU and memory for each broker container, as in a pod spec."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_requests_within_limits": CelRule(
            "!has(self.requests) || !has(self.limits) || self.requests.all(name,"
            " !(name in self.limits) || !isQuantity(string(self.requests[name]))"
            " || !isQuantity(string(self.limits[name]))"
            " || quantity(string(self.requests[name]))"
            ".compareTo(quantity(string(self.limits[name]))) <= 0)",
            REQUEST_ABOVE_LIMIT,
        )
    }

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=MAX_RESOURCE_NAMES)
    """Guaranteed amounts, e.g. ``cpu: 500m``, ``memory: 1Gi``."""
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=MAX_RESOURCE_NAMES)
    """Upper bounds; each at least its request."""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise PydanticCustomError(
                    "request_above_limit",
                    "requests.{name} ({request}) exceeds limits.{name} ({limit})",
                    {"name": name, "request": request, "limit": limit},
                )
        return self


class KafkaListener(Model):
    """A Kafka listener on every broker (docs/kafka.md): Kafka's clients and tools reach
    the cluster's topics on this port, through each broker's stable name."""

    port: int = Field(default=9093, ge=1, le=65535)
    """The port every broker serves Kafka's protocol on (its pod IP; the headless Service
    names it ``kafka``). Not the data port (9092) nor the admin port (9644)."""
    offsets_topic: str = Field(
        default="kafka.group-offsets", pattern=r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
    )
    """The Topic (in the cluster's namespace) that keeps Kafka groups' committed offsets;
    its partitions' leaders coordinate the groups. The operator creates it when no Topic
    of that name exists (``offsets_topic_spec``: 3 partitions, up to 3 replicas,
    retention off) and never changes an existing one: apply your own first to choose."""


#: partitions of the offsets topic made for a cluster (by the operator, or by ``headrace
#: local up``): each one's leader coordinates the groups hashed to it. Never changed once
#: made, since a group's coordinator is its id's hash modulo this count
OFFSETS_TOPIC_PARTITIONS: Final = 3


def offsets_topic_spec(cluster_name: str, brokers: int) -> dict[str, Any]:
    """The Topic spec of Kafka groups' committed offsets on a cluster of ``brokers``:
    replicated as widely as the cluster allows (up to 3, ``minInSync`` 2 of them), and
    never trimmed (a coordinator rebuilds its groups from the whole log)."""
    replicas = max(1, min(3, brokers))
    return {
        "clusterRef": {"name": cluster_name},
        "partitions": OFFSETS_TOPIC_PARTITIONS,
        "replicas": replicas,
        "minInSync": min(2, replicas),
        "retention": {"ms": -1, "bytes": -1},
        "tieredStorage": {"enabled": False},
    }


class BrokerConfig(Model):
    """Broker settings, passed to every broker of the cluster.

    Topic-level settings (retention, segment size, delivery) override these.
    """

    fsync_policy: FsyncPolicy = _LOG.fsync
    """``none`` (the OS decides), ``interval`` (group commit every ``flushIntervalMs``) or
    ``always`` (acknowledge after an fsync that covers the batch)."""
    flush_interval_ms: int = Field(default=_LOG.flush_interval_ms, ge=1, le=60_000)
    """Group-commit period under ``interval``, in milliseconds."""
    segment_bytes: int = Field(default=_LOG.segment_bytes, ge=1)
    """Roll to a new segment past this size, in bytes."""
    segment_ms: int = Field(default=_LOG.segment_ms, ge=1)
    """Roll a segment this old even if small, in milliseconds."""
    retention_ms: int = Field(default=_LOG.retention_ms, ge=-1)
    """Delete segments whose newest record is older than this; -1 keeps them forever."""
    retention_bytes: int = Field(default=_LOG.retention_bytes, ge=-1)
    """Delete the oldest segments while a partition is larger than this; -1 is unlimited."""
    max_batch_bytes: int = Field(default=_LOG.max_batch_bytes, ge=1)
    """Largest record batch a producer may send, in bytes."""
    checkpoint_interval_ms: int = Field(default=_LOG.checkpoint_interval_ms, ge=1)
    """How often each partition writes its recovery point, in milliseconds."""
    cursor_flush_interval_ms: int = Field(default=DEFAULT_CURSOR_FLUSH_INTERVAL_MS, ge=1)
    """Cohort cursors reach disk within this many milliseconds (bounds redelivery after a crash)."""
    cohort_grace_ms: int = Field(default=DEFAULT_COHORT_GRACE_MS, ge=0, le=3_600_000)
    """How long a cohort member losing a partition may finish in-flight records, in milliseconds."""


class Scheduling(Model):
    """Where broker pods may run. Tolerations and affinity are Kubernetes' own types,
    kept free-form here and validated by the API server when the StatefulSet is written."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels a broker's node must have."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Pod tolerations, as in a pod spec."""
    affinity: dict[str, Any] | None = None
    """Pod affinity, as in a pod spec. When unset the operator spreads the brokers across
    nodes and across zones (``topologySpreadConstraints``, max skew 1, a preference:
    ``ScheduleAnyway``)."""


class ClusterAuth(Model):
    """Authentication and ACLs of the cluster's brokers (docs/security.md §8)."""

    enabled: bool = False
    """Run the brokers with ACLs: the operator makes the Secret ``<cluster>-cluster-auth``
    (a replication token and the cluster key), renders every ``User`` of the cluster into
    the ACL file the brokers load (ConfigMap ``<cluster>-acl``), and presents the
    replication token on its heartbeat polls and topology pushes. Without it the brokers
    ask for no credentials (``User`` objects of the cluster then stay not Ready)."""


class ClientAuth(enum.StrEnum):
    """Whether clients of the data port present a certificate (docs/security.md §10)."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRED = "required"


class AdminTls(Model):
    """TLS of the brokers' admin HTTP ports (probes, the operator's polls and pushes)."""

    enabled: bool = True
    """Serve admin HTTP over TLS too (the operator then polls over HTTPS with the CA)."""
    secret_name: SubdomainName | None = None
    """A ``kubernetes.io/tls`` Secret of its own (``tls.crt``, ``tls.key``, ``ca.crt``);
    the data port's Secret when unset."""


class ClusterTls(Model):
    """TLS of the cluster's brokers (docs/security.md §10)."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_enabled_needs_a_secret": CelRule(
            "!self.enabled || has(self.secretName)", "tls.enabled needs tls.secretName"
        )
    }

    enabled: bool = False
    """Serve the data port over TLS with the certificate in ``secretName`` (and admin
    HTTP, unless ``adminTls.enabled`` is false). Brokers fetch from one another over TLS,
    verifying with the Secret's ``ca.crt``. Set it when the cluster is created: switching
    a running cluster takes restarting every broker at once (docs/operations.md)."""
    secret_name: SubdomainName | None = None
    """A ``kubernetes.io/tls`` Secret (cert-manager's shape) with ``tls.crt``, ``tls.key``
    and ``ca.crt``. The certificate must name ``<cluster>.<namespace>.svc`` (every client
    verifies that name, whatever pod IP it dials) and may name
    ``*.<cluster>-brokers.<namespace>.svc``. Mounted as a volume, so a renewal reaches
    running brokers, which reload it."""
    client_auth: ClientAuth = ClientAuth.NONE
    """``required``: every client presents a certificate signed by the client CA;
    ``optional``: one is checked when presented (``tls`` Users), others use tokens."""
    client_ca_secret_name: SubdomainName | None = Field(default=None, alias="clientCASecretName")
    """Secret whose ``ca.crt`` signs client certificates; ``secretName``'s ``ca.crt`` when
    unset. Brokers' own certificates are accepted too (they fetch from one another)."""
    admin_tls: AdminTls = Field(default_factory=AdminTls)
    """TLS of the admin ports."""

    @model_validator(mode="after")
    def _enabled_needs_a_secret(self) -> ClusterTls:
        if self.enabled and self.secret_name is None:
            raise ValueError("tls.enabled needs tls.secretName")
        return self


class ExternalListenerType(enum.StrEnum):
    """How clients outside the cluster reach each broker."""

    #: a NodePort Service per broker: every node forwards ``nodePortBase + id`` to it
    NODE_PORT = "NodePort"
    #: a LoadBalancer Service per broker: the load balancer's address, once a
    #: load-balancer controller (the cloud's, MetalLB) has given it one
    LOAD_BALANCER = "LoadBalancer"


class ExternalListenerTls(Model):
    """The external listener's own certificate: the names clients outside the cluster
    dial are not the in-cluster names the data port's certificate carries."""

    secret_name: SubdomainName
    """A ``kubernetes.io/tls`` Secret (cert-manager's shape: ``tls.crt``, ``tls.key``)
    whose certificate names every address the external listener advertises (each
    broker's load-balancer hostname or IP, or the nodes' addresses), or a name a client
    verifies instead. Served on the external listener only; client certificates are
    checked as on the data port (``tls.clientAuth``). Mounted as a volume: a renewal
    reaches running brokers, which reload it."""


class ExternalListener(Model):
    """A data listener for clients outside the cluster: each broker gets a Service of its
    own and advertises, on this listener, the address such a client dials. Clients that
    bootstrap through it are told every broker's external address (docs/operations.md,
    *External listener*)."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_node_port_base_with_node_port": CelRule(
            "self.type == 'NodePort' ? has(self.nodePortBase) : !has(self.nodePortBase)",
            "nodePortBase is required with type NodePort and refused with LoadBalancer",
        )
    }

    type: ExternalListenerType = ExternalListenerType.NODE_PORT
    """``NodePort``: broker ``i`` is reached on its node's address and node port
    ``nodePortBase + i``. ``LoadBalancer``: broker ``i`` is reached on its own
    Service's load-balancer address (``status.loadBalancer.ingress[0]``: its IP, else
    its hostname) and ``port``; until the load balancer has one, the broker is left out
    of this listener's topology and the BrokerCluster's ``ExternalAddressesAssigned``
    condition is False."""
    port: int = Field(default=9094, ge=1, le=65535)
    """The port every broker binds this listener to on its pod IP (the Services' target),
    and a LoadBalancer Service's port. Not the data port (9092), the Kafka port (9093)
    nor the admin port (9644)."""
    node_port_base: int | None = Field(default=None, ge=30000, le=32767)
    """``NodePort`` only, and required there: broker ``i``'s node port is
    ``nodePortBase + i``, a range of ``replicas`` ports inside the API server's NodePort
    range (30000-32767 by default) no other Service takes."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of every broker's external Service (a cloud's load-balancer
    settings: internal or external, its class, its addresses)."""
    tls: ExternalListenerTls | None = None
    """A certificate of its own for this listener (needs ``tls.enabled``); unset: the
    data port's certificate (``tls.secretName``), when TLS is on."""

    @model_validator(mode="after")
    def _node_port_base_with_node_port(self) -> ExternalListener:
        if (self.type == ExternalListenerType.NODE_PORT) != (self.node_port_base is not None):
            raise ValueError(
                "nodePortBase is required with type NodePort and refused with LoadBalancer"
            )
        return self


class Listeners(Model):
    """Where clients reach the brokers."""

    external: ExternalListener | None = None
    """A listener for clients outside the cluster; unset: none (clients in the cluster
    use the internal listener, the data port, as before)."""


class BrokerClusterSpec(Model):
    """The desired cluster."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_node_ports_in_range": CelRule(
            "!has(self.listeners) || !has(self.listeners.external)"
            " || !has(self.listeners.external.nodePortBase)"
            " || self.listeners.external.nodePortBase + self.replicas - 1 <= 32767",
            "listeners.external.nodePortBase + replicas - 1 must be at most 32767",
        ),
        "_external_tls_needs_tls": CelRule(
            "!has(self.listeners) || !has(self.listeners.external)"
            " || !has(self.listeners.external.tls)"
            " || (has(self.tls) && has(self.tls.enabled) && self.tls.enabled)",
            "listeners.external.tls needs tls.enabled",
        ),
    }

    replicas: int = Field(default=3, ge=1, le=256)
    """How many brokers (pods of the StatefulSet); broker ids are 0..replicas-1."""
    image: str | None = Field(default=None, min_length=1, max_length=1024)
    """Broker container image; the operator's own image when unset."""
    storage: Storage = Field(default_factory=Storage, json_schema_extra=validations(*STORAGE_RULES))
    """Each broker's volume."""
    object_store: ObjectStore | None = None
    """Where partitions are tiered; without one, tiered storage and Unload are unavailable."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each broker container."""
    broker_config: BrokerConfig = Field(default_factory=BrokerConfig)
    """Settings of every broker."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """Node selection for broker pods."""
    auth: ClusterAuth = Field(default_factory=ClusterAuth)
    """Client authentication and ACLs from ``User`` objects."""
    tls: ClusterTls = Field(default_factory=ClusterTls)
    """TLS of the data and admin ports, from a Secret (cert-manager's shape)."""
    kafka: KafkaListener | None = None
    """Serve Kafka's protocol on every broker too; unset: no Kafka listener."""
    listeners: Listeners = Field(default_factory=Listeners)
    """The data listeners besides the internal one (the data port, which brokers
    replicate through and which they advertise as their stable name or pod IP)."""

    @model_validator(mode="after")
    def _node_ports_in_range(self) -> BrokerClusterSpec:
        base = None if self.listeners.external is None else self.listeners.external.node_port_base
        if base is not None and base + self.replicas - 1 > 32767:
            raise ValueError("listeners.external.nodePortBase + replicas - 1 must be at most 32767")
        return self

    @model_validator(mode="after")
    def _external_tls_needs_tls(self) -> BrokerClusterSpec:
        external = self.listeners.external
        if external is not None and external.tls is not None and not self.tls.enabled:
            raise ValueError("listeners.external.tls needs tls.enabled")
        return self


class ListenerStatus(Model):
    """A broker's named data listener (besides ``host``/``port``, the internal one)."""

    name: str = Field(min_length=1, max_length=63)
    """The listener's name, the same on every broker (``external``)."""
    host: str | None = Field(default=None, min_length=1, max_length=253)
    """The host it advertises; unset while its address is pending (a load balancer that
    has none yet: clients of the listener are not told of the broker)."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """The port it advertises; unset while its address is pending."""


class BrokerStatus(Model):
    """One broker as the controller last saw it."""

    id: int = Field(ge=0)
    """Broker id (the StatefulSet ordinal)."""
    address: str
    """``host:port`` clients connect to (the host alone while the port is not known)."""
    live: bool
    """Whether its last heartbeat is within the liveness TTL."""
    draining: bool = False
    """Whether it is handing its partitions away before shutting down."""
    host: str | None = Field(default=None, min_length=1, max_length=253)
    """The host it advertises (the controller's record of it, with the ports below)."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """Its client (and replication) port; unset while the controller was not told it."""
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    """Its admin HTTP port (heartbeats, topology pushes); unset while not told."""
    kafka_host: str | None = Field(default=None, min_length=1, max_length=253)
    """The host its Kafka listener advertises; unset: it runs no Kafka listener."""
    kafka_port: int | None = Field(default=None, ge=0, le=65535)
    """The port its Kafka listener advertises; unset: it runs no Kafka listener."""
    listeners: list[ListenerStatus] | None = Field(default=None, json_schema_extra=list_map("name"))
    """Its other data listeners and what each advertises (clients that connect through
    one are told every broker's address on it); unset: none."""


class DeletedTopic(Model):
    """A topic deleted with ``deletionPolicy: Delete`` whose objects in the object store a
    broker is removing."""

    topic: str = Field(min_length=1)
    """The deleted topic (``namespace/name``)."""
    creation_id: str = Field(min_length=1)
    """Its incarnation: its objects are under ``<cluster>/<namespace>/<name>/<creation id>/``."""
    partitions: int = Field(ge=1)
    """The partitions it had, retired ones included."""
    deleted_generation: int = Field(ge=0)
    """The topology generation that deleted it: its objects are removed once every live
    broker has applied it."""
    broker: int | None = Field(default=None, ge=0)
    """The broker removing its objects; unset while none is asked (none live with an
    object store)."""


class BrokerClusterStatus(Status):
    """What the operator observed and decided."""

    brokers: list[BrokerStatus] = Field(default_factory=list, json_schema_extra=list_map("id"))
    """Every broker the controller has heard from, with what it advertised; ``live`` and
    ``draining`` as of the controller's latest step."""
    topology_generation: int | None = Field(default=None, ge=0)
    """Bumped on every committed metadata change; clients acknowledge it."""
    adoption_floor: int | None = Field(default=None, ge=0)
    """The lowest topology generation acknowledged by any live broker's clients."""
    topics: list[str] | None = None
    """The Topics (``namespace/name``) whose status ``topologyGeneration`` covers, written
    after their statuses: the commit record a restarted controller checks them against."""
    retained_topics: list[str] | None = None
    """Topics (``namespace/name``) whose copies this cluster's brokers keep aside
    (``retained/`` in their data directories) although no deletion of them is being
    requested: a restarted controller found them committed but could not read their
    placement (their Topic names another cluster, or is gone without its finalizer), or
    a ``deletionPolicy: Retain`` deletion took them out of the topology while a broker
    holding a copy had not moved it aside yet. Listed until a deletion of that name with
    ``deletionPolicy: Delete`` (a Retain deletion's, once every such broker has moved its
    copy aside, unless the controller restarted meanwhile), so that a broker that was
    down moves its copy aside too instead of deleting it."""
    deleted_topics: list[DeletedTopic] | None = Field(
        default=None, json_schema_extra=list_map("creationId")
    )
    """Topics deleted with ``deletionPolicy: Delete`` whose objects are still being removed
    from the object store, until a broker reports them gone (all but what snapshots pin)."""


class BrokerCluster(Resource):
    """A headrace cluster: a StatefulSet of brokers with their Services and disruption budget."""

    KIND: ClassVar[str] = "BrokerCluster"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="brokerclusters",
        singular="brokercluster",
        short_names=("hrbc",),
        columns=(
            PrinterColumn("Replicas", "integer", ".spec.replicas", "Desired brokers"),
            PrinterColumn(
                "Generation", "integer", ".status.topologyGeneration", "Topology generation"
            ),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["BrokerCluster"] = "BrokerCluster"
    metadata: ClusterMeta
    spec: BrokerClusterSpec
    status: BrokerClusterStatus | None = None
