"""The object store's errors and layering rules."""

from __future__ import annotations

import ast
from pathlib import Path

from headrace import errors
from headrace.objectstore import interface
from headrace.objectstore.errors import ERROR_CLASSES

PACKAGE = Path(interface.__file__).parent


def test_error_codes_are_unique_in_70_to_79_and_clash_with_no_wire_code() -> None:
    codes = [cls.CODE for cls in ERROR_CLASSES]
    assert len(set(codes)) == len(codes)
    assert all(70 <= c <= 79 for c in codes)
    assert all("CODE" in vars(cls) for cls in ERROR_CLASSES)
    wire = errors.all_error_classes()
    assert not set(codes) & set(wire)
    assert len(wire) == len({cls.CODE for cls in wire.values()})


def test_every_store_error_is_a_headrace_error_and_only_not_found_like_ones_are_final() -> None:
    for cls in ERROR_CLASSES:
        assert issubclass(cls, errors.HeadraceError)
    retriable = {cls.__name__ for cls in ERROR_CLASSES if cls.retriable}
    assert retriable == {"ObjectStoreError", "ObjectStoreUnavailable"}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_only_the_minio_adapter_imports_minio() -> None:
    src = PACKAGE.parent  # the whole headrace package, not only objectstore
    importers = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if any(m == "minio" or m.startswith("minio.") for m in imported_modules(p))
    )
    assert importers == ["objectstore/minio_store.py"]


def test_the_interface_and_retrying_modules_do_no_io() -> None:
    for name in ("interface.py", "retrying.py"):
        mods = imported_modules(PACKAGE / name)
        assert not mods & {"os", "socket", "subprocess", "urllib3", "minio", "asyncio", "shutil"}, (
            name
        )
