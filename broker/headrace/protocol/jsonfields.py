"""Typed field access for JSON documents (pure).

The broker↔controller documents (``coordination``, ``endpoints``) and the
controller's persisted status (``control.model``) parse JSON the same way: a
missing or mistyped field raises ``InvalidRequest`` naming the document and the
field, so a bad document is refused at the edge instead of failing deep in the
caller.
``bool`` is never accepted where an ``int`` is expected (JSON ``true`` is not 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from headrace.errors import InvalidRequest

_T = TypeVar("_T")


def mapping(doc: object, where: str) -> Mapping[str, Any]:
    """``doc`` as an object, or ``InvalidRequest``."""
    if not isinstance(doc, Mapping):
        raise InvalidRequest(f"{where}: expected an object")
    return doc


def required(doc: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T:
    """``doc[key]``, which must be there and be a ``kind`` (a bool is no int)."""
    doc = mapping(doc, where)
    if key not in doc:
        raise InvalidRequest(f"{where}: missing field {key!r}")
    value = doc[key]
    if kind is int and isinstance(value, bool):
        raise InvalidRequest(f"{where}: field {key!r} must be an integer")
    if not isinstance(value, kind):
        raise InvalidRequest(f"{where}: field {key!r} must be {kind.__name__}")
    return value


def optional(doc: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T | None:
    """The field's value; None when it is absent or null."""
    if mapping(doc, where).get(key) is None:
        return None
    return required(doc, key, kind, where)


def ints(doc: Mapping[str, Any], key: str, where: str, *, default: bool = False) -> tuple[int, ...]:
    """A list of integers; with ``default``, an absent or null field is ``()``."""
    if default and mapping(doc, where).get(key) is None:
        return ()
    values = required(doc, key, list, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidRequest(f"{where}: field {key!r} must be a list of integers")
    return tuple(values)


def objects(doc: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    """A list of objects; an absent or null field is ``[]``."""
    if mapping(doc, where).get(key) is None:
        return []
    values = required(doc, key, list, where)
    if not all(isinstance(v, Mapping) for v in values):
        raise InvalidRequest(f"{where}: field {key!r} must be a list of objects")
    return values
