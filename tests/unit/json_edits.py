"""Edits of JSON documents for tests that feed a parser bad input."""

from __future__ import annotations

import json
from typing import Any


def broken(doc: dict[str, Any], path: list[str | int], value: object) -> dict[str, Any]:
    """A deep copy of ``doc`` with the field at ``path`` set to ``value`` (``KeyError``: removed)."""
    doc = json.loads(json.dumps(doc))
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc
