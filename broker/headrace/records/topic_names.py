"""Topic names: ``namespace/name``, or ``name`` in the namespace ``default`` (pure).

The one spelling every part that keys state by topic agrees on: the broker's registry,
its listeners and the access checks (``headrace.security.access``), whose ACL
patterns name topics the same way.
"""

from __future__ import annotations

import re
from typing import Final

from headrace.errors import InvalidTopicSpec

NAME_PART: Final = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
DEFAULT_NAMESPACE: Final = "default"


def canonical_topic_name(name: str) -> str:
    """``name`` or ``namespace/name`` -> ``namespace/name``, validated."""
    parts = name.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 2 or not all(NAME_PART.match(p) for p in parts):
        raise InvalidTopicSpec(
            f"invalid topic name {name!r}: use NAME or NAMESPACE/NAME, each 1-63 characters of"
            " lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
        )
    return "/".join(parts)
