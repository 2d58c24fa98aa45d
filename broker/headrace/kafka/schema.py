"""Kafka message schemas as dataclasses, and one codec that walks them (pure).

A message is a dataclass whose fields carry their Kafka type and versions in
``dataclasses.field`` metadata (``kfield``), transcribed from Kafka's published
JSON schemas (``clients/src/main/resources/common/message/*.json``). ``encode``
and ``decode`` read that metadata, so every message shares one tested codec, and
a handler sees typed attributes rather than dictionaries.

Rules of the format that the codec applies (KIP-482 for flexible versions):

- a field is on the wire only in its ``versions``; absent fields keep their default;
- in a flexible version, strings, arrays and bytes are compact (an unsigned
  varint of length + 1, 0 = null) and every struct ends with tagged fields:
  a count, then ``tag, size, value`` in increasing tag order. A tagged field is
  written only when it differs from its default; unknown tags are skipped;
- ``nullable`` versions allow None for strings, bytes, arrays and structs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from headrace.kafka.wire import MalformedKafkaRequest, Reader, Writer

#: the last version any schema could name: "3+" means 3 to this
_OPEN: Final = 0x7FFF

VersionRange = tuple[int, int]


def versions(text: str) -> VersionRange:
    """Kafka's version notation: ``"3+"``, ``"0-12"``, ``"5"``, ``"none"``."""
    if text == "none":
        return (1, 0)  # empty
    if text.endswith("+"):
        return (int(text[:-1]), _OPEN)
    lo, _, hi = text.partition("-")
    return (int(lo), int(hi or lo))


def within(version: int, span: VersionRange | None) -> bool:
    return span is not None and span[0] <= version <= span[1]


class Kind:
    """Scalar type names, as Kafka's schemas spell them."""

    INT8: Final = "int8"
    INT16: Final = "int16"
    INT32: Final = "int32"
    INT64: Final = "int64"
    UINT32: Final = "uint32"
    FLOAT64: Final = "float64"
    BOOL: Final = "bool"
    STRING: Final = "string"
    BYTES: Final = "bytes"
    #: a record batch (or several): bytes in the wire's terms, never parsed by this codec
    RECORDS: Final = "records"
    UUID: Final = "uuid"


@dataclass(frozen=True, slots=True)
class Array:
    """``[]type``: an array of a scalar kind or of a struct (a dataclass)."""

    element: str | type[Any]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    kind: str | Array | type[Any]
    versions: VersionRange
    nullable: VersionRange | None = None
    tag: int | None = None
    tagged_versions: VersionRange | None = None


def kfield(
    kind: str | Array | type[Any],
    on: str = "0+",
    *,
    default: Any = dataclasses.MISSING,
    nullable: str | None = None,
    tag: int | None = None,
    tagged: str | None = None,
) -> Any:
    """A dataclass field with its Kafka type; arrays default to [], structs to None."""
    spec = FieldSpec(
        kind,
        versions(on),
        versions(nullable) if nullable else None,
        tag,
        versions(tagged) if tagged else None,
    )
    meta = {"kafka": spec}
    if default is not dataclasses.MISSING:
        return dataclasses.field(default=default, metadata=meta)
    if isinstance(kind, Array):
        return dataclasses.field(default_factory=list, metadata=meta)
    if isinstance(kind, type):
        return dataclasses.field(default=None, metadata=meta)
    return dataclasses.field(default=_SCALAR_DEFAULTS[kind], metadata=meta)


_SCALAR_DEFAULTS: Final[dict[str, Any]] = {
    Kind.INT8: 0,
    Kind.INT16: 0,
    Kind.INT32: 0,
    Kind.INT64: 0,
    Kind.UINT32: 0,
    Kind.FLOAT64: 0.0,
    Kind.BOOL: False,
    Kind.STRING: "",
    Kind.BYTES: b"",
    Kind.RECORDS: None,
    Kind.UUID: bytes(16),
}


_SPECS: dict[type[Any], tuple[tuple[str, FieldSpec, Any], ...]] = {}


def _specs(cls: type[Any]) -> tuple[tuple[str, FieldSpec, Any], ...]:
    """(name, spec, default) of every Kafka field of ``cls``, in declaration order."""
    known = _SPECS.get(cls)
    if known is not None:
        return known
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("kafka")
        if spec is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append((f.name, spec, default))
    _SPECS[cls] = tuple(out)
    return _SPECS[cls]


# --------------------------------------------------------------------------- encoding


def _write_scalar(w: Writer, kind: str, value: Any, compact: bool) -> None:
    if kind == Kind.INT32:
        w.int32(value)
    elif kind == Kind.INT16:
        w.int16(value)
    elif kind == Kind.INT64:
        w.int64(value)
    elif kind == Kind.STRING:
        w.string(value, compact)
    elif kind == Kind.INT8:
        w.int8(value)
    elif kind == Kind.BOOL:
        w.boolean(value)
    elif kind == Kind.UINT32:
        w.uint32(value)
    elif kind == Kind.FLOAT64:
        w.float64(value)
    elif kind == Kind.UUID:
        if len(value) != 16:
            raise ValueError("a uuid is 16 bytes")
        w.raw(value)
    elif kind == Kind.RECORDS and isinstance(value, list):
        w.blobs(value, compact)
    elif kind in (Kind.BYTES, Kind.RECORDS):
        w.blob(value, compact)
    else:  # pragma: no cover - a schema typo
        raise TypeError(f"unknown Kafka type {kind!r}")


