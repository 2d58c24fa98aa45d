"""Tiered storage: a partition's log in an object store, and its sealed state.

``layout`` (where objects live), ``manifest`` (the list of live segment
objects, its merge and fencing rules, the sealed state) and ``index`` (what a
segment object holds, its sparse index) are pure. ``tier`` does the I/O
through an ``headrace.objectstore.ObjectStore``: ``PartitionTier`` uploads,
reads and seals one partition.

See docs/tiered-storage.md.
"""
