"""Reading manifests for ``headrace apply -f`` and ``headrace delete -f``.

No networking: these helpers turn ``-f`` arguments into validated resources
(or resource keys) and leave sending them to the caller. ``-f`` takes what
kubectl's does: a file, a directory (its ``*.yaml``, ``*.yml`` and ``*.json``
files, sorted, not recursive) or ``-`` for standard input, and may be given
more than once. Every problem in every file is reported at once, prefixed
with the file name, and nothing is returned if there is any
(:class:`~headrace.resources.ManifestError`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO

from headrace.resources import (
    KINDS,
    ManifestError,
    Resource,
    ResourceKey,
    in_apply_order,
    load_source_keys,
    load_sources,
)

STDIN: Final = "-"
#: what a directory given to ``-f`` contributes
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")


def read_manifests(
    paths: Sequence[str | Path], *, stdin: TextIO | None = None
) -> list[tuple[str, str]]:
    """``(source name, text)`` for every manifest file the ``-f`` arguments name.

    ``stdin`` defaults to ``sys.stdin`` and is read at most once (``-`` twice is an
    error: the second would read nothing).
    """
    if not paths:
        raise ManifestError(["no manifests given: use -f FILE, -f DIRECTORY or -f -"])
    problems: list[str] = []
    sources: list[tuple[str, str]] = []
    if sum(1 for path in paths if str(path) == STDIN) > 1:
        problems.append("-: standard input can be given only once")
    for given in dict.fromkeys(str(path) for path in paths):
        if given == STDIN:
            sources.append(("<stdin>", (stdin or sys.stdin).read()))
            continue
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES)
            if not files:
                problems.append(f"{given}: no {', '.join(MANIFEST_SUFFIXES)} files in directory")
        else:
            files = [path]
        for file in files:
            try:
                sources.append((str(file), file.read_text(encoding="utf-8")))
            except FileNotFoundError:
                problems.append(f"{file}: no such file or directory")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{file}: cannot read: {exc}")
    if problems:
        raise ManifestError(problems)
    return sources


def manifests_to_apply(
    paths: Sequence[str | Path], *, stdin: TextIO | None = None
) -> list[Resource]:
    """The validated resources, clusters before topics before operations on them."""
    return in_apply_order(load_sources(read_manifests(paths, stdin=stdin)))


def manifests_to_delete(
    paths: Sequence[str | Path], *, stdin: TextIO | None = None
) -> list[ResourceKey]:
    """What to delete, operations before topics before clusters.

    Specs are not validated, so an outdated manifest still deletes what it made.
    """
    keys = load_source_keys(read_manifests(paths, stdin=stdin))
    rank = {kind: index for index, kind in enumerate(KINDS)}
    return sorted(keys, key=lambda key: rank[key.kind], reverse=True)
