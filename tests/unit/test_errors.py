"""The error tree: unique wire codes and a registry that maps them back."""

from __future__ import annotations

import pytest

from headrace import errors


def every_error_class() -> list[type[errors.HeadraceError]]:
    found: list[type[errors.HeadraceError]] = []
    todo: list[type[errors.HeadraceError]] = [errors.HeadraceError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


CLASSES = every_error_class()


def test_the_tree_is_not_trivially_small() -> None:
    assert len(CLASSES) > 30


def test_every_class_has_its_own_code() -> None:
    codes = [cls.CODE for cls in CLASSES]
    assert len(codes) == len(set(codes)), sorted(codes)
    # each class declares its CODE itself rather than inheriting it
    assert all("CODE" in vars(cls) for cls in CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_error_for_code_round_trips(cls: type[errors.HeadraceError]) -> None:
    err = errors.error_for_code(cls.CODE, "boom")
    assert type(err) is cls
    assert err.message == "boom"
    assert str(err) == "boom"


def test_registry_holds_every_class() -> None:
    registry = errors.all_error_classes()
    assert set(registry.values()) == set(CLASSES)
    assert all(registry[cls.CODE] is cls for cls in CLASSES)


def test_unknown_code_is_the_base_class() -> None:
    err = errors.error_for_code(65000, "what")
    assert type(err) is errors.HeadraceError
    assert err.message == "what"


def test_empty_message_defaults_to_the_class_name() -> None:
    assert errors.NotLeader().message == "NotLeader"
    assert str(errors.CorruptBatch()) == "CorruptBatch"


@pytest.mark.parametrize(
    ("cls", "retriable", "invalid_metadata"),
    [
        (errors.MalformedFrame, False, False),
        (errors.CorruptBatch, False, False),
        (errors.NotLeader, True, True),
        (errors.StaleEpoch, True, True),
        (errors.StalePartitioningVersion, True, True),
        (errors.UnknownTopic, False, True),
        (errors.NotEnoughReplicas, True, False),
        (errors.StorageError, True, False),
        (errors.OutOfOrderSequence, True, False),
    ],
)
def test_flags(cls: type[errors.HeadraceError], retriable: bool, invalid_metadata: bool) -> None:
    assert (cls.retriable, cls.invalid_metadata) == (retriable, invalid_metadata)


def test_registering_a_duplicate_code_fails() -> None:
    class Family(errors.HeadraceError):
        CODE = 60_001

    class Clash(Family):
        CODE = errors.MalformedFrame.CODE

    with pytest.raises(RuntimeError, match="duplicate error code"):
        errors._register(Family)
    assert errors.all_error_classes()[errors.MalformedFrame.CODE] is errors.MalformedFrame
