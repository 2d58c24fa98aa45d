"""A local cluster with ACLs (``local up --acl-file``): the cluster key, the brokers'
replication token, and the arguments that hand them to brokers and controller.

The replication token is kept in ``<dir>/replication.token`` (mode 0600; one token
a line, the first in use, so it rotates: docs/security.md §9) and passed by file,
never on a command line.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from headrace import files

#: the cluster key of a local cluster with ACLs: ``<dir>/cluster.key``, mode 0600
CLUSTER_KEY_FILE = "cluster.key"
#: the brokers' replication token (the controller presents it too): ``<dir>/replication.token``,
#: mode 0600; one token a line, the first in use, so it rotates (docs/security.md §9)
REPLICATION_TOKEN_FILE = "replication.token"
REPLICATION_TOKEN_ENV = "HEADRACE_REPLICATION_TOKEN"


def prepare_access(record: dict[str, Any], directory: Path, acl_file: Path) -> None:
    """Check the ACL file now (one line, before anything starts), make the cluster key and
    draw the brokers' replication token into ``<dir>/replication.token`` (mode 0600; it
    is also kept in ``record``, as local.json is 0600 too)."""
    from headrace.errors import HeadraceError
    from headrace.security.access import load_acl_file, load_cluster_key, load_token_file

    token_file = (directory / REPLICATION_TOKEN_FILE).resolve()
    try:
        load_acl_file(acl_file)
        load_cluster_key(directory / CLUSTER_KEY_FILE, create=True)
        if not token_file.exists():
            token_file.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(token_file, f"{secrets.token_urlsafe(24)}\n".encode(), mode=0o600)
        # a cluster brought up again keeps its token (and the key), rotated or not
        token = load_token_file(token_file)[0]
    except HeadraceError as exc:
        raise click.ClickException(exc.message) from exc
    record["acl_file"] = str(acl_file.resolve())
    record["replication_token"] = token
    record["replication_token_file"] = str(token_file)


def access_args(record: Mapping[str, Any], directory: Path) -> tuple[list[str], dict[str, str]]:
    """(broker arguments, broker environment) for the cluster's ACLs: none without them.

    The replication token comes from its file (re-read on change, so it rotates), never
    on a command line; a cluster recorded before the file existed passes it by
    environment."""
    acl_file = record.get("acl_file")
    if acl_file is None:
        return [], {}
    key = (directory / CLUSTER_KEY_FILE).resolve()
    args = ["--acl-file", acl_file, "--cluster-key-file", str(key)]
    token_file = record.get("replication_token_file")
    if token_file is not None:
        return [*args, "--replication-token-file", str(token_file)], {}
    return args, {REPLICATION_TOKEN_ENV: record["replication_token"]}


def replication_token(record: Mapping[str, Any]) -> str | None:
    """The token the brokers present now (a drain is a change on their admin port): the
    first line of its file, read now, as it may have rotated (None: no ACLs)."""
    from headrace.errors import HeadraceError
    from headrace.security.access import load_token_file

    path = record.get("replication_token_file")
    if path is not None:
        with contextlib.suppress(HeadraceError):
            return load_token_file(Path(path))[0]
    token = record.get("replication_token")
    return None if token is None else str(token)


def controller_access_args(record: Mapping[str, Any]) -> list[str]:
    """The controller's API takes the brokers' ACL file, and it presents the brokers'
    replication token from its file (or, by environment: ``access_args``)."""
    acl_file = record.get("acl_file")
    if acl_file is None:
        return []
    token_file = record.get("replication_token_file")
    token_args = [] if token_file is None else ["--broker-token-file", str(token_file)]
    return ["--acl-file", str(acl_file), *token_args]
