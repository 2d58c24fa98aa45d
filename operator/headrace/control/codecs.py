"""JSON codecs generated from the core's frozen dataclasses (pure).

A document whose JSON is its dataclass field for field, in camelCase, needs no
hand-written ``to_json``/``from_json``: mark the dataclass with ``CAMEL_CASE``
(``@pydantic.with_config``) and make a ``Codec`` of it. Pydantic derives both
directions from the type hints, nested dataclasses and enums included.

Reading is strict, as ``protocol.jsonfields`` is: no string is taken for a number,
JSON ``true`` is no integer, an enum takes only its values. A null reads as an absent
field (so it takes the field's default): the API server drops nulls from a status
document it is not told to keep, and a document written by the previous version may
carry them. A document of the wrong shape raises ``InvalidRequest`` naming the document,
the field path and what is wrong, in the words ``jsonfields`` uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import pydantic
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from headrace.errors import InvalidRequest

#: the configuration of a dataclass that is a camelCase document
CAMEL_CASE: Final = pydantic.ConfigDict(
    alias_generator=to_camel, validate_by_alias=True, serialize_by_alias=True
)

_T = TypeVar("_T")


class Codec(Generic[_T]):
    """``dump`` and ``load`` of one document type; ``what`` names it in errors."""

    def __init__(self, kind: type[_T], what: str) -> None:
        self._adapter = pydantic.TypeAdapter(kind)
        self.what = what

    def dump(self, value: _T) -> dict[str, Any]:
        doc: dict[str, Any] = self._adapter.dump_python(value, mode="json", by_alias=True)
        return doc

    def load(self, doc: object) -> _T:
        if not isinstance(doc, Mapping):
            raise InvalidRequest(f"{self.what}: expected an object")
        try:
            # JSON mode: strict about scalars, yet a JSON array reads as a tuple
            return self._adapter.validate_json(json.dumps(_without_nulls(doc)), strict=True)
        except pydantic.ValidationError as exc:
            problems = "; ".join(_problem(e) for e in exc.errors())
            raise InvalidRequest(f"{self.what}: {problems}") from None


def _without_nulls(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    return value


def _problem(error: ErrorDetails) -> str:
    """One validation error in ``jsonfields``' words, with the path of the field."""
    loc = list(error["loc"])
    in_list = bool(loc) and isinstance(loc[-1], int)
    field = ".".join(map(str, loc[:-1] if in_list else loc))
    key = str(loc[-1]) if loc else ""
    within = ".".join(map(str, loc[:-1]))
    value = error.get("input")
    match error["type"]:
        case "missing":
            problem = f"missing field {key!r}"
        case "enum":
            problem = f"unknown {key} {value!r}"
        case "int_type" if in_list:
            return f"field {field!r} must be a list of integers"
        case "int_type":
            return f"field {field!r} must be " + (
                "an integer" if isinstance(value, bool) else "int"
            )
        case "bool_type":
            return f"field {field!r} must be bool"
        case "string_type":
            return f"field {field!r} must be str"
        case "list_type" | "tuple_type":
            return f"field {field!r} must be list"
        case "dataclass_type" | "dict_type" if in_list:
            return f"field {field!r} must be a list of objects"
        case "dataclass_type" | "dict_type":
            return f"field {field!r} must be an object" if loc else "expected an object"
        case _:
            return f"{'.'.join(map(str, loc))}: {error['msg']}" if loc else error["msg"]
    return f"{within}: {problem}" if within else problem
