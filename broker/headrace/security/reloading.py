"""Credential files re-read without a restart: the ACL file, token files, the cluster key.

One mechanism for every file a broker or the controller takes credentials from
(``headrace.security.access`` registers them): each is read at start-up, where a bad
file stops the process with one line, and read again on SIGHUP (``reload``) or when it
changed (``reload_if_changed``: a stat per file, from the process's watch loop). A
rename counts as a change, as editors and the kubelet's Secret and ConfigMap updates
replace files that way.

A re-read that fails (unreadable, unparsable, invalid, or refused when applied)
changes nothing: the values in force stay, the log says why in one line (the readers'
messages never hold a secret), ``headrace_acl_reloads_total{source, result="error"}``
counts it and ``errors`` keeps the message for ``/v1/status`` until that file reads
well again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from headrace.errors import HeadraceError

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReloadCounter(Protocol):
    """``prometheus_client.Counter`` with ``source`` and ``result`` (``ok``, ``error``)."""

    def labels(self, source: str, result: str) -> Any: ...


def file_signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when the file is rewritten in place, replaced by a rename, or
    chmod-ed (a key file made private again)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)


def _title(source: str) -> str:
    return "ACL" if source == "acl" else source.replace("_", " ")


@dataclass(slots=True)
class CredentialFile(Generic[T]):
    #: the metric's ``source`` label and the status key: acl, auth_tokens, ...
    source: str
    path: Path
    #: the file's content, validated; raises ``HeadraceError``
    read: Callable[[Path], T]
    #: puts the content in force; raises ``HeadraceError`` (and changes nothing) to refuse it
    apply: Callable[[T], None]
    #: a short description of what is in force, for the log ("3 principals")
    describe: Callable[[T], str]
    signature: tuple[int, int, int, int] | None = None
    #: the last failed re-read's message, None once the file reads well
    error: str | None = None
    #: re-reads put in force since start-up (the file's generation)
    generation: int = 0

    def load(self) -> T:
        self.signature = file_signature(self.path)
        value = self.read(self.path)
        self.apply(value)
        return value


class CredentialFiles:
    """Every reloadable credential file of one process."""

    def __init__(self, reloads: ReloadCounter | None, on_reload: Callable[[], None]) -> None:
        """``on_reload``: called after each file put in force by a re-read (connections
        re-authenticate from then on)."""
        self.reloads = reloads
        self.on_reload = on_reload
        self.files: list[CredentialFile[Any]] = []

    def watch(
        self,
        source: str,
        path: Path,
        read: Callable[[Path], T],
        apply: Callable[[T], None],
        describe: Callable[[T], str] = lambda _: "read",
    ) -> None:
        """Read ``path`` and put it in force now (a bad file raises: start-up stops with
        its message), then again on each reload."""
        entry = CredentialFile(source, path, read, apply, describe)
        entry.load()
        self.files.append(entry)

    def reload(self) -> bool:
        """Re-read every file (SIGHUP). Whether any new content is in force."""
        changed = False
        for entry in self.files:
            changed |= self._reload(entry)
        return changed

    def reload_if_changed(self) -> bool:
        """Re-read the files that changed since their last read (the watch loop)."""
        changed = False
        for entry in self.files:
            if file_signature(entry.path) != entry.signature:
                changed |= self._reload(entry)
        return changed

    def _reload(self, entry: CredentialFile[Any]) -> bool:
        try:
            value = entry.load()
        except HeadraceError as exc:
            entry.error = exc.message
            self._count(entry.source, "error")
            log.error(
                "%s reload failed, the credentials in force stay: %s: %s",
                _title(entry.source),
                type(exc).__name__,
                exc.message,
            )
            return False
        except Exception as exc:
            # Not a reader's typed refusal (a bug, or an error a reader does not expect):
            # still a failed re-read, never the end of the watch loop that called it (an
            # exception here ended it for good, and no file was read again). The message
            # is not logged: it is nobody's promise that it holds no secret.
            entry.error = f"unexpected {type(exc).__name__} while reading the file"
            self._count(entry.source, "error")
            log.error(
                "%s reload failed, the credentials in force stay: %s",
                _title(entry.source),
                entry.error,
            )
            return False
        entry.error = None
        entry.generation += 1
        self._count(entry.source, "ok")
        log.info("%s file %s reloaded: %s", _title(entry.source), entry.path, entry.describe(value))
        self.on_reload()
        return True

    def _count(self, source: str, result: str) -> None:
        if self.reloads is not None:
            self.reloads.labels(source, result).inc()

    def error(self, source: str) -> str | None:
        return next((f.error for f in self.files if f.source == source), None)

    def generation(self, source: str) -> int:
        return next((f.generation for f in self.files if f.source == source), 0)

    def status(self) -> dict[str, dict[str, str | int | None]]:
        """Per file: its path, its generation and the last failed re-read's message (None
        if it read well)."""
        return {
            f.source: {"file": str(f.path), "generation": f.generation, "reload_error": f.error}
            for f in self.files
        }
