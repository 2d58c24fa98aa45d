"""Size and shape figures of the product code, measured the same way before and after a reshape.

Counts, over ``broker/headrace`` and ``operator/headrace`` (tests, e2e and bench are not product):
functions over 60 and over 120 lines, classes over 300 lines, functions with more than 10
parameters, import cycles between modules, ``dict[str, Any]`` in annotations, and the pairs the
``duplicates`` tool finds in product code (when that tool is on PATH).

    python tools/house_metrics.py            # a table
    python tools/house_metrics.py --json     # the same figures as JSON
    python tools/house_metrics.py --list     # the offenders, by name, under the table
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_ROOTS = (ROOT / "broker", ROOT / "operator")
LONG_FUNCTION = 60
VERY_LONG_FUNCTION = 120
LONG_CLASS = 300
MANY_PARAMETERS = 10
DICT_STR_ANY = re.compile(r"dict\[\s*str\s*,\s*(typing\.)?Any\s*\]")


@dataclass
class Figures:
    python_files: int = 0
    lines: int = 0
    functions_over_60_lines: int = 0
    functions_over_120_lines: int = 0
    classes_over_300_lines: int = 0
    functions_over_10_parameters: int = 0
    import_cycles: int = 0
    modules_in_import_cycles: int = 0
    dict_str_any: int = 0
    duplicate_pairs: int | None = None
    offenders: dict[str, list[str]] = field(default_factory=dict)


def product_files() -> list[Path]:
    files: list[Path] = []
    for root in PRODUCT_ROOTS:
        files.extend(p for p in (root / "headrace").rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files)


def module_name(path: Path) -> str:
    for root in PRODUCT_ROOTS:
        if path.is_relative_to(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(path)


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = fn.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    count = sum(1 for a in named if a.arg not in ("self", "cls"))
    return count + (args.vararg is not None) + (args.kwarg is not None)


def span(node: ast.AST) -> int:
    end = getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]
    return int(end) - int(node.lineno) + 1  # type: ignore[attr-defined]


def measure_file(path: Path, figures: Figures) -> None:
    text = path.read_text()
    figures.python_files += 1
    figures.lines += text.count("\n")
    figures.dict_str_any += len(DICT_STR_ANY.findall(text))
    where = str(path.relative_to(ROOT))
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = span(node)
            name = f"{where}:{node.lineno} {node.name}"
            if length > LONG_FUNCTION:
                figures.functions_over_60_lines += 1
                figures.offenders.setdefault("functions_over_60_lines", []).append(
                    f"{name} ({length})"
                )
            if length > VERY_LONG_FUNCTION:
                figures.functions_over_120_lines += 1
            params = parameter_count(node)
            if params > MANY_PARAMETERS:
                figures.functions_over_10_parameters += 1
                figures.offenders.setdefault("functions_over_10_parameters", []).append(
                    f"{name} ({params})"
                )
        elif isinstance(node, ast.ClassDef):
            length = span(node)
            if length > LONG_CLASS:
                figures.classes_over_300_lines += 1
                figures.offenders.setdefault("classes_over_300_lines", []).append(
                    f"{where}:{node.lineno} {node.name} ({length})"
                )


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The product modules ``path`` imports at module level or inside functions."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` depends on the module ``mod``; ``from mod import name``
            # on ``mod`` (as import-linter reads them)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively, for graphs of a few hundred modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def measure_cycles(files: list[Path], figures: Figures) -> None:
    names = {module_name(p): p for p in files}
    known = set(names)
    graph = {name: imported_modules(path, known) for name, path in names.items()}
    cycles = [sorted(c) for c in strongly_connected(graph) if len(c) > 1]
    figures.import_cycles = len(cycles)
    figures.modules_in_import_cycles = sum(len(c) for c in cycles)
    if cycles:
        figures.offenders["import_cycles"] = [", ".join(c) for c in cycles]


def measure_duplicates(figures: Figures) -> None:
    tool = shutil.which("duplicates")
    if tool is None:
        return
    total = 0
    for root in PRODUCT_ROOTS:
        out = subprocess.run(
            [tool, "--repo", str(root / "headrace"), "--seconds", "120", "--most", "1"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        first = out.splitlines()[0] if out else ""
        match = re.search(r"(\d+) pairs?", first)
        total += int(match.group(1)) if match else 0
    figures.duplicate_pairs = total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--no-duplicates", action="store_true")
    options = parser.parse_args(argv)
    figures = Figures()
    files = product_files()
    for path in files:
        measure_file(path, figures)
    measure_cycles(files, figures)
    if not options.no_duplicates:
        measure_duplicates(figures)
    if options.json:
        print(json.dumps(asdict(figures), indent=2))
        return 0
    for key, value in asdict(figures).items():
        if key != "offenders":
            print(f"{key:32} {value}")
    if options.list:
        for key, names in figures.offenders.items():
            print(f"\n{key}:")
            for name in names:
                print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
