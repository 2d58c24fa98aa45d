"""What every headrace custom resource shares: the base model, object metadata,
conditions, references and the scalar types whose rules Kubernetes enforces too.

Pure data, no I/O. The models of this package are the one source of truth for
the wire shape of each kind: :mod:`headrace.resources.crdgen` derives the CRDs
from their JSON schema and :mod:`headrace.resources.loading` validates manifests
against them, so a manifest the CLI accepts is one the API server accepts.

On the wire fields are camelCase (``minInSync``); in Python snake_case
(``min_in_sync``). Specs are strict (unknown fields are errors) because a typo
in a spec silently falling back to a default is the worst kind of bug a
declarative API can have.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Final, Literal, NamedTuple, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

GROUP: Final = "headrace.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "headrace.dev/v1alpha1"
DEFAULT_NAMESPACE: Final = "default"
#: the largest partition count a topic may have (the broker enforces the same bound)
MAX_PARTITIONS: Final = 4096


@dataclass(frozen=True, slots=True)
class CelRule:
    """One ``x-kubernetes-validations`` rule of a CRD: a check the API server makes."""

    #: the CEL expression; ``self`` is the object the rule sits on
    rule: str
    #: what the API server answers when the rule is false
    message: str
    #: the field the refusal names, relative to ``self`` (``.minInSync``)
    field_path: str | None = None

    def schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out


def validations(*rules: CelRule) -> dict[str, Any]:
    """Schema extras that make the API server check ``rules``."""
    return {"x-kubernetes-validations": [rule.schema() for rule in rules]}


def _cel_twins(schema: dict[str, Any], cls: type[Any]) -> None:
    """Put a model's ``CEL_TWINS`` into its JSON schema, so into the CRD."""
    twins: Mapping[str, CelRule] = getattr(cls, "CEL_TWINS", {})
    if twins:
        rules = schema.setdefault("x-kubernetes-validations", [])
        rules.extend(rule.schema() for rule in twins.values())


class Model(BaseModel):
    """Base of every model here: camelCase on the wire, strict about unknown fields.

    Field docstrings become the schema descriptions (``kubectl explain``) and the
    reference in ``docs/crd-reference.md``.

    A validator that compares fields (a ``model_validator``, or a ``field_validator``
    that reads another field) has a *CEL twin*: the same rule in CEL, listed in the
    model's ``CEL_TWINS`` under the validator's name, which the CRD carries. So the API
    server refuses what the model refuses, and the operator never meets a stored spec
    it cannot parse; a unit test checks that every such validator has its twin.
    """

    #: the CEL rule of each of this model's comparing validators, by validator name
    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {}

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_extra=_cel_twins,
    )


# --- names ---

_LABEL_1123: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_1123: Final = rf"{_LABEL_1123}(\.{_LABEL_1123})*"
_LABEL_1035: Final = r"[a-z]([-a-z0-9]*[a-z0-9])?"


@dataclass(frozen=True, slots=True)
class NameRule:
    """One kind of Kubernetes name: its syntax, its length bound and why."""

    #: what the name must be, as said in an error message
    what: str
    #: anchored regular expression (RE2 and Python agree on it)
    pattern: str
    max_length: int

    def check(self, value: str) -> str:
        if len(value) > self.max_length or not re.fullmatch(self.pattern[1:-1], value):
            raise PydanticCustomError(
                "invalid_name",
                "'{value}' is not a valid name: it must be {what} of at most {max} characters",
                {"value": value, "what": self.what, "max": self.max_length},
            )
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "maxLength": self.max_length, "pattern": self.pattern}


_SUBDOMAIN_WHAT: Final = (
    "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
    "starting and ending with a letter or digit)"
)
_LABEL_WHAT: Final = "a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)"

#: Secrets and StorageClasses: Kubernetes' own rule for most object names.
SUBDOMAIN: Final = NameRule(_SUBDOMAIN_WHAT, f"^{_SUBDOMAIN_1123}$", 253)
#: Topics, Repartitions, Unloads: the name is also a broker topic name and a label
#: value, both at most 63 characters.
RESOURCE_NAME: Final = NameRule(_SUBDOMAIN_WHAT, f"^{_SUBDOMAIN_1123}$", 63)
#: Namespaces.
NAMESPACE: Final = NameRule(_LABEL_WHAT, f"^{_LABEL_1123}$", 63)
#: BrokerClusters name a StatefulSet and its Services. Service names are DNS-1035
#: labels, and the StatefulSet's pods carry a ``controller-revision-hash`` label of
#: ``<name>-<10 characters>`` that must fit in 63.
CLUSTER_NAME: Final = NameRule(
    "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter "
    "and ending with a letter or digit)",
    f"^{_LABEL_1035}$",
    52,
)
#: Compactions and CompactionSchedules name Jobs and CronJobs; a CronJob's name is at
#: most 52 characters because its controller appends 11 to name the Jobs it creates.
JOB_NAME: Final = NameRule(_LABEL_WHAT, f"^{_LABEL_1123}$", 52)

