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

Two annotations cover the documents that are not their dataclass field for field:
``ListMap`` keeps a map as a list of entries sorted by key (what Kubernetes merges as a
list-map), and ``ByHand`` lets a wire type of ``headrace.protocol`` that reads and writes
itself sit inside a generated document.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import pydantic
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema

from headrace.errors import InvalidRequest

#: the configuration of a dataclass that is a camelCase document
CAMEL_CASE: Final = pydantic.ConfigDict(
    alias_generator=to_camel, validate_by_alias=True, serialize_by_alias=True
)

_T = TypeVar("_T")


class Codec(Generic[_T]):
    """``dump`` and ``load`` of one document type; ``what`` names it in errors.

    ``required``: top-level fields the document must name although the dataclass gives
    them a default.
    """

    def __init__(self, kind: type[_T], what: str, required: tuple[str, ...] = ()) -> None:
        self._adapter = pydantic.TypeAdapter(kind)
        self.what = what
        self._required = required

    def dump(self, value: _T) -> dict[str, Any]:
        doc: dict[str, Any] = self._adapter.dump_python(value, mode="json", by_alias=True)
        return doc

    def load(self, doc: object) -> _T:
        if not isinstance(doc, Mapping):
            raise InvalidRequest(f"{self.what}: expected an object")
        for key in self._required:
            if doc.get(key) is None:
                raise InvalidRequest(f"{self.what}: missing field {key!r}")
        try:
            # JSON mode: strict about scalars, yet a JSON array reads as a tuple
            return self._adapter.validate_json(json.dumps(_without_nulls(doc)), strict=True)
        except pydantic.ValidationError as exc:
            problems = "; ".join(_problem(e) for e in exc.errors())
            raise InvalidRequest(f"{self.what}: {problems}") from None


@dataclass(frozen=True, slots=True)
class ListMap:
    """Annotates a ``Mapping`` field kept in its document as a list of objects sorted by
    their ``key`` field (a Kubernetes list-map, which a patch merges by key).

    With ``value``, each entry is ``{key: k, value: v}`` for an item of the map, typed by
    the ``Mapping``'s key and value types. Without, the entry is the map's value itself (a
    dataclass, keyed by its attribute ``key``). Reading takes the last entry of a key
    listed twice.
    """

    key: str
    value: str | None = None

    def __get_pydantic_core_schema__(
        self, source: object, handler: pydantic.GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        key_type, value_type = typing.get_args(source)
        entry = handler.generate_schema(value_type)
        if self.value is not None:
            entry = core_schema.typed_dict_schema(
                {
                    self.key: core_schema.typed_dict_field(handler.generate_schema(key_type)),
                    self.value: core_schema.typed_dict_field(entry),
                }
            )
        entries = core_schema.list_schema(entry)
        return core_schema.no_info_after_validator_function(
            self._mapping,
            entries,
            serialization=core_schema.plain_serializer_function_ser_schema(
                self._entries, return_schema=entries
            ),
        )

    def _mapping(self, entries: list[Any]) -> dict[Any, Any]:
        if self.value is None:
            return {getattr(e, self.key): e for e in entries}
        return {e[self.key]: e[self.value] for e in entries}

    def _entries(self, mapping: Mapping[Any, Any]) -> list[Any]:
        if self.value is None:
            return [mapping[k] for k in sorted(mapping)]
        return [{self.key: k, self.value: mapping[k]} for k in sorted(mapping)]


@dataclass(frozen=True, slots=True)
class ByHand(Generic[_T]):
    """Annotates a field whose type reads and writes itself (a wire type of
    ``headrace.protocol``): ``load`` raises ``InvalidRequest`` naming what is wrong."""

    load: Callable[[Mapping[str, Any]], _T]
    dump: Callable[[_T], object]

    def __get_pydantic_core_schema__(
        self, source: object, handler: pydantic.GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self._load, serialization=core_schema.plain_serializer_function_ser_schema(self.dump)
        )

    def _load(self, doc: Mapping[str, Any]) -> _T:
        try:
            return self.load(doc)
        except InvalidRequest as exc:
            # reported with the field's path, like every other problem of the document
            raise PydanticCustomError("by_hand", "{problem}", {"problem": str(exc)}) from None


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