def _write_value(w: Writer, spec: FieldSpec, value: Any, version: int, flexible: bool) -> None:
    kind = spec.kind
    if value is None and not isinstance(kind, str) and not within(version, spec.nullable):
        raise ValueError(f"null is not allowed for {kind} in version {version}")
    if isinstance(kind, Array):
        if value is None:
            w.length(-1, flexible, wide=True)
            return
        w.length(len(value), flexible, wide=True)
        element = kind.element
        if isinstance(element, str):
            for item in value:
                _write_scalar(w, element, item, flexible)
        else:
            for item in value:
                _write_struct(w, item, version, flexible)
    elif isinstance(kind, type):
        if value is None:  # a nullable struct: -1 marker
            w.int8(-1)
            return
        if spec.nullable is not None:
            w.int8(1)
        _write_struct(w, value, version, flexible)
    else:
        _write_scalar(w, kind, value, flexible)


def _write_struct(w: Writer, obj: Any, version: int, flexible: bool) -> None:
    tagged: list[tuple[int, FieldSpec, Any]] = []
    for name, spec, default in _specs(type(obj)):
        if not within(version, spec.versions):
            continue
        value = getattr(obj, name)
        if spec.tag is not None:
            if flexible and within(version, spec.tagged_versions) and value != default:
                tagged.append((spec.tag, spec, value))
            continue
        _write_value(w, spec, value, version, flexible)
    if flexible:
        w.uvarint(len(tagged))
        for tag, spec, value in sorted(tagged, key=lambda t: t[0]):
            inner = Writer()
            _write_value(inner, spec, value, version, flexible)
            w.uvarint(tag)
            w.uvarint(inner.size())
            for part in inner.parts():
                w.raw(part)


def encode_into(w: Writer, obj: Any, version: int, flexible: bool) -> None:
    """Append ``obj`` as its message in ``version`` (``flexible``: that version's flag)."""
    _write_struct(w, obj, version, flexible)


# --------------------------------------------------------------------------- decoding

T = TypeVar("T")

_SCALAR_READERS: Final[dict[str, Callable[[Reader, bool], Any]]] = {
    Kind.INT8: lambda r, c: r.int8(),
    Kind.INT16: lambda r, c: r.int16(),
    Kind.INT32: lambda r, c: r.int32(),
    Kind.INT64: lambda r, c: r.int64(),
    Kind.UINT32: lambda r, c: r.uint32(),
    Kind.FLOAT64: lambda r, c: r.float64(),
    Kind.BOOL: lambda r, c: r.boolean(),
    Kind.STRING: lambda r, c: r.string(c),
    Kind.BYTES: lambda r, c: _bytes_or_none(r.blob(c)),
    Kind.RECORDS: lambda r, c: r.blob(c),
    Kind.UUID: lambda r, c: bytes(r.take(16)),
}


def _bytes_or_none(view: memoryview | None) -> bytes | None:
    return None if view is None else bytes(view)


def _read_value(r: Reader, spec: FieldSpec, version: int, flexible: bool) -> Any:
    kind = spec.kind
    nullable = within(version, spec.nullable)
    if isinstance(kind, Array):
        n = r.length(flexible, wide=True)
        if n < 0:
            if not nullable:
                raise MalformedKafkaRequest("null array where none is allowed")
            return None
        # each element takes at least one byte: a huge count in a short frame is refused here
        if n > r.remaining:
            raise MalformedKafkaRequest(f"array of {n} elements in {r.remaining} bytes")
        element = kind.element
        if isinstance(element, str):
            read = _SCALAR_READERS[element]
            return [read(r, flexible) for _ in range(n)]
        return [_read_struct(r, element, version, flexible) for _ in range(n)]
    if isinstance(kind, type):
        if nullable and r.int8() < 0:
            return None
        return _read_struct(r, kind, version, flexible)
    value = _SCALAR_READERS[kind](r, flexible)
    if value is None and not nullable:
        raise MalformedKafkaRequest(f"null {kind} where none is allowed")
    return value


def _read_struct(r: Reader, cls: type[T], version: int, flexible: bool) -> T:
    values: dict[str, Any] = {}
    by_tag: dict[int, tuple[str, FieldSpec]] = {}
    for name, spec, default in _specs(cls):
        if spec.tag is not None:
            if flexible and within(version, spec.tagged_versions):
                by_tag[spec.tag] = (name, spec)
            values[name] = default
            continue
        if within(version, spec.versions):
            values[name] = _read_value(r, spec, version, flexible)
        else:
            values[name] = default
    if flexible:
        last = -1
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            if tag <= last:
                raise MalformedKafkaRequest("tagged fields out of order")
            last = tag
            body = r.take(size)
            known = by_tag.get(tag)
            if known is not None:
                inner = Reader(body)
                values[known[0]] = _read_value(inner, known[1], version, flexible)
                if inner.remaining:
                    raise MalformedKafkaRequest(f"tagged field {tag} has trailing bytes")
    return cls(**values)


def decode_from(r: Reader, cls: type[T], version: int, flexible: bool) -> T:
    """Read one ``cls`` message in ``version``; raises ``MalformedKafkaRequest``."""
    return _read_struct(r, cls, version, flexible)
