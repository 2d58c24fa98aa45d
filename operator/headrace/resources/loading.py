"""Manifests in, validated resources out: all or nothing.

Pure: takes text, returns models or raises :class:`ManifestError`. Every
problem in every document is reported, one line each, naming the resource and
the field (``Topic/orders: spec.partitions: Input should be greater than or
equal to 1``), and nothing is returned if there is any: applying half of a set
of manifests that refer to each other leaves a state nobody asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml
from pydantic import ValidationError

from headrace.errors import InvalidTopicSpec
from headrace.resources.clusters import BrokerCluster
from headrace.resources.compactions import Compaction, CompactionSchedule
from headrace.resources.meta import (
    API_VERSION,
    GROUP,
    ObjectMeta,
    Resource,
    ResourceKey,
    json_text,
)
from headrace.resources.operations import Repartition, Unload
from headrace.resources.snapshots import TopicRestore, TopicSnapshot, TopicSnapshotSchedule
from headrace.resources.topics import Topic
from headrace.resources.users import User

#: every kind, in the order to apply them: what is referred to before what refers to it
KINDS: Final[Mapping[str, type[Resource]]] = {
    cls.KIND: cls
    for cls in (
        BrokerCluster,
        Topic,
        CompactionSchedule,
        Compaction,
        Repartition,
        Unload,
        TopicSnapshot,
        TopicSnapshotSchedule,
        TopicRestore,
        User,
    )
}


class ManifestError(InvalidTopicSpec):
    """One or more manifests are invalid; nothing was loaded.

    Shares the wire code of :class:`~headrace.errors.InvalidTopicSpec`: over the
    wire a bad manifest is a bad spec. ``problems`` holds one line per problem.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def load_manifests(text: str, *, source: str | None = None) -> list[Resource]:
    """The resources of a multi-document YAML (or JSON) text, in document order.

    ``source`` (a file name) prefixes every problem line. Raises
    :class:`ManifestError` listing every problem if any document is invalid.
    """
    return load_sources([(source, text)])


def load_sources(sources: Iterable[tuple[str | None, str]]) -> list[Resource]:
    """:func:`load_manifests` over several texts at once, all or nothing across them."""
    problems: list[str] = []
    resources: list[Resource] = []
    seen: dict[ResourceKey, _Document] = {}
    for source, text in sources:
        for document in _documents(text, source, problems):
            resource = _resource(document, problems)
            if resource is None:
                continue
            first = seen.setdefault(resource.key, document)
            if first is not document:
                problems.append(f"{document.label}: also defined in {first.where}")
            resources.append(resource)
    if problems:
        raise ManifestError(problems)
    return resources


def load_keys(text: str, *, source: str | None = None) -> list[ResourceKey]:
    """Kind, namespace and name of each manifest, for deleting.

    Only ``apiVersion``, ``kind`` and ``metadata`` are checked: deleting with a
    manifest whose spec no longer validates must still work.
    """
    return load_source_keys([(source, text)])


def load_source_keys(sources: Iterable[tuple[str | None, str]]) -> list[ResourceKey]:
    """:func:`load_keys` over several texts at once, all or nothing across them."""
    problems: list[str] = []
    keys: list[ResourceKey] = []
    for source, text in sources:
        for document in _documents(text, source, problems):
            cls = _kind(document, problems)
            if cls is None:
                continue
            meta_type: type[ObjectMeta] = cls.model_fields["metadata"].annotation  # type: ignore[assignment]
            try:
                meta = meta_type.model_validate_json(
                    json_text(document.body.get("metadata")),
                    strict=True,
                    by_alias=True,
                    by_name=False,
                )
            except ValidationError as exc:
                problems.extend(_field_problems(document.label, exc, prefix=("metadata",)))
                continue
            except (TypeError, ValueError) as exc:  # a value JSON cannot carry
                problems.append(f"{document.label}: {exc}")
                continue
            key = ResourceKey(cls.KIND, meta.namespace, meta.name)
            if key not in keys:
                keys.append(key)
    if problems:
        raise ManifestError(problems)
    return keys


