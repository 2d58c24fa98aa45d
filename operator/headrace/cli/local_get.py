"""``headrace get KIND [NAME]``: the TopicSnapshots, TopicRestores and
TopicSnapshotSchedules a local cluster keeps (``controller.store``), as ``kubectl get``
shows them through the operator: the kind's printer columns (``resources.snapshots``),
or the whole resource with ``-o json|yaml``. For one named resource the table is followed
by its conditions and, for a restore, the Spark verify job's verdict.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any, Final

import click

from headrace.cli import local_record
from headrace.resources.meta import PrinterColumn, Resource
from headrace.resources.snapshots import TopicRestore, TopicSnapshot, TopicSnapshotSchedule

#: what ``get`` shows, by the folder ``controller.store`` keeps each kind in (its plural)
KINDS: Final[tuple[type[Resource], ...]] = (TopicSnapshot, TopicRestore, TopicSnapshotSchedule)
#: ``.status.conditions[?(@.type=="Ready")].status``: a list item chosen by a field
_FILTER: Final = re.compile(r'^(\w+)\[\?\(@\.(\w+)=="([^"]*)"\)\]$')
#: one step of a path: a field, with a filter in brackets (its dots are its own)
_STEP: Final = re.compile(r"\w+(?:\[[^\]]*\])?")


def kind_named(word: str) -> type[Resource]:
    """The kind ``word`` names (its plural, singular, short name or kind, any case)."""
    lowered = word.lower()
    for kind in KINDS:
        names = kind.NAMES
        if lowered in (names.plural, names.singular, kind.KIND.lower(), *names.short_names):
            return kind
    known = ", ".join(k.NAMES.plural for k in KINDS)
    raise click.BadParameter(f"{word!r}: local mode keeps {known}", param_hint="KIND")


def column_value(doc: Any, json_path: str) -> Any:
    """The value a printer column's JSONPath (``.a.b``, ``.list[?(@.f=="v")].g``) picks in
    ``doc``; None where it finds nothing."""
    found = doc
    for step in _STEP.findall(json_path):
        match = _FILTER.match(step)
        if match is not None:
            field, key, wanted = match.groups()
            items = found.get(field) if isinstance(found, dict) else None
            found = next(
                (i for i in items or [] if isinstance(i, dict) and i.get(key) == wanted), None
            )
        else:
            found = found.get(step) if isinstance(found, dict) else None
        if found is None:
            return None
    return found


def _age(text: str, now_s: float) -> str:
    seconds = max(0, int(now_s - dt.datetime.fromisoformat(text).timestamp()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cell(doc: dict[str, Any], column: PrinterColumn, now_s: float) -> str:
    value = column_value(doc, column.json_path)
    if value is None:
        return "<none>"
    if column.type == "date":
        return _age(str(value), now_s)
    return str(value)


def table(kind: type[Resource], docs: list[dict[str, Any]], now_s: float) -> list[str]:
    """``kubectl get``'s lines: NAME and the kind's printer columns, aligned."""
    columns = kind.NAMES.columns
    rows = [["NAME", *(c.name.upper() for c in columns)]]
    rows += [[d["metadata"]["name"], *(cell(d, c, now_s) for c in columns)] for d in docs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def details(doc: dict[str, Any]) -> list[str]:
    """One named resource's conditions and, for a restore, its verification."""
    status = doc.get("status") or {}
    lines = []
    for c in status.get("conditions") or []:
        lines.append(f"condition {c['type']}={c['status']} {c['reason']}: {c.get('message', '')}")
    verification = status.get("verification")
    if verification is not None:
        line = f"verification {verification['outcome']}"
        if verification.get("reportKey"):
            line += f", report {verification['reportKey']}"
        if verification.get("reason"):
            line += f": {verification['reason']}"
        lines.append(line)
    if status.get("lastFailure"):
        lines.append(f"last failure {status['lastFailure']}")
    return lines


@click.command("get")
@click.argument("kind_word", metavar="KIND")
@click.argument("name", required=False)
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table")
@local_record.dir_option("The local cluster's directory.")
def get(kind_word: str, name: str | None, namespace: str, output: str, directory: Path) -> None:
    """Show TopicSnapshots, TopicRestores or TopicSnapshotSchedules of the local cluster
    with their status (KIND: topicsnapshot, topicrestore, topicsnapshotschedule or a short
    name: hrsnap, hrrs, hrss)."""
    from headrace.controller.store import FileStore

    kind = kind_named(kind_word)
    kept = FileStore(local_record.controller_dir(directory))
    if name is not None:
        found = kept.document(kind.NAMES.plural, f"{namespace}/{name}")
        if found is None:
            raise click.ClickException(f"{kind.NAMES.singular} {namespace}/{name} not found")
        docs = [found]
    else:
        docs = [
            d
            for d in kept.documents(kind.NAMES.plural)
            if d["metadata"].get("namespace", "default") == namespace
        ]
    if output == "json":
        click.echo(json.dumps(docs[0] if name else {"items": docs}, indent=2))
        return
    if output == "yaml":
        import yaml

        click.echo(yaml.safe_dump(docs[0] if name else {"items": docs}, sort_keys=False))
        return
    if not docs:
        click.echo(f"no {kind.NAMES.plural} in namespace {namespace}", err=True)
        return
    for line in table(kind, docs, time.time()):
        click.echo(line)
    if name is not None:
        for line in details(docs[0]):
            click.echo(line)
