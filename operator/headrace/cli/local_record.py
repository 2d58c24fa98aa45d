"""``<dir>/local.json``: what ``headrace local up`` started, so later commands find it.

It records the controller's URL, pid and instance token, each broker's id,
addresses and pid (none once ``local stop`` stopped it), the object store (and
MinIO's credentials) and the ACL files. It is readable by its owner only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from headrace import files

DEFAULT_DIR = Path("var/local")


_Command = TypeVar("_Command", bound=Callable[..., Any])


def dir_option(help_text: str) -> Callable[[_Command], _Command]:
    """``--dir``, the local cluster's directory (``directory`` in the command's arguments):
    one declaration for every command of a local cluster, each with its own help."""
    return click.option(
        "--dir",
        "directory",
        type=click.Path(path_type=Path),
        default=DEFAULT_DIR,
        show_default=True,
        help=help_text,
    )


STATE_FILE = "local.json"
#: the cluster id brokers and controller share; it prefixes every object-store key and is
#: the Topic manifests' ``clusterRef`` name, so it is the same for every local cluster
CLUSTER_ID = "local"
#: the controller's state directory under a cluster's directory (``controller.store``)
CONTROLLER_DIR = "controller"


def controller_dir(directory: Path) -> Path:
    """The local controller's state directory: its documents, and the TopicSnapshots,
    TopicRestores and TopicSnapshotSchedules ``apply -f`` keeps there."""
    return directory / CONTROLLER_DIR


def write_state(state_file: Path, record: Mapping[str, Any]) -> None:
    """local.json, readable by its owner only (it may hold object-store credentials)."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(state_file, record, sync=False, mode=0o600, indent=2)


def recorded_pids(doc: Mapping[str, Any]) -> list[int]:
    """Every process a local.json records (controller, running brokers, MinIO).

    A broker that ``local stop`` stopped has no pid: its old one may belong to
    another process by now."""
    pids = [int(b["pid"]) for b in doc.get("brokers", []) if b.get("pid") is not None]
    if doc.get("controller_pid") is not None:
        pids.append(int(doc["controller_pid"]))
    if "minio" in doc:
        pids.append(int(doc["minio"]["pid"]))
    return pids


def broker_entry(directory: Path, broker_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(local.json, the entry of broker ``broker_id`` in it); one-line errors otherwise."""
    state_file = directory / STATE_FILE
    if not state_file.exists():
        raise click.ClickException(f"no local cluster recorded in {directory}")
    record = json.loads(state_file.read_text())
    for b in record.get("brokers", []):
        if b["id"] == broker_id:
            return record, b
    ids = ", ".join(str(b["id"]) for b in record.get("brokers", []))
    raise click.ClickException(f"no broker {broker_id} in the local cluster in {directory} ({ids})")
