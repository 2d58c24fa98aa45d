"""The object-store checks of the chaos campaign and the fault tests: read a partition's
manifest straight from the server (no proxy, no fault), and say whether it parses, has a
gap, and lists an object that is not there."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.tiered import layout
from headrace.tiered.manifest import InvalidManifest, Manifest


@dataclass(slots=True)
class TierCheck:
    """One partition's stored state."""

    prefix: str
    #: the manifest as stored; None when there is none (nothing uploaded yet) or it is corrupt
    manifest: Manifest | None = None
    #: why the manifest does not parse (a corrupt manifest), None when it does
    corrupt: str | None = None
    #: holes between the manifest's start and its last offset
    gaps: tuple[tuple[int, int], ...] = ()
    #: listed keys (segment objects) with no object in the store
    missing: list[str] = field(default_factory=list)
    #: listed segment objects whose index object is gone (readers fall back to a scan,
    #: so this is reported, not a failure)
    missing_indexes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.corrupt is None and not self.gaps and not self.missing

    def to_doc(self) -> dict[str, object]:
        m = self.manifest
        return {
            "prefix": self.prefix,
            "objects": 0 if m is None else len(m.segments),
            "start": None if m is None else m.start_offset,
            "checkpoint": None if m is None else m.checkpoint,
            "corrupt": self.corrupt,
            "gaps": [list(g) for g in self.gaps],
            "missing": self.missing,
            "missing_indexes": self.missing_indexes,
        }


def check_partition(store: ObjectStore, prefix: str) -> TierCheck:
    """The manifest under ``prefix`` and every object it lists, from ``store`` (give it a
    store that reaches the server directly)."""
    found = TierCheck(prefix)
    try:
        raw = store.get(layout.manifest_key(prefix))
    except ObjectNotFound:
        return found
    try:
        found.manifest = Manifest.from_json(raw)
    except InvalidManifest as exc:
        found.corrupt = exc.message
        return found
    found.gaps = found.manifest.gaps()
    for seg in found.manifest.segments:
        if not store.exists(seg.key):
            found.missing.append(seg.key)
        if not store.exists(layout.index_key_for(seg.key)):
            found.missing_indexes.append(seg.key)
    return found
