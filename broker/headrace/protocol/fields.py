"""Typed fields of a decoded JSON document (pure), for the camelCase documents the
brokers and the controller exchange and persist.

A document of the wrong shape is the sender's error: ``InvalidRequest`` naming
where in the document (``where``) and which field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from headrace.errors import InvalidRequest

_T = TypeVar("_T")


def expect_object(doc: object, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise InvalidRequest(f"{where}: expected an object")
    return doc


def expect_field(doc: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T:
    """``doc[key]``, which must be there and be a ``kind`` (a bool is no int)."""
    doc = expect_object(doc, where)
    if key not in doc:
        raise InvalidRequest(f"{where}: missing field {key!r}")
    value = doc[key]
    if kind is int and isinstance(value, bool):
        raise InvalidRequest(f"{where}: field {key!r} must be an integer")
    if not isinstance(value, kind):
        raise InvalidRequest(f"{where}: field {key!r} must be {kind.__name__}")
    return value