def in_apply_order(resources: Iterable[Resource]) -> list[Resource]:
    """``resources`` sorted so that clusters come before topics before operations on them
    (stable within a kind); reverse it to delete."""
    rank = {kind: index for index, kind in enumerate(KINDS)}
    return sorted(resources, key=lambda resource: rank[resource.KIND])


# --- internals ---


@dataclass(frozen=True, slots=True, eq=False)
class _Document:
    """One manifest and where it came from, for error lines."""

    #: ``"file.yaml: "`` or ``""``
    prefix: str
    #: ``"document 3"``, or ``"document 3 items[0]"`` inside a List
    position: str
    body: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.prefix}{self.position}"

    @property
    def label(self) -> str:
        """``Kind/name`` when the document says them, else where it is."""
        kind = self.body.get("kind")
        metadata = self.body.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if isinstance(kind, str) and kind and isinstance(name, str) and name:
            return f"{self.prefix}{kind}/{name}"
        return self.where


def _documents(text: str, source: str | None, problems: list[str]) -> Iterator[_Document]:
    """Each non-empty document (the items of a ``kind: List``); other problems go to
    ``problems``."""
    prefix = f"{source}: " if source else ""
    try:
        for number, body in enumerate(yaml.safe_load_all(text), start=1):
            position = f"document {number}"
            if body is None:
                continue
            if isinstance(body, dict) and body.get("kind") == "List":
                items = body.get("items")
                if body.get("apiVersion") != "v1" or not isinstance(items, list):
                    problems.append(
                        f"{prefix}{position}: a List needs apiVersion v1 and a list of items"
                    )
                    continue
                for index, item in enumerate(items):
                    yield from _mapping(prefix, f"{position} items[{index}]", item, problems)
                continue
            yield from _mapping(prefix, position, body, problems)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc)
        problems.append(f"{prefix}invalid YAML{at}: {what}")


def _mapping(prefix: str, position: str, body: object, problems: list[str]) -> Iterator[_Document]:
    if isinstance(body, dict):
        yield _Document(prefix, position, body)
    else:
        problems.append(
            f"{prefix}{position}: expected a mapping with apiVersion and kind,"
            f" got {type(body).__name__}"
        )


def _kind(document: _Document, problems: list[str]) -> type[Resource] | None:
    label = document.label
    api_version = document.body.get("apiVersion")
    kind = document.body.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if api_version != API_VERSION:
        if api_version is None:
            problems.append(f"{label}: apiVersion: Field required (use {API_VERSION})")
        elif isinstance(api_version, str) and api_version.startswith(f"{GROUP}/"):
            problems.append(
                f"{label}: apiVersion: {api_version} is not a served version; use {API_VERSION}"
            )
        else:
            problems.append(f"{label}: apiVersion: expected {API_VERSION}, got {api_version!r}")
    if cls is None:
        if kind is None:
            problems.append(f"{label}: kind: Field required")
        else:
            problems.append(
                f"{label}: kind: unknown kind {kind!r}; expected one of {', '.join(KINDS)}"
            )
    return cls if api_version == API_VERSION else None


def _resource(document: _Document, problems: list[str]) -> Resource | None:
    cls = _kind(document, problems)
    if cls is None:
        return None
    try:
        return cls.from_manifest(document.body)
    except ValidationError as exc:
        problems.extend(_field_problems(document.label, exc))
    except (TypeError, ValueError) as exc:  # a value JSON cannot carry (binary, NaN)
        problems.append(f"{document.label}: {exc}")
    return None


#: pydantic error types that only echo another error
_ECHOES: Final = frozenset({"default_factory_not_called"})


def _field_problems(label: str, exc: ValidationError, *, prefix: tuple[str, ...] = ()) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        if error["type"] in _ECHOES:
            continue
        message = "Unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        path = _path((*prefix, *error["loc"]))
        lines.append(f"{label}: {path}: {message}" if path else f"{label}: {message}")
    return lines


def _path(loc: Sequence[int | str]) -> str:
    """``("spec", "moves", 0, "phase")`` -> ``spec.moves[0].phase``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text
