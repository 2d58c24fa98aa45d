"""Control core (work in progress)."""
