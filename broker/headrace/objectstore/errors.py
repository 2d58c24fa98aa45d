"""The object store's errors (pure): one family, codes 70-79.

Adapters translate their client's exceptions into these at the edge
(``raise ... from exc``); ``retriable`` says whether the same call may succeed
later. They are not wire errors, so they are not in ``headrace.errors``'
registry, and their codes clash with none of it.
"""

from __future__ import annotations

from headrace.errors import HeadraceError


class ObjectStoreError(HeadraceError):
    """The object store failed; unless a subclass says otherwise, try again later."""

    CODE = 70
    retriable = True


class ObjectNotFound(ObjectStoreError):
    """No object has this key (or, for a bucket store, the bucket has none)."""

    CODE = 71
    retriable = False


class ObjectStoreUnavailable(ObjectStoreError):
    """The store could not be reached or is overloaded: refused, reset, timed out, 5xx."""

    CODE = 72
    retriable = True


class InvalidObjectKey(ObjectStoreError):
    """The key breaks the key rules (``validate_key``) or clashes with the store's layout."""

    CODE = 73
    retriable = False


class ObjectStoreAccessDenied(ObjectStoreError):
    """Credentials were refused; retrying with the same ones will not help."""

    CODE = 74
    retriable = False


class ObjectStoreRejected(ObjectStoreError):
    """The store refused the request for another reason (missing bucket, bad argument)."""

    CODE = 75
    retriable = False


ERROR_CLASSES: tuple[type[ObjectStoreError], ...] = (
    ObjectStoreError,
    ObjectNotFound,
    ObjectStoreUnavailable,
    InvalidObjectKey,
    ObjectStoreAccessDenied,
    ObjectStoreRejected,
)
