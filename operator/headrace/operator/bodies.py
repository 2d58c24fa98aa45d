"""The edge where kopf's bodies become typed values: every body a handler, an index or
the API server hands the operator is parsed here, once, into its resource model and a
small typed metadata value; nothing past this edge walks a body's ``spec`` or
``status`` as a dict.

One function per kind (``parse_cluster``, ``parse_topic``, ...), each giving a
``Parsed``:

* ``meta`` (``Meta``): what the operator reads of ``metadata`` (name, namespace, uid,
  generation, resourceVersion, labels, annotations, deletionTimestamp, finalizers,
  ownerReferences). It always parses: the API server wrote it, and an object must be
  deletable (its finalizers let go) whatever its spec says.
* ``resource``: the pydantic model of the body without its status, validated as the
  API server validates it (``Resource.from_manifest``), or None with ``problem``
  saying why (each field and its rule). A body that does not parse is never a dead
  handler: the caller shows ``problem`` in the object's status (``Ready=False``,
  ``Stalled``) and carries on with what it can do from ``meta``.
* ``status``: the stored status as the kind's status model, or None when there is none
  (``status_problem`` says why one that is there does not parse: the operator then
  leaves it as it is rather than write over what it cannot read).

kopf's own ``Body`` (``kopf._cogs.structs.bodies``) gives read-only views of the raw
mapping; this goes one step further and turns them into the models the rest of the
operator is written against.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import pydantic

from headrace.operator.kube import ObjectRef
from headrace.resources import (
    BrokerCluster,
    Compaction,
    CompactionSchedule,
    Repartition,
    Topic,
    TopicRestore,
    TopicSnapshot,
    TopicSnapshotSchedule,
    Unload,
    User,
)
from headrace.resources.loading import ManifestError
from headrace.resources.meta import API_VERSION, DEFAULT_NAMESPACE, Resource, Status

ResourceT = TypeVar("ResourceT", bound=Resource)


class InvalidBody(ManifestError):
    """A stored object whose spec the model refuses (one line: its kind, name and
    problems)."""

    def __init__(self, kind: str, meta: Meta, problem: str) -> None:
        self.kind = kind
        self.meta = meta
        self.problem = problem
        super().__init__([f"invalid {kind} {meta.full_name}: {problem}"])


@dataclass(frozen=True, slots=True)
class OwnerReference:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class Meta:
    """What the operator reads of an object's ``metadata``."""

    name: str
    namespace: str = DEFAULT_NAMESPACE
    uid: str = ""
    #: ``metadata.generation``; 1 for an object the API server has not numbered
    generation: int = 1
    resource_version: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()

    @property
    def full_name(self) -> str:
        """'namespace/name', the name the control loop knows the object by."""
        return f"{self.namespace}/{self.name}"

    @property
    def deleting(self) -> bool:
        return bool(self.deletion_timestamp)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _owner(value: object) -> OwnerReference | None:
    if not isinstance(value, Mapping):
        return None
    return OwnerReference(
        str(value.get("apiVersion") or ""),
        str(value.get("kind") or ""),
        str(value.get("name") or ""),
        str(value.get("uid") or ""),
        bool(value.get("controller")),
    )


def meta_of(body: Mapping[str, Any]) -> Meta:
    """The typed metadata of any object body (never fails: missing fields get the API
    server's defaults)."""
    meta = body.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    version = meta.get("resourceVersion")
    created, deleted = meta.get("creationTimestamp"), meta.get("deletionTimestamp")
    owners = (_owner(o) for o in meta.get("ownerReferences") or ())
    return Meta(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or DEFAULT_NAMESPACE),
        uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 1),
        resource_version=None if version is None else str(version),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        creation_timestamp=None if not created else str(created),
        deletion_timestamp=None if not deleted else str(deleted),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        owner_references=tuple(o for o in owners if o is not None),
    )


@dataclass(frozen=True, slots=True)
class Parsed(Generic[ResourceT]):
    """One body, parsed (see the module)."""

    kind: str
    meta: Meta
    resource: ResourceT | None
    #: why the model refuses the body (each field and its rule); None when it parses
    problem: str | None = None
    #: why the stored status does not parse; None when it does or there is none
    status_problem: str | None = None
    #: the stored status, as the kind's status model (also ``resource.status`` when the
    #: spec parses); None when there is none or it does not parse
    status: Status | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(API_VERSION, self.kind, self.meta.namespace, self.meta.name)

    def model(self) -> ResourceT:
        """The resource; ``InvalidBody`` when its spec does not parse."""
        if self.resource is None:
            raise InvalidBody(self.kind, self.meta, self.problem or "does not parse")
        return self.resource


