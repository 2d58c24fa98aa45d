"""Every package of the product sits under the import contracts, and the architecture doc says so.

import-linter checks only the packages its contracts name: a new top-level package that no
contract lists would escape the plane rule and the layers unnoticed. These tests fail the day
such a package appears, and the day ``docs/architecture.md``'s package table or layer list
drifts from ``pyproject.toml``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_ROOTS = (ROOT / "broker" / "headrace", ROOT / "operator" / "headrace")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _top_level_packages() -> set[str]:
    names: set[str] = set()
    for root in PRODUCT_ROOTS:
        for entry in root.iterdir():
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir() and (entry / "__init__.py").exists():
                names.add(entry.name)
            elif entry.suffix == ".py":
                names.add(entry.stem)
    return names


def _contracts() -> list[dict[str, object]]:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = settings["tool"]["importlinter"]["contracts"]
    return contracts


def _contract(name: str) -> dict[str, object]:
    (found,) = [c for c in _contracts() if c["name"] == name]
    return found


def _layers() -> list[list[str]]:
    layers = _contract("Layers: entry points over adapters over pure cores")["layers"]
    assert isinstance(layers, list)
    return [
        [part.strip().removeprefix("headrace.") for part in layer.split("|")] for layer in layers
    ]


def test_every_top_level_package_has_a_layer() -> None:
    layered = {name for layer in _layers() for name in layer}
    assert _top_level_packages() - layered == set()
    assert layered - _top_level_packages() == set(), "the layers name a package that is gone"


def test_every_top_level_package_belongs_to_a_plane() -> None:
    data_plane = _contract("The data plane never imports the control plane")
    data = {str(m).removeprefix("headrace.") for m in data_plane["source_modules"]}  # type: ignore[attr-defined]
    control = {
        str(m).removeprefix("headrace.")
        for m in data_plane["forbidden_modules"]  # type: ignore[attr-defined]
        if str(m).startswith("headrace.")
    }
    jobs = {
        str(m).removeprefix("headrace.")
        for m in _contract("The Spark jobs never import the control plane")["source_modules"]  # type: ignore[attr-defined]
    }
    assert data & control == set()
    assert _top_level_packages() - (data | control | jobs) == set()


def test_the_architecture_doc_lists_every_package() -> None:
    text = ARCHITECTURE.read_text()
    table = text.split("### Packages", 1)[1].split("\n\n", 3)
    rows = [line for line in "\n\n".join(table).splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert _top_level_packages() - named == set()


def test_the_architecture_doc_lists_the_layers_of_the_contract() -> None:
    expected = " > ".join(" | ".join(f"`{name}`" for name in layer) for layer in _layers())
    prose = " ".join(ARCHITECTURE.read_text().split())
    assert expected in prose, f"docs/architecture.md should list the layers as: {expected}"


def test_no_product_package_may_import_the_test_harness() -> None:
    harness = _contract("The product never imports the test harness")
    sources = {str(m).removeprefix("headrace.") for m in harness["source_modules"]}  # type: ignore[attr-defined]
    assert sources == _top_level_packages()
    assert harness["forbidden_modules"] == ["headrace.testing"]


def test_the_test_harness_is_on_a_checkouts_path_but_not_in_the_wheel() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = settings["tool"]["hatch"]["build"]
    assert (ROOT / "testing" / "headrace" / "testing" / "__init__.py").exists()
    assert "testing" in build["dev-mode-dirs"]
    assert "testing" in settings["tool"]["pytest"]["ini_options"]["pythonpath"]
    assert not [p for p in build["targets"]["wheel"]["packages"] if p.startswith("testing")]
