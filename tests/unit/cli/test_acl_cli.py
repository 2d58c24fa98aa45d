"""``headrace acl``: the printed hash matches the printed token; check explains bad files."""

from __future__ import annotations

import base64
from pathlib import Path

from click.testing import CliRunner

from headrace.cli.main import main
from headrace.security.acl import hash_token


def test_token_prints_a_token_and_its_hash() -> None:
    out = CliRunner().invoke(main, ["acl", "token"]).output.splitlines()
    token = out[0].removeprefix("token: ")
    assert out[1].removeprefix("hash:  ") == hash_token(token)
    assert CliRunner().invoke(main, ["acl", "hash"], input=token + "\n").output.strip() == (
        hash_token(token)
    )


def test_check_lists_grants_and_refuses_plain_tokens(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "version: 1\nprincipals:\n  - name: app\n"
        f"    tokens: ['{hash_token('t')}']\n"
        "    grants: [{operations: [produce], topics: ['orders*']}]\n"
    )
    result = CliRunner().invoke(main, ["acl", "check", str(good)])
    assert result.exit_code == 0
    assert "produce on default/orders*" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nprincipals:\n  - name: app\n    tokens: [hunter2]\n")
    result = CliRunner().invoke(main, ["acl", "check", str(bad)])
    assert result.exit_code != 0
    assert "sha256" in result.output and "hunter2" not in result.output


def test_token_and_scram_print_credentials_the_scram_server_accepts() -> None:
    from headrace.security import scram

    out = CliRunner().invoke(main, ["acl", "token"]).output.splitlines()
    token = out[0].removeprefix("token: ")
    printed = [scram.ScramCredential.parse(line.split(": ", 1)[1]) for line in out[2:]]
    assert {c.mechanism for c in printed} == set(scram.Mechanism)
    for credential in printed:
        assert scram.derive(credential.mechanism, token, credential.salt) == credential
    assert printed[0].salt == printed[1].salt  # one salt per token, both mechanisms

    # an existing token, with the salt of its user's current credential (a rotation)
    salt = printed[0].salt
    result = CliRunner().invoke(
        main, ["acl", "scram", "--salt", base64.b64encode(salt).decode()], input="other\n"
    )
    assert result.exit_code == 0, result.output
    again = [
        scram.ScramCredential.parse(line.split(": ", 1)[1]) for line in result.output.splitlines()
    ]
    assert again == [scram.derive(c.mechanism, "other", salt) for c in printed]
    assert "other" not in result.output
