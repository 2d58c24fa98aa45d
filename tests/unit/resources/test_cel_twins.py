"""Every model validator that compares fields has a CEL twin in the CRD, so the API
server refuses what the operator's model refuses: a spec the CRD admits always parses,
and the operator never meets a stored object it cannot reconcile."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationInfo

from headrace.resources import KINDS, crdgen
from headrace.resources.meta import Model


def models() -> Iterator[type[Model]]:
    seen: set[type[Model]] = set()
    pending: list[type[Model]] = [Model]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen and sub.__module__.startswith("headrace.resources"):
                seen.add(sub)
                pending.append(sub)
    yield from sorted(seen, key=lambda c: c.__qualname__)


def comparing_validators(cls: type[Model]) -> Iterator[str]:
    """The names of ``cls``'s own validators that compare fields: every model validator,
    and every field validator that reads other fields (it takes a ``ValidationInfo``)."""
    decorators = cls.__pydantic_decorators__
    for name in decorators.model_validators:
        if name in vars(cls):
            yield name
    for name, decorator in decorators.field_validators.items():
        if name not in vars(cls):
            continue
        function = decorator.func
        parameters = inspect.signature(function).parameters.values()
        if any(p.annotation in (ValidationInfo, "ValidationInfo") for p in parameters):
            yield name


def crd_rules() -> set[str]:
    rules: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                rules.add(rule["rule"])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    for kind in KINDS.values():
        walk(crdgen.custom_resource_definition(kind))
    return rules


COMPARING = [(cls, name) for cls in models() for name in comparing_validators(cls)]


def test_the_models_have_comparing_validators() -> None:
    """(The search below finds them: it would pass vacuously otherwise.)"""
    found = {f"{cls.__name__}.{name}" for cls, name in COMPARING}
    assert {
        "ResourceRequirements._requests_within_limits",
        "TopicSpec._within_replicas",
        "UserGrant._cohorts_narrow_consume",
    } <= found


@pytest.mark.parametrize(
    ("cls", "validator"), COMPARING, ids=[f"{c.__name__}.{n}" for c, n in COMPARING]
)
def test_every_comparing_validator_has_a_cel_twin_in_the_crd(
    cls: type[Model], validator: str
) -> None:
    twin = cls.CEL_TWINS.get(validator)
    assert twin is not None, f"{cls.__name__}.{validator} has no CEL twin in CEL_TWINS"
    assert twin.rule in crd_rules(), f"the CRD lacks {cls.__name__}.{validator}'s twin"


def test_every_twin_names_a_validator() -> None:
    for cls in models():
        own = set(cls.__pydantic_decorators__.model_validators) | set(
            cls.__pydantic_decorators__.field_validators
        )
        assert set(cls.CEL_TWINS) <= own, cls.__name__