SubdomainName = Annotated[str, AfterValidator(SUBDOMAIN.check), WithJsonSchema(SUBDOMAIN.schema())]
ResourceName = Annotated[
    str, AfterValidator(RESOURCE_NAME.check), WithJsonSchema(RESOURCE_NAME.schema())
]
NamespaceName = Annotated[str, AfterValidator(NAMESPACE.check), WithJsonSchema(NAMESPACE.schema())]
ClusterName = Annotated[
    str, AfterValidator(CLUSTER_NAME.check), WithJsonSchema(CLUSTER_NAME.schema())
]
JobName = Annotated[str, AfterValidator(JOB_NAME.check), WithJsonSchema(JOB_NAME.schema())]


class ObjectMeta(Model):
    """The part of Kubernetes' ObjectMeta that headrace reads.

    Server-populated fields the operator needs (generation, uid, ...) are typed;
    any other metadata (managedFields, ownerReferences, ...) is ignored rather than
    rejected, so an object read back from the API server parses.
    """

    model_config = ConfigDict(extra="ignore")

    #: which names a kind accepts; subclasses narrow it
    name_rule: ClassVar[NameRule] = RESOURCE_NAME

    name: ResourceName
    namespace: NamespaceName = DEFAULT_NAMESPACE
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    #: set by the API server; bumped on every spec change
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = None
    creation_timestamp: AwareDatetime | None = None


class ClusterMeta(ObjectMeta):
    name_rule: ClassVar[NameRule] = CLUSTER_NAME
    name: ClusterName


class JobMeta(ObjectMeta):
    name_rule: ClassVar[NameRule] = JOB_NAME
    name: JobName


# --- references ---


class ClusterReference(Model):
    """A BrokerCluster in the same namespace."""

    name: ClusterName
    """Name of the BrokerCluster."""


class TopicReference(Model):
    """A Topic in the same namespace."""

    name: ResourceName
    """Name of the Topic."""


class SecretReference(Model):
    """A Secret in the same namespace."""

    name: SubdomainName
    """Name of the Secret."""


# --- scalars ---

