"""``headrace local add-broker`` and ``remove-broker``: scale a local cluster with moves.

The controller owns the decisions (``control.moves``); these commands start or
stop the broker process and tell the controller the new membership
(``PUT /v1/members``), then follow ``GET /v1/members``:

* **add-broker** starts broker ``max id + 1`` on the next loopback address, waits
  until it answers, and adds it to the membership: replicas (and, with them,
  some leaderships) move onto it, each one catching up as a follower first.
* **remove-broker** takes a broker (the highest id by default) out of the
  membership and waits until it holds no replica any more (``released``): its
  replicas move off first, its leaderships through an election. Only then is
  the process stopped and dropped from ``local.json``. A scale-down that would
  lose a partition's last in-sync replica, or leave fewer brokers than a
  topic's replication factor, is *blocked*: the membership is put back and the
  command fails with the controller's reasons.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from headrace.cli.controller_client import (
    checked_dir_option,
    request_json,
    resolve_controller_url,
)
from headrace.cli.local import local
from headrace.cli.local_cluster import broker_listeners, rack_for, start_broker
from headrace.cli.local_record import STATE_FILE, write_state
from headrace.cli.processes import alive, stop_processes


def _record(directory: Path) -> dict[str, Any]:
    state_file = directory / STATE_FILE
    if not state_file.exists():
        raise click.ClickException(f"no local cluster recorded in {directory}")
    return dict(json.loads(state_file.read_text()))


def _endpoint(b: dict[str, Any]) -> dict[str, Any]:
    return {"id": b["id"], "host": b["host"], "port": b["port"], "adminPort": b["admin_port"]}


def _set_members(url: str, brokers: list[dict[str, Any]]) -> dict[str, Any]:
    body = json.dumps({"brokers": [_endpoint(b) for b in brokers]}).encode()
    return dict(request_json("PUT", f"{url}/v1/members", body))


def _members(url: str) -> dict[str, Any]:
    return dict(request_json("GET", f"{url}/v1/members"))


def _wait_settled(url: str, timeout: float, what: str) -> dict[str, Any]:
    """Until no move is in flight or waiting, once a controller step has decided on the
    new membership (``decided``: an answer from before says nothing of it)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = _members(url)
        if doc.get("blocked"):
            raise click.ClickException(f"{what}: blocked: " + "; ".join(doc["blocked"]))
        if doc.get("decided", True) and not doc.get("moving") and not doc.get("waiting"):
            return doc
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"{what}: moves still running after {timeout:.0f} s"
                f" ({doc.get('moving')} moving, {doc.get('waiting')} waiting);"
                " `headrace local status` shows them"
            )
        time.sleep(0.5)


timeout_option = click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds to wait for the moves to finish.",
)


@local.command("add-broker")
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the replicas that move onto the new broker are in sync and the old"
    " copies removed.",
)
@timeout_option
def add_broker(directory: Path, controller_url: str | None, wait: bool, timeout: float) -> None:
    """Start one more broker and move a share of every topic's replicas onto it."""
    url = resolve_controller_url(controller_url, directory)
    record = _record(directory)
    brokers = record.get("brokers", [])
    if not brokers:
        raise click.ClickException("the local cluster has no brokers to copy addresses from")
    new_id = max(b["id"] for b in brokers) + 1
    if new_id > 252:
        raise click.ClickException("no loopback address left for another broker")
    first = brokers[0]
    b = {
        "id": new_id,
        "host": f"127.0.0.{2 + new_id}",
        "port": first["port"],
        "admin_port": first["admin_port"],
        "pid": None,
    }
    if record.get("kafka_port") is not None:
        b["kafka_port"] = record["kafka_port"]
    if rack := rack_for(new_id, record.get("racks", [])):
        b["rack"] = rack
    if first.get("listeners"):
        named = [(listener["name"], listener["port"]) for listener in first["listeners"]]
        b["listeners"] = broker_listeners(named, new_id)
    record["brokers"] = [*brokers, b]
    write_state(directory / STATE_FILE, record)
    start_broker(directory, new_id)
    _set_members(url, record["brokers"])
    click.echo(f"broker {new_id} is a member: replicas move onto it", err=True)
    if wait:
        _wait_settled(url, timeout, f"adding broker {new_id}")
        click.echo(f"broker {new_id} holds its share", err=True)


@local.command("remove-broker")
@click.argument("broker_id", metavar="[BROKER]", type=int, required=False)
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@timeout_option
def remove_broker(
    broker_id: int | None, directory: Path, controller_url: str | None, timeout: float
) -> None:
    """Move every replica off BROKER (default: the highest id), then stop it.

    Refused, with the controller's reasons, while that would lose a partition's last
    in-sync replica or leave fewer brokers than a topic's replication factor."""
    url = resolve_controller_url(controller_url, directory)
    record = _record(directory)
    brokers = record.get("brokers", [])
    if broker_id is None:
        if not brokers:
            raise click.ClickException("the local cluster has no brokers")
        broker_id = max(b["id"] for b in brokers)
    leaving = next((b for b in brokers if b["id"] == broker_id), None)
    if leaving is None:
        ids = ", ".join(str(b["id"]) for b in brokers)
        raise click.ClickException(f"no broker {broker_id} in the local cluster ({ids})")
    staying = [b for b in brokers if b["id"] != broker_id]
    if not staying:
        raise click.ClickException("cannot remove the last broker; `headrace local down`")
    _set_members(url, staying)
    click.echo(f"broker {broker_id} is leaving: its replicas move off first", err=True)
    deadline = time.monotonic() + timeout
    while True:
        doc = _members(url)
        if doc.get("decided", True) and doc.get("blocked"):
            _set_members(url, brokers)  # refused: nothing moves, the broker stays
            raise click.ClickException(
                f"removing broker {broker_id} is refused: " + "; ".join(doc["blocked"])
            )
        if (
            doc.get("decided", True)
            and broker_id in doc.get("released", [])
            and not doc.get("moving")
        ):
            break
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"broker {broker_id} still holds replicas after {timeout:.0f} s; it stays out of"
                " the membership and the moves go on (`headrace local status`); run this again"
                " to wait"
            )
        time.sleep(0.5)
    pid = leaving.get("pid")
    if pid is not None and alive(int(pid)):
        stop_processes([int(pid)])
    record = _record(directory)
    record["brokers"] = [b for b in record.get("brokers", []) if b["id"] != broker_id]
    write_state(directory / STATE_FILE, record)
    click.echo(f"broker {broker_id} holds nothing and is stopped", err=True)
