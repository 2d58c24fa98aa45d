"""Record batches: the unit of work on every hot path (pure, no I/O)."""
