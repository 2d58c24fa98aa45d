"""A benchmark's table in its docs page, between a start and an end marker comment."""

from __future__ import annotations

from pathlib import Path


def replace_between(path: Path, start_marker: str, end_marker: str, text: str) -> bool:
    """Put ``text`` between the markers in ``path``; False (nothing written) when the
    page lacks them."""
    page = path.read_text()
    start, end = page.find(start_marker), page.find(end_marker)
    if start < 0 or end < start:
        return False
    path.write_text(page[: start + len(start_marker)] + "\n" + text + "\n" + page[end:])
    return True
