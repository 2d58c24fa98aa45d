"""Replication bookkeeping (pure): the leader's view of its followers."""
