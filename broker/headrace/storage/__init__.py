"""Partition logs on local disk: segments, sparse indexes, recovery."""
