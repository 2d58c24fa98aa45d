"""Object keys (pure): the one rule every store enforces, and the tier layout relies on.

Pure, so the tier's key layout (``tiered.layout``) and manifests can check
names without importing a store.
"""

from __future__ import annotations

import re

from headrace.objectstore.errors import InvalidObjectKey

#: S3's limit on a key's length, in UTF-8 bytes.
MAX_KEY_BYTES = 1024

# every object call checks its key: a regex scan, not a Python loop per character
_CONTROL_OR_BACKSLASH = re.compile(r"[\x00-\x1f\x7f\\]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``InvalidObjectKey``.

    The rule is stricter than S3's so that every key is also a safe relative
    path for ``DirectoryStore``: non-empty segments separated by single ``/``;
    no leading or trailing ``/``; no segment that starts with ``.`` (which
    rules out ``.`` and ``..`` and leaves hidden names to the adapters' own
    temporary files); no backslash, NUL or other control characters; at most
    ``MAX_KEY_BYTES`` bytes of UTF-8.
    """
    if not key:
        raise InvalidObjectKey("object key is empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidObjectKey(f"object key is longer than {MAX_KEY_BYTES} bytes")
    if _CONTROL_OR_BACKSLASH.search(key):
        raise InvalidObjectKey(f"object key {key!r} has a control character or backslash")
    if _SURROGATE.search(key):
        raise InvalidObjectKey(f"object key {key!r} is not valid UTF-8")
    for segment in key.split("/"):
        if not segment:
            raise InvalidObjectKey(
                f"object key {key!r} has an empty segment (or a leading, trailing or double /)"
            )
        if segment.startswith("."):
            raise InvalidObjectKey(f"object key {key!r} has a segment starting with '.'")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or the beginning of some valid key."""
    if not prefix:
        return prefix
    # A prefix may end inside a segment or right after a '/'; check it as the
    # key it would be with a neutral character appended.
    validate_key(prefix + "x" if prefix.endswith("/") else prefix)
    return prefix
