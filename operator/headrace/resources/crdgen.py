"""The CRDs of ``crds/``, rendered from the models (pure: ``generated`` returns the text).

``python -m headrace.cli.generate`` writes them (and the reference); this
module reads and writes no files.

Pydantic's JSON schema says the right things in a form Kubernetes does not
take. A CRD schema must be *structural*: every node has a ``type`` (or is an
int-or-string or an explicitly free-form object), there is no ``$ref``, objects
list their ``properties``, and logical junctors (``anyOf``...) carry no types.
So the conversion here:

- inlines ``$ref``/``$defs`` (the models are not recursive);
- turns ``Optional[X]`` (``anyOf: [X, {type: null}]``) into ``X``, optional by
  being absent from ``required``; the operator never writes nulls;
- drops ``additionalProperties: false`` (structural schemas prune unknown
  fields, and ``kubectl`` rejects them under its default strict field
  validation) and turns ``additionalProperties: true`` into
  ``x-kubernetes-preserve-unknown-fields`` (only the free-form fields);
- turns ``const`` into a one-value ``enum`` and drops ``title`` and null defaults;
- adds the CEL rules that JSON schema cannot say (``minInSync <= replicas``,
  immutable one-shot specs, each kind's name rule).

:func:`structural_problems` checks the result, and a unit test regenerates the
CRDs and compares them with the committed files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import yaml

from headrace.resources.loading import KINDS
from headrace.resources.meta import GROUP, RESOURCE_NAME, SUBDOMAIN, VERSION, ObjectMeta, Resource

HEADER: Final = (
    "# Generated from the models in operator/headrace/resources by\n"
    "#   python -m headrace.cli.generate crds/ docs/crd-reference.md\n"
    "# Do not edit; change the models and regenerate.\n"
)

#: keys of a JSON schema node, in the order they are written (the rest follow, sorted)
_ORDER: Final = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "items",
    "additionalProperties",
    "properties",
    "required",
    "x-kubernetes-validations",
)


class CrdError(Exception):
    """The models produced a schema this module cannot make structural."""


def file_name(cls: type[Resource]) -> str:
    return f"{cls.NAMES.plural}.{GROUP}.yaml"


def custom_resource_definition(cls: type[Resource]) -> dict[str, Any]:
    """The CRD of one kind, as a JSON-ready document."""
    names = cls.NAMES
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            {
                "name": column.name,
                "type": column.type,
                "jsonPath": column.json_path,
                "description": column.description,
            }
            for column in names.columns
        ],
        "schema": {"openAPIV3Schema": openapi_schema(cls)},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{names.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "headrace"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": cls.KIND,
                "listKind": f"{cls.KIND}List",
                "plural": names.plural,
                "singular": names.singular,
                "shortNames": list(names.short_names),
                "categories": list(names.categories),
            },
            "versions": [version],
        },
    }


def openapi_schema(cls: type[Resource]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one kind."""
    raw = cls.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    root = _convert(raw, defs, "")
    properties = root["properties"]
    properties["apiVersion"] = {
        "description": f"{GROUP}/{VERSION}",
        "type": "string",
    }
    properties["kind"] = {"description": cls.KIND, "type": "string"}
    # the API server owns metadata's schema; a CRD may only restrict the name (below)
    properties["metadata"] = {"type": "object"}
    root["required"] = ["spec"]
    rules = _name_rules(cls.model_fields["metadata"].annotation)
    if rules:
        root["x-kubernetes-validations"] = rules
    return _ordered(root)


def _name_rules(meta: object) -> list[dict[str, str]]:
    """CEL rules for a name stricter than the API server's own (a DNS-1123 subdomain)."""
    if not (isinstance(meta, type) and issubclass(meta, ObjectMeta)):
        raise CrdError(f"metadata must be an ObjectMeta, not {meta!r}")
    rule = meta.name_rule
    checks = [f"self.metadata.name.size() <= {rule.max_length}"]
    if rule.pattern not in (SUBDOMAIN.pattern, RESOURCE_NAME.pattern):
        checks.append(f"self.metadata.name.matches(r'{rule.pattern}')")
    message = f"metadata.name must be {rule.what} of at most {rule.max_length} characters"
    return [{"rule": " && ".join(checks), "message": message}]


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], path: str) -> dict[str, Any]:
    out = dict(node)
    ref = out.pop("$ref", None)
    if ref is not None:
        # keys beside the $ref (the field's description and default) win over the target's
        return _convert({**defs[ref.rsplit("/", 1)[-1]], **out}, defs, path)
    if "anyOf" in out and not out.get("x-kubernetes-int-or-string"):
        branches = [b for b in out.pop("anyOf") if b != {"type": "null"}]
        if len(branches) != 1:
            raise CrdError(
                f"{path or '<root>'}: a union of {len(branches)} types is not structural"
            )
        return _convert({**branches[0], **out}, defs, path)
    out.pop("title", None)
    if "default" in out and out["default"] is None:
        del out["default"]
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "description" in out:
        out["description"] = _prose(out["description"])
    if "x-kubernetes-validations" in out:
        out["x-kubernetes-validations"] = [
            {key: rule[key] for key in ("rule", "message", "fieldPath") if key in rule}
            for rule in out["x-kubernetes-validations"]
        ]
    extra = out.pop("additionalProperties", None)
    if extra is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, Mapping):
        out["additionalProperties"] = _convert(extra, defs, f"{path}.*")
    if "properties" in out:
        out["properties"] = {
            name: _convert(child, defs, f"{path}.{name}" if path else name)
            for name, child in out["properties"].items()
        }
    if "items" in out:
        out["items"] = _convert(out["items"], defs, f"{path}[]")
    return _ordered(out)