def problems(exc: pydantic.ValidationError) -> str:
    """Each field the model refuses and its rule, on one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def _parse(cls: type[ResourceT], body: Mapping[str, Any]) -> Parsed[ResourceT]:
    meta = meta_of(body)
    # the status on its own first: an object whose spec the model refuses still has the
    # status the operator wrote, which the one telling it so is built beside
    status, status_problem = None, None
    if body.get("status"):
        status_type: Any = cls.model_fields["status"].annotation
        try:
            status = pydantic.TypeAdapter(status_type).validate_python(
                body["status"], by_alias=True
            )
        except pydantic.ValidationError as exc:
            status_problem = problems(exc)
    try:
        resource = cls.from_manifest({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError as exc:
        return Parsed(cls.KIND, meta, None, problems(exc), status_problem, status)
    except (TypeError, ValueError) as exc:  # a value JSON cannot carry
        return Parsed(cls.KIND, meta, None, str(exc), status_problem, status)
    if status is not None:
        resource = resource.model_copy(update={"status": status})
    return Parsed(cls.KIND, meta, resource, None, status_problem, status)


def parse_cluster(body: Mapping[str, Any]) -> Parsed[BrokerCluster]:
    return _parse(BrokerCluster, body)


def parse_topic(body: Mapping[str, Any]) -> Parsed[Topic]:
    return _parse(Topic, body)


def parse_unload(body: Mapping[str, Any]) -> Parsed[Unload]:
    return _parse(Unload, body)


def parse_repartition(body: Mapping[str, Any]) -> Parsed[Repartition]:
    return _parse(Repartition, body)


def parse_compaction(body: Mapping[str, Any]) -> Parsed[Compaction]:
    return _parse(Compaction, body)


def parse_compaction_schedule(body: Mapping[str, Any]) -> Parsed[CompactionSchedule]:
    return _parse(CompactionSchedule, body)


def parse_user(body: Mapping[str, Any]) -> Parsed[User]:
    return _parse(User, body)


def parse_snapshot(body: Mapping[str, Any]) -> Parsed[TopicSnapshot]:
    return _parse(TopicSnapshot, body)


def parse_snapshot_schedule(body: Mapping[str, Any]) -> Parsed[TopicSnapshotSchedule]:
    return _parse(TopicSnapshotSchedule, body)


def parse_restore(body: Mapping[str, Any]) -> Parsed[TopicRestore]:
    return _parse(TopicRestore, body)


def topic_cluster(body: Mapping[str, Any]) -> str | None:
    """The BrokerCluster a Topic body names in ``spec.clusterRef``, read whether or not its
    spec parses: kopf's index is keyed by it, so a Topic the model refuses still reaches
    its cluster's loop, which tells it why in its status."""
    spec = body.get("spec")
    ref = spec.get("clusterRef") if isinstance(spec, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return None if name is None else str(name)


def stored_status(parsed: Parsed[ResourceT]) -> Status | None:
    """The object's stored status, typed (None: there is none, or it cannot be read)."""
    return parsed.status


def stored_condition(parsed: Parsed[ResourceT], type_: str) -> dict[str, Any] | None:
    """The stored condition ``type_`` as the document a new one is built beside
    (``documents.condition`` keeps its ``lastTransitionTime`` while its status stays)."""
    status = stored_status(parsed)
    found = None if status is None else status.condition(type_)
    return None if found is None else found.model_dump(mode="json", exclude_unset=True)


def unchanged(parsed: Parsed[ResourceT], document: Mapping[str, Any]) -> bool:
    """Whether the status ``document`` says what the object's stored status says (compared
    as typed values: the same times in another spelling are the same)."""
    status = stored_status(parsed)
    if status is None:
        return parsed.status_problem is None and not document
    try:
        written = type(status).model_validate(document)
    except pydantic.ValidationError:
        return False
    return written == status


#: the Ready reason of an object whose spec the model refuses
INVALID_SPEC: Final = "InvalidSpec"


class ParseCache(Generic[ResourceT]):
    """The last parse of each object of one kind, by 'namespace/name': a loop that reads
    the same watched bodies every step parses each once. A body is taken as unchanged
    while it is the very same object (kopf's indices hold a snapshot per event, never
    edited) at the same ``resourceVersion``."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], Parsed[ResourceT]]) -> None:
        self._parse = parse
        self._last: dict[str, tuple[Mapping[str, Any], str | None, Parsed[ResourceT]]] = {}

    def __call__(self, body: Mapping[str, Any]) -> Parsed[ResourceT]:
        meta = meta_of(body)
        known = self._last.get(meta.full_name)
        if known is not None and known[0] is body and known[1] == meta.resource_version:
            return known[2]
        parsed = self._parse(body)
        self._last[meta.full_name] = (body, meta.resource_version, parsed)
        return parsed

    def keep(self, names: Collection[str]) -> None:
        """Forget every object but ``names``."""
        for name in set(self._last) - set(names):
            del self._last[name]
