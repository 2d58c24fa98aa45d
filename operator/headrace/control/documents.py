"""The controller's documents: Kubernetes-shaped resources to and from the core's types (pure).

Both controllers persist the same documents: the local controller as files
(``headrace.controller.store``), the kopf operator as custom resource status.
This module maps between those documents and the control core's types, with
no I/O: a resource's spec to a ``TopicSpec`` or an ``UnloadRequest``, the
core's status to status documents and Ready conditions, and the persisted
documents back to a ``ClusterState`` (``restore``).

A Topic's status document is the CR status Kubernetes would keep whole:
every field is declared in the Topic CRD (structural pruning drops any
other), it has no ``name`` (the object's own name says it, and a copy could
only disagree) and no nulls (the API server drops a null it is not told to
keep; an absent field reads back as None). ``observedGeneration``, in the
status and in its Ready condition, is the Topic's ``metadata.generation``
that a reconcile step ran with, never the topology generation. Specs are
read through the resource models (``headrace.resources``), so what a spec
leaves unset takes the CRD's default.

Crash safety
------------
The controller's state is spread over one status document per Topic and one
cluster document, and no store writes them atomically together (Kubernetes
patches one object at a time). So every Topic status carries the topology
generation it was written for (``topologyGeneration``), the Topic statuses
are written first and the cluster document last, as the commit record: its
``topologyGeneration`` and ``topics`` (the names it covers). The cluster
document is the BrokerCluster status, whole (``cluster_status``): the same
document the local controller keeps as ``cluster.json`` and the operator as
the BrokerCluster's status; its brokers' ``live``/``draining`` are
observations, refreshed between commits without touching the record. ``restore`` finds a
write that stopped part-way (a status stamped above the cluster document, or
a committed topic whose status is gone, or one the record does not cover)
and says so (``Restored.torn``): the state it returns may then hold content
that no generation was ever pushed with, so the loop must commit it under a
generation above every one persisted (``Restored.highest`` + 1) before it
pushes anything. Brokers fence topology by generation and ignore a push
that does not raise it, so reusing a generation would leave them on the old
content for good.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeVar

import pydantic

from headrace.control.liveness import Liveness
from headrace.control.model import (
    TOPIC_STATUS_JSON,
    ClusterState,
    DeletedIncarnation,
    FinalizedBy,
    MovePhase,
    MoveProgress,
    RecoverySource,
    RepartitionPhase,
    RepartitionProgress,
    RepartitionRequest,
    RestoreStage,
    TopicSpec,
    TopicStatus,
    UnloadPhase,
    UnloadProgress,
    UnloadRequest,
)
from headrace.errors import InvalidRequest, InvalidTopicSpec
from headrace.protocol.endpoints import UNKNOWN_PORT, BrokerEndpoint, KafkaAddress, ListenerAddress
from headrace.resources import clusters as cluster_models
from headrace.resources import topics as topic_models

API_VERSION: Final = "headrace.dev/v1alpha1"
#: on a Topic created from a snapshot: ``pending`` while the restore is written under
#: its creation id (not placed), ``written`` once it is (placed at incarnation 1)
RESTORE_ANNOTATION: Final = "headrace.dev/restore"
_M = TypeVar("_M", bound=pydantic.BaseModel)
#: on a Topic created from a snapshot: the key of that snapshot's document, so a restore
#: of another snapshot into it while it is pending is refused (``jobs.snapshot``)
RESTORE_SNAPSHOT_ANNOTATION: Final = "headrace.dev/restore-snapshot"
#: on a Topic created by a TopicRestore: that TopicRestore's name
TOPIC_RESTORE_LABEL: Final = "headrace.dev/topic-restore"
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS: Final = dt.timedelta(milliseconds=1)


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as RFC 3339 UTC, to the millisecond."""
    text = (_EPOCH + ms * _MS).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def epoch_ms(text: str) -> int:
    """The inverse of ``rfc3339`` (any RFC 3339 time with an offset)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidRequest(f"{text!r} is not an RFC 3339 time") from exc
    if when.tzinfo is None:
        raise InvalidRequest(f"{text!r} has no UTC offset")
    return (when - _EPOCH) // _MS


def full_name(resource: Mapping[str, Any]) -> str:
    """'<namespace>/<name>' of a resource document."""
    meta = resource["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def restored_topic(
    namespace: str,
    name: str,
    source_spec: Mapping[str, Any],
    partitions: int,
    stage: RestoreStage,
    snapshot_key: str,
    restore: str | None = None,
) -> dict[str, Any]:
    """The Topic a restore creates: the source Topic's spec with the snapshot's partition
    count, annotated with the restore's ``stage`` (held unplaced while ``pending``) and
    the snapshot it restores, labelled with the TopicRestore's name (``restore``) if one
    asked for it."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "annotations": {RESTORE_ANNOTATION: str(stage), RESTORE_SNAPSHOT_ANNOTATION: snapshot_key},
    }
    if restore is not None:
        metadata["labels"] = {TOPIC_RESTORE_LABEL: restore}
    return {
        "apiVersion": API_VERSION,
        "kind": "Topic",
        "metadata": metadata,
        "spec": {**source_spec, "partitions": partitions},
    }


