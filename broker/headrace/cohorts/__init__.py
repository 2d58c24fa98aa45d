"""Cohorts (consumer groups): assignment and delivery gates (pure, no I/O)."""