def _prose(text: str) -> str:
    """A docstring as one paragraph of plain text (``kubectl explain`` shows it raw)."""
    return re.sub(r"\s+", " ", text.replace("``", "`")).strip()


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    known = [key for key in _ORDER if key in node]
    rest = sorted(key for key in node if key not in _ORDER)
    return {key: node[key] for key in (*known, *rest)}


def render(crd: Mapping[str, Any]) -> str:
    """A CRD as the YAML text committed under ``crds/``."""
    return HEADER + yaml.safe_dump(
        dict(crd), sort_keys=False, default_flow_style=False, width=100, allow_unicode=True
    )


def generated() -> dict[str, str]:
    """File name -> text, for every kind."""
    return {file_name(cls): render(custom_resource_definition(cls)) for cls in KINDS.values()}


# --- structural check ---

#: JSONSchemaProps fields a CRD schema may use (apiextensions.k8s.io/v1), minus the
#: unsupported ones ($ref, id, definitions, dependencies, patternProperties,
#: additionalItems) and $schema, which Kubernetes ignores
_ALLOWED_KEYS: Final = frozenset(
    {
        "description",
        "type",
        "format",
        "title",
        "default",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "enum",
        "maxProperties",
        "minProperties",
        "required",
        "items",
        "allOf",
        "oneOf",
        "anyOf",
        "not",
        "properties",
        "additionalProperties",
        "externalDocs",
        "example",
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
_TYPES: Final = frozenset({"object", "array", "string", "integer", "number", "boolean"})
_INT_OR_STRING: Final = [{"type": "integer"}, {"type": "string"}]


def structural_problems(schema: Mapping[str, Any]) -> list[str]:
    """Why ``schema`` is not a structural CRD schema; empty when it is.

    Mirrors the API server's checks (apiextensions ``ValidateStructural`` and the
    OpenAPI schema validation) that a generator could plausibly violate.
    """
    problems = list(_walk(schema, "openAPIV3Schema", root=True))
    properties = schema.get("properties", {})
    if set(properties.get("metadata", {"type": "object"})) - {"type"}:
        problems.append("openAPIV3Schema.properties.metadata: must be just {type: object}")
    return problems


def _walk(node: Any, path: str, *, root: bool = False) -> Iterator[str]:
    if not isinstance(node, Mapping):
        yield f"{path}: is not a schema object"
        return
    for key in sorted(set(node) - _ALLOWED_KEYS):
        yield f"{path}: {key} is not allowed in a CRD schema"
    free = node.get("x-kubernetes-preserve-unknown-fields") is True
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    kind = node.get("type")
    if kind is None and not (free or int_or_string):
        yield f"{path}: has no type"
    elif kind is not None and kind not in _TYPES:
        yield f"{path}: type {kind!r} is not one of {sorted(_TYPES)}"
    for junctor in ("allOf", "oneOf", "not"):
        if junctor in node:
            yield f"{path}: {junctor} is not used by headrace schemas"
    if "anyOf" in node and not (int_or_string and node["anyOf"] == _INT_OR_STRING):
        yield f"{path}: anyOf is only allowed as the int-or-string pair"
    if int_or_string and kind is not None:
        yield f"{path}: an int-or-string has no type"
    if node.get("nullable"):
        yield f"{path}: nullable is not used (optional fields are just not required)"
    if node.get("uniqueItems"):
        yield f"{path}: uniqueItems must not be true (use x-kubernetes-list-type: set)"
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node and not isinstance(node[bound], bool):
            yield f"{path}: {bound} must be a boolean in OpenAPI v3"
    if "properties" in node:
        if kind != "object":
            yield f"{path}: properties under type {kind!r}"
        if "additionalProperties" in node:
            yield f"{path}: properties and additionalProperties are mutually exclusive"
        for name in node.get("required", []):
            if name not in node["properties"]:
                yield f"{path}: required field {name!r} is not a property"
        for name, child in node["properties"].items():
            yield from _walk(child, f"{path}.properties.{name}")
    elif "required" in node:
        yield f"{path}: required without properties"
    if "additionalProperties" in node:
        extra = node["additionalProperties"]
        if root:
            yield f"{path}: additionalProperties must not be used at the root"
        if kind != "object":
            yield f"{path}: additionalProperties under type {kind!r}"
        if isinstance(extra, bool):
            yield f"{path}: additionalProperties must be a schema, not {extra}"
        else:
            yield from _walk(extra, f"{path}.additionalProperties")
    if kind == "array":
        if "items" not in node:
            yield f"{path}: an array needs items"
        else:
            yield from _walk(node["items"], f"{path}.items")
            yield from _list_type(node, path)
    elif "items" in node:
        yield f"{path}: items under type {kind!r}"
    if kind == "object" and free and "properties" in node:
        yield f"{path}: a free-form object lists no properties"


def _list_type(node: Mapping[str, Any], path: str) -> Iterator[str]:
    list_type = node.get("x-kubernetes-list-type")
    items = node["items"]
    if list_type == "set" and items.get("type") == "object":
        yield f"{path}: a set lists scalars"
    if list_type == "map":
        keys = node.get("x-kubernetes-list-map-keys") or []
        if not keys:
            yield f"{path}: a map list needs x-kubernetes-list-map-keys"
        fields = items.get("properties", {})
        for key in keys:
            field = fields.get(key)
            if field is None:
                yield f"{path}: map key {key!r} is not a property of the items"
            elif key not in items.get("required", []) and "default" not in field:
                yield f"{path}: map key {key!r} must be required or defaulted"
