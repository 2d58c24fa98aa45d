"""``headrace acl token|hash|scram|check``: make credentials and check an ACL file
(docs/security.md).

The ACL file stores only ``sha256:<hex>`` of each token and the SCRAM credentials
derived from it, so ``token`` prints the token (give it to the client) and the lines
for the file (give them to the brokers)."""

from __future__ import annotations

import base64
import binascii
import secrets
import sys
from pathlib import Path

import click

from headrace.commands import one_line_errors


@click.group()
def acl() -> None:
    """Tokens and ACL files for brokers started with --acl-file."""


@acl.command("token")
def token() -> None:
    """Draw a fresh random token: prints the token, then its hash for the ACL file."""
    from headrace.security.acl import hash_token

    fresh = secrets.token_urlsafe(32)
    click.echo(f"token: {fresh}")
    click.echo(f"hash:  {hash_token(fresh)}")
    _echo_scram(fresh, secrets.token_bytes(_salt_bytes()))


def _salt_bytes() -> int:
    from headrace.security.scram import SALT_BYTES

    return SALT_BYTES


def _echo_scram(token: str, salt: bytes) -> None:
    from headrace.security import scram

    for mechanism in scram.Mechanism:
        credential = scram.derive(mechanism, token, salt)
        click.echo(f"{mechanism.value.lower()}: {credential.text()}")


@acl.command("scram")
@click.option(
    "--salt",
    help="base64; the salt of the principal's credentials in force, so that during a"
    " rotation one salt serves the old token and the new (default: a fresh one)",
)
@one_line_errors
def scram_(salt: str | None) -> None:
    """SCRAM credentials of a token read from stdin, for the ACL file's ``scram`` list."""
    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise click.UsageError("give the token on stdin (not as an argument: ps shows those)")
    if salt is None:
        salt_bytes = secrets.token_bytes(_salt_bytes())
    else:
        try:
            salt_bytes = base64.b64decode(salt, validate=True)
        except (binascii.Error, ValueError):
            raise click.UsageError("--salt is not base64") from None
        if not salt_bytes:
            raise click.UsageError("--salt is empty")
    _echo_scram(line, salt_bytes)


@acl.command("hash")
def hash_() -> None:
    """Hash a token read from stdin (one line), for the ACL file's ``tokens`` list."""
    from headrace.security.acl import hash_token

    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise click.UsageError("give the token on stdin (not as an argument: ps shows those)")
    click.echo(hash_token(line))


@acl.command("check")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@one_line_errors
def check(path: Path) -> None:
    """Validate an ACL file and print each principal's grants."""
    from headrace.security.access import load_acl_file

    parsed = load_acl_file(path)
    for principal in parsed.principals:
        creds = []
        if principal.tokens:
            creds.append(f"{len(principal.tokens)} token(s)")
        if principal.scram:
            creds.append(f"{len(principal.scram)} SCRAM credential(s)")
        creds += [f"certificate CN={c}" for c in principal.certificates]
        click.echo(f"{principal.name} ({', '.join(creds)})")
        for grant in principal.grants:
            ops = ",".join(op.value for op in grant.operations)
            click.echo(f"  {ops} on {' '.join(grant.topics) or '(cluster)'}")
