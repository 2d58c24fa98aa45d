"""Spark jobs over a topic's tiered segment objects (data plane; reads the storage format).

- ``arrow``: segment-object bytes -> ``pyarrow.RecordBatch`` without per-record Python.
- ``topics``: finding a topic's partitions and manifests in an object store.
- ``verify``: the checks of one partition (offsets, CRCs, manifest vs objects, sealed state).
- ``compact``: merging small segment objects (and keep-last-per-key) and swapping the manifest.
- ``sweep``: deleting orphans, the objects no manifest lists (no Spark: one process lists them).
- ``source``: the PySpark data source ``headrace`` (``spark.read.format("headrace")``).
- ``run``: the ``spark-submit`` entry point of the verify and compact jobs.

See docs/spark.md. Nothing here imports the control plane.
"""
