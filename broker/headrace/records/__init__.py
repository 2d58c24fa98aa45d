"""Record batches, the unit of work on every hot path, and the topic names they are
filed under (pure, no I/O)."""
