"""Write the generated files: ``crds/`` and ``docs/crd-reference.md``.

    python -m headrace.cli.generate crds/ docs/crd-reference.md [charts/headrace/crds/ ...]

(``make generate`` also writes the Helm chart's ``charts/headrace/crds/``: the same
files, so the chart and ``kubectl apply -f crds/`` install identical definitions.)

The rendering is pure (``resources.crdgen``, ``resources.docgen``); this
adapter does the file I/O around it: it reads ``examples/`` under the current
directory (the repository root), writes every CRD and the reference, and
removes CRD files of kinds that no longer exist.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from headrace.resources import GROUP, crdgen, docgen


def write_crds(directory: Path) -> list[Path]:
    """Write every kind's CRD into ``directory`` and remove stale generated ones."""
    directory.mkdir(parents=True, exist_ok=True)
    files = crdgen.generated()
    for stale in directory.glob(f"*.{GROUP}.yaml"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def read_examples(root: Path) -> dict[str, str]:
    """File name -> text of every manifest in ``root/examples`` (not its subdirectories)."""
    return {p.name: p.read_text() for p in sorted((root / docgen.EXAMPLES).glob("*.yaml"))}


def write_reference(target: Path, root: Path) -> Path:
    target.write_text(docgen.reference(read_examples(root)))
    return target


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(
            "usage: python -m headrace.cli.generate CRD_DIRECTORY REFERENCE_FILE"
            " [MORE_CRD_DIRECTORIES...]",
            file=sys.stderr,
        )
        return 2
    for directory in (args[0], *args[2:]):
        for path in write_crds(Path(directory)):
            print(path)
    print(write_reference(Path(args[1]), Path.cwd()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