def restore_held_for(annotations: Mapping[str, str]) -> str | None:
    """The key of the snapshot a Topic (its ``annotations``) still pending for its restore
    is held for; None if it is not pending, or was applied pending without one (by hand,
    or before Topics recorded it)."""
    if annotations.get(RESTORE_ANNOTATION) != str(RestoreStage.PENDING):
        return None
    held = annotations.get(RESTORE_SNAPSHOT_ANNOTATION)
    return str(held) if held else None


def spec_of(resource: Mapping[str, Any]) -> TopicSpec:
    """The core's view of a Topic document; what the spec leaves unset takes the model's default."""
    try:
        spec = topic_models.TopicSpec.model_validate(resource.get("spec"))
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidTopicSpec(f"topic {full_name(resource)}: {problems}") from None
    meta = resource.get("metadata", {})
    stage = str((meta.get("annotations") or {}).get(RESTORE_ANNOTATION) or "")
    try:
        restore = RestoreStage(stage)
    except ValueError:
        allowed = ", ".join(repr(s.value) for s in RestoreStage if s.value)
        raise InvalidTopicSpec(
            f"topic {full_name(resource)}: annotation {RESTORE_ANNOTATION} is {stage!r},"
            f" not one of {allowed}"
        ) from None
    return TopicSpec(
        full_name(resource),
        spec.partitions,
        spec.replicas,
        spec.min_in_sync,
        spec.tiered_storage.enabled,
        str(meta.get("uid") or ""),
        restore,
    )


def holding_spec(name: str, status: TopicStatus) -> TopicSpec:
    """A spec that keeps the placed topic ``name`` as it is, for a Topic whose spec does not
    parse (and did not earlier in this process): its status's partition and replica counts,
    the model's default ``minInSync`` for them, and tiering off (the status does not say
    whether the topic is tiered, and an Unload of an untiered one would lose its records).
    """
    replicas = status.partitions[0].replication_factor if status.partitions else 1
    defaults = topic_models.TopicSpec.model_validate(
        {"clusterRef": {"name": "unread"}, "partitions": 1, "replicas": replicas}
    )
    # The count last asked for, so that holding the topic is never read as an edit of it.
    partitions = status.spec_partitions or status.routing_partitions
    return TopicSpec(name, partitions, replicas, defaults.min_in_sync, tiered=False)


def generation_of(resource: Mapping[str, Any]) -> int:
    """``metadata.generation`` (1 for a document written before the store kept it)."""
    return int(resource.get("metadata", {}).get("generation") or 1)