#: number (group 1) and suffix (group 3); no named groups, so RE2 reads it the same
_QUANTITY: Final = re.compile(
    r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity (``"10Gi"``, ``"500m"``, ``"1e3"``).

    Negative quantities are not accepted: no headrace setting has a use for one.
    """
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity")
    number = Decimal(match[1])
    suffix = match[3] or ""
    if suffix in _BINARY:
        return number * Decimal(1024) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def _quantity_text(value: object) -> object:
    # YAML ``cpu: 2`` arrives as an int; Kubernetes accepts both forms
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


#: the longest quantity accepted: a bound, so that the API server can bound the cost of
#: the CEL rules that compare quantities
MAX_QUANTITY_LENGTH: Final = 64


def _check_quantity(value: str) -> str:
    if len(value) > MAX_QUANTITY_LENGTH or not _QUANTITY.match(value):
        raise PydanticCustomError(
            "invalid_quantity",
            "'{value}' is not a Kubernetes quantity (such as 500m, 2, 10Gi or 1e9)"
            " of at most {max} characters",
            {"value": value, "max": MAX_QUANTITY_LENGTH},
        )
    return value


def _check_positive_quantity(value: str) -> str:
    if parse_quantity(value) <= 0:
        raise PydanticCustomError("quantity_not_positive", "must be greater than zero", {})
    return value


_QUANTITY_SCHEMA: Final[dict[str, Any]] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": _QUANTITY.pattern,
    "maxLength": MAX_QUANTITY_LENGTH,
    "x-kubernetes-int-or-string": True,
}

#: A Kubernetes quantity: an integer or a string like ``10Gi``; always a string in Python.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    AfterValidator(_check_quantity),
    WithJsonSchema(_QUANTITY_SCHEMA),
]
PositiveQuantity = Annotated[Quantity, AfterValidator(_check_positive_quantity)]


def _check_unique(values: list[int]) -> list[int]:
    seen: set[int] = set()
    for value in values:
        if value in seen:
            raise PydanticCustomError(
                "duplicate_partition", "partition {value} is listed twice", {"value": value}
            )
        seen.add(value)
    return values


#: A set of partition indexes; empty means every partition of the topic.
PartitionSet = Annotated[
    list[Annotated[int, Field(ge=0, le=MAX_PARTITIONS - 1)]],
    AfterValidator(_check_unique),
    Field(max_length=MAX_PARTITIONS, json_schema_extra={"x-kubernetes-list-type": "set"}),
]


def list_map(*keys: str) -> dict[str, Any]:
    """Schema extras for a list keyed by ``keys`` (server-side apply merges by key)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


#: Schema extras of a one-shot operation's spec: it cannot change once created.
IMMUTABLE_SPEC: Final[dict[str, Any]] = {
    "x-kubernetes-validations": [
        {
            "rule": "self == oldSelf",
            "message": "spec is immutable: delete and recreate to run a different operation",
        }
    ]
}


def immutable(message: str) -> dict[str, Any]:
    """Schema extras of one field the API server refuses to change once it is set: a CEL
    transition rule (checked on updates only), refused with ``message``."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


# --- conditions and status ---


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


#: The condition every kind reports: True when the resource is in its desired state.
READY: Final = "Ready"


class Condition(Model):
    """One aspect of a resource's state, in the shape of Kubernetes' metav1.Condition."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    """Condition type in CamelCase; every kind reports ``Ready``."""
    status: ConditionStatus
    """``True``, ``False`` or ``Unknown``."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The ``metadata.generation`` this condition was computed from."""
    last_transition_time: AwareDatetime
    """When ``status`` last changed."""
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    """Why, as one CamelCase word (for a one-shot operation: its phase)."""
    message: str = Field(default="", max_length=32768)
    """Why, for humans."""


class Status(Model):
    """Fields every kind's status has. The operator writes status; users never do."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The ``metadata.generation`` the operator last acted on."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Conditions, at most one per type; ``Ready`` is always among them once reconciled."""

    def condition(self, type_: str = READY) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


# --- resources ---


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """An ``additionalPrinterColumns`` entry: what ``kubectl get`` shows."""

    name: str
    type: Literal["integer", "number", "string", "boolean", "date"]
    json_path: str
    description: str


#: ``kubectl get`` columns every kind ends with.
READY_COLUMNS: Final = (
    PrinterColumn(
        "Ready",
        "string",
        '.status.conditions[?(@.type=="Ready")].status',
        "Whether the resource is in its desired state",
    ),
    PrinterColumn(
        "Reason",
        "string",
        '.status.conditions[?(@.type=="Ready")].reason',
        "Why it is or is not ready",
    ),
    PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
)


@dataclass(frozen=True, slots=True)
class KindNames:
    """How a kind is named to the API server and to ``kubectl``."""

    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    #: ``kubectl get headrace`` lists every kind
    categories: tuple[str, ...] = ("headrace",)


class ResourceKey(NamedTuple):
    """What identifies a resource: enough to delete it."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


class Resource(Model):
    """Base of the six kinds. Subclasses set ``kind``, ``metadata``, ``spec`` and ``status``."""

    KIND: ClassVar[str]
    NAMES: ClassVar[KindNames]

    api_version: Literal["headrace.dev/v1alpha1"] = API_VERSION
    kind: str
    metadata: ObjectMeta

    @property
    def key(self) -> ResourceKey:
        return ResourceKey(self.KIND, self.metadata.namespace, self.metadata.name)

    def to_manifest(self) -> dict[str, Any]:
        """The JSON-ready document, camelCase, without unset optional fields."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_manifest(cls, document: Mapping[str, Any]) -> Self:
        """Validate a decoded manifest the way the API server would.

        Scalars are strict (``partitions: "3"`` is an error, as it is for the API
        server), and only the camelCase names are accepted. ``document`` may be any
        mapping (a kopf ``Body`` too). Raises pydantic's
        ``ValidationError``; :func:`headrace.resources.load_manifests` turns it into
        a :class:`ManifestError`.
        """
        return cls.model_validate_json(
            json_text(document), strict=True, by_alias=True, by_name=False
        )


def _json_scalar(value: object) -> object:
    # YAML turns unquoted timestamps into date/datetime; the API server sees strings
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Mapping):  # read-only views such as kopf's Body and Spec
        return dict(value)
    raise TypeError(f"{type(value).__name__} values are not allowed in a manifest")


def json_text(document: object) -> str:
    """``document`` as JSON, the form the API server validates.

    Validating the JSON text (not the Python objects) in strict mode gives the API
    server's rules: enum values and timestamps are strings, ``"3"`` is not an integer.
    """
    try:
        return json.dumps(document, default=_json_scalar, allow_nan=False)
    except ValueError:
        raise ValueError("NaN and infinite numbers are not allowed in a manifest") from None
