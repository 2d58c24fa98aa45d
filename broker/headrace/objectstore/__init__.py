"""Object storage for tiered segments: one interface, two adapters.

``interface`` is the contract (``ObjectStore``, ``ObjectInfo``); the typed
errors (``errors``) and the key rules (``keys``) are pure modules of their own,
so pure cores such as the tier layout use them without importing a store.
``retrying`` wraps any store with exponential backoff and jitter; its clock,
sleep and randomness are passed in. The adapters do the I/O: ``directory``
(files under a root; the embedded default of local mode) and ``minio_store``
(S3 API through the ``minio`` client, the only module that imports it).
The tests' MinIO server process is ``headrace.testing.minio``, outside the wheel.

See docs/object-store.md.
"""