def topic_config(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The topology document's per-topic ``config``: the Topic spec's settings that are set.

    Keys are the broker's (``retention_ms``, ``segment_bytes``, ``tiered``, ...); a
    setting left unset is left out, so the broker's own default applies. Each section of
    the spec is read through its model on its own: of a spec that does not parse, what
    still reads is kept and a section the model refuses is left out (the broker's default),
    so that a value of the wrong type is never handed to the brokers.
    """
    spec = resource.get("spec")
    sections = spec if isinstance(spec, Mapping) else {}
    retention = _section(topic_models.Retention, sections.get("retention"))
    segments = _section(topic_models.Segments, sections.get("segments"))
    tiered = _section(topic_models.TieredStorage, sections.get("tieredStorage"))
    try:
        batch = _MAX_BATCH_BYTES.validate_python(sections.get("maxBatchBytes"))
    except pydantic.ValidationError:
        batch = None
    values: dict[str, Any] = {}
    if retention is not None:
        values.update(retention_ms=retention.ms, retention_bytes=retention.bytes)
    if segments is not None:
        values.update(segment_bytes=segments.bytes, segment_ms=segments.ms)
    values.update(max_batch_bytes=batch)
    if tiered is not None:
        # the model's defaults are not settings: only what the spec sets is sent
        given = tiered.model_fields_set
        values.update(
            tiered=tiered.enabled if "enabled" in given else None,
            upload_interval_ms=tiered.upload_interval_seconds * 1000
            if "upload_interval_seconds" in given
            else None,
            local_retention_ms=tiered.local_retention_ms,
            local_retention_bytes=tiered.local_retention_bytes,
        )
    return {k: v for k, v in values.items() if v is not None}


_MAX_BATCH_FIELD: Final = topic_models.TopicSpec.model_fields["max_batch_bytes"]
#: ``TopicSpec.maxBatchBytes`` read on its own, with the model's own constraints
_MAX_BATCH_BYTES: Final[pydantic.TypeAdapter[int | None]] = pydantic.TypeAdapter(
    Annotated[_MAX_BATCH_FIELD.annotation, *_MAX_BATCH_FIELD.metadata]  # type: ignore[arg-type]
)


def _section(model: type[_M], document: object) -> _M | None:
    """``document`` read as ``model`` (None: absent, or refused by the model)."""
    if document is None:
        return None
    try:
        return model.model_validate(document)
    except pydantic.ValidationError:
        return None


def unload_request(resource: Mapping[str, Any]) -> UnloadRequest:
    """The core's view of an Unload document (``deletionTimestamp`` cancels what has not begun)."""
    meta = resource["metadata"]
    spec = resource["spec"]
    namespace = meta.get("namespace", "default")
    target = spec.get("targetBroker")
    return UnloadRequest(
        full_name(resource),
        f"{namespace}/{spec['topicRef']['name']}",
        tuple(int(p) for p in spec.get("partitions") or ()),
        None if target is None else int(target),
        cancelled=meta.get("deletionTimestamp") is not None,
    )


def _optional_time(ms: int | None) -> str | None:
    return None if ms is None else rfc3339(ms)


def _move_status(move: MoveProgress) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "partition": move.partition,
        "fromBroker": move.from_broker,
        "toBroker": move.to_broker,
        "sealedOffset": move.sealed_offset,
        "phase": move.phase.value,
        "moves": move.moves,
        "recoveryDeadline": _optional_time(move.deadline_ms),
        "message": move.message or None,
    }
    if move.verified is not None:
        doc["verification"] = {
            "result": "Passed" if move.verified else "Failed",
            "checkedAt": _optional_time(move.checked_ms),
            "message": move.verification_message,
        }
    if move.recovery_source is not None:
        doc["recovery"] = {
            "source": move.recovery_source.value,
            "message": move.recovery_message,
        }
    return _without_none(doc)


def _without_none(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v for k, v in doc.items() if v is not None
    }


def _move_of(doc: Mapping[str, Any]) -> MoveProgress:
    verification = doc.get("verification") or {}
    recovery = doc.get("recovery") or {}
    checked = verification.get("checkedAt")
    deadline = doc.get("recoveryDeadline")
    return MoveProgress(
        partition=int(doc["partition"]),
        phase=MovePhase(doc.get("phase", "Pending")),
        from_broker=doc.get("fromBroker"),
        to_broker=doc.get("toBroker"),
        sealed_offset=doc.get("sealedOffset"),
        moves=doc.get("moves"),
        verified=None if not verification else verification["result"] == "Passed",
        verification_message=str(verification.get("message", "")),
        checked_ms=None if checked is None else epoch_ms(checked),
        recovery_source=None if not recovery else RecoverySource(recovery["source"]),
        recovery_message=str(recovery.get("message", "")),
        deadline_ms=None if deadline is None else epoch_ms(deadline),
        message=str(doc.get("message") or ""),
    )


def _phase_ready(
    done: bool,
    phase: str,
    message: str,
    observed_generation: int,
    previous_ready: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """A one-shot resource's Ready condition: True once its last phase is reached, the
    phase as reason; ``lastTransitionTime`` moves only when the status value changes."""
    value = "True" if done else "False"
    changed = previous_ready is None or previous_ready.get("status") != value
    return {
        "type": "Ready",
        "status": value,
        "observedGeneration": observed_generation,
        "reason": phase,
        "message": message,
        "lastTransitionTime": now
        if changed or previous_ready is None
        else previous_ready.get("lastTransitionTime", now),
    }


def unload_status(
    progress: UnloadProgress,
    observed_generation: int,
    previous_ready: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The Unload's status document (UnloadStatus shape) for the core's progress.

    Its Ready condition is True once Completed; its reason is the phase and its
    message the progress message (which is how the message survives a restart).
    """
    ready = _phase_ready(
        progress.phase is UnloadPhase.COMPLETED,
        progress.phase.value,
        progress.message,
        observed_generation,
        previous_ready,
        now,
    )
    status = {
        "observedGeneration": observed_generation,
        "conditions": [ready],
        "phase": progress.phase.value,
        "moves": [_move_status(m) for m in progress.moves],
        "startedAt": _optional_time(progress.started_ms),
        "completedAt": _optional_time(progress.completed_ms),
    }
    return {k: v for k, v in status.items() if v is not None}


def progress_of(name: str, status: Mapping[str, Any]) -> UnloadProgress:
    """The core's progress from an Unload's status document (the inverse of ``unload_status``)."""
    ready = next(
        (
            c
            for c in status.get("conditions", [])
            if isinstance(c, dict) and c.get("type") == "Ready"
        ),
        {},
    )
    started = status.get("startedAt")
    completed = status.get("completedAt")
    try:
        return UnloadProgress(
            name,
            UnloadPhase(status.get("phase", "Pending")),
            tuple(_move_of(m) for m in status.get("moves", [])),
            None if started is None else epoch_ms(started),
            None if completed is None else epoch_ms(completed),
            str(ready.get("message", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"unload {name}: unreadable status: {exc}") from exc


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """A metav1.Condition whose ``lastTransitionTime`` moves only when ``status`` does
    (a no-op reconcile then writes the same document, which the status store skips).
    The message is cut to 4096 characters: a Job's or a store's error can be long."""
    moved = previous is None or previous.get("status") != status
    return {
        "type": type_,
        "status": status,
        "observedGeneration": generation,
        "reason": reason,
        "message": message[:4096],
        "lastTransitionTime": now
        if moved or previous is None
        else previous.get("lastTransitionTime", now),
    }


def ready_condition(
    status: TopicStatus | None,
    problem: tuple[str, str] | None,
    previous: dict[str, Any] | None,
    now: str,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """The Ready condition in metav1.Condition shape (what GitOps tools read)."""
    if status is None:
        value, reason, message = (
            "False",
            problem[0] if problem else "Pending",
            (problem[1] if problem else "waiting for placement"),
        )
    elif problem is not None:
        value, reason, message = "False", problem[0], problem[1]
    elif any(str(p.state) != "Online" for p in status.partitions):
        value, reason, message = (
            "False",
            "PartitionsNotOnline",
            "some partitions are electing or offline",
        )
    else:
        value, reason, message = "True", "Online", f"{len(status.partitions)} partitions online"
    changed = previous is None or previous.get("status") != value
    return _without_none(
        {
            "type": "Ready",
            "status": value,
            "observedGeneration": observed_generation,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now
            if changed or previous is None
            else previous.get("lastTransitionTime", now),
        }
    )


def condition_time(ms: int) -> str:
    """A condition's ``lastTransitionTime``: RFC 3339 UTC to the second."""
    return rfc3339(ms - ms % 1000).replace(".000Z", "Z")


def topic_status(
    state: ClusterState,
    name: str,
    problem: tuple[str, str] | None,
    previous_ready: dict[str, Any] | None,
    now: str,
    observed_generation: int,
) -> dict[str, Any]:
    """A Topic's status document: the core's ``TopicStatus``, its Ready condition, and the stamp.

    ``observed_generation`` is the Topic's ``metadata.generation`` the reconcile
    step ran with. ``topologyGeneration`` is the topology generation the
    document was written for (see the module's crash-safety notes). The
    inverse is ``status_of``.
    """
    status = state.topics.get(name)
    ready = ready_condition(status, problem, previous_ready, now, observed_generation)
    return {
        **(_core_status(status) if status is not None else {}),
        "observedGeneration": observed_generation,
        "topologyGeneration": state.generation,
        "conditions": [ready],
    }


def _core_status(status: TopicStatus) -> dict[str, Any]:
    """The core's ``TopicStatus`` JSON without its ``name`` and without nulls."""
    doc = TOPIC_STATUS_JSON.dump(status)
    del doc["name"]
    doc["partitions"] = [_without_none(p) for p in doc["partitions"]]
    # for people (``kubectl get topics``): after a Repartition the spec may lag the count;
    # retired partitions (after a shrink) are not routed to, so not counted
    doc["partitionCount"] = status.active_partitions or len(status.partitions)
    return _without_none(doc)


def status_of(name: str, status: Mapping[str, Any]) -> TopicStatus:
    """The core's ``TopicStatus`` of the Topic ``name`` from the status of its document."""
    return TOPIC_STATUS_JSON.load({**status, "name": name})


def cluster_status(
    state: ClusterState, liveness: Liveness | None = None, set_aside: Collection[str] = ()
) -> dict[str, Any]:
    """The cluster document, written last: the commit record of ``state.generation``.

    It is the BrokerCluster status (``headrace.resources.clusters.BrokerClusterStatus``),
    built through that model so that it is one the CRD accepts: ``topologyGeneration``,
    the committed ``topics``, and per broker what it advertised (``host``, ``port``,
    ``adminPort``, ``kafkaHost``/``kafkaPort`` with a Kafka listener, ``listeners`` with
    named listeners; a port nobody
    told the controller is left out) with ``address`` for
    people and ``live``/``draining`` from ``liveness`` (none live when not given);
    ``retainedTopics``: the topics set aside (``Restored.set_aside``), if any;
    ``deletedTopics``: the deleted incarnations whose objects are being removed, if any. No
    ``conditions``: those belong to whoever reconciles the BrokerCluster's workload.
    """
    live = frozenset() if liveness is None else liveness.live
    draining = frozenset() if liveness is None else liveness.draining
    status = cluster_models.BrokerClusterStatus(
        topology_generation=state.generation,
        topics=sorted(state.topics),
        retained_topics=sorted(set_aside) or None,
        deleted_topics=[
            cluster_models.DeletedTopic(
                topic=d.topic,
                creation_id=d.creation_id,
                partitions=d.partitions,
                deleted_generation=d.deleted_generation,
                broker=d.broker,
            )
            for _, d in sorted(state.deleted.items())
        ]
        or None,
        brokers=[
            cluster_models.BrokerStatus(
                id=b.id,
                address=_address(b),
                live=b.id in live,
                draining=b.id in draining,
                host=b.host,
                port=_known(b.port),
                admin_port=_known(b.admin_port),
                kafka_host=None if b.kafka is None else b.kafka.host,
                kafka_port=None if b.kafka is None else b.kafka.port,
                listeners=[
                    cluster_models.ListenerStatus(name=n.name, host=n.host, port=n.port)
                    if n.assigned
                    else cluster_models.ListenerStatus(name=n.name)
                    for n in b.listeners
                ]
                or None,
            )
            for _, b in sorted(state.brokers.items())
        ],
    )
    # The conditions are not the control loop's to write (a status patch would replace them).
    return status.model_dump(mode="json", exclude_none=True, exclude={"conditions"})


def with_liveness(cluster: Mapping[str, Any], liveness: Liveness) -> dict[str, Any]:
    """The cluster document with every broker's ``live``/``draining`` as ``liveness`` says.

    Only those two fields change: the commit record's generation, topics and brokers stay
    what the last commit wrote (see the crash-safety notes).
    """
    brokers = [
        {**b, "live": b["id"] in liveness.live, "draining": b["id"] in liveness.draining}
        for b in cluster.get("brokers", [])
    ]
    return {**cluster, "brokers": brokers}


def _known(port: int) -> int | None:
    return None if port == UNKNOWN_PORT else port


def _address(broker: BrokerEndpoint) -> str:
    if broker.port == UNKNOWN_PORT:
        return broker.host
    host = f"[{broker.host}]" if ":" in broker.host else broker.host
    return f"{host}:{broker.port}"


def _endpoint(broker: cluster_models.BrokerStatus) -> BrokerEndpoint:
    if broker.host is None:
        raise InvalidRequest(f"cluster document: broker {broker.id} has no host")
    kafka = None
    if broker.kafka_host is not None and broker.kafka_port is not None:
        kafka = KafkaAddress(broker.kafka_host, broker.kafka_port)
    return BrokerEndpoint(
        broker.id,
        broker.host,
        UNKNOWN_PORT if broker.port is None else broker.port,
        UNKNOWN_PORT if broker.admin_port is None else broker.admin_port,
        kafka,
        tuple(
            ListenerAddress(n.name, n.host, n.port)
            if n.host is not None and n.port is not None
            else ListenerAddress.pending(n.name)
            for n in broker.listeners or ()
        ),
    )


def _cluster_of(doc: Mapping[str, Any]) -> cluster_models.BrokerClusterStatus:
    try:
        return cluster_models.BrokerClusterStatus.model_validate(doc)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'status'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"cluster document: {problems}") from None


def previous_ready(status: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Ready condition of a status document, if it has one."""
    conditions = (status or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)


@dataclass(frozen=True, slots=True)
class Restored:
    """The persisted state, and whether a write stopped part-way through it."""

    state: ClusterState
    #: some document is newer than the cluster document, or a committed one is missing
    torn: bool
    #: the highest generation any persisted document names
    highest: int
    #: topics whose copies the brokers must keep aside: committed without a status to
    #: restore their placement from (no deletion was requested: that would have taken
    #: them out of the record first), or set aside before (``retainedTopics``)
    set_aside: frozenset[str] = field(default_factory=frozenset)


def restore(
    cluster: Mapping[str, Any] | None, statuses: Mapping[str, Mapping[str, Any]]
) -> Restored:
    """The state from the cluster document and the Topic statuses (by 'namespace/name').

    The cluster document is read through ``BrokerClusterStatus`` (its ``live`` and
    ``draining`` are observations, not state); one it does not validate as raises
    ``InvalidRequest``. A status with no partitions (a topic not placed yet) holds no state. See
    the module's notes for what ``torn`` means and why.
    """
    record = _cluster_of(cluster or {})
    generation = record.topology_generation or 0
    brokers = {b.id: _endpoint(b) for b in record.brokers}
    topics = {
        name: status_of(name, status)
        for name, status in statuses.items()
        if status.get("partitions") is not None
    }
    torn, highest = False, generation
    for name, status in statuses.items():
        stamp = status.get("topologyGeneration")
        if isinstance(stamp, int) and not isinstance(stamp, bool):
            highest = max(highest, stamp)
            torn = torn or stamp > generation
        elif name in topics:
            torn = True  # it holds state, but not which generation it was written for
    committed = record.topics
    # No commit record (none written yet, or a store older than it): trust only an empty state.
    torn = torn or (bool(topics) if committed is None else set(committed) != set(topics))
    unrestorable = set(committed or ()) - set(topics)
    set_aside = frozenset(unrestorable | set(record.retained_topics or ()))
    deleted = {
        d.creation_id: DeletedIncarnation(
            d.topic, d.creation_id, d.partitions, d.deleted_generation, d.broker
        )
        for d in record.deleted_topics or ()
    }
    return Restored(ClusterState(generation, brokers, topics, deleted), torn, highest, set_aside)


# --------------------------------------------------------------------------- repartitions


def repartition_request(resource: Mapping[str, Any]) -> RepartitionRequest:
    """The core's view of a Repartition document (``deletionTimestamp``: deleted)."""
    meta = resource["metadata"]
    spec = resource["spec"]
    namespace = meta.get("namespace", "default")
    return RepartitionRequest(
        full_name(resource),
        f"{namespace}/{spec['topicRef']['name']}",
        int(spec["partitions"]),
        int(spec.get("adoptionTimeoutSeconds", 30)) * 1000,
        cancelled=meta.get("deletionTimestamp") is not None,
    )


def repartition_status(
    progress: RepartitionProgress,
    observed_generation: int,
    previous_ready: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The Repartition's status document (RepartitionStatus shape) for the core's progress.

    Ready is True once Finalized; its reason is the phase, its message the progress message.
    """
    ready = _phase_ready(
        progress.phase is RepartitionPhase.FINALIZED,
        progress.phase.value,
        progress.message,
        observed_generation,
        previous_ready,
        now,
    )
    return _without_none(
        {
            "observedGeneration": observed_generation,
            "conditions": [ready],
            "phase": progress.phase.value,
            "fromPartitions": progress.from_partitions,
            "toPartitions": progress.to_partitions,
            "fromVersion": progress.from_version,
            "toVersion": progress.to_version,
            "adoptionGeneration": progress.adoption_generation,
            "cutoverAt": _optional_time(progress.cutover_ms),
            "drainedAt": _optional_time(progress.drained_ms),
            "finalizedAt": _optional_time(progress.finalized_ms),
            "finalizedBy": None if progress.finalized_by is None else progress.finalized_by.value,
        }
    )


def repartition_progress_of(name: str, status: Mapping[str, Any]) -> RepartitionProgress:
    """The inverse of ``repartition_status``."""
    ready = next(
        (
            c
            for c in status.get("conditions", [])
            if isinstance(c, dict) and c.get("type") == "Ready"
        ),
        {},
    )

    def ms(key: str) -> int | None:
        text = status.get(key)
        return None if text is None else epoch_ms(text)

    try:
        by = status.get("finalizedBy")
        return RepartitionProgress(
            name,
            RepartitionPhase(status.get("phase", "Pending")),
            status.get("fromPartitions"),
            status.get("toPartitions"),
            status.get("fromVersion"),
            status.get("toVersion"),
            status.get("adoptionGeneration"),
            ms("cutoverAt"),
            ms("drainedAt"),
            ms("finalizedAt"),
            None if by is None else FinalizedBy(by),
            str(ready.get("message", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"repartition {name}: unreadable status: {exc}") from exc
