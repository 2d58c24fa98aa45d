"""The dashboard page's files, shipped as package data (``static/``).

Read once and kept: they never change while the process runs. Nothing is
loaded from a CDN, since nothing outside the cluster can be assumed reachable.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Final

from headrace.errors import InvalidRequest

#: file name -> content type; the only files served
CONTENT_TYPES: Final = {
    "index.html": "text/html",
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
}


@functools.cache
def asset(name: str) -> bytes:
    """The bytes of one of ``CONTENT_TYPES``' files; ``InvalidRequest`` for any other name."""
    if name not in CONTENT_TYPES:
        raise InvalidRequest(f"no dashboard asset {name!r}")
    return resources.files("headrace.dashboard").joinpath("static", name).read_bytes()
